"""`gpuchef top --attach URL --plugin HOST:PORT`: the attach screen from gpuchef's vLLM plugin
(gpuchef/sessions/attach_plugin.py), end to end on the CPU. A fake vLLM front end (the stand-ins
of test_vllm_plugin.py, shaped like vLLM 0.24's SchedulerStats/IterationStats) calls the real
plugin's record() for two engines; the plugin publishes on a free loopback port; `top --attach`
reads it with its /metrics served by test_attach.py's fake vLLM server. The panels show what was
sent (decode rows and prefill tokens add up), one band per engine, each panel's source named;
the trace keeps the records, and replay and the report draw the same iterations. Without plugin
records the /metrics panels stay and the step waveform's line says why; bad --plugin values are
one error line each."""

from __future__ import annotations

import asyncio

import pytest

import gpuchef.vllm_plugin as plugin_pkg
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.probes.recorder import read_trace
from test_attach import LOAD, FakeServer, build, drive, wait_for
from test_vllm_plugin import (CUDAGraphStat, EngineCoreOutputs, FakeHost, IterationStats,
                              PromptTokenStats, SchedulerStats)

N = 40  # output batches per engine


def batch(engine: int, k: int) -> tuple[EngineCoreOutputs, IterationStats, dict]:
    """Batch ``k`` of ``engine`` and what the dashboard must count of it: engine 0 runs with
    --cudagraph-metrics (a 128-token prefill chunk every other step), engine 1 without (prefill
    counted as the prompts completed: 200 tokens each)."""
    d = 1 + (k + engine) % 4
    f = 1 if k % 3 == 0 else 0
    s = SchedulerStats(num_running_reqs=d + f + 1, num_waiting_reqs=k % 3,
                       kv_cache_usage=(k % 50) / 100)
    chunk = 128 if k % 2 == 0 else 0
    if engine == 0:
        s.cudagraph_stats = CUDAGraphStat(num_unpadded_tokens=d + chunk,
                                          num_padded_tokens=d + chunk + 8, num_paddings=8,
                                          runtime_mode="PIECEWISE")
    it = IterationStats()
    it.num_generation_tokens = d + f
    it.prompt_token_stats = PromptTokenStats(computed=200 * f, total=200 * f)
    it.time_to_first_tokens_iter = [0.3] * f
    it.inter_token_latencies_iter = [0.02] * d
    want = {"decode": d, "prefill": chunk if engine == 0 else 200 * f, "running": d + f + 1}
    return EngineCoreOutputs(engine, d + f, s), it, want


@pytest.fixture
def vllm(monkeypatch):
    """The fake front end with the plugin on (GPUCHEF_PUBLISH=127.0.0.1:0: a free port), two
    engines; yields (host, "127.0.0.1:PORT")."""
    for k in ("GPUCHEF_PUBLISH_ALLOW_REMOTE", "GPUCHEF_PUBLISH_HWM"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GPUCHEF_PUBLISH", "127.0.0.1:0")
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0, 1])
    try:
        yield host, host.instances[0].endpoint.removeprefix("tcp://")
    finally:
        host.close()


async def send(host, sent: dict[int, list[dict]]) -> None:
    """N batches per engine, the engines interleaved, a little apart (intervals to measure)."""
    assert host.instances[0].publisher.wait_for_readers(1, 10)
    for k in range(N):
        for e in (0, 1):
            out, it, want = batch(e, k)
            host.output(out, it)
            sent[e].append(want)
        await asyncio.sleep(0.015)


