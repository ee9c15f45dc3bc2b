"""`gpuchef top --attach URL`: the dashboard on a server gpuchef does not host, driven with
Pilot. A fake server on 127.0.0.1 serves vLLM 0.24's real /metrics text (captured on the H200,
tests/probes/data) and switches it between scrapes: the panels show the values in that text.
Every bad-input path is one status line (or one error line before start) and the session goes
on; the trace keeps the scrapes as their own record type."""

from __future__ import annotations

import asyncio
import io
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web
from rich.console import Console

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.probes.recorder import read_trace
from gpuchef.commands.top import _build, top

DATA = Path(__file__).parents[1] / "probes" / "data"
LOAD = (DATA / "vllm_0.24_metrics_load.txt").read_text()
AFTER = (DATA / "vllm_0.24_metrics_after.txt").read_text()


def _value(text: str, name: str) -> float:
    """The sum over label sets of ``name`` in Prometheus text (independent of probes.scrape)."""
    tot = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", line)
        if m:
            tot += float(m.group(1))
    return tot


class FakeServer:
    """An aiohttp server on a free loopback port. ``text``: what /metrics answers now;
    ``status``: its HTTP status; ``routes``: extra handlers. ``models``: True (a /v1/models
    list), False (no such route: 404) or "garbage" (200 with an HTML page); ``model_gets``
    counts its GETs. ``port``: the port to listen on (0: a free one)."""

    def __init__(self, text: str = LOAD, status: int = 200, metrics: bool = True,
                 knobs: bool = False, models: bool | str = True, port: int = 0) -> None:
        self.text, self.status, self.metrics, self.knobs = text, status, metrics, knobs
        self.want_port = port
        self.models = models
        self.model_gets = 0
        self.state = {"mode": "chunked", "max_num_batched_tokens": 512, "max_num_seqs": 64}
        self.scrapes = 0
        self.patches: list[dict] = []

    async def _metrics(self, request):
        self.scrapes += 1
        return web.Response(text=self.text, status=self.status)

    async def _get_knobs(self, request):
        return web.json_response(self.state)

    async def _patch_knobs(self, request):
        """Accepts budgets up to 1024 (a stand-in for the engine's own limit)."""
        body = await request.json()
        self.patches.append(body)
        b = body.get("max_num_batched_tokens")
        if b is not None and b > 1024:
            return web.json_response({"error": {"message": f"max_num_batched_tokens={b} is "
                                                           "above this engine's limit 1024"}},
                                     status=400)
        self.state.update(body)
        return web.json_response({"accepted": body, "scheduler": self.state})

    async def _models(self, request):
        self.model_gets += 1
        if self.models == "garbage":
            return web.Response(text="<html>models</html>", content_type="text/html")
        return web.json_response({"object": "list", "data": [
            {"id": "fake", "object": "model", "max_model_len": 4096, "vocab_size": 1000}]})

    async def _cut(self, request):
        """Every stream is closed by the server after 2 chunks, before [DONE]."""
        await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(2):
            await resp.write(b'data: {"choices": [{"index": 0, "text": "x", '
                             b'"finish_reason": null}]}\n\n')
            await asyncio.sleep(0.01)
        request.transport.close()
        return resp

    def __enter__(self) -> "FakeServer":
        app = web.Application()
        if self.metrics:
            app.router.add_get("/metrics", self._metrics)
        if self.models:
            app.router.add_get("/v1/models", self._models)
        if self.knobs:
            app.router.add_get("/gpuchef/v1/scheduler", self._get_knobs)
            app.router.add_patch("/gpuchef/v1/scheduler", self._patch_knobs)
        app.router.add_post("/v1/completions", self._cut)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            sock = socket.socket()
            sock.bind(("127.0.0.1", self.want_port))
            self.port = sock.getsockname()[1]
            site = web.SockSite(self.runner, sock)
            self.loop.run_until_complete(site.start())
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def build(args):
    ctx = top.make_context("top", list(args))
    return _build(ctx, dict(ctx.params), Console(file=io.StringIO()))


def drive(session, go) -> None:
    """Run the pilot coroutine ``go()`` and close the attached session whatever happens."""
    try:
        asyncio.run(go())
    finally:
        session.close()


