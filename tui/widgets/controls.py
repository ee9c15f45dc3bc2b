"""The controls panel: mode, the four live knobs, the autopilot's targets, the load's rate and a
load switch, whose line says the load's state as the header does (``LoadState.status``).

Inputs validate as you type (the same ``parse_knob`` the engine uses, so the red mark and the
message agree); Enter sends the value. The session validates again and refuses a bad value with
a message naming the allowed range — nothing else changes. Fields show the value in force
whenever they are not being edited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.validation import ValidationResult, Validator
from textual.widgets import Input, Label, Select, Switch

from gpuchef.engine_host.vocab.config import (AUTO_BUDGET, KNOBS, MODES, SETTINGS, SchedulerConfig,
                                              parse_auto_budget, parse_knob)
from gpuchef.engine_host.vocab.errors import ConfigError

from .. import theme
from ..session import LoadState, parse_rate

#: The knobs the panel shows, in its order (labels: engine_host.vocab.config.KNOBS)
SHOWN = ("max_num_batched_tokens", "long_prefill_token_threshold", "max_num_seqs",
         "max_num_partial_prefills")


class KnobValidator(Validator):
    """Validates one knob with the engine's own ``parse_knob`` (message names the range)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.knob = name

    def validate(self, value: str) -> ValidationResult:
        try:
            parse_knob(self.knob, value)
        except ConfigError as e:
            return self.failure(str(e))
        return self.success()


class AutoBudgetValidator(Validator):
    """Validates the autopilot's targets with the engine's own ``parse_auto_budget`` ("off" or
    empty turns it off)."""

    def validate(self, value: str) -> ValidationResult:
        try:
            parse_auto_budget(value)
        except ConfigError as e:
            return self.failure(str(e))
        return self.success()


class RateValidator(Validator):
    """Validates the rate with the load's own ``parse_rate`` (req/s, or × for a trace)."""

    def __init__(self, panel: "ControlsPanel") -> None:
        super().__init__()
        self.panel = panel

    def validate(self, value: str) -> ValidationResult:
        try:
            parse_rate(value, self.panel._rate_unit)
        except ConfigError as e:
            return self.failure(str(e))
        return self.success()


