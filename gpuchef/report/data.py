"""What a report shows, computed from one or more session traces: segments (A/B windows or mode
stretches), the groups compared (per A/B setting, else per mode, across traces), their metrics.

Grouping:

* a trace with A/B marks (``gpuchef ab``, the dashboard's live A/B) is cut into windows, and
  its groups are the settings A and B pooled over their *counted* windows — all of it
  ``probes.ab``'s (marks, windows, which windows count, membership, the window throughput,
  pooling), the code ``gpuchef ab`` and the live A/B screen run, so the three agree;
* a ``gpuchef ab --capacity`` trace is cut into its probes (``capacity:<A|B>:<rate>`` marks,
  ``gpuchef.experiments.capacity.parse_capacity_mark``); its groups are the settings A and B, each pooling
  its probes — which ran at different rates, so the report draws no B − A comparison of them
  (the Capacity probes section compares, probe by probe);
* any other trace is cut where the scheduler mode changes (first step of each mode stretch);
  its groups are the modes;
* several traces: each contributes its groups; equal names get the trace's name appended (traces
  of one file name are told apart by their folder, or numbered: ``run (2)``).

A request belongs to the segment in which it *arrived* (so both arms of an A/B see the same
arrival process), a step to the one in which it *started*. A mode stretch's duration runs from
its start to the last token of its requests (or its end, if sooner); the first starts at the
load's start, which a ``gpuchef bench`` trace records (``probes.metrics.LOAD_START``), so that
its duration is the one bench printed (``probes.metrics.benchmark_duration_s``, the one
``vllm bench serve`` divides by); an older trace starts at its first arrival. Metrics are
``probes.metrics.summarize``'s (vllm bench serve's definitions). When the mode changed during
the load, each stretch's throughputs are the work done in it, as an A/B window's
(:func:`_stretch_results`, ``probes.ab``); counts and latencies stay by arrival.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes import ab as abdef
from gpuchef.probes.metrics import (GPU_SUMMARY_FIELDS, BenchMetrics, benchmark_duration_s,
                                    gpu_means, load_start_ns, summarize)
from gpuchef.probes.nvml import GpuSample
from gpuchef.probes.recorder import Trace, read_trace, trace_name, trace_span

MODE_COLORS = {"continuous": "#C44E52", "chunked": "#4C72B0"}
AB_COLORS = {"A": "#4C72B0", "B": "#DD8452"}
PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
           "#8C8C8C")
#: the one group of a `top --attach` trace (no steps: the server's scheduler is not seen)
ATTACHED = "attached"
GPU_FIELDS = GPU_SUMMARY_FIELDS  # probes/metrics.py owns the list and its NaN policy


@dataclass
class Segment:
    """A stretch of one trace under one setting: ``label`` (a group name inside the trace:
    "A"/"B" or a mode), ``name`` (e.g. "A1", "chunked", "A@4": a capacity probe at 4 req/s
    asked), ``[t0_ns, t1_ns)`` (monotonic ns)."""

    label: str
    name: str
    t0_ns: int
    t1_ns: int
    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    #: True for a window of an interleaved A/B (its length is the window); False for a whole
    #: run or mode stretch (it ends with its own last token, as a benchmark duration does).
    window: bool = False
    #: A/B windows: the key (run, label, n) and ``probes.ab``'s result (None: still open at the
    #: end of the trace); only counted windows enter their group.
    ab_key: tuple[int, str, int] | None = None
    result: "abdef.WindowResult | None" = None
    #: a capacity probe: the rate it asked for (req/s, from its mark); None for other segments
    probe_rate: float | None = None

    @property
    def counted(self) -> bool:
        return self.result is not None and self.result.counted

    @property
    def duration_s(self) -> float:
        """Seconds the segment's throughputs divide by: an A/B window's span (``probes.ab``);
        a mode stretch from its start to the last token of its requests (or its end, if
        sooner; its last step's end when no request has a token) — ``probes.metrics.
        benchmark_duration_s``, gpuchef bench's duration."""
        if self.result is not None:
            return self.result.duration_s
        end = max([s.t_end_ns for s in self.steps], default=self.t1_ns)
        d = benchmark_duration_s(self.t0_ns, self.requests, end_ns=min(end, self.t1_ns))
        return min(d, max(self.t1_ns - self.t0_ns, 1) / 1e9)


@dataclass
class TraceView:
    """One trace, cut into segments. ``origin_ns``: time 0 of its plots (the earliest record).
    ``ab``: it holds A/B windows. ``capacity``: it holds the probes of ``gpuchef ab --capacity``
    (its segments are the probes). ``settings``: label → one-line description of the setting."""

    path: Path
    name: str
    trace: Trace
    origin_ns: int
    end_ns: int
    segments: list[Segment]
    ab: bool
    settings: dict[str, str]
    capacity: bool = False
    #: capacity_probes' result, computed once (the Run table and the Capacity section read it)
    _probes: Any = field(default=None, repr=False, compare=False)
    #: :func:`ab_results` of an A/B trace (run id → its probes.ab.Comparison or None)
    comparisons: dict = field(default_factory=dict, repr=False, compare=False)
    #: mode stretches whose throughputs are each stretch's own work (:func:`_stretch_results`)
    stretch_work: bool = False

    def t(self, t_ns: float) -> float:
        """Seconds since ``origin_ns``."""
        return (t_ns - self.origin_ns) / 1e9

    @property
    def events(self) -> list[EngineEvent]:
        return self.trace.events

    @property
    def meta(self) -> dict[str, Any]:
        return self.trace.meta


@dataclass
class Group:
    """One column of the comparison: a setting or a mode (of one trace). ``metrics``: over all
    its segments' requests and steps, durations summed. ``gpu``: mean GPU fields over its
    segments' samples (NaN when none). ``color``: its colour in every plot."""

    key: str
    label: str
    view: TraceView
    segments: list[Segment]
    metrics: BenchMetrics
    gpu: dict[str, float]
    color: str
    description: str = ""
    short: str = ""  # a column header: "A", "B", a mode (plus the trace's name if needed)

    @property
    def requests(self) -> list[RequestRecord]:
        return [r for s in self.segments for r in s.requests]

    @property
    def steps(self) -> list[StepRecord]:
        return [x for s in self.segments for x in s.steps]


@dataclass
class ReportData:
    views: list[TraceView]
    groups: list[Group]
    problems: list[str]
    percentiles: tuple[float, ...]
    goodput: dict[str, float]


def ab_segments(events: Sequence[EngineEvent], end_ns: int) -> list[Segment]:
    """A/B windows of every run in ``events`` (``probes.ab.windows``), in time order; a window
    still open ends at ``end_ns``. With several runs (a dashboard session) each run's settings
    are kept apart: label "A (run 2)", name "A1/2"."""
    rids = abdef.runs_in(events)
    several = len(rids) > 1
    out = []
    for rid in rids:
        for w in abdef.windows(events, rid)[1]:
            t1 = min(w.t1_ns if w.t1_ns is not None else end_ns, end_ns)
            label, name = w.label, w.name
            if several:
                label, name = f"{label} (run {rid})", f"{name}/{rid}"
            if t1 > w.t0_ns:
                out.append(Segment(label, name, w.t0_ns, t1, window=True,
                                   ab_key=(rid, w.label, w.n)))
    out.sort(key=lambda x: x.t0_ns)
    return out


def capacity_segments(events: Sequence[EngineEvent], end_ns: int) -> list[Segment]:
    """The probes of a ``gpuchef ab --capacity`` trace, in time order: one segment per
    ``capacity:<A|B>:<rate>`` mark (``gpuchef.experiments.capacity.parse_capacity_mark``), label "A"/"B",
    name ``A@<rate asked>``, ``probe_rate`` the rate asked (req/s), running to the next probe's
    mark or ``end_ns``. Stop marks (``capacity:<A|B>:stopped:…``) do not cut. [] for a trace
    without them."""
    from gpuchef.experiments.capacity import parse_capacity_mark

    opens = []
    for e in events:
        if e.kind == "mark":
            m = parse_capacity_mark(e.name)
            if m is not None and m[1] is not None:
                opens.append((e.t_ns, m[0], m[1]))
    opens.sort(key=lambda x: x[0])
    out = []
    for i, (t0, label, rate) in enumerate(opens):
        t1 = opens[i + 1][0] if i + 1 < len(opens) else end_ns
        if t1 > t0:
            out.append(Segment(label, f"{label}@{rate:g}", t0, t1, probe_rate=rate))
    return out


def mode_segments(steps: Sequence[StepRecord], start_ns: int, end_ns: int) -> list[Segment]:
    """Stretches of one scheduler mode: a new one starts at the first step of another mode; the
    first at ``start_ns`` (the load's start: gpuchef bench's load-start event, else its first
    arrival or step)."""
    out: list[Segment] = []
    for s in steps:
        if not out or out[-1].label != s.mode:
            t0 = min(start_ns, s.t_start_ns) if not out else s.t_start_ns
            if out:
                out[-1].t1_ns = t0
            out.append(Segment(s.mode, s.mode, t0, end_ns))
    return out


def segment_finder(segments: Sequence[Segment]) -> Callable[[int], Segment | None]:
    """A function of a time (monotonic ns) giving the segment whose ``[t0_ns, t1_ns)`` holds it,
    or None (before, between or after the segments)."""
    import bisect

    segs = sorted(segments, key=lambda s: s.t0_ns)
    starts = [s.t0_ns for s in segs]

    def find(t: int) -> Segment | None:
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return None
        s = segs[i]
        return s if t < s.t1_ns else None

    return find


def _assign(segments: list[Segment], requests: Sequence[RequestRecord],
            steps: Sequence[StepRecord]) -> None:
    """Requests by ``entered_ns`` (their arrival; a request withdrawn before it arrived, by its
    withdrawal: a capacity probe stopped early withdraws the rest of its arrivals, which must not
    land in the next probe), steps by start, into the segment whose range holds them; records
    outside every segment (a dashboard session before or between A/B runs) belong to none."""
    if not segments:
        return
    find = segment_finder(segments)
    for r in requests:
        s = find(r.entered_ns)
        if s is not None:
            s.requests.append(r)
    for st in steps:
        s = find(st.t_start_ns)
        if s is not None:
            s.steps.append(st)


def _describe_steps(steps: Sequence[StepRecord]) -> str:
    if not steps:
        return ""
    s = steps[0]
    d = f"mode={s.mode}, max_num_batched_tokens={s.max_num_batched_tokens}"
    if s.long_prefill_token_threshold:
        d += f", long_prefill_token_threshold={s.long_prefill_token_threshold}"
    return d


def _place_legacy_withdrawals(requests: list[RequestRecord]) -> list[RequestRecord]:
    """``requests`` (file order) with ``ended_ns`` inferred for a capacity trace written
    before traces had the field: a request the early stop aborted before its arrival
    (``finish_reason`` ``capacity.EARLY_STOP_REASON``, no token, never scheduled) was recorded
    at the stop, right after the records that closed before it, but carries its planned arrival,
    which lies in a later probe. It gets the latest close time of the records before it in the
    file — inside the probe that withdrew it. Records of newer traces are returned as they are."""
    from dataclasses import replace

    from gpuchef.experiments.capacity import EARLY_STOP_REASON

    out, t = [], 0
    for r in requests:
        if (not r.ended_ns and r.finish_reason == EARLY_STOP_REASON and not r.token_times_ns
                and not r.first_scheduled_ns):
            if 0 < t < r.arrival_ns:
                r = replace(r, ended_ns=t)
        else:
            t = max(t, r.closed_ns)
        out.append(r)
    return out


def _meta_mode(meta: dict[str, Any]) -> str:
    """The scheduler mode a trace's meta record names (``engine_config.scheduler.mode``), or
    "requests" when it names none."""
    ec = meta.get("engine_config") if isinstance(meta.get("engine_config"), dict) else {}
    sc = ec.get("scheduler") if isinstance(ec.get("scheduler"), dict) else {}
    mode = sc.get("mode")
    return mode if isinstance(mode, str) and mode else "requests"


def view_trace(tr: Trace) -> TraceView:
    """Cut one trace into segments (A/B windows when it has them, else mode stretches)."""
    tr.requests = _place_legacy_withdrawals(tr.requests)  # before the span: they are not late
    origin, end = trace_span(tr)
    end = max(end, origin + 1)  # a one-instant trace still divides
    steps = sorted(tr.steps, key=lambda s: s.t_start_ns)
    segs = ab_segments(tr.events, end + 1)
    ab = bool(segs)
    cap = False
    if not ab:
        segs = capacity_segments(tr.events, end + 1)
        cap = bool(segs)
    meta_ab = tr.meta.get("ab") if isinstance(tr.meta.get("ab"), dict) else {}
    if not ab and not cap:
        # the load's start as gpuchef bench recorded it (arrival 0's time: the benchmark
        # duration counts from there); else its first arrival or step (the samplers may have
        # started earlier)
        start = load_start_ns(tr.events)
        if start is None:
            start = min([r.entered_ns for r in tr.requests] + [x.t_start_ns for x in steps[:1]],
                        default=origin)
        segs = mode_segments(steps, start, end + 1)
        src = tr.meta.get("source") if isinstance(tr.meta.get("source"), dict) else {}
        if not segs and src.get("kind") == "attached" and (tr.requests or tr.scrapes
                                                           or tr.plugin):
            # `top --attach`: no steps (the server's own); one stretch, the client's requests
            segs = [Segment(ATTACHED, ATTACHED, start, end + 1)]
        elif not segs and tr.requests:
            # gpuchef's own engine, but no step could be read: the requests still count, in
            # one stretch under the mode the meta record names (build() says why)
            segs = [Segment(_meta_mode(tr.meta), _meta_mode(tr.meta), start, end + 1)]
    _assign(segs, tr.requests, steps)
    settings: dict[str, str] = {}
    for seg in segs:
        if seg.label in settings:
            continue
        spec = (meta_ab.get("settings") or {}).get(seg.label, {}) if ab or cap else {}
        if isinstance(spec, dict) and (spec.get("describe") or spec.get("spec") is not None):
            settings[seg.label] = str(spec.get("describe") or spec["spec"]) or "the base settings"
        elif seg.label == ATTACHED:
            urls = (tr.meta.get("source") or {}).get("urls") or []
            settings[seg.label] = f"server {', '.join(urls)} (its own scheduler and knobs)"
        else:
            settings[seg.label] = _describe_steps(seg.steps) if ab or cap else \
                _describe_steps(seg.steps).split(", ", 1)[-1]
    return TraceView(tr.path, trace_name(tr.path), tr, origin, end, segs, ab, settings, cap)


def ab_results(view: TraceView, percentiles: Sequence[float],
               goodput: dict[str, float] | None) -> dict[int, abdef.Comparison | None]:
    """``probes.ab.analyse`` of each A/B run of ``view`` (run id → its comparison, None while a
    setting has no counted window), each segment given its window's result. The verdict needs
    ``MIN_REPETITIONS`` pairs for `gpuchef ab`'s sequential runs, else ``MIN_WINDOWS``."""
    meta_ab = view.meta.get("ab") if isinstance(view.meta.get("ab"), dict) else {}
    src = view.meta.get("source") if isinstance(view.meta.get("source"), dict) else {}
    # an attached server's A/B runs are whole loads (gpuchef ab over HTTP, top --attach's A/B)
    sequential = (bool(meta_ab) and meta_ab.get("interleave") is False) or \
        src.get("kind") == "attached"
    tr = view.trace
    gs = sorted(tr.gpu_samples, key=lambda g: g.t_ns)
    ts = [g.t_ns for g in gs]

    def gpu(a: int, b: int) -> dict[str, float]:
        import bisect
        return _field_means(gs[bisect.bisect_left(ts, a):bisect.bisect_left(ts, b)])

    by_key = {s.ab_key: s for s in view.segments if s.ab_key is not None}
    out: dict[int, abdef.Comparison | None] = {}
    for rid in abdef.runs_in(view.events):
        _, wins, _, results, cmp = abdef.analyse(
            view.events, tr.requests, tr.steps, run=rid, percentiles=percentiles,
            goodput=goodput or None, gpu_means=gpu if gs else None,
            min_pairs=abdef.MIN_REPETITIONS if sequential else abdef.MIN_WINDOWS,
            whole_loads=sequential)
        mirrored = {(w.label, w.n) for w in wins if w.mirrored}
        for r in results:
            seg = by_key.get((rid, r.label, r.rep))
            if seg is not None:
                seg.result = r
                if (r.label, r.rep) in mirrored:  # A's and B's windows share a span: by server
                    seg.requests, seg.steps = list(r.requests), []
        out[rid] = cmp
    return out


def _gpu_means(view: TraceView, segs: Sequence[Segment]) -> dict[str, float]:
    import bisect

    gs = sorted(view.trace.gpu_samples, key=lambda g: g.t_ns)
    ts = [g.t_ns for g in gs]
    samples = [g for s in segs
               for g in gs[bisect.bisect_left(ts, s.t0_ns):bisect.bisect_left(ts, s.t1_ns)]]
    return _field_means(samples)


def _field_means(samples: Sequence[GpuSample]) -> dict[str, float]:
    """Mean of each of GPU_FIELDS (% or W) over ``samples``: ``probes.metrics.gpu_means``
    (values not measured, None or NaN, left out; NaN for a field none of them has)."""
    return gpu_means(samples, GPU_FIELDS)


def capacity_probes(view: TraceView) -> tuple[list[Any], list[Any]]:
    """The probes of a ``gpuchef ab --capacity`` trace, judged from its records as the command
    judged them (``capacity.judge_probe`` and ``probe_of``): (their Probes in time order, each
    with ``label`` "A"/"B" added; the SLOs, from the meta's ``slo_spec``, [] when not recorded).
    A probe is one of :func:`capacity_segments` (its requests by arrival, steps by start); a
    ``capacity:<A|B>:stopped:<why>`` mark inside it says it stopped early. Computed once per
    view."""
    if view._probes is not None:
        return view._probes
    from gpuchef.experiments.capacity import judge_probe, parse_capacity_mark, parse_slos, probe_of, \
        slo_percentiles
    from gpuchef.engine_host.vocab.errors import ConfigError

    meta_ab = view.meta.get("ab") if isinstance(view.meta.get("ab"), dict) else {}
    try:
        slos = parse_slos(meta_ab["slo_spec"]) if meta_ab.get("slo_spec") else []
    except ConfigError:
        slos = []
    stops = sorted((e.t_ns, m[2]) for e in view.events if e.kind == "mark"
                   for m in [parse_capacity_mark(e.name)] if m is not None and m[1] is None)
    segs = view.segments if view.capacity else capacity_segments(view.events, view.end_ns + 1)
    if not view.capacity:  # cut otherwise (A/B windows too): the probes on a copy of the records
        _assign(segs, view.trace.requests, sorted(view.trace.steps, key=lambda s: s.t_start_ns))
    pcts = tuple(sorted({50.0, 99.0} | set(slo_percentiles(slos))))
    out = []
    last_seg = segs[-1] if segs else None
    for seg in segs:
        if not seg.requests:
            continue
        stop = next(((t, why) for t, why in stops if seg.t0_ns <= t < seg.t1_ns), (None, ""))
        rq = sorted(seg.requests, key=lambda r: r.arrival_ns)
        p = probe_of(judge_probe(rq, seg.steps, seg.t0_ns, percentiles=pcts, stopped=stop[1],
                                 stopped_ns=stop[0]), slos, seg.probe_rate)
        if seg is last_seg and not view.trace.complete and not stop[1]:
            # the recording stopped inside it: a partial probe, not a verdict
            p.fails = ["cut short: the trace ends inside this probe (no end record), so it "
                       "is judged on part of its requests", *p.fails]
            p.met = False
        p.label = seg.label
        out.append(p)
    view._probes = (out, slos)
    return view._probes


#: gpuchef/sessions/live_load.py marks a live rate change as ``rate→<value><unit>`` (unit "×" for a trace's
#: speed, " req/s" for random arrivals).
RATE_MARK = "rate→"


def last_rate(events: Sequence[EngineEvent]) -> str | None:
    """The rate set by the last ``rate→`` mark of ``events`` ("0.26×", "3 req/s"), or None."""
    marks = [e for e in events if e.kind == "mark" and str(e.name).startswith(RATE_MARK)]
    if not marks:
        return None
    return str(max(marks, key=lambda e: e.t_ns).name)[len(RATE_MARK):].strip()


def part_start_rate(view: TraceView, views: Sequence[TraceView] = ()) -> tuple[str | None, str]:
    """For a later part of a `top` session (``meta.part`` > 1): (the load rate in force when
    it began — the last rate change of the parts before it, or None when none changed it —,
    the name of the part that says so, or of the first part looked for and not found). The
    earlier parts are taken from ``views`` (the report's inputs) or read from beside the trace
    (``meta.previous_part``)."""
    seen = 0
    cur: TraceView | Trace = view
    while seen < 64:
        prev = (cur.meta if isinstance(cur, TraceView) else cur.meta).get("previous_part")
        if not isinstance(prev, str) or not prev:
            return None, ""
        name = Path(prev).name
        here = view.path.parent / name
        found = next((v for v in views if v.path.name == name
                      and v.meta.get("session_id") == view.meta.get("session_id")), None)
        if found is not None:
            tr: Trace = found.trace
        else:
            p = Path(prev) if Path(prev).is_file() else here
            if not p.is_file():
                return None, f"{name} (not found)"
            try:
                tr = read_trace(p)
            except Exception:  # an unreadable earlier part: say so, the report goes on
                return None, f"{name} (unreadable)"
        rate = last_rate(tr.events)
        if rate is not None:
            return rate, name
        cur, seen = tr, seen + 1
    return None, ""


def gpu_names(view: TraceView) -> dict[int, str]:
    """GPU index → its name, from the trace meta's ``gpus`` ({"0": "NVIDIA H200", …}); GPUs
    not named there are left out."""
    g = view.meta.get("gpus")
    out: dict[int, str] = {}
    if isinstance(g, dict):
        for k, v in g.items():
            try:
                out[int(k)] = str(v)
            except (TypeError, ValueError):
                continue
    return out


def gpu_indices(view: TraceView) -> list[int]:
    """The GPU indices (NVML) that have samples in the trace, ascending."""
    return sorted({g.gpu for g in view.trace.gpu_samples})


def per_gpu_means(view: TraceView) -> dict[int, dict[str, float]]:
    """Per GPU (index → fields), over the whole trace: the mean of each of GPU_FIELDS (% or W),
    ``mem_used_gib`` (mean device memory used, GiB) and ``samples`` (how many samples, a float
    count). A field never sampled on that GPU is NaN."""
    by: dict[int, list[GpuSample]] = {}
    for g in view.trace.gpu_samples:
        by.setdefault(g.gpu, []).append(g)
    out = {}
    for k in sorted(by):
        m = _field_means(by[k])
        mem = [g.mem_used_bytes for g in by[k] if g.mem_used_bytes is not None]
        m["mem_used_gib"] = sum(mem) / len(mem) / 2**30 if mem else math.nan
        m["samples"] = float(len(by[k]))
        out[k] = m
    return out


def _unique_names(views: Sequence[TraceView]) -> None:
    """Give traces of the same file name distinct names: ``folder/stem`` when their folders are
    named differently, else ``stem (2)``, ``stem (3)``, … (the first keeps its name)."""
    by: dict[str, list[TraceView]] = {}
    for v in views:
        by.setdefault(v.name, []).append(v)
    taken = {v.name for v in views}
    for name, same in by.items():
        if len(same) < 2:
            continue
        folders = [v.path.resolve().parent.name for v in same]
        if all(folders) and len(set(folders)) == len(same):
            for v, f in zip(same, folders):
                v.name = f"{f}/{name}"
            continue
        for i, v in enumerate(same[1:], start=2):
            while f"{name} ({i})" in taken:
                i += 1
            v.name = f"{name} ({i})"
            taken.add(v.name)


def _stretch_results(view: TraceView, percentiles: Sequence[float],
                     goodput: dict[str, float] | None) -> dict[int, "abdef.WindowResult"]:
    """A trace cut into mode stretches (the dashboard's mode switch under one load): each
    stretch as a ``probes.ab`` window (``window_results``, keyed by ``id(segment)``), so its
    throughputs are the work done while the mode was in force — requests finished, tokens
    produced and computed in its span — as an A/B window's are. Arrival-based throughputs
    credited a stretch with the requests that arrived in it and finished in the next (a
    saturated continuous stretch read 34.8 req/s while it finished none). Latencies stay by
    arrival. {} for a trace of one stretch (its arrivals are its work: bench's numbers), A/B
    windows and capacity probes (their own rules)."""
    segs = view.segments
    if view.ab or view.capacity or len(segs) < 2 or not any(s.steps for s in segs):
        return {}
    wins = [abdef.Window(0, s.label, i + 1, s.t0_ns, s.t1_ns, s.steps[0].step if s.steps else 0)
            for i, s in enumerate(segs)]
    res = abdef.window_results(wins, view.trace.requests, [x for s in segs for x in s.steps],
                               percentiles=percentiles, goodput=goodput, whole_loads=True)
    return {id(s): r for s, r in zip(segs, res)}


def cut_short_line(path: str | Path, shown: str) -> str:
    """The one line for a trace without an ``end`` record (``gpuchef report`` and ``gpuchef
    replay``): it was cut short, or its session is still writing it (a live server's trace);
    ``shown`` says what the command does with it."""
    return (f"{path}: no end record — the recording was cut short (the process was killed), or "
            f"its session is still running and writing it; {shown}")


def build(paths: Sequence[str | Path], *, percentiles: Sequence[float] = (50.0, 90.0, 99.0),
          goodput: dict[str, float] | None = None) -> ReportData:
    """Read the traces and compute the groups. Raises TraceReadError (from ``read_trace``) for
    a file that is not a gpuchef trace; skipped lines are collected in ``problems``, as is a
    trace without an ``end`` record (cut short)."""
    views, problems = _read_views(paths)
    _unique_names(views)
    groups = [g for v in views for g in _view_groups(v, percentiles, goodput)]
    _name_and_colour(groups)
    return ReportData(views, groups, problems, tuple(percentiles), dict(goodput or {}))


def _read_views(paths: Sequence[str | Path]) -> tuple[list[TraceView], list[str]]:
    """Each trace read and viewed, and the problems to show: its skipped lines, then what the
    trace as a whole lacks (an end record, a load-start event, every step record)."""
    views, problems = [], []
    for p in paths:
        tr = read_trace(p)
        first = len(problems)  # where this trace's problems begin
        problems.extend(tr.problems)
        if not tr.complete:
            problems.append(cut_short_line(tr.path, "the report shows what was written"))
        if (tr.meta.get("command") == "bench" and load_start_ns(tr.events) is None
                and tr.requests):
            problems.append(f"{tr.path}: no load-start event (gpuchef bench writes one before "
                            "its first step; an older trace has none): the duration counts "
                            "from the first arrival, "
                            "not from the load's start as gpuchef bench counted it, so the "
                            "throughputs here may read higher than bench printed")
        src = tr.meta.get("source") if isinstance(tr.meta.get("source"), dict) else {}
        if tr.requests and not tr.steps and src.get("kind") != "attached":
            import re

            bad = sum(1 for x in tr.problems if re.search(r" line \d+: step ", x))
            problems.insert(first, f"{tr.path}: no step record could be read"
                            + (f" ({bad} step line{'s' if bad != 1 else ''} unreadable)"
                               if bad else "")
                            + f": its {len(tr.requests)} requests are reported in one group "
                            "(the mode its meta record names), without engine-step figures"
                            )  # first: it says what the lines below it cost
        views.append(view_trace(tr))
    return views, problems


def _view_groups(v: TraceView, percentiles: Sequence[float],
                 goodput: dict[str, float] | None) -> list[Group]:
    """A trace's groups: one per A/B setting (its counted windows pooled, ``probes.ab.pool``),
    per mode under one load (each stretch's own work), or per mode (its segments' requests
    and steps summarized)."""
    groups: list[Group] = []
    by: dict[str, list[Segment]] = {}
    if v.ab:
        v.comparisons = ab_results(v, percentiles, goodput)
        for s in v.segments:
            if s.counted:  # the windows gpuchef ab and the live screen count
                by.setdefault(s.label, []).append(s)
    else:
        for s in v.segments:
            by.setdefault(s.label, []).append(s)
    stretches = _stretch_results(v, percentiles, goodput)
    v.stretch_work = bool(stretches)
    for label, segs in by.items():
        reqs = [r for s in segs for r in s.requests]
        steps = [x for s in segs for x in s.steps]
        if v.ab:  # probes.ab.pool: the one definition of pooled A/B figures
            m, gp = abdef.pool([s.result for s in segs], percentiles, goodput)
            desc = v.settings.get(label, "")
            name = f"{label}: {desc}" if desc else label
            groups.append(Group(f"{v.name}/{label}", name, v, segs, m,
                                gp if gp else _field_means(()), "", desc, label))
            continue
        if stretches:  # mode switches under one load: each stretch's own work (probes.ab)
            m, _ = abdef.pool([stretches[id(s)] for s in segs], percentiles, goodput)
            desc = v.settings.get(label, "")
            groups.append(Group(f"{v.name}/{label}", label, v, segs, m, _gpu_means(v, segs),
                                "", desc, label))
            continue
        dur = sum(s.duration_s for s in segs)
        m = summarize(reqs, max(dur, 1e-9), percentiles=percentiles, goodput=goodput or None,
                      steps=steps or None)
        if len(segs) > 1 and steps:
            # the span of all steps would count the gaps between windows: use the windows'
            span = sum((max(x.t_end_ns for x in s.steps) - min(x.t_start_ns for x in s.steps))
                       / 1e9 for s in segs if s.steps)
            m.steps_span_s = span
            m.steps_per_s = len(steps) / span if span > 0 else math.nan
            m.busy_fraction = sum(x.gpu_ms for x in steps) / (span * 1e3) if span > 0 \
                else math.nan
        desc = v.settings.get(label, "")
        name = f"{label}: {desc}" if (v.ab or v.capacity) and desc else label
        groups.append(Group(f"{v.name}/{label}", name, v, segs, m, _gpu_means(v, segs), "",
                            v.settings.get(label, ""), label))
    return groups


def _name_and_colour(groups: list[Group]) -> None:
    """Names unique across traces (a label or short name two groups share gets its trace's
    name); colours by mode or A/B setting when that is unambiguous, else the palette's."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[g.label] = counts.get(g.label, 0) + 1
    shorts: dict[str, int] = {}
    for g in groups:
        shorts[g.short] = shorts.get(g.short, 0) + 1
    for g in groups:
        if counts[g.label] > 1:
            g.label = f"{g.label} · {g.view.name}"
        if shorts[g.short] > 1:
            g.short = f"{g.short} · {g.view.name}"
    plain = [g.segments[0].label for g in groups]
    if len(set(plain)) == len(plain) and all(p in MODE_COLORS or p in AB_COLORS for p in plain):
        for g, p in zip(groups, plain):
            g.color = MODE_COLORS.get(p) or AB_COLORS[p]
    elif all(g.view.ab for g in groups) and len(groups) <= 2:
        for g in groups:
            g.color = AB_COLORS.get(g.segments[0].label[:1], PALETTE[0])
    else:
        for i, g in enumerate(groups):
            g.color = PALETTE[i % len(PALETTE)]
