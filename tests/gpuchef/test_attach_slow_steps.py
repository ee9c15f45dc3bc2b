"""`top --attach` on a server whose engine steps are longer than the scrape interval (an
overloaded server: the tiny CPU `gpuchef serve` at 100 req/s ran 0.38 s steps under 250 ms
scrapes). Its counters move only when a step ends, so between two scrapes with no step end in
between they stand still while requests run: half the busy intervals read 0 tok/s and the
others twice the server's rate, and the dashboard's "latest scrape interval" numbers and
charts flickered between the two. Such an interval is merged into the next
(``probes.scrape.DeltaStream``), so every interval's rates are over whole steps; a server that
runs requests and counts nothing for longer than ``NO_STEP_MERGE_MAX_S`` still reads 0.

The reference is the fake server's own counters: a step of ``TOKENS`` generated tokens ends
every ``EVERY``-th scrape, requests always running."""

from __future__ import annotations

import pytest

from gpuchef.sessions.attach import AttachedServer
from gpuchef.probes.scrape import NO_STEP_MERGE_MAX_S, DeltaStream, parse_metrics

TOKENS = 96
EVERY = 3


def vllm_text(gen: float, prompt: float, running: int) -> str:
    return (f"# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            f"# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="m"}} {gen}\n'
            f"# TYPE vllm:prompt_tokens_total counter\n"
            f'vllm:prompt_tokens_total{{model_name="m"}} {prompt}\n')


def test_intervals_of_a_slow_stepping_server_are_over_whole_steps():
    calls = {"n": 0, "gen": 0.0}

    def fetch(url: str, timeout: float) -> str:
        n = calls["n"]
        calls["n"] += 1
        if n and n % EVERY == 0:
            calls["gen"] += TOKENS  # a step ended since the last scrape
        return vllm_text(calls["gen"], 1000.0, 12)

    srv = AttachedServer("http://127.0.0.1:9", 20.0, fetch=fetch)
    for _ in range(10 * EVERY + 1):
        srv.scraper.scrape_once()
    good = [s for s in srv.samples() if not s.error]
    assert len(good) == 10 * EVERY + 1
    ds = srv.deltas()
    assert ds, "no interval"
    for d in ds:  # each holds at least one step: never 0 tok/s while 12 requests run
        assert d.gauges["running"] == 12 and d.rates["generation_tokens"] > 0, d
        tokens = d.rates["generation_tokens"] * d.dt_s
        assert tokens == pytest.approx(round(tokens / TOKENS) * TOKENS)  # whole steps
    # the intervals tile the scrapes (the last one ends a step): their tokens add up to the
    # server's counter difference
    assert sum(d.rates["generation_tokens"] * d.dt_s for d in ds) == pytest.approx(
        good[-1].values["generation_tokens"] - good[0].values["generation_tokens"])
    assert len(ds) == 10  # one per step


def test_a_server_that_runs_requests_and_counts_nothing_reads_zero_after_the_cap():
    s = DeltaStream()
    step_ns = int(0.25e9)
    got = []
    for k in range(int(2 * NO_STEP_MERGE_MAX_S / 0.25) + 2):
        d = s.add(parse_metrics(vllm_text(500.0, 1000.0, 7), url="u", t_ns=k * step_ns))
        if d is not None:
            got.append(d)
    assert got, "a stuck server must still show its intervals"
    assert all(d.rates["generation_tokens"] == 0 and d.dt_s >= NO_STEP_MERGE_MAX_S for d in got)
    # an idle server (nothing running) is not merged: its zero is the truth at once
    s = DeltaStream()
    idle = [s.add(parse_metrics(vllm_text(500.0, 1000.0, 0), url="u", t_ns=k * step_ns))
            for k in range(3)]
    assert idle[0] is None and all(d is not None and d.rates["generation_tokens"] == 0
                                   for d in idle[1:])


def test_report_and_replay_draw_the_intervals_the_live_dashboard_drew():
    """One owner for a trace's scrape intervals: `gpuchef report` (scrape_plots.trace_deltas)
    and `gpuchef replay` (ReplayScrapedServer) of an attached trace give the live
    AttachedServer's intervals (DeltaStream), not the raw consecutive pairs that flickered
    between 0 and twice the rate (a tester's finding after d0dcec5)."""
    from types import SimpleNamespace

    from gpuchef.sessions.replay import ReplayScrapedServer
    from gpuchef.report.scrape_plots import trace_deltas

    calls = {"n": 0, "gen": 0.0}

    def fetch(url: str, timeout: float) -> str:
        n = calls["n"]
        calls["n"] += 1
        if n and n % EVERY == 0:
            calls["gen"] += TOKENS
        return vllm_text(calls["gen"], 1000.0, 12)

    srv = AttachedServer("http://127.0.0.1:9", 20.0, fetch=fetch)
    for _ in range(6 * EVERY + 1):
        srv.scraper.scrape_once()
    live = list(srv.deltas())
    samples = srv.samples()
    assert len(live) == 6 and len(samples) == 6 * EVERY + 1
    (report,) = trace_deltas(samples).values()
    assert report == list(live)
    session = SimpleNamespace(trace=SimpleNamespace(meta={"scrape_hz": 20.0}),
                              position_ns=samples[-1].t_ns)
    assert list(ReplayScrapedServer(session, srv.url, samples).deltas()) == list(live)