def test_two_engines_two_bands_what_was_sent_the_sources_and_the_trace(vllm, tmp_path):
    host, ep = vllm
    trace = tmp_path / "p.jsonl"
    sent: dict[int, list[dict]] = {0: [], 1: []}
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--plugin", ep, "--scrape-hz", "10", "--window", "10s",
                     "--trace", str(trace), "--screenshot-dir", str(tmp_path)])
        s = app.session
        keys = [(f"tcp://{ep}", 0), (f"tcp://{ep}", 1)]

        async def go():
            async with app.run_test(size=(170, 70)) as pilot:
                scr = app.screen
                assert await wait_for(pilot, lambda: scr.ready)
                await send(host, sent)
                assert await wait_for(pilot, lambda: all(
                    k in scr.plugin_view.cols and len(scr.plugin_view.cols[k]) == N
                    for k in keys))
                await pilot.pause(1.2)  # a numbers refresh
                check_screen(scr, srv.url, ep, sent)
                await pilot.press("q")

        drive(s, go)
        live = {k: s.plugin.log.rows(k) for k in keys}
    check_trace(trace, srv.url, ep, live, sent)


def check_screen(scr, url: str, ep: str, sent: dict[int, list[dict]]) -> None:
    name = url.removeprefix("http://")
    frames = scr.plugin_frames
    assert [f.label for f in frames] == [f"{name} · engine 0", f"{name} · engine 1"]
    for e, f in enumerate(frames):
        c = scr.plugin_view.cols[(f"tcp://{ep}", e)]
        # every batch sent is a row: its decode rows and prefill tokens add up
        assert int(c.decode.sum()) == sum(w["decode"] for w in sent[e])
        assert int(c.prefill.sum()) == sum(w["prefill"] for w in sent[e])
        # each slice draws a batch that was sent (its largest), and the largest prefill shows
        w = f.wave
        ok = w.prefill_per_step == w.prefill_per_step
        drawn = set(zip(w.prefill_per_step[ok].astype(int), w.decode_per_step[ok].astype(int)))
        assert drawn and drawn <= {(x["prefill"], x["decode"]) for x in sent[e]}
        assert max(w.prefill_per_step[ok]) == max(x["prefill"] for x in sent[e])
        assert f.prefill_scheduled == (e == 0)
        assert 5 < c.interval_ms[-1] < 2000  # the time between this engine's last two batches
    for pid in ("#a-iter", "#a-pbatch", "#a-pqueue"):
        p = scr.query_one(pid)
        assert p.display
        rows = [st.text for st in p._strips]
        i0 = next(i for i, r in enumerate(rows) if r.startswith(f" 1: {name} · engine 0"))
        i1 = next(i for i, r in enumerate(rows) if r.startswith(f" 2: {name} · engine 1"))
        assert i0 < i1
        assert "from gpuchef's vLLM plugin · per output batch" in p.title_strip(260).text
        if pid == "#a-pqueue":  # each band's readout: its engine's newest batch
            assert f"R {sent[0][-1]['running']}" in "\n".join(rows[i0:i1])
            assert f"R {sent[1][-1]['running']}" in "\n".join(rows[i1:])
        if pid == "#a-pbatch":
            assert "prefill = scheduled tokens − decode rows" in rows[i0]
            assert "prefill = prompts completed" in rows[i1]
    # the plugin's panels replace the step line, and the /metrics queue and batch estimate
    assert not scr.query_one("#a-steps").display
    assert not scr.query_one("#a-queue").display and not scr.query_one("#a-batch").display
    assert scr.query_one("#a-rates").display  # token rates stay from /metrics
    src = str(scr.query_one("#a-sources").render())
    assert f"{name}: steps, batches, queue/KV from gpuchef's vLLM plugin (tcp://{ep})" in src
    assert "token rates, server latency: /metrics" in src
    nums = str(scr.query_one("#a-plugin").render())
    assert "engine 0" in nums and "engine 1" in nums and f"{N:>16}" in nums  # records