async def wait_for(pilot, cond, timeout=10.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return True
        await pilot.pause(0.05)
    return False


def test_attach_to_vllm_metrics_panels_show_the_parsed_values(tmp_path):
    trace = tmp_path / "a.jsonl"
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--trace", str(trace),
                     "--screenshot-dir", str(tmp_path)])
        s = app.session
        server = s.servers[0]

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                scr = app.screen
                assert await wait_for(pilot, lambda: len(server.deltas()) >= 2)
                await pilot.pause(1.2)  # a numbers refresh
                shown = scr.shown[server.url]
                assert shown["running"] == _value(LOAD, "vllm:num_requests_running") == 7
                assert shown["waiting"] == _value(LOAD, "vllm:num_requests_waiting")
                assert shown["kv_usage"] == pytest.approx(_value(LOAD, "vllm:kv_cache_usage_perc"))
                assert shown["prompt_tokens"] == 0  # the same text twice: nothing happened
                n0 = len(server.samples())
                srv.text = AFTER  # the load finished between two scrapes
                assert await wait_for(pilot, lambda: any(
                    d.gauges.get("running") == 0 for d in server.deltas()))
                d = next(d for d in server.deltas() if d.gauges.get("running") == 0)
                # the interval that crossed: its rate × its length is the counters' difference
                dp = _value(AFTER, "vllm:prompt_tokens_total") - _value(LOAD,
                                                                        "vllm:prompt_tokens_total")
                dg = (_value(AFTER, "vllm:generation_tokens_total")
                      - _value(LOAD, "vllm:generation_tokens_total"))
                assert d.rates["prompt_tokens"] * d.dt_s == pytest.approx(dp)
                assert d.rates["generation_tokens"] * d.dt_s == pytest.approx(dg)
                it_n = (_value(AFTER, "vllm:iteration_tokens_total_count")
                        - _value(LOAD, "vllm:iteration_tokens_total_count"))
                it_s = (_value(AFTER, "vllm:iteration_tokens_total_sum")
                        - _value(LOAD, "vllm:iteration_tokens_total_sum"))
                assert d.hist_mean["iteration_tokens"] == pytest.approx(it_s / it_n)
                # the chart holds that interval's rate in some column, the numbers the newest
                from gpuchef.tui.plotdata import TimeGrid
                from gpuchef.tui.widgets.scrape import build_scrape_frame
                f = build_scrape_frame(server.deltas(), TimeGrid.ending_at(
                    s.clock(), s.start_ns, 10.0, 100), server.kind, server.hz)
                col = f.get("prompt_tokens")
                assert any(v == pytest.approx(dp / d.dt_s) for v in col[col == col])
                await pilot.pause(1.2)
                shown = scr.shown[server.url]
                assert shown["running"] == 0 and shown["prompt_tokens"] == 0
                # the numbers panel's text and the panel titles say where they come from
                text = str(scr.numbers.render())
                assert "running" in text and "vllm" in text
                titles = [p.title_strip(170).text for p in scr.scrape_panels]
                assert all("from /metrics" in t or "histogram deltas" in t for t in titles)
                assert any("100 ms scrapes" in t for t in titles)
                steps = str(scr.query_one("#a-steps").render())
                assert "no per-step records" in steps
                # the knobs: vLLM has no gpuchef knob endpoint, so read-only with the reason
                assert "no gpuchef knob endpoint" in s.knobs_reason
                await pilot.press("m")
                await pilot.pause(0.2)
                assert s.scheduler_config.mode == "chunked"  # nothing changed
                assert len(server.samples()) > n0
                await pilot.press("q")

        drive(s, go)
    t = read_trace(trace)
    assert t.meta["source"] == {"kind": "attached", "urls": [srv.url]}
    assert {x.server for x in t.scrapes} == {"vllm"}
    assert t.scrapes and all(x.url == srv.url + "/metrics" for x in t.scrapes)
    assert {x.values.get("running") for x in t.scrapes if not x.error} == {7.0, 0.0}
    assert t.complete and not t.problems
    assert t.end["counts"]["scrape"] == len(t.scrapes)


