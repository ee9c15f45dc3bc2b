"""`gpuchef top --serve`: the dashboard over an engine fed over HTTP. Built through the CLI's own
option handling (the same `_build` the command runs), driven with Textual's Pilot while the
openai client sends requests from another thread; the dashboard's timeline and the trace see
the HTTP requests (ids http-N), and the internal load stays paused until asked for."""

from __future__ import annotations

import asyncio
import io
import re

import pytest
from rich.console import Console

openai = pytest.importorskip("openai")

from gpuchef.probes.recorder import read_trace  # noqa: E402
from gpuchef.commands.top import _build, top  # noqa: E402


def build(args):
    ctx = top.make_context("top", list(args))
    return _build(ctx, dict(ctx.params), Console(file=io.StringIO()))


def test_top_serve_shows_http_requests_and_keeps_the_internal_load_paused(tmp_path):
    trace = tmp_path / "t.jsonl"
    app = build(["--device", "cpu", "--model", "tiny", "--serve", "--port", "0",
                 "--max-model-len", "512", "--trace", str(trace), "--screenshot-dir",
                 str(tmp_path)])
    s = app.session
    front = s.closers[0].__self__  # the ServeProcess
    assert front.url.startswith("http://127.0.0.1:")
    assert s.load.paused and s.info.serving == front.url
    assert "internal load started paused (p toggles it)" in s.info.note
    c = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)

    def send():
        return [c.completions.create(model="tiny", prompt=[5] * (20 + 7 * i), max_tokens=6,
                                     extra_body={"ignore_eos": True}) for i in range(5)]

    from gpuchef.tui.widgets.header import SessionHeader, header_text

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(0.6)
            shown = header_text(app.screen.query_one(SessionHeader)._state).plain
            assert "PAUSED" in shown and f"serving {front.url}" in shown, shown
            rs = await asyncio.to_thread(send)
            assert [r.usage.completion_tokens for r in rs] == [6] * 5
            await pilot.pause(1.5)
            reqs = s.timeline.snapshot().requests
            assert sorted(r.request_id for r in reqs) == [f"http-{i}" for i in range(5)]
            assert s.load.state().submitted == 0  # the internal load sent nothing
            # the header shows the HTTP load beside the paused internal one: what arrived over
            # the window it has measured, and none left in flight (each request was answered)
            shown = header_text(app.screen.query_one(SessionHeader)._state).plain
            m = re.search(r"HTTP load arriving ([\d.]+) req/s \(last \d+ s\) · (\d+) in flight",
                          shown)
            assert m and float(m.group(1)) > 0 and m.group(2) == "0", shown
            assert "internal load" in shown and "PAUSED" in shown, shown
            await pilot.press("p")  # the user starts the internal load beside HTTP
            for _ in range(100):
                if s.load.state().submitted:
                    break
                await pilot.pause(0.1)
            assert not s.load.paused and s.load.state().submitted > 0
            await pilot.pause(0.6)  # the header redraws at least every 0.5 s
            shown = header_text(app.screen.query_one(SessionHeader)._state).plain
            # it no longer says the load is paused (the note once did, for the whole session)
            assert "PAUSED" not in shown and "load paused" not in shown, shown
            await pilot.press("q")

    try:
        asyncio.run(go())
    finally:
        s.close()
    t = read_trace(trace)
    http_ids = sorted(r.request_id for r in t.requests if r.request_id.startswith("http-"))
    assert http_ids == [f"http-{i}" for i in range(5)]
    assert t.meta["source"]["kind"] == "hosted"


def test_serve_flags_without_serve_are_refused_before_the_model_loads():
    from gpuchef.engine_host.vocab.errors import ConfigError

    with pytest.raises(ConfigError, match="--port, --api-key need --serve"):
        build(["--device", "cpu", "--port", "9000", "--api-key", "k"])


def test_top_serve_says_once_that_its_http_process_died_and_goes_on(tmp_path):
    """The HTTP server's process killed (kill -9, the OOM killer) under `top --serve`: the
    dashboard notices within a second (ServeProcess.failure(), as `gpuchef serve`), says so once
    in a notification and in the header, naming the URL; the request the dead server had in
    flight is aborted (its client is gone with the server); the engine and the internal load go
    on, and the bridge keeps no more records for the dead server."""
    import os
    import signal
    import threading
    import time

    from gpuchef.tui.widgets.header import SessionHeader, header_text
    from tui_fakes import capture_notes

    trace = tmp_path / "t.jsonl"
    app = build(["--device", "cpu", "--model", "tiny", "--serve", "--port", "0",
                 "--max-model-len", "512", "--trace", str(trace), "--screenshot-dir",
                 str(tmp_path)])
    s = app.session
    front = s.closers[0].__self__
    c = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0, timeout=20)
    got: dict = {}

    def stream():  # held in the queue: the engine is paused until the server is gone
        try:
            for _ in c.completions.create(model="tiny", prompt=[5] * 20, max_tokens=200,
                                          stream=True, extra_body={"ignore_eos": True}):
                pass
        except Exception as e:  # noqa: BLE001 - the connection breaks: any openai error
            got["error"] = e

    line = f"the HTTP server process is gone (killed by SIGKILL): nothing listens on {front.url}"

    async def go():
        async with app.run_test(size=(200, 48)) as pilot:
            notes = capture_notes(app)
            s.pause_engine(True)
            t = threading.Thread(target=stream, daemon=True)
            t.start()
            for _ in range(100):  # queued in the paused engine (its process): the queue says so
                if s.engine.num_waiting == 1:
                    break
                await pilot.pause(0.1)
            assert s.engine.num_waiting == 1
            assert not app.front_door_error
            await pilot.pause(0.6)  # the header redraws at least every 0.5 s
            before = header_text(app.screen.query_one(SessionHeader)._state).plain
            assert f"serving {front.url}" in before and "HTTP SERVER STOPPED" not in before
            os.kill(front._proc.pid, signal.SIGKILL)
            t0 = time.monotonic()
            while not app.front_door_error and time.monotonic() - t0 < 5:
                await pilot.pause(0.1)
            assert app.front_door_error == line
            assert time.monotonic() - t0 < 2
            await pilot.pause(0.3)
            assert [n for n in notes if "HTTP server process" in n] == [
                f"{line}. The engine, the internal load (p) and the trace go on here."]
            await pilot.pause(0.6)  # the header redraws at least every 0.5 s
            shown = app.screen.query_one(SessionHeader)._state
            shown = header_text(shown).plain
            assert f"HTTP SERVER STOPPED: {line}" in shown
            # it no longer claims to serve: the URL is named only by the line saying it is gone
            assert "serving" not in shown and shown.count(front.url) == 1
            s.pause_engine(False)
            await pilot.press("p")  # the internal load still drives the engine
            step0 = s.host.step_id
            for _ in range(100):
                if s.load.state().submitted and s.host.step_id > step0 + 5:
                    break
                await pilot.pause(0.1)
            assert s.load.state().submitted > 0 and s.host.step_id > step0 + 5
            assert s.engine_error is None
            assert len(front._q) == 0  # nothing is kept for the dead server
            assert [n for n in notes if "HTTP server process" in n] == [
                f"{line}. The engine, the internal load (p) and the trace go on here."]
            t.join(20)
            assert "error" in got
            await pilot.press("q")

    try:
        asyncio.run(go())
    finally:
        s.close()
    recs = {r.request_id: r for r in read_trace(trace).requests}
    assert recs["http-0"].finish_reason == "abort"
    assert len(recs["http-0"].token_times_ns) == 0  # aborted while queued: no token made


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
