"""The command palette (ctrl+p): every dashboard action, plus settings typed as text.

Typed forms (any spelling ``engine_host.vocab.config.setting_name`` takes: short names, vLLM knob names
or flags; values as in the controls panel):

* ``budget 512`` / ``max_num_batched_tokens 512``, ``chunk 256``, ``seqs 64``, ``partial 2``,
  ``long-partial 1``, ``mode continuous``
* ``auto itl_p99:50ms,ttft_p99:2s`` / ``autopilot itl_p99:50ms`` / ``auto off`` (the autopilot's
  targets, ``--auto-budget``'s form)
* ``rate 3`` (req/s, or × for a trace)
* ``window 60`` (seconds of waveform)
* ``ab mode=chunked vs mode=continuous``, ``ab budget=2048 vs budget=512 window=20``,
  ``ab budget=1024 vs auto=itl_p99:50ms,ttft_p99:2s`` (the autopilot's targets keep their comma)

A typed command is previewed by the same checks Enter runs (``GpuchefApp.check_rate``,
``check_knob``, ``parse_auto_budget``, ``parse_ab``, the window's range): a value that Enter would
refuse shows that refusal in the palette ("⚠ …"); choosing it shows the message and changes
nothing.
"""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Any

from textual.command import DiscoveryHit, Hit, Hits, Provider

from gpuchef.engine_host.vocab.config import (AUTO_BUDGET, KNOBS, parse_auto_budget, parse_settings,
                                              setting_name)
from gpuchef.engine_host.vocab.errors import ConfigError

from .screens.ab import describe_setting  # one formatter of an A/B setting

def parse_setting(text: str) -> dict[str, Any]:
    """``"mode=continuous, budget=512"`` → ``{"mode": "continuous", "max_num_batched_tokens":
    512}`` (engine_host.vocab.config.parse_settings, the one grammar). Raises ConfigError naming a bad
    pair, knob or value, or a setting that names no knob."""
    out = parse_settings(text)
    if not out:
        raise ConfigError("an A/B setting names no knob (e.g. mode=continuous)")
    return out


def parse_ab(text: str) -> tuple[dict[str, Any], dict[str, Any], float | None]:
    """``"mode=chunked vs mode=continuous window=20"`` → (A, B, window_s or None)."""
    window = None
    # "window=20", "window = 20s", "window=20 s", "window=20," (then more pairs)
    m = re.search(r"\bwindow\s*=\s*([^\s,]*)(?:\s*s\b)?\s*,?", text)
    if m:
        raw = m.group(1)
        try:
            window = float(raw[:-1] if raw.endswith("s") else raw)
        except ValueError:
            window = math.nan
        if not math.isfinite(window):
            raise ConfigError(f"A/B window {raw!r} is not a number of seconds (e.g. window=20)")
        text = text[:m.start()] + " " + text[m.end():]
        if re.search(r"\bwindow\s*=", text):
            raise ConfigError("the A/B window is given twice: give one window=SECONDS")
    if " vs " not in f" {text} ":
        raise ConfigError("write the A/B as 'ab SETTING vs SETTING', e.g. "
                          "'ab mode=chunked vs mode=continuous'")
    a, _, b = text.partition(" vs ")
    return parse_setting(a), parse_setting(b), window


#: Score of a typed command that parsed (Textual's fuzzy scores run above 1): shown alone. A
#: typed command that did not parse scores 1.0 and the fuzzy look-alikes follow it.
TYPED_EXCLUSIVE = 1000.0


