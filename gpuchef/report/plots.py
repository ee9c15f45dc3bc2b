"""The report's figures, drawn with matplotlib (``Figure`` objects: no pyplot, no GUI backend)
and returned as inline SVG text for the HTML page.

Each function takes the :class:`~gpuchef.report.data.ReportData` (or one of its views) and
returns an SVG string (``<svg …>…</svg>``: no XML prolog, no RDF metadata, ids salted per
figure so that several SVGs can live in one HTML document). Dense artists (thousands of step
bars or points) are kept few by binning and quantile-sampling, so the page stays small.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from typing import Any, Sequence

import numpy as np

from gpuchef.engine_host.autopilot import (ERROR_ENTER, ERROR_LEAVE, FALLBACK, INFEASIBLE,
                                          LEARNING, NOT_STEERING, STATE_MEANING, STEERING)
from gpuchef.engine_host.config import setting_label
from gpuchef.probes.timeline import Timeline
from gpuchef.probes.metrics import autopilot_totals, is_completed, is_probe_id

from .data import AB_COLORS, PALETTE, Group, TraceView, gpu_indices, gpu_names, per_gpu_means

_LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
PREFILL = "#E9A23B"
DECODE = "#2A9D8F"
MIXED = "#8E6C8A"
GRID = "#E6E6E6"
INK = "#333333"
TARGET_BINS = 400
CDF_POINTS = 400

_RC = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial", "Liberation Sans"],
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.labelsize": 9.0,
    "axes.edgecolor": "#999999",
    "axes.labelcolor": INK,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": GRID,
    "grid.linewidth": 0.6,
    "xtick.color": "#555555",
    "ytick.color": "#555555",
    "legend.frameon": False,
    "legend.fontsize": 8.0,
    "svg.fonttype": "path",  # text as paths: identical on every machine, no font lookups
    "figure.dpi": 100,
}


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained")


def to_svg(fig: Any, name: str, alt: str) -> str:
    """``fig`` as inline SVG text. ``name`` salts the element ids (unique per figure in one
    page); ``alt`` becomes the SVG's accessible label."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({**_RC, "svg.hashsalt": name}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None,
                                                 "Format": None, "Type": None})
    s = buf.getvalue()
    s = re.sub(r"<\?xml[^>]*\?>\s*", "", s)
    s = re.sub(r"<!DOCTYPE[^>]*>\s*", "", s)
    s = re.sub(r"<!--.*?-->\s*", "", s, flags=re.S)
    s = re.sub(r"<metadata>.*?</metadata>\s*", "", s, flags=re.S)
    # inline in HTML5 the parser supplies the SVG namespaces: no namespace URLs in the page
    s = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", s)
    # glyph and marker ids repeat between figures: prefix every id and reference with the name
    s = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{name}-{m.group(1)}"', s)
    s = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{name}-{m.group(1)}"', s)
    s = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{name}-{m.group(1)})", s)
    # 1/100 px is finer than any screen: shorter numbers, a third of the bytes of a dense path.
    # Only numbers >= 1: scale factors (glyphs: 0.015625) must keep every digit.
    s = re.sub(r'(?<=[\s"(,])(-?[1-9]\d*\.\d{2})\d+', r"\1", s)
    s = re.sub(r" \n(?=[MLCZQ])", " ", s)
    s = s.replace("<svg ", f'<svg role="img" aria-label="{_attr(alt)}" ', 1)
    return s.strip()


def _attr(text: str) -> str:
    return (text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
            .replace(">", "&gt;"))


def _with_rc(fn):
    def wrapped(*a, **kw):
        import matplotlib

        with matplotlib.rc_context(_RC):
            return fn(*a, **kw)
    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


# ---- helpers -------------------------------------------------------------------------------------

def _nice_bin(span_s: float) -> float:
    """A round bin width (s) giving about TARGET_BINS bins."""
    raw = max(span_s / TARGET_BINS, 1e-3)
    exp = math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * 10 ** exp >= raw:
            return m * 10 ** exp
    return 10 ** (exp + 1)


def _timeline(view: TraceView):
    tr = view.trace
    tl = Timeline(max_steps=len(tr.steps) + 1, max_requests=len(tr.requests) + 1,
                  max_request_tokens=sum(len(r.token_times_ns) for r in tr.requests) + 1,
                  max_gpu_samples=len(tr.gpu_samples) + 1, max_host_samples=len(tr.host_samples) + 1,
                  max_events=len(tr.events) + 1, origin_ns=view.origin_ns)
    for s in sorted(tr.steps, key=lambda s: s.t_end_ns):
        tl.add_step(s)
    for g in sorted(tr.gpu_samples, key=lambda g: g.t_ns):
        tl.add_gpu_sample(g)
    return tl.snapshot(now_ns=view.end_ns + 1)


def _ffill(y: np.ndarray) -> np.ndarray:
    """Carry the last value over empty bins: a queue or the KV cache keeps its state between
    steps (a long step spans several bins)."""
    ok = np.isfinite(y)
    if not ok.any():
        return y
    idx = np.where(ok, np.arange(y.size), 0)
    np.maximum.accumulate(idx, out=idx)
    out = y[idx]
    out[: np.argmax(ok)] = np.nan
    return out


def _binned(x: np.ndarray, v: np.ndarray, nb: int, how: str) -> np.ndarray:
    idx = np.clip(x, 0, nb - 1)
    if how == "max":
        out = np.full(nb, np.nan)
        np.fmax.at(out, idx, v)
        return out
    s = np.bincount(idx, weights=v, minlength=nb)
    c = np.bincount(idx, minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c > 0, s / np.maximum(c, 1), np.nan)


#: Event labels above the top panel: at most this many rows; a label that fits in none is left
#: out and counted ("+N labels not shown").
LABEL_ROWS = 3
LABEL_FONT = 7.0
LABEL_ROW_PT = 9.0
CHAR_W = 0.62  # mean glyph width of DejaVu Sans, in font sizes (labels' width estimate)


