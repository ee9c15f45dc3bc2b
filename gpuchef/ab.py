"""A/B experiments: two scheduler settings against the same seeded load, on one engine.

``gpuchef ab`` (gpuchef/ab_cmd.py) is a thin shell over this module:

* :func:`parse_setting` turns ``--a``/``--b`` specs (``mode=chunked,max_num_batched_tokens=2048``)
  into full :class:`SchedulerConfig` s;
* :func:`run_sequential` runs the load once per setting per repetition, A then B, then B then A
  (alternating the order cancels slow drift: thermals, clocks, a noisy neighbour);
* :func:`run_interleaved` runs one load while the engine alternates settings in windows of
  ``window_s`` seconds on the same arrival stream;
* :func:`compare` pools each setting's runs and computes B − A with its spread over the
  repetitions (or windows) and a verdict.

Every run or window starts with an ``ab:<run>:<A|B>:<n>`` mark event (the dashboard's live A/B
uses the same labels, so ``gpuchef report`` draws both) and the experiment ends with
``ab:<run>:end``. Settings are switched between steps through the host (``set_config`` →
``LLMEngine.set_scheduler_config``), so the trace also holds each knob change as an event.

Metrics are ``probes.metrics.summarize``'s (``vllm bench serve``'s definitions). In an
interleaved run a request belongs to the window in which it *arrived* (so both settings see the
same arrival process) and a step to the window in which it started; requests that straddle an
edge are counted in full for the window they arrived in, so windows should be long against the
requests' E2EL (the command warns when many straddle).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

from .engine_host.config import AUTO_BUDGET, KNOBS, ConfigError, SchedulerConfig, parse_value
from .engine_host.records import EngineEvent
from .probes.metrics import BenchMetrics, summarize

LABELS = ("A", "B")
REPETITIONS_RANGE = (1, 100)
WINDOW_RANGE_S = (0.5, 3600.0)
#: In an interleaved run, warn when more than this share of requests finished after the end of
#: the window they arrived in (their latency mixes both settings).
STRADDLE_WARN_SHARE = 0.25


# ---- settings ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One arm of the experiment. ``changes``: the knobs the spec names (parsed);
    ``config``: the base SchedulerConfig with them applied (what the engine runs)."""

    label: str
    spec: str
    changes: dict[str, Any]
    config: SchedulerConfig

    def describe(self) -> str:
        """The spec as given, normalised: ``mode=chunked, max_num_batched_tokens=2048``."""
        if not self.changes:
            return "the base settings"
        return ", ".join(f"{k}={v}" for k, v in self.changes.items())

    def knobs(self) -> dict[str, Any]:
        """Every field of ``config`` (mode and knobs): what ``host.set_config`` gets."""
        return {f.name: getattr(self.config, f.name) for f in fields(self.config)}


def _aliases() -> dict[str, str]:
    """Knob name → vLLM knob name: the dashboard palette's short names (``budget``, ``chunk``,
    ``seqs``, ``partial``), ``mode`` and every knob of ``engine_host.config.KNOBS``."""
    from .tui.commands import SHORT_TO_KNOB  # textual: imported only when a spec is parsed

    return SHORT_TO_KNOB


def knob_alias(word: str) -> str | None:
    """The vLLM-spelled knob (or ``mode``) that ``word`` names, or None."""
    return _aliases().get(word.strip().lstrip("-").replace("-", "_").lower())


def knob_names() -> str:
    """The accepted knob names for messages: ``mode, max_num_batched_tokens (budget), …``."""
    short: dict[str, list[str]] = {}
    for k, v in _aliases().items():
        if k != v:
            short.setdefault(v, []).append(k)
    return ", ".join(["mode", *(f"{k} ({', '.join(short[k])})" if k in short else k
                                for k in KNOBS)])


