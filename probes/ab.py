"""A/B runs: the one owner of their marks, windows, per-window metrics, the window-throughput
definition and the B − A table. The dashboard's live A/B screen (tui/ab_live.py), ``gpuchef ab``
(gpuchef/experiments/ab.py) and ``gpuchef report`` (gpuchef/report/data.py) all call this module, so the
same records give the same numbers on every surface (tests/probes/test_ab.py asserts it).

**Marks.** Each window (an interleaved window, or one whole run of ``gpuchef ab``'s sequential
mode) opens with an ``EngineEvent("mark")`` named ``ab:<run>:<A|B>:<n>`` (run id, setting, its
1-based window number); ``ab:<run>:end`` closes the last one. ``ab:<run>:AB:<n>`` opens a
*mirrored* window: repetition *n* of a load sent to two servers at once (``gpuchef ab --a url=U1
--b url=U2``, the attached dashboard's A/B), which is window *n* of A and of B over the same
span, each holding only its own server's requests — told apart by the request id's prefix
``A/`` or ``B/`` (:func:`side_of`). :func:`mark_name` writes them, :func:`parse_mark` reads them;
nothing else spells the format. A load sent again (each repetition of ``gpuchef ab``) gives its
requests the suffix ``#<rep>``, and a load sent to each side (mirrored, or `gpuchef ab`'s
sequential runs) the side prefix (:func:`rep_request_id`): ids are unique in a trace.

**Windows.** A window runs from its mark to the next mark of the same run (or the end mark).
It is *counted* when it is complete (closed by a later mark), at least
``MIN_WINDOW_SHARE`` of the run's median window length long (a window cut short by a stop is
noise), and at least one finished request arrived in it (live, a request counts once it has
finished). Its *span* ends at the engine's last activity in
it (last token or step end), so a sequential run ends with its last token, as the benchmark
duration of ``vllm bench serve`` does, and an interleaved window keeps its full length.

**Membership.** A request belongs to the window it *arrived* in (both settings then see the same
arrival process), a step to the window it *started* in. Latency figures (TTFT, TPOT, ITL, E2EL,
goodput) are over a window's requests.

**Throughput** (the one definition): the work done while the setting was in force, per second of
the window's span — requests *finished* in the span, output tokens *produced* in it (token
times), tokens *computed* by its steps (prefill + decode; with no steps recorded, a server seen
from its client, ``summarize``'s input + output tokens of the window's requests); goodput
likewise: the requests finished in the span that met every goodput SLO (``summarize``'s test),
so goodput ≤ request throughput. Under an open-loop load the requests that arrived in a window
only measure the arrival process; what a setting achieved is what it finished while in force.

**Pooled and per-window.** A setting's pooled figures are :func:`pool` over its counted windows
(their requests and steps as one set, spans summed); a window's own figures are the same
function over that one window, so pooled and per-window numbers come from the same windows.
B − A per window pairs window *n* of A with window *n* of B.

**Verdict.** "B better"/"B worse" (or "differs" for a figure with no better direction) when the
mean of B's windows differs from the mean of A's by more than the range of either setting's own
windows and every pair (A_n, B_n) differs in that direction; else "within spread". Fewer than
``min_pairs`` pairs: "not enough windows yet" — ``MIN_WINDOWS`` (4) for interleaved windows,
which are short and noisy (with 2 windows each, two settings that do not differ at all have a
1-in-3 chance that every B window beats every A window or loses to it), ``MIN_REPETITIONS`` (2)
for whole sequential runs.

**Failed requests.** A side that lost requests answered a smaller load, and the requests that
failed fast are the ones it did not have to serve: its latency and throughput are not those of
the same work. Each setting's requests sent / completed / failed per counted window
(:class:`RequestCounts`, from ``BenchMetrics.completed``/``failed``: a request is failed when it
did not finish normally) go with the comparison and make its first row ("failed", vLLM's key).
When the share of requests that failed differs between A and B — in any pair (A_n, B_n) or
pooled; no tolerance: one request lost on one side only is enough — every row with a better
direction but the failed row gets the verdict ``NOT_COMPARABLE`` and
``Comparison.not_comparable`` says why in one line (:func:`failures_differ`); so they do when
the shares are equal but, over the same load (a pair of windows holding the same requests),
the two sides failed different requests (:func:`failed_requests_differ`). The failed row itself
is then judged on its counts: the side that lost more requests is worse, whatever the spread.
"""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from gpuchef.probes.metrics import (DEFAULT_PERCENTILES, BenchMetrics, is_completed, is_probe_id,
                                     json_safe, percentile_label, summarize)