def check_trace(trace, url: str, ep: str, live: dict, sent: dict[int, list[dict]]) -> None:
    from gpuchef.report.data import build, view_trace
    from gpuchef.report.html import render
    from gpuchef.report.plugin_plots import plugin_figure, trace_frames
    from gpuchef.sessions.replay import ReplaySession

    t = read_trace(trace)
    assert t.meta["source"]["plugin"] == {url: f"tcp://{ep}"}
    assert t.end["counts"]["plugin"] == len(t.plugin) == 2 * N and not t.problems
    # replay at the end: the rows the live dashboard drew, exactly
    rs = ReplaySession(trace)
    rs.seek(rs.end_ns)
    for key, rows in live.items():
        assert rs.plugin.since(key, 0)[0] == rows
        assert len(rows) == N
    # halfway, only the rows recorded before the position
    mid = live[(f"tcp://{ep}", 0)][N // 2].t_ns
    rs.seek(mid)
    assert len(rs.plugin.since((f"tcp://{ep}", 0), 0)[0]) == N // 2 + 1
    # the report bins the same rows: the same sums, the same largest batch
    view = view_trace(read_trace(trace))
    frames = trace_frames(view)
    assert [lab for lab, _ in frames] == [f"{url[7:]} engine 0", f"{url[7:]} engine 1"]
    for e, (_, f) in enumerate(frames):
        steps = f.wave.steps
        assert int(steps[steps == steps].sum()) == N
        pre = f.wave.prefill_per_step
        assert max(pre[pre == pre]) == max(x["prefill"] for x in sent[e])
    assert plugin_figure(view).startswith("<svg")
    page = render(build([trace], percentiles=(50.0, 99.0)))
    assert 'id="fig-plugin-p"' in page and "the server's output batches from gpuchef" in \
        page.replace("&#x27;", "'")


def test_replay_of_a_plugin_trace_draws_the_bands(vllm, tmp_path):
    """`gpuchef replay` of an attached trace with plugin records: the attach screen's plugin
    panels, cut at the playback position."""
    from gpuchef.commands.replay import build_app

    host, ep = vllm
    trace = tmp_path / "p.jsonl"
    sent: dict[int, list[dict]] = {0: [], 1: []}
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--plugin", ep, "--scrape-hz", "10",
                     "--trace", str(trace), "--screenshot-dir", str(tmp_path)])

        async def go():
            async with app.run_test(size=(170, 60)) as pilot:
                await send(host, sent)
                assert await wait_for(pilot, lambda: sum(
                    len(app.session.plugin.log.rows(k)) for k in app.session.plugin.keys())
                    == 2 * N)
                await pilot.press("q")

        drive(app.session, go)
    rapp = build_app(str(trace), paused=True, screenshot_dir=str(tmp_path))

    async def replay():
        async with rapp.run_test(size=(170, 60)) as pilot:
            assert await wait_for(pilot, lambda: getattr(rapp.screen, "ready", False))
            rapp.action_seek_edge(1)  # the end
            await pilot.pause(0.5)
            scr = rapp.screen
            assert [f.label for f in scr.plugin_frames] == [
                f"{srv.url[7:]} · engine 0", f"{srv.url[7:]} · engine 1"]
            for e in (0, 1):
                c = scr.plugin_view.cols[(f"tcp://{ep}", e)]
                assert int(c.decode.sum()) == sum(w["decode"] for w in sent[e])
            assert scr.query_one("#a-pbatch").display and not scr.query_one("#a-steps").display
            rapp.seek_to("0")  # before the first batch: the line says none was recorded yet
            await pilot.pause(0.5)
            assert all(f.wave is None for f in scr.plugin_frames)
            await pilot.press("q")

    asyncio.run(replay())


