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
    prompts = [ol.get_option_at_index(i).prompt for i in range(ol.option_count)]
    return [str(getattr(p, "plain", p)) for p in prompts]


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


# ---- the mode band, the batch panel and the change labels ---------------------------------
def test_mode_band_shows_the_mode_switched_to_before_any_step_ran_in_it():
    """A switch in a quiet stretch (no step yet) kept the old mode's colour on the band."""
    from gpuchef.engine_host.vocab.records import EngineEvent
    from gpuchef.tui import theme

    async def go():
        s = StaticSession(gpu=True)
        last = _last_step(s)
        assert last.mode == "chunked"
        t_switch = last.t_end_ns + S
        s.timeline.add_event(EngineEvent("mode", last.step + 1, t_switch, "mode", "chunked",
                                         "continuous"))
        s.now = t_switch + 3 * S  # quiet: no step since
        app = make_app(s)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            axis = app.screen.query_one("#axis")
            f = axis._frame
            c = f.grid.col_of(t_switch)
            assert set(f.modes[c + 1:]) == {"continuous"}, f.modes[c - 2:]
            assert f.modes[f.grid.col_of(last.t_end_ns)] == "chunked"
            # the band's newest cell is drawn in continuous's colour
            seg = list(axis._strips[0])[-2]  # the last waveform run, before the right gutter
            assert seg.style.color.name.lower() == theme.MODE_COLOURS["continuous"].lower() or \
                seg.style.color.triplet.hex.lower() == theme.MODE_COLOURS["continuous"].lower()
    run(go())


def test_batch_title_help_and_computation_agree_on_the_largest_step():
    """The title said 'largest step in each slice', the help 'mean of the steps': the code
    draws the largest (a real step: a prefill-only and a decode-only step must not blend)."""
    from gpuchef.engine_host.vocab.records import StepRecord
    from gpuchef.probes.timeline import Timeline
    from gpuchef.tui.plotdata import StepColumns, TimeGrid, build_frame
    from gpuchef.tui.screens.help import PANELS
    from gpuchef.tui.widgets.waveforms import BatchPanel

    ms = 1_000_000
    tl = Timeline(origin_ns=T0, clock=lambda: T0)
    # one slice of 1 s: a 600-token prefill-only step and a 30-decode step
    for i, (pre, dec) in enumerate(((600, 0), (0, 30))):
        t = T0 + (100 + 300 * i) * ms
        tl.add_step(StepRecord(i, t, t + 50 * ms, 50.0, "continuous", 512, 256, 0, 1,
                               1 if pre else 0, pre, dec, 0, 1, 0, 0, 10, 100))
    grid = TimeGrid.ending_at(T0 + 1500 * ms, T0, 2.0, 2)
    f = build_frame(tl.snapshot(T0 + 1500 * ms), grid, gpu=False,
                    steps=StepColumns.from_steps(tl.snapshot(T0 + 2 * S).steps))
    assert (f.prefill_per_step[0], f.decode_per_step[0]) == (600, 0)  # not the mean (300, 15)
    assert "largest step" in BatchPanel.UNIT
    help_text = dict(PANELS)["Batch composition"]
    assert "largest step" in help_text and "mean of" not in help_text


def test_a_continuous_prefill_above_the_budget_line_is_marked_and_explained():
    """Continuous batching runs a prompt longer than the budget alone; its bar rises above the
    dashed budget line. The panel marks those slices ▲ and its title says why."""
    async def go():
        s = StaticSession(gpu=True)  # continuous, budget 512, prompts up to 1000 tokens
        app = make_app(s)
        async with app.run_test(size=(200, 48)) as pilot:
            await settle(pilot)
            panel = app.screen.query_one("#batch")
            f = panel._frame
            over = (f.prefill_per_step + f.decode_per_step) > f.budget
            assert over.any()  # the toy engine ran such steps
            rows = strips_text(panel)
            assert "above the budget line: a prompt longer than the budget runs alone" \
                in rows[1], rows[1]
            shift = len(rows[1]) - 8 - f.grid.cols  # the left gutter is 8 cells
            from gpuchef.tui.widgets.waveforms import BatchPanel
            note = BatchPanel.OVER_NOTES[0]
            marks = rows[1][8:-8].replace(note, " " * len(note))  # the note's own ▲ aside
            cols = [i for i, ch in enumerate(marks) if ch == "▲"]
            assert cols and set(cols) <= {i for i in range(f.grid.cols) if over[i]}, (cols, shift)
    run(go())


def test_change_labels_are_whole_or_counted_never_cut():
    """Close changes overlapped until only the last was readable ('▲  ▲  ▲partial 2→1') and
    a label at the right edge was cut ('▲mode→con')."""
    from gpuchef.tui.widgets.waveforms import change_labels

    marks = [(40, "budget 512→1024"), (41, "chunk off→256"), (43, "partial 1→2"),
             (58, "mode→continuous")]
    row = change_labels(marks, 60)
    assert len(row) == 60
    assert "mode→continuous▲" in row and row.rstrip().endswith("▲")  # ends at its column
    assert row.index("mode→continuous▲") + len("mode→continuous") == 58
    shown = [lab for _, lab in marks if lab in row]
    counted = sum(int(x[1:]) for x in row.split() if x.startswith("+") and x[1:].isdigit())
    assert len(shown) + counted == len(marks), row
    for lab in ("budget 512", "chunk off", "partial 1", "mode→con"):  # no label is cut short
        assert lab not in row or any(full in row for _, full in marks if full.startswith(lab))
    assert row.count("▲") >= len(shown)
    # room for all: each at its column, nothing counted
    row = change_labels([(2, "mode→chunked"), (30, "budget 512→1024")], 60)
    assert row.index("▲mode→chunked") == 2 and row.index("▲budget 512→1024") == 30
    assert "+" not in row


def test_time_axis_draws_close_changes_legibly_in_the_app():
    from gpuchef.engine_host.vocab.records import EngineEvent

    async def go():
        s = StaticSession(gpu=True)
        last = _last_step(s)
        t = last.t_end_ns - int(1.5 * S)
        for i, (name, old, new) in enumerate((("max_num_batched_tokens", 1024, 2048),
                                              ("long_prefill_token_threshold", 0, 256),
                                              ("max_num_partial_prefills", 2, 1))):
            s.timeline.add_event(EngineEvent("knob", last.step, t + i * 200_000_000, name, old,
                                             new))
        s.timeline.add_event(EngineEvent("mode", last.step, last.t_end_ns, "mode", "chunked",
                                         "continuous"))
        app = make_app(s)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            row = strips_text(app.screen.query_one("#axis"))[1]
            assert "mode→continuous▲" in row, row
            shown = [x for x in ("budget 1024→2048", "chunk off→256", "partial 2→1",
                                 "mode→continuous") if x in row]
            counted = sum(int(x[1:]) for x in row.split() if x.startswith("+") and x[1:].isdigit())
            assert len(shown) + counted == 4, row
    run(go())


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