class DashboardCommands(Provider):
    """Palette hits for the dashboard's actions and typed settings."""

    def _actions(self) -> list[tuple[str, Any, str]]:
        app = self.app
        s = app.session
        cfg = s.scheduler_config
        want = app.requested_config  # what `m`, `b` and `a` start from: changes sent count
        other = "continuous" if want.mode == "chunked" else "chunked"
        load = s.load.state()
        auto = want.auto_budget
        acts = [
            (f"Switch mode to {other}", partial(app.request_knob, "mode", other),
             "continuous = prefill-first whole prompts; chunked = decode-first, token budget"),
            ((f"Turn autopilot off (now {auto})" if auto else
              f"Turn autopilot on ({app.auto_budget_targets})"), app.action_toggle_autopilot,
             "b; other targets: type 'auto itl_p99:50ms,ttft_p99:2s' or 'auto off'"),
            ("Resume load" if load.paused else "Pause load", app.action_toggle_load,
             "stop or restart new arrivals"),
            ("Resume engine" if app.requested_engine_paused else "Pause engine",
             app.action_toggle_engine, "stop stepping; queued requests wait"),
            (f"Start A/B: mode={want.mode} vs mode={other}", app.action_ab,
             f"windows of {app.ab_window_s:g} s; or type 'ab budget=2048 vs budget=512'"),
            ("Stop A/B", app.action_ab_stop, "settings go back to what they were"),
            ("Show A/B screen", app.show_ab, "the A/B side by side"),
            ("Waveform window 10 s", partial(app.action_set_window, 10), ""),
            ("Waveform window 60 s", partial(app.action_set_window, 60), ""),
            ("Waveform window 10 min", partial(app.action_set_window, 600), ""),
            ("Write / rotate the session trace", app.action_export_trace,
             s.trace_path or "no trace yet: writes what the timeline holds, then records"),
            ("Save SVG screenshot", app.action_screenshot, ""),
            ("Help: keys and panels", app.action_help, ""),
        ]
        for name, spec in KNOBS.items():
            short = spec.short
            acts.append((f"Set {name} ({short}) — type '{short} N'",
                         partial(app.notify, f"type '{short} N' in the palette, e.g. "
                                 f"'{short} {getattr(cfg, name)}'; allowed [{spec.lo}, {spec.hi}]"),
                         f"now {getattr(cfg, name)}; {spec.help}"))
        unit = "req/s" if load.kind == "random" else "× trace speed"
        acts.append((f"Set load rate — type 'rate N' ({unit})",
                     partial(app.notify, f"type 'rate N' in the palette ({unit}); now {load.rate:g}"),
                     f"now {load.rate:g} {unit}"))
        return acts

    async def discover(self) -> Hits:
        for text, cb, help_ in self._actions():
            yield DiscoveryHit(text, cb, help=help_ or None)

    async def search(self, query: str) -> Hits:
        q = query.strip()
        typed = self._typed(q)
        if typed is not None:
            yield typed
            if typed.score >= TYPED_EXCLUSIVE:  # a command that parsed is what was meant: no
                return                          # look-alikes ("window 5" vs "Waveform window 10 s")
        matcher = self.matcher(q)
        words = [w for w in (_squash(x) for x in q.split()) if w]
        found = typed is not None
        for text, cb, help_ in self._actions():
            # every typed word must appear in the action: Textual's fuzzy score alone matched
            # "foo" to "Waveform window 10 s" (f…o…o), and Enter ran it
            if not all(w in _squash(text) for w in words):
                continue
            score = matcher.match(text)
            if score > 0:
                found = True
                yield Hit(score * 0.9, matcher.highlight(text), cb, text=text, help=help_ or None)
        if not found and q:
            msg = (f"no command {q!r}: type a word of an action (mode, pause, window, trace, "
                   "help, …) or a setting: 'budget 512', 'rate 2', "
                   "'ab mode=chunked vs mode=continuous'")
            yield Hit(0.5, f"⚠ {msg}", partial(self.app.notify, msg, severity="warning",
                                              title="palette"), text=q)

    def _typed(self, q: str) -> Hit | None:
        app = self.app
        words = q.split(None, 1)
        if len(words) != 2:
            return None
        head, rest = words[0].lower(), words[1].strip()
        if head == "ab":
            try:
                a, b, window = parse_ab(rest)
            except ConfigError as e:
                return Hit(1.0, f"A/B: {e}", partial(app.notify, str(e), severity="error"),
                           text=f"ab {rest}")
            w = app.ab_window_s if window is None else window
            return Hit(TYPED_EXCLUSIVE, f"Start A/B: {describe_setting(a)} vs "
                       f"{describe_setting(b)}, windows of {w:g} s",
                       partial(app.start_ab, a, b, w), text=f"ab {rest}")
        name = setting_name(head)
        if name == AUTO_BUDGET:
            try:
                app.check_knob(AUTO_BUDGET, rest)
                spec = parse_auto_budget(rest)
            except ConfigError as e:
                return Hit(1.0, f"⚠ {e}", partial(app.notify, str(e), severity="error",
                                                   title="refused"), text=f"{head} {rest}")
            what = f"Autopilot on: {spec.canonical}" if spec else "Autopilot off (static budget)"
            return Hit(TYPED_EXCLUSIVE, what, partial(app.request_knob, AUTO_BUDGET, rest),
                       text=f"{head} {rest}", help="in force from the engine's next step")
        if head == "rate":
            try:
                v, unit = app.check_rate(rest)
            except ConfigError as e:
                return Hit(1.0, f"⚠ {e}", partial(app.notify, str(e), severity="error",
                                                   title="refused"), text=f"rate {rest}")
            shown = f"{v:g} req/s" if unit == "req/s" else f"×{v:g} (trace speed)"
            return Hit(TYPED_EXCLUSIVE, f"Set load rate to {shown}",
                       partial(app.request_rate, rest), text=f"rate {rest}")
        if head == "window":
            try:
                w = float(rest.rstrip("s"))
            except ValueError:
                return None
            if not 1 <= w <= 3600:  # the same range as action_set_window
                msg = f"waveform window {w:g} s is out of range: allowed [1, 3600] s"
                return Hit(TYPED_EXCLUSIVE, f"⚠ {msg}", partial(app.notify, msg,
                           severity="error", title="refused"), text=f"window {rest}")
            return Hit(TYPED_EXCLUSIVE, f"Waveform window {w:g} s",
                       partial(app.action_set_window, w), text=f"window {rest}")
        if name is None:
            return None
        try:
            v = app.check_knob(name, rest)
        except ConfigError as e:
            return Hit(1.0, f"⚠ {e}", partial(app.notify, str(e), severity="error",
                                               title="refused"), text=f"{head} {rest}")
        return Hit(TYPED_EXCLUSIVE, f"Set {name} = {v}", partial(app.request_knob, name, rest),
                   text=f"{head} {rest}", help="in force from the engine's next step")


def _squash(text: str) -> str:
    """Lower case, letters and digits only: 'A/B' and 'ab' match."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


__all__ = ["DashboardCommands", "parse_ab", "parse_setting"]