def place_labels(items: Sequence[tuple[float, str]], x0: float, x1: float, width_pt: float,
                 rows: int = LABEL_ROWS, font: float = LABEL_FONT) -> list[int | None]:
    """A row (0 = lowest) for each label ``(x, text)`` (x in data units on ``[x0, x1]``, drawn
    left-aligned from x) so that no two labels of a row overlap, given the axis width in points;
    None where no row has room (the label is elided). Greedy in x order, lowest free row."""
    scale = width_pt / max(x1 - x0, 1e-12)  # points per data unit
    ends = [-math.inf] * rows
    out: list[int | None] = [None] * len(items)
    for i in sorted(range(len(items)), key=lambda k: items[k][0]):
        x, text = items[i]
        left = (x - x0) * scale
        w = (len(text) + 1) * CHAR_W * font + 3.0
        for r in range(rows):
            if left >= ends[r]:
                out[i], ends[r] = r, left + w
                break
    return out


def _events_overlay(ax: Any, view: TraceView, label: bool, ymax_frac: float = 1.0,
                    span_s: float | None = None, fig_w_in: float = 11.5) -> int:
    """A/B windows shaded, mode switches solid, knob changes dashed, other marks dotted. With
    ``label``: their names above the axes, stacked in up to ``LABEL_ROWS`` rows so that none
    overlaps (:func:`place_labels`; the rest elided and counted). Returns the rows used."""
    tf = view.t
    items: list[tuple[float, str, str]] = []  # (x s, text, colour)
    if view.ab or view.capacity:  # A/B windows, or capacity probes (named A@<rate asked>)
        for seg in view.segments:
            c = AB_COLORS.get(seg.label[:1], "#999999")
            ax.axvspan(tf(seg.t0_ns), tf(seg.t1_ns), color=c, alpha=0.10, lw=0, zorder=0)
            items.append((tf(seg.t0_ns), seg.name, c))
    knobs = [e for e in view.events if e.kind in ("knob", "mode")]
    from gpuchef.experiments.capacity import parse_capacity_mark

    def opens_probe(name: str) -> bool:  # shaded as its segment; a stop mark stays a line
        m = parse_capacity_mark(name) if view.capacity else None
        return m is not None and m[1] is not None

    marks = [e for e in view.events if e.kind == "mark" and not str(e.name).startswith("ab:")
             and not opens_probe(str(e.name))]
    for e in knobs:
        ax.axvline(tf(e.t_ns), color="#7B4EA3" if e.kind == "mode" else "#777777",
                   lw=1.0 if e.kind == "mode" else 0.7, ls="-" if e.kind == "mode" else "--",
                   zorder=1)
        if not (view.ab or view.capacity):  # the segments' names say the settings
            items.append((tf(e.t_ns), f"→ {e.new}" if e.kind == "mode"
                          else f"{setting_label(e.name)} {e.old}→{e.new}", "#555555"))
    for e in marks:
        ax.axvline(tf(e.t_ns), color="#555555", lw=0.7, ls=":", zorder=1)
        items.append((tf(e.t_ns), str(e.name), "#555555"))
    if not label or not items:
        return 0
    x0, x1 = ax.get_xlim()
    if span_s is not None:
        x0, x1 = 0.0, span_s
    # the axes take ~0.75 of the figure's width (the legends sit outside on the right)
    rows = place_labels([(x, t) for x, t, _ in items], x0, x1, 0.75 * fig_w_in * 72)
    used = 0
    for (x, text, c), r in zip(items, rows):
        if r is None or not x0 <= x <= x1:
            continue
        used = max(used, r + 1)
        ax.annotate(text, (x, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(1.5, 1.0 + r * LABEL_ROW_PT), textcoords="offset points",
                    va="bottom", ha="left", fontsize=LABEL_FONT, color=c, annotation_clip=False)
    hidden = sum(1 for r in rows if r is None)
    if hidden:
        ax.annotate(f"+{hidden} labels not shown", (1.0, 1.0), xycoords="axes fraction",
                    xytext=(0, 1.0 + LABEL_ROWS * LABEL_ROW_PT), textcoords="offset points",
                    va="bottom", ha="right", fontsize=LABEL_FONT, color="#777777")
        used = LABEL_ROWS + 1
    return used


# ---- waveforms -------------------------------------------------------------------------------------

def waveforms(view: TraceView, span_s: float | None = None,
              token_ylim: float | None = None) -> tuple[str, list[str]]:
    """:func:`waveforms_figure` as SVG: (SVG, panel titles)."""
    fig, panels = waveforms_figure(view, span_s, token_ylim)
    return to_svg(fig, f"wave-{_slug(view.name)}", f"Waveforms of {view.name}"), panels


@_with_rc
def waveforms_figure(view: TraceView, span_s: float | None = None,
                     token_ylim: float | None = None) -> tuple[Any, list[str]]:
    """The run over time, one panel each: engine busy (%), tokens per step (prefill/decode means
    stacked, the largest step, the budget), queue (running/waiting), KV cache used (%), GPU
    (SM active, tensor active, DRAM bandwidth %, power W) when sampled, and latency (each
    request's TTFT at its arrival, P99 ITL per bin). Returns (SVG, panel titles)."""
    tr = view.trace
    span = span_s or max(view.t(view.end_ns), 1e-3)
    bin_s = _nice_bin(span)
    nb = max(1, int(math.ceil(span / bin_s)))
    edges_s = np.arange(nb + 1) * bin_s
    mids = edges_s[:-1] + bin_s / 2
    snap = _timeline(view)
    t0 = view.origin_ns
    t1 = t0 + int(nb * bin_s * 1e9)
    gpu_fields = [f for f in ("sm_active", "tensor_active", "dram_bw_util")
                  if any(getattr(g, f) is not None for g in tr.gpu_samples)]
    has_power = any(g.power_w is not None for g in tr.gpu_samples)
    panels = ["Engine busy", "Tokens per step", "Queue", "KV cache", "Latency"]
    if gpu_fields or has_power:
        panels.insert(4, "GPU")
    fig = _figure(11.5, 1.45 * len(panels) + 0.5)
    axes = fig.subplots(len(panels), 1, sharex=True)
    ax_of = dict(zip(panels, axes))
    steps = sorted(tr.steps, key=lambda s: s.t_start_ns)
    n = len(steps)

    ax = ax_of["Engine busy"]
    if n:
        wf = snap.step_waveform(t0, t1, nb)
        ax.fill_between(mids, wf.busy * 100, step="mid", color="#5B8DB8", alpha=0.75, lw=0)
        ax.plot(mids, wf.busy * 100, drawstyle="steps-mid", color="#2F5F8A", lw=0.5)
    ax.set_ylim(0, 105)
    ax.set_ylabel("busy %")
    ax.set_title(f"Engine busy: model compute per {bin_s * 1e3:g} ms bin", pad=12)

    ax = ax_of["Tokens per step"]
    if n:
        ts = np.fromiter((s.t_start_ns for s in steps), np.int64, n)
        x = ((ts - t0) / 1e9 / bin_s).astype(np.int64)
        pre = np.fromiter((s.num_prefill_tokens for s in steps), np.float64, n)
        dec = np.fromiter((s.num_decode_reqs for s in steps), np.float64, n)
        budget = np.fromiter((s.max_num_batched_tokens for s in steps), np.float64, n)
        mp, md = _binned(x, pre, nb, "mean"), _binned(x, dec, nb, "mean")
        mx = _binned(x, pre + dec, nb, "max")
        bud = _ffill(_binned(x, budget, nb, "max"))
        md0, mp0 = np.nan_to_num(md), np.nan_to_num(mp)
        # log axis: the mean step (tens of tokens) and the budget (thousands) both readable
        ax.fill_between(mids, 0.5, np.maximum(md0, 0.5), step="mid", color=DECODE, alpha=0.85,
                        lw=0, label="decode (mean)")
        ax.fill_between(mids, np.maximum(md0, 0.5), np.maximum(md0 + mp0, 0.5), step="mid",
                        color=PREFILL, alpha=0.9, lw=0, label="prefill (mean, on top)")
        ax.plot(mids, mx, drawstyle="steps-mid", color="#555555", lw=0.5, alpha=0.7,
                label="largest step")
        ax.plot(mids, bud, drawstyle="steps-mid", color="#B03A2E", lw=1.0, ls="--",
                label="budget (max_num_batched_tokens)")
        ap = autopilot_series(view, span_s)  # the same bins (span, step start)
        if ap is not None:
            ax.plot(mids, ap["allowance"], drawstyle="steps-mid", color=ALLOWANCE, lw=0.9,
                    label="prefill allowance (autopilot, mean)")
        top = token_ylim or np.nanmax(np.concatenate([mx, bud])) * 1.5
        ax.set_yscale("log")
        ax.set_ylim(0.5, top if math.isfinite(top) and top > 1 else 10)
        ax.legend(**_LEGEND)
    ax.set_ylabel("tokens (log)")
    ax.set_title("Tokens per step: prefill and decode (mean per bin, stacked), largest step, "
                 "token budget" + (", the autopilot's prefill allowance"
                                   if n and autopilot_absent(view) is None else ""))

    ax = ax_of["Queue"]
    if n:
        run = np.fromiter((s.num_running for s in steps), np.float64, n)
        wait = np.fromiter((s.num_waiting for s in steps), np.float64, n)
        ax.plot(mids, _ffill(_binned(x, run, nb, "mean")), drawstyle="steps-mid",
                color="#4C72B0", lw=1.0, label="running")
        ax.plot(mids, _ffill(_binned(x, wait, nb, "mean")), drawstyle="steps-mid",
                color="#C44E52", lw=1.0, label="waiting")
        ax.legend(**_LEGEND)
        ax.set_ylim(bottom=0)
    ax.set_ylabel("requests")
    ax.set_title("Queue: running and waiting requests (mean per bin)")

    ax = ax_of["KV cache"]
    if n:
        kv = np.fromiter((s.kv_blocks_used / s.kv_blocks_total * 100 if s.kv_blocks_total else 0.0
                          for s in steps), np.float64, n)
        y = _ffill(_binned(x, kv, nb, "max"))
        ax.fill_between(mids, np.nan_to_num(y), step="mid", color="#8172B3", alpha=0.5, lw=0)
        ax.plot(mids, y, drawstyle="steps-mid", color="#5A4E8C", lw=0.7)
        top = np.nanmax(y) if np.isfinite(y).any() else 1.0
        ax.set_ylim(0, max(1.0, min(100.0, top * 1.25)))
    ax.set_ylabel("KV used %")
    ax.set_title("KV cache blocks in use (max per bin)")

    if "GPU" in ax_of:
        ax = ax_of["GPU"]
        names = {"sm_active": ("SM active", "#4C72B0"), "tensor_active": ("tensor active", "#55A868"),
                 "dram_bw_util": ("DRAM bandwidth", "#DD8452")}
        gb = max(bin_s, 0.1)  # GPM windows are >= 100 ms: finer bins only repeat values
        gn = max(1, int(math.ceil(span / gb)))
        gm = np.arange(gn) * gb + gb / 2
        for f in gpu_fields:
            _, v = snap.sample_waveform(f, t0, t0 + int(gn * gb * 1e9), gn)
            ax.plot(gm, v, color=names[f][1], lw=0.9, label=f"{names[f][0]} %")
        ax.set_ylim(0, 105)
        ax.set_ylabel("%")
        handles, labels = ax.get_legend_handles_labels()
        if has_power:
            ax2 = ax.twinx()
            _, pw = snap.sample_waveform("power_w", t0, t0 + int(gn * gb * 1e9), gn)
            ax2.plot(gm, pw, color="#888888", lw=0.8, ls="-", alpha=0.9, label="power W")
            ax2.set_ylabel("W")
            ax2.set_ylim(bottom=0)
            ax2.grid(False)
            ax2.spines["right"].set_visible(True)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels, **{**_LEGEND, "bbox_to_anchor": (1.075, 1.0)})
        ng = len({g.gpu for g in tr.gpu_samples})
        ax.set_title("GPU (NVML/GPM): SM active, tensor active, DRAM bandwidth, power"
                     + (f" — mean of {ng} GPUs (each: see Per-GPU)" if ng > 1 else ""))

    ax = ax_of["Latency"]
    reqs = [r for r in tr.requests if r.token_times_ns]
    if reqs:
        at = np.array([view.t(r.arrival_ns) for r in reqs])
        ttft = np.array([r.ttft_ms for r in reqs])
        ax.scatter(at, np.maximum(ttft, 1e-3), s=5, color="#C44E52", alpha=0.6, lw=0,
                   label="TTFT of each request (at its arrival)", rasterized=len(reqs) > 3000)
        coarse = max(bin_s, _nice_bin(span * TARGET_BINS / 60))
        cn = max(1, int(math.ceil(span / coarse)))
        gaps: list[list[float]] = [[] for _ in range(cn)]
        for r in reqs:
            t = r.token_times_ns
            for i in range(1, len(t)):
                k = int((t[i] - t0) / 1e9 / coarse)
                if 0 <= k < cn:
                    gaps[k].append((t[i] - t[i - 1]) / 1e6)
        p99 = np.array([np.percentile(g, 99) if g else np.nan for g in gaps])
        ax.plot(np.arange(cn) * coarse + coarse / 2, p99, drawstyle="steps-mid", color="#2F5F8A",
                lw=1.1, label=f"P99 ITL per {coarse:g} s")
        ax.set_yscale("log")
        ax.legend(**_LEGEND)
    ax.set_ylabel("ms")
    ax.set_title("Latency over time: TTFT per request, P99 inter-token latency")
    axes[-1].set_xlabel("time since the start of the trace (s)")
    axes[-1].set_xlim(0, span)
    for i, a in enumerate(axes):
        rows = _events_overlay(a, view, label=(i == 0), span_s=span)
        if i == 0 and rows > 1:  # room for the stacked labels under the title
            a.set_title(a.get_title(loc="left"), loc="left", pad=12 + LABEL_ROW_PT * (rows - 1))
    return fig, panels


