"""Requests a capacity probe's early stop withdraws are not failed requests.

An early stop decides a probe (an SLO is broken beyond doubt) and aborts the requests still
open or still to arrive with ``finish_reason`` "early stop". Nothing went wrong with them:
``vllm bench serve``'s *failed* (a request the server did not answer) must not count them, or
a probe that failed on latency reads as a server that lost 7 of its 8 requests. They are
counted as *withdrawn* (``probes.metrics.is_withdrawn`` owns the rule); an "abort" (a client
or the server gave up) and an "error" stay failed."""

from __future__ import annotations

from gpuchef.engine_host.vocab.records import RequestRecord
from gpuchef.probes.metrics import format_results_block, summarize

MS = 1_000_000


def _records():
    done = [RequestRecord(f"req-{i}", 0, 16, 4, (10 * MS, 20 * MS, 30 * MS, 40 * MS), "length")
            for i in range(3)]
    withdrawn = [RequestRecord(f"req-{i}", i * MS, 16, 0, (), "early stop", ended_ns=2 * MS)
                 for i in range(3, 9)]
    lost = [RequestRecord("req-9", 0, 16, 0, (), "abort"),
            RequestRecord("req-10", 0, 16, 1, (5 * MS,), "error")]
    probes = [RequestRecord("probe-0", 0, 4, 0, (), "early stop"),
              RequestRecord("probe-1", 0, 4, 0, (), "abort")]
    return done + withdrawn + lost + probes


def test_withdrawn_requests_are_neither_completed_nor_failed():
    recs = _records()
    m = summarize(recs, 1.0, percentiles=(99,))
    mine = [r for r in recs if not r.request_id.startswith("probe-")]
    # the reference: vllm bench serve's completed (length/stop) and failed (the rest), with the
    # tool's own withdrawals taken out of failed
    assert m.completed == sum(r.finish_reason in ("length", "stop") for r in mine)
    assert m.withdrawn == sum(r.finish_reason == "early stop" for r in mine) > 0
    assert m.failed == sum(r.finish_reason in ("abort", "error") for r in mine) == 2
    assert m.probe_failed == 1 and m.probe_completed == 0  # a withdrawn probe request likewise
    d = m.to_dict()
    assert (d["completed"], d["failed"], d["withdrawn"]) == (m.completed, m.failed, m.withdrawn)
    block = format_results_block(m)
    assert f"Withdrawn requests (not failed):         {m.withdrawn}" in block
    assert "Withdrawn" not in format_results_block(summarize(recs[:3], 1.0))