@pytest.mark.parametrize("case", ["refused", "404", "500", "unknown", "not_text"])
def test_bad_servers_are_one_status_line_and_the_session_goes_on(tmp_path, case):
    texts = {"unknown": "# HELP foo_total x\n# TYPE foo_total counter\nfoo_total 3\n",
             "not_text": "<html>hello</html>\n"}
    srv = FakeServer(texts.get(case, LOAD), status={"500": 500}.get(case, 200),
                     metrics=case != "404")
    if case == "refused":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sock.close()
        ctx = None
    else:
        ctx = srv.__enter__()
        url = srv.url
    want = {"refused": "cannot reach it", "404": "HTTP 404", "500": "HTTP 500",
            "unknown": "no vLLM, SGLang or gpuchef series", "not_text": "not Prometheus text"}
    try:
        app = build(["--attach", url, "--scrape-hz", "10", "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                assert await wait_for(pilot, lambda: len(s.servers[0].samples()) >= 3)
                await pilot.pause(0.3)
                lines = s.status_lines
                assert len(lines) == 1 and want[case] in lines[0], lines
                header = str(app.screen.query_one("#a-header").render())
                assert want[case] in header
                # the panels give the same reason, not "no … series in its /metrics"
                for pid in ("#a-queue", "#a-batch"):
                    line = app.screen.query_one(pid)._strips[0].text
                    assert "no scrape — " in line and want[case] in line, line
                    assert "series in its /metrics" not in line.replace(want[case], "")
                if case == "404":
                    assert "--enable-metrics" in lines[0]
                n = len(s.servers[0].samples())
                await pilot.pause(0.5)
                assert len(s.servers[0].samples()) > n  # still scraping
                if ctx is not None and case != "404":
                    srv.text, srv.status = LOAD, 200  # the server recovers: the line goes
                    assert await wait_for(pilot, lambda: not s.status_lines)
                await pilot.press("q")

        drive(s, go)
    finally:
        if ctx is not None:
            srv.__exit__(None, None, None)


@pytest.mark.parametrize("args,msg", [
    (["--attach", "http://127.0.0.1:1", "--model", "tiny"], "--model does not apply with --attach"),
    (["--attach", "http://127.0.0.1:1", "--serve"], "--serve does not apply with --attach"),
    (["--attach", "http://127.0.0.1:1", "--cudagraph-mode", "FULL_DECODE_ONLY",
      "--cudagraph-capture-sizes", "16"],
     "--cudagraph-mode, --cudagraph-capture-sizes do not apply with --attach"),
    (["--attach", "http://127.0.0.1:1", "--max-num-batched-tokens", "64", "--mode", "chunked"],
     "--mode, --max-num-batched-tokens do not apply"),
    (["--scrape-hz", "2"], "--scrape-hz needs --attach"),
    (["--attach", "ftp://x"], "--attach 'ftp://x' must be http"),
    (["--attach", "http://127.0.0.1:1", "--scrape-hz", "0"], "--scrape-hz 0 is out of range"),
    (["--attach", "http://127.0.0.1:1", "--attach", "http://127.0.0.1:1/metrics"],
     "is given twice"),
])
def test_attach_flags_that_make_no_sense_are_one_error(args, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)):
        build(args)


def test_a_user_and_password_in_the_url_are_refused_and_never_shown():
    for url in ("http://me:s3cret@127.0.0.1:1", "ftp://me:s3cret@127.0.0.1:1/metrics"):
        with pytest.raises(ConfigError) as e:
            build(["--attach", url, "--request-rate", "2"])
        msg = str(e.value)
        assert "s3cret" not in msg and "me:" not in msg
        assert msg.startswith(f"--attach '{url.split('//')[0]}//***@127.0.0.1:1") and \
            "--api-key" in msg, msg


def test_load_to_an_unreachable_server_is_refused_before_start(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    with pytest.raises(ConfigError, match=f"--attach {url}: cannot connect"):
        build(["--attach", url, "--dataset", "random", "--num-prompts", "3"])


def test_attach_to_gpuchef_serve_with_gpuchefs_load_matches_the_servers_trace(tmp_path):
    """The dashboard on `gpuchef serve --model tiny` (a subprocess) while gpuchef sends its
    load: the scrape intervals' generation-token rates integrate to the tokens the server's
    trace generated and the client received (exactly: counters), the running gauge's time
    average matches the server's steps' within 30 % (scrapes at 10 Hz sample a gauge), and the
    knobs are live (a PATCH the server's knob endpoint then reports)."""
    import json
    import urllib.request

    from serve_proc import ServeProc

    strace = tmp_path / "serve.jsonl"
    with ServeProc("--max-model-len", "256", "--trace", str(strace)) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--dataset", "random",
                     "--input-len", "24", "--output-len", "12", "--request-rate", "4",
                     "--num-prompts", "10", "--screenshot-dir", str(tmp_path)])
        s = app.session
        server = s.servers[0]

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                assert await wait_for(pilot, lambda: s.load.state().done, timeout=25)
                await pilot.pause(0.6)  # scrapes after the last token
                assert server.kind == "gpuchef" and s.knobs_reason == ""
                assert app.request_knob("max_num_batched_tokens", 256)
                await pilot.pause(1.2)
                assert "budget 256" in str(app.screen.query_one("#a-knobs").render())
                await pilot.press("q")

        drive(s, go)
        with urllib.request.urlopen(srv.url + "/gpuchef/v1/scheduler", timeout=5) as r:
            assert json.loads(r.read())["max_num_batched_tokens"] == 256
    tr = read_trace(strace)
    deltas = server.deltas()
    gen = sum(d.rates["generation_tokens"] * d.dt_s for d in deltas)
    client = s.timeline.snapshot().requests
    assert len(client) == 10 and all(r.finish_reason == "length" for r in client)
    assert round(gen) == sum(r.output_len for r in tr.requests) == \
        sum(r.output_len for r in client) == 120
    prompt = sum(d.rates["prompt_tokens"] * d.dt_s for d in deltas)
    assert round(prompt) == sum(r.prompt_len for r in tr.requests)
    # time-averaged running requests over the load: the scrapes' gauge vs the server's steps
    t0, t1 = min(r.arrival_ns for r in client), max(r.token_times_ns[-1] for r in client)
    ds = [d for d in deltas if t0 <= d.t_ns <= t1]
    scraped = sum(d.gauges["running"] * d.dt_s for d in ds) / sum(d.dt_s for d in ds)
    steps = [x for x in tr.steps if t0 <= x.t_end_ns <= t1]
    # a step's queue holds from its end to the next step's end
    held = [(b.t_end_ns - a.t_end_ns, a.num_running) for a, b in zip(steps, steps[1:])]
    stepped = sum(dt * n for dt, n in held) / sum(dt for dt, _ in held)
    assert scraped == pytest.approx(stepped, rel=0.3, abs=0.5)


