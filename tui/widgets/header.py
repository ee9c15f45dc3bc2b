"""The header: what runs (model, engine and tensor-parallel size, the GPUs or device, attention),
how it is scheduled (sync or async, the mode and the knobs in force), what load drives it — what
arrives per second from each source, labelled with its window, beside the trace's mean — for how
long, and where the trace goes.

Its two logical lines (the engine, the load) are made of items that are never split: at a given
width an item that does not fit on the line starts the next one (:func:`flow`), so at 120, 160
or 200 columns every item shows whole. ``SessionHeader`` shows at most ``max_lines`` such lines
(a narrow terminal's 2: each logical line's first, ending in "…" where items are left out),
plus a line for each failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from gpuchef.engine_host.vocab.config import KNOBS, SchedulerConfig

from .. import theme
from ..arrivals import Arrivals, fmt_rate
from ..session import ABState, LoadState, SessionInfo


@dataclass(frozen=True)
class HeaderState:
    """Everything the header shows; the widget redraws only when this changes. ``arrivals``:
    what arrives at the engine (tui/arrivals.py; None: not measured, e.g. a replay)."""

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
    arrivals: Arrivals | None = None


def _fmt_elapsed(s: int) -> str:
    h, r = divmod(max(0, s), 3600)
    m, sec = divmod(r, 60)
    return f"{h:d}:{m:02d}:{sec:02d}"


#: An item of a header line: (separator before it, its text). The separator is dropped when the
#: item starts a line.
Item = tuple[str, Text]


def _item(sep: str, *parts: tuple[str, str]) -> Item:
    t = Text()
    for text, style in parts:
        t.append(text, style=style)
    return sep, t


def engine_items(st: HeaderState) -> list[Item]:
    """The first logical line: what runs and how it is scheduled."""
    i, c = st.info, st.config
    bold = f"bold {theme.TITLE}"
    out = [_item("", (f" {i.title} ", f"bold {theme.PANEL_BG} on {theme.MIXED}"))]
    model = [(i.model, bold)]
    if i.random_weights:
        model.append((" (random weights)", theme.WAITING))
    out.append(_item("  ", *model))
    if i.engine:
        out.append(_item("  ", (f"{i.engine} TP {i.tensor_parallel_size}", bold)))
    dev = (f"GPU{'s' if len(i.gpus) > 1 else ''} {','.join(i.gpus)}" if i.gpus else i.device)
    out.append(_item("  ", (dev, theme.TITLE), *([(f" {i.dtype}", theme.LABEL)] if i.dtype
                                                  else [])))
    out.append(_item("  ", (f"attention {i.attention}", theme.LABEL)))
    if i.async_scheduling is not None:
        out.append(_item("  ", ("async" if i.async_scheduling else "sync", theme.LABEL)))
    mode_bg = theme.MODE_COLOURS.get(c.mode, theme.TITLE)
    out.append(_item("   ", ("mode ", theme.LABEL),
                     (f" {c.mode} ", f"bold {theme.PANEL_BG} on {mode_bg}")))
    chunk = "off" if c.long_prefill_token_threshold == 0 else str(c.long_prefill_token_threshold)
    for name, val in (("max_num_batched_tokens", c.max_num_batched_tokens),
                      ("long_prefill_token_threshold", chunk), ("max_num_seqs", c.max_num_seqs),
                      ("max_num_partial_prefills", c.max_num_partial_prefills)):
        out.append(_item("  ", (f"{KNOBS[name].label} ", theme.LABEL), (str(val), bold)))
    return out


def load_items(st: HeaderState) -> list[Item]:
    """The second logical line: the load — gpuchef's own (its setting, what arrived over the
    last window, the trace's mean) and, under `top --serve` or once any came, the HTTP
    requests (what arrived, how many are in flight) — then elapsed time, trace, A/B, notes."""
    i, ld, a = st.info, st.load, st.arrivals
    bold = f"bold {theme.TITLE}"
    http = a is not None and (bool(i.serving) or a.http_seen)
    out = [_item(" ", ("internal load " if http else "load ", theme.LABEL),
                 (ld.describe(), f"bold {theme.WAITING if ld.paused else theme.TITLE}"))]
    if a is not None and ld.kind != "none":
        out.append(_item(" · ", ("arriving ", theme.LABEL),
                         (f"{fmt_rate(a.load_rate)} req/s", bold),
                         (f" ({a.span_label()})", theme.LABEL)))
    if ld.trace_mean > 0:
        out.append(_item(" · ", ("trace mean ", theme.LABEL),
                         (f"{ld.trace_mean:.1f} req/s", theme.TITLE)))
    if http:
        out.append(_item("   ", ("HTTP load ", theme.LABEL), ("arriving ", theme.LABEL),
                         (f"{fmt_rate(a.http_rate)} req/s", bold),
                         (f" ({a.span_label()})", theme.LABEL)))
        out.append(_item(" · ", (str(a.http_in_flight), bold), (" in flight", theme.LABEL)))
    out.append(_item("   ", ("elapsed ", theme.LABEL), (_fmt_elapsed(st.elapsed_s), bold)))
    out.append(_item("   ", ("trace ", theme.LABEL),
                     (st.trace or "off (e: write one)", theme.TITLE if st.trace else theme.AXIS)))
    if st.ab.active:
        colour = theme.AB_COLOURS.get(st.ab.current, theme.TITLE)
        out.append(_item("   ", ("A/B ", theme.LABEL),
                         (f" {st.ab.current}#{st.ab.index} ", f"bold {theme.PANEL_BG} on {colour}"),
                         (f" {st.ab.window_s:g} s windows", theme.LABEL)))
    if i.serving and not st.server_error:  # once it is gone the last line says so instead
        out.append(_item("   ", (f"serving {i.serving}", theme.TITLE)))
    if i.note:
        out.append(_item("   ", (i.note, theme.AXIS)))
    if st.ui_cost_pct is not None:
        out.append(_item("   ", (f"UI {st.ui_cost_pct:.1f}% of a core", theme.AXIS)))
    if st.paused_engine:
        out.append(_item("   ", ("ENGINE PAUSED", f"bold {theme.PREEMPTED}")))
    return out


def flow(items: list[Item], width: int | None, max_lines: int | None = None) -> list[Text]:
    """``items`` laid out in lines of at most ``width`` cells (None: one line): an item goes on
    the current line with its separator when it fits, else starts the next line (indented one
    cell, without its separator). An item wider than a line gets a line of its own. With
    ``max_lines``, the last line takes every item left (the widget crops it with "…")."""
    lines: list[Text] = []
    cur: Text | None = None
    for sep, body in items:
        if cur is None:  # the logical line's first item keeps its lead
            cur = Text(sep) + body
        elif (width is None or cur.cell_len + cell_len(sep) + body.cell_len <= width
              or (max_lines is not None and len(lines) + 1 >= max_lines)):
            cur.append(sep)
            cur.append_text(body)
        else:
            lines.append(cur)
            cur = Text(" ") + body
    if cur is not None:
        lines.append(cur)
    return lines


def header_lines(st: HeaderState, width: int | None = None,
                 max_lines: int | None = None) -> list[Text]:
    """The header's lines at ``width`` cells (None: the two logical lines, engine and load,
    unwrapped), then one line per failure (``ENGINE STOPPED``, ``HTTP SERVER STOPPED``).
    ``max_lines``: at most this many lines before the failures — each logical line keeps its
    first, the engine's and then the load's next ones follow in turn, and the items that find
    no line go on their logical line's last one (which the widget crops with "…")."""
    items = [engine_items(st), load_items(st)]
    need = [len(flow(it, width)) for it in items]
    quota = need
    if max_lines is not None and sum(need) > max_lines:
        quota = [1] * len(items)
        left = max(0, max_lines - len(items))
        while left and any(q < n for q, n in zip(quota, need)):
            for k, n in enumerate(need):
                if left and quota[k] < n:
                    quota[k] += 1
                    left -= 1
    red = f"bold {theme.PREEMPTED}"
    lines = [line for it, q in zip(items, quota) for line in flow(it, width, q)]
    if st.engine_error:
        lines.append(Text(f" ENGINE STOPPED: {st.engine_error}", style=red))
    if st.server_error:
        lines.append(Text(f" HTTP SERVER STOPPED: {st.server_error}", style=red))
    return lines


