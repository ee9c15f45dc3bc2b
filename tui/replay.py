"""`gpuchef replay`'s app: the live dashboard's screens over a saved trace played back
(:class:`tui.session.ReplayControl`, built by ``gpuchef/sessions/replay.py``).

Composition, not a fork: :class:`ReplayApp` is ``GpuchefApp`` with playback keys added and every
steering action refused ("replay is read-only"); :class:`ReplayScreen` is the main screen with a
status line on top (file, position / length, speed, playing or paused) and the controls panel
disabled. A seek clears the screen's incremental column caches and redraws at once, so the panels
show exactly the recorded records up to the new position.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from gpuchef.engine_host.vocab.errors import ConfigError
from . import theme
from .app import GpuchefApp
from .keys import KEYS
from .session import READ_ONLY, ReplayControl, fmt_t, parse_time
from .plotdata import GpuColumns, StepColumns
from .screens.help import CLOSE_HINT, PANELS, HelpScreen
from .screens.attach import AttachScreen
from .screens.main import MainScreen
from .widgets.controls import ControlsPanel


SEEK_S, BIG_SEEK_S = 5.0, 30.0
SEED_MARGIN_S = 5.0  # seconds of columns kept before the window after a seek


@dataclass(frozen=True)
class ReplayKey:
    keys: str    # Textual key names
    shown: str
    action: str
    help: str
    short: str = ""


REPLAY_KEYS: tuple[ReplayKey, ...] = (
    ReplayKey("space,p", "space / p", "play_pause", "play / pause", "play/pause"),
    ReplayKey("left", "←", f"seek({-SEEK_S:g})", f"back {SEEK_S:g} s", "−5s"),
    ReplayKey("right", "→", f"seek({SEEK_S:g})", f"forward {SEEK_S:g} s", "+5s"),
    ReplayKey("shift+left", "shift+←", f"seek({-BIG_SEEK_S:g})", f"back {BIG_SEEK_S:g} s"),
    ReplayKey("shift+right", "shift+→", f"seek({BIG_SEEK_S:g})", f"forward {BIG_SEEK_S:g} s"),
    ReplayKey("comma", ",", "speed(0.5)", "speed ÷2 (down to 0.25×)", "slower"),
    ReplayKey("full_stop", ".", "speed(2)", "speed ×2 (up to 16×)", "faster"),
    ReplayKey("home", "Home", "seek_edge(0)", "go to the start"),
    ReplayKey("end", "End", "seek_edge(1)", "go to the end"),
    ReplayKey("g", "g", "goto", "go to a time (seconds or mm:ss.s from the start)", "go to"),
)
VIEW_ACTIONS = ("set_window", "cycle_window", "toggle_side", "screenshot", "help", "quit")


def status_text(s: ReplayControl) -> Text:
    """"REPLAY file · t = mm:ss.s / total · speed ×N · playing" and the last step's numbers."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" REPLAY ", style=f"bold {theme.PANEL_BG} on {theme.WAITING}")
    t.append(f" {s.path}", style=f"bold {theme.TITLE}")
    t.append("  ·  t = ", style=theme.LABEL)
    t.append(f"{fmt_t(s.position_s)}", style=f"bold {theme.TITLE}")
    t.append(f" / {fmt_t(s.duration_s)}", style=theme.LABEL)
    t.append("  ·  speed ", style=theme.LABEL)
    t.append(f"×{s.speed:g}", style=f"bold {theme.TITLE}")
    t.append("  ·  ", style=theme.LABEL)
    state = "playing" if s.playing else ("paused at the end" if s.position_ns >= s.end_ns
                                         else "paused")
    t.append(state,
             style=f"bold {theme.DECODE if s.playing else theme.WAITING}")
    st = s.last_step()
    if st is not None:
        t.append(f"   step {st.step}  running {st.num_running}  waiting {st.num_waiting}  "
                 f"KV {st.kv_blocks_used}/{st.kv_blocks_total}", style=theme.LABEL)
    return t


class ReplayBar(Static):
    DEFAULT_CSS = f"ReplayBar {{ height: 1; background: {theme.PANEL_BG}; }}"

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self.plain = ""

    def show(self, s: ReplayControl) -> None:
        text = status_text(s)
        if text.plain != self.plain:
            self.plain = text.plain
            self.update(text, layout=False)


