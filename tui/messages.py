"""Messages posted to the app: by the controls panel and palette (requests to change something)
and by worker threads (results of slow work). The app applies them through the session."""

from __future__ import annotations

from typing import Any

from textual.message import Message


class KnobRequest(Message):
    """Set ``name`` (a knob from ``engine_host.config.KNOBS`` or "mode") to ``value`` (as typed;
    the session validates it)."""

    def __init__(self, name: str, value: Any) -> None:
        super().__init__()
        self.name = name
        self.value = value


class RateRequest(Message):
    """Set the load's rate: req/s for random arrivals, the replay speed (×) for a trace."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class LoadToggle(Message):
    """Pause (``run`` False) or resume (True) the arrivals."""

    def __init__(self, run: bool) -> None:
        super().__init__()
        self.run = run


class TraceExported(Message):
    """A trace export/rotation finished (``ok``) or failed; ``text`` says where or why."""

    def __init__(self, text: str, ok: bool) -> None:
        super().__init__()
        self.text = text
        self.ok = ok
