"""Engine configuration and the live scheduler knobs, with their validation.

Knob names and meanings follow vLLM's ``SchedulerConfig`` (vllm/config/scheduler.py); the modes
are gpuchef's (see DESIGN.md): ``continuous`` is vLLM V0's ``_schedule_default`` (prefill-first,
whole prompts) and ``chunked`` is Sarathi-Serve's stall-free batching (decode-first, token budget).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

MODES = ("continuous", "chunked")
ENGINES = ("native", "vllm")


class ConfigError(ValueError):
    """Bad user input. The message names the value given and what is allowed."""


@dataclass(frozen=True)
class KnobSpec:
    """One live knob: its type and allowed closed range ``[lo, hi]``."""

    name: str
    lo: int
    hi: int
    help: str
    flag: str  # vLLM's flag spelling


# Upper bounds are sanity limits (a knob typed with an extra zero is refused, not obeyed).
KNOBS: dict[str, KnobSpec] = {
    k.name: k
    for k in (
        KnobSpec("max_num_batched_tokens", 1, 1 << 20, "token budget per step (tokens)",
                 "--max-num-batched-tokens"),
        KnobSpec("max_num_seqs", 1, 4096, "cap on running requests", "--max-num-seqs"),
        KnobSpec("long_prefill_token_threshold", 0, 1 << 20,
                 "chunk size: cap on one request's prefill tokens per step (0 = the budget)",
                 "--long-prefill-token-threshold"),
        KnobSpec("max_num_partial_prefills", 1, 4096,
                 "prompts that may be left mid-prefill at once (chunked mode)",
                 "--max-num-partial-prefills"),
    )
}


def parse_mode(value: Any) -> str:
    """Return ``value`` as a mode name. Raises ConfigError naming the allowed modes."""
    v = str(value).strip().lower()
    if v not in MODES:
        raise ConfigError(f"mode {value!r} is not one of {', '.join(MODES)}")
    return v


def parse_knob(name: str, value: Any) -> int:
    """Validate one knob value (int or a string of digits).

    Returns the int. Raises ConfigError naming the knob, the value and the allowed range; an
    unknown knob name is an error that lists the known ones.
    """
    spec = KNOBS.get(name)
    if spec is None:
        raise ConfigError(f"unknown knob {name!r}; knobs are: {', '.join(KNOBS)}, mode")
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer in [{spec.lo}, {spec.hi}], got {value!r}")
    if isinstance(value, str):
        s = value.strip().replace("_", "")
        try:
            value = int(s)
        except ValueError:
            raise ConfigError(
                f"{name} must be an integer in [{spec.lo}, {spec.hi}], got {value!r}") from None
    elif isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"{name} must be an integer in [{spec.lo}, {spec.hi}], got {value!r}")
        value = int(value)
    elif not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer in [{spec.lo}, {spec.hi}], got {value!r}")
    if not spec.lo <= value <= spec.hi:
        raise ConfigError(f"{name}={value} is out of range: allowed [{spec.lo}, {spec.hi}]")
    return value


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's mode and knobs; all of them may change between steps.

    Defaults: ``max_num_batched_tokens`` 2048 (vLLM's default for chunked prefill on small GPUs
    and Sarathi-Serve's larger budget), ``max_num_seqs`` 256 (vLLM's default below 70 GiB),
    ``long_prefill_token_threshold`` 0 (off, as in vLLM), ``max_num_partial_prefills`` 1 (vLLM V0).
    """

    mode: str = "chunked"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", parse_mode(self.mode))
        for f in fields(self):
            if f.name in KNOBS:
                object.__setattr__(self, f.name, parse_knob(f.name, getattr(self, f.name)))

    def with_changes(self, **changes: Any) -> "SchedulerConfig":
        """A copy with ``changes`` applied and validated (ConfigError on a bad one; self unchanged)."""
        for k in changes:
            if k != "mode" and k not in KNOBS:
                parse_knob(k, 0)  # raises with the list of knobs
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def chunk_limit(self) -> int:
        """Most prefill tokens one request may get in one step (tokens)."""
        t = self.long_prefill_token_threshold
        return self.max_num_batched_tokens if t <= 0 else min(t, self.max_num_batched_tokens)


@dataclass
class CacheConfig:
    """KV cache shape. ``num_gpu_blocks`` None = size from ``kv_cache_memory_gb`` or, failing that,
    from ``gpu_memory_utilization`` on CUDA / 4096 blocks on CPU."""

    block_size: int = 16
    num_gpu_blocks: int | None = None
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ConfigError(f"--block-size {self.block_size} is not allowed: use a power of two "
                              "in [1, 128] (FlashInfer and vLLM use 16)")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ConfigError(f"--num-gpu-blocks {self.num_gpu_blocks} must be > 0 (blocks)")
        gb = self.kv_cache_memory_gb
        if gb is not None and not (gb > 0 and math.isfinite(gb)):  # NaN fails both
            raise ConfigError(f"--kv-cache-memory {gb:g} must be > 0 GiB (a finite number)")
        u = self.gpu_memory_utilization
        if not 0 < u <= 1:
            raise ConfigError(f"--gpu-memory-utilization {u:g} is out of range: allowed (0, 1] "
                              "(a fraction of GPU memory)")


@dataclass
class EngineConfig:
    """Everything fixed at engine start-up.

    ``model`` is a preset name (see ``presets.PRESETS``) or a local Hugging Face folder.
    ``dtype`` is "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "float64", "bfloat16" or
    "float16". ``max_model_len`` None = the model's ``max_position_embeddings`` capped at 8192.
    ``engine``: "native" (gpuchef's own) or "vllm" (vLLM hosted in-process, the ``[vllm]``
    extra; see vllm_engine.py). ``tensor_parallel_size``: GPUs for vLLM (native: 1 only).
    ``async_scheduling`` (vLLM's ``--async-scheduling``): the native engine schedules and launches
    step N+1 while step N runs on the GPU (docs/async_scheduling.md); same tokens.
    Raises ConfigError for an unknown engine or a size below 1.
    """

    model: str = "tiny"
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    attention_backend: str = "auto"
    enforce_eager: bool = False
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    engine: str = "native"
    tensor_parallel_size: int = 1
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"--tensor-parallel-size {tp!r} must be an integer >= 1")
