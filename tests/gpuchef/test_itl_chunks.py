"""One ITL definition on every surface (issue 15 §6): a request whose output arrives in chunks
of several tokens at one time stamp — a hosted vLLM's multi-token step, an SSE chunk of k
tokens — has one ITL per chunk, as ``vllm bench serve`` records it, so that its ITLs add up to
E2EL − TTFT. probes.metrics (bench, ab), the report (read from a trace) and the dashboard's
rolling numbers give the same ITLs, worked out here by hand."""

from __future__ import annotations

import pytest

from gpuchef.engine_host.vocab.records import RequestRecord, StepRecord
from gpuchef.probes.metrics import summarize
from gpuchef.probes.recorder import TraceRecorder, read_trace
from gpuchef.probes.timeline import Timeline
from gpuchef.report.data import build
from gpuchef.tui.plotdata import StepColumns
from gpuchef.tui.widgets.numbers import RequestColumns, compute_numbers_fast

MS = 1_000_000
T0 = 10**12


def _records():
    # arrival at 0; first token at 100 ms; a 3-token chunk at 160; one token at 190 (ms)
    a = RequestRecord("req-0", T0, 10, 5, tuple(T0 + t * MS for t in (100, 160, 160, 160, 190)),
                      "length", max_tokens=5)
    # a 2-token first chunk, then two single tokens
    b = RequestRecord("req-1", T0, 10, 4, tuple(T0 + t * MS for t in (50, 50, 90, 140)),
                      "length", max_tokens=4)
    steps = [StepRecord(i, T0 + t * MS, T0 + (t + 10) * MS, 10.0, "chunked", 512, 256, 0, 1, 0,
                        0, 2, 0, 2, 0, 0, 10, 100) for i, t in enumerate((40, 90, 150, 180))]
    return [a, b], steps


WANT = sorted([60.0, 30.0, 40.0, 50.0])  # per chunk: a: 160−100, 190−160; b: 90−50, 140−90


def test_every_surface_has_one_itl_per_chunk(tmp_path):
    reqs, steps = _records()
    for r in reqs:
        assert sum(r.itls_ms) == pytest.approx(r.e2el_ms - r.ttft_ms)
    pcts = (0.0, 50.0, 100.0)
    want = [(0.0, WANT[0]), (50.0, (WANT[1] + WANT[2]) / 2), (100.0, WANT[-1])]
    # bench / ab
    m = summarize(reqs, 1.0, percentiles=pcts, steps=steps)
    assert m.percentiles_itl_ms == want
    assert m.mean_itl_ms == pytest.approx(sum(WANT) / 4)
    # the report, from a trace
    path = tmp_path / "chunks.jsonl"
    rec = TraceRecorder(path, meta={"command": "bench", "device": "cpu"})
    for x in (*steps, *reqs):
        rec.record(x)
    rec.close()
    assert [r.token_times_ns for r in read_trace(path).requests] == \
        [r.token_times_ns for r in reqs]  # the chunks survive the trace (times repeat)
    data = build([path], percentiles=pcts)
    (g,) = data.groups
    assert g.metrics.percentiles_itl_ms == want
    # the dashboard's rolling numbers
    tl = Timeline(origin_ns=T0, clock=lambda: T0)
    for x in steps:
        tl.add_step(x)
    for r in reqs:
        tl.add_request(r)
    snap = tl.snapshot(T0 + 10**9)
    sc, rc = StepColumns(), RequestColumns()
    sc.extend(snap.steps)
    rc.extend(snap)
    n = compute_numbers_fast(snap, 30.0, {}, pcts, sc, rc)
    assert n.metrics.percentiles_itl_ms == want