class ReplayScreen(MainScreen):
    """The main screen plus the replay status line; the controls panel is read-only."""

    def compose(self) -> ComposeResult:
        yield ReplayBar(id="replay-bar")
        yield from super().compose()

    def on_mount(self) -> None:
        # Textual then runs MainScreen.on_mount itself (handlers are dispatched along the MRO)
        self.bar = self.query_one(ReplayBar)
        controls = self.query_one(ControlsPanel)
        controls.disabled = True
        controls.border_title = "settings in force (read-only)"
        controls.fixed_load_hint = "as recorded"  # p/space: playback, not the load
        controls.query_one("#load-hint", Label).update("as recorded")
        self.seed()

    def tick(self, force: bool = False) -> None:
        super().tick(force)
        self.bar.show(self.app.session)

    def seed(self) -> None:
        """Fresh column caches holding the window before the position (plus a margin), so a
        seek in a long trace converts only what the panels can show."""
        s: ReplayControl = self.app.session
        now = s.clock()
        t0 = now - int((self.app.window_s + SEED_MARGIN_S) * 1e9)
        steps = s.timeline.snapshot(now).steps
        self.steps = StepColumns()
        self.steps.extend(steps[bisect_left(steps, t0, key=_t_end):])
        gs = s.timeline.snapshot(now).gpu_samples
        self.gpus = GpuColumns()
        self.gpus.extend(SimpleNamespace(gpu_samples=gs[bisect_left(gs, t0, key=_t):]))

    def jumped(self) -> None:
        """After a seek or a window change: new columns and a redraw now."""
        self.seed()
        if self.ready:
            self.tick(force=True)


class ReplayAttachScreen(AttachScreen):
    """An attached trace played back: the attach screen (the servers' /metrics as recorded)
    plus the replay status line."""

    def compose(self) -> ComposeResult:
        yield ReplayBar(id="replay-bar")
        yield from super().compose()

    def on_mount(self) -> None:
        self.bar = self.query_one(ReplayBar)

    def tick(self, force: bool = False) -> None:
        super().tick(force)
        self.bar.show(self.app.session)

    def jumped(self) -> None:
        """After a seek: redraw now (the frames are built from the intervals up to the
        position each tick; only the GPU columns and the plugin's rows, which are rebuilt)."""
        self.gpus = GpuColumns()
        self.plugin_view.reset()
        if self.ready:
            self.tick(force=True)


def _t_end(x) -> int:
    return x.t_end_ns


def _t(x) -> int:
    return x.t_ns


