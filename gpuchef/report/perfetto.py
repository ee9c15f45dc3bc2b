"""Session traces as Chrome Trace Event JSON (object form), for ui.perfetto.dev and chrome://tracing.

Format (the Trace Event Format document): ``{"traceEvents": [...],
"displayTimeUnit": "ms", "otherData": {...}}``; ``ts``/``dur`` in µs. Per trace (one process
each, several traces side by side with their own time 0):

* thread "engine steps": each step an ``X`` slice (name "prefill" / "decode" / "mixed", args: the
  StepRecord). Slices on one thread must nest; steps of one engine never overlap, but a step that
  starts before the previous one ended (clock skew, a merged trace) goes to an "engine steps
  (overlap)" thread rather than break the nesting;
* thread "settings": A/B windows or mode stretches as ``X`` slices;
* threads "requests #k": each request an ``X`` slice from arrival to its last token with a
  nested "waiting + prefill" slice up to its first token; requests are packed greedily onto as
  few threads as keep them from overlapping;
* ``C`` counters: tokens per step (prefill, decode), queue (running, waiting), KV cache used (%),
  and per GPU (one process each): utilisation % (SM active, tensor active, DRAM bandwidth,
  GPU-Util), power (W), memory used (GiB); host CPU % and RSS;
* ``i`` instants: knob changes, mode switches, marks, warnings and errors (global scope);
* ``M`` metadata: process and thread names and sort order.

Time 0 is the trace's first record; ``otherData.clock`` keeps the meta record's clock origin so
that a gpuchef trace can be aligned with a PyTorch profiler trace (wall = t − monotonic + time).
"""

from __future__ import annotations

import heapq
import json
from typing import Any, Sequence

from gpuchef.probes.metrics import GPU_SUMMARY_FIELDS
from gpuchef.probes.nvml.fields import BY_NAME

from .data import ReportData, TraceView, gpu_indices, gpu_names

PID_STRIDE = 100  # pids of trace k: k*100 + 1 (engine), + 2 (requests), + 10 + gpu (GPUs)
#: the GPU fields of the "utilisation (%)" counter: the summaries' % fields, by their labels
_UTIL = tuple(f for f in GPU_SUMMARY_FIELDS if BY_NAME[f].unit == "%")
TID_STEPS, TID_OVERLAP, TID_SETTINGS, TID_COUNTERS = 1, 2, 3, 4


def _us(view: TraceView, t_ns: int) -> float:
    return round((t_ns - view.origin_ns) / 1e3, 3)


