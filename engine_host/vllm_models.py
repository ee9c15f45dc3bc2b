"""Model folders for vLLM: a gpuchef preset or a local Hugging Face folder → what vLLM loads.

A preset becomes a folder with only ``config.json`` (under
``~/.cache/gpuchef/vllm-models/<preset>``, a stable path so that vLLM's compile cache hits on the
next start), loaded with ``load_format="dummy"`` (random weights); a local folder is passed
through (dummy weights too if it has no weight files). Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from .vocab.errors import ConfigError
from .engine import DEFAULT_MAX_MODEL_LEN
from .vocab.presets import PRESETS, get_preset


@dataclass(frozen=True)
class VllmModelInfo:
    """What the dashboard says about the model (the native engine's ``LoadedModel`` fields).

    ``source``: "preset" or the folder's absolute path. ``num_params``: from the shapes (0 when
    gpuchef's ModelConfig does not know the architecture); ``weight_bytes`` in the run's dtype.
    """

    name: str
    random_weights: bool
    source: str
    num_params: int
    weight_bytes: int = 0


@dataclass(frozen=True)
class VllmModelSource:
    """Where vLLM loads the model from: ``path`` (a folder with ``config.json``),
    ``load_format`` ("dummy" = random weights, "auto" = the folder's weights), the parsed
    ``hf_config`` dict, and ``generation_eos`` (generation_config.json's eos ids, read before
    vLLM starts so that a bad file is refused first)."""

    path: str
    name: str
    random_weights: bool
    source: str
    load_format: str
    hf_config: dict[str, Any]
    generation_eos: tuple[int, ...] = ()


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuchef" / "vllm-models"


def preset_model_folder(name: str, root: str | Path | None = None) -> Path:
    """A folder holding preset ``name``'s ``config.json`` for vLLM's ``load_format="dummy"``.

    ``root`` defaults to ``$XDG_CACHE_HOME/gpuchef/vllm-models`` (``~/.cache/...``); the path is
    stable so vLLM's torch.compile cache is reused across runs, and the file is rewritten only
    when its content changes. Falls back to a temporary folder when the cache is not writable.
    Raises ConfigError for an unknown preset.
    """
    cfg = get_preset(name)
    text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    for base in ([Path(root)] if root is not None else [_cache_root()]):
        folder = base / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            f = folder / "config.json"
            if not f.is_file() or f.read_text(encoding="utf-8") != text:
                tmp = f.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, f)
            return folder
        except OSError:
            if root is not None:
                raise ConfigError(f"cannot write the preset's config.json under {str(base)!r}")
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f"gpuchef-vllm-{name}-"))
    (folder / "config.json").write_text(text, encoding="utf-8")
    return folder


_WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def resolve_vllm_model(model: str) -> VllmModelSource:
    """A preset name or a local Hugging Face folder → where vLLM loads it from.

    Raises ConfigError (one line) for an unknown preset, a path that does not exist or is not a
    folder, a folder without ``config.json``, a ``config.json`` that is not a JSON object, or a
    ``generation_config.json`` whose ``eos_token_id`` cannot be read.
    A folder with no weight files is loaded with random weights (``load_format="dummy"``).
    """
    if model in PRESETS:
        return VllmModelSource(str(preset_model_folder(model)), model, True, "preset", "dummy",
                               get_preset(model))
    from .loader import generation_eos_token_ids, model_folder, read_config_json

    path = model_folder(model)
    hf = read_config_json(path)
    full = path.resolve()
    has_weights = any(next(full.glob(g), None) is not None for g in _WEIGHT_GLOBS)
    return VllmModelSource(str(full), full.name, not has_weights, str(full),
                           "auto" if has_weights else "dummy", hf, generation_eos_token_ids(full))


def model_info(src: VllmModelSource, dtype: torch.dtype) -> tuple[VllmModelInfo, Any]:
    """gpuchef's view of the model: VllmModelInfo and a ``model_config`` with ``vocab_size``,
    ``eos_token_ids`` and ``max_position_embeddings`` (gpuchef's ModelConfig when it knows the
    architecture, else the same fields read from config.json). ``eos_token_ids`` include the
    folder's generation_config.json ones (``loader.merge_eos``)."""
    from .loader import merge_eos
    from .model import ModelConfig, eos_token_ids

    try:
        mc: Any = ModelConfig.from_hf_config(src.hf_config)
        n = mc.num_params()
    except (ConfigError, KeyError, TypeError, ValueError):
        hf = src.hf_config.get("text_config", src.hf_config)
        try:
            eos_ids = eos_token_ids(hf.get("eos_token_id", src.hf_config.get("eos_token_id")))
        except ConfigError:
            eos_ids = ()  # an architecture gpuchef does not parse: vLLM judges its config
        mc = SimpleNamespace(vocab_size=int(hf.get("vocab_size", 0)), eos_token_ids=eos_ids,
                             max_position_embeddings=int(hf.get("max_position_embeddings",
                                                                DEFAULT_MAX_MODEL_LEN)))
        n = 0
    eos = merge_eos(mc.eos_token_ids, src.generation_eos)
    if isinstance(mc, SimpleNamespace):
        mc.eos_token_ids = eos
    else:
        mc = replace(mc, eos_token_ids=eos)
    size = torch.tensor([], dtype=dtype).element_size()
    return VllmModelInfo(src.name, src.random_weights, src.source, n, n * size), mc