LABELS = ("A", "B")
#: A window shorter than this share of its run's median window length is not counted.
MIN_WINDOW_SHARE = 0.5
#: Pairs of windows (A_n, B_n) the verdict needs: interleaved windows, whole sequential runs.
MIN_WINDOWS = 4
MIN_REPETITIONS = 2
NOT_ENOUGH = "not enough windows yet"
#: The verdict of a judged row when A and B lost different shares of their requests.
NOT_COMPARABLE = "not comparable"
#: The key of the failed-requests row (vllm bench serve's result key).
FAILED_ROW = "failed"
#: Rows of :func:`metric_specs` about engine steps: a client does not see a server's steps (an
#: A/B of servers gpuchef does not host leaves them out).
STEP_ROWS = ("steps_per_s", "mean_tokens_per_step", "num_preemptions", "busy_fraction_pct")

#: the label of a mirrored mark: both settings' window n at once (two servers, one arrival clock)
MIRRORED = "AB"
_MARK = re.compile(r"^ab:(\d+):(?:(A|B|AB):(\d+)|(end))$")


# ---- marks ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mark:
    """A parsed A/B mark: ``run`` id, ``label`` "A", "B", ``MIRRORED`` ("AB": both at once) or
    "end", ``n`` the window number (None for "end")."""

    run: int
    label: str
    n: int | None


def mark_name(run: int, label: str, n: int | None = None) -> str:
    """``ab:<run>:<A|B|AB>:<n>`` (``label`` "A"/"B", or ``MIRRORED`` for both at once; ``n``
    >= 1) or ``ab:<run>:end``. Raises ValueError for anything else."""
    if label == "end" and n is None:
        return f"ab:{int(run)}:end"
    if label not in (*LABELS, MIRRORED) or n is None or int(n) < 1:
        raise ValueError(f"A/B mark: label {label!r} with n {n!r}: allowed A, B or AB with "
                         "n >= 1, or end")
    return f"ab:{int(run)}:{label}:{int(n)}"


def parse_mark(name: Any) -> Mark | None:
    """The :class:`Mark` that an event name spells, or None when it is not an A/B mark."""
    m = _MARK.match(str(name))
    if m is None:
        return None
    if m.group(4):
        return Mark(int(m.group(1)), "end", None)
    return Mark(int(m.group(1)), m.group(2), int(m.group(3)))


def rep_request_id(request_id: str, rep: int, run: int = 1, side: str | None = None) -> str:
    """A request's id in repetition ``rep`` (>= 1) of A/B run ``run`` that sends the same load
    again: ``<id>#<rep>``, or ``<id>#<run>.<rep>`` for a later run of the same session (the
    attached dashboard's ``r``), so that no two records of a trace share an id. A suffix: the
    probe prefix (``probe-``) stays in front. ``side`` ("A"/"B"): the load is sent to each side
    (a mirrored run, or a sequential one: A's and B's copies of repetition n), whose copies
    are told apart by the prefix ``A/`` / ``B/`` (:func:`side_of`). Raises ValueError for
    ``rep`` or ``run`` < 1, or a ``side`` other than A, B or None."""
    if int(rep) < 1 or int(run) < 1:
        raise ValueError(f"rep_request_id: rep {rep!r} and run {run!r} must be >= 1")
    if side is not None and side not in LABELS:
        raise ValueError(f"rep_request_id: side {side!r}: allowed A, B or None")
    head = f"{side}/" if side else ""
    return (f"{head}{request_id}#{int(rep)}" if int(run) == 1
            else f"{head}{request_id}#{int(run)}.{int(rep)}")


def side_of(request_id: Any) -> str | None:
    """"A" or "B" for a request of a mirrored run (its id ``A/...`` or ``B/...``), else None."""
    head = str(request_id)[:2]
    return head[0] if head in ("A/", "B/") else None


