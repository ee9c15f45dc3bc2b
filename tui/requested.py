"""What the user has asked the engine for: the state it has in force with the changes sent but
not yet seen in force on top. The app's keys that step or toggle a value (``+``, ``]``, ``m``,
``b``, ``P``) compute the new value from here.

The engine applies a change between steps, and what it has in force reaches the dashboard later
still (the engine runs in a process of its own; an attached server's knobs come with its next
scrape). A key that read the engine's value directly read the old value again on a second press
made before then: ``+++`` doubled the budget once, ``mm`` switched the mode once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from gpuchef.engine_host.vocab.config import SchedulerConfig

#: How long a sent value stands for the value in force when the engine does not show it (s). A
#: change the engine refused in its own thread, or a later change from elsewhere (an A/B run, the
#: HTTP knob endpoint) that hides it, never shows: past this the engine's value counts again.
#: An engine applies a change before its next step, and sends what it has in force with every
#: step, so a change it took shows long before this.
PENDING_TTL_S = 5.0

_CONFIG_FIELDS = frozenset(f.name for f in fields(SchedulerConfig))


@dataclass
class _Pending:
    seen: Any                                       # the engine's value when last looked at
    values: list[Any] = field(default_factory=list)  # sent, in order, not yet seen in force
    sent_at: float = 0.0                            # clock() of the last one


class Requested:
    """Values sent to the engine by name (a ``SchedulerConfig`` field, or e.g. "engine_paused")
    and not yet seen in force. :meth:`get` and :meth:`config` give the value in force with the
    last value sent on top.

    A sent value is dropped once the engine's value is seen to change to it (the values sent
    before it go too: the engine applies them in order), when the engine's value changes from
    the last value sent to one never sent (a change from elsewhere, after them), or ``ttl_s``
    after the last one sent for that name. The engine's value is compared with what it was
    when last looked at, not only with the value sent: after ``+`` then ``-`` from a budget of
    1024 the engine's budget is already 1024, the value ``-`` asked for, before either change is
    applied; it then passes through 2048, and a key pressed then must still step from 1024."""

    def __init__(self, ttl_s: float = PENDING_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._pending: dict[str, _Pending] = {}

    def __bool__(self) -> bool:
        return bool(self._pending)

    def sent(self, name: str, value: Any, in_force: Any) -> None:
        """``value`` (parsed, as the engine holds it) was sent for ``name``, whose value in
        force is ``in_force``."""
        p = self._pending.get(name)
        if p is None:
            p = self._pending[name] = _Pending(seen=in_force)
        p.values.append(value)
        p.sent_at = self._clock()

    def get(self, name: str, in_force: Any) -> Any:
        """The value of ``name`` as requested: the last one sent, else ``in_force``."""
        p = self._pending.get(name)
        if p is None:
            return in_force
        if in_force != p.seen:
            if in_force in p.values:
                del p.values[:p.values.index(in_force) + 1]
            elif p.seen == p.values[-1]:
                # it had the last value asked for, now one never asked for: a change from
                # elsewhere after all of these (they can be applied in one step, unseen)
                p.values.clear()
            p.seen = in_force
        if not p.values or self._clock() - p.sent_at > self.ttl_s:
            del self._pending[name]
            return in_force
        return p.values[-1]

    def config(self, in_force: SchedulerConfig) -> SchedulerConfig:
        """``in_force`` with every knob, mode or autopilot target still pending on top."""
        changes = {}
        for name in [n for n in self._pending if n in _CONFIG_FIELDS]:
            v = getattr(in_force, name)
            want = self.get(name, v)
            if want != v:
                changes[name] = want
        return in_force.with_changes(**changes) if changes else in_force

    def forget_config(self) -> None:
        """Forget the pending knobs, mode and autopilot targets (an A/B run sets them now)."""
        for name in [n for n in self._pending if n in _CONFIG_FIELDS]:
            del self._pending[name]


__all__ = ["PENDING_TTL_S", "Requested"]
