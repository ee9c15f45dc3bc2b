"""A dashboard tick that fires while the app tears down (its screens already popped: the
interval timer races the exit) draws nothing and raises nothing — it used to raise Textual's
ScreenStackError and fail the run at exit (seen on a loaded CI machine)."""

import asyncio

from tui_fakes import StaticSession, settle

from gpuchef.tui.app import GpuchefApp


def test_a_tick_after_the_screens_are_gone_is_a_no_op():
    app = GpuchefApp(StaticSession(gpu=True), show_ui_cost=False)
    seen = {}

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            ticks = app.ticks
            app._tick()  # a live tick counts
            seen["live"] = app.ticks - ticks
        # run_test has exited: every screen is gone, as when the timer fires during teardown
        ticks = app.ticks
        app._tick()
        seen["after"] = app.ticks - ticks

    asyncio.run(go())
    assert seen == {"live": 1, "after": 0}


def test_a_tick_while_the_screen_is_being_removed_draws_nothing():
    """CI (stop 25): Textual's ``_prune`` marks every node of a screen at once and then removes
    the widgets one by one; a tick in between found ``#a-header`` gone but other children left
    and raised NoMatches out of the run. A screen marked for removal is not drawn at all."""
    app = GpuchefApp(StaticSession(gpu=True), show_ui_cost=False)
    seen = {}

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            scr = app.screen
            calls = []
            real = scr.tick
            scr.tick = lambda *a, **k: (calls.append(1), real(*a, **k))
            nodes = list(scr.walk_children(with_self=True))
            for node in nodes:  # what App._prune does first, before any widget is removed
                node._pruning = True
            ticks = app.ticks
            app._tick()
            seen["pruning"] = (len(calls), app.ticks - ticks)
            for node in nodes:
                node._pruning = False
            app._tick()
            seen["live"] = (len(calls), app.ticks - ticks)

    asyncio.run(go())
    assert seen == {"pruning": (0, 0), "live": (1, 1)}
