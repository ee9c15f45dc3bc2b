"""Capacity under latency SLOs: the highest request rate a setting sustains while every SLO holds.

Method: Sarathi-Serve's evaluation (Agrawal et al., OSDI 2024, §5) defines *capacity* as the
highest load (requests/s) at which the system still meets its latency targets (there: P99
time-between-tokens, with the median scheduling delay kept under 2 s), found by a binary search
over the request rate in which every probe is a full benchmark run. :func:`capacity_search` does
that bisection as a pure function over a ``measure(rate) -> metrics`` callable, so that it can be
tested against a synthetic latency model; ``gpuchef ab --capacity`` supplies a ``measure`` that
runs the engine.

The midpoint is geometric (``sqrt(lo·hi)``), so the bracket shrinks by the same *ratio* each
probe whatever the scale of the rates (0.5 req/s on a CPU, 50 on an H200). Bisection assumes that
meeting the SLOs is monotone in the rate; measurement noise near the capacity can break that, so
the result is "a rate that met the SLOs, with a failing rate within the tolerance above it".

A probe's **rate is what it offered**: its requests' count over their arrival span
(:func:`offered_rate`), from the probe's own workload — a replayed trace that gets denser later
offers more than its first seconds suggest, so ``gpuchef ab`` refines the trace speed until the
probe's own arrivals offer the rate asked for. A probe **meets** when every SLO holds and it is
not saturated (:func:`judge_load`: achieved short of offered by more than
``SATURATION_TOLERANCE``, or the waiting queue growing through the probe) — a median that holds
while the queue grows is not capacity. A probe whose SLO is broken beyond doubt stops early
(``experiments.early_stop.EarlyStop``). A met probe shorter than the steady-state rule
(``MIN_PROBE_SPAN_S`` and
``STEADY_E2EL_FACTOR`` × its median E2EL) is flagged. docs/capacity.md compares the method with
Sarathi-Serve's and vLLM's ``vllm bench sweep serve_sla``.

SLO metrics use ``vllm bench serve``'s definitions (probes/metrics.py): TTFT, TPOT, ITL (one
per output chunk), E2EL — each as mean, median or any percentile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..engine_host.vocab.errors import ConfigError
from ..engine_host.vocab.config import parse_latency_targets
from ..engine_host.vocab.records import RequestRecord, StepOutput
from ..engine_host.vocab.workload import PROBE_ID_PREFIX
from ..probes.metrics import DEFAULT_PERCENTILES, WITHDRAWN_REASON, is_completed

SLO_METRICS = ("ttft", "tpot", "itl", "e2el")
RATE_RANGE = (1e-3, 1e6)  # req/s
DEFAULT_MAX_PROBES = 16


@dataclass(frozen=True)
class SLO:
    """One latency target: ``metric`` (ttft/tpot/itl/e2el), ``stat`` ("mean", "median" or
    "p<q>" with q in [0, 100]) and ``limit_ms`` (ms). Met when the measured value is <= the
    limit; a value that could not be measured (NaN: no requests) does not meet it."""

    metric: str
    stat: str
    limit_ms: float

    @property
    def key(self) -> str:
        """``itl_p99``: also the key a Mapping ``measure`` result is read with."""
        return f"{self.metric}_{self.stat}"

    @property
    def percentile(self) -> float | None:
        if self.stat.startswith("p"):
            return float(self.stat[1:])
        return None

    def value(self, m: Any) -> float:
        """The measured value (ms) from a ``BenchMetrics`` or a Mapping {key: ms}."""
        if isinstance(m, Mapping):
            v = m.get(self.key, math.nan)
            return math.nan if v is None else float(v)
        if self.stat in ("mean", "median"):
            return float(getattr(m, f"{self.stat}_{self.metric}_ms"))
        q = self.percentile
        for p, v in getattr(m, f"percentiles_{self.metric}_ms"):
            if p == q:
                return float(v)
        raise ConfigError(f"percentile P{q:g} of {self.metric} was not computed for this run")

    def met(self, m: Any) -> bool:
        v = self.value(m)
        return math.isfinite(v) and v <= self.limit_ms

    def __str__(self) -> str:
        return f"{self.key} ≤ {self.limit_ms:g} ms"


def parse_slos(spec: str | Sequence[str]) -> list[SLO]:
    """Parse ``"itl_p99:100ms,ttft_p99:2000ms"`` into SLOs, with the grammar ``--auto-budget``
    shares (``engine_host.vocab.config.parse_latency_targets``: pairs split by commas or spaces,
    values in ms by default or with a ``ms``/``s`` unit).

    Keys are ``<metric>_<stat>``: metric ttft, tpot, itl or e2el; stat mean, median or p<q>
    (q in [0, 100], e.g. p50, p90, p99, p99.9). Raises ConfigError naming the bad pair and what
    is allowed; an empty spec or a key given twice is an error.
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    targets = parse_latency_targets(" ".join(str(s) for s in parts), flag="--slo",
                                    metrics=SLO_METRICS,
                                    example="e.g. itl_p99:100ms,ttft_p99:2000ms")
    if not targets:
        raise ConfigError("--slo is empty: give e.g. itl_p99:100ms,ttft_p99:2000ms")
    return [SLO(t.metric, t.stat, t.ms) for t in targets]


