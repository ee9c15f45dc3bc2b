"""Engine configuration and the live scheduler knobs, with their validation.

Knob names and meanings follow vLLM's ``SchedulerConfig`` (vllm/config/scheduler.py); the modes
are gpuchef's: ``continuous`` is vLLM V0's ``_schedule_default`` (prefill-first,
whole prompts) and ``chunked`` is Sarathi-Serve's stall-free batching (decode-first, token budget).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .errors import ConfigError

MODES = ("continuous", "chunked")
ENGINES = ("native", "vllm")
#: ``--cudagraph-mode`` (vLLM's ``CompilationConfig.cudagraph_mode`` values the native engine
#: has): full graphs for decode-only steps plus piecewise graphs (split at attention) for steps
#: with prefill tokens, or the decode graphs only. No graphs at all is ``--enforce-eager``.
CUDAGRAPH_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")
#: Padded token counts of the piecewise graphs (steps with prefill tokens). A bf16 GEMM of M
#: rows does M FLOP per weight byte; an H200 gives ~990 dense TFLOP/s for 4.8 TB/s (~200 FLOP a
#: byte), so below M ≈ 200 a step's GEMMs are bound by reading the weights and padding rows cost
#: little: coarse sizes there. Above, padding is paid in compute: sizes step by 64 rows (≤ 25 %
#: padding above 256 tokens, ≤ 7 % above 896). The cap, 1024, is where graphs stop paying on an
#: H200 (docs/engine-graphs.md, "Capture sizes"): 1.45–1.51× over eager for 512 prefill tokens
#: + 64 decodes, 1.16× at 1024 tokens, 1.01× at 2048. runner.CudaGraphPiecewise captures them.
PIECEWISE_CAPTURE_SIZES = (16, 32, 64, 96, *range(128, 1024 + 1, 64))
#: the largest piecewise capture size accepted (tokens): the static buffers are this many rows
MAX_CAPTURE_SIZE = 16384


def parse_capture_sizes(text: str | None) -> tuple[int, ...] | None:
    """``--cudagraph-capture-sizes`` as typed ("16,32,64": token counts, commas, spaces
    allowed) → a tuple of ints; None or "" → None (the default sizes). The range is checked by
    EngineConfig. Raises ConfigError naming the value for anything but integers."""
    if text is None or not str(text).strip():
        return None
    try:
        return tuple(int(v) for v in str(text).split(","))
    except ValueError:
        raise ConfigError(f"--cudagraph-capture-sizes {text!r} must be comma-separated token "
                          f"counts, e.g. 16,32,64,128,256,512") from None


@dataclass(frozen=True)
class KnobSpec:
    """One live knob: its type and allowed closed range ``[lo, hi]``, and its names: ``name``
    (vLLM's ``SchedulerConfig`` field), ``flag`` (vLLM's flag spelling), ``short`` (the word typed
    in the palette and A/B specs) and ``label`` (what the dashboard, header and report show)."""

    name: str
    lo: int
    hi: int
    help: str
    flag: str  # vLLM's flag spelling
    short: str
    label: str


# Upper bounds are sanity limits (a knob typed with an extra zero is refused, not obeyed).
KNOBS: dict[str, KnobSpec] = {
    k.name: k
    for k in (
        KnobSpec("max_num_batched_tokens", 1, 1 << 20, "token budget per step (tokens)",
                 "--max-num-batched-tokens", "budget", "budget"),
        KnobSpec("max_num_seqs", 1, 4096, "cap on running requests", "--max-num-seqs",
                 "seqs", "max seqs"),
        KnobSpec("long_prefill_token_threshold", 0, 1 << 20,
                 "chunk size: cap on one request's prefill tokens per step (0 = the budget)",
                 "--long-prefill-token-threshold", "chunk", "chunk"),
        KnobSpec("max_num_partial_prefills", 1, 4096,
                 "prompts that may be left mid-prefill at once (chunked mode)",
                 "--max-num-partial-prefills", "partial", "partial"),
        KnobSpec("max_long_partial_prefills", 1, 4096,
                 "of the partial prefills, how many may be long prompts (over "
                 "long_prefill_token_threshold), so short ones pass them (chunked mode; above "
                 "max_num_partial_prefills it never binds — vLLM refuses that at start-up, "
                 "gpuchef lets it be so that turning one live knob down never voids the other)",
                 "--max-long-partial-prefills", "long_partial", "long partial"),
    )
}

#: The autopilot's setting (``SchedulerConfig.auto_budget``): not an integer knob, so not in
#: KNOBS, but live and recorded like one (EngineEvent kind "knob", name "auto_budget").
AUTO_BUDGET = "auto_budget"
#: The only spellings of "autopilot off" ("" and None are what HTTP and SchedulerConfig send);
#: "0", "none", "false" are refused rather than guessed at.
AUTO_BUDGET_OFF = ("", "off")
#: Sanity bounds on an autopilot target (ms): a target typed with extra zeros, or one below
#: 1 ms (no engine step is that short: the autopilot could only starve prefills), is refused.
AUTO_BUDGET_MAX_MS = 600_000.0
AUTO_BUDGET_MIN_MS = 1.0
#: The stats a latency target may name, as ``vllm bench serve`` computes them.
LATENCY_STATS = "mean, median or p<0-100>"
_TARGET_KEY_RE = re.compile(r"^([a-z0-9]+)_(mean|median|p\d+(?:\.\d+)?)$")
_DURATION_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(ms|s)?$")


@dataclass(frozen=True)
class LatencyTarget:
    """One parsed ``METRIC_STAT:DURATION`` pair: ``metric`` ("itl", "ttft", …), ``stat``
    ("mean", "median" or "p<q>", q in [0, 100]) and ``ms`` (the duration, ms, > 0)."""

    metric: str
    stat: str
    ms: float

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.stat}"


def parse_latency_targets(spec: str, *, flag: str, metrics: tuple[str, ...],
                          example: str, min_ms: float = 0.0,
                          max_ms: float = math.inf) -> list[LatencyTarget]:
    """Parse ``"itl_p99:50ms,ttft_p99:2s"``: pairs split by commas or spaces (an empty pair, as
    after a trailing comma, is skipped), each ``<metric>_<stat>:<duration>`` with ``metric`` in
    ``metrics``, stat mean, median or p<q> (q in [0, 100]) and the duration in ms by default or
    with a ``ms``/``s`` unit. The one grammar of ``--slo`` (gpuchef/experiments/capacity.py) and
    ``--auto-budget`` (:func:`parse_auto_budget`); each caller passes its metrics and bounds.

    Returns the targets in the order given (possibly empty). Raises ConfigError starting
    ``{flag} {pair!r}`` naming what is wrong and what is allowed: not METRIC_STAT:DURATION, an
    unknown metric, a percentile out of range, not a duration, negative, 0 or outside
    ``(min_ms, max_ms]`` (``[min_ms, max_ms]`` when ``min_ms`` > 0), a key given twice."""
    def allowed() -> str:
        lo = f"[{min_ms:g} ms" if min_ms > 0 else "(0 ms"
        hi = f"{max_ms / 1000:g} s]" if math.isfinite(max_ms) else "∞)"
        return f"allowed {lo}, {hi}"

    out: list[LatencyTarget] = []
    for pair in re.split(r"[,\s]+", str(spec).strip()):
        if not pair:
            continue
        key, sep, val = pair.partition(":")
        key = key.strip().lower()
        m = _TARGET_KEY_RE.match(key)
        if not sep or not m or m.group(1) not in metrics:
            raise ConfigError(f"{flag} {pair!r} is not METRIC_STAT:DURATION with metric one of "
                              f"{', '.join(metrics)} and stat {LATENCY_STATS}; {example}")
        stat = m.group(2)
        if stat.startswith("p") and not 0.0 <= float(stat[1:]) <= 100.0:
            raise ConfigError(f"{flag} {pair!r}: percentile {stat[1:]} is out of range: "
                              "allowed [0, 100]")
        val = val.strip().lower()
        if val.startswith("-"):
            raise ConfigError(f"{flag} {pair!r}: {val!r} is negative: {allowed()}")
        v = _DURATION_RE.match(val)
        if not v:
            raise ConfigError(f"{flag} {pair!r}: {val!r} is not a duration ({example})")
        ms = float(v.group(1)) * (1000.0 if v.group(2) == "s" else 1.0)
        if not (math.isfinite(ms) and ms > 0 and ms >= min_ms and ms <= max_ms):
            raise ConfigError(f"{flag} {pair!r}: {val!r} is out of range: {allowed()}")
        if any(t.key == key for t in out):
            raise ConfigError(f"{flag} {pair!r}: {key} is given twice")
        out.append(LatencyTarget(m.group(1), stat, ms))
    return out


@dataclass(frozen=True)
class AutoBudgetSpec:
    """The autopilot's targets: ``itl_ms`` (the step time the decodes may see, ms) with the
    statistic it is meant for (``itl_stat``: "p99", "median", …), and optionally ``ttft_ms``
    (the time to first token the waiting queue may see, ms) with ``ttft_stat``."""

    itl_ms: float
    itl_stat: str = "p99"
    ttft_ms: float | None = None
    ttft_stat: str = "p99"

    @property
    def canonical(self) -> str:
        """``itl_p99:50ms,ttft_p99:2000ms``: the form stored in SchedulerConfig and traces."""
        s = f"itl_{self.itl_stat}:{self.itl_ms:g}ms"
        if self.ttft_ms is not None:
            s += f",ttft_{self.ttft_stat}:{self.ttft_ms:g}ms"
        return s


def parse_auto_budget(spec: Any, name: str = "--auto-budget") -> AutoBudgetSpec | None:
    """Parse ``--auto-budget itl_p99:50ms[,ttft_p99:2s]`` (:func:`parse_latency_targets`'s
    grammar, as ``--slo`` spells it; metrics itl and ttft). "", "off" or None → None (the
    autopilot off). ``name``: how messages name the setting (the flag; ``auto_budget`` where
    it arrives as a knob: the HTTP knob endpoint, an A/B spec).

    Raises ConfigError naming the value and what is allowed: an unknown key, a key twice, no
    ``itl_…`` target, a target that is not a duration, negative, below 1 ms or over 600 s, or a
    TTFT target below one step (below the ITL target: a first token takes at least one step).
    """
    if spec is None or isinstance(spec, AutoBudgetSpec):
        return spec
    text = str(spec).strip()
    if text.lower() in AUTO_BUDGET_OFF:
        return None
    eg = "e.g. itl_p99:50ms or itl_p99:50ms,ttft_p99:2s; or off"
    targets = parse_latency_targets(text, flag=name, metrics=("itl", "ttft"),
                                    example=eg, min_ms=AUTO_BUDGET_MIN_MS,
                                    max_ms=AUTO_BUDGET_MAX_MS)
    got: dict[str, tuple[str, float]] = {}
    for t in targets:
        if t.metric in got:
            raise ConfigError(f"{name} {text!r}: the {t.metric} target is given twice")
        got[t.metric] = (t.stat, t.ms)
    if "itl" not in got:
        raise ConfigError(f"{name} {text!r} has no ITL target: the autopilot keeps the "
                          f"step time under it ({eg})")
    itl_stat, itl_ms = got["itl"]
    ttft_stat, ttft_ms = got.get("ttft", ("p99", None))
    if ttft_ms is not None and ttft_ms < itl_ms:
        raise ConfigError(f"{name} {text!r}: ttft target {ttft_ms:g} ms is below one step "
                          f"(the itl target, {itl_ms:g} ms): a first token takes at least one step")
    return AutoBudgetSpec(itl_ms, itl_stat, ttft_ms, ttft_stat)


def parse_mode(value: Any) -> str:
    """Return ``value`` as a mode name. Raises ConfigError naming the allowed modes."""
    v = str(value).strip().lower()
    if v not in MODES:
        raise ConfigError(f"mode {value!r} is not one of {', '.join(MODES)}")
    return v


def parse_value(name: str, value: Any) -> Any:
    """Validate one setting of SchedulerConfig by name: ``mode`` (parse_mode), ``auto_budget``
    (parse_auto_budget, returned as its canonical string, "" = off) or a knob (parse_knob).
    Raises ConfigError as those do."""
    if name == "mode":
        return parse_mode(value)
    if name == AUTO_BUDGET:
        spec = parse_auto_budget(value, AUTO_BUDGET)
        return "" if spec is None else spec.canonical
    return parse_knob(name, value)


def parse_knob(name: str, value: Any) -> int:
    """Validate one knob value (int or a string of digits).

    Returns the int. Raises ConfigError naming the knob (field name and flag: the same
    message reaches the command line, the dashboard, A/B specs and HTTP, and a user may have
    typed either), the value and the allowed range; a name that is not a knob is
    :func:`not_a_knob`'s error.
    """
    spec = KNOBS.get(name)
    if spec is None:
        raise not_a_knob(name)
    flag = f" (flag {spec.flag})"
    not_int = f"{name} must be an integer in [{spec.lo}, {spec.hi}], got {value!r}{flag}"
    if isinstance(value, bool):
        raise ConfigError(not_int)
    if isinstance(value, str):
        s = value.strip().replace("_", "")
        try:
            value = int(s)
        except ValueError:
            raise ConfigError(not_int) from None
    elif isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(not_int)
        value = int(value)
    elif not isinstance(value, int):
        raise ConfigError(not_int)
    if not spec.lo <= value <= spec.hi:
        raise ConfigError(f"{name}={value} is out of range: allowed [{spec.lo}, {spec.hi}]{flag}")
    return value


# ---- names: one table (KNOBS + SETTINGS) for flags, palette, A/B specs, labels, messages ----------

@dataclass(frozen=True)
class SettingSpec:
    """A live setting of SchedulerConfig that is not an integer knob (``mode``, ``auto_budget``):
    its names as in KnobSpec, plus ``aliases`` (other words typed for it)."""

    name: str
    help: str
    flag: str
    short: str
    label: str
    aliases: tuple[str, ...] = ()


#: ``mode`` and ``auto_budget``: KNOBS's sibling table (their values are parsed by parse_value).
SETTINGS: dict[str, SettingSpec] = {
    s.name: s
    for s in (
        SettingSpec("mode", "continuous (prefill-first, whole prompts) or chunked (decode-first, "
                    "token budget)", "--mode", "mode", "mode"),
        SettingSpec(AUTO_BUDGET, "the autopilot's targets, e.g. itl_p99:50ms,ttft_p99:2s, or off",
                    "--auto-budget", "auto", "autopilot", aliases=("autopilot",)),
    )
}


def _spellings(spec: KnobSpec | SettingSpec) -> tuple[str, ...]:
    """Every word accepted for ``spec`` (normalised as setting_name normalises)."""
    return (spec.name, spec.short, spec.flag.lstrip("-").replace("-", "_"),
            *getattr(spec, "aliases", ()))


_BY_WORD: dict[str, str] = {w: spec.name for spec in (*KNOBS.values(), *SETTINGS.values())
                            for w in _spellings(spec)}


def setting_name(word: str) -> str | None:
    """The SchedulerConfig field (``max_num_batched_tokens``, ``mode``, ``auto_budget``) that
    ``word`` names, or None. Accepted: the field name, vLLM's flag (``--max-num-batched-tokens``,
    dashes or not), the short name (``budget``, ``long-partial``) and aliases (``autopilot``);
    case and ``-``/``_`` do not matter."""
    return _BY_WORD.get(str(word).strip().lstrip("-").lower().replace("-", "_"))


def setting_label(name: str) -> str:
    """The display label of a setting (``max seqs``, ``autopilot``); ``name`` itself if unknown."""
    spec = KNOBS.get(name) or SETTINGS.get(name)
    return spec.label if spec else name


def setting_short(name: str) -> str:
    """The short name typed for a setting (``seqs``, ``auto``); ``name`` itself if unknown."""
    spec = KNOBS.get(name) or SETTINGS.get(name)
    return spec.short if spec else name


def field_names() -> str:
    """The SchedulerConfig fields that may change, for messages: ``max_num_batched_tokens, …,
    mode, auto_budget``."""
    return ", ".join([*KNOBS, *SETTINGS])


def startup_flags() -> dict[str, str]:
    """The engine settings fixed at start-up (EngineConfig's and CacheConfig's fields, e.g.
    ``block_size``) → their flag (``--block-size``; a field's ``metadata["flag"]`` where the
    flag is spelt otherwise)."""
    out = {}
    for f in (*fields(EngineConfig), *fields(CacheConfig)):
        if f.name not in ("cache", "scheduler"):
            out[f.name] = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
    return out


def not_a_knob(word: str, known: str | None = None) -> ConfigError:
    """The error for ``word`` (as typed) that names no live setting. An engine setting fixed at
    start-up (:func:`startup_flags`, in any spelling setting_name accepts) says so, with its
    flag: "block_size is fixed at start-up (flag --block-size); live knobs are: …"; anything
    else is "unknown knob 'x'; knobs are: …". ``known``: the list shown (default
    field_names())."""
    known = field_names() if known is None else known
    key = str(word).strip().lstrip("-").lower().replace("-", "_")
    flag = startup_flags().get(key)
    if flag is not None:
        return ConfigError(f"{key} is fixed at start-up (flag {flag}); live knobs are: {known}")
    return ConfigError(f"unknown knob {word!r}; knobs are: {known}")


def setting_names() -> str:
    """Every setting with its short names, for messages: ``mode, max_num_batched_tokens
    (budget), …, auto_budget (auto, autopilot)``."""
    def one(spec: KnobSpec | SettingSpec) -> str:
        short = [w for w in (spec.short, *getattr(spec, "aliases", ())) if w != spec.name]
        return f"{spec.name} ({', '.join(short)})" if short else spec.name

    return ", ".join(one(s) for s in (SETTINGS["mode"], *KNOBS.values(), SETTINGS[AUTO_BUDGET]))


def parse_settings(text: str) -> dict[str, Any]:
    """Parse ``KNOB=VALUE[, KNOB=VALUE ...]`` (pairs split by commas or spaces; any spelling
    setting_name accepts; a bare ``continuous`` or ``chunked`` means ``mode=…``). The autopilot's
    ``auto=itl_p99:50ms,ttft_p99:2s`` takes the ``TARGET:DURATION`` parts that follow it.

    Returns ``{field name: parsed value}`` in the order given (values as parse_value returns
    them); "" → ``{}``. Raises ConfigError naming the bad pair, the unknown knob (with the known
    ones), a knob given twice, or parse_value's error for a bad value.
    """
    pairs: list[str] = []
    for piece in re.split(r"[,\s]+", re.sub(r"\s*=\s*", "=", str(text).strip())):
        if not piece:
            continue
        if (pairs and "=" not in piece and ":" in piece
                and setting_name(pairs[-1].partition("=")[0]) == AUTO_BUDGET):
            pairs[-1] += "," + piece  # auto=itl_p99:50ms,ttft_p99:2s is one setting
        else:
            pairs.append(piece)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep:
            if key.lower() not in MODES:
                raise ConfigError(f"{pair!r} is not KNOB=VALUE; use e.g. budget=512,mode=continuous "
                                  f"(knobs: {setting_names()})")
            key, val = "mode", key
        name = setting_name(key)
        if name is None:
            raise not_a_knob(key, setting_names())
        if name in out:
            raise ConfigError(f"{name} is given twice")
        out[name] = parse_value(name, val)
    return out


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's mode and knobs; all of them may change between steps.

    Defaults: ``max_num_batched_tokens`` 2048 (vLLM's default for chunked prefill on small GPUs
    and Sarathi-Serve's larger budget), ``max_num_seqs`` 256 (vLLM's default below 70 GiB),
    ``long_prefill_token_threshold`` 0 (off, as in vLLM), ``max_num_partial_prefills`` 1 (vLLM V0),
    ``max_long_partial_prefills`` 1 (vLLM V0; vLLM refuses a value above
    ``max_num_partial_prefills`` at start-up, gpuchef lets it be, where it never binds, so that
    turning one live knob down never makes the other invalid), ``auto_budget`` "" (the autopilot
    off; else its targets in ``AutoBudgetSpec.canonical`` form, see engine_host/autopilot.py).
    Raises ConfigError for a bad value.
    """

    mode: str = "chunked"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    auto_budget: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", parse_mode(self.mode))
        for f in fields(self):
            if f.name in KNOBS:
                object.__setattr__(self, f.name, parse_knob(f.name, getattr(self, f.name)))
        object.__setattr__(self, AUTO_BUDGET, parse_value(AUTO_BUDGET, self.auto_budget))

    def with_changes(self, **changes: Any) -> "SchedulerConfig":
        """A copy with ``changes`` applied and validated (ConfigError on a bad one; self unchanged)."""
        for k in changes:
            if k not in SETTINGS and k not in KNOBS:
                raise not_a_knob(k)
        return replace(self, **changes)

    @property
    def auto_budget_spec(self) -> AutoBudgetSpec | None:
        """``auto_budget`` parsed; None when the autopilot is off."""
        return parse_auto_budget(self.auto_budget)

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
    kv_cache_memory_gb: float | None = field(default=None,
                                             metadata={"flag": "--kv-cache-memory"})
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



