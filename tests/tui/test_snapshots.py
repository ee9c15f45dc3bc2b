"""SVG snapshots of the dashboard over a static session (synthetic timeline, fake clock, fake GPU
samples), so that the pictures depend on the code only. Update with --snapshot-update after
looking at the new SVGs."""

import pytest
from tui_fakes import StaticSession, settle

from gpuchef.tui.app import GpuchefApp

SIZE = (160, 48)
#: the widths the legends and the header must fit whole (tests/tui/test_screen_traps.py checks
#: the same sizes for cut text)
WIDTHS = [(120, 40), (160, 48), (200, 60)]


async def settle_long(pilot):
    await settle(pilot)
    await pilot.press("a")
    await settle(pilot, min_ticks=8)


def app(session, window_s=60.0):
    return GpuchefApp(session, window_s=window_s, show_ui_cost=False)


def test_main_screen_gpu(snap_compare):
    assert snap_compare(app(StaticSession(gpu=True)), terminal_size=SIZE, run_before=settle)


def test_main_screen_cpu_without_nvml(snap_compare):
    assert snap_compare(app(StaticSession(gpu=False)), terminal_size=SIZE, run_before=settle)


def test_main_screen_10s_window(snap_compare):
    assert snap_compare(app(StaticSession(gpu=True), window_s=10.0), terminal_size=SIZE,
                        run_before=settle)


def test_ab_screen(snap_compare):
    s = StaticSession(gpu=True, seconds=85, ab_window_s=10)
    assert snap_compare(app(s), terminal_size=SIZE, run_before=settle_long)


def test_help_screen(snap_compare):
    assert snap_compare(app(StaticSession(gpu=False)), press=["question_mark"],
                        terminal_size=SIZE, run_before=settle)


@pytest.mark.parametrize("size", WIDTHS, ids=[f"{w}x{h}" for w, h in WIDTHS])
def test_main_screen_cpu_at_width(snap_compare, size):
    """The CPU session (the longest header: its note) at each width: every legend entry and
    header item whole, the readouts' windows said."""
    assert snap_compare(app(StaticSession(gpu=False)), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", WIDTHS, ids=[f"{w}x{h}" for w, h in WIDTHS])
def test_main_screen_serve_http_load_at_width(snap_compare, size):
    """`top --serve` driven over HTTP, the internal load paused: the header shows both loads."""
    assert snap_compare(app(StaticSession(gpu=True, http=True)), terminal_size=size,
                        run_before=settle)