def header_text(st: HeaderState, width: int | None = None,
                max_lines: int | None = None) -> Text:
    """The header as one Text, lines joined (see :func:`header_lines`)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    for k, line in enumerate(header_lines(st, width, max_lines)):
        if k:
            t.append("\n")
        t.append_text(line)
    return t


class SessionHeader(Static):
    """The header at the width it is given: as many lines as its items need, at most
    ``max_lines`` (see :func:`header_lines` for what gives way), plus one per failure.
    ``lines``: how many it shows now (the main screen lays its charts out around it)."""

    DEFAULT_CSS = """
    SessionHeader { height: 2; background: #1b2130; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, max_lines: int = 6, **kw) -> None:
        super().__init__("", **kw)
        self._state: HeaderState | None = None
        self._width = 0
        self.max_lines = max_lines
        self.lines = 2

    def wanted_lines(self, st: HeaderState | None = None, width: int | None = None) -> int:
        """Lines the header takes for ``st`` at ``width`` (default: the ones shown / its own)."""
        st = st or self._state
        if st is None:
            return self.lines
        return len(header_lines(st, max(1, width or self._own_width()), self.max_lines))

    def _own_width(self) -> int:
        return self.size.width or self.app.size.width

    def show(self, st: HeaderState, force: bool = False) -> None:
        """Redraw if anything shown (or the width) changed; relayout only if the line count
        did."""
        width = self._own_width()
        if st == self._state and width == self._width and not force:
            return
        self._state, self._width = st, width
        text = header_text(st, max(1, width), self.max_lines)
        lines = text.plain.count("\n") + 1
        if lines != self.lines:
            self.lines = lines
            self.styles.height = lines
            self.update(text)
        else:
            self.update(text, layout=False)

    def on_resize(self) -> None:
        if self._state is not None:
            self.show(self._state, force=True)