# ---- the autopilot ---------------------------------------------------------------------------------

#: The autopilot's per-step states (``StepRecord.autopilot_state``, named and explained by
#: ``engine_host.autopilot.STATES``) and their colours.
AP_STATES = {STEERING: "#2A9D8F", LEARNING: "#E9A23B", INFEASIBLE: "#7B4FA0", FALLBACK: "#C44E52"}
ALLOWANCE = "#5B8C2A"


def ap_state_label(state: str) -> str:
    """The legend's entry for a state the autopilot did not steer in: "not steering:
    infeasible — the model predicts the decodes alone … the static budget, for TTFT"."""
    return textwrap.fill(f"not steering: {state} — {STATE_MEANING[state]}", 44)


def autopilot_absent(view: TraceView) -> str | None:
    """Why the trace has no autopilot figure (None: it has one): the autopilot off throughout,
    or on but with no chunked step (it is idle in continuous mode)."""
    steps = view.trace.steps
    if not any(s.auto_budget for s in steps):
        return ("the autopilot was off throughout (no step ran with --auto-budget): there is "
                "no allowance or predicted step time to draw")
    if not any(s.auto_budget and s.prefill_allowance >= 0 for s in steps):
        return ("the autopilot was on but chose no allowance: no chunked step ran with it "
                "(in continuous mode prompts are never split, so it is idle)")
    return None


