"""`gpuchef replay`: a saved trace on the dashboard — the panels show the recorded values at the
playback position; play, pause, seek and speed move the clock; steering is refused."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner
from tui_fakes import T0, capture_notes, palette, simulate

from gpuchef.commands.cli import _register, cli
from gpuchef.probes.recorder import TraceRecorder, read_trace
from gpuchef.probes.timeline import Timeline
from gpuchef.sessions.replay import ReplaySession
from gpuchef.tui.session import READ_ONLY, fmt_t, parse_time
from gpuchef.tui.replay import ReplayApp, ReplayBar, ReplayHelpScreen
from gpuchef.commands.replay import build_app
from gpuchef.tui.widgets.header import SessionHeader
from gpuchef.tui.widgets.numbers import NumbersPanel

_register()

SECONDS = 40.0
SWITCH_S = 20.0  # continuous until here, then chunked


class FakeWall:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    """A 40 s trace of the fakes' toy engine (continuous → chunked at 20 s), written by the real
    recorder: every stream, one mode switch."""
    tl = Timeline(origin_ns=T0, clock=lambda: T0)
    end = simulate(tl, start_ns=T0, seconds=SECONDS, mode_at=[(0, "continuous"),
                                                             (SWITCH_S, "chunked")])
    snap = tl.snapshot(end)
    path = tmp_path_factory.mktemp("replay") / "toy.jsonl"
    rec = TraceRecorder(path, meta={"command": "top", "device": "cpu", "attention_backend":
                                    "reference", "model": {"name": "tiny", "random_weights": True},
                                    "workload": {"dataset": "random", "request_rate": 3.0}})
    for r in (*snap.steps, *snap.gpu_samples, *snap.events, *snap.requests):
        rec.record(r)
    rec.close()
    return path


def make_app(path, **kw):
    wall = FakeWall()
    s = ReplaySession(path, wall=wall, **kw)
    app = ReplayApp(s, window_s=10.0, fps=10.0, show_ui_cost=False)
    return app, s, wall


def run(coro):
    return asyncio.run(coro)


def header(app) -> str:
    return str(app.screen.query_one(SessionHeader).render())


def bar(app) -> str:
    return app.screen.query_one(ReplayBar).plain


# -- the session ----------------------------------------------------------------------------------
def test_snapshot_at_a_position_holds_exactly_the_recorded_past(trace_path):
    tr = read_trace(trace_path)
    s = ReplaySession(trace_path, wall=FakeWall())
    assert s.problems == [] and abs(s.duration_s - SECONDS) < 1.0
    for sec in (3.0, 19.5, 27.25):
        s.seek_s(sec)
        t = s.position_ns
        snap = s.timeline.snapshot(s.clock())
        assert [x.step for x in snap.steps] == [x.step for x in tr.steps if x.t_end_ns <= t]
        assert len(snap.gpu_samples) == sum(g.t_ns <= t for g in tr.gpu_samples)
        last = [x for x in tr.steps if x.t_end_ns <= t][-1]
        assert s.last_step() == last
        assert s.scheduler_config.mode == ("continuous" if sec < SWITCH_S else "chunked")


def test_play_pause_speed_and_clipping(trace_path):
    wall = FakeWall()
    s = ReplaySession(trace_path, wall=wall, start_s=5)
    assert s.position_s == pytest.approx(5)
    s.play()
    wall.t += 2
    assert s.position_s == pytest.approx(7)
    s.set_speed(4)
    wall.t += 1
    assert s.position_s == pytest.approx(11)
    s.pause()
    wall.t += 10
    assert s.position_s == pytest.approx(11)
    s.step(-100)
    assert s.position_ns == s.start_ns
    s.play()
    wall.t += 1000
    assert s.position_ns == s.end_ns and not s.playing  # stops at the end
    for bad in (0.1, 17, "x"):
        with pytest.raises(Exception, match="replay speed"):
            s.set_speed(bad)
    assert parse_time("1:05.5") == 65.5 and parse_time("42") == 42 and fmt_t(65.5) == "01:05.5"


def test_steering_raises_read_only(trace_path):
    s = ReplaySession(trace_path, wall=FakeWall())
    for call in (lambda: s.set_knob("mode", "chunked"), lambda: s.load.set_rate(2),
                 lambda: s.ab.start({}, {}, 10), s.export_trace):
        with pytest.raises(Exception, match="read-only"):
            call()


# -- the app under Pilot ------------------------------------------------------------------------
def test_pilot_seeks_and_plays_the_panels_show_the_recorded_values(trace_path):
    app, s, wall = make_app(trace_path, start_s=10)
    notes = capture_notes(app)

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(0.2)
            st = s.last_step()
            assert "t = 00:10.0 / 00:4" in bar(app) and "paused" in bar(app)
            assert f"running {st.num_running}  waiting {st.num_waiting}" in bar(app)
            assert "continuous" in header(app)
            # seek forward past the mode switch: → 5 s, shift+→ 30 s (clipped at the end), Home
            await pilot.press("right")
            await pilot.pause(0.1)
            assert s.position_s == pytest.approx(15)
            assert "t = 00:15.0" in bar(app)
            await pilot.press("shift+right")
            await pilot.pause(0.1)
            assert s.position_ns == s.end_ns
            await pilot.press("home")
            await pilot.pause(0.1)
            assert s.position_ns == s.start_ns
            # go to 25 s by typing it: the header shows chunked, the bar the recorded step
            await pilot.press("g")
            await pilot.pause(0.1)
            await pilot.press(*"25", "enter")
            await pilot.pause(0.2)
            assert s.position_s == pytest.approx(25)
            st = s.last_step()
            assert st.mode == "chunked" and "chunked" in header(app)
            assert f"step {st.step}  running {st.num_running}  waiting {st.num_waiting}" \
                in bar(app)
            # the numbers panel shows what the snapshot at 25 s gives
            scr = app.screen
            assert scr.steps.last_step == st.step  # the columns end at the recorded step
            assert str(app.screen.query_one(NumbersPanel).render()).strip()
            # play: the clock follows the (fake) wall clock at the speed; pause stops it
            await pilot.press("space")
            wall.t += 2
            await pilot.pause(0.2)
            assert s.playing and s.position_s == pytest.approx(27)
            assert "playing" in bar(app) and "t = 00:27.0" in bar(app)
            await pilot.press("full_stop")  # ×2
            wall.t += 1
            await pilot.pause(0.1)
            assert s.speed == 2 and s.position_s == pytest.approx(29)
            assert "speed ×2" in bar(app)
            await pilot.press("comma", "comma")  # ÷4
            assert s.speed == 0.5
            await pilot.press("space")
            pos = s.position_ns
            wall.t += 5
            await pilot.pause(0.1)
            assert not s.playing and s.position_ns == pos and "paused" in bar(app)
            # seeking back redraws from the recorded past only
            await pilot.press("left")
            await pilot.pause(0.1)
            assert scr.steps.last_step == s.last_step().step
            assert scr.steps.ints[:, 1].max() <= s.position_ns  # nothing from after the position
            # a longer window re-reads the columns: every recorded step up to the position
            await pilot.press("3")
            await pilot.pause(0.1)
            assert app.window_s == 600
            assert len(scr.steps) == len(s.timeline.snapshot(s.position_ns).steps)
            # steering keys are refused; nothing changes
            for key in ("m", "plus", "greater_than_sign", "a", "e"):
                await pilot.press(key)
            await pilot.pause(0.1)
            assert sum(READ_ONLY in n for n in notes) == 5, notes
            assert s.scheduler_config.mode == "chunked"
            await pilot.press("question_mark")
            await pilot.pause(0.1)
            assert isinstance(app.screen, ReplayHelpScreen)
            await pilot.press("escape")
            await pilot.press("q")
        assert s.closed if hasattr(s, "closed") else True

    run(go())


# -- the command --------------------------------------------------------------------------------
def test_cli_refuses_a_file_that_is_not_a_trace(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    r = CliRunner().invoke(cli, ["replay", str(bad)])
    assert r.exit_code == 2
    assert "not a gpuchef trace" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["replay", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "cannot open" in r.output
    r = CliRunner().invoke(cli, ["replay", str(bad), "--speed", "100"])
    assert r.exit_code == 2


def test_cli_start_beyond_the_end_and_bad_speed_name_the_flag(trace_path):
    r = CliRunner().invoke(cli, ["replay", str(trace_path), "--start", "99999"])
    assert r.exit_code == 2 and "--start 99999 is beyond the end of" in r.output
    assert "allowed [0, " in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["replay", str(trace_path), "--speed", "0"])
    assert r.exit_code == 2 and "--speed 0 is out of range: allowed [0.25, 16]" in r.output
    # (a missing --screenshot-dir is created: tests/tui/test_screenshot_dir.py)


def test_a_truncated_trace_warns_with_line_numbers_and_still_plays(trace_path, tmp_path):
    lines = trace_path.read_text().splitlines(keepends=True)
    lines[5] = "{not json\n"
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])  # no end record
    from io import StringIO

    from rich.console import Console
    buf = StringIO()
    app = build_app(str(cut), err=Console(file=buf, width=300), paused=True)
    out = buf.getvalue()
    assert "line 6: not valid JSON" in out and "truncated last record" in out
    assert "no end record" in out
    assert app.session.timeline.totals["step"] > 100 and not app.session.playing
    notes = capture_notes(app)  # what the user sees

    async def go():
        async with app.run_test(size=(150, 44)) as pilot:
            await pilot.pause(0.3)
            app.seek_to("99999")  # beyond the end: shown, and said
            await pilot.pause(0.1)
            await pilot.press("q")

    run(go())
    assert any("line 6: not valid JSON" in n for n in notes), notes
    assert any("no end record" in n for n in notes), notes
    assert any("beyond the end of the trace" in n for n in notes), notes
    assert app.session.position_s == pytest.approx(app.session.duration_s)


def test_a_real_cpu_bench_trace_replays(tmp_path):
    """`gpuchef bench --trace` on the CPU, then the replay at its end: the bar shows the last
    recorded step's queue, the header its mode."""
    path = tmp_path / "cpu.jsonl"
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--dataset",
                                 "random", "--num-prompts", "12", "--input-len", "64",
                                 "--output-len", "16", "--request-rate", "20", "--mode",
                                 "chunked", "--trace", str(path)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    app = build_app(str(path), paused=True, window="10s")
    s = app.session
    tr = read_trace(path)
    assert tr.complete and tr.problems == [] and s.duration_s > 0

    async def go():
        async with app.run_test(size=(150, 44)) as pilot:
            await pilot.pause(0.2)
            await pilot.press("end")
            await pilot.pause(0.2)
            last = max(tr.steps, key=lambda x: x.t_end_ns)
            assert s.last_step() == last
            assert f"running {last.num_running}  waiting {last.num_waiting}" in bar(app)
            assert "chunked" in header(app) and "tiny" in header(app)
            snap = s.timeline.snapshot(s.clock())
            assert len(snap.steps) == len(tr.steps) and len(snap.requests) == 12
            await pilot.press("q")

    run(go())