class GotoScreen(ModalScreen[str | None]):
    """Asks for a time; dismisses with the text (None: cancelled)."""

    BINDINGS = [("escape", "cancel", "cancel")]
    DEFAULT_CSS = f"""
    GotoScreen {{ align: center middle; }}
    GotoScreen > Vertical {{ width: 50; height: auto; background: {theme.PANEL_BG};
                            border: round #b56cff; padding: 0 1; }}
    """

    def __init__(self, total_s: float) -> None:
        super().__init__()
        self.total_s = total_s

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"go to (seconds or mm:ss.s, trace length {fmt_t(self.total_s)})")
            yield Input(placeholder="e.g. 42 or 1:05.5", id="goto")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, m: Input.Submitted) -> None:
        self.dismiss(m.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ReplayHelpScreen(HelpScreen):
    @staticmethod
    def _content() -> Table:
        t = Table.grid(padding=(0, 2))
        t.add_column(no_wrap=True, style=f"bold {theme.WAITING}")
        t.add_column(style=theme.TITLE)
        t.add_row(Text("gpuchef replay — keys", style=f"bold {theme.MIXED}"),
                  Text(CLOSE_HINT, style=f"bold {theme.WAITING}"))
        t.add_row(Text("playback", style=f"bold {theme.LABEL}"), "")
        for k in REPLAY_KEYS:
            t.add_row(f"  {k.shown}", k.help)
        t.add_row(Text("view", style=f"bold {theme.LABEL}"), "")
        for k in KEYS:
            if k.action.split("(")[0] in VIEW_ACTIONS:
                t.add_row(f"  {k.shown}", k.help.replace(
                    "quit: stop load, engine and samplers, finish the trace", "quit"))
        t.add_row("", "")
        t.add_row("", Text(f"{READ_ONLY}: the scheduler, load, A/B and trace keys are refused. "
                           "The panels show what was recorded up to the position; the header "
                           "shows the settings in force then.", style=theme.LABEL))
        t.add_row("", "")
        t.add_row(Text("panels", style=f"bold {theme.LABEL}"), "")
        for name, text in PANELS:
            t.add_row(f"  {name}", text)
        return t


class ReplayCommands(Provider):
    """Palette hits for playback: "seek 1:23" (or "go"/"t"), "speed 4", play/pause, start/end."""

    def _actions(self) -> list[tuple[str, object, str]]:
        app = self.app
        s = app.session
        return [("Pause replay" if s.playing else "Play replay", app.action_play_pause, "space"),
                ("Go to the start", partial(app.action_seek_edge, 0), "Home"),
                ("Go to the end", partial(app.action_seek_edge, 1), "End"),
                ("Go to a time…", app.action_goto, "or type 'seek 1:23'")]

    async def discover(self) -> Hits:
        for text, cb, help_ in self._actions():
            yield DiscoveryHit(text, cb, help=help_)

    async def search(self, query: str) -> Hits:
        typed = self._typed(query)
        if typed is not None:
            yield typed
        matcher = self.matcher(query)
        for text, cb, help_ in self._actions():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score * 0.9, matcher.highlight(text), cb, text=text, help=help_)

    def _typed(self, q: str) -> Hit | None:
        app = self.app
        word, _, rest = q.strip().partition(" ")
        word, rest = word.lower(), rest.strip()
        if not rest:
            return None
        try:
            if word in ("seek", "go", "goto", "t"):
                v = parse_time(rest)
                return Hit(1.0, f"Go to {fmt_t(v)}", partial(app.seek_to, rest), text=q)
            if word == "speed":
                v = float(rest.rstrip("x×"))
                return Hit(1.0, f"Replay speed ×{v:g}", partial(app.set_speed, v), text=q)
        except (ConfigError, ValueError) as e:
            return Hit(1.0, f"⚠ {e}", partial(app.notify, str(e), severity="error"), text=q)
        return None


