"""The dashboard driven as a user would (Textual Pilot) over the real engine (tiny, CPU): every
key, control and palette command reaches the engine — the next StepRecord shows the new value —
bad values are refused with the allowed range, mode switches keep every request alive, a live
A/B run makes two windows per setting, and quitting leaves a readable trace."""

import asyncio
import glob
import io
import time

import pytest
from rich.console import Console
from tui_fakes import capture_notes, palette

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.vocab.workload import WorkloadConfig
from gpuchef.sessions.live import LiveSession
from gpuchef.probes.nvml.fake import FakeNvml
from gpuchef.probes.recorder import read_trace
from gpuchef.tui.ab_live import ab_windows
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.keys import KEYS
from gpuchef.tui.screens.ab import ABScreen
from gpuchef.tui.screens.help import HelpScreen
from gpuchef.tui.widgets.waveforms import GpuPanel

SIZE = (160, 48)
START = SchedulerConfig(mode="chunked", max_num_batched_tokens=256, max_num_seqs=256,
                        long_prefill_token_threshold=0, max_num_partial_prefills=1)


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=512,
                                  cache=CacheConfig(num_gpu_blocks=1024)))


def make_app(engine, tmp_path=None, *, rate=25.0, trace=None, nvml=None, start=START, **app_kw):
    engine.set_scheduler_config(start)
    wcfg = WorkloadConfig(dataset="random", request_rate=rate, input_len=48, range_ratio=0.5,
                          output_len=12, num_prompts=100, vocab_size=engine.model_config.vocab_size,
                          max_model_len=engine.max_model_len)
    session = LiveSession(engine, wcfg, trace_path=trace, nvml=nvml, host_probe=False,
                          slos={"ttft": 2000.0, "tpot": 200.0}, sample_hz=10)
    app = GpuchefApp(session, window_s=10, screenshot_dir=str(tmp_path or "."), **app_kw)
    app.notes = capture_notes(app)
    session.start()
    return app, session


def run(coro):
    return asyncio.run(coro)


async def until(pilot, pred, timeout=30.0):  # generous: the CI machine is shared
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        await pilot.pause(0.05)
    return pred()


def steps_after(session, step_id):
    return [s for s in session.timeline.snapshot().steps if s.step >= step_id]


async def reaches(pilot, session, knob, value, timeout=30.0):
    """True once a step at or after now runs with ``knob == value`` (and all later ones do)."""
    sid = session.host.step_id

    def ok():
        later = steps_after(session, sid)
        hit = [i for i, s in enumerate(later) if getattr(s, knob) == value]
        return bool(hit) and all(getattr(s, knob) == value for s in later[hit[0]:])

    return await until(pilot, ok, timeout)


def test_every_key_reaches_the_engine(engine):
    app, s = make_app(engine)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: len(s.timeline.snapshot().steps) > 3)
            for key, knob, value in (
                    ("m", "mode", "continuous"), ("m", "mode", "chunked"),
                    ("plus", "max_num_batched_tokens", 512),
                    ("minus", "max_num_batched_tokens", 256),
                    ("left_square_bracket", "long_prefill_token_threshold", 128),
                    ("right_square_bracket", "long_prefill_token_threshold", 0),
                    ("right_curly_bracket", "max_num_seqs", 512),
                    ("left_curly_bracket", "max_num_seqs", 256),
                    ("right_parenthesis", "max_num_partial_prefills", 2),
                    ("left_parenthesis", "max_num_partial_prefills", 1)):
                await pilot.press(key)
                assert await reaches(pilot, s, knob, value), (key, knob, value)
            # each change is an event at the step where it took effect, drawn as a marker
            evs = [e for e in s.timeline.snapshot().events if e.kind in ("knob", "mode")]
            assert len(evs) == 10
            for e in evs:
                first = next(st for st in s.timeline.snapshot().steps if st.step == e.step)
                assert getattr(first, e.name) == e.new
            await pilot.press("greater_than_sign")
            assert s.load.state().rate == pytest.approx(31.2, abs=0.1)
            await pilot.press("less_than_sign")
            assert s.load.state().rate == pytest.approx(25.0, abs=0.1)
            await pilot.press("p")
            assert s.load.state().paused
            assert await until(pilot, lambda: any(e.kind == "pause" and e.name == "load"
                                                  for e in s.timeline.snapshot().events))
            await pilot.press("p")
            assert not s.load.state().paused
            for key, w in (("1", 10), ("2", 60), ("3", 600), ("w", 10)):
                await pilot.press(key)
                assert app.window_s == w
            await pilot.press("3")  # 10 min: every change of this test is in the window
            await pilot.pause(0.6)
            labels = [m.label for m in app.screen.query_one("#axis")._frame.markers]
            assert "mode→continuous" in labels and "budget 256→512" in labels, labels

    try:
        run(go())
    finally:
        s.close()


