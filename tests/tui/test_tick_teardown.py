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
