"""``make_engine``: the native engine or vLLM, behind the one surface EngineHost drives."""

from __future__ import annotations

from typing import Callable

from .vocab.config import ENGINES, EngineConfig
from .vocab.errors import ConfigError
from .contract import Engine


def make_engine(cfg: EngineConfig, engine: str | None = None,
                tensor_parallel_size: int | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> Engine:
    """Build the engine ``cfg`` asks for.

    ``engine``: "native" (``LLMEngine``) or "vllm" (``VllmEngine``, vLLM's engine core hosted in
    this process; imported only here); None = ``cfg.engine``. ``tensor_parallel_size``: GPUs for
    vLLM; None = ``cfg.tensor_parallel_size``. ``progress(stage, done, total)``: start-up stages.

    Raises ConfigError (one line) for an unknown engine, the native engine asked for more than
    one GPU, and whatever the chosen engine refuses (for vLLM: not installed, torch mismatch, no
    GPU, a model it cannot load — see ``vllm_env.check_vllm_environment``). Nothing global
    changes on failure: the other engine can still be built in the same process.
    """
    kind = cfg.engine if engine is None else engine
    tp = cfg.tensor_parallel_size if tensor_parallel_size is None else tensor_parallel_size
    if kind not in ENGINES:
        raise ConfigError(f"--engine {kind!r} is not one of {', '.join(ENGINES)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"--tensor-parallel-size {tp!r} must be an integer >= 1")
    if kind == "native":
        if tp != 1:
            raise ConfigError(f"--tensor-parallel-size {tp}: gpuchef's native engine runs on one "
                              "GPU; use --engine vllm for tensor parallelism")
        from .engine import LLMEngine

        return LLMEngine(cfg, progress=progress)
    from .vllm_engine import VllmEngine

    return VllmEngine(cfg, tensor_parallel_size=tp, progress=progress)
