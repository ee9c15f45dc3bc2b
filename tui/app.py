"""`gpuchef top`'s Textual app: screens, keys and the refresh timer; the session does the work.

One timer (``fps``, default 10) calls the visible screen's ``tick()``; screens redraw from
timeline snapshots only what changed. Every command goes through the session, which validates it
in this thread (a bad value raises ConfigError: we show its message, nothing changes) and applies
it between engine steps. A key that steps or toggles a value (``+``, ``m``, ``b``, ``P``) starts
from the value last asked for (``requested``, tui/requested.py), not from the one the engine has
confirmed, which arrives a step or more later: every press of a burst counts. ``ui_cost_pct``
is the CPU time of this (the UI) thread as a share of one core over the last ~2 s — shown in the
header, read by ``benchmarks/bench_ui.py``. ``arrivals``: what arrives at a hosted engine per
source (tui/arrivals.py), measured on every tick whatever the screen, so that no finished
request goes uncounted while a modal screen is up.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ScreenStackError
from textual.css.query import NoMatches
from textual.message import Message

from gpuchef.engine_host.vocab.config import AUTO_BUDGET, KNOBS, SchedulerConfig, parse_value
from gpuchef.engine_host.vocab.errors import ConfigError

from .ab_live import ABAnalyser
from .arrivals import ArrivalMeter, Arrivals
from .commands import DashboardCommands
from .keys import bindings
from .requested import Requested
from .session import Session, parse_rate
from .screens.ab import ABScreen
from .screens.help import HelpScreen
from .screens.main import MainScreen
from .widgets.controls import ControlsPanel

WINDOWS_S = (10.0, 60.0, 600.0)
#: The autopilot's targets when ``b`` turns it on and none were in force this session (the
#: issue's H200 targets; the controls panel or the palette's 'auto …' set others).
DEFAULT_AUTO_BUDGET = "itl_p99:50ms,ttft_p99:2s"
#: how often `top --serve` checks that its HTTP server process is alive (s), as `gpuchef serve`
FRONT_DOOR_POLL_S = 0.5
#: how often the arrival meter reads the timeline (s)
ARRIVALS_EVERY_S = 0.25


class GpuchefApp(App):
    """The dashboard over ``session``. ``window_s``: waveform window (s); ``fps``: refresh rate
    (Hz, 1–30); ``ab_window_s``: A/B window length (s); ``screenshot_dir``: where ``s`` saves;
    ``show_ui_cost``: show the UI thread's CPU share in the header. ``front_door``: `top
    --serve`'s HTTP server (a ``ServeProcess``), whose ``failure()`` is polled: when its process
    dies the dashboard says so once and in the header, and goes on (the engine, the load and the
    trace are this process's)."""

    TITLE = "gpuchef top"
    AUTO_FOCUS = None  # keys drive the dashboard until the user tabs into a field
    COMMANDS = App.COMMANDS | {DashboardCommands}
    BINDINGS = bindings()
    # the screens' layout (widgets keep their DEFAULT_CSS); absolute, because Textual reads a
    # relative CSS_PATH beside the module of the subclass (ReplayApp's, a test's)
    CSS_PATH = Path(__file__).with_name("gpuchef.tcss")

    def __init__(self, session: Session, *, window_s: float = 60.0, fps: float = 10.0,
                 ab_window_s: float = 10.0, screenshot_dir: str = ".",
                 show_ui_cost: bool = True, front_door: Any = None) -> None:
        super().__init__()
        if not 1 <= fps <= 30:
            raise ConfigError(f"refresh rate {fps!r} fps is out of range: allowed [1, 30]")
        self.session = session
        self.window_s = float(window_s)
        self.fps = float(fps)
        self.ab_window_s = float(ab_window_s)
        self.screenshot_dir = screenshot_dir
        self.ab_analyser = ABAnalyser(session.slos, session.percentiles)
        self.ui_cost_pct: float | None = None
        self.show_ui_cost = show_ui_cost  # off for snapshot tests (machine-dependent)
        self._cost_mark = (time.monotonic(), time.thread_time())
        self._error_shown = False
        self.front_door = front_door
        #: the line saying the HTTP server process is gone ("" while it serves)
        self.front_door_error = ""
        # the targets ``b`` turns the autopilot on with: the last ones in force
        self.auto_budget_targets = (session.scheduler_config.auto_budget or DEFAULT_AUTO_BUDGET)
        #: changes sent to the engine and not yet seen in force: the stepping and toggling keys
        #: compute from them, so that every press of a burst counts (``+++`` = ×8)
        self.requested = Requested()
        self.ticks = 0
        self.tick_cpu_s = 0.0
        self.arrival_meter = self.make_arrival_meter()
        #: the newest reading of ``arrival_meter`` (None: none yet, or nothing measured)
        self.arrivals: Arrivals | None = None
        self._arrivals_at = -math.inf

    def make_arrival_meter(self) -> ArrivalMeter | None:
        """What measures the arrivals over the numbers' window: a hosted engine's (its steps
        count the requests in flight); None for attached servers."""
        if not self.session.info.per_step_records:
            return None
        return ArrivalMeter(self.session.stats_window_s)

    def measure_arrivals(self) -> Arrivals | None:
        """Update :attr:`arrivals` from a snapshot taken now (see tui/arrivals.py)."""
        m = self.arrival_meter
        if m is None:
            return None
        s = self.session
        self.arrivals = m.update(s.timeline.snapshot(s.clock()), s.load.state())
        self._arrivals_at = time.monotonic()
        return self.arrivals

    def on_mount(self) -> None:
        if self.session.info.per_step_records:
            self.push_screen(MainScreen())
        else:  # a server gpuchef does not host: its picture comes from /metrics scrapes
            from .screens.attach import AttachScreen
            self.push_screen(AttachScreen())
        self.set_interval(1.0 / self.fps, self._tick)
        if self.front_door is not None:
            self.set_interval(FRONT_DOOR_POLL_S, self._watch_front_door)

    def _tick(self) -> None:
        c0 = time.thread_time()
        try:
            scr = self.screen
        except ScreenStackError:  # a tick racing the app's teardown: no screen left to draw
            return
        if not self._screen_live(scr):  # the timer racing the exit or a pop: widgets going
            return
        if time.monotonic() - self._arrivals_at >= ARRIVALS_EVERY_S - 0.01:
            self.measure_arrivals()
        if getattr(scr, "ready", False):  # set once the screen has mounted its widgets
            try:
                scr.tick()
            except NoMatches:  # a tick racing the screen's teardown at exit: nothing to draw
                if self._screen_live(scr) and scr.children:
                    raise
        if self.requested:  # read for the side effect: each look lets a change seen in force,
            # even one the engine passes through, drop its entry
            _ = self.requested_config, self.requested_engine_paused
        c1 = time.thread_time()
        self.ticks += 1
        self.tick_cpu_s += c1 - c0
        w0, t0 = self._cost_mark
        now = time.monotonic()
        if now - w0 >= 2.0 and self.show_ui_cost:
            self.ui_cost_pct = (c1 - t0) / (now - w0) * 100
            self._cost_mark = (now, c1)
        err = self.session.engine_error
        if err and not self._error_shown:
            self._error_shown = True
            self.notify(err, title="engine stopped", severity="error", timeout=30)

    def _screen_live(self, scr) -> bool:
        """False once the app shuts down (`_running` goes False first) or `scr` is being
        removed: Textual marks every node of a pruned screen (`_pruning`) at once and then
        removes its widgets one by one, so a tick in between finds some gone."""
        return self.is_running and not any(
            getattr(scr, flag, False) for flag in ("_pruning", "_closing", "_closed"))

    def _watch_front_door(self) -> None:
        """`top --serve`: notice that the HTTP server's process died (kill -9, the OOM killer).
        `gpuchef serve` exits 1 then (a supervisor restarts it); the dashboard has a user and
        an engine that still runs, so it says so and goes on (docs/serve.md)."""
        if self.front_door_error:
            return
        gone = self.front_door.failure()
        if gone:
            self.front_door_error = gone
            self.notify(f"{gone}. The engine, the internal load (p) and the trace go on here.",
                        title="HTTP server stopped", severity="error", timeout=30)

    # -- commands through the session --------------------------------------------------------------
    @property
    def requested_config(self) -> SchedulerConfig:
        """The scheduler config as requested: the engine's, with the changes sent from here and
        not yet in force on top (what the next step or toggle starts from)."""
        return self.requested.config(self.session.scheduler_config)

    @property
    def requested_engine_paused(self) -> bool:
        """Whether the engine is paused, as requested (``P``; the engine pauses between steps)."""
        return bool(self.requested.get("engine_paused", self.session.engine_paused))

    def _refused(self, e: ConfigError) -> None:
        self.notify(str(e), title="refused", severity="error", timeout=8)
        self._resync()

    def ab_busy(self) -> str:
        """Why a knob cannot be set now ("" = it can): an A/B run sets the knobs, or sends the
        load to both servers."""
        st = self.session.ab.state()
        if not st.active:
            return ""
        return ("an A/B run is sending the load to both servers: stop it first (x)" if st.load
                else "an A/B run sets the knobs now: stop it first (x)")

    def check_knob(self, name: str, value: Any) -> Any:
        """What :meth:`request_knob` would send for ``name`` = ``value``, without sending it:
        the parsed value, or ConfigError with the refusal it would show (the palette previews
        it). The session may still refuse (an engine limit), as it would after Enter."""
        reason = self.session.knobs_reason  # attached read-only, a replay
        if reason:
            raise ConfigError(reason)
        parsed = parse_value(name, value)
        busy = self.ab_busy()
        if busy:
            raise ConfigError(busy)
        return parsed

    def request_knob(self, name: str, value: Any) -> bool:
        """Send one knob, the mode or the autopilot's targets (``auto_budget``: a spec or "off")
        to the engine; show the refusal if it is bad. True if sent."""
        try:
            parsed = parse_value(name, value)
        except ConfigError as e:
            self._refused(e)
            return False
        if getattr(self.requested_config, name, None) == parsed:
            return False  # already asked for (e.g. a field re-sent as it was): nothing to do
        busy = self.ab_busy()
        if busy:
            self.notify(busy, severity="warning")
            self._resync()
            return False
        try:
            v = self.session.set_knob(name, value)
        except ConfigError as e:
            self._refused(e)
            return False
        self.requested.sent(name, v, getattr(self.session.scheduler_config, name, None))
        if name == AUTO_BUDGET:
            if v:
                self.auto_budget_targets = v
            self.notify(f"autopilot {'→ ' + v if v else 'off: the static budget'} (from the "
                        "next step)", timeout=3)
            return True
        self.notify(f"{name} → {v} (from the next step)", timeout=3)
        return True

    def _resync(self) -> None:
        resync = getattr(self.screen, "resync_controls", None)
        if resync is not None:  # fields go back to what is in force
            resync()

    def check_rate(self, value: Any) -> tuple[float, str]:
        """What :meth:`request_rate` would set, without setting it: (rate, unit — "req/s" or
        "×"), or ConfigError with the refusal it would show: a load whose rate is fixed (its
        ``REASON``), or ``parse_rate``'s (the load's own parser). The palette previews it."""
        load = self.session.load
        reason = load.REASON
        if reason:
            raise ConfigError(reason)
        unit = load.state().rate_unit
        return parse_rate(value, unit), unit

    def request_rate(self, value: Any) -> bool:
        """Set the load's rate (req/s, or × for a trace); show the refusal if it is bad. True
        if set."""
        try:
            self.check_rate(value)
            v = self.session.load.set_rate(value)
        except ConfigError as e:
            self._refused(e)
            return False
        unit = self.session.load.state().rate_unit
        self.notify(f"load rate → {v:g} {unit}", timeout=3)
        return True

    @dataclass
    class TraceExported(Message):
        """A trace export/rotation finished (``ok``) or failed; ``text`` says where or why
        (posted by the export worker thread)."""

        text: str
        ok: bool

    def on_controls_panel_knob_request(self, m: ControlsPanel.KnobRequest) -> None:
        self.request_knob(m.name, m.value)

    def on_controls_panel_rate_request(self, m: ControlsPanel.RateRequest) -> None:
        self.request_rate(m.value)

    def on_controls_panel_load_toggle(self, m: ControlsPanel.LoadToggle) -> None:
        paused = self.session.load.state().paused
        if m.run == paused:
            self.action_toggle_load()

    def on_gpuchef_app_trace_exported(self, m: GpuchefApp.TraceExported) -> None:
        self.notify(m.text, title="trace" if m.ok else "trace refused",
                    severity="information" if m.ok else "error", timeout=8)

    # -- key actions -------------------------------------------------------------------------------
    def action_toggle_mode(self) -> None:
        cur = self.requested_config.mode
        self.request_knob("mode", "continuous" if cur == "chunked" else "chunked")

    def action_toggle_autopilot(self) -> None:
        """``b``: the autopilot off, or on with the last targets in force this session."""
        on = bool(self.requested_config.auto_budget)
        self.request_knob(AUTO_BUDGET, "off" if on else self.auto_budget_targets)

    def action_knob_step(self, name: str, direction: int) -> None:
        cfg = self.requested_config
        spec = KNOBS[name]
        v = getattr(cfg, name)
        if name == "max_num_partial_prefills":
            new = v + (1 if direction > 0 else -1)
        elif name == "long_prefill_token_threshold":
            budget = cfg.max_num_batched_tokens
            eff = v if v > 0 else budget
            new = eff * 2 if direction > 0 else max(1, eff // 2)
            if direction > 0 and new >= budget:
                new = 0  # a chunk as large as the budget is no cap: off
            if direction < 0 and v == 0:
                new = max(1, budget // 2)
        else:
            new = v * 2 if direction > 0 else max(1, v // 2)
        if not spec.lo <= new <= spec.hi:
            self._refused(ConfigError(f"{name}={new} is out of range: allowed "
                                      f"[{spec.lo}, {spec.hi}]"))
            return
        if new != v:
            self.request_knob(name, new)

    def action_rate_step(self, direction: int) -> None:
        r = self.session.load.state().rate
        new = r * 1.25 if direction > 0 else r / 1.25
        new = float(f"{new:.3g}")
        self.request_rate(new)

    def action_toggle_load(self) -> None:
        load = self.session.load
        try:
            if load.state().paused:
                load.resume()
                self.notify("load resumed", timeout=3)
            else:
                load.pause()
                self.notify("load paused: no new arrivals (p resumes)", timeout=3)
        except ConfigError as e:  # a load that cannot pause (top --attach's): say why
            self._refused(e)

    def action_toggle_engine(self) -> None:
        s = self.session
        paused = self.requested_engine_paused
        try:
            s.pause_engine(not paused)
        except ConfigError as e:  # no engine of gpuchef's to pause (attached servers): say why
            self._refused(e)
            return
        self.requested.sent("engine_paused", not paused, s.engine_paused)
        self.notify("engine resumed" if paused else "engine paused: requests wait (P resumes)",
                    timeout=3)

    def action_set_window(self, seconds: float) -> None:
        try:
            w = float(seconds)
        except (TypeError, ValueError):
            w = math.nan
        if not (math.isfinite(w) and 1 <= w <= 3600):
            self._refused(ConfigError(f"waveform window {seconds!r} s is out of range: "
                                      "allowed [1, 3600] s"))
            return
        self.window_s = w
        self.notify(f"waveform window {w:g} s", timeout=2)

    def action_toggle_side(self) -> None:
        toggle = getattr(self.screen, "toggle_side", None)
        if toggle is not None:
            toggle()

    def action_cycle_window(self) -> None:
        later = [w for w in WINDOWS_S if w > self.window_s]
        self.action_set_window(later[0] if later else WINDOWS_S[0])

    def start_ab(self, a: dict, b: dict, window_s: float | None = None,
                 rounds: int | None = None) -> bool:
        try:
            self.session.ab.start(a, b, self.ab_window_s if window_s is None else window_s, rounds)
        except ConfigError as e:
            self._refused(e)
            return False
        self.requested.forget_config()  # the A/B run sets the knobs now, and restores them
        self.show_ab()
        return True

    def show_ab(self) -> None:
        if not isinstance(self.screen, ABScreen):
            self.push_screen(ABScreen())

    def action_ab(self) -> None:
        if isinstance(self.screen, ABScreen):
            self.pop_screen()
            return
        st = self.session.ab.state()
        if st.active or st.run:
            self.show_ab()
            return
        if not self.session.info.per_step_records:  # attached: two servers as they are
            self.start_ab({}, {})
            return
        cur = self.requested_config.mode
        other = "continuous" if cur == "chunked" else "chunked"
        self.start_ab({"mode": cur}, {"mode": other})

    def action_ab_restart(self) -> None:
        st = self.session.ab.state()
        if st.active:
            self.notify("the A/B run is still going (x stops it)", severity="warning")
            return
        if st.settings:
            self.start_ab(st.settings["A"], st.settings["B"], st.window_s, st.rounds)

    def action_ab_stop(self) -> None:
        if not self.session.ab.state().active:
            self.notify("no A/B run is going", timeout=3)
            return
        self._stop_ab()

    @work(thread=True, exclusive=True, group="ab")
    def _stop_ab(self) -> None:
        attached = bool(self.session.ab.state().load)  # two servers: no settings were changed
        self.session.ab.stop()
        self.call_from_thread(self.notify, "A/B stopped" if attached else
                              "A/B stopped; settings restored", timeout=4)

    def action_export_trace(self) -> None:
        self._export_trace()

    @work(thread=True, exclusive=True, group="trace", exit_on_error=False)
    def _export_trace(self) -> None:
        try:
            text = self.session.export_trace()
        except ConfigError as e:
            self.post_message(self.TraceExported(str(e), False))
        else:
            self.post_message(self.TraceExported(text, True))

    def action_screenshot(self) -> None:
        try:
            path = self.save_screenshot(path=self.screenshot_dir)
        except OSError as e:  # the folder went away or is read-only: say so, keep running
            self.notify(f"screenshot not saved: {self.screenshot_dir!r}: {e.strerror or e}",
                        title="screenshot", severity="error", timeout=8)
            return
        self.notify(f"screenshot saved: {path}", timeout=5)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self.notify("stopping load, engine and samplers; finishing the trace…", timeout=10)
        await asyncio.to_thread(self.session.close)
        self.exit()
