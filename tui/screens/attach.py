"""The main screen of an attached session (`top --attach`): a server gpuchef does not host.

Its picture comes from the server's ``/metrics`` (``tui.widgets.scrape``), the local GPUs when
sampled, and gpuchef's own load when it sends one. What a hosted session draws from StepRecords
(the step waveform, exact batch composition) has no source here: that panel says why. The first
server's charts are drawn; the numbers panel has one column per server.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from gpuchef.engine_host.vocab.config import setting_label as _label

from .. import theme
from ..chart import GUTTER_L, GUTTER_R
from ..plotdata import GpuColumns, StepColumns, TimeGrid, build_frame
from ..widgets.numbers import compute_numbers
from ..widgets.scrape import (AttachNumbersPanel, BatchEstimatePanel, ScrapeQueuePanel,
                              ServerLatencyPanel, TokenRatePanel, attach_numbers_text,
                              build_scrape_frame, server_numbers)
from ..widgets.waveforms import GpuPanel, MemPowerPanel

NUMBERS_EVERY_S = 1.0
#: why the step waveform is absent on an attached server
NO_STEPS = ("no per-step records: a server gpuchef does not host exports no step spans "
            "(the panels below are per scrape interval)")


def attach_header_text(s, elapsed_s: int) -> Text:
    """Two or more lines: the servers and their kinds, the load, elapsed time, trace, knobs;
    then one line per thing that is wrong now (a scrape failing, the load stopped)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" gpuchef top --attach ", style=f"bold {theme.PANEL_BG} on {theme.MIXED}")
    for srv in s.servers:
        t.append(f"  {srv.url}", style=f"bold {theme.TITLE}")
        t.append(f" ({srv.kind})", style=theme.LABEL)
    t.append(f"  model {s.info.model}", style=theme.LABEL)
    if s.info.gpus:
        t.append(f"  local GPU{'s' if len(s.info.gpus) > 1 else ''} {','.join(s.info.gpus)}",
                 style=theme.TITLE)
    reason = s.knobs_reason
    if not reason:
        c = s.scheduler_config
        t.append("   knobs live: ", style=theme.LABEL)
        t.append(f"{c.mode} {_label('max_num_batched_tokens')} {c.max_num_batched_tokens} "
                 f"{_label('max_num_seqs')} {c.max_num_seqs}",
                 style=f"bold {theme.TITLE}")
    else:
        t.append("   knobs read-only", style=theme.WAITING)
    t.append("\n load ", style=theme.LABEL)
    t.append(s.load.state().describe(), style=f"bold {theme.TITLE}")
    h, r = divmod(max(0, elapsed_s), 3600)
    t.append("   elapsed ", style=theme.LABEL)
    t.append(f"{h:d}:{r // 60:02d}:{r % 60:02d}", style=f"bold {theme.TITLE}")
    t.append("   trace ", style=theme.LABEL)
    t.append(s.trace_path or "off (e: write one)", style=theme.TITLE if s.trace_path else theme.AXIS)
    if s.info.note:
        t.append(f"   {s.info.note}", style=theme.AXIS)
    for line in s.status_lines:
        t.append(f"\n ⚠ {line}", style=f"bold {theme.PREEMPTED}")
    return t


