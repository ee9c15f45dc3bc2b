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


from gpuchef.probes.metrics import (DEFAULT_PERCENTILES, BenchMetrics, RequestTable, gpu_means,
                                     summarize, window_metrics)
from gpuchef.probes.timeline import TimelineSnapshot

from ..chart import fmt_age
from ..plotdata import StepColumns, resume_index

from .. import theme


@dataclass(frozen=True)
class Numbers:
    """One refresh of the numbers panel. ``metrics``: None before anything finished or ran.
    ``running`` / ``waiting``: the newest step's queues, plus the requests submitted since it
    (they wait: during an engine pause no step counts them); ``age_s``: how old that step is
    (s; NaN before any step)."""

    window_s: float
    metrics: BenchMetrics | None
    slos: dict[str, float]
    running: int = 0
    waiting: int = 0
    mean_sm_active: float = float("nan")
    busy: float = float("nan")  # engine compute time / window (idle time counts), 0–1
    age_s: float = float("nan")


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
    busy = min(1.0, sum(s.gpu_ms for s in steps) / (dur * 1e3)) if dur > 0 else float("nan")
    return Numbers(window_s, m, dict(slos), last.num_running if last else 0,
                   last.num_waiting if last else 0,
                   gpu_means(gs, ("sm_active",))["sm_active"], busy,
                   (snap.t_ns - last.t_end_ns) / 1e9 if last else float("nan"))


class RequestColumns:
    """The snapshot's finished requests in a ``probes.metrics.RequestTable``, appended as they
    finish (each record is converted once) and keyed by the timeline's finish time; rows that
    fell out of the timeline's request ring are dropped in chunks. The table's rows mirror the
    ring: the last ``live`` rows are the snapshot's."""

    def __init__(self) -> None:
        self.table = RequestTable()
        self._last = None
        self._base = 0  # rows before this one fell out of the ring
        self.live = 0

    def extend(self, snap: TimelineSnapshot) -> None:
        pairs = snap._req_pairs
        keys = self.table.cols["key"]
        i = resume_index(pairs, self._last, lambda p: p[1], lambda p: p[0],
                         int(keys[-1]) if len(keys) else None)
        fresh = pairs[i:]
        if fresh:
            self._last = fresh[-1][1]
            self.table.append((r for _, r in fresh), (k for k, _ in fresh))
        self.live = len(pairs)
        base = len(self.table) - len(pairs)
        if base > 4096:  # drop what fell out of the ring, in chunks
            self.table.drop_first(base)
            base = 0
        self._base = base

    def between(self, t0: int, t1: int) -> tuple[int, int]:
        """Rows of the requests that finished in ``[t0, t1)`` (``requests_between``)."""
        return self.table.rows_between(t0, t1, self._base)


def compute_numbers_fast(snap: TimelineSnapshot, window_s: float, slos: dict[str, float],
                         percentiles: tuple[float, ...], steps: StepColumns,
                         reqs: RequestColumns, pending: int = 0) -> Numbers:
    """:func:`compute_numbers` from columns kept up to date by the caller (``steps`` extended
    with ``snap.steps``, ``reqs`` with ``snap``): the same ``probes.metrics.window_metrics``
    over numpy slices, without a Python pass over the window's steps, requests and tokens (at
    150 steps/s a 30 s window holds ~4 500 steps and tens of thousands of inter-token gaps)."""
    t1 = snap.t_ns
    t0 = t1 - int(window_s * 1e9)
    dur = (t1 - max(t0, snap.origin_ns)) / 1e9
    i, j = reqs.between(t0, t1)
    sl = steps.ending_between(t0, t1)
    m = None
    if dur > 0 and (j > i or sl.stop > sl.start):
        m = window_metrics(reqs.table, i, j, dur, percentiles=percentiles, goodput=slos or None,
                           steps=steps.arrays(sl) if sl.stop > sl.start else None)
    last = snap.steps[-1] if snap.steps else None
    gs = snap.gpu_samples_between(t0, t1)
    busy = min(1.0, float(steps.gpu_ms[sl].sum()) / (dur * 1e3)) if dur > 0 else float("nan")
    return Numbers(window_s, m, dict(slos), last.num_running if last else 0,
                   (last.num_waiting if last else 0) + pending,
                   gpu_means(gs, ("sm_active",))["sm_active"], busy,
                   (snap.t_ns - last.t_end_ns) / 1e9 if last else float("nan"))


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


def window_label(s: float) -> str:
    """The numbers' window, at most 7 cells: "30 s", "600 s", "60 min"."""
    return f"{s:g} s" if s < 1000 else f"{s / 60:.0f} min"


def numbers_text(n: Numbers, percentiles: tuple[float, ...]) -> Text:
    """The panel's lines as one Text (fixed columns; no Rich layout per refresh). Always
    ``NUMBERS_LINES`` lines, so that the panel never changes height."""
    m = n.metrics
    lo, hi = (percentiles[0], percentiles[-1]) if percentiles else DEFAULT_PERCENTILES
    head = f"bold {theme.TITLE}"
    t = Text(no_wrap=True, overflow="crop")
    _line(t, "latency (ms)", f"P{lo:g}", f"P{hi:g}", name_style=head, a_style=head, b_style=head)
    for stem, name, colour in (("ttft", "TTFT", theme.PREFILL), ("tpot", "TPOT", theme.DECODE),
                               ("itl", "ITL per chunk", theme.DECODE),
                               ("e2el", "E2EL", theme.TITLE)):
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
    # the window said here too: the step waveform's readouts beside it are over ~2 s
    _line(t, "engine", "", f"last {window_label(n.window_s)}", name_style=head,
          b_style=theme.LABEL)
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
    age = fmt_age(n.age_s)
    if age:  # the newest step is this old (a long step in flight, a pause)
        t.rstrip()
        t.append(f" {age}\n", style=theme.LABEL)
    t.rstrip()
    return t


NUMBERS_LINES = 21


class NumbersPanel(Static):
    """The numbers column. ``show(numbers)`` replaces the table (about once a second)."""

    DEFAULT_CSS = f"""
    NumbersPanel {{ height: 22; padding: 0 1; background: {theme.PANEL_BG}; }}
    """

    def __init__(self, percentiles: tuple[float, ...], **kw) -> None:
        super().__init__("", **kw)
        self.percentiles = percentiles
        self.border_title = "Numbers"
        self._shown = None  # the table last shown (no repaint when nothing moved)

    def show(self, n: Numbers) -> None:
        title = f"Numbers · last {window_label(n.window_s)}"
        if title != self.border_title:
            self.border_title = title
        text = numbers_text(n, self.percentiles)
        if text != self._shown:  # nothing moved: no repaint
            self._shown = text
            self.update(text, layout=False)
