"""The dashboard's A/B screen on two attached servers (`top --attach U1 --attach U2`, issue 14
item 3): `a` sends gpuchef's load to both, as `gpuchef ab --a url=U1 --b url=U2` does
(``experiments.http.run_ab``), mirrored or sequential, the mode stated on screen; the screen's
client-side figures and verdict are ``probes.ab``'s over the marks and requests the session
recorded.

Two `gpuchef serve --model tiny` subprocesses on loopback: A with ``max_num_batched_tokens`` 16,
B with 2048 (256-token prompts: A's prefill takes 16 steps where B's takes one, so A's TTFT is
the larger). Independent references: each server's ClientResults of the same run (TTFT, ITL,
TPOT computed here with numpy, as vllm bench serve does), the verdict rule applied to the
per-repetition means computed from them, and `gpuchef report` of the session trace. Bad input
(a second server that does not answer, one that closes every stream early) runs against the
fake server of test_attach.py: one status line, the session goes on.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from serve_proc import ServeProc
from test_attach import FakeServer, build, drive, wait_for

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.probes import ab as abdef
from gpuchef.probes.recorder import read_trace
from gpuchef.tui.screens.ab import ABScreen

LOAD = ["--num-prompts", "5", "--input-len", "256", "--output-len", "4", "--request-rate", "5",
        "--scrape-hz", "2"]


@pytest.fixture(scope="module")
def servers():
    with ServeProc("--mode", "chunked", "--max-num-batched-tokens", "16") as a, \
            ServeProc("--mode", "chunked", "--max-num-batched-tokens", "2048") as b:
        yield a, b


def reference(results) -> dict[str, float]:
    """vllm bench serve's client figures of ``results`` (ClientResults), computed here."""
    ok = [r for r in results if r.success]
    ttft = np.array([(r.chunk_times_ns[0] - r.start_ns) / 1e6 for r in ok])
    itl = np.array([(b - a) / 1e6 for r in ok for a, b in zip(r.chunk_times_ns,
                                                              r.chunk_times_ns[1:])])
    tpot = np.array([((r.chunk_times_ns[-1] - r.chunk_times_ns[0]) / 1e6) / (r.output_tokens - 1)
                     for r in ok if r.output_tokens > 1])
    return {"completed": len(ok), "failed": len(results) - len(ok),
            "mean_ttft_ms": ttft.mean(), "p99_ttft_ms": np.percentile(ttft, 99),
            "mean_itl_ms": itl.mean(), "median_itl_ms": np.median(itl),
            "mean_tpot_ms": tpot.mean()}


def shown(m) -> dict[str, float]:
    return {"completed": m.completed, "failed": m.failed, "mean_ttft_ms": m.mean_ttft_ms,
            "p99_ttft_ms": dict(m.percentiles_ttft_ms)[99.0], "mean_itl_ms": m.mean_itl_ms,
            "median_itl_ms": m.median_itl_ms, "mean_tpot_ms": m.mean_tpot_ms}