def parse_setting(spec: str, base: SchedulerConfig, label: str = "A",
                  flag: str | None = None) -> Setting:
    """Parse ``KNOB=VALUE[,KNOB=VALUE...]`` (knobs: ``mode`` and ``engine_host.config.KNOBS``;
    vLLM's dashed spelling ``max-num-batched-tokens`` and the dashboard palette's short names
    ``budget``, ``chunk``, ``seqs``, ``partial`` work too; a bare ``continuous`` or
    ``chunked`` means ``mode=…``; "" means the base settings) over ``base``.
    ``auto_budget=itl_p99:50ms,ttft_p99:2s`` (the autopilot's targets; ``off`` turns it off)
    takes the ``TARGET:DURATION`` parts that follow it.

    Raises ConfigError naming the flag, the value and the allowed range or names.
    """
    flag = flag or f"--{label.lower()}"
    changes: dict[str, Any] = {}
    parts: list[str] = []
    for part in str(spec).split(","):
        part = part.strip()
        if parts and "=" not in part and ":" in part and parts[-1].lower().startswith(
                ("auto_budget=", "auto-budget=")):
            parts[-1] += "," + part  # auto_budget=itl_p99:50ms,ttft_p99:2s is one setting
        elif part:
            parts.append(part)
    for part in parts:
        key, sep, val = part.partition("=")
        key = key.strip().lstrip("-").replace("-", "_").lower()
        if not sep:
            if key in ("continuous", "chunked"):
                key, val = "mode", key
            else:
                raise ConfigError(
                    f"{flag} {spec!r}: {part!r} is not KNOB=VALUE; use e.g. "
                    f"mode=chunked,max_num_batched_tokens=2048 (knobs: {knob_names()})")
        name = AUTO_BUDGET if key == AUTO_BUDGET else knob_alias(key)
        if name is None:
            raise ConfigError(f"{flag} {spec!r}: unknown knob {key!r}; knobs are: {knob_names()}")
        key = name
        if key in changes:
            raise ConfigError(f"{flag} {spec!r}: {key} is given twice")
        try:
            changes[key] = parse_value(key, val)
        except ConfigError as e:
            raise ConfigError(f"{flag} {spec!r}: {e}") from None
    try:
        cfg = base.with_changes(**changes)
    except ConfigError as e:
        raise ConfigError(f"{flag} {spec!r}: {e}") from None
    return Setting(label, str(spec), changes, cfg)


def check_repetitions(n: Any) -> int:
    """``--repetitions`` as an int in [1, 100]. Raises ConfigError."""
    lo, hi = REPETITIONS_RANGE
    if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= hi:
        raise ConfigError(f"--repetitions {n!r} is out of range: allowed [{lo}, {hi}]")
    return n


def check_window(w: Any) -> float:
    """``--window`` (s) as a float in [0.5, 3600]. Raises ConfigError."""
    lo, hi = WINDOW_RANGE_S
    try:
        v = float(w)
    except (TypeError, ValueError):
        raise ConfigError(f"--window {w!r} must be a number of seconds in [{lo:g}, {hi:g}]") from None
    if not lo <= v <= hi:
        raise ConfigError(f"--window {v:g} s is out of range: allowed [{lo:g}, {hi:g}] s")
    return v


def run_orders(repetitions: int) -> list[tuple[str, str]]:
    """The order of the two settings in each repetition: AB, BA, AB, … (drift cancels)."""
    return [("A", "B") if i % 2 == 0 else ("B", "A") for i in range(repetitions)]


# ---- runs ---------------------------------------------------------------------------------------