# ---- windows --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """One window of run ``run``: setting ``label`` ("A"/"B"), its number ``n`` (1-based per
    setting), ``[t0_ns, t1_ns)`` (monotonic ns; ``t1_ns`` None while it runs) and ``step0``, the
    first engine step with the setting in force. ``mirrored``: opened by an ``AB`` mark — its
    requests are those of ``label``'s server (:func:`side_of`), its steps and GPU means none (the
    client sees neither server's steps; the GPUs sampled over the span ran both)."""

    run: int
    label: str
    n: int
    t0_ns: int
    t1_ns: int | None
    step0: int
    mirrored: bool = False

    @property
    def complete(self) -> bool:
        return self.t1_ns is not None

    @property
    def name(self) -> str:
        return f"{self.label}{self.n}"


def runs_in(events: Sequence[Any]) -> list[int]:
    """The A/B run ids that ``events`` hold marks of, in order of their first mark."""
    out: list[int] = []
    for ev in events:
        if getattr(ev, "kind", None) == "mark":
            m = parse_mark(ev.name)
            if m is not None and m.run not in out:
                out.append(m.run)
    return out


def windows(events: Sequence[Any], run: int | None = None) -> tuple[int | None, list[Window], bool]:
    """(run id, its windows in time order, ended) from EngineEvents; ``run`` None: the newest
    (highest id). Ended: its ``end`` mark was seen."""
    marks = []
    for i, ev in enumerate(events):
        if getattr(ev, "kind", None) != "mark":
            continue
        m = parse_mark(ev.name)
        if m is not None:
            marks.append((ev.t_ns, i, m, ev))
    if not marks:
        return None, [], False
    if run is None:
        run = max(m.run for _, _, m, _ in marks)
    mine = sorted([x for x in marks if x[2].run == run], key=lambda x: (x[0], x[1]))
    out: list[Window] = []
    ended = False
    for k, (t, _, m, ev) in enumerate(mine):
        if m.label == "end":
            ended = True
            continue
        t1 = mine[k + 1][0] if k + 1 < len(mine) else None
        if m.label == MIRRORED:
            out += [Window(run, x, m.n, t, t1, ev.step, mirrored=True) for x in LABELS]
        else:
            out.append(Window(run, m.label, m.n, t, t1, ev.step))
    return run, out, ended


# ---- per-window figures -----------------------------------------------------------------------------