def slo_percentiles(slos: Sequence[SLO]) -> tuple[float, ...]:
    """The percentiles the SLOs need computed (for ``summarize(percentiles=...)``)."""
    return tuple(sorted({s.percentile for s in slos if s.percentile is not None}))


@dataclass(frozen=True)
class Tolerance:
    """When the bisection stops: the bracket [met, failed] is narrower than ``abs_rps`` req/s
    (if set) or than ``rel`` of its lower end (if set)."""

    rel: float | None = 0.05
    abs_rps: float | None = None

    def done(self, lo: float, hi: float) -> bool:
        if self.abs_rps is not None and hi - lo <= self.abs_rps:
            return True
        return self.rel is not None and lo > 0 and hi / lo - 1.0 <= self.rel

    def __str__(self) -> str:
        return f"{self.rel * 100:g}%" if self.rel is not None else f"{self.abs_rps:g} req/s"


def parse_tolerance(text: Any) -> Tolerance:
    """``"5%"`` (relative: stop when hi/lo − 1 <= 5 %) or ``"0.5"`` (absolute, req/s: stop
    when hi − lo <= 0.5). Raises ConfigError for anything else or a value <= 0."""
    s = str(text).strip().lower()
    rel = s.endswith("%")
    num = s[:-1] if rel else s.removesuffix("req/s").strip()
    try:
        v = float(num)
    except ValueError:
        raise ConfigError(f"--tolerance {text!r} must be a percentage (5%) or req/s (0.5)") from None
    if not (math.isfinite(v) and v > 0) or (rel and v >= 100):
        raise ConfigError(f"--tolerance {text!r} is out of range: allowed (0%, 100%) or > 0 req/s")
    return Tolerance(rel=v / 100.0, abs_rps=None) if rel else Tolerance(rel=None, abs_rps=v)


def check_rates(lo: Any, hi: Any) -> tuple[float, float]:
    """``--rate-lo``/``--rate-hi`` (req/s) as floats with 0 < lo < hi. Raises ConfigError."""
    a, b = RATE_RANGE
    vals = []
    for name, v in (("--rate-lo", lo), ("--rate-hi", hi)):
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} {v!r} must be a number of req/s") from None
        if not (math.isfinite(x) and a <= x <= b):
            raise ConfigError(f"{name} {v!r} is out of range: allowed [{a:g}, {b:g}] req/s")
        vals.append(x)
    if not vals[0] < vals[1]:
        raise ConfigError(f"--rate-lo {vals[0]:g} must be below --rate-hi {vals[1]:g}")
    return vals[0], vals[1]


# ---- one probe: offered and achieved rate, saturation, early stop ------------------------------

#: Steady state: a probe's arrivals must span at least this (s) and ``STEADY_E2EL_FACTOR`` × its
#: median E2EL, else its row says it is too short to show a sustained rate.
MIN_PROBE_SPAN_S = 20.0
STEADY_E2EL_FACTOR = 10.0
#: The first ``WARMUP_SHARE`` of a probe's arrival span is its warm-up (an empty engine fills
#: up); offered and achieved rates and the queue are judged over the rest.
WARMUP_SHARE = 0.25
#: Saturation, rule 1: achieved below (1 − this) × offered over the judged span. Rule 1 is the
#: gross check (the issue's probe served 18.4 of 29 req/s: 0.63); rule 2 the fine one. Served
#: probes of a replayed trace read below 1 because the number in the system grows through a
#: finite probe (Little's law: arrivals getting denser, outputs getting longer) — 0.87 to 0.93 on
#: the H200 for probes with P50 TTFT ≤ 50 ms and no queue (docs/capacity.md) — so 10 % failed them.
SATURATION_TOLERANCE = 0.20
#: Saturation, rule 2: the mean waiting queue of the last quarter of the arrival span exceeds
#: that of the second quarter by more than this many requests and more than doubles.
QUEUE_GROWTH_MIN = 4.0


#: ``finish_reason`` of the requests an early stop aborts (RequestRecord; the trace keeps it):
#: withdrawn, neither completed nor failed (``probes.metrics.is_withdrawn`` owns the rule).
EARLY_STOP_REASON = WITHDRAWN_REASON


