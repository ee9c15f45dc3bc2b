"""Replay positions far past the trace (HD's bug report, 2026-12-01): `--start 1e308` and
going to 1e300 s in the app raised OverflowError (int of an infinite ns count) and killed the
dashboard. Now the flag is refused naming the allowed span, and the app shows the end."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner
from tui_fakes import T0, simulate

from gpuchef.commands.cli import _register, cli
from gpuchef.probes.recorder import TraceRecorder
from gpuchef.probes.timeline import Timeline
from gpuchef.sessions.replay import ReplaySession
from gpuchef.tui.replay import ReplayApp

_register()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    tl = Timeline(origin_ns=T0, clock=lambda: T0)
    end = simulate(tl, start_ns=T0, seconds=6.0, mode_at=[(0, "chunked")])
    snap = tl.snapshot(end)
    path = tmp_path_factory.mktemp("seek") / "t.jsonl"
    rec = TraceRecorder(path, meta={"command": "top", "device": "cpu"})
    for r in (*snap.steps, *snap.gpu_samples, *snap.events, *snap.requests):
        rec.record(r)
    rec.close()
    return path


@pytest.mark.parametrize("start,msg", [("1e308", "is beyond the end of"),
                                       ("inf", "a finite number of seconds"),
                                       ("-1", "a finite number of seconds")])
def test_cli_start_out_of_the_trace_is_one_line(trace, start, msg):
    r = CliRunner().invoke(cli, ["replay", str(trace), "--start", start])
    assert r.exit_code == 2 and msg in r.output, r.output
    assert "Traceback" not in r.output and "OverflowError" not in r.output


def test_session_seeks_clip_instead_of_overflowing(trace):
    s = ReplaySession(trace, wall=lambda: 0.0)
    assert s.seek_s(1e300) == s.end_ns
    assert s.step(-1e300) == s.start_ns and s.step(1e300) == s.end_ns
    with pytest.raises(Exception, match="not a number of seconds"):
        s.seek_s(float("inf"))


def test_going_to_1e300_in_the_app_shows_the_end(trace):
    s = ReplaySession(trace, wall=lambda: 0.0)
    notes: list[str] = []

    class App(ReplayApp):
        def notify(self, message, *a, **kw):
            notes.append(str(message))
            super().notify(message, *a, **kw)

    app = App(s, window_s=10.0, fps=10.0, show_ui_cost=False)

    async def go():
        async with app.run_test(size=(150, 44)) as pilot:
            await pilot.pause(0.2)
            assert app.seek_to("1e300")
            await pilot.pause(0.2)
            assert app.is_running and s.position_ns == s.end_ns
            assert any("showing the end" in n for n in notes), notes
            await pilot.press("q")

    asyncio.run(go())
