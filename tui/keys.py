"""Every key of the dashboard, in one table: the bindings and the help screen both read it."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    keys: str        # Textual key names, comma-separated
    shown: str       # how the help screen and footer print it
    action: str
    help: str
    group: str
    short: str = ""  # footer label; empty = not in the footer


KEYS: tuple[Key, ...] = (
    Key("m", "m", "toggle_mode", "switch mode: continuous (prefill-first) ↔ chunked (decode-first)",
        "scheduler", "mode"),
    Key("plus,equals_sign", "+", "knob_step('max_num_batched_tokens', 1)",
        "token budget ×2 (max_num_batched_tokens)", "scheduler", "budget×2"),
    Key("minus", "-", "knob_step('max_num_batched_tokens', -1)", "token budget ÷2", "scheduler",
        "budget÷2"),
    Key("right_square_bracket", "]", "knob_step('long_prefill_token_threshold', 1)",
        "chunk size ×2 (long_prefill_token_threshold; reaching the budget turns it off)",
        "scheduler", "chunk×2"),
    Key("left_square_bracket", "[", "knob_step('long_prefill_token_threshold', -1)",
        "chunk size ÷2 (from off: half the budget)", "scheduler", "chunk÷2"),
    Key("right_curly_bracket", "}", "knob_step('max_num_seqs', 1)",
        "max_num_seqs ×2 (running requests cap)", "scheduler"),
    Key("left_curly_bracket", "{", "knob_step('max_num_seqs', -1)", "max_num_seqs ÷2", "scheduler"),
    Key("right_parenthesis", ")", "knob_step('max_num_partial_prefills', 1)",
        "max_num_partial_prefills +1", "scheduler"),
    Key("left_parenthesis", "(", "knob_step('max_num_partial_prefills', -1)",
        "max_num_partial_prefills −1", "scheduler"),
    Key("b", "b", "toggle_autopilot", "autopilot on / off (--auto-budget: each step's prefill "
        "allowance from a fitted step-time model; on with the last targets, else "
        "itl_p99:50ms,ttft_p99:2s; set others in the controls or the palette: "
        "'auto itl_p99:100ms,ttft_p99:3s', 'auto off')", "scheduler"),
    Key("greater_than_sign", ">", "rate_step(1)", "load rate ×1.25 (req/s, or trace speed)",
        "load", "rate↑"),
    Key("less_than_sign", "<", "rate_step(-1)", "load rate ÷1.25", "load", "rate↓"),
    Key("p", "p", "toggle_load", "pause / resume the load (no new arrivals)", "load", "pause"),
    Key("P", "P", "toggle_engine", "pause / resume the engine (requests wait)", "load"),
    Key("1", "1", "set_window(10)", "waveform window 10 s", "view"),
    Key("2", "2", "set_window(60)", "waveform window 60 s", "view"),
    Key("3", "3", "set_window(600)", "waveform window 10 min", "view"),
    Key("w", "w", "cycle_window", "next waveform window (10 s → 60 s → 10 min)", "view", "window"),
    Key("n", "n", "toggle_side", "hide / show numbers and controls (hidden below 120 columns: "
        "n shows them full width)", "view"),
    Key("a", "a", "ab", "live A/B: start one (A = now, B = the other mode; with two --attach: "
        "the load sent to both servers) and show it; on the A/B screen: back", "A/B", "A/B"),
    Key("x", "x", "ab_stop", "stop the A/B run (settings go back to what they were)", "A/B"),
    Key("r", "r", "ab_restart", "on the A/B screen: run the same A/B again", "A/B"),
    Key("e", "e", "export_trace", "write the session trace (or finish this part and start the "
        "next)", "session", "trace"),
    Key("s", "s", "screenshot", "save an SVG screenshot", "session", "svg"),
    Key("ctrl+p", "ctrl+p", "command_palette", "command palette: every action, and typed "
        "settings such as 'budget 512', 'rate 2', 'ab budget=2048 vs budget=512'", "session"),
    Key("tab", "tab", "focus_next", "move into the controls panel (Enter applies, Esc leaves)",
        "session"),
    Key("question_mark", "?", "help", "this help", "session", "help"),
    Key("q", "q", "quit", "quit: stop load, engine and samplers, finish the trace", "session",
        "quit"),
)


def bindings() -> list[Binding]:
    """App bindings from :data:`KEYS` (tab and the palette are Textual's own)."""
    out = []
    for k in KEYS:
        if k.action in ("focus_next", "command_palette", "ab_restart"):  # Textual's / the A/B screen's
            continue
        out.append(Binding(k.keys, k.action, k.short or k.help[:24], show=bool(k.short),
                           key_display=k.shown))
    return out
