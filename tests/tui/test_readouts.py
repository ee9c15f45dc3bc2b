"""Issue 15 §2: the dashboard under load says what it measured — readouts hold the last known
value and its age, arrivals during an engine pause count as waiting, the header and the mode
band show what is in force, labels stay legible, help and controls work from the keyboard, the
palette does nothing for text that is no command, and any terminal size draws. Driven with
Textual's Pilot over static sessions (fake clock; tui_fakes)."""

from __future__ import annotations

import asyncio

import pytest
from tui_fakes import T0, StaticSession, settle

from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.screens.main import MIN_H, MIN_W

S = 1_000_000_000


def run(coro):
    return asyncio.run(coro)


def make_app(session=None, **kw):
    return GpuchefApp(session or StaticSession(gpu=True), window_s=kw.pop("window_s", 60.0),
                      show_ui_cost=False, **kw)


def strips_text(panel) -> list[str]:
    return ["".join(seg.text for seg in strip) for strip in panel._strips]


# ---- any terminal size draws something or says it is too small ----------------------------
@pytest.mark.parametrize("size", [(18, 24), (17, 40), (10, 30), (160, 4), (160, 2), (1, 1)])
def test_small_terminals_draw_a_too_small_line(size):
    """18 columns crashed chart.strips (a tuple has no tolist), a resize below the gutters
    crashed TimeAxis.draw (negative width)."""
    async def go():
        app = make_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            await pilot.resize_terminal(*size)
            await settle(pilot)
            scr = app.screen
            line = scr.query_one("#too-small")
            assert scr.has_class("-tiny") and line.display
            assert f"{size[0]}×{size[1]} is too small" in str(line.render())
            await pilot.resize_terminal(160, 48)  # and back: the charts draw again
            await settle(pilot)
            assert not scr.has_class("-tiny")
            assert any("Step waveform" in t for t in strips_text(scr.query_one("#step")))
    run(go())


def test_every_panel_survives_widths_around_its_gutters():
    """Just above the screen's minimum, a panel narrower than its gutters says so."""
    async def go():
        app = make_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            for w in range(MIN_W, MIN_W + 12):
                await pilot.resize_terminal(w, MIN_H + 30)
                await settle(pilot)
                assert not app.screen.has_class("-tiny")
    run(go())