def test_opening_the_dashboard_changes_nothing(engine):
    app, s = make_app(engine, start=START.with_changes(mode="continuous",
                                                       max_num_batched_tokens=1024))

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(1.0)
            assert app.screen.query_one("#mode").value == "continuous"
            assert app.screen.query_one("#knob-max_num_batched_tokens").value == "1024"

    try:
        run(go())
    finally:
        s.close()
    assert s.scheduler_config.mode == "continuous"
    assert not [e for e in s.timeline.snapshot().events if e.kind in ("mode", "knob")]
    assert not app.notes


def test_controls_and_palette_reach_the_engine_and_bad_values_are_refused(engine):
    app, s = make_app(engine)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            scr = app.screen
            inp = scr.query_one("#knob-max_num_batched_tokens")
            inp.focus()
            inp.value = "384"
            await pilot.press("enter")
            assert await reaches(pilot, s, "max_num_batched_tokens", 384)
            assert app.screen.focused is None  # Enter leaves the field: keys drive the dashboard
            chunk = scr.query_one("#knob-long_prefill_token_threshold")
            chunk.focus()
            chunk.value = "64"
            await pilot.press("enter")
            assert await reaches(pilot, s, "long_prefill_token_threshold", 64)
            scr.query_one("#mode").value = "continuous"
            assert await reaches(pilot, s, "mode", "continuous")
            rate = scr.query_one("#rate")
            rate.focus()
            rate.value = "12.5"
            await pilot.press("enter")
            assert await until(pilot, lambda: s.load.state().rate == 12.5)
            scr.query_one("#load").value = False
            assert await until(pilot, lambda: s.load.state().paused)
            scr.query_one("#load").value = True
            assert await until(pilot, lambda: not s.load.state().paused)
            # the host records the load's resume before its next step: wait for it, so that the
            # count of events below is not taken between the two
            assert await until(pilot, lambda: any(e.kind == "resume" and e.name == "load"
                                                  for e in s.timeline.snapshot().events))

            # a bad value: a message naming the allowed range, nothing else changes
            before = s.scheduler_config
            n_events = len(s.timeline.snapshot().events)
            inp.focus()
            inp.value = "0"
            assert inp.has_class("-invalid")
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert any("allowed [1, 1048576]" in n for n in app.notes), app.notes
            assert s.scheduler_config == before
            assert len(s.timeline.snapshot().events) == n_events
            assert scr.query_one("#knob-max_num_batched_tokens").value == "384"  # shows what is in force
            rate.focus()
            rate.value = "-3"
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert any("allowed (0, 10000]" in n for n in app.notes), app.notes
            assert s.load.state().rate == 12.5
            # typed key by key, what the user typed is what the refusal names ("1e3" was 13)
            inp.focus()
            inp.value = ""
            await pilot.press(*"1e3", "enter")
            await pilot.pause(0.3)
            assert any("got '1e3'" in n for n in app.notes), app.notes
            assert s.scheduler_config.max_num_batched_tokens == 384
            rate.focus()
            rate.value = ""
            await pilot.press(*"inf", "enter")
            await pilot.pause(0.3)
            assert any("'inf'" in n for n in app.notes), app.notes
            assert s.load.state().rate == 12.5

            # the command palette: typed settings
            await pilot.press("ctrl+p")
            await pilot.pause(0.3)
            await pilot.press(*"budget 320")
            await pilot.pause(0.5)
            await pilot.press("enter")
            assert await reaches(pilot, s, "max_num_batched_tokens", 320)
            await pilot.press("ctrl+p")
            await pilot.pause(0.3)
            await pilot.press(*"seqs 99999")
            await pilot.pause(0.5)
            await pilot.press("enter")
            await pilot.pause(0.3)
            # the field name and the flag: either may be what the user knows
            assert any("max_num_seqs=99999 is out of range: allowed [1, 4096] "
                       "(flag --max-num-seqs)" in n for n in app.notes), app.notes
            assert s.scheduler_config.max_num_seqs == 256
            # typed commands win over look-alike actions, and 0 is a value, not "the default"
            w_before = app.window_s
            for typed, msg in (("window 0", "waveform window 0 s is out of range"),
                               ("ab mode=chunked vs mode=continuous window=0",
                                "allowed [0.5, 3600]"),
                               ("ab mode=chunked vs mode=continuous window=abc",
                                "A/B window 'abc' is not a number")):
                await palette(pilot, typed)
                assert any(msg in n for n in app.notes), (typed, app.notes)
            assert app.window_s == w_before
            assert not s.ab.state().active

    try:
        run(go())
    finally:
        s.close()


def test_mode_switches_under_load_keep_every_request_alive(engine):
    app, s = make_app(engine, rate=40.0)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: s.load.state().submitted > 10)
            for _ in range(6):
                await pilot.press("m")
                await pilot.pause(0.25)
            await pilot.press("p")  # stop arrivals, let the engine drain
            await pilot.pause(0.2)
            submitted = s.load.state().submitted
            assert await until(pilot, lambda: not engine.has_unfinished()
                               and len(s.timeline.snapshot().requests) >= submitted, 120)
            return submitted

    try:
        submitted = run(go())
    finally:
        s.close()
    reqs = s.timeline.snapshot().requests
    modes = {st.mode for st in s.timeline.snapshot().steps}
    assert modes == {"chunked", "continuous"}
    assert len(reqs) == submitted
    assert {r.finish_reason for r in reqs} == {"length"}
    assert all(r.output_len == r.max_tokens for r in reqs)
    assert len({r.request_id for r in reqs}) == submitted


