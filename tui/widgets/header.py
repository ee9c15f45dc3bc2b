"""The header: what runs (model, engine and tensor-parallel size, the GPUs or device, attention),
how it is scheduled (sync or async, the mode and the knobs in force), what load drives it, for how long, and where
the trace goes."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from gpuchef.engine_host.config import KNOBS, SchedulerConfig

from .. import theme
from ..session import ABState, LoadState, SessionInfo


@dataclass(frozen=True)
class HeaderState:
    """Everything the header shows; the widget redraws only when this changes."""

    info: SessionInfo
    config: SchedulerConfig
    load: LoadState
    elapsed_s: int
    trace: str | None
    gpu_status: str
    ab: ABState
    ui_cost_pct: float | None = None
    engine_error: str | None = None
    paused_engine: bool = False
    server_error: str = ""  # `top --serve`: the HTTP server process is gone (its line)


def _fmt_elapsed(s: int) -> str:
    h, r = divmod(max(0, s), 3600)
    m, sec = divmod(r, 60)
    return f"{h:d}:{m:02d}:{sec:02d}"


def header_text(st: HeaderState) -> Text:
    i, c = st.info, st.config
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(" gpuchef top ", style=f"bold #11151c on {theme.MIXED}")
    t.append("  ")
    t.append(i.model, style=f"bold {theme.TITLE}")
    if i.random_weights:
        t.append(" (random weights)", style=theme.WAITING)
    if i.engine:
        t.append(f"  {i.engine}", style=f"bold {theme.TITLE}")
        t.append(f" TP {i.tensor_parallel_size}", style=f"bold {theme.TITLE}")
    if i.gpus:
        t.append(f"  GPU{'s' if len(i.gpus) > 1 else ''} {','.join(i.gpus)}", style=theme.TITLE)
    else:
        t.append(f"  {i.device}", style=theme.TITLE)
    if i.dtype:
        t.append(f" {i.dtype}", style=theme.LABEL)
    t.append(f"  attention {i.attention}", style=theme.LABEL)
    if i.async_scheduling is not None:
        t.append("  async" if i.async_scheduling else "  sync", style=theme.LABEL)
    t.append("   mode ", style=theme.LABEL)
    t.append(f" {c.mode} ", style=f"bold #11151c on {theme.MODE_COLOURS.get(c.mode, theme.TITLE)}")
    chunk = "off" if c.long_prefill_token_threshold == 0 else str(c.long_prefill_token_threshold)
    for name, val in (("max_num_batched_tokens", c.max_num_batched_tokens),
                      ("long_prefill_token_threshold", chunk), ("max_num_seqs", c.max_num_seqs),
                      ("max_num_partial_prefills", c.max_num_partial_prefills)):
        t.append(f"  {KNOBS[name].label} ", style=theme.LABEL)
        t.append(str(val), style=f"bold {theme.TITLE}")
    t.append("\n")
    t.append(" load ", style=theme.LABEL)
    t.append(st.load.describe(), style=f"bold {theme.WAITING if st.load.paused else theme.TITLE}")
    t.append("   elapsed ", style=theme.LABEL)
    t.append(_fmt_elapsed(st.elapsed_s), style=f"bold {theme.TITLE}")
    t.append("   trace ", style=theme.LABEL)
    t.append(st.trace or "off (e: write one)", style=theme.TITLE if st.trace else theme.AXIS)
    if st.ab.active:
        colour = theme.AB_COLOURS.get(st.ab.current, theme.TITLE)
        t.append("   A/B ", style=theme.LABEL)
        t.append(f" {st.ab.current}#{st.ab.index} ", style=f"bold #11151c on {colour}")
        t.append(f" {st.ab.window_s:g} s windows", style=theme.LABEL)
    if i.serving and not st.server_error:  # once it is gone the last line says so instead
        t.append(f"   serving {i.serving}", style=theme.TITLE)
    if i.note:
        t.append(f"   {i.note}", style=theme.AXIS)
    if st.ui_cost_pct is not None:
        t.append(f"   UI {st.ui_cost_pct:.1f}% of a core", style=theme.AXIS)
    if st.paused_engine:
        t.append("   ENGINE PAUSED", style=f"bold {theme.PREEMPTED}")
    if st.engine_error:
        t.append(f"\n ENGINE STOPPED: {st.engine_error}", style=f"bold {theme.PREEMPTED}")
    if st.server_error:
        t.append(f"\n HTTP SERVER STOPPED: {st.server_error}", style=f"bold {theme.PREEMPTED}")
    return t


class SessionHeader(Static):
    DEFAULT_CSS = """
    SessionHeader { height: 2; background: #1b2130; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._state: HeaderState | None = None
        self._lines = 2

    def show(self, st: HeaderState) -> None:
        """Redraw if anything shown changed; relayout only if the line count did."""
        if st == self._state:
            return
        self._state = st
        text = header_text(st)
        lines = text.plain.count("\n") + 1
        if lines != self._lines:
            self._lines = lines
            self.styles.height = lines
            self.update(text)
        else:
            self.update(text, layout=False)
