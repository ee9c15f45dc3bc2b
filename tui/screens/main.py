"""The main screen: header, the waveforms on one time axis, numbers and controls.

``tick()`` runs on the UI thread ``fps`` times a second and returns at once unless a frame is
due: one per column of the time grid (10 s window: every tick; 60 s: every 0.5 s) or when the
mode, a knob or the load changed. A frame takes one timeline snapshot, rebuilds the charts if
anything arrived, the numbers once a second and the header if what it shows changed — all in
the same frame, so Textual composes the screen once.
"""

from __future__ import annotations

import time

import numpy as np
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ..chart import GUTTER_L, GUTTER_R
from ..plotdata import GpuColumns, StepColumns, TimeGrid, build_frame
from ..widgets.controls import ControlsPanel
from ..widgets.header import HeaderState, SessionHeader
from ..widgets.numbers import NumbersPanel, RequestColumns, compute_numbers_fast
from ..widgets.queue_kv import QueueKvPanel
from ..widgets.waveforms import (BatchPanel, GpuPanel, MemPowerPanel, PerGpuPanel, StepPanel,
                                 StepTimePanel, TimeAxis)

MAX_FRAME_S = 0.5       # the last (partial) column and the header refresh at least this often
NUMBERS_EVERY_S = 1.0


def header_state(app) -> HeaderState:
    s = app.session
    now = s.clock()
    return HeaderState(s.info, s.scheduler_config, s.load.state(),
                       int((now - s.start_ns) // 1_000_000_000), s.trace_path, s.gpu_status,
                       s.ab.state(), app.ui_cost_pct, s.engine_error,
                       s.engine_paused,
                       getattr(app, "front_door_error", ""), getattr(app, "arrivals", None))


SIDE_HIDDEN_HINT = "narrow terminal: n shows numbers/controls"
SIDE_SHOWN_HINT = "narrow terminal: n goes back to the charts"
SCROLL_HINT = "short terminal: scroll ↓ for more charts"
#: Below this many columns or rows nothing fits: the screen shows one "too small" line instead.
MIN_W, MIN_H = 30, 8
#: Rows the charts at their minimum heights (tui/gpuchef.tcss: GPU 8, DRAM/power 6, step,
#: batch and queue 6 each, time axis 3) and the footer need: with fewer left under the header
#: the screen is ``-short``. The autopilot's step-time panel, while shown, needs its 7 more.
CHART_ROWS = 36
STEP_TIME_ROWS = 7
#: Header lines at most on a wide terminal (>= 120 columns: every item whole — 120 columns take
#: up to 5 under `top --serve`) and on a narrow one (each logical line's first, cut with "…")
HEADER_LINES_WIDE, HEADER_LINES_NARROW = 6, 2


def too_small_text(w: int, h: int) -> str:
    return (f"terminal {w}×{h} is too small for gpuchef top: it needs at least {MIN_W}×{MIN_H} "
            "(q quits)")


class MainScreen(Screen):
    """Below 120 columns (``-narrow``) the side panel is hidden and ``n`` shows it full width
    instead of the charts; when the rows under the header are fewer than :data:`CHART_ROWS`
    (``-short``, where the charts no longer fit) the charts shrink and scroll. A hint line says
    so. The header wraps its items to the width (up to 6 lines; 2 on a narrow terminal), so
    ``-short`` depends on its line count as well as on the height: set here, not by a fixed
    breakpoint. Its layout rules: tui/gpuchef.tcss."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = []  # -short / -tall: _fit_rows (the header's height varies)

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._grid_key: tuple | None = None
        self._totals: dict | None = None
        self._last_frame = 0.0
        self._last_numbers = 0.0
        self._gpu_on: bool | None = None
        self._n_gpus = 0  # GPUs laid out per row (0: the pooled panels)
        self._cfg = None
        self._load = None
        self.steps = StepColumns()
        self.gpus = GpuColumns()
        self.reqs = RequestColumns()
        self._seen_step = (-1, 0)  # (newest step id seen, requests submitted when it was seen)
        self._header_lines = 0
        self.ready = False  # set once the first tick has drawn every panel

    def compose(self) -> ComposeResult:
        yield SessionHeader(id="header")
        with Horizontal(id="body"):
            with Vertical(id="waves"):
                yield GpuPanel(id="gpu")
                yield PerGpuPanel(id="gpus")
                yield MemPowerPanel(id="mem")
                yield StepPanel(id="step")
                yield BatchPanel(id="batch")
                yield StepTimePanel(id="steptime")
                yield QueueKvPanel(id="queue")
                yield TimeAxis(id="axis")
            with VerticalScroll(id="side"):
                yield NumbersPanel(self.app.session.percentiles, id="numbers")
                yield ControlsPanel(self.app.session.scheduler_config.mode, id="controls")
        with Horizontal(id="hints"):
            yield Static(SIDE_HIDDEN_HINT, id="hint-side")
            yield Static(SCROLL_HINT, id="hint-scroll")
        yield Static("", id="too-small")
        yield Footer()

    def on_mount(self) -> None:
        self.gpu_panel = self.query_one("#gpu", GpuPanel)
        self.mem_panel = self.query_one("#mem", MemPowerPanel)
        self.step_panel = self.query_one("#step", StepPanel)
        self.batch_panel = self.query_one("#batch", BatchPanel)
        self.queue_panel = self.query_one("#queue", QueueKvPanel)
        self.axis = self.query_one("#axis", TimeAxis)
        self.per_gpu = self.query_one(PerGpuPanel)
        self.per_gpu.display = False
        # the autopilot's step-time panel: shown while it is on or its steps are in the window
        self.step_time = self.query_one(StepTimePanel)
        self.step_time.display = bool(self.app.session.scheduler_config.auto_budget)
        #: every chart, in the order they are drawn
        self.panels = [self.gpu_panel, self.mem_panel, self.step_panel, self.batch_panel,
                       self.queue_panel, self.axis, self.per_gpu, self.step_time]
        self.header = self.query_one(SessionHeader)
        self.numbers = self.query_one(NumbersPanel)
        self.controls = self.query_one(ControlsPanel)
        self.call_after_refresh(self._first_tick)  # once every child has mounted

    def _first_tick(self) -> None:
        self.tick(force=True)
        self.ready = True

    def toggle_side(self) -> None:
        """``n``: the side panel (numbers, controls) off on a wide terminal; on a narrow one,
        where it is hidden, shown full width in place of the charts."""
        on = not self.has_class("-side-on")
        self.set_class(on, "-side-on")
        self.query_one("#hint-side", Static).update(SIDE_SHOWN_HINT if on else SIDE_HIDDEN_HINT)
        self._grid_key = None
        self._last_numbers = 0.0

    def on_resize(self) -> None:
        self._grid_key = None
        w, h = self.size.width, self.size.height
        tiny = w < MIN_W or h < MIN_H
        self.set_class(tiny, "-tiny")
        if tiny:
            self.query_one("#too-small", Static).update(too_small_text(w, h))
        self._fit_rows()

    def _fit_rows(self) -> None:
        """The header's line cap for this width, and ``-short``/``-tall`` from the rows left
        under the header at its line count."""
        w, h = self.size.width, self.size.height
        header = self.query_one(SessionHeader)
        header.max_lines = HEADER_LINES_WIDE if w >= 120 else HEADER_LINES_NARROW
        lines = header.wanted_lines(width=w) if w else header.lines
        st = getattr(self, "step_time", None)  # set on mount
        need = CHART_ROWS + (STEP_TIME_ROWS if st is not None and st.display else 0)
        tall = h - lines >= need
        if tall != self.has_class("-tall") or tall == self.has_class("-short"):
            self.set_class(tall, "-tall")
            self.set_class(not tall, "-short")

    def resync_controls(self) -> None:
        """Put what is in force back into the controls (after a refused value)."""
        if self.ready:
            self.controls.sync(self.app.session.scheduler_config, self.app.session.load.state(),
                               force=True)

    def on_screen_resume(self) -> None:
        self._grid_key = None
        self._last_numbers = 0.0

    # -- the refresh ---------------------------------------------------------------------------
    def tick(self, force: bool = False) -> None:
        """One frame, when due: every column of the grid (at most ``fps``, at least every
        ``MAX_FRAME_S``), or at once when the mode, a knob or the load changed. Charts, numbers
        and header change in the same frame, so Textual composes once instead of three times."""
        app = self.app
        s = app.session
        wall = time.monotonic()
        cols = self.step_panel.size.width - GUTTER_L - GUTTER_R
        cfg, load = s.scheduler_config, s.load.state()
        changed = cfg != self._cfg or load != self._load
        frame_s = min(MAX_FRAME_S, max(1.0 / app.fps, app.window_s / max(cols, 1)))
        if not (force or changed or wall - self._last_frame >= frame_s - 0.02):
            return
        self._last_frame = wall
        now = s.clock()
        self._tick_gpu(s)
        snap = None
        if cols > 0:
            grid = TimeGrid.ending_at(now, s.start_ns, app.window_s, cols)
            totals = s.timeline.totals
            if force or grid.key() != self._grid_key or totals != self._totals:
                snap = s.timeline.snapshot(now)
                self.steps.extend(snap.steps)
                if self._gpu_on:
                    self.gpus.extend(snap)
                    self._layout_gpus(len(self.gpus.indices))
                frame = build_frame(snap, grid, gpu=bool(self._gpu_on), steps=self.steps,
                                    gpus=self.gpus)
                frame.pending = self._pending(snap, load)
                shown = bool(cfg.auto_budget) or bool(
                    frame.allowance is not None and np.isfinite(frame.allowance).any())
                if shown != self.step_time.display:
                    self.step_time.display = shown
                    self._fit_rows()  # its rows come out of the others'
                for p in self.panels:
                    if p.display and not getattr(p, "off_reason", ""):  # skip hidden panels
                        p.set_frame(frame)
                self._grid_key, self._totals = grid.key(), totals
        if force or wall - self._last_numbers >= NUMBERS_EVERY_S - 0.05:
            snap = snap or s.timeline.snapshot(now)
            self.steps.extend(snap.steps)
            self.reqs.extend(snap)
            self.numbers.show(compute_numbers_fast(snap, s.stats_window_s, s.slos, s.percentiles,
                                                   self.steps, self.reqs,
                                                   self._pending(snap, load)))
            self._last_numbers = wall
        self.header.show(header_state(app))  # redraws only if something shown changed
        if self.header.lines != self._header_lines:  # the charts get the rows it left
            self._header_lines = self.header.lines
            self._fit_rows()
        if changed or force:
            self.controls.sync(cfg, load)
            self._cfg, self._load = cfg, load

    def _pending(self, snap, load) -> int:
        """Requests the load submitted since the newest step was first seen: no step has
        counted them yet (an engine pause, a long step in flight), and they wait."""
        newest = snap.steps[-1].step if snap.steps else -1
        if newest != self._seen_step[0]:
            self._seen_step = (newest, load.submitted)
        return max(0, load.submitted - self._seen_step[1])

    def _tick_gpu(self, s) -> None:
        on = bool(s.gpu_available)
        if on == self._gpu_on and (on or self.gpu_panel.off_reason == _off_text(s.gpu_status)):
            return
        self._gpu_on = on
        gpu, mem = self.gpu_panel, self.mem_panel
        gpu.set_class(not on, "off")
        gpu.set_off("" if on else _off_text(s.gpu_status))
        mem.display = on  # one line says why for both GPU panels
        self._grid_key = None
        self._n_gpus = -1  # lay the GPU panels out again
        self._layout_gpus(len(self.gpus.indices) if on else 0)

    def _layout_gpus(self, n: int) -> None:
        """One row per GPU when more than one is sampled (``n`` GPUs); else the pooled panels."""
        n = n if n > 1 else 0
        if n == self._n_gpus:
            return
        self._n_gpus = n
        self.per_gpu.display = bool(n)
        if n:
            self.per_gpu.styles.height = self.per_gpu.rows_needed(n)
        self.gpu_panel.display = not n
        self.mem_panel.display = not n and bool(self._gpu_on)


def _off_text(status: str) -> str:
    return status or "NVML not started"