def test_the_h200_slice_replays_with_gpu_panels():
    """The real 1 s H200 trace: GPU panels on, GPU columns hold the samples up to the position."""
    from pathlib import Path
    path = Path(__file__).parents[1] / "gpuchef" / "data" / "h200_chunked_1s.jsonl"
    app = build_app(str(path), paused=True, window="10s", start_s=0.5)
    s = app.session

    async def go():
        async with app.run_test(size=(150, 44)) as pilot:
            await pilot.pause(0.2)
            scr = app.screen
            assert s.gpu_available and not scr.gpu_panel.off_reason
            t = s.position_ns
            assert len(scr.gpus.t) == sum(g.t_ns <= t for g in s.trace.gpu_samples) > 0
            assert "flashinfer" in header(app) and "NVIDIA H200" in s.gpu_status
            st = s.last_step()
            assert f"running {st.num_running}" in bar(app) and "t = 00:00.5 / 00:01.0" in bar(app)
            await pilot.press("q")

    run(go())


def test_palette_seeks_and_sets_the_speed(trace_path):
    app, s, wall = make_app(trace_path)

    async def go():
        async with app.run_test(size=(150, 44)) as pilot:
            await pilot.pause(0.2)
            for typed in ("seek 0:30", "speed 4"):
                await palette(pilot, typed)
            assert s.position_s == pytest.approx(30) and s.speed == 4
            assert "t = 00:30.0" in bar(app) and "speed ×4" in bar(app)
            await pilot.press("q")

    run(go())