class ControlsPanel(Vertical):
    # what the panel asks of the app (requests: the session validates and applies them)
    @dataclass
    class KnobRequest(Message):
        """Set ``name`` (a knob of ``engine_host.vocab.config.KNOBS``, "mode" or "auto_budget") to
        ``value`` (as typed)."""

        name: str
        value: Any

    @dataclass
    class RateRequest(Message):
        """Set the load's rate: req/s for random arrivals, the speed (×) for a trace."""

        value: Any

    @dataclass
    class LoadToggle(Message):
        """Pause (``run`` False) or resume (True) the arrivals."""

        run: bool

    DEFAULT_CSS = f"""
    ControlsPanel {{ height: auto; padding: 0 1; background: {theme.PANEL_BG}; }}
    """ + """
    ControlsPanel Horizontal { height: 1; margin: 0 0 1 0; }
    ControlsPanel Label { width: 10; color: #9aa5b8; }
    ControlsPanel Label.hint { width: 1fr; color: #6c7689; padding: 0 0 0 1; }
    ControlsPanel Input { width: 12; height: 1; border: none; padding: 0 1; }
    ControlsPanel Input.-invalid { border: none; background: #5a1a2a; }
    ControlsPanel #auto-budget { width: 1fr; }
    ControlsPanel Select { width: 18; height: 1; }
    ControlsPanel SelectCurrent { border: none; height: 1; padding: 0 1; }
    ControlsPanel Switch { height: 1; border: none; padding: 0; width: 6; }
    /* the field that takes typed keys must stand out: Textual's default focus tint was one
       grey step (234 → 235), and "-5" typed into what looked focused hit the `-` key */
    ControlsPanel Input:focus { background: #3d5a8a; color: #ffffff; text-style: bold; }
    ControlsPanel Input.-invalid:focus { background: #8a2a40; }
    ControlsPanel Select:focus > SelectCurrent { background: #3d5a8a; color: #ffffff; }
    ControlsPanel Switch:focus { background: #3d5a8a; }
    """

    def __init__(self, mode: str = "chunked", **kw) -> None:
        super().__init__(**kw)
        self.border_title = "Controls · Enter applies, Esc leaves"
        self._rate_unit = "req/s"
        self._mode = mode  # the Select starts at the mode in force: its first Changed is a no-op
        self._shown: dict = {}  # the values last written into the fields
        #: shown beside the load switch instead of the load's state ("": the state; a replay
        #: sets "as recorded")
        self.fixed_load_hint = ""
        self._load_hint = ""

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label(SETTINGS["mode"].label)
            yield Select([(m, m) for m in MODES], allow_blank=False, value=self._mode, id="mode",
                         compact=True)
        for name in SHOWN:
            spec = KNOBS[name]
            with Horizontal():
                yield Label(spec.label)
                # type="text": Textual's integer/number types drop what they cannot parse as it
                # is typed ("1e3" became 13), so the refusal could not name what was typed
                yield Input(type="text", id=f"knob-{name}", validators=[KnobValidator(name)],
                            validate_on=["changed", "submitted"], compact=True,
                            tooltip=f"{name} ({spec.flag}): {spec.help}; allowed "
                                    f"[{spec.lo}, {spec.hi}]")
                yield Label(f"[{spec.lo}, {spec.hi:,}]" if name != "long_prefill_token_threshold"
                            else "0 = budget", classes="hint")
        with Horizontal():
            yield Label(SETTINGS[AUTO_BUDGET].label)
            yield Input(type="text", id="auto-budget", validators=[AutoBudgetValidator()],
                        validate_on=["changed", "submitted"], compact=True, placeholder="off",
                        tooltip="--auto-budget: itl_p99:50ms[,ttft_p99:2s] picks each step's "
                                "prefill allowance from a fitted step-time model; off = the "
                                "static budget (b toggles)")
        with Horizontal():
            yield Label("rate")
            yield Input(type="text", id="rate", validators=[RateValidator(self)],
                        validate_on=["changed", "submitted"], compact=True,
                        tooltip="request rate (req/s) for random arrivals, or the trace replay "
                                "speed (×)")
            yield Label("req/s", classes="hint", id="rate-unit")
        with Horizontal():
            yield Label("load")
            yield Switch(value=True, id="load", animate=False)
            yield Label("", classes="hint", id="load-hint")

    # -- user input ----------------------------------------------------------------------------
    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        wid = event.input.id or ""
        if wid.startswith("knob-"):
            self.post_message(self.KnobRequest(wid[5:], event.value))
        elif wid == "auto-budget":
            self.post_message(self.KnobRequest(AUTO_BUDGET, event.value.strip() or "off"))
        elif wid == "rate":
            self.post_message(self.RateRequest(event.value))
        self.screen.set_focus(None)

    @on(Select.Changed, "#mode")
    def _mode(self, event: Select.Changed) -> None:
        event.stop()
        if event.value is not Select.BLANK:
            self.post_message(self.KnobRequest("mode", event.value))

    @on(Switch.Changed, "#load")
    def _load(self, event: Switch.Changed) -> None:
        event.stop()
        self.post_message(self.LoadToggle(event.value))

    def on_key(self, event) -> None:
        if event.key == "escape":
            event.stop()
            self.screen.set_focus(None)

    # -- show what is in force -----------------------------------------------------------------
    def sync(self, cfg: SchedulerConfig, load: LoadState, force: bool = False) -> None:
        """Show ``cfg`` and ``load``: a field is rewritten only when its value in force changed
        since the last sync (so a change the user just made is not undone before the app has
        seen it) and it is not being edited; ``force`` rewrites every field (after a refusal)."""
        focused = None if force else self.screen.focused
        shown = {"mode": cfg.mode, **{n: str(getattr(cfg, n)) for n in SHOWN},
                 "rate": f"{load.rate:g}", "load": not load.paused,
                 AUTO_BUDGET: cfg.auto_budget or "off"}
        last = {} if force else self._shown
        self._shown = shown
        changed = {k for k, v in shown.items() if last.get(k) != v}
        sel = self.query_one("#mode", Select)
        if "mode" in changed and focused is not sel and sel.value != cfg.mode:
            with self.prevent(Select.Changed):
                sel.value = cfg.mode
        for name in SHOWN:
            inp = self.query_one(f"#knob-{name}", Input)
            if name in changed and focused is not inp and inp.value != shown[name]:
                inp.value = shown[name]
        auto = self.query_one("#auto-budget", Input)
        if AUTO_BUDGET in changed and focused is not auto and auto.value != shown[AUTO_BUDGET]:
            auto.value = shown[AUTO_BUDGET]
        rate = self.query_one("#rate", Input)
        if "rate" in changed and focused is not rate and rate.value != shown["rate"]:
            rate.value = shown["rate"]
        unit = load.rate_unit
        if unit != self._rate_unit:
            self._rate_unit = unit
            self.query_one("#rate-unit", Label).update(
                "req/s" if unit == "req/s" else "× trace speed")
        sw = self.query_one("#load", Switch)
        if "load" in changed and sw.value != shown["load"]:
            with self.prevent(Switch.Changed):
                sw.value = shown["load"]
        hint = self.fixed_load_hint or load_hint(load)
        if hint != self._load_hint:
            self._load_hint = hint
            self.query_one("#load-hint", Label).update(hint)


def load_hint(load: LoadState) -> str:
    """The line beside the load switch: the state the header shows (``LoadState.status``) and
    what ``p`` does from it."""
    if load.kind == "none":
        return "not gpuchef's load"
    return {"PAUSED": "PAUSED · p resumes", "done": "done (the load ended)"}.get(
        load.status, "on · p pauses")