def autopilot_series(view: TraceView, span_s: float | None = None) -> dict[str, Any] | None:
    """The autopilot's figures per time bin, from the StepRecords that ran with it
    (``auto_budget`` set, ``prefill_allowance`` ≥ 0), binned by step start as the waveforms
    are: ``t_s`` (bin middles, s), ``allowance`` (mean ``prefill_allowance``, tokens),
    ``prefill`` (mean ``num_prefill_tokens`` of the same steps), ``budget`` (the largest
    ``max_num_batched_tokens``, carried over empty bins), ``wall_ms`` / ``predicted_ms`` (mean
    actual ``wall_ms`` and mean ``predicted_ms`` of the steps with a prediction — the same
    steps for both), ``fit_error_pct`` (mean ``fit_error`` × 100 of the steps tracking it),
    ``state`` (the last step's ``autopilot_state`` per bin, "" none); and totals: ``steps``,
    ``states`` (steps per state), ``last`` (the newest such StepRecord). None when
    :func:`autopilot_absent` gives a reason."""
    if autopilot_absent(view) is not None:
        return None
    ap = sorted((s for s in view.trace.steps if s.auto_budget and s.prefill_allowance >= 0),
                key=lambda s: s.t_start_ns)
    span = span_s or max(view.t(view.end_ns), 1e-3)
    bin_s = _nice_bin(span)
    nb = max(1, int(math.ceil(span / bin_s)))
    n = len(ap)
    ts = np.fromiter((s.t_start_ns for s in ap), np.int64, n)
    x = ((ts - view.origin_ns) / 1e9 / bin_s).astype(np.int64)

    def col(f):
        return np.fromiter((getattr(s, f) for s in ap), np.float64, n)

    pred, fe = col("predicted_ms"), col("fit_error")
    hp, he = pred >= 0, fe >= 0
    wall = col("wall_ms")
    state = [""] * nb
    for i, s in zip(np.clip(x, 0, nb - 1), ap):
        state[int(i)] = s.autopilot_state
    tot = autopilot_totals(ap)
    return {
        "t_s": np.arange(nb) * bin_s + bin_s / 2, "bin_s": bin_s,
        "allowance": _binned(x, col("prefill_allowance"), nb, "mean"),
        "prefill": _binned(x, col("num_prefill_tokens"), nb, "mean"),
        "budget": _ffill(_binned(x, col("max_num_batched_tokens"), nb, "max")),
        "wall_ms": _binned(x[hp], wall[hp], nb, "mean"),
        "predicted_ms": _binned(x[hp], pred[hp], nb, "mean"),
        "fit_error_pct": _binned(x[he], fe[he] * 100.0, nb, "mean"),
        "state": state, "steps": tot.steps, "states": tot.states, "last": tot.last,
        "totals": tot,
    }