def test_replay_and_report_share_the_span_of_a_shuffled_trace(trace_path, tmp_path):
    """Lines out of order (meta first, end last): replay's duration and the report's span are
    the earliest to the latest record time, computed here from the raw lines."""
    import json
    import random

    from gpuchef.report.data import view_trace

    lines = trace_path.read_text().splitlines()
    body = lines[1:-1]
    random.Random(7).shuffle(body)
    # reversed too: the first line of each stream is then its latest record
    for i, order in enumerate((body, body[::-1])):
        p = tmp_path / f"shuf{i}.jsonl"
        p.write_text("\n".join([lines[0], *order, lines[-1]]) + "\n")
        lo, hi = [], []
        for ln in order:
            d = json.loads(ln)
            if d["type"] == "step":
                lo.append(d["t_start_ns"]), hi.append(d["t_end_ns"])
            elif d["type"] == "request":
                hi.append((d["token_times_ns"] or [d["arrival_ns"]])[-1])
            elif "t_ns" in d:
                lo.append(d["t_ns"]), hi.append(d["t_ns"])
        s = ReplaySession(p, wall=FakeWall())
        v = view_trace(read_trace(p))
        assert (s.start_ns, s.end_ns) == (min(lo), max(hi))
        assert (v.origin_ns, v.end_ns) == (min(lo), max(hi))
        assert s.duration_s == pytest.approx((v.end_ns - v.origin_ns) / 1e9)