def run_ab_on_screen(app, timeout=150.0):
    """Press a, wait until the A/B has finished and the screen has drawn it; returns
    (screen, the banner's text, the table's text)."""
    out = {}

    async def go():
        async with app.run_test(size=(180, 50)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("a")
            assert await wait_for(pilot, lambda: isinstance(app.screen, ABScreen), 5)
            out["running"] = str(app.screen.query_one("#ab-banner").render())
            ab = app.session.ab
            assert await wait_for(pilot, lambda: ab.state().run == 1 and not ab.state().active,
                                  timeout), ab.state()
            scr = app.screen
            scr.tick(force=True)
            await pilot.pause(0.2)
            out.update(screen=scr, banner=str(scr.query_one("#ab-banner").render()),
                       table=str(scr.query_one("#ab-table").render()),
                       header=str(scr.query_one("#ab-aheader").render()),
                       sides={k: str(scr.query_one(f"#nums-{k}").render()) for k in "AB"})
    drive(app.session, go)
    return out


@pytest.mark.parametrize("load", ["mirrored", "sequential"])
def test_ab_screen_of_two_attached_servers_agrees_with_their_client_results(servers, tmp_path,
                                                                            load):
    a, b = servers
    trace = tmp_path / "t.jsonl"
    app = build(["--attach", a.url, "--attach", b.url, "--ab-load", load, *LOAD,
                 "--trace", str(trace), "--screenshot-dir", str(tmp_path)])
    assert app.session.load.state().name.endswith(f"kept for the A/B ({load}; a starts it)")
    out = run_ab_on_screen(app)
    scr, ab = out["screen"], app.session.ab
    assert f"load {load} — " in out["banner"] and "finished" in out["banner"]
    assert ("every request sent to both servers at the same arrival time" in out["banner"]) == \
        (load == "mirrored")
    assert "repetition 1" in out["running"]
    runs = ab.runs
    assert [(r.label, r.rep) for r in runs] == (
        [("A", 1), ("B", 1), ("A", 2), ("B", 2)] if load == "mirrored"
        else [("A", 1), ("B", 1), ("B", 2), ("A", 2)])
    for k in "AB":  # the screen's pooled client figures = the server's ClientResults
        ref = reference([x for r in runs if r.label == k for x in r.run.results])
        got = shown(scr.figures[k])
        assert got["completed"] == ref["completed"] == 10 and got["failed"] == 0
        for key in ref:
            assert got[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-6), (k, key)
        assert f"{ref['mean_ttft_ms']:,.1f}" in out["sides"][k]
    # the verdict: the rule applied to the per-repetition means computed from the clients
    per = {k: [reference(r.run.results)["mean_ttft_ms"] for r in sorted(
        (r for r in runs if r.label == k), key=lambda r: r.rep)] for k in "AB"}
    assert all(y < x for x, y in zip(per["A"], per["B"])), per  # B's budget prefills at once
    spec = next(s for s in abdef.metric_specs((50.0, 99.0), False, False)
                if s.key == "mean_ttft_ms")
    row = next(r for r in scr.rows if r.key == "mean_ttft_ms")
    assert row.a_runs == pytest.approx(per["A"]) and row.b_runs == pytest.approx(per["B"])
    assert row.verdict == abdef.verdict(spec, per["A"], per["B"], abdef.MIN_REPETITIONS)
    assert row.verdict in out["table"] and "Mean TTFT" in out["table"]
    assert not any(r.key in abdef.STEP_ROWS for r in scr.rows)  # no server's steps seen
    # the session trace: its report gives the screen's groups (probes.ab, one owner)
    from gpuchef.report.data import build as report_build

    tr = read_trace(trace)
    assert tr.meta["ab"]["load"] == load
    groups = {g.short: g for g in report_build([trace], percentiles=(50.0, 99.0)).groups}
    assert sorted(groups) == ["A", "B"]
    for k in "AB":
        assert shown(groups[k].metrics) == pytest.approx(shown(scr.figures[k]))


def test_a_second_server_that_does_not_answer_is_one_line_and_the_session_goes_on(servers):
    a, _ = servers
    with FakeServer() as gone:
        url = gone.url
    app = build(["--attach", a.url, "--attach", url, *LOAD])
    s = app.session
    notes = []

    async def go():
        async with app.run_test(size=(160, 45)) as pilot:
            app.notify = lambda msg, **kw: notes.append(msg)
            await pilot.pause(0.3)
            await pilot.press("a")
            await pilot.pause(0.3)
            assert not isinstance(app.screen, ABScreen)
            # the load to the first server goes on; the dashboard keeps scraping
            assert await wait_for(pilot, lambda: s.load.state().submitted >= 5, 60)
    drive(s, go)
    assert len(notes) == 1 and "no A/B:" in notes[0] and url in notes[0], notes
    assert "--attach (B)" in notes[0] and "url=" not in notes[0], notes
    # asked for at start (--ab-load): refused before the session, naming the flags given
    with pytest.raises(ConfigError) as e:
        build(["--attach", a.url, "--attach", url, "--ab-load", "mirrored", *LOAD])
    msg = str(e.value)
    assert msg.startswith("--ab-load: --attach (B) ") and url in msg and "url=" not in msg, msg
    assert "--attach (B)" in notes[0]


def test_a_server_that_closes_streams_early_is_one_status_line_and_a_still_shown(servers):
    a, _ = servers
    with FakeServer() as cut:  # answers /v1/models; every stream closed before [DONE]
        app = build(["--attach", a.url, "--attach", cut.url, "--ab-load", "mirrored",
                     "--ab-repetitions", "1", *LOAD])
        out = run_ab_on_screen(app, timeout=90)
    st = app.session.ab.state()
    assert st.status.startswith(f"no request to {cut.url} (B) succeeded: 5 requests:"), st.status
    assert "stream" in st.status
    assert f"A/B #1: {st.status}" in app.session.status_lines
    # one line, in the header (the session's status lines), not repeated in the banner
    assert out["header"].count(f"⚠ A/B #1: no request to {cut.url}") == 1
    assert "no request to" not in out["banner"]
    fig = out["screen"].figures  # A's figures are still shown, from its own requests
    ref = reference([x for r in app.session.ab.runs if r.label == "A" for x in r.run.results])
    assert fig["A"].completed == 5 and fig["A"].mean_ttft_ms == pytest.approx(ref["mean_ttft_ms"])


def test_ab_is_refused_with_one_server_and_a_knob_spec_and_while_the_load_runs(servers):
    a, b = servers
    app = build(["--attach", a.url, *LOAD[-2:]])
    with pytest.raises(Exception) as e:
        app.session.ab.start({}, {}, 1.0)
    assert "give --attach twice" in str(e.value)
    app.session.close()
    app = build(["--attach", a.url, "--attach", b.url, *LOAD])
    s = app.session
    try:
        s.start()
        with pytest.raises(Exception) as e:
            s.ab.start({"max_num_batched_tokens": 512}, {}, 1.0)
        assert "compares them as they are" in str(e.value)
        with pytest.raises(Exception) as e:  # gpuchef's load to the first server is running
            s.ab.start({}, {}, 1.0)
        assert "still being sent to" in str(e.value) and "--ab-load" in str(e.value)
        deadline = time.monotonic() + 60
        while not s.load.state().done and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.ab.start({}, {}, 1.0).active  # once it ended: the same load to both
        s.ab.stop()
        assert not s.ab.state().active and "stopped after" in s.ab.state().status
    finally:
        s.close()


@pytest.mark.parametrize("extra,needle", [
    (["--ab-load", "mirrored"], "--ab-load runs an A/B of two attached servers"),
    (["--ab-repetitions", "0"], "--ab-repetitions 0 is out of range: allowed [1, 100]"),
])
def test_ab_flags_bad_input_is_one_error_before_start(extra, needle):
    from gpuchef.engine_host.vocab.errors import ConfigError

    with FakeServer() as srv:
        with pytest.raises(ConfigError) as e:
            build(["--attach", srv.url, *LOAD, *extra])
    assert needle in str(e.value)


def test_ab_flags_need_attach():
    from gpuchef.engine_host.vocab.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        build(["--ab-load", "sequential", "--device", "cpu", "--model", "tiny"])
    assert "--ab-load needs --attach URL" in str(e.value)


def test_knob_keys_wait_and_x_stops_the_ab_keeping_what_finished(servers):
    a, b = servers
    app = build(["--attach", a.url, "--attach", b.url, "--ab-load", "mirrored",
                 "--num-prompts", "40", "--input-len", "32", "--output-len", "4",
                 "--request-rate", "2", "--scrape-hz", "2"])
    s = app.session
    notes = []

    async def go():
        async with app.run_test(size=(170, 48)) as pilot:
            app.notify = lambda msg, **kw: notes.append(msg)
            await pilot.pause(0.3)
            await pilot.press("a")
            assert await wait_for(pilot, lambda: len(s.timeline.snapshot().requests) >= 4, 30)
            await pilot.press("plus")  # a knob key while the A/B runs: refused, nothing sent
            await pilot.press("x")
            assert await wait_for(pilot, lambda: not s.ab.state().active, 15)
            await pilot.pause(0.3)
    drive(s, go)
    assert "an A/B run is sending the load to both servers: stop it first (x)" in notes, notes
    assert "A/B stopped" in notes and not any("settings restored" in n for n in notes)
    st = s.ab.state()
    assert st.status == "stopped after 0 of 4 runs" and s.ab.runs == []
    # the requests that finished before the stop are kept, both servers', under the run's mark
    ids = {q.request_id[:2] for q in s.timeline.snapshot().requests}
    assert ids == {"A/", "B/"}
    marks = [e.name for e in s.timeline.snapshot().events if e.kind == "mark"]
    assert marks == ["ab:1:AB:1", "ab:1:end"]


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
