"""Timeline: ring buffers, snapshots under a concurrent producer, steps spread over time bins (the
waveform, the busy fraction of a range), GPU sample means per bin."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.sinks import RecordBatch
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepOutput, StepRecord
from gpuchef.probes.sampler import HostSample
from gpuchef.probes.nvml import GpuSample
from gpuchef.probes.metrics import summarize
from gpuchef.probes.timeline import (Timeline, busy_fraction, spread_over_bins,
                                     step_compute_ns)

MS = 1_000_000
S = 1_000_000_000


def step(i: int, t0: int, t1: int, *, gpu_ms: float | None = None, prefill: int = 0,
         decode: int = 0, preempted: int = 0, mode: str = "chunked") -> StepRecord:
    return StepRecord(i, t0, t1, (t1 - t0) / MS if gpu_ms is None else gpu_ms, mode, 2048, 256, 0,
                      1, 1 if prefill else 0, prefill, decode, 0, decode, 0, preempted, 10, 100)


def request(i: int, arrival: int, times: list[int], reason: str = "length") -> RequestRecord:
    return RequestRecord(f"r{i}", arrival, 100, len(times), tuple(times), reason,
                         output_token_ids=tuple(range(len(times))))


def gpu(t: int, g: int = 0, **kw) -> GpuSample:
    return GpuSample(t, g, **kw)


def test_busy_fraction_of_a_range_counts_each_step_by_its_overlap():
    steps, t = [], 0
    # A: 1 s of 10 ms steps, 8 ms compute each; B: 1 s of 10 ms steps fully busy
    for i in range(100):
        steps.append(step(i, t, t + 8 * MS))
        t += 10 * MS
    for i in range(100, 200):
        steps.append(step(i, t, t + 10 * MS))
        t += 10 * MS
    assert busy_fraction(steps, 0, S) == pytest.approx(0.8)
    assert busy_fraction(steps, S, 2 * S) == pytest.approx(1.0)
    # a step at the range edge counts by its overlap: step 0 keeps 3 of its 8 ms
    assert busy_fraction(steps, 5 * MS, S) == pytest.approx((800 - 5) / 995, rel=1e-9)
    # idle time after the last step counts; compute is capped at the step's span
    assert busy_fraction(steps, S, 4 * S) == pytest.approx(1 / 3)
    assert busy_fraction([step(0, 0, 10 * MS, gpu_ms=25.0)], 0, 20 * MS) == pytest.approx(0.5)
    assert busy_fraction([], 0, S) == 0.0 and np.isnan(busy_fraction(steps, S, S))


def test_spread_over_bins_shares_each_span_by_overlap_in_any_order():
    edges = np.array([0, 100, 200, 300], dtype=np.int64)
    # a 150-long step from 50 (a third in bin 0, two thirds in bin 1), one of zero length at
    # 250 (lands in bin 2), and one past the edges (counted in no bin)
    ts, te = np.array([250, 50, 400]), np.array([250, 200, 500])
    amounts, twice = spread_over_bins(ts, te, edges, [6.0, 30.0, 7.0], [12.0, 60.0, 14.0])
    assert amounts.tolist() == pytest.approx([10.0, 20.0, 6.0])
    assert twice.tolist() == pytest.approx([20.0, 40.0, 12.0])
    (none,) = spread_over_bins(np.array([], dtype=np.int64), np.array([], dtype=np.int64),
                               edges, np.array([]))
    assert none.tolist() == [0.0, 0.0, 0.0]
    assert step_compute_ns([0, 0, 5], [10 * MS, 10 * MS, 5], [4.0, 12.0, 1.0]).tolist() == \
        pytest.approx([4 * MS, 10 * MS, 1 * MS])


def test_step_waveform_sums_and_shape():
    tl = Timeline(clock=lambda: 0, origin_ns=0)
    t = 0
    # continuous-batching-like: a 40 ms prefill burst then 60 ms idle, ten times
    for i in range(10):
        tl.add_step(step(i, t, t + 40 * MS, prefill=2000))
        t += 100 * MS
    wf = tl.snapshot(S).step_waveform(0, S, 20)
    assert wf.busy.shape == wf.prefill_tokens.shape == wf.decode_tokens.shape == (20,)
    assert wf.edges_ns.shape == (21,) and wf.edges_ns.dtype == np.int64
    assert wf.busy.tolist() == pytest.approx([0.8, 0.0] * 10)  # |****____| per 100 ms
    assert wf.prefill_tokens.sum() == pytest.approx(20000)
    assert wf.steps.sum() == 10 and wf.bin_s == pytest.approx(0.05)
    # a bin that cuts a step in half gets half its tokens
    half = tl.snapshot(S).step_waveform(0, 20 * MS, 1)
    assert half.prefill_tokens[0] == pytest.approx(1000) and half.busy[0] == pytest.approx(1.0)
    empty = tl.snapshot(S).step_waveform(5 * S, 6 * S, 4)
    assert empty.busy.tolist() == [0.0] * 4
    with pytest.raises(ConfigError, match="n_bins"):
        tl.snapshot(S).step_waveform(0, S, 0)


def test_sample_waveform():
    tl = Timeline(clock=lambda: 0, origin_ns=0)
    for k in range(10):
        tl.add_gpu_sample(gpu(k * 100 * MS, sm_active=float(k * 10)))
    edges, m = tl.snapshot(S).sample_waveform("sm_active", 0, S, 5)
    assert m.tolist() == pytest.approx([5, 25, 45, 65, 85])
    _, m2 = tl.snapshot(S).sample_waveform("tensor_active", 0, S, 5)
    assert np.isnan(m2).all()
    with pytest.raises(ConfigError):
        tl.snapshot(S).sample_waveform("nope", 0, S, 5)


def test_ring_buffers_stay_bounded_after_100k_appends():
    tl = Timeline(max_steps=1000, max_requests=500, max_request_tokens=2000, max_gpu_samples=700,
                  max_host_samples=50, max_events=30)
    for i in range(100_000):
        tl.add_step(step(i, i * MS, i * MS + MS // 2))
        tl.add_gpu_sample(gpu(i * MS))
        tl.add_host_sample(HostSample(i * MS, 1.0, 1, 1.0))
        tl.add_event(EngineEvent("mark", i, i * MS))
        tl.add_request(request(i, i * MS, [i * MS + k for k in range(1, 4 + i % 5)]))
    snap = tl.snapshot(10**15)
    assert len(snap.steps) == 1000 and snap.steps[-1].step == 99_999
    assert len(snap.gpu_samples) == 700 and len(snap.host_samples) == 50
    assert len(snap.events) == 30
    assert len(snap.requests) <= 500
    assert sum(len(r.token_times_ns) for r in snap.requests) <= 2000
    assert snap.requests[-1].request_id == "r99999"
    assert all(r.output_token_ids == () for r in snap.requests)  # ids dropped to save memory
    assert snap.totals == {"step": 100_000, "request": 100_000, "gpu_sample": 100_000,
                           "host_sample": 100_000, "event": 100_000}


def test_snapshot_is_consistent_under_a_concurrent_producer():
    tl = Timeline(max_steps=5000, max_gpu_samples=5000)
    stop = threading.Event()
    produced = [0]

    def produce():
        i = 0
        clock = tl.clock
        while not stop.is_set():
            t = clock()
            tl.add_step(step(i, t - 1000, t))
            tl.add_gpu_sample(gpu(t))
            i += 1
        produced[0] = i

    th = threading.Thread(target=produce)
    th.start()
    try:
        for _ in range(200):
            snap = tl.snapshot()
            ids = [s.step for s in snap.steps]
            assert ids == list(range(ids[0], ids[0] + len(ids))) if ids else True  # no gaps
            assert len(ids) <= 5000
            assert all(s.t_end_ns <= snap.t_ns for s in snap.steps)  # one cut for all streams
            assert all(g.t_ns <= snap.t_ns for g in snap.gpu_samples)
            before = tuple(snap.steps)
            snap.step_waveform(snap.t_ns - 50 * MS, snap.t_ns + 1, 10)  # while the producer runs
            assert tuple(snap.steps) == before and len(snap.steps) == len(before)  # immutable
    finally:
        stop.set()
        th.join()
    assert produced[0] > 0 and tl.totals["step"] == produced[0]


def test_requests_out_of_finish_order_are_still_found():
    tl = Timeline(clock=lambda: 0, origin_ns=0)
    tl.add_request(request(0, 0, [500 * MS]))
    tl.add_request(RequestRecord("err", 100 * MS, 10, 0, (), "error"))  # finished "earlier"
    tl.add_request(request(2, 0, [700 * MS]))
    snap = tl.snapshot(S)
    m = summarize(snap.requests_between(0, S), 1.0)
    assert m.completed == 2 and m.failed == 1
    assert [r.request_id for r in snap.requests_between(0, S)] == ["r0", "err", "r2"]


def test_add_dispatch_and_record_batch():
    tl = Timeline()
    recs = [step(0, 0, 1), request(0, 0, [1]), gpu(1), HostSample(1, None, 1, None),
            EngineEvent("mark", 0, 1)]
    for r in recs:
        tl.add(r)
    assert len(tl) == 5
    with pytest.raises(TypeError):
        tl.add("nope")
    # as the host's sink: a turn's steps, requests and events (its outputs are not kept)
    tl.record(RecordBatch([EngineEvent("knob", 1, 2), step(1, 2, 3),
                           StepOutput(1, 3, (("r1", 5),)), request(1, 0, [3])]))
    assert tl.totals == {"step": 2, "request": 2, "gpu_sample": 1, "host_sample": 1, "event": 2}


def test_bad_sizes():
    with pytest.raises(ConfigError, match="max_steps"):
        Timeline(max_steps=0)


def test_memory_stays_flat_once_the_rings_are_full():
    """Python memory held by a timeline (tracemalloc) stops growing once every ring is full:
    after 4x more records than fill it, it holds what it held when first full (within 5 %)."""
    import gc
    import tracemalloc

    caps = dict(max_steps=2000, max_requests=300, max_request_tokens=20_000,
                max_gpu_samples=2000, max_host_samples=200, max_events=100)

    def feed(tl, lo, hi):
        for i in range(lo, hi):
            t = i * MS
            tl.add_step(step(i, t, t + MS // 2, prefill=100, decode=30))
            tl.add_gpu_sample(gpu(t, sm_active=50.0, power_w=500.0))
            if i % 5 == 0:
                tl.add_host_sample(HostSample(t, 1.0, 1, 1.0))
                tl.add_event(EngineEvent("mark", i, t))
                tl.add_request(request(i, t, [t + 10 * MS + k for k in range(40 + i % 90)]))

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tl = Timeline(**caps)
        feed(tl, 0, 4000)  # 2x every count cap: all rings full
        gc.collect()
        full = tracemalloc.get_traced_memory()[0] - base
        feed(tl, 4000, 20_000)
        gc.collect()
        later = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    snap = tl.snapshot(10**15)
    assert len(snap.steps) == 2000 and len(snap.gpu_samples) == 2000
    assert sum(len(r.token_times_ns) for r in snap.requests) <= 20_000
    assert full > 500_000  # it did measure the records (~2000 steps of ~400 B)
    assert later <= full * 1.05, (full, later)


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