@_with_rc
def autopilot_figure(view: TraceView, span_s: float | None = None) -> Any | None:
    """Three panels over time for a trace with autopilot steps (None without): the prefill
    allowance it chose over the prefill tokens the steps carried and the static budget; the
    model's predicted vs the actual step time (ms); its fit error (%) against the thresholds
    at which it steers (≤ ERROR_ENTER) and falls back (> ERROR_LEAVE). Bins where it did not
    steer are shaded by state (learning, infeasible, fallback), the legend saying what each
    means (``STATE_MEANING``)."""
    d = autopilot_series(view, span_s)
    if d is None:
        return None
    t, bs = d["t_s"], d["bin_s"]
    fig = _figure(11.5, 5.2)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    ax1.fill_between(t, np.nan_to_num(d["prefill"]), step="mid", color=PREFILL, alpha=0.8, lw=0,
                     label="prefill tokens per step (mean)")
    ax1.plot(t, d["allowance"], drawstyle="steps-mid", color=ALLOWANCE, lw=1.2,
             label="prefill allowance (autopilot, mean)")
    ax1.plot(t, d["budget"], drawstyle="steps-mid", color="#B03A2E", lw=1.0, ls="--",
             label="budget (max_num_batched_tokens)")
    for st in NOT_STEERING:
        on = np.array([x == st for x in d["state"]])
        if on.any():
            for a in (ax1, ax2, ax3):
                a.fill_between(t, 0, 1, where=on, step="mid", color=AP_STATES[st], alpha=0.12,
                               lw=0, transform=a.get_xaxis_transform(),
                               label=ap_state_label(st) if a is ax1 else None)
    ax1.set_ylim(bottom=0)
    ax1.set_ylabel("tokens")
    ax1.set_title("Autopilot: the prefill allowance it chose per step, over the prefill the "
                  f"steps carried (mean per {bs * 1e3:g} ms bin)")
    ax1.legend(**_LEGEND)
    ax2.plot(t, d["wall_ms"], drawstyle="steps-mid", color="#555555", lw=1.0,
             label="actual step time (wall_ms)")
    ax2.plot(t, d["predicted_ms"], drawstyle="steps-mid", color=ALLOWANCE, lw=1.0, ls="--",
             label="predicted (predicted_ms)")
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel("ms")
    ax2.set_title("Step time: the model's prediction vs the actual (the same steps, mean per bin)")
    ax2.legend(**_LEGEND)
    ax3.plot(t, d["fit_error_pct"], drawstyle="steps-mid", color=INK, lw=1.0,
             label="fit error (the model's tracked mean relative error)")
    ax3.axhline(ERROR_ENTER * 100, color=AP_STATES[STEERING], lw=0.8, ls=":",
                label=f"steers at ≤ {ERROR_ENTER:.0%}")
    ax3.axhline(ERROR_LEAVE * 100, color=AP_STATES[FALLBACK], lw=0.8, ls=":",
                label=f"falls back above {ERROR_LEAVE:.0%}")
    ax3.set_ylim(0, max(60.0, float(np.nanmax(d["fit_error_pct"])) * 1.15
                        if np.isfinite(d["fit_error_pct"]).any() else 60.0))
    ax3.set_ylabel("%")
    ax3.set_title("Fit error of the step-time model")
    ax3.legend(**_LEGEND)
    ax3.set_xlabel("time since the start of the trace (s)")
    ax3.set_xlim(0, span_s or max(view.t(view.end_ns), 1e-3))
    for a in (ax1, ax2, ax3):
        _events_overlay(a, view, label=False, span_s=span_s or max(view.t(view.end_ns), 1e-3))
    return fig


def autopilot(view: TraceView, span_s: float | None = None) -> str | None:
    """:func:`autopilot_figure` as SVG (None: no autopilot steps, see :func:`autopilot_absent`)."""
    fig = autopilot_figure(view, span_s)
    if fig is None:
        return None
    return to_svg(fig, f"autopilot-{_slug(view.name)}", f"The autopilot in {view.name}")


# ---- per GPU ---------------------------------------------------------------------------------------

#: The per-GPU figure's utilisation measure, best first: (GpuSample field, what it is).
UTIL_FIELDS = (("sm_active", "SM active (GPM: share of SMs busy)"),
               ("gpu_util", "GPU-Util (NVML: any kernel running)"))


def util_field(view: TraceView) -> tuple[str, str] | None:
    """The utilisation measure the per-GPU figure plots, as (field, description): SM active when
    every GPU of the trace has it, else GPU-Util when any GPU has that (one measure for all the
    GPUs, so that they compare), else None."""
    gpus = set(gpu_indices(view))
    for f, what in UTIL_FIELDS:
        have = {g.gpu for g in view.trace.gpu_samples if getattr(g, f) is not None}
        if have == gpus or (have and f == "gpu_util"):
            return f, what
    return None


def spread(v: np.ndarray) -> np.ndarray:
    """Max − min across GPUs per bin: ``v`` (n_gpus, n_bins) → (n_bins,), NaN where fewer than
    two GPUs have a value."""
    ok = np.isfinite(v).sum(axis=0) >= 2
    return np.where(ok, np.fmax.reduce(v, axis=0) - np.fmin.reduce(v, axis=0), np.nan)


