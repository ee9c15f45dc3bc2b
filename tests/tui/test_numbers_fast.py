"""The numbers panel's column path (compute_numbers_fast: probes.metrics.window_metrics over a
RequestTable kept up to date frame by frame) gives what compute_numbers (summarize over the
snapshot's records, rebuilt each time) gives, also after the request ring dropped old requests,
with multi-token chunks, and for probe requests."""

from __future__ import annotations

import math
import random

from gpuchef.engine_host.vocab.records import RequestRecord, StepRecord
from gpuchef.engine_host.vocab.workload import PROBE_ID_PREFIX
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.plotdata import StepColumns
from gpuchef.tui.widgets.numbers import RequestColumns, compute_numbers, compute_numbers_fast

MS = 1_000_000


def _same(a, b, path="") -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9,
                                                                 abs_tol=1e-9), path
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, (path, a, b)


def _compare(tl: Timeline, steps: StepColumns, reqs: RequestColumns, now: int, window_s: float,
             slos) -> None:
    snap = tl.snapshot(now)
    steps.extend(snap.steps)
    reqs.extend(snap)
    ref = compute_numbers(snap, window_s, slos, (50.0, 99.0))
    got = compute_numbers_fast(snap, window_s, slos, (50.0, 99.0), steps, reqs)
    assert (ref.metrics is None) == (got.metrics is None)
    if ref.metrics is not None:
        r, g = vars(ref.metrics), vars(got.metrics)
        for k in r:
            _same(r[k], g[k], k)
    _same(ref.busy, got.busy, "busy")
    assert (ref.running, ref.waiting) == (got.running, got.waiting)


def test_fast_numbers_match_summarize():
    rng = random.Random(3)
    t0 = 10**12
    tl = Timeline(origin_ns=t0, clock=lambda: t0, max_requests=300)
    steps, reqs = StepColumns(), RequestColumns()
    t = t0
    step = 0
    rid = 0
    for _ in range(40):  # 40 frames of ~0.25 s
        for _ in range(rng.randint(0, 40)):
            dur = rng.randint(1, 12) * MS
            pre, dec = rng.choice([(0, 30), (512, 0), (300, 20)])
            tl.add_step(StepRecord(step, t, t + dur, dur / MS * 0.8, "chunked", 512, 64, 0, 1,
                                   1 if pre else 0, pre, dec, 0, dec, rng.randint(0, 5),
                                   rng.randint(0, 1), 10, 100))
            step += 1
            t += dur + rng.randint(0, 3) * MS
            if rng.random() < 0.5:
                rid += 1
                n = rng.choice([0, 1, 2, 5, 40])
                times = sorted(t - rng.randint(0, 2000) * MS for _ in range(n))
                for k in range(1, n):  # multi-token chunks: several tokens at one time stamp
                    if rng.random() < 0.3:
                        times[k] = times[k - 1]
                times = tuple(times)
                name = f"{PROBE_ID_PREFIX}{rid}" if rng.random() < 0.1 else f"r{rid}"
                reason = rng.choice(["length", "stop", "length", "abort", "error"])
                arr = (times[0] if times else t) - rng.randint(1, 500) * MS
                tl.add_request(RequestRecord(name, arr, rng.randint(1, 900), max(n, 1), times,
                                             reason))
        for window_s, slos in ((30.0, {}), (2.0, {"ttft": 300.0, "tpot": 20.0})):
            _compare(tl, steps, reqs, t, window_s, slos)
    assert tl.totals["request"] > 300  # the ring dropped requests on the way
