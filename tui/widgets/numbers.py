"""Rolling numbers: latency percentiles, throughput, goodput against the SLOs, engine figures.

Definitions are ``probes.metrics.summarize``'s (``vllm bench serve``'s): TTFT, TPOT, ITL, E2EL
in ms over the requests that finished in the last ``window_s`` seconds; throughputs per second
of that window (clipped to the session's start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

import numpy as np

from gpuchef.probes.metrics import (COMPLETED_REASONS, PROBE_ID_PREFIX, BenchMetrics, _check_q,
                                    summarize)
from gpuchef.probes.timeline import TimelineSnapshot

from ..plotdata import StepColumns, resume_index

from .. import theme


@dataclass(frozen=True)
class Numbers:
    """One refresh of the numbers panel. ``metrics``: None before anything finished or ran.
    ``in_flight``: requests submitted but not finished (from the newest step's queues)."""

    window_s: float
    metrics: BenchMetrics | None
    slos: dict[str, float]
    running: int = 0
    waiting: int = 0
    mean_sm_active: float = float("nan")
    busy: float = float("nan")  # engine compute time / window (idle time counts), 0–1


def compute_numbers(snap: TimelineSnapshot, window_s: float, slos: dict[str, float],
                    percentiles: tuple[float, ...]) -> Numbers:
    """Summarise the last ``window_s`` seconds of ``snap`` (see the module docstring)."""
    t1 = snap.t_ns
    t0 = t1 - int(window_s * 1e9)
    dur = (t1 - max(t0, snap.origin_ns)) / 1e9
    steps = snap.steps_between(t0, t1)
    reqs = snap.requests_between(t0, t1)
    m = None
    if dur > 0 and (steps or reqs):
        m = summarize(reqs, dur, percentiles=percentiles, goodput=slos or None,
                      steps=steps or None)
    last = snap.steps[-1] if snap.steps else None
    gs = snap.gpu_samples_between(t0, t1)
    sm = [s.sm_active for s in gs if s.sm_active is not None]
    busy = min(1.0, sum(s.gpu_ms for s in steps) / (dur * 1e3)) if dur > 0 else float("nan")
    return Numbers(window_s, m, dict(slos), last.num_running if last else 0,
                   last.num_waiting if last else 0,
                   sum(sm) / len(sm) if sm else float("nan"), busy)


_REQ_FIELDS = ("key", "counted", "done", "timed", "prompt", "output", "ttft", "tpot", "e2el",
               "itl_end")


class RequestColumns:
    """The snapshot's finished requests as numpy columns, appended incrementally (each record is
    converted once): per request its window key (finish ns), whether summarize counts it
    (completed, not a probe), failed, prompt/output lengths, TTFT, TPOT (NaN for one token),
    E2EL (ms), and its ITLs in one flat array (``itl_end``: cumulative end offsets; requests that
    summarize does not time add none). The rows mirror the timeline's request ring: the last
    ``len(snapshot requests)`` rows are the snapshot's."""

    def __init__(self) -> None:
        self.cols = {k: np.zeros(0, dtype=np.float64 if k in ("ttft", "tpot", "e2el")
                                 else np.int64) for k in _REQ_FIELDS}
        self.itl = np.zeros(0)
        self._last = None
        self._base = 0  # rows before this one fell out of the ring (trimmed in chunks)
        self.live = 0   # rows in the ring at the last extend

    def extend(self, snap: TimelineSnapshot) -> None:
        pairs = snap._req_pairs
        keys = self.cols["key"]
        i = resume_index(pairs, self._last, lambda p: p[1], lambda p: p[0],
                         int(keys[-1]) if len(keys) else None)
        fresh = pairs[i:]
        if fresh:
            self._last = fresh[-1][1]
            rows = {k: [] for k in _REQ_FIELDS}
            itls = [self.itl]
            end = int(self.cols["itl_end"][-1]) if len(self.cols["itl_end"]) else 0
            for key, r in fresh:
                probe = r.request_id.startswith(PROBE_ID_PREFIX)
                done = r.finish_reason in COMPLETED_REASONS
                t = r.token_times_ns
                counted = done and not probe
                timed = counted and bool(t)
                nan = float("nan")
                ttft = e2el = tpot = nan
                if timed:
                    ttft, e2el = (t[0] - r.arrival_ns) / 1e6, (t[-1] - r.arrival_ns) / 1e6
                    if r.output_len > 1:
                        tpot = (e2el - ttft) / (r.output_len - 1)
                    if len(t) > 1:
                        d = np.diff(np.asarray(t, dtype=np.int64)) / 1e6
                        itls.append(d)
                        end += len(d)
                for k, v in zip(_REQ_FIELDS, (key, counted, (not done) and not probe, timed,
                                              r.prompt_len, r.output_len, ttft, tpot, e2el,
                                              end)):
                    rows[k].append(v)
            for k in _REQ_FIELDS:
                self.cols[k] = np.concatenate([self.cols[k],
                                               np.asarray(rows[k], dtype=self.cols[k].dtype)])
            self.itl = np.concatenate(itls) if len(itls) > 1 else self.itl
        n = len(self.cols["key"])
        self.live = len(pairs)
        base = n - len(pairs)
        if base > 4096:  # drop what fell out of the ring, in chunks
            off = int(self.cols["itl_end"][base - 1])
            for k in _REQ_FIELDS:
                self.cols[k] = self.cols[k][base:]
            self.cols["itl_end"] = self.cols["itl_end"] - off
            self.itl = self.itl[off:]
            base = 0
        self._base = base

    def between(self, t0: int, t1: int) -> tuple[int, int]:
        """Rows of the requests that finished in ``[t0, t1)`` (``requests_between``)."""
        k = self.cols["key"]
        i = max(self._base, int(np.searchsorted(k, t0, side="left")))
        j = max(i, int(np.searchsorted(k, t1, side="left")))
        return i, j


def _stats(a: np.ndarray, pcts: tuple[float, ...]) -> tuple:
    if not len(a):
        return (NAN, NAN, NAN, [(p, NAN) for p in pcts])
    q = np.percentile(a, pcts) if pcts else []
    return (float(np.mean(a)), float(np.median(a)), float(np.std(a)),
            [(p, float(v)) for p, v in zip(pcts, q)])


NAN = float("nan")


def fast_metrics(reqs: RequestColumns, steps: StepColumns, t0: int, t1: int, dur: float,
                 percentiles: tuple[float, ...], slos: dict[str, float]) -> BenchMetrics | None:
    """``summarize(snap.requests_between(t0, t1), dur, percentiles, slos,
    steps=snap.steps_between(t0, t1))`` from the columns (numpy, no pass over the records);
    None when the window has neither. The probe figures are left at their defaults (the panel
    does not show them)."""
    i, j = reqs.between(t0, t1)
    te = steps.ints[:, 1]
    si, sj = int(np.searchsorted(te, t0)), int(np.searchsorted(te, t1))
    if not (dur > 0 and (j > i or sj > si)):
        return None
    pcts = tuple(_check_q(p) for p in percentiles)
    c = {k: v[i:j] for k, v in reqs.cols.items()}
    counted = c["counted"].astype(bool)
    timed = c["timed"].astype(bool)
    completed, failed = int(counted.sum()), int(c["done"].sum())
    total_in, total_out = int(c["prompt"][counted].sum()), int(c["output"][counted].sum())
    ttft, e2el = c["ttft"][timed], c["e2el"][timed]
    tp = c["tpot"][timed]
    tpots = tp[np.isfinite(tp)]
    a = int(reqs.cols["itl_end"][i - 1]) if i > 0 else 0
    b = int(reqs.cols["itl_end"][j - 1]) if j > 0 else 0
    itls = reqs.itl[a:b] if j > i else reqs.itl[:0]
    good = None
    if slos:
        req = {"ttft": ttft, "tpot": np.nan_to_num(tp, nan=0.0), "e2el": e2el}
        ok = np.ones(len(ttft), bool)
        for k, v in slos.items():
            ok &= req[k] <= v
        good = int(ok.sum()) / dur
    m = BenchMetrics(
        duration_s=dur, completed=completed, failed=failed, total_input=total_in,
        total_output=total_out, request_throughput=completed / dur,
        output_throughput=total_out / dur, total_token_throughput=(total_in + total_out) / dur,
        request_goodput=good, goodput_slos_ms=dict(slos), percentiles=pcts,
        **{f"{k}_{stem}_ms": v
           for stem, vals in (("ttft", ttft), ("tpot", tpots), ("itl", itls), ("e2el", e2el))
           for k, v in zip(("mean", "median", "std", "percentiles"), _stats(vals, pcts))})
    if sj > si:
        ints, gpu = steps.ints[si:sj], steps.gpu_ms[si:sj]
        n = sj - si
        span_ns = int(ints[:, 1].max() - ints[:, 0].min())
        pre, dec = ints[:, 2], ints[:, 3]
        m.num_steps = n
        m.steps_span_s = span_ns / 1e9
        m.steps_per_s = n / m.steps_span_s if span_ns > 0 else NAN
        m.mean_step_ms = float(np.mean((ints[:, 1] - ints[:, 0]) / 1e6))
        m.mean_gpu_ms = float(np.mean(gpu))
        m.mean_prefill_tokens_per_step = float(np.mean(pre))
        m.mean_decode_tokens_per_step = float(np.mean(dec))
        m.mean_tokens_per_step = float(np.mean(pre + dec))
        m.num_mixed_steps = int(((pre > 0) & (dec > 0)).sum())
        m.num_preemptions = int(ints[:, 6].sum())
        m.busy_fraction = float(gpu.sum()) / (span_ns / 1e6) if span_ns > 0 else NAN
    return m


def compute_numbers_fast(snap: TimelineSnapshot, window_s: float, slos: dict[str, float],
                         percentiles: tuple[float, ...], steps: StepColumns,
                         reqs: RequestColumns) -> Numbers:
    """:func:`compute_numbers` from columns kept up to date by the caller (``steps`` extended
    with ``snap.steps``, ``reqs`` with ``snap``): the same numbers, without a Python pass over
    the window's steps, requests and tokens (at 150 steps/s a 30 s window holds ~4 500 steps
    and tens of thousands of inter-token gaps)."""
    t1 = snap.t_ns
    t0 = t1 - int(window_s * 1e9)
    dur = (t1 - max(t0, snap.origin_ns)) / 1e9
    m = fast_metrics(reqs, steps, t0, t1, dur, percentiles, slos)
    last = snap.steps[-1] if snap.steps else None
    gs = snap.gpu_samples_between(t0, t1)
    sm = [s.sm_active for s in gs if s.sm_active is not None]
    te = steps.ints[:, 1]
    si, sj = int(np.searchsorted(te, t0)), int(np.searchsorted(te, t1))
    busy = min(1.0, float(steps.gpu_ms[si:sj].sum()) / (dur * 1e3)) if dur > 0 else float("nan")
    return Numbers(window_s, m, dict(slos), last.num_running if last else 0,
                   last.num_waiting if last else 0,
                   sum(sm) / len(sm) if sm else float("nan"), busy)


def _f(v: float | None, nd: int = 0) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if abs(v) >= 10_000:
        return f"{v:,.0f}"
    return f"{v:,.{nd}f}"


def _pct(pairs, q: float) -> float:
    for p, v in pairs:
        if p == q:
            return v
    return float("nan")


W_NAME, W_VAL = 16, 10


def _line(t: Text, name: str, a: str = "", b: str = "", *, name_style: str = theme.LABEL,
          a_style: str = theme.TITLE, b_style: str = theme.TITLE) -> None:
    t.append(name[:W_NAME].ljust(W_NAME), style=name_style)
    t.append(a.rjust(W_VAL), style=a_style)
    t.append(b.rjust(W_VAL), style=b_style)
    t.append("\n")


def numbers_text(n: Numbers, percentiles: tuple[float, ...]) -> Text:
    """The panel's lines as one Text (fixed columns; no Rich layout per refresh). Always
    ``NUMBERS_LINES`` lines, so that the panel never changes height."""
    m = n.metrics
    lo, hi = (percentiles[0], percentiles[-1]) if percentiles else (50.0, 99.0)
    head = f"bold {theme.TITLE}"
    t = Text(no_wrap=True, overflow="crop")
    _line(t, "latency (ms)", f"P{lo:g}", f"P{hi:g}", name_style=head, a_style=head, b_style=head)
    for stem, name, colour in (("ttft", "TTFT", theme.PREFILL), ("tpot", "TPOT", theme.DECODE),
                               ("itl", "ITL", theme.DECODE), ("e2el", "E2EL", theme.TITLE)):
        pairs = getattr(m, f"percentiles_{stem}_ms") if m else []
        nd = 1 if stem in ("tpot", "itl") else 0
        _line(t, name, _f(_pct(pairs, lo), nd), _f(_pct(pairs, hi), nd), name_style=colour)
    _line(t, "throughput", name_style=head)
    _line(t, "requests/s", _f(m.request_throughput if m else None, 2))
    _line(t, "output tok/s", _f(m.output_throughput if m else None))
    _line(t, "total tok/s", _f(m.total_token_throughput if m else None))
    if n.slos:
        g = m.request_goodput if m else None
        share = (g / m.request_throughput * 100) if (m and g is not None
                                                     and m.request_throughput > 0) else None
        _line(t, "goodput req/s", _f(g, 2), f"{share:.0f}%" if share is not None else "–",
              name_style=theme.RUNNING, b_style=theme.LABEL)
        slo = " ".join(f"{k.upper()}≤{v:g}" for k, v in n.slos.items())
        t.append(f" SLO {slo} ms\n", style=theme.AXIS)
    else:
        _line(t, "goodput", "–", "no SLO", b_style=theme.AXIS)
        t.append(" --goodput ttft:MS tpot:MS sets one\n", style=theme.AXIS)
    _line(t, "engine", name_style=head)
    busy = n.busy * 100
    _line(t, "steps/s", _f(m.steps_per_s if m else None, 1), f"busy {_f(busy)}%",
          b_style=theme.LABEL)
    _line(t, "tokens/step", _f(m.mean_tokens_per_step if m else None, 1))
    pre = m.mean_prefill_tokens_per_step if m else None
    dec = m.mean_decode_tokens_per_step if m else None
    _line(t, "  prefill", _f(pre, 1), name_style=theme.PREFILL, a_style=theme.PREFILL)
    _line(t, "  decode", _f(dec, 1), name_style=theme.DECODE, a_style=theme.DECODE)
    mixed = (m.num_mixed_steps / m.num_steps * 100) if (m and m.num_steps) else None
    _line(t, "  mixed steps", f"{_f(mixed)}%", name_style=theme.MIXED, a_style=theme.MIXED)
    _line(t, "preemptions", _f(m.num_preemptions if m else None))
    sm = f"{n.mean_sm_active:.0f}%" if math.isfinite(n.mean_sm_active) else "no data"
    _line(t, "SM active (GPM)", sm, name_style=theme.SM_ACTIVE)
    _line(t, "done / failed", f"{m.completed if m else 0}", f"{m.failed if m else 0}")
    _line(t, "running/waiting", f"{n.running}", f"{n.waiting}")
    t.rstrip()
    return t


NUMBERS_LINES = 21


class NumbersPanel(Static):
    """The numbers column. ``show(numbers)`` replaces the table (about once a second)."""

    DEFAULT_CSS = """
    NumbersPanel { height: 22; padding: 0 1; background: #11151c; }
    """

    def __init__(self, percentiles: tuple[float, ...], **kw) -> None:
        super().__init__("", **kw)
        self.percentiles = percentiles
        self.border_title = "Numbers"

    def show(self, n: Numbers) -> None:
        title = f"Numbers · last {n.window_s:g} s"
        if title != self.border_title:
            self.border_title = title
        text = numbers_text(n, self.percentiles)
        if text != getattr(self, "_shown", None):  # nothing moved: no repaint
            self._shown = text
            self.update(text, layout=False)
