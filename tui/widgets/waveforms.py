"""Waveform panels on the shared time axis: GPU saturation, DRAM bandwidth and power, the step
waveform, batch composition (with the autopilot's prefill allowance), the autopilot's predicted
vs actual step time, and the time axis with the change markers.

Each panel is a Line-API widget: ``set_frame(WaveFrame)`` rebuilds its rows once (numpy → Strips)
and ``render_line`` hands them to Textual; nothing is recomputed when Textual repaints. Row 0 is
the title: what is drawn, its legend (what each colour is), its unit and where the numbers come
from, and at its right end the window of the readouts under it, if they are over one.

One rule fits every title row to its width (:meth:`ChartPanel.title_variants`): parts show whole
or not at all, and when the row is too narrow they give way in this order — the source, then the
unit for its short form (``UNIT_SHORT``), then the unit, then each legend entry for its short
name (a third element of the entry). The title, the legend and the readout window stay; only a
row too narrow for even their short forms is cut, with "…".
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from gpuchef.engine_host.autopilot import FALLBACK, INFEASIBLE, STEERING
from gpuchef.probes.nvml.fields import BY_NAME

from .. import theme
from ..chart import GUTTER_L, GUTTER_R, Cells, fmt_num, last_value, style, text_strip
from ..plotdata import WaveFrame, nice_max

BG = theme.PANEL_BG
LBL = style(theme.LABEL, BG)
VAL = style(theme.TITLE, BG, bold=True)


def _gutter(rows: int, top: str = "", bottom: str = "", mid: dict[int, str] | None = None
            ) -> list[tuple[str, Style]]:
    out = [("", LBL)] * rows
    if rows:
        out = list(out)
        if top:
            out[0] = (top, LBL)
        if bottom and rows > 1:
            out[-1] = (bottom, LBL)
        for r, t in (mid or {}).items():
            if 0 <= r < rows:
                out[r] = (t, LBL)
    return out


def _right(rows: int, items: Sequence[tuple[str, str]]) -> list[tuple[str, Style]]:
    out: list[tuple[str, Style]] = [("", LBL)] * rows
    out = list(out)
    for r, (text, colour) in enumerate(items[:rows]):
        out[r] = (text, style(colour, BG, bold=True))
    return out


#: Fewest waveform columns a panel draws; below it a panel shows :func:`too_small`'s line.
MIN_COLS = 4


def fit_title(variants: Sequence[list[tuple[str, Style]]], width: int, right: str = "") -> Strip:
    """The first of ``variants`` (title row parts, longest first) that fits ``width`` cells
    with ``right`` at the row's right end (two blanks before it); when none does, the last
    one cut with "…" before ``right``."""
    tail = [(f"  {right}", LBL)] if right else []
    rlen = cell_len(tail[0][0]) if tail else 0
    for parts in variants:
        used = sum(cell_len(t) for t, _ in parts)
        if used + rlen <= width:
            pad = [(" " * (width - used - rlen), LBL)] if width - used - rlen else []
            return text_strip(list(parts) + pad + tail, width, BG)
    parts = list(variants[-1]) if variants else []
    room = max(0, width - rlen)
    strip = text_strip(parts, room, BG)
    if room:
        strip = Strip(list(strip.crop(0, room - 1)) + [Segment("…", LBL)], room)
    return Strip(list(strip) + [Segment(t, st) for t, st in tail], width)


def too_small(w: int, h: int) -> list[Strip]:
    """A panel too narrow to draw: one line saying so (cropped to ``w``), then blank rows."""
    line = text_strip([("too small", style(theme.AXIS, BG))], w, BG)
    return [line] + [Strip.blank(w, style(bg=BG)) for _ in range(h - 1)]


class ChartPanel(Widget):
    """Base of the waveform panels: a title row, then ``draw()``'s rows."""

    DEFAULT_CSS = """
    ChartPanel { height: 7; background: #11151c; }
    """
    TITLE = ""
    UNIT = ""
    #: the unit's short form, for a title row too narrow for ``UNIT`` ("" = none)
    UNIT_SHORT = ""
    SOURCE = ""
    #: (name, colour) or (name, colour, short name) per colour drawn
    LEGEND: tuple[tuple[str, ...], ...] = ()

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._frame: WaveFrame | None = None
        self._strips: list[Strip] = []
        self._built_for: tuple[int, int] = (0, 0)
        self._title_key: tuple | None = None  # what the title row was last built from

    # -- data ----------------------------------------------------------------------------------
    def set_frame(self, frame: WaveFrame) -> None:
        self._frame = frame
        self._rebuild()

    def _rebuild(self) -> None:
        w, h = self.size.width, self.size.height
        if w <= 0 or h <= 0:
            return
        if w - GUTTER_L - GUTTER_R < MIN_COLS:  # no room for the gutters and a waveform
            self._publish(too_small(w, h), w, h)
            return
        rows = [self.title_strip(w)]
        if h > 1:
            body = self.draw(self._frame, w - GUTTER_L - GUTTER_R, h - 1) if self._frame else []
            rows.extend(body)
        self._publish(rows, w, h)

    def _publish(self, rows: list[Strip], w: int, h: int) -> None:
        """Show ``rows``; repaint only the lines that differ from the ones shown (Textual
        re-renders and composites a refreshed widget line by line: a title, an idle series or an
        empty top row need not be redone each frame)."""
        old, self._strips = self._strips, rows
        if self._built_for != (w, h) or len(old) != len(rows):
            self._built_for = (w, h)
            self.refresh()
            return
        regions = []
        y0 = None
        for y, (a, b) in enumerate(zip(old, rows)):
            same = a is b or a == b
            if not same and y0 is None:
                y0 = y
            elif same and y0 is not None:
                regions.append(Region(0, y0, w, y - y0))
                y0 = None
        if y0 is not None:
            regions.append(Region(0, y0, w, len(rows) - y0))
        if regions:
            self.refresh(*regions)

    def on_resize(self) -> None:
        self._rebuild()

    def render_line(self, y: int) -> Strip:
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.size.width, style(bg=BG))

    # -- drawing -------------------------------------------------------------------------------
    def title_parts(self, *, unit: str | None = None, source: bool = True,
                    short_legend: bool = False) -> list[tuple[str, Style]]:
        """The title row's parts: ``unit`` instead of ``UNIT`` ("" = none), the source or not,
        the legend's short names or not."""
        parts = [(" ▍", style(theme.AXIS, BG)), (self.TITLE, style(theme.TITLE, BG, bold=True))]
        u = self.UNIT if unit is None else unit
        if u:
            parts.append((f"  {u}", style(theme.LABEL, BG)))
        if self.SOURCE and source:
            parts.append((f"  · {self.SOURCE}", style(theme.AXIS, BG)))
        for entry in self.LEGEND:
            text = entry[2] if short_legend and len(entry) > 2 else entry[0]
            parts.append(("   ■ ", style(entry[1], BG)))
            parts.append((text, style(theme.LABEL, BG)))
        return parts

    def title_variants(self) -> list[list[tuple[str, Style]]]:
        """The title row's forms, longest first: the module docstring's rule."""
        out = [self.title_parts()]
        if self.SOURCE:
            out.append(self.title_parts(source=False))
        if self.UNIT_SHORT and self.UNIT:
            out.append(self.title_parts(unit=self.UNIT_SHORT, source=False))
        if self.UNIT:
            out.append(self.title_parts(unit="", source=False))
        if any(len(e) > 2 for e in self.LEGEND):
            out.append(self.title_parts(unit="", source=False, short_legend=True))
        return out

    def title_right(self) -> str:
        """Text at the right end of the title row, over the readouts ("" = none)."""
        return ""

    def title_strip(self, width: int) -> Strip:
        right = self.title_right()
        key = (width, self.UNIT, self.SOURCE, self.LEGEND, right)  # titles change with these
        if self._title_key != key:
            self._title_key, self._title = key, fit_title(self.title_variants(), width, right)
        return self._title

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:  # pragma: no cover
        raise NotImplementedError

    @staticmethod
    def fit(a: np.ndarray, cols: int) -> np.ndarray:
        """``a`` cropped (oldest dropped) or left-padded with NaN to ``cols`` (a resize between
        the frame and the draw)."""
        a = np.asarray(a, float)
        if len(a) >= cols:
            return a[len(a) - cols:]
        return np.concatenate([np.full(cols - len(a), np.nan), a])

    def marker_cols(self, f: WaveFrame, cols: int) -> list[int]:
        shift = cols - f.grid.cols
        return [m.col + shift for m in f.markers]


