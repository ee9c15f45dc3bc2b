"""Build a model from a preset (random weights) or a local Hugging Face folder (safetensors).

Nothing here downloads: a model is a preset name from ``presets.PRESETS`` or a folder on disk
with ``config.json`` and ``*.safetensors`` (one file, or shards listed in
``model.safetensors.index.json``). The model is built on the meta device and materialised
directly on the target device in the target dtype, so an 8B preset never exists in float32 on
the CPU.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .vocab.errors import ConfigError
from .model import LlamaForCausalLM, ModelConfig, eos_token_ids
from .vocab.presets import PRESETS, get_preset

ProgressFn = Callable[[str, int, int], None]

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # old Llama conversions saved this buffer
_INDEX = "model.safetensors.index.json"


@dataclass
class LoadedModel:
    """A model ready to run, and what the dashboard says about it.

    ``source`` is "preset" or the folder's absolute path; ``num_params`` counts tied weights
    once; ``weight_bytes`` is the parameters' size in the loaded dtype (bytes).
    """

    model: LlamaForCausalLM
    config: ModelConfig
    name: str
    random_weights: bool
    source: str
    num_params: int
    weight_bytes: int


def load_model(model: str, *, dtype: torch.dtype, device: torch.device | str, seed: int = 0,
               progress: ProgressFn | None = None) -> LoadedModel:
    """Load ``model``: a preset name (random weights from ``seed``) or a local HF folder.

    ``progress(stage, done, total)`` is called once per tensor ("init weights" or
    "load weights"); when None, a tqdm bar is drawn if stderr is a terminal, else nothing.
    Raises ConfigError with one clear message for: an unknown preset (lists the presets), a
    path that does not exist or is not a folder, no or malformed ``config.json`` (with the JSON
    error's position), an unsupported config, no ``*.safetensors``, a missing weight (named), a
    shape mismatch (name, expected, got), an unreadable safetensors file.
    """
    device = torch.device(device)
    if progress is None:
        progress = _tqdm_progress() if sys.stderr.isatty() else None
    if model in PRESETS:
        cfg = ModelConfig.from_hf_config(get_preset(model))
        net = _build_empty(cfg, dtype, device)
        _random_init(net, cfg, seed, device, progress)
        return _result(net, cfg, model, True, "preset")

    path = model_folder(model, "config.json and *.safetensors")
    cfg = _read_config(path)
    files = _safetensors_files(path)
    net = _build_empty(cfg, dtype, device)
    _load_weights(net, cfg, files, progress)
    return _result(net, cfg, path.resolve().name, False, str(path.resolve()))


# ----------------------------------------------------------------------------- building


def _build_empty(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    # Meta first: no memory and no default init; then storage on the device, uninitialised.
    with torch.device("meta"):
        net = LlamaForCausalLM(cfg)
    net = net.to(dtype=dtype).to_empty(device=device)
    net.requires_grad_(False)
    return net.eval()


def _random_init(net: LlamaForCausalLM, cfg: ModelConfig, seed: int, device: torch.device,
                 progress: ProgressFn | None) -> None:
    """transformers' ``_init_weights`` for these models: N(0, initializer_range) for linear and
    embedding weights, zeros for biases, ones for norm weights. In place, tensor by tensor, on
    the device, from one seeded generator (deterministic per seed and device type)."""
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)
    params = list(net.named_parameters())
    for i, (name, p) in enumerate(params):
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, cfg.initializer_range, generator=gen)
        if progress:
            progress("init weights", i + 1, len(params))


def _result(net, cfg, name, random_weights, source) -> LoadedModel:
    params = list(net.parameters())  # shared tensors appear once
    return LoadedModel(
        model=net, config=cfg, name=name, random_weights=random_weights, source=source,
        num_params=sum(p.numel() for p in params),
        weight_bytes=sum(p.numel() * p.element_size() for p in params),
    )


# ----------------------------------------------------------------------------- files


def model_folder(model: str, needs: str = "config.json") -> Path:
    """``model`` (not a preset) as a local folder. Raises ConfigError naming it when it does not
    exist (an unknown preset when it looks like a name) or is not a folder (``needs`` says what
    the folder must hold)."""
    path = Path(model).expanduser()
    if not path.exists():
        if os.sep in model or model.startswith((".", "~")):
            raise ConfigError(f"model folder {model!r} does not exist (gpuchef never downloads: "
                              f"give a local Hugging Face folder, or a preset: "
                              f"{', '.join(PRESETS)})")
        raise ConfigError(f"unknown model preset {model!r} and no such folder; presets: "
                          f"{', '.join(PRESETS)} (or a local Hugging Face folder)")
    if not path.is_dir():
        raise ConfigError(f"model path {str(path)!r} is not a folder: give a Hugging Face folder "
                          f"with {needs}")
    return path


def read_config_json(path: Path) -> dict[str, Any]:
    """The ``config.json`` of Hugging Face folder ``path`` as a dict.

    Raises ConfigError naming the file for a missing file, invalid JSON (with line and column),
    an unreadable file, or JSON that is not an object.
    """
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"no config.json in model folder {str(path)!r}")
    return _read_json_object(cfg_path)


def _read_json_object(file: Path) -> dict[str, Any]:
    try:
        obj = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{str(file)!r} is not valid JSON: {e.msg} at line {e.lineno} "
                          f"column {e.colno}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {str(file)!r}: {e}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{str(file)!r} must hold a JSON object, got {type(obj).__name__}")
    return obj


def generation_eos_token_ids(path: Path) -> tuple[int, ...]:
    """The ``eos_token_id`` (an int or a list) of folder ``path``'s ``generation_config.json``
    as a tuple; () when the folder has no such file or the file no such field. Raises
    ConfigError naming the file when it is not a JSON object or the field is not an int, a list
    of ints or null."""
    gen_path = path / "generation_config.json"
    if not gen_path.is_file():
        return ()
    gen = _read_json_object(gen_path)
    try:
        return eos_token_ids(gen.get("eos_token_id"))
    except ConfigError as e:
        raise ConfigError(f"{str(gen_path)!r}: {e}") from None


def merge_eos(config_ids: Sequence[int], generation_ids: Sequence[int]) -> tuple[int, ...]:
    """The ids generation stops on: config.json's, then generation_config.json's, each once.

    As vLLM does (``SamplingParams.update_from_generation_config``, PR #4182 for issue #4180:
    Llama 3 Instruct ends a turn with ``<|eot_id|>``, listed only in generation_config.json): it
    stops on the model's eos and on every generation-config eos id. gpuchef loads no tokenizer,
    so config.json's ids stand for the tokenizer's eos (the first stays the primary one)."""
    return tuple(dict.fromkeys((*config_ids, *generation_ids)))


def _read_config(path: Path) -> ModelConfig:
    cfg_path = path / "config.json"
    cfg = read_config_json(path)
    try:
        mc = ModelConfig.from_hf_config(cfg)
    except ConfigError as e:
        raise ConfigError(f"{str(cfg_path)!r}: {e}") from None
    return replace(mc, eos_token_ids=merge_eos(mc.eos_token_ids,
                                               generation_eos_token_ids(path)))


def _safetensors_files(path: Path) -> list[Path]:
    index = path / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{str(index)!r} is not a valid safetensors index "
                              f"(needs a 'weight_map' object): {e}") from None
        for n in names:
            if not (path / n).is_file():
                raise ConfigError(f"shard {n!r} listed in {_INDEX} is missing from {str(path)!r}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = f" (found {', '.join(others)}: convert to safetensors)" if others else ""
        raise ConfigError(f"no *.safetensors files in model folder {str(path)!r}{hint}")
    return files


def _load_weights(net: LlamaForCausalLM, cfg: ModelConfig, files: list[Path],
                  progress: ProgressFn | None) -> None:
    from safetensors import SafetensorError, safe_open

    layout = net.checkpoint_layout()
    params = dict(net.named_parameters())
    seen: set[str] = set()
    unexpected: list[str] = []
    try:
        handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
        keys = [list(h.keys()) for h in handles]
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"cannot read safetensors in {str(files[0].parent)!r}: {e}") from None
    total, done = sum(len(k) for k in keys), 0
    with torch.no_grad():
        for f, h, names in zip(files, handles, keys):
            for key in names:
                done += 1
                target = layout.get(key)
                if target is None:
                    if not key.endswith(_IGNORED_SUFFIXES) and not (
                            key == "lm_head.weight" and cfg.tie_word_embeddings):
                        unexpected.append(key)
                else:
                    try:
                        t = h.get_tensor(key)
                    except (SafetensorError, OSError) as e:
                        raise ConfigError(f"cannot read {key!r} from {f.name!r}: {e}") from None
                    pname, r0, r1, shape = target
                    if tuple(t.shape) != shape:
                        raise ConfigError(f"weight {key!r} in {f.name!r} has shape "
                                          f"{list(t.shape)}, expected {list(shape)}")
                    params[pname][r0:r1].copy_(t)
                    seen.add(key)
                if progress:
                    progress("load weights", done, total)
    missing = [k for k in layout if k not in seen]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConfigError(f"weight {missing[0]!r}{more} missing from the safetensors files in "
                          f"{str(files[0].parent)!r}")
    if unexpected:
        warnings.warn(f"ignored {len(unexpected)} tensors not used by the model, e.g. "
                      f"{', '.join(unexpected[:3])}", stacklevel=3)


def _tqdm_progress() -> ProgressFn:
    """A progress callback that draws one tqdm bar per stage on stderr."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def update(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=total, desc=stage, unit="tensor", leave=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update