def test_without_plugin_records_the_metrics_panels_stay_and_the_line_says_why(tmp_path):
    import socket

    with socket.socket() as sk:  # a free port nobody publishes on
        sk.bind(("127.0.0.1", 0))
        silent = sk.getsockname()[1]
    with FakeServer(LOAD) as a, FakeServer(LOAD) as b:
        app = build(["--attach", a.url, "--attach", b.url, "--plugin", "-", "--plugin",
                     f"127.0.0.1:{silent}", "--scrape-hz", "10", "--screenshot-dir",
                     str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 60)) as pilot:
                scr = app.screen
                assert await wait_for(pilot, lambda: all(x.deltas() for x in s.servers))
                await pilot.pause(1.2)
                line = str(scr.query_one("#a-steps").render())
                assert scr.query_one("#a-steps").display
                assert "no per-step records" in line
                assert f"no record from tcp://127.0.0.1:{silent} yet" in line
                assert not any(scr.query_one(x).display for x in ("#a-iter", "#a-pbatch",
                                                                  "#a-pqueue"))
                assert scr.query_one("#a-queue").display and scr.query_one("#a-batch").display
                src = str(scr.query_one("#a-sources").render())
                assert f"{a.url[7:]}: queue/KV, batch estimate from /metrics; no plugin " \
                       "records (--plugin not given)" in src
                await pilot.press("q")

        drive(s, go)
    with FakeServer(LOAD) as srv:  # no --plugin at all
        app = build(["--attach", srv.url, "--screenshot-dir", str(tmp_path)])

        async def go2():
            async with app.run_test(size=(170, 50)) as pilot:
                assert await wait_for(pilot, lambda: app.screen.ready)
                line = str(app.screen.query_one("#a-steps").render())
                assert line.startswith(" ▍Step waveform  ⊘ no plugin records (--plugin not "
                                       "given) — no per-step records"), line
                await pilot.press("q")

        drive(app.session, go2)


@pytest.mark.parametrize("args, msg", [
    (["--plugin", "5557"], "--plugin '5557': '5557' is not HOST:PORT"),
    (["--plugin", "127.0.0.1:99999"], "the port 99999 is not in 0..65535"),
    (["--plugin", "127.0.0.1:x"], "the port 'x' is not a number"),
    (["--plugin", "127.0.0.1:0"], "port 0 lets vLLM's plugin pick a free port"),
    (["--plugin", "127.0.0.1:5557", "--plugin", "127.0.0.1:5558"],
     "--plugin is given 2 times for 1 --attach URL(s)"),
])
def test_bad_plugin_values_are_one_error_naming_the_value_and_what_is_allowed(args, msg):
    with pytest.raises(ConfigError) as e:
        build(["--attach", "http://127.0.0.1:1", *args])
    assert msg in str(e.value)
    if "times" not in msg:
        assert "allowed: HOST:PORT as vLLM was started with GPUCHEF_PUBLISH=HOST:PORT" \
            in str(e.value)


def test_plugin_twice_or_without_attach_is_refused():
    with pytest.raises(ConfigError, match="--plugin tcp://127.0.0.1:5557 is given twice"):
        build(["--attach", "http://127.0.0.1:1", "--attach", "http://127.0.0.1:2",
               "--plugin", "127.0.0.1:5557", "--plugin", "tcp://127.0.0.1:5557"])
    from click.testing import CliRunner

    from gpuchef.commands.top import top

    r = CliRunner().invoke(top, ["--plugin", "127.0.0.1:5557"])
    assert r.exit_code == 2
    assert "--plugin needs --attach URL (a server to watch)" in r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1


def test_plugin_values_are_what_gpuchef_publish_takes():
    """parse_plugin's spellings: what GPUCHEF_PUBLISH takes, normalised to tcp://."""
    from gpuchef.sessions.attach_plugin import parse_plugin

    assert parse_plugin("127.0.0.1:5557") == "tcp://127.0.0.1:5557"
    assert parse_plugin(" tcp://127.0.0.1:5557 ") == "tcp://127.0.0.1:5557"
    assert parse_plugin("[::1]:5557") == "tcp://[::1]:5557"
    assert parse_plugin("localhost:5557") == "tcp://127.0.0.1:5557"
    assert parse_plugin("-") == ""


def test_e_writes_the_plugin_records_held_and_records_on(vllm, tmp_path):
    host, ep = vllm
    sent: dict[int, list[dict]] = {0: [], 1: []}
    out = tmp_path / "e.jsonl"
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--plugin", ep, "--scrape-hz", "10",
                     "--screenshot-dir", str(tmp_path)])
        s = app.session

        async def go():
            async with app.run_test(size=(170, 60)) as pilot:
                await send(host, sent)
                assert await wait_for(pilot, lambda: sum(
                    s.plugin.counts(k).received for k in s.plugin.keys()) == 2 * N)
                msg = s.export_trace(str(out))
                assert f"{2 * N} plugin records" in msg
                host.output(*batch(0, N)[:2])  # one more, recorded there
                assert await wait_for(pilot, lambda: s.plugin.counts(
                    (f"tcp://{ep}", 0)).received == N + 1)
                await pilot.press("q")

        drive(s, go)
    t = read_trace(out)
    assert len(t.plugin) == 2 * N + 1 and not t.problems
    assert t.meta["source"]["plugin"] == {srv.url: f"tcp://{ep}"}