@_with_rc
def per_gpu(view: TraceView, span_s: float | None = None) -> str | None:
    """Each GPU of a multi-GPU trace over time, one line per GPU (mean per bin of >= 0.1 s, the
    GPM window): utilisation (%; SM active, or GPU-Util when GPM was off — see ``util_field``)
    with the min…max band across GPUs, the spread across GPUs per bin (max − min, percentage
    points: a rank of a tensor-parallel group that lags or idles shows as a lasting spread),
    DRAM bandwidth (% of peak) and power (W) when sampled. None when no such field was sampled."""
    tr = view.trace
    gpus = gpu_indices(view)
    names = gpu_names(view)
    means = per_gpu_means(view)
    util = util_field(view)
    extra = [(f, t, u) for f, t, u in (
        ("dram_bw_util", "DRAM bandwidth per GPU (GPM, % of peak)", "%"),
        ("power_w", "Board power per GPU (NVML)", "W"))
        if any(getattr(g, f) is not None for g in tr.gpu_samples)]
    same = len({names.get(k) for k in gpus}) == 1 and names.get(gpus[0])  # one name for all
    panels: list[tuple[str, str, str]] = []
    if util:
        panels += [(util[0], f"{util[1]} per GPU, % (band: min…max across GPUs)"
                    + (f" — {len(gpus)} × {same}" if same else ""), "%"),
                   ("spread", "Spread across GPUs: max − min of "
                    f"{util[1].split(' (')[0]} per bin", "pp")]
    panels += extra
    if not panels:
        return None
    span = span_s or max(view.t(view.end_ns), 1e-3)
    gb = max(_nice_bin(span), 0.1)  # GPM windows are >= 100 ms: finer bins only repeat values
    gn = max(1, int(math.ceil(span / gb)))
    mids = np.arange(gn) * gb + gb / 2
    t0 = view.origin_ns
    t1 = t0 + int(gn * gb * 1e9)
    snap = _timeline(view)
    ratios = [0.55 if f == "spread" else 1.0 for f, _, _ in panels]
    fig = _figure(11.5, 1.6 * sum(ratios) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(panels), 1, sharex=True,
                                      gridspec_kw={"height_ratios": ratios}))
    series: dict[str, np.ndarray] = {}
    for ax, (f, title, unit) in zip(axes, panels):
        if f == "spread":
            sp = spread(series[util[0]])
            ax.fill_between(mids, np.nan_to_num(sp), step="mid", color="#C44E52", alpha=0.35, lw=0)
            ax.plot(mids, sp, drawstyle="steps-mid", color="#9B2D30", lw=0.8)
            have = np.flatnonzero(np.isfinite(sp))
            if have.size:  # the mean, drawn over the bins it is taken over
                ax.hlines(float(np.nanmean(sp)), mids[have[0]] - gb / 2, mids[have[-1]] + gb / 2,
                          color="#9B2D30", lw=0.8, ls="--", label=f"mean {np.nanmean(sp):.1f} pp")
                ax.legend(**_LEGEND)
            ax.set_ylim(bottom=0)
        else:
            v = np.vstack([snap.sample_waveform(f, t0, t1, gn, gpu=k)[1] for k in gpus])
            series[f] = v
            if f == (util[0] if util else None) and len(gpus) > 1:
                lo, hi = np.fmin.reduce(v, axis=0), np.fmax.reduce(v, axis=0)
                ax.fill_between(mids, lo, hi, step="mid", color="#999999", alpha=0.2, lw=0,
                                label="min…max")
            for i, k in enumerate(gpus):
                m = means[k][f]
                lab = f"GPU {k}" + (f" · {names[k]}" if names.get(k) and not same else "")
                lab += f" (mean {m:.0f} {unit})" if math.isfinite(m) else " (not sampled)"
                ax.plot(mids, v[i], drawstyle="steps-mid", color=PALETTE[i % len(PALETTE)],
                        lw=1.0, label=lab)
            if unit == "%":
                ax.set_ylim(0, 105)
            else:
                ax.set_ylim(bottom=0)
            ax.legend(**_LEGEND)
        ax.set_ylabel(unit)
        ax.set_title(title, pad=12 if ax is axes[0] else None)
    axes[-1].set_xlabel("time since the start of the trace (s)")
    axes[-1].set_xlim(0, span)
    for i, a in enumerate(axes):
        rows = _events_overlay(a, view, label=(i == 0), span_s=span)
        if i == 0 and rows > 1:
            a.set_title(a.get_title(loc="left"), loc="left", pad=12 + LABEL_ROW_PT * (rows - 1))
    return to_svg(fig, f"gpus-{_slug(view.name)}", f"Per-GPU utilisation of {view.name}")


