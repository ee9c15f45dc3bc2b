"""Live A/B analysis: the windows of an A/B run, read back from its marks, and per-setting numbers
with the difference and the run-to-run spread.

Window edges are the ``ab:<run>:<A|B>:<n>`` mark events (their time is when the setting took
effect, between two engine steps); ``ab:<run>:end`` closes the last window. Each window's first
``settle_s`` seconds are skipped: requests in flight at an edge finish under the new setting.
A request belongs to the window it finished in, a step to the window it ended in (as
``probes.timeline`` windows do). Metric definitions are ``probes.metrics.summarize``'s.

"Beyond the spread" means the per-window values of A and of B do not overlap at all (every B
window beat every A window, or lost to it) — with at least two complete windows per setting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from gpuchef.probes.metrics import BenchMetrics, summarize
from gpuchef.probes.timeline import TimelineSnapshot

from .model import ABState


@dataclass(frozen=True)
class ABWindow:
    """One window: setting ``label`` ("A"/"B"), its 1-based ``index``, ``[t0_ns, t1_ns)``
    (``t1_ns`` None while it runs) and the first step in force (``step0``)."""

    label: str
    index: int
    t0_ns: int
    t1_ns: int | None
    step0: int

    @property
    def complete(self) -> bool:
        return self.t1_ns is not None


def ab_windows(events, run: int | None = None) -> tuple[int | None, list[ABWindow], bool]:
    """(run id, windows in time order, ended) of A/B run ``run`` (default: the newest) from
    EngineEvents. Ended: its ``end`` mark was seen."""
    marks = []
    for ev in events:
        if ev.kind != "mark" or not str(ev.name).startswith("ab:"):
            continue
        parts = str(ev.name).split(":")
        try:
            rid = int(parts[1])
        except (IndexError, ValueError):
            continue
        marks.append((rid, parts[2:], ev))
    if not marks:
        return None, [], False
    if run is None:
        run = max(m[0] for m in marks)
    mine = [(p, ev) for rid, p, ev in marks if rid == run]
    wins: list[ABWindow] = []
    ended = False
    for i, (p, ev) in enumerate(mine):
        if p and p[0] == "end":
            ended = True
            continue
        if len(p) < 2 or p[0] not in ("A", "B"):
            continue
        t1 = mine[i + 1][1].t_ns if i + 1 < len(mine) else None
        wins.append(ABWindow(p[0], int(p[1]), ev.t_ns, t1, ev.step))
    return run, wins, ended


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    better: str  # "lower", "higher" or "" (shown, not judged)
    get: Callable[[BenchMetrics, float], float]


def _p(stem: str, q: float) -> Callable[[BenchMetrics, float], float]:
    def get(m: BenchMetrics, _sm: float) -> float:
        for p, v in getattr(m, f"percentiles_{stem}_ms"):
            if p == q:
                return v
        return math.nan
    return get


def metrics_for(percentiles: tuple[float, ...], goodput: bool) -> list[Metric]:
    lo, hi = (percentiles[0], percentiles[-1]) if percentiles else (50.0, 99.0)
    out = []
    for stem, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL")):
        out.append(Metric(f"p{lo:g}_{stem}", f"{name} P{lo:g}", "ms", "lower", _p(stem, lo)))
        out.append(Metric(f"p{hi:g}_{stem}", f"{name} P{hi:g}", "ms", "lower", _p(stem, hi)))
    out.append(Metric(f"p{hi:g}_e2el", f"E2EL P{hi:g}", "ms", "lower", _p("e2el", hi)))
    out.append(Metric("req_s", "requests/s", "req/s", "higher", lambda m, s: m.request_throughput))
    out.append(Metric("out_tok_s", "output tok/s", "tok/s", "higher",
                      lambda m, s: m.output_throughput))
    if goodput:
        out.append(Metric("goodput", "goodput", "req/s", "higher",
                          lambda m, s: m.request_goodput if m.request_goodput is not None
                          else math.nan))
    out.append(Metric("steps_s", "steps/s", "/s", "", lambda m, s: m.steps_per_s))
    out.append(Metric("tok_step", "tokens/step", "tok", "", lambda m, s: m.mean_tokens_per_step))
    out.append(Metric("mixed", "mixed steps", "%", "",
                      lambda m, s: m.num_mixed_steps / m.num_steps * 100 if m.num_steps else math.nan))
    # busy over the whole window (idle time between steps counts), not summarize's step span
    out.append(Metric("busy", "engine busy", "%", "",
                      lambda m, s: min(100.0, m.mean_gpu_ms * m.num_steps / (m.duration_s * 10))
                      if m.num_steps else math.nan))
    out.append(Metric("sm", "SM active", "%", "", lambda m, s: s))
    return out


@dataclass
class SettingResult:
    """One setting: its complete windows, pooled metrics over them (requests of all its windows,
    durations summed) and each window's own metrics (for the spread)."""

    label: str
    windows: list[ABWindow] = field(default_factory=list)
    pooled: BenchMetrics | None = None
    pooled_sm: float = math.nan
    per_window: list[tuple[BenchMetrics, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """A metric's line in the A/B table. ``verdict``: "B better", "B worse", "differs" (no
    better direction), "within spread", or "need ≥2 windows each"."""

    metric: Metric
    a: float
    b: float
    delta: float
    delta_pct: float
    spread_a: float
    spread_b: float
    verdict: str


@dataclass
class ABResult:
    run: int | None
    windows: list[ABWindow]
    ended: bool
    settings: dict[str, SettingResult]
    rows: list[Row]


class ABAnalyser:
    """Computes :class:`ABResult` from snapshots; a finished window's metrics are computed once."""

    def __init__(self, slos: dict[str, float], percentiles: tuple[float, ...]) -> None:
        self.slos = dict(slos)
        self.percentiles = tuple(percentiles)
        self._cache: dict[tuple[int, int], tuple[BenchMetrics, float, tuple, tuple]] = {}
        self._pooled: dict[tuple, tuple[BenchMetrics, float]] = {}

    def _window(self, snap: TimelineSnapshot, w: ABWindow, settle_ns: int):
        key = (w.t0_ns, w.t1_ns or 0)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        t0, t1 = w.t0_ns + settle_ns, w.t1_ns
        if t1 is None or t1 <= t0:
            return None
        reqs = snap.requests_between(t0, t1)
        steps = snap.steps_between(t0, t1)
        m = summarize(reqs, (t1 - t0) / 1e9, percentiles=self.percentiles,
                      goodput=self.slos or None, steps=steps or None)
        sm = [g.sm_active for g in snap.gpu_samples_between(t0, t1) if g.sm_active is not None]
        out = (m, sum(sm) / len(sm) if sm else math.nan, reqs, steps)
        self._cache[key] = out
        return out

    def analyse(self, snap: TimelineSnapshot, state: ABState) -> ABResult:
        run, wins, ended = ab_windows(snap.events, state.run or None)
        settle_ns = int(state.settle_s * 1e9)
        res = {k: SettingResult(k) for k in ("A", "B")}
        pooled_parts: dict[str, tuple[list, list, float, list]] = {
            k: ([], [], 0.0, []) for k in ("A", "B")}
        for w in wins:
            if not w.complete:
                continue
            got = self._window(snap, w, settle_ns)
            if got is None:
                continue
            m, sm, reqs, steps = got
            r = res[w.label]
            r.windows.append(w)
            r.per_window.append((m, sm))
            rq, st, dur, sms = pooled_parts[w.label]
            rq.extend(reqs)
            st.extend(steps)
            sms.append(sm)
            pooled_parts[w.label] = (rq, st, dur + (w.t1_ns - w.t0_ns - settle_ns) / 1e9, sms)
        for k, (rq, st, dur, sms) in pooled_parts.items():
            if dur <= 0:
                continue
            key = (k, tuple((w.t0_ns, w.t1_ns) for w in res[k].windows), settle_ns)
            hit = self._pooled.get(key)  # same complete windows: same numbers
            if hit is None:
                pooled = summarize(rq, dur, percentiles=self.percentiles,
                                   goodput=self.slos or None, steps=st or None)
                fin = [x for x in sms if math.isfinite(x)]
                hit = self._pooled[key] = (pooled, sum(fin) / len(fin) if fin else math.nan)
            res[k].pooled, res[k].pooled_sm = hit
        rows = []
        for met in metrics_for(self.percentiles, bool(self.slos)):
            rows.append(_row(met, res["A"], res["B"]))
        return ABResult(run, wins, ended, res, rows)


def _vals(r: SettingResult, met: Metric) -> list[float]:
    return [v for m, sm in r.per_window if math.isfinite(v := met.get(m, sm))]


def _row(met: Metric, a: SettingResult, b: SettingResult) -> Row:
    va = met.get(a.pooled, a.pooled_sm) if a.pooled else math.nan
    vb = met.get(b.pooled, b.pooled_sm) if b.pooled else math.nan
    d = vb - va
    dp = d / va * 100 if math.isfinite(va) and va != 0 else math.nan
    wa, wb = _vals(a, met), _vals(b, met)
    sa = max(wa) - min(wa) if len(wa) >= 2 else math.nan
    sb = max(wb) - min(wb) if len(wb) >= 2 else math.nan
    if not wa and not wb and not (math.isfinite(va) or math.isfinite(vb)):
        verdict = "no data"
    elif len(wa) < 2 or len(wb) < 2:
        verdict = "need ≥2 windows each"
    elif min(wb) > max(wa) or max(wb) < min(wa):
        up = min(wb) > max(wa)
        if met.better == "":
            verdict = "differs"
        else:
            good = up == (met.better == "higher")
            verdict = "B better" if good else "B worse"
    else:
        verdict = "within spread"
    return Row(met, va, vb, d, dp, sa, sb, verdict)