class StepPanel(ChartPanel):
    """Share of each time slice the engine spent computing, by the kind of step: the bursts and
    gaps of continuous batching against the steady mixed batches of chunked prefill."""

    TITLE = "Step waveform"
    UNIT = "engine busy, % of each slice"
    UNIT_SHORT = "busy % per slice"
    SOURCE = "StepRecord spans, gpu_ms"
    LEGEND = (("prefill-only", theme.PREFILL, "prefill"), ("mixed", theme.MIXED),
              ("decode-only step", theme.DECODE, "decode"))
    #: the readouts (busy, steps/s) are over about this long of the newest complete columns
    READOUT_S = 2.0

    @classmethod
    def readout_cols(cls, f: WaveFrame) -> int:
        """Columns the readouts are over: the newest complete ones spanning ~READOUT_S (one
        at least; the partial last column is too young to read)."""
        return max(1, min(len(f.busy) - 1, int(round(cls.READOUT_S / max(f.grid.bin_s, 1e-9)))))

    def title_right(self) -> str:
        """The readouts' window, over them: "last 1.9 s" (whole columns, so not always 2 s)."""
        f = self._frame
        if f is None or not len(f.busy):
            return ""
        return f"last {fmt_span(self.readout_cols(f) * f.grid.bin_s)}"

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:
        c = Cells(h, cols, [])
        layers = [self.fit(f.busy_prefill, cols) * h, self.fit(f.busy_mixed, cols) * h,
                  self.fit(f.busy_decode, cols) * h]
        c.stacked(layers, [theme.PREFILL, theme.MIXED, theme.DECODE])
        c.markers(self.marker_cols(f, cols))
        # over the last ~2 s of complete columns (the title row says how long exactly)
        k = self.readout_cols(f)
        done = slice(-k - 1, -1) if len(f.busy) > 1 else slice(None)
        busy = float(np.mean(f.busy[done])) * 100
        steps_s = float(np.nansum(f.steps[done])) / max(1e-9, k * f.grid.bin_s)
        right = _right(h, [("busy", theme.LABEL), (f"{busy:.0f}%", theme.TITLE),
                           ("steps/s", theme.LABEL), (fmt_num(steps_s), theme.TITLE)])
        return c.strips(_gutter(h, "100%", "0%", {h // 2: " 50%"} if h >= 5 else None),
                        right, BG)


class BatchPanel(ChartPanel):
    """Tokens per step, prefill stacked under decode, against the token budget. A step above
    the budget is marked ▲ in the top row, and the row says why (in its longest free stretch):
    continuous batching runs a prompt longer than the budget alone, whole (it never splits
    prompts), by design."""

    TITLE = "Batch composition"
    UNIT = "tokens of the largest step in each slice"
    UNIT_SHORT = "tokens per step"
    SOURCE = "StepRecord"
    LEGEND = (("prefill", theme.PREFILL), ("decode", theme.DECODE),
              ("╌ token budget", theme.BUDGET, "╌ budget"))
    #: title and legend while the window holds autopilot steps: their prefill allowance is
    #: drawn too (the unit shorter, the source left out, so that the legend fits)
    UNIT_AUTO = "tokens per step"
    #: the title parts set before the autopilot legend took over (None: not taken over)
    _plain: tuple | None = None
    LEGEND_AUTO = LEGEND + (("━ autopilot allowance", theme.ALLOWANCE, "━ allowance"),)
    BUDGET = True  # its readout; False where the records hold no budget (vLLM's plugin)
    OVER_NOTES = ("▲ above the budget line: a prompt longer than the budget runs alone, whole",
                  "▲ above budget: a long prompt runs alone", "▲ > budget")

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:
        pre, dec = self.fit(f.prefill_per_step, cols), self.fit(f.decode_per_step, cols)
        budget = self.fit(f.budget, cols)
        # carry the budget line through idle columns so that it reads as a line
        known = np.isfinite(budget)
        if known.any():
            idx = np.where(known, np.arange(cols), -1)
            np.maximum.accumulate(idx, out=idx)
            budget = np.where(idx >= 0, budget[np.maximum(idx, 0)], np.nan)
        tot = np.nan_to_num(pre) + np.nan_to_num(dec)
        top = nice_max(max(float(np.nanmax(budget)) if known.any() else 0.0,
                           float(tot.max()) if len(tot) else 0.0), 8)
        allow = self.fit(f.allowance, cols) if f.allowance is not None else np.full(cols, np.nan)
        auto = bool(np.isfinite(allow).any())
        if auto != (self._plain is not None):  # the title over to it / back
            if auto:
                self._plain = (self.UNIT, self.SOURCE, self.LEGEND)  # as set (the A/B screen's)
                self.UNIT, self.SOURCE, self.LEGEND = self.UNIT_AUTO, "", self.LEGEND_AUTO
            else:
                self.UNIT, self.SOURCE, self.LEGEND = self._plain
                self._plain = None
        c = Cells(h, cols, [])
        c.stacked([pre / top * h, dec / top * h], [theme.PREFILL, theme.DECODE])
        # the allowance sits on the prefill it allowed (the decodes are stacked above it);
        # drawn before the budget so that the budget line keeps cells where both fall
        c.hline(allow / top * h, theme.ALLOWANCE, char="━", over=True)
        c.hline(budget / top * h, theme.BUDGET)
        over = np.nonzero(np.isfinite(budget) & (tot > budget))[0]
        if len(over):
            c.chars[0, over] = "▲"
            c.fg[0, over] = c.colour(theme.PREEMPTED)
            _note(c, 0, self.OVER_NOTES, theme.PREEMPTED)
        c.markers(self.marker_cols(f, cols))
        lt = f.latest  # the newest step, not the last columns' (a long step in flight: "–")
        p = lt.prefill if lt else float("nan")
        d = lt.decode if lt else float("nan")
        b = last_value(budget, cols)
        items = [("prefill", theme.PREFILL), (fmt_num(p), theme.PREFILL),
                 ("decode", theme.DECODE), (fmt_num(d), theme.DECODE),
                 ("budget", theme.BUDGET), (fmt_num(b), theme.BUDGET)][:6 if self.BUDGET else 4]
        ap = f.autopilot
        if auto and ap is not None and ap.allowance >= 0:  # the newest step's allowance
            items[4:4] = [("allow", theme.ALLOWANCE), (fmt_num(ap.allowance), theme.ALLOWANCE)]
        right = _right(h, items)
        return c.strips(_gutter(h, fmt_num(top), "0", {h // 2: fmt_num(top / 2)} if h >= 5
                                else None), right, BG)


class StepTimePanel(ChartPanel):
    """The autopilot's step-time model against the engine: each slice's actual step time
    (``StepRecord.wall_ms``, mean of the steps ending there, bars) under the model's prediction
    for the same steps (``predicted_ms``, ━) and its ITL target (╌), and in the title the
    controller's status from the newest step (``autopilot_state``, ``fit_error``: the model's
    tracked mean relative error, the number its fallback rule uses)."""

    TITLE = "Autopilot step time"
    UNIT = "ms: actual (bars), predicted ━, ITL target ╌"
    UNIT_SHORT = "ms: bars actual, ━ predicted"
    SOURCE = "StepRecord wall_ms, predicted_ms"

    def title_parts(self, **kw) -> list[tuple[str, Style]]:
        parts = super().title_parts(**kw)
        ap = self._frame.autopilot if self._frame is not None else None
        if ap is not None:  # the status first: on a narrow panel the unit and source give way
            colour = {STEERING: theme.DECODE, FALLBACK: theme.PREEMPTED,
                      INFEASIBLE: theme.PREEMPTED}.get(ap.state, theme.WAITING)
            parts[2:2] = [(": ", LBL), (ap.line(), style(colour, BG, bold=True))]
        return parts

    def title_strip(self, width: int) -> Strip:
        ap = self._frame.autopilot if self._frame is not None else None
        key = (width, ap.line() if ap else "")
        if self._title_key != key:
            self._title_key, self._title = key, fit_title(self.title_variants(), width)
        return self._title

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:
        act = self.fit(f.step_ms, cols) if f.step_ms is not None else np.full(cols, np.nan)
        pred = (self.fit(f.predicted_ms, cols) if f.predicted_ms is not None
                else np.full(cols, np.nan))
        hp = np.isfinite(pred)
        # the scale is the predicted steps' (a step before the model, e.g. a whole prompt in
        # continuous mode, is drawn clipped rather than flattening the comparison)
        vals = np.concatenate([act[np.isfinite(act) & hp] if hp.any() else act[np.isfinite(act)],
                               pred[hp]])
        vmax = float(vals.max()) if len(vals) else 0.0
        ap = f.autopilot
        target = ap.itl_target_ms if ap else float("nan")
        if target == target and target <= 3 * vmax:  # in scale unless it would squash the data
            vmax = max(vmax, target)
        top = nice_max(vmax, 1)
        c = Cells(h, cols, [])
        c.stacked([np.nan_to_num(act) / top * h], [theme.STEP_ACTUAL])
        c.hline(pred / top * h, theme.ALLOWANCE, char="━", over=True)
        if target == target and target <= top:
            c.hline(np.full(cols, target / top * h), theme.BUDGET)
        if not hp.any():
            msg = "no prediction yet (the model predicts from its 24th step)"[:cols]
            c.chars[0, :len(msg)] = list(msg)
            c.fg[0, :len(msg)] = c.colour(theme.AXIS)
        c.markers(self.marker_cols(f, cols))
        a = ap.wall_ms if ap else float("nan")
        pr = ap.predicted_ms if ap and ap.predicted_ms >= 0 else float("nan")
        # the newest step's (the fit error is in the title)
        right = _right(h, [("pred", theme.ALLOWANCE), (fmt_num(pr, "ms"), theme.ALLOWANCE),
                           ("actual", theme.STEP_ACTUAL), (fmt_num(a, "ms"), theme.STEP_ACTUAL)])
        return c.strips(_gutter(h, fmt_num(top), "0", {h // 2: fmt_num(top / 2)} if h >= 5
                                else None), right, BG)


def _note(c: Cells, row: int, texts: Sequence[str], colour: str) -> None:
    """Write the longest of ``texts`` that fits into the longest run of empty cells of ``row``
    (a blank kept on each side); nothing if none fits."""
    empty = np.concatenate([[False], c.chars[row] == " ", [False]])
    edges = np.flatnonzero(np.diff(empty.astype(np.int8)))
    if not len(edges):
        return
    starts, ends = edges[0::2], edges[1::2]
    k = int(np.argmax(ends - starts))
    a, b = int(starts[k]) + 1, int(ends[k]) - 1
    for t in texts:
        if len(t) <= b - a:
            c.chars[row, a:a + len(t)] = list(t)
            c.fg[row, a:a + len(t)] = c.colour(colour)
            return


def gpu_series(field: str, colour: str, vmax: float) -> tuple[str, str, str, float, str]:
    """A SeriesPanel row for a GpuSample field: its short label and unit from the table of GPU
    fields (probes/nvml/fields.py)."""
    f = BY_NAME[field]
    return (field, f.short, colour, vmax, f.unit)


class SeriesPanel(ChartPanel):
    """Several single-series bar strips stacked vertically, each with its own scale."""

    SERIES: tuple[tuple[str, str, str, float, str], ...] = ()
    # (frame.gpu key, label, colour, fixed max (0 = auto), unit)
    OFF_TITLE = ""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.off_reason = ""

    def set_off(self, reason: str) -> None:
        """Show one line saying why there is nothing to draw (NVML missing, …)."""
        if reason != self.off_reason:
            self.off_reason = reason
            self._rebuild()

    def _rebuild(self) -> None:
        if self.off_reason:
            w, h = self.size.width, self.size.height
            if w <= 0:
                return
            lead = [(" ▍", style(theme.AXIS, BG)),
                    (self.OFF_TITLE or self.TITLE, style(theme.TITLE, BG, bold=True)),
                    ("  ⊘ off — ", style(theme.PREEMPTED, BG, bold=True))]
            # the reason wraps at words onto the panel's other rows (it names what is missing:
            # not a line to lose); what finds no row ends in "…"
            first = max(1, w - sum(cell_len(t) for t, _ in lead))
            lines = _wrap(self.off_reason, first, max(1, w - 3), max(1, h))
            rows = [lead + [(lines[0], style(theme.LABEL, BG))]]
            rows += [[("   " + line, style(theme.LABEL, BG))] for line in lines[1:]]
            self._strips = [text_strip(r, w, BG) for r in rows]
            self.refresh()
            return
        super()._rebuild()

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:
        n = len(self.SERIES)
        per = max(1, h // n)
        rows: list[Strip] = []
        for i, (key, label, colour, vmax, unit) in enumerate(self.SERIES):
            rh = per if i < n - 1 else h - per * (n - 1)
            if rh <= 0:
                continue
            vals = self.fit(f.gpu.get(key, np.full(cols, np.nan)), cols)
            top = vmax or nice_max(float(np.nanmax(vals)) if np.isfinite(vals).any() else 0.0, 1)
            c = Cells(rh, cols, [])
            c.stacked([vals / top * rh], [colour])
            if not np.isfinite(vals).any():
                msg = "no data"
                c.chars[rh - 1, :len(msg)] = list(msg[:cols])
                c.fg[rh - 1, :len(msg)] = c.colour(theme.AXIS)
            c.markers(self.marker_cols(f, cols))
            cur = last_value(vals, 4)
            left = _gutter(rh, label, f"0–{fmt_num(top)}{unit}" if rh > 1 else "")
            right = _right(rh, [(fmt_num(cur, unit), colour)])
            rows.extend(c.strips(left, right, BG))
        return rows


class GpuPanel(SeriesPanel):
    TITLE = "GPU saturation"
    OFF_TITLE = "GPU panels"
    UNIT = "% (GPM SM active, tensor active; GPU-Util = any kernel running)"
    UNIT_SHORT = "% (GPM; GPU-Util = any kernel)"
    SOURCE = "NVML/GPM"
    SERIES = (gpu_series("sm_active", theme.SM_ACTIVE, 100.0),
              gpu_series("tensor_active", theme.TENSOR_ACTIVE, 100.0),
              gpu_series("gpu_util", theme.GPU_UTIL, 100.0))


class MemPowerPanel(SeriesPanel):
    TITLE = "DRAM bandwidth and power"
    UNIT = "% of peak (GPM DRAM BW), W"
    UNIT_SHORT = "% of peak, W"
    SOURCE = "NVML/GPM"
    SERIES = (gpu_series("dram_bw_util", theme.DRAM_BW, 100.0),
              gpu_series("power_w", theme.POWER, 0.0))


class TimeAxis(ChartPanel):
    """The shared time axis: mode in force per column, change markers with labels, and time
    ticks counted back from now."""

    DEFAULT_CSS = """
    TimeAxis { height: 3; background: #11151c; }
    """
    from_start = False  # ticks count from the window's start (A/B windows) instead of back from now

    def _rebuild(self) -> None:
        w, h = self.size.width, self.size.height
        if w <= 0 or h <= 0 or self._frame is None:
            return
        if w - GUTTER_L - GUTTER_R < MIN_COLS:
            self._publish(too_small(w, h), w, h)
            return
        self._publish(self.draw(self._frame, w - GUTTER_L - GUTTER_R, h), w, h)

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:
        shift = cols - f.grid.cols
        # row 0: mode strip with marker ticks
        c0 = Cells(1, cols, [])
        modes = ([""] * max(0, shift) + f.modes)[-cols:] if cols else []
        for m, colour in theme.MODE_COLOURS.items():
            sel = [i for i, x in enumerate(modes) if x == m]
            if sel:
                c0.chars[0, sel] = "▀"
                c0.fg[0, sel] = c0.colour(colour)
        for mk in f.markers:
            col = mk.col + shift
            if 0 <= col < cols:
                c0.chars[0, col] = "┃"
                c0.fg[0, col] = c0.colour(_marker_colour(mk))
        rows = c0.strips([("mode", LBL)], [("", LBL)], BG)
        # row 1: marker labels, whole or not at all (see change_labels)
        line = change_labels([(mk.col + shift, mk.label) for mk in f.markers], cols)
        c1 = Cells(1, cols, [])
        c1.chars[0] = list(line)
        c1.fg[0] = c1.colour(theme.TITLE)
        for mk in f.markers:  # a phase's name in the phase colour, where it was placed
            if mk.kind == "phase":
                for a, b in label_cells(line, mk.col + shift, mk.label):
                    c1.fg[0, a:b] = c1.colour(theme.PHASE)
        # "1 col =" sits right above its value (the time row's right gutter)
        rows += c1.strips([("changes", LBL)], [(" 1 col =", LBL)], BG)
        # row 2: ticks back from now
        win = f.grid.bin_s * cols
        step = _tick_step(win, cols)
        c2 = Cells(1, cols, [])
        c2.fg[0] = c2.colour(theme.AXIS)
        if self.from_start:
            k, free = 0, 0
            while True:
                t = k * step
                col = int(round(t / f.grid.bin_s))
                if col >= cols:
                    break
                lab = "0" if k == 0 else _fmt_dur(t)
                if col >= free and col + len(lab) <= cols:
                    c2.chars[0, col:col + len(lab)] = list(lab)
                    free = col + len(lab) + 1
                k += 1
        else:
            k, prev_start = 0, cols
            while True:
                t = k * step
                col = cols - 1 - int(round(t / f.grid.bin_s))
                if col < 0:
                    break
                lab = "now" if k == 0 else "-" + _fmt_dur(t)
                start = col - len(lab) + 1
                if start >= 0 and col < prev_start - 1:  # right-aligned on its tick, never touching
                    c2.chars[0, start:col + 1] = list(lab)
                    prev_start = start
                k += 1
        rows += c2.strips([("time", LBL)], [(f"▏{_fmt_dur(f.grid.bin_s)}", LBL)], BG)
        return rows[:h]


def _marker_colour(mk) -> str:
    """A marker's tick colour on the mode strip: an A/B window's side, a phase, else the
    title colour."""
    if mk.kind == "ab":
        return theme.AB_COLOURS.get(mk.label[:1], theme.TITLE)
    return theme.PHASE if mk.kind == "phase" else theme.TITLE


def label_cells(line: str, col: int, label: str) -> list[tuple[int, int]]:
    """Where ``change_labels`` put the marker at ``col`` with ``label`` in ``line``: [(start,
    end)] of its "▲label" or "label▲" cells, or of a bare "▲" at ``col``; [] when not shown."""
    n = len(label) + 1
    if line[col:col + n] == "▲" + label:
        return [(col, col + n)]
    if col - n + 1 >= 0 and line[col - n + 1:col + 1] == label + "▲":
        return [(col - n + 1, col + 1)]
    return [(col, col + 1)] if 0 <= col < len(line) and line[col] == "▲" else []


def change_labels(markers: Sequence[tuple[int, str]], cols: int) -> str:
    """The time axis's change row, ``cols`` cells: each marker ``(column, label)`` gets its
    label whole, newest (rightmost) first — "▲label" starting at its column, or "label▲"
    ending there when that runs off the right edge — with a blank cell between labels. A
    marker whose label does not fit is a bare "▲" (where its cell is free) and is counted on
    the nearest label: "▲budget 512→1024 +2" (+2 more changes there). Labels are never cut."""
    line = [" "] * cols
    used = [False] * cols  # a label's own blanks are taken too
    placed: list[list] = []  # [start, end, anchor col, right-aligned, count]

    def free(a: int, b: int) -> bool:  # cells [a, b) and one blank each side
        return 0 <= a and b <= cols and not any(used[max(0, a - 1):min(cols, b + 1)])

    def put(a: int, text: str) -> None:
        line[a:a + len(text)] = text
        used[a:a + len(text)] = [True] * len(text)

    for col, label in sorted(markers, key=lambda m: m[0], reverse=True):
        if not 0 <= col < cols:
            continue
        n = len(label) + 1
        if free(col, col + n):
            put(col, "▲" + label)
            placed.append([col, col + n, col, False, 0])
        elif free(col - n + 1, col + 1):
            put(col - n + 1, label + "▲")
            placed.append([col - n + 1, col + 1, col, True, 0])
        else:
            if not used[col]:
                put(col, "▲")
            if placed:  # the nearest label takes the count
                min(placed, key=lambda p: abs(p[2] - col))[4] += 1
    # the counts, right to left: one that finds no room beside its label goes to the next one
    carry = 0
    for a, b, _, right, k in sorted(placed, key=lambda p: p[0], reverse=True):
        k += carry
        carry = 0
        if not k:
            continue
        m = len(f" +{k}")
        after = b + m <= cols and not any(used[b:b + m + 1])
        before = a - m >= 0 and not any(used[max(0, a - m - 1):a])
        if after and (not right or not before):
            put(b, f" +{k}")
        elif before:
            put(a - m, f"+{k} ")
        else:
            carry = k
    if carry:  # no label had room beside it: the count goes where there is, leftmost
        tag = f"+{carry}"
        for j in range(cols - len(tag) + 1):
            if not any(used[max(0, j - 1):j + len(tag) + 1]):
                put(j, tag)
                break
    return "".join(line)


def _wrap(text: str, first: int, rest: int, rows: int) -> list[str]:
    """``text`` in at most ``rows`` lines, broken at spaces: the first ``first`` cells wide,
    the others ``rest``; a last line that cannot hold the rest ends in "…"."""
    words = text.split(" ")
    lines: list[str] = []
    cur = ""
    for word in words:
        width = first if not lines else rest
        cand = f"{cur} {word}" if cur else word
        if cell_len(cand) <= width or not cur:
            cur = cand
            continue
        lines.append(cur)
        cur = word
    lines.append(cur)
    if len(lines) > rows:
        lines = lines[:rows - 1] + [" ".join(lines[rows - 1:])]
    width = first if len(lines) == 1 else rest
    if cell_len(lines[-1]) > width:
        lines[-1] = lines[-1][:max(0, width - 1)] + "…"
    return lines


def fmt_span(s: float) -> str:
    """A readout's window: "1.9 s", "12 s", "1.5 min"."""
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min"


def _tick_step(window_s: float, cols: int) -> float:
    target = window_s / max(1, cols // 14)
    for s in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600):
        if s >= target:
            return float(s)
    return 3600.0


def _fmt_dur(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 10 and s != int(s):
        return f"{s:.2g}s"
    if s < 60:
        return f"{s:g}s"
    if s < 3600:
        return f"{s / 60:g}m"
    return f"{s / 3600:g}h"



class PerGpuPanel(ChartPanel):
    """Several GPUs: one row per GPU (SM active as a one-row waveform, the latest SM active,
    tensor active, DRAM bandwidth, memory used (%) and power (W) as numbers), a ``mean`` row over
    all GPUs and a ``spread`` row: max − min of SM active across GPUs per time slice (%), so that
    one rank lagging behind its tensor-parallel group shows at a glance.

    The numbers take the right :data:`NUM_W` columns, so this panel's waveforms end that much
    further left than the other panels' (the right end is still "now")."""

    TITLE = "GPUs"
    UNIT = "SM active %; spread = max−min across GPUs"
    SOURCE = "NVML/GPM"
    NUM_W = 26  # "tens% DRAM% mem%  power" after the SM% gutter
    HEADS = f"{'SM%':>{GUTTER_R}}{'tens%':>6}{'DRAM%':>6}{'mem%':>6}{'W':>8}"

    def rows_needed(self, n_gpus: int) -> int:
        """Height (rows) for ``n_gpus``: title, one per GPU, mean, spread."""
        return n_gpus + 3

    def title_strip(self, width: int) -> Strip:
        key = (width, self.UNIT, self.SOURCE)
        if self._title_key != key:
            heads = self.HEADS  # column heads over the numbers; the source goes first if short
            parts = self.title_parts()
            used = sum(len(t) for t, _ in parts)
            while len(parts) > 2 and used > width - len(heads) - 1:
                used -= len(parts.pop()[0])
            short = "  SM active %, spread max−min"
            if len(parts) == 2 and used + len(short) <= width - len(heads) - 1:
                parts.append((short, LBL))
                used += len(short)
            pad = max(1, width - used - len(heads))
            parts += [(" " * pad, LBL), (heads, LBL)]
            self._title_key, self._title = key, text_strip(parts, width, BG)
        return self._title

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:
        cols = max(1, cols - self.NUM_W)
        per = f.per_gpu
        if not per:
            return []
        sm = np.vstack([self.fit(v.get("sm_active", np.full(cols, np.nan)), cols)
                        for v in per.values()])
        ok = np.isfinite(sm).sum(axis=0) >= 2
        with np.errstate(all="ignore"):
            spread = np.where(ok, np.nanmax(np.where(np.isfinite(sm), sm, -np.inf), axis=0)
                              - np.nanmin(np.where(np.isfinite(sm), sm, np.inf), axis=0), np.nan)
        mk = self.marker_cols(f, cols)
        rows: list[Strip] = []
        for k, series in per.items():
            rows.append(self._row(f"GPU {k}", series, cols, mk, theme.SM_ACTIVE))
        rows.append(self._row("mean", f.gpu, cols, mk, theme.TITLE))
        last = np.array([last_value(self.fit(v.get("sm_active", np.full(cols, np.nan)), cols), 4)
                         for v in per.values()])
        cur = last_value(spread, 4)
        extra = ""
        if np.isfinite(last).sum() >= 2:
            keys = list(per)
            hi = keys[int(np.nanargmax(last))]
            lo = keys[int(np.nanargmin(last))]
            extra = f"hi GPU {hi} · lo GPU {lo}"
        c = Cells(1, cols, [])
        c.stacked([spread / 100.0], [theme.PREEMPTED])
        c.markers(mk)
        strip = c.strips([("spread", LBL)], [(fmt_num(cur, "%"), style(theme.PREEMPTED, BG,
                                                                         bold=True))], BG)[0]
        rows.append(_join(strip, extra.rjust(self.NUM_W)[:self.NUM_W], LBL))
        return rows[:h]

    def _row(self, label: str, v: dict[str, np.ndarray], cols: int, mk: list[int],
             colour: str) -> Strip:
        def cur(key: str) -> float:
            return last_value(self.fit(v.get(key, np.full(cols, np.nan)), cols), 4)

        sm = self.fit(v.get("sm_active", np.full(cols, np.nan)), cols)
        c = Cells(1, cols, [])
        c.stacked([sm / 100.0], [colour])
        c.markers(mk)
        strip = c.strips([(label, LBL)], [(_num(cur("sm_active"), "%"),
                                            style(colour, BG, bold=True))], BG)[0]
        nums = (f"{_num(cur('tensor_active'), '%'):>6}{_num(cur('dram_bw_util'), '%'):>6}"
                f"{_num(cur('mem_used_pct'), '%'):>6}{_num(cur('power_w'), 'W'):>8}")
        return _join(strip, nums[:self.NUM_W].rjust(self.NUM_W), VAL)


def _num(v: float, unit: str) -> str:
    return "–" if not np.isfinite(v) else f"{v:.0f}{unit}"


def _join(strip: Strip, text: str, st: Style) -> Strip:
    return Strip(list(strip) + [Segment(text, st)], strip.cell_length + len(text))