class AttachScreen(Screen):
    """Several ``--attach``: each chart has one band per server (the first alone when they do
    not fit) and ``v`` rotates their order; the numbers panel has one column per server."""

    BINDINGS = [Binding("v", "next_server", "server")]
    #: below 120 columns the side panel is hidden and ``n`` shows it in place of the charts
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.ready = False  # set once the first tick has drawn every panel
        self._last_numbers = 0.0
        self._gpu_on: bool | None = None
        self._gpu_key: tuple | None = None
        self._header = None
        self.gpus = GpuColumns()
        self._no_steps = StepColumns()
        #: the numbers last shown, by server URL (read by tests)
        self.shown: dict[str, dict] = {}
        self._knobs_shown: tuple | None = None
        #: index of the server the charts draw
        self.charted = 0

    def compose(self) -> ComposeResult:
        yield Static("", id="a-header")
        with Horizontal(id="a-body"):
            with Vertical(id="a-waves"):
                yield GpuPanel(id="a-gpu")
                yield MemPowerPanel(id="a-mem")
                yield Static(f" ▍Step waveform  ⊘ {NO_STEPS}", id="a-steps")
                yield ScrapeQueuePanel(id="a-queue")
                yield TokenRatePanel(id="a-rates")
                yield BatchEstimatePanel(id="a-batch")
                yield ServerLatencyPanel(id="a-latency")
            with VerticalScroll(id="a-side"):
                yield AttachNumbersPanel(id="a-numbers")
                yield Static("", id="a-knobs")
        yield Footer()

    def on_mount(self) -> None:
        self.scrape_panels = [self.query_one(x) for x in ("#a-queue", "#a-rates", "#a-batch",
                                                          "#a-latency")]
        self.gpu_panels = [self.query_one("#a-gpu"), self.query_one("#a-mem")]
        self.numbers = self.query_one(AttachNumbersPanel)
        n = len(self.app.session.servers)
        if n > 2:  # one 17-cell column per server beside the 14-cell labels
            self.query_one("#a-side").styles.width = min(17 * n + 18, 120)
        self.call_after_refresh(self._first_tick)

    def _first_tick(self) -> None:
        self.tick(force=True)
        self.ready = True

    def resync_controls(self) -> None:
        self._show_knobs()

    def _show_knobs(self) -> None:
        s = self.app.session
        reason = s.knobs_reason
        t = Text()
        t.append("Knobs", style=f"bold {theme.TITLE}")
        if reason:
            t.append(f"  {reason}", style=theme.WAITING)
        else:
            c = s.scheduler_config
            t.append(f"  live (PATCH /gpuchef/v1/scheduler on {s.servers[0].url})\n",
                     style=theme.LABEL)
            t.append(f" mode {c.mode}  {_label('max_num_batched_tokens')} "
                     f"{c.max_num_batched_tokens}  {_label('max_num_seqs')} {c.max_num_seqs}  "
                     f"{_label('long_prefill_token_threshold')} "
                     f"{c.long_prefill_token_threshold or 'off'}",
                     style=f"bold {theme.TITLE}")
            t.append("\n m mode  +/- budget  [/] chunk", style=theme.AXIS)
        self.query_one("#a-knobs", Static).update(t)

    def tick(self, force: bool = False) -> None:
        app = self.app
        s = app.session
        now = s.clock()
        wall = time.monotonic()
        self._tick_gpu(s)
        cols = self.scrape_panels[0].size.width - GUTTER_L - GUTTER_R
        if cols > 0:
            grid = TimeGrid.ending_at(now, s.start_ns, app.window_s, cols)
            n = len(s.servers)
            order = [s.servers[(self.charted + k) % n] for k in range(n)]  # v rotates it
            frames = []
            for k, srv in enumerate(order):
                last = srv.samples()[-1:]
                f = build_scrape_frame(srv.deltas(), grid, srv.kind, srv.hz,
                                       last[0] if last else None)
                f.url_label = srv.url.split("//", 1)[-1]
                if n > 1:  # the titles say whose chart is on top (or alone, when short)
                    f.server = f"{f.url_label} first ({self.charted + 1}/{n}, v)"
                frames.append(f)
            for p in self.scrape_panels:
                p.set_frames(frames)
            if self._gpu_on:
                snap = s.timeline.snapshot(now)
                self.gpus.extend(snap)
                wf = build_frame(snap, grid, gpu=True, steps=self._no_steps, gpus=self.gpus)
                for p in self.gpu_panels:
                    p.set_frame(wf)
        if force or wall - self._last_numbers >= NUMBERS_EVERY_S - 0.05:
            self._last_numbers = wall
            nums = [server_numbers(x.url, x.kind, x.status, x.deltas(), now, s.stats_window_s,
                                   s.percentiles, latest=_newest_good(x.samples()))
                    for x in s.servers]
            self.shown = {n.url: dict(n.values) for n in nums}
            snap = s.timeline.snapshot(now)
            client = compute_numbers(snap, s.stats_window_s, s.slos, s.percentiles).metrics \
                if snap.requests else None
            self.numbers.show(attach_numbers_text(nums, client, s.percentiles, s.stats_window_s))
            self._show_knobs()
        cfg = (s.scheduler_config, s.knobs_reason)
        if cfg != self._knobs_shown:  # a knob change shows at once, not at the next second
            self._knobs_shown = cfg
            self._show_knobs()
        header = attach_header_text(s, int((now - s.start_ns) // 1_000_000_000))
        if header != self._header:
            self._header = header
            self.query_one("#a-header", Static).update(header)

    def toggle_side(self) -> None:
        """``n``: the numbers/knobs panel off on a wide terminal; on a narrow one, where it is
        hidden, shown full width in place of the charts."""
        self.set_class(not self.has_class("-side-on"), "-side-on")

    def action_next_server(self) -> None:
        n = len(self.app.session.servers)
        if n < 2:
            self.app.notify("one server attached: the charts draw it", timeout=3)
            return
        self.charted = (self.charted + 1) % n
        self.tick(force=True)

    def _tick_gpu(self, s) -> None:
        on = bool(s.gpu_available)
        key = (on, s.gpu_status)
        if key == self._gpu_key:
            return
        self._gpu_key = key
        self._gpu_on = on
        gpu, mem = self.gpu_panels
        gpu.set_class(not on, "off")
        gpu.set_off("" if on else (s.gpu_status or "NVML not started"))
        mem.display = on


def _newest_good(samples):
    """The newest scrape of ``samples`` (oldest first) that did not fail, or None."""
    for x in reversed(samples):
        if not x.error:
            return x
    return None