def test_live_ab_makes_two_windows_per_setting_and_restores_the_settings(engine):
    app, s = make_app(engine)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: len(s.timeline.snapshot().steps) > 3)
            assert app.start_ab({"mode": "chunked", "max_num_batched_tokens": 256},
                                {"mode": "continuous"}, window_s=1.2, rounds=2)
            assert isinstance(app.screen, ABScreen)
            assert await until(pilot, lambda: not s.ab.state().active, 60)
            await pilot.pause(0.7)  # the A/B screen refreshes twice a second

            def counted() -> bool:  # a window counts once requests that arrived in it finish
                r = app.ab_analyser.analyse(s.timeline.snapshot(), s.ab.state())
                return all(len(r.settings[k].windows) == 2 for k in "AB")
            assert await until(pilot, counted, 45)
            return app.ab_analyser.analyse(s.timeline.snapshot(), s.ab.state())

    try:
        res = run(go())
    finally:
        s.close()
    run_id, wins, ended = ab_windows(s.timeline.snapshot().events)
    assert ended and [w.label for w in wins] == ["A", "B", "A", "B"]
    assert len(res.settings["A"].windows) == 2 and len(res.settings["B"].windows) == 2
    steps = s.timeline.snapshot().steps
    for w in wins:  # the window's setting is in force from its first step to its end
        inside = [st for st in steps if w.step0 <= st.step and st.t_end_ns <= w.t1_ns]
        assert inside and {st.mode for st in inside} == {"chunked" if w.label == "A" else "continuous"}
    assert s.scheduler_config.mode == "chunked"  # restored
    assert all(r.verdict for r in res.rows)


def test_quit_writes_a_readable_trace_and_e_rotates_it(engine, tmp_path):
    path = tmp_path / "top.jsonl"
    app, s = make_app(engine, tmp_path, trace=str(path))

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: len(s.timeline.snapshot().requests) > 3)
            await pilot.press("m")
            await pilot.press("e")
            assert await until(pilot, lambda: s.trace_path.endswith("top.part2.jsonl"))
            await pilot.pause(0.5)
            await pilot.press("q")
            await until(pilot, lambda: not app.is_running, 60)

    run(go())
    for p in (path, tmp_path / "top.part2.jsonl"):
        tr = read_trace(p)
        assert tr.complete and not tr.problems, (p, tr.problems)
        assert tr.meta["command"] == "top"
    first, second = read_trace(path), read_trace(tmp_path / "top.part2.jsonl")
    assert first.steps and first.requests
    assert any(e.kind == "mode" for e in first.events)
    assert second.meta["part"] == 1 and second.steps
    assert not s.load._thread.is_alive() and not s.host._thread.is_alive()


def test_e_without_a_trace_writes_what_the_dashboard_holds(engine, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app, s = make_app(engine, tmp_path)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: len(s.timeline.snapshot().requests) > 3)
            await pilot.press("m")
            await pilot.pause(0.3)
            await pilot.press("e")
            assert await until(pilot, lambda: s.trace_path is not None)
            await pilot.pause(0.5)
            await pilot.press("s")
            await pilot.pause(0.2)

    try:
        run(go())
    finally:
        s.close()
    files = glob.glob(str(tmp_path / "gpuchef-top-*.jsonl"))
    assert len(files) == 1
    tr = read_trace(files[0])
    assert tr.complete and not tr.problems and tr.meta["backfilled_from_timeline"]
    ids = [st.step for st in tr.steps]
    first = s.timeline.snapshot().steps[0].step  # the engine is shared: ids go on between tests
    assert ids[0] == first and ids == sorted(ids) and len(set(ids)) == len(ids)  # none twice
    assert ids == list(range(first, first + len(ids)))  # none lost either
    assert any(e.kind == "mode" for e in tr.events)
    assert glob.glob(str(tmp_path / "*.svg"))


def test_gpu_panels_live_with_nvml_and_help_lists_every_key(engine):
    app, s = make_app(engine, nvml=FakeNvml(gpm=True, pcie_window_s=0))

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: s.gpu_available)
            assert await until(pilot, lambda: len(s.timeline.snapshot().gpu_samples) > 3)
            await pilot.pause(0.5)
            gpu = app.screen.query_one(GpuPanel)
            assert not gpu.off_reason and gpu.display
            assert any("SM act" in st.text for st in gpu._strips)
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            con = Console(width=200, record=True, file=io.StringIO())
            con.print(HelpScreen._content())
            text = con.export_text()
            for k in KEYS:
                assert f"  {k.shown} " in text and k.help[:30] in text
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)

    try:
        run(go())
    finally:
        s.close()


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