def test_a_server_that_closes_streams_early_is_one_status_line_and_nothing_is_lost(tmp_path):
    trace = tmp_path / "cut.jsonl"
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--dataset", "random",
                     "--input-len", "8", "--output-len", "4", "--request-rate", "40",
                     "--num-prompts", "5", "--trace", str(trace),
                     "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                assert await wait_for(pilot, lambda: s.load.state().done)
                await pilot.pause(0.3)
                lines = s.status_lines
                assert len(lines) == 1, lines
                assert lines[0].startswith("load: 5 requests: stream closed early"), lines
                assert "after 2 chunk(s)" in lines[0]
                header = str(app.screen.query_one("#a-header").render())
                assert "stream closed early" in header
                n = len(s.servers[0].samples())
                await pilot.pause(0.4)
                assert len(s.servers[0].samples()) > n  # the session goes on
                await pilot.press("p")  # a load that cannot pause says why, nothing breaks
                await pilot.pause(0.1)
                await pilot.press("q")

        drive(s, go)
    reqs = s.timeline.snapshot().requests
    assert len(reqs) == 5 and all(r.finish_reason == "error" for r in reqs)
    t = read_trace(trace)
    assert sorted(r.request_id for r in t.requests) == sorted(r.request_id for r in reqs)
    assert all("stream_cut" in r.error for r in t.requests)
    assert t.scrapes and t.complete