#: Which kernel attends a step's decode rows on FlashInfer (``EngineConfig.decode_attention``,
#: ``attention.FlashInferAttention(decode_attention=...)``): FlashInfer's own decode wrapper, or
#: TensorRT-LLM's XQA decode kernel as FlashInfer ships it
#: (``flashinfer.decode.xqa_batch_decode_with_kv_cache``; page sizes 16/32/64/128, head dim ≤
#: 256, fp16/bf16). "auto": FlashInfer's wrapper (measured faster in the whole decode step on
#: the H200: docs/benchmarks.md, "Decode attention alone").
DECODE_ATTENTION = ("auto", "flashinfer", "xqa")

@dataclass
class EngineConfig:
    """Everything fixed at engine start-up.

    ``model`` is a preset name (see ``presets.PRESETS``) or a local Hugging Face folder.
    ``dtype`` is "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "float64", "bfloat16" or
    "float16". ``max_model_len`` None = the model's ``max_position_embeddings`` capped at 8192.
    ``engine``: "native" (gpuchef's own) or "vllm" (vLLM hosted in-process, the ``[vllm]``
    extra; see vllm_engine.py). ``tensor_parallel_size``: GPUs for vLLM (native: 1 only).
    ``async_scheduling`` (vLLM's ``--async-scheduling``): the native engine schedules and launches
    step N+1 while step N runs on the GPU (docs/async_scheduling.md); same tokens. None (the
    default): on for CUDA, off for CPU, where the runner does a step's work in its launch and
    there is nothing to overlap (``engine.resolve_async_scheduling``); for vLLM, vLLM's own
    default.
    ``cudagraph_mode`` (CUDA with FlashInfer, not ``enforce_eager``; one of CUDAGRAPH_MODES):
    "FULL_AND_PIECEWISE" (default) also runs steps with prefill tokens of up to the largest
    ``cudagraph_capture_sizes`` tokens through piecewise graphs (docs/engine-graphs.md);
    "FULL_DECODE_ONLY" graphs decode-only steps only. ``cudagraph_capture_sizes``: the piecewise
    graphs' padded token counts (None = PIECEWISE_CAPTURE_SIZES, 16 … 1024); the
    decode graphs keep ``runner.GRAPH_BATCH_SIZES``. The native engine's only (refused, unless
    at their defaults, with ``engine="vllm"``).
    ``decode_attention`` (``DECODE_ATTENTION``): the kernel for decode rows on
    FlashInfer — "auto" (FlashInfer's decode wrapper), "flashinfer" or "xqa"
    (``FlashInferAttention``); the native engine's only.
    Raises ConfigError for an unknown engine, a size below 1, an ``async_scheduling`` other
    than True, False or None, an unknown ``cudagraph_mode`` or a capture size outside
    [1, MAX_CAPTURE_SIZE].
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
    async_scheduling: bool | None = None
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    decode_attention: str = "auto"

    def __post_init__(self) -> None:
        if self.decode_attention not in DECODE_ATTENTION:
            raise ConfigError(f"--decode-attention {self.decode_attention!r} is not one of "
                              f"{', '.join(DECODE_ATTENTION)}")
        if self.engine == "vllm" and self.decode_attention != "auto":
            raise ConfigError("--decode-attention picks the native engine's decode kernel; "
                              "--engine vllm chooses its own (vLLM's --attention-backend)")
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            extra = " (no graphs at all: --enforce-eager)" if str(
                self.cudagraph_mode).upper() == "NONE" else ""
            raise ConfigError(f"--cudagraph-mode {self.cudagraph_mode!r} is not one of "
                              f"{', '.join(CUDAGRAPH_MODES)}{extra}")
        if self.cudagraph_capture_sizes is not None:
            sizes = self.cudagraph_capture_sizes
            if (isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__")
                    or not sizes or not all(isinstance(n, int) and not isinstance(n, bool)
                                            and 1 <= n <= MAX_CAPTURE_SIZE for n in sizes)):
                shown = (",".join(map(str, sizes)) if isinstance(sizes, (tuple, list)) and sizes
                         else repr(sizes))  # as typed on the command line: 0,16, not (0, 16)
                raise ConfigError(f"--cudagraph-capture-sizes {shown} must be a non-empty "
                                  f"list of token counts in [1, {MAX_CAPTURE_SIZE}]")
            self.cudagraph_capture_sizes = tuple(sorted(set(sizes)))
        if self.engine == "vllm" and (self.cudagraph_mode != CUDAGRAPH_MODES[0]
                                      or self.cudagraph_capture_sizes is not None):
            raise ConfigError("--cudagraph-mode and --cudagraph-capture-sizes set the native "
                              "engine's graphs; --engine vllm captures its own (vLLM's "
                              "--compilation-config sets them)")
        if not (self.async_scheduling is None or isinstance(self.async_scheduling, bool)):
            raise ConfigError(f"async_scheduling={self.async_scheduling!r} must be True, False "
                              "or None (on for CUDA, off for CPU)")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"--tensor-parallel-size {tp!r} must be an integer >= 1")
