"""Keys pressed faster than the engine confirms them: every press counts, in order.

The engine applies a change between steps and its config reaches the dashboard later still (it
runs in a process of its own), so ``+++`` read the old budget three times and doubled it once,
and ``mm`` switched the mode once. Here the session's config moves only when the test says the
engine applied what was sent (``LaggingSession.apply``)."""

from __future__ import annotations

import asyncio

from tui_fakes import StaticSession, settle

from gpuchef.engine_host.vocab.config import parse_value
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.requested import Requested

SIZE = (160, 48)


class LaggingSession(StaticSession):
    """A session whose engine applies the changes sent only when ``apply`` is called (one per
    engine step, in order), as an engine in another process does a step or more later."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.queued: list[tuple[str, object]] = []
        self.engine_paused = False
        self.pause_calls: list[bool] = []

    def set_knob(self, name, value):
        v = parse_value(name, value)
        self.knob_calls.append((name, v))
        self.queued.append((name, v))
        return v

    def pause_engine(self, paused: bool) -> None:
        self.pause_calls.append(paused)
        self.queued.append(("engine_paused", paused))

    def apply(self, n: int | None = None) -> None:
        """The engine takes the first ``n`` changes sent (all when None)."""
        n = len(self.queued) if n is None else n
        for name, v in self.queued[:n]:
            if name == "engine_paused":
                self.engine_paused = v
            else:
                self._cfg = self._cfg.with_changes(**{name: v})
        del self.queued[:n]


def drive(session, body):
    app = GpuchefApp(session, show_ui_cost=False)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await body(pilot, app)

    asyncio.run(go())


def test_a_burst_of_plus_doubles_the_budget_once_per_press():
    s = LaggingSession()
    start = s.scheduler_config.max_num_batched_tokens

    async def body(pilot, app):
        await pilot.press("+", "+", "+")
        assert s.scheduler_config.max_num_batched_tokens == start  # nothing applied yet
        assert s.knob_calls == [("max_num_batched_tokens", start * 2),
                                ("max_num_batched_tokens", start * 4),
                                ("max_num_batched_tokens", start * 8)]
        assert app.requested_config.max_num_batched_tokens == start * 8

    drive(s, body)


def test_m_twice_switches_the_mode_there_and_back():
    s = LaggingSession()
    start = s.scheduler_config.mode
    other = "continuous" if start == "chunked" else "chunked"

    async def body(pilot, app):
        await pilot.press("m", "m")
        assert s.knob_calls == [("mode", other), ("mode", start)]
        s.apply()
        await pilot.pause(0.3)
        assert s.scheduler_config.mode == start and app.requested_config.mode == start

    drive(s, body)


def test_b_and_capital_p_twice_toggle_twice():
    s = LaggingSession()

    async def body(pilot, app):
        await pilot.press("b", "b")
        assert s.knob_calls == [("auto_budget", "itl_p99:50ms,ttft_p99:2000ms"),
                                ("auto_budget", "")]
        await pilot.press("P", "P")
        assert s.pause_calls == [True, False]

    drive(s, body)


def test_a_key_steps_from_what_was_asked_while_the_engine_passes_through_older_values():
    """``+`` then ``-`` from 1024: the engine's 1024 is already what ``-`` asked for, then it
    takes 2048 (the ``+``) for a step; a ``+`` pressed then steps from 1024, not 2048. Once
    the engine has caught up, its own value counts again (a change made elsewhere)."""
    s = LaggingSession()
    start = s.scheduler_config.max_num_batched_tokens

    async def body(pilot, app):
        await pilot.press("+", "-")
        s.apply(1)  # the engine runs a step with the `+`'s 2048
        await pilot.pause(0.3)  # refresh ticks look at the engine's config
        await pilot.press("+")
        assert [v for _, v in s.knob_calls] == [start * 2, start, start * 2]
        s.apply()  # the rest in one step: the engine's value goes 2048 → 2048, unseen
        await pilot.pause(0.3)
        s._cfg = s._cfg.with_changes(max_num_batched_tokens=512)  # e.g. the HTTP knob endpoint
        await pilot.press("+")
        assert s.knob_calls[-1] == ("max_num_batched_tokens", 1024)

    drive(s, body)


def test_a_value_the_engine_never_shows_stops_counting_after_the_ttl():
    now = [0.0]
    r = Requested(ttl_s=5.0, clock=lambda: now[0])
    r.sent("max_num_batched_tokens", 2048, 1024)
    assert r.get("max_num_batched_tokens", 1024) == 2048
    now[0] = 4.9
    assert r.get("max_num_batched_tokens", 1024) == 2048
    now[0] = 5.1  # refused by the engine, or hidden by a change from elsewhere
    assert r.get("max_num_batched_tokens", 1024) == 1024
    assert not r