def judging_rules() -> dict[str, float]:
    """The constants a probe is judged by, as a capacity trace's meta keeps them
    (``meta.ab.rules``), so that a report can say when it judges a trace by other ones."""
    return {"saturation_tolerance": SATURATION_TOLERANCE, "warmup_share": WARMUP_SHARE,
            "queue_growth_min": QUEUE_GROWTH_MIN, "min_probe_span_s": MIN_PROBE_SPAN_S,
            "steady_e2el_factor": STEADY_E2EL_FACTOR}


def rules_note(recorded: Any) -> str:
    """"" when ``recorded`` (a trace's ``meta.ab.rules``) equals :func:`judging_rules`, else
    one sentence saying that the trace is judged by today's rules and what differs."""
    now = judging_rules()
    if not isinstance(recorded, dict):
        return ("The trace does not record the rules its command judged by (an older "
                f"trace): it is judged by today's (rule 1 at {SATURATION_TOLERANCE:.0%}), "
                "so a verdict can differ from the command's at the time.")
    diff = [f"{k} {recorded.get(k)!r} then, {v!r} now" for k, v in now.items()
            if recorded.get(k) != v]
    return ("" if not diff else "The command judged by other rules than today's, which judge "
            "the probes here: " + "; ".join(diff) + ".")


def probe_mark(label: str, rate: float) -> str:
    """The mark that opens a probe in the trace: ``capacity:<A|B>:<rate asked, req/s>``."""
    return f"capacity:{label}:{rate:.4g}"


def stop_mark(label: str, reason: str) -> str:
    """The mark of an early stop: ``capacity:<A|B>:stopped:<reason>``."""
    return f"capacity:{label}:stopped:{reason}"


def parse_capacity_mark(name: Any) -> tuple[str, float | None, str] | None:
    """(label, rate asked or None, stop reason or "") of a :func:`probe_mark` or
    :func:`stop_mark` name; None for any other name."""
    parts = str(name).split(":", 3)
    if len(parts) < 3 or parts[0] != "capacity" or parts[1] not in ("A", "B"):
        return None
    if parts[2] == "stopped":
        return parts[1], None, parts[3] if len(parts) > 3 else ""
    try:
        return parts[1], float(parts[2]), ""
    except ValueError:
        return None


def offered_rate(arrivals_s: Sequence[float]) -> float:
    """A load's offered rate (req/s): its requests' count over their arrival span, as
    ``(n − 1) / (last − first)`` (n − 1 gaps: the rate of the arrival process, whatever the
    first arrival's offset). NaN for fewer than two requests or a zero span."""
    a = sorted(arrivals_s)
    if len(a) < 2 or a[-1] <= a[0]:
        return math.nan
    return (len(a) - 1) / (a[-1] - a[0])


@dataclass
class Measured:
    """What one probe of ``gpuchef ab --capacity`` measured. ``metrics``: BenchMetrics (or a
    Mapping {SLO key: ms}); ``offered_rps``: :func:`offered_rate` of its workload;
    ``achieved_rps``: the finish rate of the judged requests (those after the warm-up,
    its inner 80 %, :func:`judge_load`); ``judged_offered_rps``: the arrival rate of the same
    requests, the figure achieved is held against (a replayed trace's arrivals get denser, so it
    can exceed ``offered_rps``); ``span_s``: its arrival span; ``failures``: the rules it broke
    besides the SLOs (saturation, with numbers); ``stopped_early``: why it was cut short
    (an SLO already broken beyond doubt), "" if it ran to the end; ``notes``: e.g. too short."""

    metrics: Any
    offered_rps: float = math.nan
    achieved_rps: float = math.nan
    span_s: float = math.nan
    failures: list[str] = field(default_factory=list)
    stopped_early: str = ""
    notes: list[str] = field(default_factory=list)
    judged_offered_rps: float = math.nan


