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


# ---- keyboard: help scrolls, the focused control shows, typing goes into it ---------------
def test_help_scrolls_with_arrows_and_page_down_without_tab():
    async def go():
        app = make_app()
        async with app.run_test(size=(130, 20)) as pilot:
            await settle(pilot)
            await pilot.press("question_mark")
            await pilot.pause(0.3)
            box = app.screen.query_one("VerticalScroll")
            assert box.max_scroll_y > 0  # the help is longer than the terminal
            await pilot.press("down")
            await pilot.pause(0.2)
            assert box.scroll_y == pytest.approx(1)
            await pilot.press("pagedown")
            await pilot.pause(0.2)
            assert box.scroll_y > 5
            await pilot.press("end")
            await pilot.pause(0.2)
            assert box.scroll_y == pytest.approx(box.max_scroll_y)
    run(go())


def _brightness(c) -> float:
    return c.brightness


def test_the_focused_control_is_clearly_visible_and_takes_what_is_typed():
    """The focused field was background 234 on 235: '-5' typed there went to the `-` key
    (budget ÷2). Focus now changes the field's background by a visible step, and a focused
    field takes '-5' as text (refused with the range on Enter, nothing else changes)."""
    async def go():
        s = StaticSession(gpu=True)
        app = make_app(s)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            inp = app.screen.query_one("#knob-max_num_batched_tokens")
            other = app.screen.query_one("#knob-max_num_seqs")
            idle = inp.styles.background
            app.set_focus(inp)
            await pilot.pause(0.2)
            assert app.focused is inp
            focused = inp.styles.background
            assert abs(_brightness(focused) - _brightness(idle)) >= 0.15, (idle, focused)
            assert other.styles.background == idle  # only the focused one is marked
            inp.value = ""
            await pilot.press("minus", "5")
            await pilot.pause(0.2)
            assert inp.value == "-5"
            assert s.knob_calls == []  # the `-` binding (budget ÷2) did not run
            assert s.scheduler_config.max_num_batched_tokens == 1024
    run(go())


# ---- the palette ---------------------------------------------------------------------------
async def _palette_hits(pilot, typed: str) -> list[str]:
    from textual.command import CommandList

    await pilot.press("ctrl+p")
    await pilot.pause(0.3)
    await pilot.press(*typed)
    await pilot.pause(0.6)
    ol = pilot.app.screen.query_one(CommandList)
    return [str(getattr(ol.get_option_at_index(i).prompt, "plain", ol.get_option_at_index(i).prompt))
            for i in range(ol.option_count)]


def _notes(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


def test_palette_text_that_is_no_command_does_nothing_and_says_so():
    """'foo' + Enter ran the fuzzy look-alike 'Waveform window 10 s'."""
    async def go():
        s = StaticSession(gpu=True)
        app = make_app(s)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            hits = await _palette_hits(pilot, "foo")
            assert len(hits) == 1 and "no command" in hits[0], hits
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert app.window_s == 60.0 and s.knob_calls == [] and not s.ab.started
            assert any("no command" in n and "'foo'" in n for n in _notes(app)), _notes(app)
            # a word of an action still finds it
            await pilot.press("escape")
            hits = await _palette_hits(pilot, "window 10")
            assert hits[0].startswith("Waveform window 10 s"), hits
    run(go())


def test_palette_ab_preview_reads_as_settings_not_python_dicts():
    async def go():
        s = StaticSession(gpu=True)
        app = make_app(s)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            hits = await _palette_hits(pilot, "ab budget=2048 vs budget=128")
            assert hits[0].startswith("Start A/B: budget=2048 vs budget=128, windows of"), hits
            assert "{" not in hits[0] and "max_num_batched_tokens" not in hits[0]
            await pilot.press("escape")
            hits = await _palette_hits(pilot, "ab mode=continuous chunk=0 vs mode=chunked")
            assert hits[0].startswith("Start A/B: mode=continuous, chunk=off vs mode=chunked"), hits
    run(go())


# ---- readouts: the last known value and its age, never an unmeasured 0 -------------------
def _last_step(s):
    return s.timeline.snapshot(s.now).steps[-1]


def test_queue_and_kv_readouts_hold_the_last_step_and_say_how_old_it_is():
    """CPU steps under overload take 1–4 s: the readouts looked back 3 columns (~1.3 s at 60 s)
    and showed 'R 0 / W 0' and '0 %' while the numbers said 73 running / 14 waiting."""
    async def go():
        s = StaticSession(gpu=True)
        last = _last_step(s)
        assert last.num_running > 0  # the toy engine's last step ran requests
        s.now = last.t_end_ns + int(3.2 * S)  # a long step in flight: nothing ended since
        app = make_app(s)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            q = strips_text(app.screen.query_one("#queue"))
            right = [t[-8:].strip() for t in q[1:]]
            assert f"R {last.num_running}" in right, right
            assert f"W {last.num_waiting}" in right, right
            assert "3.2s ago" in right, right
            kv = round(100 * last.kv_blocks_used / last.kv_blocks_total)
            assert f"{kv}%" in right, right
            # the chart holds the state too: the newest columns are not drawn as an empty queue
            frame = app.screen.query_one("#queue")._frame
            assert frame.running[-1] == last.num_running and frame.waiting[-1] == last.num_waiting
            # and the numbers panel agrees, with the age
            text = str(app.screen.query_one("#numbers").render())
            assert f"{last.num_running}" in text.split("running/waiting")[1]
            assert "3.2 s ago" in text or "3.2s ago" in text
    run(go())


def test_arrivals_while_the_engine_is_paused_count_as_waiting():
    """Paused, no step reports the queue: running/waiting froze while arrivals went on (then
    jumped to 18). Requests the load submitted since the newest step are waiting."""
    async def go():
        s = StaticSession(gpu=True)
        last = _last_step(s)
        app = make_app(s)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            s.load.submitted += 7  # seven arrivals, the engine paused: no step since
            s.now += 2 * S
            await settle(pilot)
            app.screen._last_numbers = 0.0
            app.screen.tick(force=True)
            await pilot.pause()
            right = [t[-8:].strip() for t in strips_text(app.screen.query_one("#queue"))[1:]]
            assert f"W {last.num_waiting + 7}" in right, right
            text = str(app.screen.query_one("#numbers").render())
            row = text.split("running/waiting")[1].split()
            assert row[:2] == [str(last.num_running), str(last.num_waiting + 7)], row
    run(go())