@dataclass
class WindowResult:
    """One window's records and figures. ``rep``: its number (``n``); ``[t0_ns, t1_ns)``: its
    span (the end at the engine's last activity in it); ``requests``: those that arrived in it;
    ``steps``: those that started in it; ``work``: requests finished, output tokens produced
    and tokens computed in the span (:func:`work_in`); ``metrics``: :func:`pool` of the window
    alone; ``gpu``: mean GPU fields over the span (empty without a sampler); ``counted``: it
    enters the pooled figures and the verdict, else ``why`` not."""

    label: str
    rep: int
    t0_ns: int
    t1_ns: int
    requests: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    metrics: BenchMetrics | None = None
    gpu: dict[str, float] = field(default_factory=dict)
    work: dict[str, int] | None = None
    counted: bool = True
    why: str = ""
    run: int = 0
    step0: int = 0

    @property
    def duration_s(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9

    @property
    def name(self) -> str:
        return f"{self.label}{self.rep}"


def work_in(requests: Sequence[Any], steps: Sequence[Any], t0: int, t1: int) -> dict[str, int]:
    """What the engine did in ``[t0, t1)`` (ns): ``finished`` requests (last token in the range
    and completed: ``probes.metrics.is_completed``; an aborted request is not finished however
    far it got), ``output_tokens`` (token times in the range, any request's, aborted ones'
    too), ``step_tokens`` (prefill + decode tokens of ``steps``: pass those that started in the
    range)."""
    finished = out = 0
    for r in requests:
        tt = r.token_times_ns
        if not tt or tt[-1] < t0 or tt[0] >= t1:
            continue
        if tt[-1] < t1 and is_completed(r.finish_reason):
            finished += 1
        out += bisect_left(tt, t1) - bisect_left(tt, t0)
    tok = sum(s.num_prefill_tokens + s.num_decode_reqs for s in steps)
    return {"finished": finished, "output_tokens": out, "step_tokens": tok}


def _span_end(reqs_near: Sequence[Any], steps: Sequence[Any], t0: int, t1: int,
              last_arrival_ns: int = 0) -> int:
    """Just past the engine's last activity in ``[t0, t1)`` (the latest token time, failure or
    step end in it, + 1 ns so that the half-open span holds it) and past ``last_arrival_ns``
    (the window's last member's arrival: one arriving after the last activity, just before a
    switch, is still a member, so the span must hold it); ``t0 + 1`` when there was none.
    A request that failed counts to when it failed (``ended_ns``), as ``vllm bench serve``'s
    duration runs until every request has answered, failures included: ended at its last token,
    a side whose server died mid-run was given a short span and a throughput above what was
    offered."""
    last = max(t0, last_arrival_ns)
    for r in reqs_near:
        tt = r.token_times_ns
        if tt:
            i = bisect_left(tt, t1) - 1
            if i >= 0 and tt[i] >= t0:
                last = max(last, tt[i])
        elif t0 <= r.ended_ns < t1:
            last = max(last, r.ended_ns)
    for s in steps:
        last = max(last, s.t_end_ns)
    return min(t1, max(last + 1, t0 + 1))


def pool(windows: Sequence[WindowResult], percentiles: Sequence[float] = DEFAULT_PERCENTILES,
         goodput: dict[str, float] | None = None) -> tuple[BenchMetrics, dict[str, float]]:
    """The figures of ``windows`` as one (the setting's pooled figures, or one window's own):
    ``probes.metrics.summarize`` over their requests and steps with their spans summed as the
    duration; throughputs and goodput from their summed ``work`` (the module docstring);
    steps/s and busy fraction over the windows' own step spans (not the gaps between them);
    GPU fields weighted by span. Raises ValueError for no windows."""
    if not windows:
        raise ValueError("pool() needs at least one window")
    reqs = [r for w in windows for r in w.requests]
    steps = [s for w in windows for s in w.steps]
    dur = max(sum(w.duration_s for w in windows), 1e-9)
    m = summarize(reqs, dur, percentiles=percentiles, goodput=goodput or None,
                  steps=steps or None)
    work = {k: sum((w.work or {}).get(k, 0) for w in windows)
            for k in ("finished", "output_tokens", "step_tokens")}
    m.request_throughput = work["finished"] / dur
    m.output_throughput = work["output_tokens"] / dur
    if steps:  # without steps (a server seen from its client): vLLM's (input + output) / duration
        m.total_token_throughput = work["step_tokens"] / dur
    if goodput and all(w.work and "good_finished" in w.work for w in windows):
        m.request_goodput = sum(w.work["good_finished"] for w in windows) / dur
    if steps:
        span = sum((max(s.t_end_ns for s in w.steps) - min(s.t_start_ns for s in w.steps)) / 1e9
                   for w in windows if w.steps)
        m.steps_span_s = span
        m.steps_per_s = len(steps) / span if span > 0 else math.nan
        m.busy_fraction = sum(s.gpu_ms for s in steps) / (span * 1e3) if span > 0 else math.nan
    gpu: dict[str, float] = {}
    for k in {k for w in windows for k in w.gpu}:
        pairs = [(w.gpu[k], w.duration_s) for w in windows
                 if math.isfinite(w.gpu.get(k, math.nan))]
        tot = sum(d for _, d in pairs)
        gpu[k] = sum(v * d for v, d in pairs) / tot if tot > 0 else math.nan
    return m, gpu


def window_results(wins: Sequence[Window], requests: Sequence[Any], steps: Sequence[Any], *,
                   percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                   goodput: dict[str, float] | None = None,
                   gpu_means: Callable[[int, int], dict[str, float]] | None = None,
                   cache: dict | None = None, whole_loads: bool = False) -> list[WindowResult]:
    """A :class:`WindowResult` for each complete window of ``wins`` (time order), counted or
    not (see the module docstring). ``requests``: RequestRecords (any order); ``steps``:
    StepRecords; ``gpu_means(t0_ns, t1_ns)``: mean GPU fields over a span. ``cache``: a dict
    kept between calls (the live screen) — a window whose records did not change is not
    recomputed. ``whole_loads``: each window is a whole load (`gpuchef ab`'s sequential
    repetitions), so the ``MIN_WINDOW_SHARE`` length rule, a sign of a window cut short by a
    stop, does not apply — two 2-prompt loads differ 2x in length by chance."""
    done = [w for w in wins if w.complete]
    if not done:
        return []
    med = statistics.median(w.t1_ns - w.t0_ns for w in done)
    sorted_all = sorted(requests, key=lambda r: r.arrival_ns)
    lists = {None: sorted_all}  # mirrored windows: each server's own requests
    if any(w.mirrored for w in done):
        lists.update({k: [r for r in sorted_all if side_of(r.request_id) == k] for k in LABELS})
    arrs = {k: [r.arrival_ns for r in v] for k, v in lists.items()}
    st = sorted(steps, key=lambda s: s.t_start_ns)
    st_t = [s.t_start_ns for s in st]
    out = []
    for w in done:
        t0, t1 = w.t0_ns, w.t1_ns
        side = w.label if w.mirrored else None
        by_arr, arr = lists[side], arrs[side]
        reqs = by_arr[bisect_left(arr, t0):bisect_left(arr, t1)]
        stp = [] if w.mirrored else st[bisect_left(st_t, t0):bisect_left(st_t, t1)]
        # requests with tokens in the window arrived before its end
        near = [r for r in by_arr[:bisect_left(arr, t1)]
                if r.token_times_ns and r.token_times_ns[-1] >= t0]
        # and those that failed in it (no tokens): the span runs to their failure
        failed = [r for r in reqs if not r.token_times_ns and r.ended_ns >= t0]
        key = (w.run, w.label, w.n, t0, t1, len(reqs), len(stp), len(near),
               sum(len(r.token_times_ns) for r in near), len(failed))
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            out.append(hit)
            continue
        end = _span_end(near + failed, stp, t0, t1, reqs[-1].arrival_ns if reqs else 0)
        work = work_in(near, stp, t0, end)
        if goodput:  # good work done: the finished requests that met every SLO
            fin = [r for r in near if t0 <= r.token_times_ns[-1] < end]
            work["good_finished"] = round(summarize(fin, 1.0, percentiles=(50.0,),
                                                    goodput=goodput).request_goodput or 0)
        res = WindowResult(w.label, w.n, t0, end, list(reqs), list(stp), work=work,
                           run=w.run, step0=w.step0,
                           # mirrored: the span is both servers' (the GPUs sampled too)
                           gpu=gpu_means(t0, end) if gpu_means is not None and not w.mirrored
                           else {})
        if not whole_loads and t1 - t0 < MIN_WINDOW_SHARE * med:
            res.counted, res.why = False, (f"shorter than {MIN_WINDOW_SHARE:g} of the median "
                                           f"window ({med / 1e9:.3g} s)")
        elif not reqs:
            res.counted, res.why = False, "no finished request arrived in it"
        res.metrics, _ = pool([res], percentiles, goodput)
        if cache is not None:
            cache[key] = res
        out.append(res)
    return out


# ---- the B − A table ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MetricSpec:
    """A row of the B − A table: ``key`` (vllm bench serve's JSON key where it has one),
    ``label``, ``unit``, ``better`` "higher", "lower" or "" (shown, not judged), and
    ``get(metrics, gpu_means)``."""

    key: str
    label: str
    better: str
    get: Callable[[BenchMetrics, dict[str, float]], float]
    unit: str = ""


def _pct_get(stem: str, q: float) -> Callable[[BenchMetrics, dict], float]:
    def get(m: BenchMetrics, _g: dict) -> float:
        return next((v for p, v in getattr(m, f"percentiles_{stem}_ms") if p == q), math.nan)
    return get


def metric_specs(percentiles: Sequence[float], goodput: bool, gpu: bool) -> list[MetricSpec]:
    """The rows compared, in vllm bench serve's order (failed requests first), then gpuchef's
    step and GPU figures."""
    out = [MetricSpec(FAILED_ROW, "Failed requests", "lower", lambda m, g: float(m.failed)),
           MetricSpec("request_throughput", "Request throughput (req/s)", "higher",
                      lambda m, g: m.request_throughput, "req/s")]
    if goodput:
        out.append(MetricSpec("request_goodput", "Request goodput (req/s)", "higher",
                              lambda m, g: math.nan if m.request_goodput is None
                              else m.request_goodput, "req/s"))
    out += [MetricSpec("output_throughput", "Output token throughput (tok/s)", "higher",
                       lambda m, g: m.output_throughput, "tok/s"),
            MetricSpec("total_token_throughput", "Total token throughput (tok/s)", "higher",
                       lambda m, g: m.total_token_throughput, "tok/s")]
    for stem, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL")):
        out.append(MetricSpec(f"mean_{stem}_ms", f"Mean {name} (ms)", "lower",
                              lambda m, g, s=stem: getattr(m, f"mean_{s}_ms"), "ms"))
        for p in percentiles:
            pl = percentile_label(p)
            out.append(MetricSpec(f"p{pl}_{stem}_ms", f"P{pl} {name} (ms)", "lower",
                                  _pct_get(stem, p), "ms"))
    out += [MetricSpec("steps_per_s", "Steps per second", "", lambda m, g: m.steps_per_s, "/s"),
            MetricSpec("mean_tokens_per_step", "Mean tokens per step", "",
                       lambda m, g: m.mean_tokens_per_step, "tok"),
            MetricSpec("num_preemptions", "Preemptions", "lower",
                       lambda m, g: float(m.num_preemptions), ""),
            MetricSpec("busy_fraction_pct", "Compute busy fraction (%)", "",
                       lambda m, g: m.busy_fraction * 100.0, "%")]
    if gpu:
        out += [MetricSpec("sm_active_pct", "GPU SM active (mean %)", "",
                           lambda m, g: g.get("sm_active", math.nan), "%"),
                MetricSpec("power_w", "GPU power (mean W)", "",
                           lambda m, g: g.get("power_w", math.nan), "W")]
    return out


@dataclass
class DeltaRow:
    """B − A for one metric. Pooled: ``a``/``b`` (each setting's counted windows as one set),
    ``delta`` = b − a, ``delta_pct``. Per window: ``a_runs``/``b_runs`` (each window's own
    value, in window order), ``deltas`` (B_n − A_n of each pair). ``verdict``: see the module
    docstring."""

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
    unit: str = ""

    @property
    def spread(self) -> tuple[float, float]:
        """(min, max) of the paired per-window deltas; NaNs with fewer than two pairs."""
        d = [x for x in self.deltas if math.isfinite(x)]
        return (min(d), max(d)) if len(d) >= 2 else (math.nan, math.nan)

    @property
    def median_delta(self) -> float:
        """The median of the paired per-window deltas (NaN without a pair)."""
        d = [x for x in self.deltas if math.isfinite(x)]
        return statistics.median(d) if d else math.nan

    @property
    def stdev(self) -> float:
        d = [x for x in self.deltas if math.isfinite(x)]
        return statistics.stdev(d) if len(d) >= 2 else math.nan

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.spread
        return json_safe({"key": self.key, "label": self.label, "better": self.better,
                        "a": self.a, "b": self.b, "delta": self.delta,
                        "delta_pct": self.delta_pct, "deltas": self.deltas,
                        "delta_median": self.median_delta, "delta_min": lo, "delta_max": hi,
                        "delta_stdev": self.stdev, "a_runs": self.a_runs,
                        "b_runs": self.b_runs, "verdict": self.verdict})


def verdict(spec: MetricSpec, a_runs: Sequence[float], b_runs: Sequence[float],
            min_pairs: int = MIN_WINDOWS) -> str:
    """The verdict of one row from the paired per-window values (module docstring)."""
    pairs = [(x, y) for x, y in zip(a_runs, b_runs) if math.isfinite(x) and math.isfinite(y)]
    if not pairs:
        return "n/a"
    if len(pairs) < min_pairs:
        return f"{NOT_ENOUGH} ({len(pairs)} of {min_pairs})"
    a = [x for x, _ in pairs]
    b = [y for _, y in pairs]
    d = statistics.fmean(b) - statistics.fmean(a)
    noise = max(max(a) - min(a), max(b) - min(b))
    if abs(d) > noise and all((y - x) * d > 0 for x, y in pairs):
        if not spec.better:
            return "differs"
        return "B better" if (d > 0) == (spec.better == "higher") else "B worse"
    return "within spread"


@dataclass(frozen=True)
class RequestCounts:
    """One window's (or a setting's pooled) requests: ``sent`` = ``completed`` + ``failed``
    (``BenchMetrics``' counts; probe requests are in neither)."""

    sent: int
    completed: int
    failed: int

    @classmethod
    def of(cls, m: BenchMetrics) -> "RequestCounts":
        return cls(m.completed + m.failed, m.completed, m.failed)

    @classmethod
    def total(cls, counts: Sequence["RequestCounts"]) -> "RequestCounts":
        return cls(*(sum(getattr(c, k) for c in counts) for k in ("sent", "completed", "failed")))

    def as_dict(self) -> dict[str, int]:
        return {"sent": self.sent, "completed": self.completed, "failed": self.failed}


def failures_differ(a: Sequence[RequestCounts], b: Sequence[RequestCounts]) -> str:
    """Why A's and B's figures are not comparable, or "" when they are: the share of requests
    that failed differs between A and B in a pair of windows (``a[n]``, ``b[n]``: window n+1 of
    each, in window order) or pooled (every window of each). No tolerance — one request lost by
    one side only differs. One line: ``"B failed 100 of 200 requests, A 0 of 200: latency and
    throughput rows are not compared"``."""
    def share_differs(x: RequestCounts, y: RequestCounts) -> bool:
        return x.failed * y.sent != y.failed * x.sent  # exact: x.failed/x.sent vs y's

    pa, pb = RequestCounts.total(a), RequestCounts.total(b)
    bad = [(n, x, y) for n, (x, y) in enumerate(zip(a, b), start=1) if share_differs(x, y)]
    if not bad and not share_differs(pa, pb):
        return ""
    first, second = (("B", pb), ("A", pa)) if pb.failed * pa.sent > pa.failed * pb.sent \
        else (("A", pa), ("B", pb))
    text = (f"{first[0]} failed {first[1].failed} of {first[1].sent} requests, "
            f"{second[0]} {second[1].failed} of {second[1].sent}")
    if not share_differs(pa, pb):  # the same pooled, not in the same windows
        n, x, y = bad[0]
        text += (f", not in the same pairs (A{n} {x.failed} of {x.sent}, "
                 f"B{n} {y.failed} of {y.sent})")
    return text + ": latency and throughput rows are not compared"


def load_id(request_id: Any) -> str:
    """A request's id in its load: without a mirrored run's side prefix (``A/``) and the
    repetition suffix (``#n``, :func:`rep_request_id`), so that A's and B's copies of one load
    request share it."""
    rid = str(request_id)
    if side_of(rid):
        rid = rid[2:]
    return rid.split("#", 1)[0]


def failed_requests_differ(a: Sequence[WindowResult], b: Sequence[WindowResult]) -> str:
    """Why A's and B's figures are not comparable although the same shares failed, or "": in a
    pair of windows (``a[n]``, ``b[n]``) that hold the same load (the same :func:`load_id` set:
    a mirrored repetition, or sequential runs of one seeded load) the two sides failed
    different requests — A losing the short ones and B the long ones leaves each a different
    load to be timed on. Windows of different requests (the live screen's alternating windows
    on one arrival stream) are compared by shares alone (:func:`failures_differ`)."""
    for n, (x, y) in enumerate(zip(a, b), start=1):
        loads = [{load_id(r.request_id): is_completed(r.finish_reason)
                  for r in w.requests if not is_probe_id(r.request_id)} for w in (x, y)]
        if not loads[0] or loads[0].keys() != loads[1].keys():
            continue
        only_a = sum(1 for k, done in loads[0].items() if not done and loads[1][k])
        only_b = sum(1 for k, done in loads[1].items() if not done and loads[0][k])
        if only_a or only_b:
            return (f"A and B failed different requests of the same load (pair {n}: "
                    f"{only_a} failed on A only, {only_b} on B only): latency and throughput "
                    "rows are not compared")
    return ""


@dataclass
class Comparison:
    """The counted windows of both settings (``runs``, time order), each setting's pooled
    figures (``pooled[label]``, ``pooled_gpu[label]``), the B − A rows and ``skipped``: the
    complete windows not counted (each with its ``why``). ``counts[label]``: each counted
    window's :class:`RequestCounts`, in window order (the order of a row's ``a_runs`` /
    ``b_runs``); ``not_comparable``: why the judged rows have no verdict (the module
    docstring, "Failed requests"), "" when they have one."""

    runs: list[WindowResult]
    pooled: dict[str, BenchMetrics]
    pooled_gpu: dict[str, dict[str, float]]
    rows: list[DeltaRow]
    skipped: list[WindowResult] = field(default_factory=list)
    min_pairs: int = MIN_WINDOWS
    counts: dict[str, list[RequestCounts]] = field(default_factory=dict)
    not_comparable: str = ""

    def count(self, label: str) -> int:
        return sum(1 for r in self.runs if r.label == label)

    def requests(self, label: str) -> RequestCounts:
        """``label``'s requests over its counted windows."""
        return RequestCounts.total(self.counts.get(label, []))

    def requests_dict(self) -> dict[str, Any]:
        """JSON-ready: per setting its pooled counts and ``per_window`` (each counted window's),
        and ``not_comparable`` (None when the rows were judged)."""
        return {**{k: {**self.requests(k).as_dict(),
                       "per_window": [c.as_dict() for c in self.counts.get(k, [])]}
                   for k in LABELS},
                "not_comparable": self.not_comparable or None}


def compare(results: Sequence[WindowResult], percentiles: Sequence[float] = DEFAULT_PERCENTILES,
            goodput: dict[str, float] | None = None, min_pairs: int = MIN_WINDOWS) -> Comparison:
    """Pool each setting's counted windows and compute B − A per metric; with each setting's
    requests sent / completed / failed per window, and no verdict on the judged rows when the
    shares that failed differ (:func:`failures_differ`) or, over the same load, the requests
    that failed (:func:`failed_requests_differ`). Raises ValueError when a setting has no
    counted window."""
    counted = [r for r in results if r.counted]
    by = {k: sorted([r for r in counted if r.label == k], key=lambda r: (r.rep, r.t0_ns))
          for k in LABELS}
    for k in LABELS:
        if not by[k]:
            raise ValueError(f"setting {k} has no window to compare")
    pooled, pooled_gpu = {}, {}
    for k in LABELS:
        pooled[k], pooled_gpu[k] = pool(by[k], percentiles, goodput)
    has_gpu = any(math.isfinite(v) for g in pooled_gpu.values() for v in g.values())
    counts = {k: [RequestCounts.of(r.metrics) for r in by[k]] for k in LABELS}
    why = failures_differ(counts["A"], counts["B"]) or failed_requests_differ(by["A"], by["B"])
    rows = []
    for spec in metric_specs(percentiles, bool(goodput), has_gpu):
        a = spec.get(pooled["A"], pooled_gpu["A"])
        b = spec.get(pooled["B"], pooled_gpu["B"])
        a_runs = [spec.get(r.metrics, r.gpu) for r in by["A"]]
        b_runs = [spec.get(r.metrics, r.gpu) for r in by["B"]]
        d = b - a
        dp = d / a * 100.0 if math.isfinite(a) and a != 0 else math.nan
        v = verdict(spec, a_runs, b_runs, min_pairs)
        if why and spec.better and spec.key != FAILED_ROW and v != "n/a":
            v = NOT_COMPARABLE
        elif why and spec.key == FAILED_ROW and d != 0:
            v = "B worse" if d > 0 else "B better"  # counts, not a noisy figure
        rows.append(DeltaRow(spec.key, spec.label, spec.better, a, b, d, dp,
                             [y - x for x, y in zip(a_runs, b_runs)], a_runs, b_runs,
                             v, spec.unit))
    return Comparison(sorted(counted, key=lambda r: r.t0_ns), pooled, pooled_gpu, rows,
                      [r for r in results if not r.counted], min_pairs, counts, why)


def analyse(events: Sequence[Any], requests: Sequence[Any], steps: Sequence[Any], *,
            run: int | None = None, percentiles: Sequence[float] = DEFAULT_PERCENTILES,
            goodput: dict[str, float] | None = None, min_pairs: int = MIN_WINDOWS,
            gpu_means: Callable[[int, int], dict[str, float]] | None = None,
            cache: dict | None = None, whole_loads: bool = False
            ) -> tuple[int | None, list[Window], bool, list[WindowResult], Comparison | None]:
    """Everything about A/B run ``run`` (default: the newest) from its records: (run id, its
    windows, ended, each complete window's result, the comparison — None while a setting has
    no counted window). The one entry point of the live screen, ``gpuchef ab`` and the report.
    ``whole_loads``: the windows are whole sequential loads (see :func:`window_results`)."""
    rid, wins, ended = windows(events, run)
    results = window_results(wins, requests, steps, percentiles=percentiles, goodput=goodput,
                             gpu_means=gpu_means, cache=cache, whole_loads=whole_loads)
    try:
        cmp = compare(results, percentiles, goodput, min_pairs)
    except ValueError:
        cmp = None
    return rid, wins, ended, results, cmp
