"""Narrow and short terminals: below 120 columns the side panel (numbers, controls) hides and `n`
shows it full width; below 40 rows the charts shrink and scroll; a hint line says both. Over the
static session of test_snapshots (fake clock, fake GPU samples)."""

import asyncio

from tui_fakes import StaticSession, settle

from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.keys import KEYS
from gpuchef.tui.screens.main import SIDE_HIDDEN_HINT, SIDE_SHOWN_HINT




async def settle_side(pilot):
    await settle(pilot)
    await pilot.press("n")
    await settle(pilot)


def app(session=None):
    return GpuchefApp(session or StaticSession(gpu=True), window_s=60.0, show_ui_cost=False)


def test_main_screen_80x24(snap_compare):
    assert snap_compare(app(), terminal_size=(80, 24), run_before=settle)


def test_main_screen_80x24_side_panel(snap_compare):
    assert snap_compare(app(), terminal_size=(80, 24), run_before=settle_side)


def test_main_screen_100x30(snap_compare):
    assert snap_compare(app(), terminal_size=(100, 30), run_before=settle)


def shown(scr, sel):
    w = scr.query_one(sel)
    return w.display and w.region.width > 0 and w.region.height > 0


def test_n_toggles_the_side_panel_narrow_and_wide():
    asyncio.run(_toggles())


async def _toggles():
    assert any(k.keys == "n" and k.action == "toggle_side" for k in KEYS)  # help lists it
    a = app()
    async with a.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        scr = a.screen
        assert scr.has_class("-narrow") and scr.has_class("-short")
        assert not shown(scr, "#side") and shown(scr, "#waves") and shown(scr, "#hints")
        assert str(scr.query_one("#hint-side").render()) == SIDE_HIDDEN_HINT
        await pilot.press("n")
        await settle(pilot)
        assert shown(scr, "#side") and shown(scr, "#numbers") and not shown(scr, "#waves")
        assert scr.query_one("#side").region.width == 80  # full width
        assert str(scr.query_one("#hint-side").render()) == SIDE_SHOWN_HINT
        await pilot.press("n")
        await settle(pilot)
        assert not shown(scr, "#side") and shown(scr, "#waves")
        # wide again: the side panel is back (as at the standard sizes), no hint line
        await pilot.resize_terminal(160, 48)
        await settle(pilot)
        assert scr.has_class("-wide") and scr.has_class("-tall")
        assert shown(scr, "#side") and shown(scr, "#waves") and not shown(scr, "#hints")
        await pilot.press("n")  # on a wide terminal n hides it: the charts take the width
        await settle(pilot)
        assert not shown(scr, "#side") and scr.query_one("#waves").region.width == 160