def _meta(pid: int, tid: int | None, name: str, value: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {"name" if "name" in name
                                                                        else "sort_index": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


_SLICE_NAME = {"prefill_only": "prefill", "mixed": "mixed", "decode_only": "decode"}


def _kind(s: Any) -> str:
    return _SLICE_NAME[s.kind]  # StepRecord.kind, as the slice's name


def trace_events(view: TraceView, k: int) -> list[dict[str, Any]]:
    """The events of one trace (the k-th of the file: its pids start at ``k*PID_STRIDE``), in
    this order: process and thread names, steps, settings, requests, GPUs and host, instants."""
    base = k * PID_STRIDE
    eng, reqp = base + 1, base + 2
    ev: list[dict[str, Any]] = [
        _meta(eng, None, "process_name", f"gpuchef engine — {view.name}"),
        _meta(eng, None, "process_sort_index", base + 1),
        _meta(eng, TID_STEPS, "thread_name", "engine steps"),
        _meta(eng, TID_SETTINGS, "thread_name", "A/B windows" if view.ab else
              "capacity probes" if view.capacity else "scheduler mode"),
        _meta(eng, TID_COUNTERS, "thread_name", "counters"),
        _meta(reqp, None, "process_name", f"requests — {view.name}"),
        _meta(reqp, None, "process_sort_index", base + 2),
    ]
    ev += _step_events(view, eng)
    ev += _setting_events(view, eng)
    ev += _request_events(view, reqp)
    ev += _gpu_and_host_events(view, base, eng)
    ev += _instant_events(view, eng)
    return ev


def _step_events(view: TraceView, eng: int) -> list[dict[str, Any]]:
    """Steps as X slices that never partially overlap on one tid (an overlapping step goes to
    the "engine steps (overlap)" thread), with their token, queue and KV counters."""
    tr = view.trace
    ev: list[dict[str, Any]] = []
    last_end = -1
    overlap = False
    for s in sorted(tr.steps, key=lambda s: (s.t_start_ns, s.t_end_ns)):
        ts, te = _us(view, s.t_start_ns), _us(view, max(s.t_end_ns, s.t_start_ns))
        tid = TID_STEPS
        if s.t_start_ns < last_end:
            tid, overlap = TID_OVERLAP, True
        else:
            last_end = s.t_end_ns
        ev.append({"ph": "X", "pid": eng, "tid": tid, "name": _kind(s), "cat": "step",
                   "ts": ts, "dur": round(te - ts, 3), "args": s.as_dict()})
        ev.append({"ph": "C", "pid": eng, "tid": TID_COUNTERS, "name": "tokens per step",
                   "ts": ts, "args": {"prefill": s.num_prefill_tokens, "decode": s.num_decode_reqs}})
        ev.append({"ph": "C", "pid": eng, "tid": TID_COUNTERS, "name": "queue (requests)",
                   "ts": ts, "args": {"running": s.num_running, "waiting": s.num_waiting}})
        if s.kv_blocks_total:
            ev.append({"ph": "C", "pid": eng, "tid": TID_COUNTERS, "name": "KV cache used (%)",
                       "ts": ts, "args": {"used": round(s.kv_blocks_used / s.kv_blocks_total
                                                        * 100, 3)}})
    if overlap:
        ev.append(_meta(eng, TID_OVERLAP, "thread_name", "engine steps (overlap)"))
    return ev


def _setting_events(view: TraceView, eng: int) -> list[dict[str, Any]]:
    """Settings stretches as X slices (never overlapping: each ends where the next begins, or
    before); a mirrored repetition's A and B windows share one span: one slice "A1 | B1"."""
    ev: list[dict[str, Any]] = []
    prev = -1.0
    spans: dict[tuple[int, int], list] = {}
    for seg in sorted(view.segments, key=lambda s: s.t0_ns):
        spans.setdefault((seg.t0_ns, seg.t1_ns), []).append(seg)
    for (t0, t1), segs in spans.items():
        ts, te = max(_us(view, t0), prev), _us(view, t1)
        if te <= ts:
            continue
        ev.append({"ph": "X", "pid": eng, "tid": TID_SETTINGS, "cat": "setting",
                   "name": " | ".join(x.name for x in segs), "ts": ts, "dur": round(te - ts, 3),
                   "args": {"setting": "; ".join(view.settings.get(x.label, x.label)
                                                 for x in segs)}})
        prev = te
    return ev


def _request_events(view: TraceView, reqp: int) -> list[dict[str, Any]]:
    """Requests as X slices with a nested "waiting + prefill" one, packed greedily onto lanes
    (threads) so that one lane's slices stay disjoint."""
    tr = view.trace
    ev: list[dict[str, Any]] = []
    lanes: list[tuple[int, int]] = []  # heap of (end_ns, lane)
    n_lanes = 0
    for r in sorted(tr.requests, key=lambda r: r.entered_ns):
        if r.withdrawn:  # withdrawn before it arrived: it never ran, no slice to draw
            continue
        end = r.closed_ns
        if lanes and lanes[0][0] <= r.arrival_ns:
            _, lane = heapq.heappop(lanes)
        else:
            n_lanes += 1
            lane = n_lanes
            ev.append(_meta(reqp, lane, "thread_name", f"requests #{lane}"))
        heapq.heappush(lanes, (end + 1, lane))
        ts, te = _us(view, r.arrival_ns), _us(view, end)
        args = {"prompt_len": r.prompt_len, "output_len": r.output_len,
                "finish_reason": r.finish_reason, "num_preemptions": r.num_preemptions,
                "ttft_ms": r.ttft_ms, "e2el_ms": r.e2el_ms, "tpot_ms": r.tpot_ms}
        ev.append({"ph": "X", "pid": reqp, "tid": lane, "name": r.request_id, "cat": "request",
                   "ts": ts, "dur": round(max(te - ts, 0.0), 3), "args": args})
        if r.token_times_ns:
            tf = _us(view, r.token_times_ns[0])
            ev.append({"ph": "X", "pid": reqp, "tid": lane, "name": "waiting + prefill",
                       "cat": "request", "ts": ts, "dur": round(max(tf - ts, 0.0), 3),
                       "args": {"ttft_ms": r.ttft_ms}})
    return ev


def _gpu_and_host_events(view: TraceView, base: int, eng: int) -> list[dict[str, Any]]:
    """A process per GPU with its utilisation, power and memory counters; the host's CPU and
    RSS on the engine's counters thread."""
    tr = view.trace
    ev: list[dict[str, Any]] = []
    names = gpu_names(view)
    for g in gpu_indices(view):
        pid = base + 10 + g
        ev.append(_meta(pid, None, "process_name", f"GPU {g} {names.get(g, '')} — {view.name}"))
        ev.append(_meta(pid, None, "process_sort_index", base + 10 + g))
    for x in sorted(tr.gpu_samples, key=lambda x: x.t_ns):
        pid, ts = base + 10 + x.gpu, _us(view, x.t_ns)
        util = {BY_NAME[f].label: v for f in _UTIL if (v := getattr(x, f)) is not None}
        if util:
            ev.append({"ph": "C", "pid": pid, "name": "utilisation (%)", "ts": ts, "args": util})
        if x.power_w is not None:
            ev.append({"ph": "C", "pid": pid, "name": "power (W)", "ts": ts,
                       "args": {"power": x.power_w}})
        if x.mem_used_bytes is not None:
            ev.append({"ph": "C", "pid": pid, "name": "memory used (GiB)", "ts": ts,
                       "args": {"used": round(x.mem_used_bytes / 2**30, 3)}})
    for h in sorted(tr.host_samples, key=lambda h: h.t_ns):
        args = {"RSS GiB": round(h.rss_bytes / 2**30, 3)}
        if h.process_cpu_pct is not None:
            args["process CPU %"] = h.process_cpu_pct
        ev.append({"ph": "C", "pid": eng, "tid": TID_COUNTERS, "name": "host",
                   "ts": _us(view, h.t_ns), "args": args})
    return ev


def _instant_events(view: TraceView, eng: int) -> list[dict[str, Any]]:
    """Knob changes, mode switches, marks, warnings and errors as global instants."""
    ev: list[dict[str, Any]] = []
    for e in view.events:
        label = (f"{e.name}: {e.old} → {e.new}" if e.kind in ("knob", "mode")
                 else f"{e.kind}: {e.name or e.message}")
        ev.append({"ph": "i", "pid": eng, "tid": TID_STEPS, "s": "g", "name": label,
                   "cat": e.kind, "ts": _us(view, e.t_ns), "args": e.as_dict()})
    return ev


def to_chrome_trace(data: ReportData) -> dict[str, Any]:
    """The Chrome Trace Event JSON object of all traces in ``data``."""
    events: list[dict[str, Any]] = []
    for k, v in enumerate(data.views):
        events.extend(trace_events(v, k))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "gpuchef report --format perfetto",
            "traces": [{"file": v.path.name, "clock": v.meta.get("clock"),
                        "time0_monotonic_ns": v.origin_ns, "model": v.meta.get("model"),
                        "command": v.meta.get("command")} for v in data.views],
        },
    }


def write(data: ReportData, path: str) -> int:
    """Write the JSON to ``path``; returns the number of events."""
    obj = to_chrome_trace(data)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"), allow_nan=False, default=_default)
    return len(obj["traceEvents"])


def _default(o: Any) -> Any:
    if isinstance(o, float):
        return None
    return str(o)
