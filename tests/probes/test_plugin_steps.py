"""probes/plugin_steps.py: gpuchef's vLLM plugin records as iteration rows, on crafted records
(no sockets): where a batch is placed in time, when its interval is known, how its prefill
tokens are counted, what is not an engine step, and the log the dashboard reads from."""

from __future__ import annotations

import math

from gpuchef.probes.plugin_reader import Received
from gpuchef.probes.plugin_steps import IterationLog, iterations_of
from gpuchef.probes.plugin_wire import PluginRecord

MS = 1_000_000


def got(seq, mono_ms, recv_ms, *, engine=0, pub=7, gap=0, dropped=0, restarted=False,
        server="tcp://127.0.0.1:5557", **kw) -> Received:
    kw.setdefault("has_sched", True)
    kw.setdefault("running", 3)
    kw.setdefault("waiting", 1)
    kw.setdefault("kv_usage", 0.25)
    rec = PluginRecord(v=1, pub=pub, engine_idx=engine, seq=seq, mono_ns=int(mono_ms * MS),
                       t_ns=10**18, **kw)
    return Received(server, rec, dropped, gap, dropped, restarted, 10**18,
                    int(recv_ms * MS))


def test_batches_keep_their_spacing_and_sit_at_the_quickest_transport_delay():
    log = IterationLog()
    # the API server's clock is 1000 ms behind ours; the records arrive 0.5, 0.1, 0.3 ms late
    rows = [log.add(got(0, 0, 1000.5)), log.add(got(1, 0.2, 1000.3)),
            log.add(got(2, 45, 1045.3))]
    us = [round(r.t_ns / 1000) for r in rows]
    # the first sits at the delay seen so far (0.5 ms), later ones at the smallest (0.1 ms); the
    # second would sit before the first: rows never go back in time
    assert us == [1_000_500, 1_000_500, 1_045_100]
    assert [r.interval_ns for r in rows] == [-1, int(0.2 * MS), int(44.8 * MS)]


def test_interval_unknown_after_lost_records_and_after_an_idle_engine():
    log = IterationLog()
    a = log.add(got(0, 0, 0.1))
    b = log.add(got(3, 30, 30.1, gap=2, dropped=2))  # seq 1, 2 lost: 30 ms is three batches
    c = log.add(got(4, 40, 40.1, running=0, waiting=0))  # the engine has nothing left
    d = log.add(got(5, 900, 900.1))  # a request came: the interval holds the idle time
    e = log.add(got(6, 912, 912.1))
    assert [x.interval_ns for x in (a, b, c, d, e)] == [-1, -1, 10 * MS, -1, 12 * MS]
    assert b.gap == 2
    c = log.counts(("tcp://127.0.0.1:5557", 0))
    assert (c.received, c.rows, c.lost, c.dropped) == (5, 5, 2, 2)


def test_prefill_is_scheduled_minus_decode_rows_with_cudagraph_stats_else_completed_prompts():
    log = IterationLog()
    # 300 tokens scheduled: 4 decode rows, each verifying 2 draft tokens, and a prefill chunk
    r = log.add(got(0, 0, 0.1, cg_unpadded_tokens=300, spec_draft_tokens=8,
                    itls=[0.01, 0.02, 0.03, 0.04], ttfts=[0.5], prompt_tokens=1000,
                    generation_tokens=5, has_iter=True))
    assert (r.prefill_tokens, r.prefill_scheduled, r.decode_rows, r.first_tokens) == \
        (300 - 4 - 8, True, 4, 1)
    assert r.prompt_tokens == 1000 and r.generation_tokens == 5
    assert math.isclose(r.itl_sum_s, 0.1) and r.itl_max_s == 0.04
    # no --cudagraph-metrics: the prompts whose prefill completed here, whole
    r = log.add(got(1, 10, 10.1, itls=[0.01] * 3, ttfts=[0.4, 0.6], prompt_tokens=700,
                    has_iter=True))
    assert (r.prefill_tokens, r.prefill_scheduled, r.decode_rows, r.first_tokens) == \
        (700, False, 3, 2)
    assert math.isnan(log.add(got(2, 20, 20.1)).itl_max_s)  # no decode row


def test_records_that_are_no_engine_step_make_no_row_and_a_restart_starts_over():
    log = IterationLog()
    key = ("tcp://127.0.0.1:5557", 0)
    log.add(got(0, 0, 0.1))
    # an aborted request's finish output: no SchedulerStats, no token
    assert log.add(got(1, 5, 5.1, has_sched=False, running=None, waiting=None,
                       kv_usage=None, finished=1)) is None
    r = log.add(got(2, 10, 10.1))
    assert r.interval_ns == 10 * MS  # from the last step's output, not the abort's
    # tokens without SchedulerStats (another API server got the stats): a row, state unknown
    r = log.add(got(3, 20, 20.1, has_sched=False, running=None, waiting=None, kv_usage=None,
                    itls=[0.01], has_iter=True, generation_tokens=1))
    assert (r.running, r.waiting, r.decode_rows) == (-1, -1, 1) and math.isnan(r.kv_usage)
    r = log.add(got(0, 5000, 5000.1, pub=8, restarted=True))  # vLLM restarted
    assert r.interval_ns == -1
    c = log.counts(key)
    assert (c.received, c.rows, c.not_steps) == (5, 4, 1)


def test_log_is_read_incrementally_per_stream_cut_at_a_position_and_trimmed():
    log = IterationLog(keep=10)
    for k in range(25):
        log.add(got(k, k, k + 0.1, engine=k % 2))
        log.add(got(k, k, k + 0.1, server="tcp://127.0.0.1:6000"))
    assert log.keys() == [("tcp://127.0.0.1:5557", 0), ("tcp://127.0.0.1:5557", 1),
                          ("tcp://127.0.0.1:6000", 0)]
    key = ("tcp://127.0.0.1:6000", 0)
    rows, n = log.since(key, 0)  # trimmed to the newest 10 (in chunks: at most 20 kept)
    assert n == 25 and 10 <= len(rows) <= 20 and rows[-1].seq == 24
    rows, n2 = log.since(key, n)
    assert rows == [] and n2 == 25
    log.add(got(25, 25, 25.1, server="tcp://127.0.0.1:6000"))
    rows, n3 = log.since(key, n2)
    assert [r.seq for r in rows] == [25] and n3 == 26
    # a replay's position: rows up to it
    rows, n4 = log.since(key, 20, until_ns=int(22.5 * MS))
    assert [r.seq for r in rows] == [20, 21, 22] and n4 == 23


def test_a_traces_records_give_the_rows_the_live_log_gave():
    recs = [got(k, 10 * k, 10 * k + 0.2 + (k % 3) * 0.1, engine=k % 2, itls=[0.01] * (k % 4))
            for k in range(40)]
    live = IterationLog()
    for g in recs:
        live.add(g)
    replayed = iterations_of(list(reversed(recs)))  # the trace's order need not be kept
    for key in live.keys():
        assert replayed.rows(key) == live.rows(key)