def _log_x(ax: Any) -> None:
    """A log x axis labelled 1, 2, 5, 10, 20, 50, … in plain numbers (no 2×10¹ crowding)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "x"


# ---- step close-ups -------------------------------------------------------------------------------

def closeup_window(steps: Sequence[Any], width_ns: int) -> tuple[int, int]:
    """The ``width_ns`` stretch with the most prefill tokens (ties: the earliest): where the
    difference between the modes shows. Returns (t0_ns, t1_ns)."""
    if not steps:
        return 0, width_ns
    st = sorted(steps, key=lambda s: s.t_start_ns)
    best, best_t, j, acc = -1, st[0].t_start_ns, 0, 0
    for i, s in enumerate(st):
        acc += s.num_prefill_tokens
        while st[j].t_start_ns < s.t_start_ns - width_ns:
            acc -= st[j].num_prefill_tokens
            j += 1
        if acc > best:
            best, best_t = acc, st[j].t_start_ns
    return best_t, best_t + width_ns


def closeup_steps(steps: Sequence[Any], a: int, b: int) -> list[Any]:
    """The steps that overlap ``[a, b)`` (ns), by start: a long prefill step that began before
    the stretch is in it (it was drawn as idle time when only starts in the stretch counted)."""
    return sorted((s for s in steps if s.t_start_ns < b and s.t_end_ns > a),
                  key=lambda s: s.t_start_ns)


def closeup_stats(steps: Sequence[Any], a: int, b: int) -> tuple[int, float]:
    """(steps overlapping ``[a, b)``, share of the stretch the model computed): each step's
    ``gpu_ms`` counted for the part of its wall time inside the stretch."""
    sel = closeup_steps(steps, a, b)
    busy_ms = sum(s.gpu_ms * max(0, min(s.t_end_ns, b) - max(s.t_start_ns, a))
                  / max(1, s.t_end_ns - s.t_start_ns) for s in sel)
    return len(sel), busy_ms / max(1e-9, (b - a) / 1e6)


@_with_rc
def closeups(groups: Sequence[Group], aligned: bool = False) -> str:
    """Each group's busiest stretch (most prefill tokens) drawn step by step: a bar per step
    spanning its wall time, as high as its tokens (log axis), coloured by kind (decode only,
    mixed, prefill only), the budget dashed, and on the right axis the requests decoding in each
    step — under continuous batching it drops to zero during a prefill: the decodes stall.
    White gaps are time the engine was not stepping. ``aligned``: the groups replayed the same
    load (one trace each): show all at the first group's stretch, at the same time since each
    trace's start, so that they serve the same arrivals."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    walls = [np.median([s.t_end_ns - s.t_start_ns for s in g.steps]) for g in groups if g.steps]
    width = int(min(5e9, max(0.25e9, 100 * max(walls)))) if walls else int(1e9)
    fig = _figure(11.5, 2.0 * len(groups) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(groups), 1, sharey=True))
    picks = []
    offset = None
    for g in groups:
        if aligned and offset is not None:
            a = g.view.origin_ns + offset
            b = a + width
        else:
            a, b = closeup_window(g.steps, width)
            offset = a - g.view.origin_ns
        picks.append((a, b, closeup_steps(g.steps, a, b)))
    dmax = max([s.num_decode_reqs for _, _, sel in picks for s in sel] or [1])
    tmax = max([s.num_tokens for _, _, sel in picks for s in sel] +
               [s.max_num_batched_tokens for _, _, sel in picks for s in sel] or [10])
    colors = {"decode only": DECODE, "mixed": MIXED, "prefill only": PREFILL}
    for ax, g, (a, b, sel) in zip(axes, groups, picks):
        ax2 = ax.twinx()
        if sel:
            x = np.array([(s.t_start_ns - a) / 1e6 for s in sel])
            w = np.array([(s.t_end_ns - s.t_start_ns) / 1e6 for s in sel])
            ax.bar(x, [max(s.num_tokens, 1) for s in sel], width=w, align="edge", lw=0,
                   color=[colors[_kind(s)] for s in sel])
            ends = x + w
            ax.step([0, *ends], [sel[0].max_num_batched_tokens,
                                 *[s.max_num_batched_tokens for s in sel]],
                    where="pre", color="#B03A2E", ls="--", lw=0.9)
            ax2.step([*x, ends[-1]], [*[s.num_decode_reqs for s in sel], sel[-1].num_decode_reqs],
                     where="post", color="#1F3B57", lw=1.1)
            n, share = closeup_stats(sel, a, b)
            ax.text(0.995, 0.97, f"{n} steps; model compute {share:.0%} of the stretch",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#555555")
        ax.set_yscale("log")
        ax.set_ylim(0.8, tmax * 3)
        ax.set_xlim(0, width / 1e6)
        ax.set_ylabel("tokens (log)")
        ax2.set_ylim(0, dmax * 1.25 + 1)
        ax2.set_ylabel("decoding")
        ax2.grid(False)
        ax2.spines["right"].set_visible(True)
        ax.set_title(f"{g.label} — t = {g.view.t(a):.2f} s … {g.view.t(b):.2f} s",
                     color=g.color)
    axes[-1].set_xlabel("ms into the stretch (bar width = the step's wall time)")
    handles = [Patch(color=DECODE, label="decode-only step"), Patch(color=MIXED, label="mixed step"),
               Patch(color=PREFILL, label="prefill-only step"),
               Line2D([], [], color="#B03A2E", ls="--", label="token budget"),
               Line2D([], [], color="#1F3B57", label="requests decoding in the step (right axis)")]
    fig.legend(handles=handles, loc="outside upper center", ncol=5)
    return to_svg(fig, "closeups", "Step-by-step close-up of each group's busiest stretch")


# ---- batch composition -----------------------------------------------------------------------------

def composition(steps: Sequence[Any]) -> dict[str, tuple[int, float, float]]:
    """Steps by kind — "decode only", "prefill only", "mixed" — as (count, share of steps,
    share of compute time) each."""
    kinds = {"decode only": [0, 0.0], "prefill only": [0, 0.0], "mixed": [0, 0.0]}
    for s in steps:
        k = _kind(s)
        kinds[k][0] += 1
        kinds[k][1] += s.gpu_ms
    n = sum(v[0] for v in kinds.values()) or 1
    t = sum(v[1] for v in kinds.values()) or 1.0
    return {k: (v[0], v[0] / n, v[1] / t) for k, v in kinds.items()}


_KIND_LABEL = {"prefill_only": "prefill only", "mixed": "mixed", "decode_only": "decode only"}


def _kind(s: Any) -> str:
    return _KIND_LABEL[s.kind]  # StepRecord.kind, in the report's words


@_with_rc
def composition_hist(groups: Sequence[Group]) -> str:
    """Histogram of tokens per step (log bins), stacked by step kind, one panel per group."""
    tot = [s.num_prefill_tokens + s.num_decode_reqs for g in groups for s in g.steps]
    top = max(tot) if tot else 2
    bins = np.unique(np.round(np.logspace(0, math.log10(max(2, top)) + 1e-9, 28)).astype(int))
    bins = np.append(bins, bins[-1] + 1)
    cols = min(len(groups), 3)
    rows = math.ceil(len(groups) / cols)
    fig = _figure(11.5, 2.6 * rows + 0.3)
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True)).ravel()
    for ax, g in zip(axes, groups):
        data = {k: [s.num_prefill_tokens + s.num_decode_reqs for s in g.steps if _kind(s) == k]
                for k in ("decode only", "mixed", "prefill only")}
        ax.hist([data["decode only"], data["mixed"], data["prefill only"]], bins=bins,
                stacked=True, color=[DECODE, MIXED, PREFILL], label=list(data), lw=0)
        _log_x(ax)
        ax.set_title(g.label, color=g.color)
        ax.set_xlabel("tokens in the step")
        comp = composition(g.steps)
        ax.text(0.98, 0.95, "\n".join(f"{k}: {c[1]:.1%} of steps" for k, c in comp.items()),
                transform=ax.transAxes, ha="right", va="top", fontsize=7.5, color="#444444")
        ax.set_yscale("log")
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    axes[0].set_ylabel("steps (log)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncol=3)
    return to_svg(fig, "composition", "Batch composition histogram per group")


# ---- latency CDFs -------------------------------------------------------------------------------

def _cdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(np.asarray([x for x in values if x is not None and math.isfinite(x)], float))
    if v.size == 0:
        return v, v
    # plotting positions (i − 0.5)/n stay inside (0, 1), as the logit axis needs
    if v.size > CDF_POINTS:  # quantile-sample: same curve, bounded size
        q = np.concatenate([np.linspace(0.5 / v.size, 0.9, CDF_POINTS // 2),
                            1 - np.geomspace(0.1, 0.5 / v.size, CDF_POINTS // 2)])
        return np.quantile(v, q), q
    return v, (np.arange(1, v.size + 1) - 0.5) / v.size


def latency_values(g: Group) -> dict[str, list[float]]:
    """TTFT and TPOT per completed request, ITL pooled (ms): vllm bench serve's definitions."""
    out: dict[str, list[float]] = {"TTFT": [], "ITL": [], "TPOT": []}
    for r in g.requests:
        if not is_completed(r.finish_reason) or not r.token_times_ns:
            continue
        if is_probe_id(r.request_id):
            continue
        out["TTFT"].append(r.ttft_ms)
        if r.output_len > 1:
            out["TPOT"].append((r.e2el_ms - r.ttft_ms) / (r.output_len - 1))
        out["ITL"].extend(r.itls_ms)
    return out


def latency_cdfs(groups: Sequence[Group]) -> str:
    """:func:`latency_figure` as SVG."""
    return to_svg(latency_figure(groups), "cdfs", "Latency CDFs per group")


#: Log-axis label sets, densest first: (subs, decade stride).
_LOG_TICKS = (((1.0, 2.0, 3.0, 5.0, 7.0), 1), ((1.0, 2.0, 5.0), 1), ((1.0, 3.0), 1),
              ((1.0,), 1), ((1.0,), 2), ((1.0,), 3), ((1.0,), 5))


def log_ticks(lo: float, hi: float, width_pt: float, font: float = 8.0
              ) -> tuple[tuple[float, ...], int]:
    """The densest (subs, decade stride) of ``_LOG_TICKS`` whose labels ("{:g}" of each tick in
    ``[lo, hi]``) fit side by side on a log axis ``width_pt`` points wide, 4 pt apart."""
    lo, hi = max(lo, 1e-12), max(hi, lo * 1.0001)
    span = math.log10(hi / lo)
    for subs, stride in _LOG_TICKS:
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1,
                                              math.ceil(math.log10(hi)) + 1)
                 if e % stride == 0 for m in subs]
        ticks = [t for t in ticks if lo <= t <= hi]
        pos = [math.log10(t / lo) / span * width_pt for t in ticks]
        half = [len(f"{t:g}") * CHAR_W * font / 2 for t in ticks]
        if all(pos[i + 1] - pos[i] >= half[i] + half[i + 1] + 4.0 for i in range(len(pos) - 1)):
            return subs, stride
    return _LOG_TICKS[-1]


@_with_rc
def latency_figure(groups: Sequence[Group]) -> Any:
    """Cumulative distributions of TTFT, ITL and TPOT (ms, log axis), one line per group, with
    the P99 marked; x labels thinned so that none overlaps (:func:`log_ticks`)."""
    from matplotlib.ticker import LogLocator, NullFormatter

    fig = _figure(11.5, 3.4)
    axes = fig.subplots(1, 3, sharey=True)
    vals = [latency_values(g) for g in groups]
    for ax, metric in zip(axes, ("TTFT", "ITL", "TPOT")):
        for g, v in zip(groups, vals):
            x, y = _cdf(v[metric])
            if not x.size:
                continue
            x = np.maximum(x, 1e-3)
            ax.plot(x, y, color=g.color, lw=1.4, label=g.label)
            p99 = float(np.percentile(v[metric], 99))
            ax.plot([max(p99, 1e-3)], [0.99], "o", color=g.color, ms=4)
        ax.axhline(0.99, color="#999999", lw=0.6, ls=":")
        _log_x(ax)
        ax.set_yscale("logit")
        ax.set_yticks([0.01, 0.1, 0.5, 0.9, 0.99, 0.999])
        ax.set_yticklabels(["1%", "10%", "50%", "90%", "99%", "99.9%"])
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{metric} (ms)")
        ax.set_title(metric + {"TTFT": ": time to first token", "ITL": ": gap between output "
                               "chunks", "TPOT": ": per request, excl. the 1st"}[metric])
        ax.set_ylim(0.005, 0.9995)
        lo, hi = ax.get_xlim()
        # a third of the figure, less the y labels: ~3 in of axis each
        subs, stride = log_ticks(lo, hi, 11.5 * 72 / 3 - 40)
        ax.xaxis.set_major_locator(LogLocator(base=10.0 ** stride, subs=subs))
    axes[0].set_ylabel("share ≤ x (logit axis)")
    axes[0].legend(loc="lower right")
    return fig


# ---- A/B windows ----------------------------------------------------------------------------------

@_with_rc
def ab_windows_plot(view: TraceView, percentile: float = 99.0) -> str:
    """Per-window P-x TTFT and ITL and output throughput of an A/B trace, coloured by setting:
    the run-to-run spread the A/B verdict is judged against."""
    from gpuchef.probes.ab import pool

    fig = _figure(11.5, 2.6)
    axes = fig.subplots(1, 3)
    for seg in view.segments:
        if seg.result is None or not seg.result.requests:
            continue
        m, _ = pool([seg.result], (percentile,))  # probes.ab: the figures the tables show
        x = view.t(seg.t0_ns)
        c = AB_COLORS.get(seg.label[:1], INK)
        for ax, v in zip(axes, (m.percentiles_ttft_ms[0][1], m.percentiles_itl_ms[0][1],
                                m.output_throughput)):
            ax.plot([x], [v], "o", color=c, ms=5)
            ax.annotate(seg.name, (x, v), xytext=(3, 3), textcoords="offset points", fontsize=6.5,
                        color=c)
    p = f"P{percentile:g}"
    for ax, t in zip(axes, (f"{p} TTFT per window (ms)", f"{p} ITL per window (ms)",
                            "Output tokens/s per window")):
        ax.set_title(t)
        ax.set_xlabel("window start (s)")
        ax.set_ylim(bottom=0)
    return to_svg(fig, f"abwin-{_slug(view.name)}", f"A/B windows of {view.name}")