def test_a_trace_still_being_written_is_not_called_stopped(tmp_path):
    """A live session's trace (flushed, not closed) has no end record yet: replay's warning
    says it may still be written, in report's words (one line, report.data.cut_short_line),
    not only that the writer stopped; closed, there is no such warning."""
    from io import StringIO

    from rich.console import Console

    from gpuchef.engine_host.vocab.records import RequestRecord
    from gpuchef.report import build

    p = tmp_path / "live.jsonl"
    rec = TraceRecorder(p, meta={"command": "serve"})
    try:
        rec.record(RequestRecord("http-0", T0, 4, 2, (T0 + 10**8, T0 + 2 * 10**8), "length"))
        rec.flush()
        buf = StringIO()
        build_app(str(p), err=Console(file=buf, width=400), paused=True)
        (line,) = [x for x in buf.getvalue().splitlines() if "no end record" in x]
        assert "still running and writing it" in line and "replaying what was written" in line
        (rline,) = [x for x in build([p]).problems if "no end record" in x]
        assert line.removeprefix("warning: ").split(";")[0] == rline.split(";")[0]
    finally:
        rec.close()
    buf = StringIO()
    build_app(str(p), err=Console(file=buf, width=400), paused=True)
    assert "no end record" not in buf.getvalue()


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
