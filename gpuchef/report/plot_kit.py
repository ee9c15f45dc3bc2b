"""What every figure of the report shares: matplotlib ``Figure`` objects (no pyplot, no GUI
backend) in one rc style, turned into inline SVG text by :func:`to_svg` (no XML prolog, no RDF
metadata, ids salted per figure so that several SVGs can live in one HTML document); the
colours; binning steps into time bins (dense artists — thousands of step bars or points — are
kept few by binning, so the page stays small); the event overlay (A/B windows, knob and mode
changes, marks) every time axis carries."""

from __future__ import annotations

import io
import math
import re
from typing import Any, Sequence

import numpy as np

from gpuchef.engine_host.vocab.config import setting_label
from gpuchef.probes.timeline import Timeline

from .data import AB_COLORS, TraceView


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


def _log_x(ax: Any) -> None:
    """A log x axis labelled 1, 2, 5, 10, 20, 50, … in plain numbers (no 2×10¹ crowding)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "x"