#: Rule 1 compares the spread of the judged requests' arrivals and of their finishes between
#: these quantiles (inner 80 %), so that one long output at either edge does not set a rate.
RATE_QUANTILES = (0.10, 0.90)


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of sorted ``xs`` (numpy's default)."""
    h = q * (len(xs) - 1)
    i = int(math.floor(h))
    return xs[i] + (h - i) * (xs[min(i + 1, len(xs) - 1)] - xs[i])


def judge_load(arrivals_ns: Sequence[int], finishes_ns: Sequence[int | None],
               steps: Sequence[Any], median_e2el_ms: float = math.nan
               ) -> tuple[float, float, list[str], list[str]]:
    """(offered req/s over the judged span, achieved req/s of the same requests, saturation
    rules broken, notes) of one probe. ``arrivals_ns``: every request's arrival;
    ``finishes_ns``: each one's last token time, in the same order (None: it did not complete);
    ``steps``: its StepRecords (``num_waiting``). The judged requests are those that arrived
    after the first ``WARMUP_SHARE`` of the arrival span (an empty engine fills up first).

    Rule 1 (achieved short of offered): the judged requests' finishes come at a rate below
    (1 − ``SATURATION_TOLERANCE``) × the rate their arrivals came at, each rate taken as the
    share of them between the ``RATE_QUANTILES`` over the time that share spans (a request not
    completed finishes at +inf). Served, each finish is its arrival plus its own time in the
    system, so the finishes span the arrivals' time plus how much that time in system grew
    (a denser trace, longer outputs, slower steps: up to seconds over a probe, hence the
    tolerance); saturated, they come at the engine's service rate whatever arrives. Counting
    the finishes inside the arrival span instead, even shifted by the warm-up's service time,
    calls a probe saturated whose requests' E2EL merely grew through it (on an H200: P50 TTFT
    62 ms, drained 3.8 s after the last arrival, yet "achieved 5.81 of 8.48 req/s").
    Rule 2 (queue growing): the mean ``num_waiting`` of the steps in the last quarter of the
    arrival span exceeds the second quarter's by more than ``QUEUE_GROWTH_MIN`` and is more
    than twice it. Notes: the span is
    shorter than ``MIN_PROBE_SPAN_S`` or ``STEADY_E2EL_FACTOR`` × the median E2EL. Raises
    ValueError when the two lists differ in length."""
    if len(finishes_ns) != len(arrivals_ns):
        raise ValueError(f"judge_load: {len(arrivals_ns)} arrivals but {len(finishes_ns)} "
                         "finishes (one per arrival, None when it did not complete)")
    fails: list[str] = []
    notes: list[str] = []
    if len(arrivals_ns) < 2:
        return math.nan, math.nan, fails, ["fewer than 2 requests"]
    a0, a1 = min(arrivals_ns), max(arrivals_ns)
    span = (a1 - a0) / 1e9
    if span <= 0:
        return math.nan, math.nan, fails, ["every request arrived at once"]
    w0 = a0 + int(WARMUP_SHARE * (a1 - a0))
    judged = [(a, f) for a, f in zip(arrivals_ns, finishes_ns) if a >= w0]
    offered = achieved = math.nan
    if len(judged) >= 2:
        lo, hi = RATE_QUANTILES
        share = (hi - lo) * (len(judged) - 1)
        arr = sorted(float(a) for a, _ in judged)
        done = sorted(float(f) for _, f in judged if f is not None)
        da = (_quantile(arr, hi) - _quantile(arr, lo)) / 1e9
        offered = share / da if da > 0 else math.nan
        if math.ceil(hi * (len(judged) - 1)) >= len(done):  # the hi quantile is a non-finish
            achieved = 0.0
        else:  # the not completed sort last (+inf): the quantiles fall among the finished
            fin = done + [math.inf] * (len(judged) - len(done))
            df = (_quantile(fin, hi) - _quantile(fin, lo)) / 1e9
            achieved = share / df if df > 0 else math.nan
        if math.isfinite(offered) and achieved < (1.0 - SATURATION_TOLERANCE) * offered:
            fails.append(f"saturated: achieved {achieved:.3g} req/s < "
                         f"{1 - SATURATION_TOLERANCE:.0%} of offered {offered:.3g} req/s (the "
                         f"finishes vs the arrivals of the requests after the first "
                         f"{WARMUP_SHARE:.0%}, which arrive faster than the whole probe's "
                         f"rate when the trace gets denser)")
    q = (a1 - a0) / 4
    def waiting(lo: float, hi: float) -> float:
        v = [s.num_waiting for s in steps if lo <= s.t_start_ns < hi]
        return sum(v) / len(v) if v else math.nan
    w2, w4 = waiting(a0 + q, a0 + 2 * q), waiting(a0 + 3 * q, a1 + 1)
    if math.isfinite(w2) and math.isfinite(w4) and w4 - w2 > QUEUE_GROWTH_MIN and w4 > 2 * w2:
        fails.append(f"saturated: the waiting queue grew from {w2:.3g} to {w4:.3g} requests "
                     "(mean of the 2nd and 4th quarter of the arrivals)")
    need = max(MIN_PROBE_SPAN_S, STEADY_E2EL_FACTOR * median_e2el_ms / 1e3
               if math.isfinite(median_e2el_ms) else 0.0)
    if span < need:
        notes.append(f"arrivals span {span:.3g} s < {need:.3g} s (steady state: at least "
                     f"{MIN_PROBE_SPAN_S:g} s and {STEADY_E2EL_FACTOR:g}× the median E2EL)")
    return offered, achieved, fails, notes


def judge_probe(requests: Sequence[Any], steps: Sequence[Any], start_ns: int, *,
                percentiles: Sequence[float] = DEFAULT_PERCENTILES, goodput: dict | None = None,
                stopped: str = "", stopped_ns: int | None = None) -> Measured:
    """A probe's :class:`Measured` from its records alone (``gpuchef ab --capacity`` and the
    report of its trace both call this): ``summarize`` over its requests (duration from
    ``start_ns`` to the last token), the offered rate of their arrivals (probe requests left
    out), and :func:`judge_load`'s achieved rate, saturation rules and notes — not judged for a
    probe ``stopped`` early (a partial run, at ``stopped_ns``), whose note says when."""
    from ..probes.metrics import summarize

    mine = [r for r in requests if not str(r.request_id).startswith(PROBE_ID_PREFIX)]
    ends = [r.token_times_ns[-1] for r in requests if r.token_times_ns]
    last = max(ends) if ends else start_ns + 1
    m = summarize(requests, max(1e-9, (last - start_ns) / 1e9), percentiles=percentiles,
                  goodput=goodput or None, steps=steps or None)
    arr = [r.arrival_ns for r in mine]
    off = offered_rate([a / 1e9 for a in arr])
    span = (max(arr) - min(arr)) / 1e9 if len(arr) > 1 else math.nan
    if stopped:
        at = (stopped_ns if stopped_ns is not None else last) - start_ns
        note = (f"stopped at {at / 1e9:.1f} s of {(max(arr) - start_ns) / 1e9:.1f} s of "
                "arrivals" if arr else "stopped")
        if m.withdrawn:
            note += f"; {m.withdrawn} of {len(mine)} requests withdrawn (not failed)"
        return Measured(m, off, math.nan, span, [], stopped, [note])
    fin = [r.token_times_ns[-1] if is_completed(r.finish_reason) and r.token_times_ns
           else None for r in mine]
    judged, achieved, fails, notes = judge_load(arr, fin, steps, m.median_e2el_ms)
    return Measured(m, off, achieved, span, fails, "", notes, judged)


def stopped_slo(reason: str, slos: Sequence[SLO]) -> SLO | None:
    """The SLO an early stop's ``reason`` proved broken (``early_stop.EarlyStop`` writes
    ``"<key> > <limit> ms certain (...)"``; the trace's stop mark keeps it), or None."""
    for s in slos:
        if str(reason).startswith(f"{s.key} > "):
            return s
    return None


def probe_of(ms: Measured, slos: Sequence[SLO], target: float = math.nan) -> "Probe":
    """The :class:`Probe` of a measurement: every broken rule in ``fails`` (the SLOs with their
    values, saturation; an early stop alone when it stopped), met when there is none.

    A probe stopped early has no value for any SLO — its figures cover only the requests that
    finished before the stop (14 of 168 in one run: an ITL P99 of 143.6 ms beside "itl_p99 >
    200 ms certain"), not the run — so ``values`` are NaN, and ``above`` holds what the stop
    proved: the broken SLO's key → its limit (ms), a bound the statistic exceeds."""
    m = ms.metrics
    values = {s.key: s.value(m) for s in slos}
    above: dict[str, float] = {}
    if ms.stopped_early:  # the partial run's own figures say less than the reason
        values = {k: math.nan for k in values}
        broken = stopped_slo(ms.stopped_early, slos)
        if broken is not None:
            above[broken.key] = broken.limit_ms
        fails = [f"stopped early: {ms.stopped_early}"]
    else:
        fails = [f"{s.key} {values[s.key]:.4g} ms > {s.limit_ms:g} ms" if math.isfinite(
                 values[s.key]) else f"{s.key} not measured" for s in slos if not s.met(m)]
        fails += ms.failures
    rate = ms.offered_rps if math.isfinite(ms.offered_rps) else target
    return Probe(rate, not fails, values, m, target, ms.achieved_rps, ms.span_s, fails,
                 ms.stopped_early, list(ms.notes), ms.judged_offered_rps, above)


@dataclass
class Probe:
    """One measured rate. ``rate``: what the probe offered (req/s, :func:`offered_rate` of its
    workload; the rate asked for when unknown), ``met``: every SLO held and no other rule
    failed, ``values``: SLO key → measured ms, ``metrics``: what ``measure`` returned (its
    ``metrics``), ``target``: the rate the search asked for, ``achieved``: the finish
    rate of the requests after the warm-up, ``judged_offered``: their arrival rate (what
    ``achieved`` is held against, :func:`judge_load`), ``span_s``: the arrival span, ``fails``: every rule broken (an SLO: "itl_p99 126 ms > 100
    ms"; saturation; an early stop), ``stopped_early``: why it was cut short, ``notes``,
    ``above``: for a probe stopped early, the SLO key it proved broken → the limit (ms) its
    value is known to exceed (its ``values`` are NaN: a partial run measures no SLO)."""

    rate: float
    met: bool
    values: dict[str, float]
    metrics: Any = None
    target: float = math.nan
    achieved: float = math.nan
    span_s: float = math.nan
    fails: list[str] = field(default_factory=list)
    stopped_early: str = ""
    notes: list[str] = field(default_factory=list)
    judged_offered: float = math.nan
    above: dict[str, float] = field(default_factory=dict)

    def value_text(self, key: str, fmt: str = "{:.1f}") -> str:
        """An SLO's cell in a table: its value (``fmt``), "> limit" when an early stop proved
        it broken, "n/a" when not measured (none finished, or the probe stopped early)."""
        if key in self.above:
            return f"> {self.above[key]:g}"
        v = self.values.get(key, math.nan)
        return fmt.format(v) if math.isfinite(v) else "n/a"

    @property
    def why(self) -> str:
        """The rules it broke, "; "-joined ("" when it met them all)."""
        return "; ".join(self.fails)


@dataclass
class CapacityResult:
    """The outcome of :func:`capacity_search`.

    ``capacity``: the highest offered rate (req/s) that met every SLO, None when even the
    first probe failed. ``at_upper_bound``: ``rate_hi`` itself met them (capacity ≥ it: raise
    --rate-hi). ``bracket``: (highest met, lowest failed), offered rates — the true capacity
    lies between. ``probes``: in the order measured. ``converged``: the bracket was narrowed
    to the tolerance (True) or the search stopped at ``max_probes`` first (False); None when
    there is no bracket to narrow — ``at_upper_bound`` (capacity ≥ ``rate_hi``) or capacity
    None (fails at ``rate_lo``) — so a bound is never marked converged.
    """

    capacity: float | None
    at_upper_bound: bool
    bracket: tuple[float | None, float | None]
    probes: list[Probe] = field(default_factory=list)
    converged: bool | None = True

    def __post_init__(self) -> None:
        if self.at_upper_bound or self.capacity is None:
            self.converged = None

    def short_probes(self, min_span_s: float = MIN_PROBE_SPAN_S) -> list[Probe]:
        """Probes that met the SLOs but are too short for steady state: a note from
        :func:`judge_load`, or (without a measured span) arrivals spanning less than
        ``min_span_s`` (requests completed / rate: 20 requests at 32 req/s arrive in 0.6 s)."""
        out = []
        for p in self.probes:
            if not p.met:
                continue
            if p.notes:
                out.append(p)
                continue
            span = p.span_s
            if not math.isfinite(span):
                n = getattr(p.metrics, "completed", None)
                span = n / p.rate if n is not None and p.rate > 0 else math.nan
            if math.isfinite(span) and span < min_span_s:
                out.append(p)
        return out

    def describe(self) -> str:
        s = self._describe()
        short = self.short_probes()
        if short:
            s += (f" — warning: {len(short)} probe(s) that met the SLOs are too short for a "
                  f"steady state (arrivals < {MIN_PROBE_SPAN_S:g} s or < {STEADY_E2EL_FACTOR:g}"
                  f"× the median E2EL; e.g. {short[-1].rate:.3g} req/s): give a longer "
                  "--duration")
        return s

    def _describe(self) -> str:
        if self.capacity is None:
            lo = self.probes[0].rate if self.probes else math.nan
            return f"none: the SLOs fail already at {lo:.3g} req/s (the lowest rate tried)"
        if self.at_upper_bound:
            return f"≥ {self.capacity:.3g} req/s (met at --rate-hi; raise it)"
        lo, hi = self.bracket
        s = f"{self.capacity:.3g} req/s offered (fails at {hi:.3g})"
        return s if self.converged else s + " — not converged: probe limit reached"

    def as_dict(self) -> dict[str, Any]:
        def f(v: Any) -> Any:
            return None if isinstance(v, float) and not math.isfinite(v) else v
        return {"capacity_rps": self.capacity, "at_upper_bound": self.at_upper_bound,
                "bracket_rps": list(self.bracket), "converged": self.converged,
                "probes": [{"rate_rps": f(p.rate), "offered_rps": f(p.rate),
                            "target_rps": f(p.target), "achieved_rps": f(p.achieved),
                            "judged_offered_rps": f(p.judged_offered),
                            "arrival_span_s": f(p.span_s), "met": p.met, "fails": p.fails,
                            "stopped_early": p.stopped_early or None, "notes": p.notes,
                            "values_ms": {k: f(v) for k, v in p.values.items()},
                            "values_above_ms": dict(p.above)}
                           for p in self.probes]}


def capacity_search(measure: Callable[[float], Any], slos: Sequence[SLO], rate_lo: float,
                    rate_hi: float, tolerance: Tolerance = Tolerance(),
                    max_probes: int = DEFAULT_MAX_PROBES,
                    on_probe: Callable[[Probe], None] | None = None) -> CapacityResult:
    """Bisect over the request rate for the highest rate at which ``measure(rate)`` meets every
    SLO and no saturation rule (Sarathi-Serve's capacity search; see the module docstring).

    ``measure(rate)`` (req/s asked for) returns a :class:`Measured` (its offered rate is the
    probe's rate, its ``failures`` and ``stopped_early`` fail the probe), or a plain
    ``BenchMetrics``/Mapping {SLO key: ms} (the probe's rate is then the one asked for).
    Probes ``rate_lo`` first (if it fails: capacity None), then ``rate_hi`` (if it holds:
    capacity ``rate_hi``'s offered rate, ``at_upper_bound``), then geometric midpoints of the
    asked rates until ``tolerance`` says the bracket is narrow enough or ``max_probes`` runs
    were made. ``on_probe`` sees each probe. Raises ConfigError for rates out of order, no
    SLOs or ``max_probes`` < 2.
    """
    if not slos:
        raise ConfigError("capacity search needs at least one SLO (--slo)")
    if max_probes < 2:
        raise ConfigError(f"max_probes {max_probes} must be >= 2")
    lo, hi = check_rates(rate_lo, rate_hi)
    probes: list[Probe] = []
    offered: dict[float, float] = {}

    def probe(rate: float) -> bool:
        got = measure(rate)
        p = probe_of(got if isinstance(got, Measured) else Measured(got), slos, rate)
        offered[rate] = p.rate
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p.met

    if not probe(lo):
        return CapacityResult(None, False, (None, offered[lo]), probes)
    if probe(hi):
        return CapacityResult(offered[hi], True, (offered[hi], None), probes)
    ok, bad = lo, hi
    while not tolerance.done(ok, bad):
        if len(probes) >= max_probes:
            return CapacityResult(offered[ok], False, (offered[ok], offered[bad]), probes,
                                  converged=False)
        mid = math.sqrt(ok * bad)
        if probe(mid):
            ok = mid
        else:
            bad = mid
    return CapacityResult(offered[ok], False, (offered[ok], offered[bad]), probes)


def capacity_ratio(a: CapacityResult, b: CapacityResult) -> tuple[float | None, str, str | None]:
    """(B/A, text, bound). ``bound``: "upper" when B/A is only an upper bound (A met the SLOs
    at --rate-hi, so A's capacity is at least that: text ``≤ …``), "lower" when it is only a
    lower bound (B met them at --rate-hi: ``≥ …``), None when the ratio is a value. The ratio is
    None with a reason when it cannot be given, ``inf`` when only B meets the SLOs in the range
    and 0.0 when only A does."""
    ca, cb = a.capacity, b.capacity
    if ca is None and cb is None:
        return None, "n/a: neither setting meets the SLOs in the rate range", None
    if ca is None:
        return math.inf, "∞: B meets the SLOs at rates where A never does", None
    if cb is None:
        return 0.0, "0: A meets the SLOs, B never does in the rate range", None
    if a.at_upper_bound and b.at_upper_bound:
        return None, "n/a: both meet the SLOs at --rate-hi (raise it)", None
    r = cb / ca
    if a.at_upper_bound:
        return r, f"≤ {r:.2f}×", "upper"
    if b.at_upper_bound:
        return r, f"≥ {r:.2f}×", "lower"
    return r, f"{r:.2f}×", None


# ---- a probe's workload ----------------------------------------------------------------------

def trace_rate(wcfg) -> float:
    """The native request rate of a trace dataset (req/s at --trace-speed 1) over the requests
    the load selects (:func:`offered_rate`)."""
    from ..engine_host.vocab.workload import generate

    r = offered_rate([s.arrival_s for s in generate(replace(wcfg, trace_speed=1.0,
                                                            probe_interval_s=None))])
    if not math.isfinite(r):
        raise ConfigError("--capacity needs a trace with at least two requests at distinct times")
    return r


#: A trace probe's speed is refined until its offered rate is within this share of the target.
SPEED_TOLERANCE = 0.02


def probe_workload(wcfg, rate: float, native: float | None):
    """(WorkloadConfig, its specs, offered req/s) for a probe at ``rate`` req/s. Random arrivals:
    ``--request-rate rate``. A trace: sped up until the probe's *own* arrivals offer ``rate``
    (:func:`offered_rate` of the requests the probe replays, within ``SPEED_TOLERANCE``,
    by bisection over the speed; the closest one tried otherwise): a trace that gets denser later offers more than ``rate`` when
    its speed is taken from its start (the H200 probe labelled 12.6 req/s offered ≈ 29)."""
    from ..engine_host.vocab.workload import generate

    if native is None:
        w = replace(wcfg, request_rate=rate)
        specs = generate(w)
        return w, specs, offered_rate([x.arrival_s for x in specs if not _is_probe(x)])
    def at(speed: float):
        w = replace(wcfg, trace_speed=speed)
        specs = generate(w)
        return w, specs, offered_rate([x.arrival_s for x in specs if not _is_probe(x)])

    # Bisection on log(speed): a denser stretch makes the offered rate jump, so a fixed-point
    # step (speed × rate/offered) can oscillate around it.
    s0 = rate / native
    tried = [at(s0)]
    lo = hi = s0
    if tried[0][2] > rate:  # bracket [lo, hi] with offered(lo) < rate < offered(hi)
        while len(tried) < 12 and math.isfinite(tried[-1][2]) and tried[-1][2] > rate:
            hi, lo = lo, lo / 2
            tried.append(at(lo))
    else:
        while len(tried) < 12 and math.isfinite(tried[-1][2]) and tried[-1][2] < rate:
            lo, hi = hi, hi * 2
            tried.append(at(hi))
    for _ in range(16):
        best = min((t for t in tried if math.isfinite(t[2])), key=lambda t: abs(t[2] - rate),
                   default=None)
        if best is None or abs(best[2] / rate - 1.0) <= SPEED_TOLERANCE or hi <= lo:
            break
        mid = math.sqrt(lo * hi)
        got = at(mid)
        tried.append(got)
        if not math.isfinite(got[2]):
            break
        lo, hi = (mid, hi) if got[2] < rate else (lo, mid)
    ok = [t for t in tried if math.isfinite(t[2])]
    return min(ok, key=lambda t: abs(t[2] - rate)) if ok else tried[-1]


def _is_probe(spec) -> bool:
    return str(spec.request_id).startswith(PROBE_ID_PREFIX)

# ---- a probe on the hosted engine (`gpuchef ab --capacity`) -------------------------------------

def measure_on_engine(engine: Any, wcfg: Any, native: float | None, setting: Any, label: str,
                      rate: float, slos: Sequence[SLO], *, percentiles: Sequence[float],
                      goodput: dict[str, float] | None, sinks: Sequence[Any] = (),
                      console: Any = None) -> Measured:
    """One probe of ``setting`` (an ``experiments.ab.Setting``, side ``label``) at ``rate``
    req/s on the idle ``engine``: the probe's workload (:func:`probe_workload`, ``native``: a
    trace's own rate), its ``capacity:<label>:<rate>`` mark, the load run with the setting in
    force and an :class:`~gpuchef.experiments.early_stop.EarlyStop` watching it (a decided
    probe's remaining requests are withdrawn, its stop mark says why), judged by
    :func:`judge_probe`. Raises ConfigError for an empty workload; what ``run_load`` raises."""
    from ..sessions.headless import phase_marks, run_load
    from .early_stop import EarlyStop
    from .hosted import assert_idle, emit_mark

    w, specs, off = probe_workload(wcfg, rate, native)
    if not specs:
        raise ConfigError(f"the workload at {rate:g} req/s is empty: raise --num-prompts "
                          "or --duration")
    assert_idle(engine)
    emit_mark(engine, probe_mark(label, rate), sinks)
    mine = [x for x in specs if not _is_probe(x)]
    stop = EarlyStop(slos, [x.output_len for x in mine],
                     [int(x.arrival_s * 1e9) for x in mine], [x.request_id for x in mine])
    hold: dict[str, Any] = {}

    def decided(reason: str, t_ns: int) -> None:  # the thread delivering the stream
        if reason and "t" not in hold:
            hold["t"] = t_ns
            emit_mark(engine, stop_mark(label, reason), sinks)
            for x in specs:  # the rest are aborted: the probe is decided
                hold["host"].abort(x.request_id, EARLY_STOP_REASON)

    class Watch:  # the early stop's sink: each turn's outputs and finished requests, in order
        def record(self, batch: Any) -> None:
            for rec in batch.records:
                if isinstance(rec, StepOutput):
                    if not stop.t0_ns:
                        stop.start(hold["host"].t0_ns)
                    decided(stop.on_output(rec), rec.t_ns)
                elif isinstance(rec, RequestRecord) and rec.token_times_ns:
                    decided(stop.on_request(rec), rec.token_times_ns[-1])

    def on_start(h: Any) -> None:
        hold["host"] = h
        h.set_config(**setting.knobs())

    res = run_load(engine, specs, sinks=[*sinks, Watch()], console=console,
                   on_start=on_start, marks=phase_marks(w))
    return judge_probe(res.requests, res.steps, res.t0_ns, percentiles=percentiles,
                       goodput=goodput, stopped=stop.reason, stopped_ns=hold.get("t"))
