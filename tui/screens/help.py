"""The help screen (`?`): every key, the colours, and what each panel shows."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .. import theme
from ..keys import KEYS

PANELS = (
    ("header", "what runs and the knobs in force; the load: 'arriving' is what arrived per "
     "second over the numbers' window (its span said), 'trace mean' the whole trace's mean at "
     "the current speed (a trace's first minutes can arrive far below it); under --serve the "
     "HTTP load too (ids http-N: arriving, in flight)."),
    ("GPU saturation", "NVML/GPM SM active and tensor active (saturation); GPU-Util is NVML's "
     "'any kernel running' (liveness: one tiny kernel reads 100 %)."),
    ("DRAM bandwidth, power", "GPM DRAM bandwidth (% of peak); board power (W, NVML, a 1 s mean "
     "on Ampere and newer)."),
    ("Step waveform", "per time slice, the share of time the engine computed (step wall spans and "
     "gpu_ms), coloured by step kind: prefill-only, mixed, decode-only. Continuous batching shows "
     "prefill bursts and decode stretches (|*****____|); chunked prefill a steady mixed batch. "
     "Its busy and steps/s readouts are over the newest ~2 s of complete slices (the title row "
     "says how long); the numbers' are over their window."),
    ("Batch composition", "tokens of the largest step ending in each slice (a real step, not a "
     "mean), prefill under decode, against the token budget (╌). ▲ marks a step above the "
     "budget: continuous batching runs a prompt longer than the budget alone, whole. With the "
     "autopilot on (b), ━ is the prefill allowance it gave that step (StepRecord "
     "prefill_allowance) and 'allow' the newest step's."),
    ("Autopilot step time", "shown while the autopilot is on: each slice's actual step time "
     "(bars, mean wall_ms of the steps ending there) under its model's prediction for the same "
     "steps (━, predicted_ms), its ITL target ╌; the title says its status — steering "
     "(fitted, err = its tracked mean relative error), learning (not fitted: 1/8–1/2 of the budget), "
     "infeasible (its decodes alone are predicted over the ITL target: the static budget, for "
     "TTFT) or fallback (while the error is over 50 %, until ≤ 30 %: a share of the budget that the measured ITL alone sets)."),
    ("Queue and KV cache", "running and waiting requests after the last step (held between "
     "steps; arrivals since the newest step count as waiting), preemptions (×), KV blocks in "
     "use. A readout older than 1 s says its age."),
    ("time axis", "mode in force (▀ amber continuous, violet chunked; a switch shows at once), "
     "every change marked (┃ and ▲label) at the step where it took effect — labels whole, "
     "the ones with no room counted as +N; ticks count back from now."),
    ("Numbers", "vllm bench serve's definitions over the last N s: TTFT, TPOT, ITL (one per "
     "output chunk), E2EL, "
     "throughput, goodput against the SLOs (--goodput), steps/s, tokens per step."),
)


#: How to leave the help, on its frame (always in sight, however far it is scrolled) and on its
#: first line
CLOSE_HINT = "Esc closes (or ? or q) · ↑↓ PgUp PgDn scroll"


class HelpScreen(ModalScreen):
    # the app sets AUTO_FOCUS = None (keys drive the dashboard); here the text takes focus, so
    # that ↑↓, PgUp/PgDn, Home/End scroll it without a Tab first
    AUTO_FOCUS = "VerticalScroll"
    BINDINGS = [("escape,question_mark,q", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        scroll = VerticalScroll()
        scroll.border_title = "help"
        scroll.border_subtitle = CLOSE_HINT
        with scroll:
            yield Static(self._content())

    @staticmethod
    def _content() -> Table:
        t = Table.grid(padding=(0, 2))
        t.add_column(no_wrap=True, style=f"bold {theme.WAITING}")
        t.add_column(style=theme.TITLE)
        t.add_row(Text("gpuchef top — keys", style=f"bold {theme.MIXED}"),
                  Text(CLOSE_HINT, style=f"bold {theme.WAITING}"))
        group = None
        for k in KEYS:
            if k.group != group:
                group = k.group
                t.add_row(Text(group, style=f"bold {theme.LABEL}"), "")
            t.add_row(f"  {k.shown}", k.help)
        t.add_row("", "")
        legend = Text()
        for name, c in (("prefill", theme.PREFILL), ("decode", theme.DECODE),
                        ("mixed step", theme.MIXED), ("running", theme.RUNNING),
                        ("waiting", theme.WAITING), ("preempted", theme.PREEMPTED),
                        ("KV", theme.KV)):
            legend.append("■ ", style=c)
            legend.append(name + "   ", style=theme.TITLE)
        t.add_row(Text("colours", style=f"bold {theme.LABEL}"), legend)
        t.add_row("", "")
        t.add_row(Text("panels", style=f"bold {theme.LABEL}"), "")
        for name, text in PANELS:
            t.add_row(f"  {name}", text)
        t.add_row("", "")
        t.add_row("", Text("Bad values are refused with the allowed range; nothing else changes. "
                           "Esc or ? closes this.", style=theme.LABEL))
        return t
