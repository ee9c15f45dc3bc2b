"""probes/plugin_steps.py: gpuchef's vLLM plugin records as iteration rows, on crafted records
(no sockets): where a batch is placed in time, when its interval is known, how its prefill
tokens are counted, what is not an engine step, and the log the dashboard reads from; and on
every record the plugin published from a real `vllm serve` 0.24.0 on an H100, against vLLM's own
/metrics counters of that run (tests/data/README.md)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import msgspec
import numpy as np

from gpuchef.probes.plugin_reader import Received, SeqAccounts
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


# ---- a real vllm serve 0.24.0 on one H100 (tests/data/README.md) -------------------------------

VLLM024_H100 = Path(__file__).parents[1] / "data" / "vllm024_plugin_h100.jsonl.gz"
#: what vLLM's own /metrics counters moved by over that run: the independent reference
VLLM_ITERATIONS = 4393  # vllm:iteration_tokens_total's count (one per IterationStats)
VLLM_PROMPT_TOKENS = 409_600  # vllm:prompt_tokens_total: 400 prompts of 1024 tokens
VLLM_GENERATION_TOKENS = 102_400  # vllm:generation_tokens_total: 400 × 256
VLLM_ITERATION_TOKENS_SUM = 512_000  # the iteration_tokens histogram's sum
PROMPTS, PROMPT_LEN = 400, 1024


def _vllm024_records() -> tuple[list[dict], list[Received]]:
    """The file's lines, and each as the reader's Received. A line is the PluginRecord's fields
    plus the reader's ``server``, ``recv_ns``, ``gap``, ``dropped`` (not received_to_json's
    layout): the accounting is made again by the reader's own SeqAccounts, and the arrival on
    the monotonic axis is ``mono_ns`` plus the transport delay ``recv_ns − t_ns`` (reader and
    vLLM on one host: the same clocks)."""
    with gzip.open(VLLM024_H100, "rt", encoding="utf-8") as f:
        lines = [json.loads(ln) for ln in f]
    acc, gots = SeqAccounts(), []
    for d in lines:
        rec = msgspec.convert({k: v for k, v in d.items()
                               if k not in ("server", "recv_ns", "gap", "dropped")}, PluginRecord)
        gots.append(acc.ingest(d["server"], d["dropped"], rec, d["recv_ns"],
                               rec.mono_ns + d["recv_ns"] - rec.t_ns))
    return lines, gots


def test_a_real_vllm_runs_records_add_up_to_vllms_own_counters():
    lines, gots = _vllm024_records()
    assert len(gots) == 4395 and [g.record.seq for g in gots] == list(range(4395))
    # the reader's accounting, made again, is what the file says it was: nothing lost
    assert [g.gap for g in gots] == [d["gap"] for d in lines] and not any(
        g.gap or g.dropped or g.gap_dropped for g in gots)
    recs = [g.record for g in gots]
    # the plugin's records against vLLM's /metrics: one IterationStats per iteration counted
    assert sum(r.has_iter for r in recs) == VLLM_ITERATIONS
    assert sum(r.prompt_tokens for r in recs) == VLLM_PROMPT_TOKENS
    assert sum(r.generation_tokens for r in recs) == VLLM_GENERATION_TOKENS

    log = iterations_of(gots)
    key, = log.keys()
    rows, c = log.rows(key), log.counts(key)
    # every record had SchedulerStats: each is a row (the last two, without IterationStats,
    # are the engine's empty outputs after the last request finished)
    assert (c.received, c.rows, c.not_steps, c.lost, c.dropped) == (4395, 4395, 0, 0, 0)
    # generation tokens = a decode row per ITL + a first token per TTFT
    decode, first = sum(r.decode_rows for r in rows), sum(r.first_tokens for r in rows)
    assert first == PROMPTS  # every request's first token, once
    assert decode + first == VLLM_GENERATION_TOKENS
    assert sum(r.generation_tokens for r in rows) == VLLM_GENERATION_TOKENS
    # no --cudagraph-metrics: prefill falls back to the prompts completed, whole, at their first
    # token (bench's prompts are 1024 tokens, none cached)
    assert not any(r.prefill_scheduled for r in rows)
    assert sum(r.prefill_tokens for r in rows) == VLLM_PROMPT_TOKENS
    assert all(r.prefill_tokens == PROMPT_LEN * r.first_tokens for r in rows)
    assert sum(r.prompt_tokens + r.generation_tokens for r in rows) == VLLM_ITERATION_TOKENS_SUM


def test_a_real_vllm_runs_rows_keep_vllms_spacing_and_track_the_engine_core_itl():
    _, gots = _vllm024_records()
    log = iterations_of(gots)
    rows = log.rows(log.keys()[0])
    # placed at mono_ns + the quickest transport delay seen so far: once the quickest record
    # came, every row keeps the API server's exact spacing
    delay = [g.recv_mono_ns - g.record.mono_ns for g in gots]
    k = int(np.argmin(delay))
    assert 0 < delay[k] < 300_000  # loopback: ~0.17 ms at its quickest
    assert {r.t_ns - g.record.mono_ns for r, g in zip(rows[k:], gots[k:])} == {delay[k]}
    assert all(b.t_ns >= a.t_ns for a, b in zip(rows, rows[1:]))
    # the interval is unknown for the first batch and for the two after the engine went idle
    # (running = waiting = 0 at the end); every other one is positive
    assert [i for i, r in enumerate(rows) if r.interval_ns < 0] == [0, 4393, 4394]
    iv = np.array([r.interval_ns for r in rows if r.interval_ns >= 0]) / 1e6
    assert iv.min() > 0
    # the front end's time between batches against vLLM's engine-core ITLs (its own clock):
    # medians 7.82 ms and 7.98 ms over this run
    itl = np.array([x for g in gots for x in g.record.itls]) * 1e3
    assert len(itl) == VLLM_GENERATION_TOKENS - PROMPTS
    assert 6 < np.median(iv) < 10 and 6 < np.median(itl) < 10
    assert abs(np.median(iv) - np.median(itl)) < 0.5
    # batch by batch: the interval is the step the batch's decode rows waited (98.5% within
    # 1 ms; the rest are batches the front end received late or early)
    pairs = np.array([(r.interval_ns / 1e6, r.itl_max_s * 1e3) for r in rows
                      if r.interval_ns >= 0 and r.decode_rows])
    assert np.mean(np.abs(pairs[:, 0] - pairs[:, 1]) < 1.0) > 0.98
    assert math.isclose(sum(r.itl_sum_s for r in rows), itl.sum() / 1e3, rel_tol=1e-9)