@dataclass
class Run:
    """One measured stretch of one setting: a whole load (sequential) or one window
    (interleaved). ``rep``: 1-based repetition (or window number) of that setting;
    ``t0_ns``/``t1_ns``: its span (monotonic ns); ``gpu``: mean GPU saturation fields over it
    (``Samplers.gpu_means``; empty without samplers)."""

    label: str
    rep: int
    t0_ns: int
    t1_ns: int
    requests: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    metrics: BenchMetrics | None = None
    gpu: dict[str, float] = field(default_factory=dict)
    load_t0_ns: int = 0  # when the load's clock started (arrival offsets count from it)
    work: dict[str, int] | None = None  # interleaved windows: what was done in the window

    @property
    def duration_s(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9


def _assert_idle(engine: Any) -> None:
    """Each run must start with no requests and an empty KV cache (else it inherits load)."""
    if engine.has_unfinished():
        raise RuntimeError("the engine still holds requests between A/B runs")
    used = engine.kv.usage().used
    if used:
        raise RuntimeError(f"the KV cache still holds {used} blocks between A/B runs")


def _mark(engine: Any, label: str, listeners: Sequence[Callable[[str, Any], None]]) -> EngineEvent:
    """A mark event emitted while no host runs (the same record ``host.mark`` makes). A run's
    opening mark is emitted this way, before the host starts, so that it precedes the load's
    clock origin and every arrival; ``step`` is the first step the run will execute."""
    ev = EngineEvent("mark", engine.step_id, time.monotonic_ns(), label)
    for f in listeners:
        f("event", ev)
    return ev


def run_sequential(engine: Any, specs: Sequence[Any], settings: dict[str, Setting],
                   repetitions: int = 1, *, listeners: Sequence[Callable[[str, Any], None]] = (),
                   console: Any = None, percentiles: Sequence[float] = (50.0, 99.0),
                   goodput: dict[str, float] | None = None, samplers: Any = None,
                   run_id: int = 1, on_run: Callable[[int, int, Run], None] | None = None
                   ) -> list[Run]:
    """Run ``specs`` once per setting per repetition on ``engine``, in :func:`run_orders`.

    Each run gets the same specs (identical arrival offsets, lengths and token ids), starts on
    an idle engine with an empty KV cache, and has the setting in force from its first step.
    ``on_run(i, total, run)`` is called after each run. Returns the runs in execution order.
    Raises RuntimeError if the engine is not idle between runs, and what ``run_load`` raises.
    """
    from .session import run_load

    runs: list[Run] = []
    orders = run_orders(repetitions)
    total = 2 * len(orders)
    for rep, order in enumerate(orders, start=1):
        for label in order:
            _assert_idle(engine)
            st = settings[label]

            def on_start(host: Any, st: Setting = st) -> None:
                host.set_config(**st.knobs())

            _mark(engine, f"ab:{run_id}:{label}:{rep}", listeners)
            res = run_load(engine, specs, listeners=listeners, console=console, on_start=on_start)
            t1 = res.t0_ns + int(res.duration_s * 1e9)
            m = summarize(res.requests, res.duration_s, percentiles=percentiles,
                          goodput=goodput or None, steps=res.steps or None)
            run = Run(label, rep, res.t0_ns, t1, list(res.requests), list(res.steps), m,
                      samplers.gpu_means(res.t0_ns, t1) if samplers is not None else {},
                      load_t0_ns=res.t0_ns)
            runs.append(run)
            if on_run is not None:
                on_run(len(runs), total, run)
    _assert_idle(engine)
    _mark(engine, f"ab:{run_id}:end", listeners)
    return runs


class _Switcher:
    """Alternates the host between two settings every ``window_s`` seconds (a thread)."""

    def __init__(self, engine: Any, settings: dict[str, Setting], order: tuple[str, str],
                 window_s: float, run_id: int, listeners: Sequence[Callable[[str, Any], None]]
                 ) -> None:
        self.engine, self.listeners = engine, listeners
        self.settings, self.order, self.window_s, self.run_id = settings, order, window_s, run_id
        self.first: EngineEvent | None = None
        self.stop = threading.Event()
        self.counts = {k: 0 for k in LABELS}
        self.host: Any = None
        self.thread: threading.Thread | None = None

    def _switch(self, k: int) -> None:
        label = self.order[k % 2]
        self.counts[label] += 1
        name = f"ab:{self.run_id}:{label}:{self.counts[label]}"
        self.host.set_config(**self.settings[label].knobs())
        if k == 0:  # before the host starts: the mark must precede the load's first arrival
            self.first = _mark(self.engine, name, self.listeners)
        else:
            self.host.mark(name)

    def on_start(self, host: Any) -> None:
        self.host = host
        self._switch(0)  # queued before the host starts: in force from the first step
        self.thread = threading.Thread(target=self._loop, name="gpuchef-ab-switch", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        t0 = time.monotonic()
        k = 1
        # Edges on absolute deadlines so that windows do not drift with the switch cost.
        while not self.stop.wait(max(0.0, t0 + k * self.window_s - time.monotonic())):
            self._switch(k)
            k += 1

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5.0)


def windows_from_marks(events: Sequence[Any], run_id: int, end_ns: int) -> list[tuple[str, int, int, int]]:
    """``(label, n, t0_ns, t1_ns)`` for each ``ab:<run_id>:<A|B>:<n>`` mark in ``events``; a
    window ends at the next mark of the run (or ``end_ns``). Windows starting at or after
    ``end_ns`` are dropped."""
    marks = []
    for ev in events:
        if ev.kind != "mark":
            continue
        parts = str(ev.name).split(":")
        if len(parts) >= 3 and parts[0] == "ab" and parts[1] == str(run_id):
            marks.append((ev.t_ns, parts[2:]))
    marks.sort(key=lambda m: m[0])
    out = []
    for i, (t, p) in enumerate(marks):
        if p[0] not in LABELS or len(p) < 2:
            continue
        t1 = marks[i + 1][0] if i + 1 < len(marks) else end_ns
        t1 = min(t1, end_ns)
        if t1 > t:
            out.append((p[0], int(p[1]), t, t1))
    return out


def work_in(requests: Sequence[Any], steps: Sequence[Any], t0: int, t1: int) -> dict[str, int]:
    """What the engine did during ``[t0, t1)``: requests finished, output tokens produced
    (token times in the range), tokens computed (prefill + decode of the steps that started)."""
    finished = sum(1 for r in requests if r.token_times_ns and t0 <= r.token_times_ns[-1] < t1)
    out = sum(1 for r in requests for t in r.token_times_ns if t0 <= t < t1)
    tok = sum(s.num_prefill_tokens + s.num_decode_reqs for s in steps)
    return {"finished": finished, "output_tokens": out, "step_tokens": tok}


def set_window_throughput(m: BenchMetrics, work: dict[str, int], dur_s: float) -> None:
    # Under an open-loop load the requests that *arrived* in a window only measure the arrival
    # process; what a setting did while in force is what finished during its windows.
    m.request_throughput = work["finished"] / dur_s
    m.output_throughput = work["output_tokens"] / dur_s
    m.total_token_throughput = work["step_tokens"] / dur_s


def run_interleaved(engine: Any, specs: Sequence[Any], settings: dict[str, Setting],
                    window_s: float, repetitions: int = 1, *,
                    listeners: Sequence[Callable[[str, Any], None]] = (), console: Any = None,
                    percentiles: Sequence[float] = (50.0, 99.0),
                    goodput: dict[str, float] | None = None, samplers: Any = None,
                    run_id: int = 1, on_run: Callable[[int, int, Run], None] | None = None
                    ) -> tuple[list[Run], float]:
    """One load per repetition while the engine alternates A and B every ``window_s`` s
    (repetition 2 starts with B, and so on). Returns (one Run per window, in time order; the
    share of counted requests that finished after their window ended).

    Windows run from one mark to the next, clipped to the last arrival (the drain after it
    belongs to no setting); a last window shorter than half ``window_s`` is left out. Latency:
    the requests that *arrived* in the window. Throughput (request, output token, total token
    = tokens computed by the steps): what was *done* during the window, per second of it. Steps:
    those that started in it. Raises ConfigError when the load is too short for one window per
    setting; RuntimeError if the engine is not idle at the start; what ``run_load`` raises."""
    from .session import run_load

    runs: list[Run] = []
    straddle = total_reqs = 0
    counts = {k: 0 for k in LABELS}
    for rep, order in enumerate(run_orders(repetitions), start=1):
        _assert_idle(engine)
        sw = _Switcher(engine, settings, order, window_s, run_id, listeners)
        sw.counts = dict(counts)  # window numbers go on across repetitions
        try:
            res = run_load(engine, specs, listeners=listeners, console=console,
                           on_start=sw.on_start)
        finally:
            sw.close()
        counts = dict(sw.counts)
        if not res.requests:
            continue
        horizon = max(r.arrival_ns for r in res.requests) + 1
        events = ([sw.first] if sw.first is not None else []) + list(res.events)
        for label, n, t0, t1 in windows_from_marks(events, run_id, horizon):
            if t1 - t0 < window_s * 0.5e9:
                continue
            reqs = [r for r in res.requests if t0 <= r.arrival_ns < t1]
            steps = [s for s in res.steps if t0 <= s.t_start_ns < t1]
            dur = (t1 - t0) / 1e9
            m = summarize(reqs, dur, percentiles=percentiles, goodput=goodput or None,
                          steps=steps or None)
            work = work_in(res.requests, steps, t0, t1)
            set_window_throughput(m, work, dur)
            total_reqs += len(reqs)
            straddle += sum(1 for r in reqs if r.token_times_ns and r.token_times_ns[-1] > t1)
            run = Run(label, n, t0, t1, reqs, steps, m,
                      samplers.gpu_means(t0, t1) if samplers is not None else {},
                      load_t0_ns=res.t0_ns, work=work)
            runs.append(run)
            if on_run is not None:
                on_run(len(runs), 0, run)
    _assert_idle(engine)
    _mark(engine, f"ab:{run_id}:end", listeners)
    for k in LABELS:
        if not any(r.label == k for r in runs):
            raise ConfigError(
                f"the load was too short for a full --window of setting {k} ({window_s:g} s): "
                "lower --window, or lengthen the load (--num-prompts, --duration, a finite "
                "--request-rate)")
    return runs, (straddle / total_reqs if total_reqs else 0.0)


# ---- comparison ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MetricSpec:
    """A row of the B − A table: ``better`` is "higher", "lower" or "" (shown, not judged)."""

    key: str
    label: str
    better: str
    get: Callable[[BenchMetrics, dict[str, float]], float]


def _pct_get(stem: str, q: float) -> Callable[[BenchMetrics, dict], float]:
    def get(m: BenchMetrics, _g: dict) -> float:
        return next((v for p, v in getattr(m, f"percentiles_{stem}_ms") if p == q), math.nan)
    return get


def _pw(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def metric_specs(percentiles: Sequence[float], goodput: bool, gpu: bool) -> list[MetricSpec]:
    """The rows compared, in vllm bench serve's order, then gpuchef's step and GPU figures."""
    out = [MetricSpec("request_throughput", "Request throughput (req/s)", "higher",
                      lambda m, g: m.request_throughput)]
    if goodput:
        out.append(MetricSpec("request_goodput", "Request goodput (req/s)", "higher",
                              lambda m, g: math.nan if m.request_goodput is None
                              else m.request_goodput))
    out += [MetricSpec("output_throughput", "Output token throughput (tok/s)", "higher",
                       lambda m, g: m.output_throughput),
            MetricSpec("total_token_throughput", "Total token throughput (tok/s)", "higher",
                       lambda m, g: m.total_token_throughput)]
    for stem, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        out.append(MetricSpec(f"mean_{stem}_ms", f"Mean {name} (ms)", "lower",
                              lambda m, g, s=stem: getattr(m, f"mean_{s}_ms")))
        for p in percentiles:
            out.append(MetricSpec(f"p{_pw(p)}_{stem}_ms", f"P{_pw(p)} {name} (ms)", "lower",
                                  _pct_get(stem, p)))
    out += [MetricSpec("steps_per_s", "Steps per second", "", lambda m, g: m.steps_per_s),
            MetricSpec("mean_tokens_per_step", "Mean tokens per step", "",
                       lambda m, g: m.mean_tokens_per_step),
            MetricSpec("num_preemptions", "Preemptions", "lower",
                       lambda m, g: float(m.num_preemptions)),
            MetricSpec("busy_fraction_pct", "Compute busy fraction (%)", "",
                       lambda m, g: m.busy_fraction * 100.0)]
    if gpu:
        out += [MetricSpec("sm_active_pct", "GPU SM active (mean %)", "",
                           lambda m, g: g.get("sm_active", math.nan)),
                MetricSpec("power_w", "GPU power (mean W)", "",
                           lambda m, g: g.get("power_w", math.nan))]
    return out


@dataclass
class DeltaRow:
    """B − A for one metric. ``a``/``b``: pooled over each setting's runs. ``deltas``: B − A of
    each pair of runs (repetition i of A with repetition i of B). ``verdict``: "B better" /
    "B worse" (or "differs" for a metric with no better direction) when the difference exceeds
    the run-to-run spread — the mean of B's runs is further from the mean of A's than the range
    of either setting's runs, and every pair differs the same way — else "within spread";
    "1 run" when there are fewer than two pairs (no spread to judge by)."""

    key: str
    label: str
    better: str
    a: float
    b: float
    delta: float
    delta_pct: float
    deltas: list[float]
    a_runs: list[float]
    b_runs: list[float]
    verdict: str

    @property
    def spread(self) -> tuple[float, float]:
        """(min, max) of the paired deltas; NaNs with fewer than two pairs."""
        d = [x for x in self.deltas if math.isfinite(x)]
        return (min(d), max(d)) if len(d) >= 2 else (math.nan, math.nan)

    @property
    def stdev(self) -> float:
        d = [x for x in self.deltas if math.isfinite(x)]
        return statistics.stdev(d) if len(d) >= 2 else math.nan

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.spread
        return _finite({"key": self.key, "label": self.label, "better": self.better,
                        "a": self.a, "b": self.b, "delta": self.delta,
                        "delta_pct": self.delta_pct, "deltas": self.deltas,
                        "delta_min": lo, "delta_max": hi, "delta_stdev": self.stdev,
                        "a_runs": self.a_runs, "b_runs": self.b_runs, "verdict": self.verdict})


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


@dataclass
class Comparison:
    """Both settings pooled (``pooled[label]``: BenchMetrics over all its runs' requests and
    steps, durations summed; ``pooled_gpu``: duration-weighted GPU means) and the B − A rows."""

    runs: list[Run]
    pooled: dict[str, BenchMetrics]
    pooled_gpu: dict[str, dict[str, float]]
    rows: list[DeltaRow]


def _verdict(spec: MetricSpec, a_runs: list[float], b_runs: list[float]) -> str:
    """Beyond the spread: the mean of B's runs differs from the mean of A's by more than the
    range (max − min) of either setting's own runs, and every pair of runs (A_i, B_i) differs
    in that same direction."""
    pairs = [(x, y) for x, y in zip(a_runs, b_runs) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 2:
        return "1 run" if pairs else "n/a"
    a = [x for x, _ in pairs]
    b = [y for _, y in pairs]
    d = statistics.fmean(b) - statistics.fmean(a)
    noise = max(max(a) - min(a), max(b) - min(b))
    same_sign = all((y - x) * d > 0 for x, y in pairs)
    if abs(d) > noise and same_sign:
        if not spec.better:
            return "differs"
        return "B better" if (d > 0) == (spec.better == "higher") else "B worse"
    return "within spread"


def pool(runs: Sequence[Run], percentiles: Sequence[float],
         goodput: dict[str, float] | None) -> tuple[BenchMetrics, dict[str, float]]:
    """One setting's runs as one: requests and steps concatenated, durations summed."""
    reqs = [r for run in runs for r in run.requests]
    steps = [s for run in runs for s in run.steps]
    dur = sum(r.duration_s for r in runs)
    m = summarize(reqs, max(dur, 1e-9), percentiles=percentiles, goodput=goodput or None,
                  steps=steps or None)
    if runs and all(r.work is not None for r in runs):
        set_window_throughput(m, {k: sum(r.work[k] for r in runs) for k in runs[0].work},
                               max(dur, 1e-9))
    gpu: dict[str, float] = {}
    keys = {k for r in runs for k in r.gpu}
    for k in keys:
        pairs = [(r.gpu[k], r.duration_s) for r in runs if math.isfinite(r.gpu.get(k, math.nan))]
        w = sum(d for _, d in pairs)
        gpu[k] = sum(v * d for v, d in pairs) / w if w > 0 else math.nan
    if steps and len(runs) > 1:
        # summarize's step span would include the idle gaps between runs: use the runs' own.
        m.steps_span_s = sum(_span(r.steps) for r in runs)
        m.steps_per_s = len(steps) / m.steps_span_s if m.steps_span_s > 0 else math.nan
        busy_ms = sum(s.gpu_ms for s in steps)
        m.busy_fraction = busy_ms / (m.steps_span_s * 1e3) if m.steps_span_s > 0 else math.nan
    return m, gpu


def _span(steps: Sequence[Any]) -> float:
    if not steps:
        return 0.0
    return (max(s.t_end_ns for s in steps) - min(s.t_start_ns for s in steps)) / 1e9


def compare(runs: Sequence[Run], percentiles: Sequence[float] = (50.0, 99.0),
            goodput: dict[str, float] | None = None) -> Comparison:
    """Pool each setting's runs and compute B − A per metric (:class:`DeltaRow`).

    Pairs for the spread: the i-th run of A with the i-th run of B (repetition i, or the i-th
    window of each in an interleaved run). Raises ValueError when a setting has no run."""
    by = {k: sorted([r for r in runs if r.label == k], key=lambda r: (r.rep, r.t0_ns))
          for k in LABELS}
    for k in LABELS:
        if not by[k]:
            raise ValueError(f"setting {k} has no run to compare")
    pooled, pooled_gpu = {}, {}
    for k in LABELS:
        pooled[k], pooled_gpu[k] = pool(by[k], percentiles, goodput)
    has_gpu = any(math.isfinite(v) for g in pooled_gpu.values() for v in g.values())
    rows = []
    for spec in metric_specs(percentiles, bool(goodput), has_gpu):
        a = spec.get(pooled["A"], pooled_gpu["A"])
        b = spec.get(pooled["B"], pooled_gpu["B"])
        a_runs = [spec.get(r.metrics, r.gpu) for r in by["A"]]
        b_runs = [spec.get(r.metrics, r.gpu) for r in by["B"]]
        deltas = [y - x for x, y in zip(a_runs, b_runs)]
        d = b - a
        dp = d / a * 100.0 if math.isfinite(a) and a != 0 else math.nan
        rows.append(DeltaRow(spec.key, spec.label, spec.better, a, b, d, dp, deltas, a_runs,
                             b_runs, _verdict(spec, a_runs, b_runs)))
    return Comparison(list(runs), pooled, pooled_gpu, rows)


# ---- text output --------------------------------------------------------------------------------

LABEL_W = 40
COL_W = 16


def _split_row(line: str) -> tuple[str, str] | None:
    """A results-block row ``"{:<40} {value}"`` as (label, value); None for a header line."""
    if len(line) > LABEL_W and line[LABEL_W] == " " and line[:LABEL_W].rstrip().endswith(":"):
        return line[:LABEL_W].rstrip(), line[LABEL_W + 1:].strip()
    return None


def side_by_side(block_a: str, block_b: str, title: str, heads: tuple[str, str] = ("A", "B")) -> str:
    """Merge two ``format_results_block`` texts into one with two value columns. Rows are
    matched by label (a row only one block has shows "" in the other column); section headers
    are re-centred to the wider block."""
    width = LABEL_W + 1 + 2 * COL_W
    rows_b: dict[tuple[str, str], str] = {}
    section = ""
    for line in block_b.splitlines():
        r = _split_row(line)
        if r is None:
            section = line.strip("=- ")
        else:
            rows_b[(section, r[0])] = r[1]
    out = ["{s:=^{n}}".format(s=f" {title} ", n=width),
           "{:<{w}} {:>{c}}{:>{c}}".format("", heads[0], heads[1], w=LABEL_W, c=COL_W)]
    section = ""
    lines = block_a.splitlines()
    for i, line in enumerate(lines):
        r = _split_row(line)
        if r is None:
            section = line.strip("=- ")
            if i == 0:
                continue  # title: replaced above
            if not section:
                out.append(line[0] * width if line else line)
            else:
                out.append("{s:{c}^{n}}".format(s=section, c=line[0], n=width))
            continue
        vb = rows_b.pop((section, r[0]), "")
        out.append("{:<{w}} {:>{c}}{:>{c}}".format(r[0], r[1], vb, w=LABEL_W, c=COL_W).rstrip())
    return "\n".join(out)


def _num(v: float, digits: int = 2) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:.{digits}f}"


def format_deltas(cmp: Comparison, unit_name: str = "repetition") -> str:
    """The B − A table: pooled A and B, B − A, B − A in %, the min..max of the paired deltas
    over the repetitions (or windows), and the verdict (see :class:`DeltaRow`)."""
    n = min(sum(1 for r in cmp.runs if r.label == k) for k in LABELS)
    head = f" B − A (spread over {n} {unit_name}{'s' if n != 1 else ''}) "
    fmt = "{:<32}{:>11}{:>11}{:>11}{:>9}{:>21}  {:<13}"
    width = 32 + 11 * 3 + 9 + 21 + 2 + 13
    lines = ["{s:-^{n}}".format(s=head, n=width),
             fmt.format("metric", "A", "B", "B − A", "%", "B − A min..max", "verdict")]
    for r in cmp.rows:
        lo, hi = r.spread
        spread = f"{_num(lo)}..{_num(hi)}" if math.isfinite(lo) else "—"
        pct = f"{r.delta_pct:+.1f}%" if math.isfinite(r.delta_pct) else "n/a"
        delta = f"{r.delta:+.2f}" if math.isfinite(r.delta) else "n/a"
        lines.append(fmt.format(r.label[:31], _num(r.a), _num(r.b), delta, pct, spread,
                                r.verdict).rstrip())
    lines.append("-" * width)
    lines.append("A, B: pooled over the runs. Verdict: B better/worse when B − A exceeds the "
                 "run-to-run spread (the\nmeans of the runs differ by more than either "
                 "setting's range, and every pair of runs agrees).")
    if n == 2:
        lines.append("With 2 runs each the verdict is weak: use --repetitions 3 or more.")
    return "\n".join(lines)