def test_lost_records_are_one_status_line_per_engine():
    from gpuchef.probes.plugin_reader import Received
    from gpuchef.probes.plugin_wire import PluginRecord
    from gpuchef.sessions.attach_plugin import PluginSource

    src = PluginSource({"http://h:8000": "tcp://127.0.0.1:5557"})
    for seq, gap, dropped in ((0, 0, 0), (6, 5, 3), (7, 0, 0)):
        src.log.add(Received("tcp://127.0.0.1:5557", PluginRecord(
            v=1, pub=1, engine_idx=1, seq=seq, has_sched=True, running=1, waiting=0),
            dropped, gap, dropped, seq == 0, 0, seq * 1000))
    assert src.status("http://h:8000") == "" and src.status("http://other:1") == \
        "no plugin records (--plugin not given)"
    assert src.status_lines == [
        "plugin tcp://127.0.0.1:5557 engine 1: 5 of 8 records lost (3 dropped by vLLM's "
        "publisher: this reader fell behind; 2 while reconnecting)"]


def test_a_trace_of_plugin_records_without_a_scrape_replays_its_bands(tmp_path):
    """An attached trace that holds plugin records but no /metrics scrape (cut short before the
    first, or made of a plugin records file): its server still gets a band, the plugin panels
    draw the rows, and the /metrics panels and the header say there is no scrape."""
    from gpuchef.commands.replay import build_app
    from gpuchef.probes.plugin_reader import Received
    from gpuchef.probes.plugin_wire import PluginRecord
    from gpuchef.probes.recorder import TraceRecorder

    url, ep = "http://vllm-host:8000", "tcp://127.0.0.1:5557"
    trace = tmp_path / "p.jsonl"
    meta = {"command": "top", "device": "remote",
            "source": {"kind": "attached", "urls": [url], "plugin": {url: ep}}}
    with TraceRecorder(trace, meta=meta) as rec:
        for k in range(60):  # a batch every 8 ms: 3 decode rows, a 1024-token prompt every 10th
            rec.record(Received(ep, PluginRecord(
                v=1, pub=1, seq=k, mono_ns=10**12 + k * 8_000_000, t_ns=10**18, has_sched=True,
                has_iter=True, running=4, waiting=0, kv_usage=0.1, itls=[0.008] * 3,
                ttfts=[0.05] * (k % 10 == 0), prompt_tokens=1024 * (k % 10 == 0),
                generation_tokens=3 + (k % 10 == 0)), 0, 0, 0, k == 0, 10**18,
                10**12 + k * 8_000_000 + 100_000))
    rapp = build_app(str(trace), paused=True, screenshot_dir=str(tmp_path))

    async def replay():
        async with rapp.run_test(size=(170, 50)) as pilot:
            assert await wait_for(pilot, lambda: getattr(rapp.screen, "ready", False))
            rapp.action_seek_edge(1)
            await pilot.pause(0.5)
            scr = rapp.screen
            assert [f.label for f in scr.plugin_frames] == ["vllm-host:8000 · engine 0"]
            c = scr.plugin_view.cols[(ep, 0)]
            assert int(c.decode.sum()) == 180
            assert scr.query_one("#a-pbatch").display and not scr.query_one("#a-steps").display
            assert rapp.session.status_lines == [f"{url}: no /metrics scrape in this trace"]
            assert all(f.error == f"{url}: no /metrics scrape in this trace"
                       for f in scr.scrape_panels[0].frames)
            await pilot.press("q")

    asyncio.run(replay())
