"""The main screen of an attached session (`top --attach`): a server gpuchef does not host.

Its picture comes from the server's ``/metrics`` (``tui.widgets.scrape``), the local GPUs when
sampled, and gpuchef's own load when it sends one. What a hosted session draws from StepRecords
(the step waveform, exact batch composition, the queues per step) comes from gpuchef's vLLM
plugin when the server runs it and ``--plugin`` names its endpoint (``tui.widgets.iterations``:
a band per server and engine, per output batch); a server whose plugin sent rows has its
/metrics queue and batch-estimate panels give way to those (when every server has). Without
plugin rows the step waveform's line says why. The charts have a band per server; the numbers
panel has one column per server, and per plugin stream; "Sources" says which source each
panel draws.
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
from ..widgets.iterations import (IterationPanel, PluginBatchPanel, PluginQueuePanel,
                                  PluginView, plugin_numbers_text, sources_text)
from ..widgets.waveforms import GpuPanel, MemPowerPanel

NUMBERS_EVERY_S = 1.0
#: why the step waveform is absent on an attached server
NO_STEPS = ("no per-step records: a server gpuchef does not host exports no step spans "
            "(the panels below are per scrape interval)")
#: the plugin panels, in the order they are composed
PLUGIN_IDS = ("#a-iter", "#a-pbatch", "#a-pqueue")


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
        #: the vLLM plugin's rows as columns, and the frames last drawn (read by tests)
        self.plugin_view = PluginView()
        self.plugin_frames: list = []
        self._plugin_shown: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="a-header")
        with Horizontal(id="a-body"):
            with Vertical(id="a-waves"):
                yield GpuPanel(id="a-gpu")
                yield MemPowerPanel(id="a-mem")
                yield Static(f" ▍Step waveform  ⊘ {NO_STEPS}", id="a-steps")
                yield IterationPanel(id="a-iter")
                yield PluginBatchPanel(id="a-pbatch")
                yield PluginQueuePanel(id="a-pqueue")
                yield ScrapeQueuePanel(id="a-queue")
                yield TokenRatePanel(id="a-rates")
                yield BatchEstimatePanel(id="a-batch")
                yield ServerLatencyPanel(id="a-latency")
            with VerticalScroll(id="a-side"):
                yield AttachNumbersPanel(id="a-numbers")
                yield Static("", id="a-plugin")
                yield Static("", id="a-sources")
                yield Static("", id="a-knobs")
        yield Footer()

    def on_mount(self) -> None:
        self.scrape_panels = [self.query_one(x) for x in ("#a-queue", "#a-rates", "#a-batch",
                                                          "#a-latency")]
        self.gpu_panels = [self.query_one("#a-gpu"), self.query_one("#a-mem")]
        self.plugin_panels = [self.query_one(x) for x in PLUGIN_IDS]
        self._show_plugin(False, set())
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
        # the rates panel is always shown (the queue panel gives way to the plugin's)
        cols = self.query_one("#a-rates").size.width - GUTTER_L - GUTTER_R
        if cols > 0:
            grid = TimeGrid.ending_at(now, s.start_ns, app.window_s, cols)
            n = len(s.servers)
            order = [s.servers[(self.charted + k) % n] for k in range(n)]  # v rotates it
            frames = []
            for k, srv in enumerate(order):
                last = srv.samples()[-1:]
                f = build_scrape_frame(srv.deltas(), grid, srv.kind, srv.hz,
                                       last[0] if last else None)
                if not last and srv.status:  # no scrape at all: say so, not "no series"
                    f.error = srv.status
                f.url_label = srv.url.split("//", 1)[-1]
                if n > 1:  # the titles say whose chart is on top (or alone, when short)
                    f.server = f"{f.url_label} first ({self.charted + 1}/{n}, v)"
                frames.append(f)
            for p in self.scrape_panels:
                p.set_frames(frames)
            self._tick_plugin(s, order, grid)
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
            streams = self.plugin_view.streams(s.plugin, s.servers)
            self.query_one("#a-plugin", Static).update(plugin_numbers_text(
                s.plugin, streams, now, s.stats_window_s))
            covered = self.plugin_view.covered(s.plugin, s.servers)
            self.query_one("#a-sources", Static).update(sources_text(s, covered, bool(covered)))
            self._show_knobs()
        cfg = (s.scheduler_config, s.knobs_reason)
        if cfg != self._knobs_shown:  # a knob change shows at once, not at the next second
            self._knobs_shown = cfg
            self._show_knobs()
        header = attach_header_text(s, int((now - s.start_ns) // 1_000_000_000))
        if header != self._header:
            self._header = header
            self.query_one("#a-header", Static).update(header)

    def _tick_plugin(self, s, order, grid: TimeGrid) -> None:
        """The plugin's panels: frames of every stream of the servers with an endpoint (in the
        charts' order); shown once a stream has rows, in place of the step waveform's line."""
        self.plugin_view.update(s.plugin)
        frames = self.plugin_view.frames(s.plugin, order, grid)
        self.plugin_frames = frames
        on = any(f.wave is not None for f in frames)
        self._show_plugin(on, self.plugin_view.covered(s.plugin, s.servers))
        if on:
            for p in self.plugin_panels:
                p.set_frames(frames)

    def _show_plugin(self, on: bool, covered: set[str]) -> None:
        """Plugin panels on or off; the /metrics queue and batch estimate give way when every
        server's plugin sent rows; off, the step waveform's line says why."""
        s = self.app.session
        every = bool(covered) and covered >= {x.url for x in s.servers}
        key = (on, every, "" if on else next(
            (f.off for f in self.plugin_frames if f.off),
            s.plugin.status(s.servers[0].url) if s.servers else "no plugin records"))
        if key == self._plugin_shown:
            return
        self._plugin_shown = key
        for p in self.plugin_panels:
            p.display = on
        for x in ("#a-queue", "#a-batch"):
            self.query_one(x).display = not every
        steps = self.query_one("#a-steps", Static)
        steps.display = not on
        if not on:
            steps.update(f" ▍Step waveform  ⊘ {key[2]} — {NO_STEPS}")  # why first: it is cut

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