class ReplayApp(GpuchefApp):
    """The dashboard over a :class:`ReplayControl` (same arguments as ``GpuchefApp``)."""

    TITLE = "gpuchef replay"
    COMMANDS = GpuchefApp.COMMANDS | {ReplayCommands}
    BINDINGS = [Binding(k.keys, k.action, k.short or k.help[:24], show=bool(k.short),
                        key_display=k.shown.split(" ")[0]) for k in REPLAY_KEYS] + [
        # the live dashboard's steering keys stay bound (they say "read-only") but leave the footer
        Binding(k.keys, k.action, k.help[:24], show=False, key_display=k.shown) for k in KEYS
        if k.short and k.action.split("(")[0] not in VIEW_ACTIONS and k.keys != "p"]

    session: ReplayControl

    def __init__(self, session: ReplayControl, *, warnings: list[str] | tuple[str, ...] = (),
                 **kw) -> None:
        super().__init__(session, **kw)
        self.warnings = list(warnings)  # what reading the trace found (shown once mounted)
        # named after the trace and the command that wrote it, as the header's first cell
        self.title = session.info.title

    def make_arrival_meter(self) -> None:
        """None: the arrival meter counts live requests (the engine's queues, the load's
        sends); a trace's position moves back and forth."""
        return None

    def on_mount(self, event) -> None:
        event.prevent_default()  # not GpuchefApp.on_mount: it would push the live main screen
        attached = not self.session.info.per_step_records  # a `top --attach` trace
        self.push_screen(ReplayAttachScreen() if attached else ReplayScreen())
        self.set_interval(1.0 / self.fps, self._tick)
        for w in self.warnings[:3]:  # the terminal's copy is hidden behind the dashboard
            self.notify(w, title="trace", severity="warning", timeout=12)
        if len(self.warnings) > 3:
            self.notify(f"… and {len(self.warnings) - 3} more (printed before the dashboard "
                        "started)", title="trace", severity="warning", timeout=12)

    # -- playback ----------------------------------------------------------------------------
    def _jumped(self) -> None:
        jumped = getattr(self.screen, "jumped", None)
        if jumped is not None:
            jumped()
        else:  # another screen on top: redraw when it closes
            for scr in self.screen_stack:
                if isinstance(scr, ReplayScreen):
                    scr.seed()

    def _show_bar(self) -> None:
        bar = getattr(self.screen, "bar", None)
        if bar is not None:
            bar.show(self.session)

    def action_play_pause(self) -> None:
        self.session.toggle()
        self._show_bar()

    def action_seek(self, seconds: float) -> None:
        self.session.step(float(seconds))
        self._jumped()

    def action_seek_edge(self, end: int) -> None:
        s = self.session
        s.seek(s.end_ns if end else s.start_ns)
        self._jumped()

    def action_speed(self, factor: float) -> None:
        s = self.session
        self.set_speed(min(16.0, max(0.25, s.speed * float(factor))))

    def set_speed(self, x: float) -> bool:
        """Playback speed (×, 0.25–16); a bad value is refused with the range."""
        try:
            v = self.session.set_speed(x)
        except ConfigError as e:
            self._refused(e)
            return False
        self.notify(f"speed ×{v:g}", timeout=2)
        self._show_bar()
        return True

    def seek_to(self, text: str) -> bool:
        """Seek to ``text`` (seconds or mm:ss.s from the start); a bad value is refused."""
        try:
            t = parse_time(text)
            self.session.seek_s(t)
        except ConfigError as e:
            self.notify(str(e), title="refused", severity="error", timeout=6)
            return False
        if t > self.session.duration_s:
            self.notify(f"time {text!r} is beyond the end of the trace "
                        f"({self.session.duration_s:.1f} s): showing the end",
                        severity="warning", timeout=6)
        self._jumped()
        return True

    def action_goto(self) -> None:
        def done(text: str | None) -> None:
            if text:
                self.seek_to(text)
        self.push_screen(GotoScreen(self.session.duration_s), done)

    # -- steering: refused ---------------------------------------------------------------------
    def _read_only(self, what: str) -> bool:
        self._refused(ConfigError(f"{READ_ONLY} ({what})"))
        return False

    def request_knob(self, name, value) -> bool:
        return self._read_only(name)

    def check_knob(self, name, value):
        raise ConfigError(f"{READ_ONLY} ({name})")

    def request_rate(self, value) -> bool:
        return self._read_only("load rate")

    def check_rate(self, value):
        raise ConfigError(f"{READ_ONLY} (load rate)")

    def action_toggle_mode(self) -> None:
        self._read_only("mode")

    def action_knob_step(self, name: str, direction: int) -> None:
        self._read_only(name)

    def action_rate_step(self, direction: int) -> None:
        self._read_only("load rate")

    def action_toggle_load(self) -> None:
        self.action_play_pause()

    def on_controls_panel_knob_request(self, m) -> None:
        m.prevent_default()  # the disabled controls only echo the recorded settings: ignore

    def on_controls_panel_rate_request(self, m) -> None:
        m.prevent_default()

    def on_controls_panel_load_toggle(self, m) -> None:
        m.prevent_default()  # GpuchefApp's handler would toggle playback

    def action_toggle_engine(self) -> None:
        self._read_only("engine")

    def start_ab(self, a, b, window_s=None, rounds=None) -> bool:
        return self._read_only("A/B")

    def show_ab(self) -> None:
        self._read_only("A/B")

    def action_ab(self) -> None:
        self._read_only("A/B")

    def action_ab_restart(self) -> None:
        self._read_only("A/B")

    def action_ab_stop(self) -> None:
        self._read_only("A/B")

    def action_export_trace(self) -> None:
        self._read_only("the trace is already saved")

    def action_set_window(self, seconds: float) -> None:
        old = self.window_s
        super().action_set_window(seconds)
        if self.window_s > old:  # the columns were seeded for the smaller window
            self._jumped()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(ReplayHelpScreen())

    async def action_quit(self) -> None:
        self.session.close()
        self.exit()