def test_several_servers_one_numbers_column_each_and_v_switches_the_charts(tmp_path):
    """Two vLLM servers (one under load, one idle) and a third that is down: a column each with
    its own values, one status line for the one that is down, ``v`` charts the next server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    with FakeServer(LOAD) as a, FakeServer(AFTER) as b:
        app = build(["--attach", a.url, "--attach", b.url, "--attach", down, "--scrape-hz", "10",
                     "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(190, 50)) as pilot:
                scr = app.screen
                assert await wait_for(pilot, lambda: all(len(x.deltas()) >= 1
                                                         for x in s.servers[:2]))
                await pilot.pause(1.2)
                assert scr.shown[a.url]["running"] == _value(LOAD, "vllm:num_requests_running")
                assert scr.shown[b.url]["running"] == _value(AFTER, "vllm:num_requests_running")
                assert scr.shown[a.url]["kv_usage"] == pytest.approx(
                    _value(LOAD, "vllm:kv_cache_usage_perc"))
                assert scr.shown[down]["running"] is None
                text = str(scr.numbers.render())
                for u in (a.url, b.url, down):
                    assert u.split("//")[1] in text
                assert len(s.status_lines) == 1 and down in s.status_lines[0]
                title = scr.scrape_panels[0].title_strip(190).text
                assert a.url.split("//")[1] in title and "(1/3, v)" in title
                await pilot.press("v")
                await pilot.pause(0.2)
                title = scr.scrape_panels[0].title_strip(190).text
                assert b.url.split("//")[1] in title and "(2/3, v)" in title
                await pilot.press("q")

        drive(s, go)


def test_e_without_trace_writes_every_scrape_held_and_goes_on_recording(tmp_path):
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "20", "--screenshot-dir", str(tmp_path)])
        s = app.session
        out = tmp_path / "e.jsonl"

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                assert await wait_for(pilot, lambda: len(s.servers[0].samples()) >= 5)
                msg = await asyncio.to_thread(s.export_trace, str(out))
                assert "recording goes on there" in msg and s.trace_path == str(out)
                n = len(s.servers[0].samples())
                assert await wait_for(pilot, lambda: len(s.servers[0].samples()) >= n + 5)
                await pilot.press("q")

        drive(s, go)
    t = read_trace(out)
    held = s.servers[0].samples()
    # every scrape the session made is in the file, once, in time order
    assert [x.t_ns for x in t.scrapes] == [x.t_ns for x in held]
    assert t.meta["backfilled_from_timeline"] and t.complete


def test_local_gpus_through_the_nvml_sampler_with_gpus_and_off_with_the_reason_without(tmp_path):
    import numpy as np

    from gpuchef.sessions.attach import AttachSession
    from gpuchef.probes.nvml.fake import FakeNvml
    from gpuchef.tui.app import GpuchefApp

    fetch = lambda url, timeout: LOAD  # noqa: E731  (no HTTP: the scrapes read the text)
    for gpus in ([0], None):
        s = AttachSession(["http://127.0.0.1:9"], scrape_hz=10, gpus=gpus, sample_hz=20,
                          nvml=FakeNvml(1, pcie_window_s=0), fetch=fetch)
        app = GpuchefApp(s, window_s=10.0, screenshot_dir=str(tmp_path))
        s.start()

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                scr = app.screen
                gpu = scr.query_one("#a-gpu")
                if gpus:
                    assert await wait_for(pilot, lambda: len(s.timeline.snapshot().gpu_samples) > 5)
                    await pilot.pause(0.5)
                    assert s.gpu_available and gpu.off_reason == ""
                    sm = gpu._frame.gpu["sm_active"]
                    assert np.isfinite(sm).any()
                    assert scr.query_one("#a-mem").display
                else:
                    await pilot.pause(0.3)
                    assert not s.gpu_available and "no --gpus" in gpu.off_reason
                    assert not scr.query_one("#a-mem").display
                # the scrapes go on either way (LOAD's 7 running requests and still counters:
                # no step ended, so the first interval closes after NO_STEP_MERGE_MAX_S)
                assert await wait_for(pilot, lambda: len(s.servers[0].deltas()) >= 1)
                await pilot.press("q")

        drive(s, go)


def test_knobs_live_through_the_knob_endpoint_and_a_refusal_is_the_servers_message(tmp_path):
    with FakeServer(LOAD, knobs=True) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                await pilot.pause(0.3)
                assert s.knobs_reason == "" and s.scheduler_config.max_num_batched_tokens == 512
                await pilot.press("plus")  # budget ×2: 1024, accepted
                await pilot.pause(0.2)
                assert srv.patches[-1] == {"max_num_batched_tokens": 1024}
                assert s.scheduler_config.max_num_batched_tokens == 1024
                await pilot.press("plus")  # 2048: the server refuses, nothing changes
                await pilot.pause(0.3)
                assert srv.state["max_num_batched_tokens"] == 1024
                assert any("above this engine's limit 1024" in str(n.message)
                           for n in app._notifications)
                await pilot.press("m")
                await pilot.pause(0.2)
                assert srv.state["mode"] == "continuous"
                assert "mode continuous" in str(app.screen.query_one("#a-knobs").render())
                await pilot.press("q")

        drive(s, go)


def test_headless_bad_attach_is_one_error_line_and_exit_2():
    from serve_proc import run_cli

    r = run_cli("top", "--attach", "http://127.0.0.1:1", "--serve", timeout=60)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: --serve does not apply with --attach")


def test_sglang_server_queue_from_its_names_and_the_batch_panel_says_it_has_no_source(tmp_path):
    text = (DATA / "sglang_metrics.txt").read_text()  # built from SGLang's documented names
    with FakeServer(text) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                assert await wait_for(pilot, lambda: len(s.servers[0].deltas()) >= 1)
                await pilot.pause(1.2)
                scr = app.screen
                assert s.servers[0].kind == "sglang"
                want = (_value(text, "sglang:num_running_reqs"), _value(text, "sglang:num_queue_reqs"))
                got = (scr.shown[srv.url]["running"], scr.shown[srv.url]["waiting"])
                assert got == want
                batch = scr.query_one("#a-batch")
                line = batch._strips[0].text
                assert "no source" in line and "no per-iteration token histogram" in line
                queue = scr.query_one("#a-queue")._strips[0].text
                assert "no source" not in queue
                await pilot.press("q")

        drive(s, go)


def test_two_servers_one_band_each_in_the_charts(tmp_path):
    with FakeServer(LOAD) as a, FakeServer(AFTER) as b:
        app = build(["--attach", a.url, "--attach", b.url, "--scrape-hz", "10",
                     "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 60)) as pilot:
                assert await wait_for(pilot, lambda: all(x.deltas() for x in s.servers))
                await pilot.pause(0.5)
                rows = [st.text for st in app.screen.query_one("#a-queue")._strips]
                ia = next(i for i, r in enumerate(rows) if r.startswith(" 1: " + a.url[7:]))
                ib = next(i for i, r in enumerate(rows) if r.startswith(" 2: " + b.url[7:]))
                assert ia < ib
                band_a, band_b = "\n".join(rows[ia:ib]), "\n".join(rows[ib:])
                ra = int(_value(LOAD, "vllm:num_requests_running"))
                rb = int(_value(AFTER, "vllm:num_requests_running"))
                assert f"R {ra}" in band_a and f"R {rb}" in band_b and ra != rb
                await pilot.press("v")  # the order rotates
                await pilot.pause(0.3)
                rows = [st.text for st in app.screen.query_one("#a-queue")._strips]
                assert any(r.startswith(" 1: " + b.url[7:]) for r in rows)
                await pilot.press("q")

        drive(s, go)


def test_narrow_terminal_hides_the_side_panel_and_n_shows_it(tmp_path):
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(80, 24)) as pilot:
                await pilot.pause(0.5)
                scr = app.screen
                side, waves = scr.query_one("#a-side"), scr.query_one("#a-waves")
                assert not side.display or side.size.width == 0
                assert waves.size.width == 80
                await pilot.press("n")
                await pilot.pause(0.3)
                assert side.size.width == 80 and waves.size.width == 0
                await pilot.press("q")

        drive(s, go)


def _idle_text() -> str:
    """vLLM-like text whose histogram is declared but has no sample yet (a labelled family
    with no child), with gauges and counters."""
    return ("# HELP vllm:iteration_tokens_total x\n# TYPE vllm:iteration_tokens_total histogram\n"
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0\n")


def test_idle_server_batch_panel_says_idle_not_absent_and_draws_once_observed(tmp_path):
    with FakeServer(_idle_text()) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                scr = app.screen
                assert await wait_for(pilot, lambda: len(s.servers[0].deltas()) >= 2)
                await pilot.pause(0.3)
                line = scr.query_one("#a-batch")._strips[0].text
                assert "idle — " in line and "vllm:iteration_tokens_total" in line, line
                assert "no per-iteration token histogram" not in line
                # the same panel when the family is not there at all
                srv.text = _idle_text().split("# TYPE vllm:num_requests_running", 1)[0] \
                    .replace("iteration_tokens_total", "other_total") + _idle_text().split(
                        "\n", 2)[2]
                n = len(s.servers[0].samples())
                assert await wait_for(pilot, lambda: len(s.servers[0].samples()) > n + 2)
                await pilot.pause(0.3)
                line = scr.query_one("#a-batch")._strips[0].text
                assert "no source — " in line and "no per-iteration token histogram" in line
                # observations: the chart is drawn (no ⊘ line)
                srv.text = LOAD
                assert await wait_for(pilot, lambda: "⊘" not in scr.query_one(
                    "#a-batch")._strips[0].text)
                await pilot.press("q")

        drive(s, go)


def test_impossible_gauges_are_refused_by_name_and_panel_and_numbers_agree(tmp_path):
    """waiting −5 and KV usage 1e308: one status line naming both; neither is drawn nor
    shown as a number (the chart's KV figure and the numbers column both say –)."""
    text = re.sub(r"^(vllm:num_requests_waiting(?:\{[^}]*\})?) \S+$", r"\1 -5", LOAD, flags=re.M)
    text = re.sub(r"^(vllm:kv_cache_usage_perc(?:\{[^}]*\})?) \S+$", r"\1 1e308", text,
                  flags=re.M)
    assert text != LOAD
    with FakeServer(text) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10", "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                scr = app.screen
                assert await wait_for(pilot, lambda: len(s.servers[0].deltas()) >= 2)
                await pilot.pause(1.2)  # a numbers refresh
                lines = s.status_lines
                assert len(lines) == 1, lines
                assert "vllm:num_requests_waiting = -5.0" in lines[0]
                assert "vllm:kv_cache_usage_perc = 1e+308" in lines[0]
                shown = scr.shown[srv.url]
                assert shown["waiting"] is None and shown["kv_usage"] is None
                assert shown["running"] == _value(LOAD, "vllm:num_requests_running")
                queue = "\n".join(x.text for x in scr.query_one("#a-queue")._strips)
                assert "inf%" not in queue and "W -5" not in queue
                assert "W –" in queue, queue
                await pilot.press("q")

        drive(s, go)


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("prometheus") is None,
                    reason="needs Debian's prometheus (.ci/run installs it)")
def test_prometheus_fleet_one_column_per_target_and_the_trace_records_both(tmp_path):
    """`top --prometheus URL`: the two gpuchef servers a real Prometheus scrapes, a column each
    with the values their own /metrics give, and a trace of both (issue 29 item 3)."""
    from openai import OpenAI
    from serve_proc import PrometheusProc, ServeProc

    from gpuchef.probes.scrape import parse_metrics

    with ServeProc() as a, ServeProc() as b, \
            PrometheusProc([u.split("://", 1)[1] for u in (a.url, b.url)], tmp_path) as prom:
        t0 = time.monotonic()
        app = None
        while app is None:  # until Prometheus has scraped both (its first scrape: ~1 s)
            try:
                app = build(["--prometheus", prom.url, "--scrape-hz", "4",
                             "--trace", str(tmp_path / "t.jsonl"),
                             "--screenshot-dir", str(tmp_path)])
            except ConfigError as e:
                assert time.monotonic() - t0 < 60, e
                time.sleep(0.5)
                continue
            if len(app.session.servers) < 2:
                app.session.close()
                app = None
                time.sleep(0.5)
        s = app.session
        assert sorted(x.url for x in s.servers) == sorted([a.url, b.url])
        c = OpenAI(base_url=a.url + "/v1", api_key="x")
        for n in (6, 10):
            c.completions.create(model="tiny", prompt=[12] * n, max_tokens=3)
        with urllib.request.urlopen(a.url + "/metrics", timeout=10) as r:
            direct = parse_metrics(r.read().decode())

        async def go():
            async with app.run_test(size=(190, 50)) as pilot:
                scr = app.screen
                srv = {x.url: x for x in s.servers}

                def newest(u, q):
                    good = [x for x in srv[u].samples() if not x.error]
                    return good[-1].values.get(q) if good else None
                assert await wait_for(pilot, lambda: newest(a.url, "requests_finished")
                                      == direct.values["requests_finished"], 30)
                assert newest(a.url, "prompt_tokens") == direct.values["prompt_tokens"] == 16
                assert newest(b.url, "prompt_tokens") == 0
                assert srv[a.url].kind == srv[b.url].kind == "gpuchef"
                await pilot.pause(1.2)  # the numbers panel's next second
                assert scr.shown[a.url]["running"] == scr.shown[b.url]["running"] == 0
                text = str(scr.numbers.render())
                assert a.url.split("//")[1] in text and b.url.split("//")[1] in text
                await pilot.press("q")

        drive(s, go)
    tr = read_trace(tmp_path / "t.jsonl")
    assert tr.meta["source"]["prometheus"] == prom.url
    assert {x.url for x in tr.scrapes} == {a.url, b.url}
    last = [x for x in tr.scrapes if x.url == a.url and not x.error][-1]
    assert last.values["prompt_tokens"] == direct.values["prompt_tokens"] == 16
