"""What one refresh of the dashboard's numbers panel costs on the UI thread, at an H200-like load.

A synthetic timeline (no engine): ``--steps-per-s`` StepRecords a second and ``--req-per-s``
finished requests a second of ``--output-len`` tokens each (one token per 6 ms), 60 s of history,
then ``--refreshes`` refreshes one second apart: each appends a second of records, takes a
snapshot, extends the incremental columns (StepColumns, RequestColumns → probes.metrics.
RequestTable) and computes the panel over the last ``--window`` s (``compute_numbers_fast`` →
``probes.metrics.window_metrics``). Printed: median and max ms per refresh, and one
``summarize`` over the window's records (the path without incremental columns) for reference.

    python benchmarks/bench_numbers.py              # 150 steps/s, 20 req/s × 250 tokens, 30 s
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpuchef.engine_host.vocab.records import RequestRecord, StepRecord
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.plotdata import StepColumns
from gpuchef.tui.widgets.numbers import RequestColumns, compute_numbers, compute_numbers_fast

MS = 1_000_000


def feed(tl: Timeline, t: int, step: int, rid: int, rng: random.Random, seconds: float,
         sps: float, rps: float, out: int) -> tuple[int, int, int]:
    end = t + int(seconds * 1e9)
    dt = int(1e9 / sps)
    while t < end:
        tl.add_step(StepRecord(step, t, t + dt - MS, 5.0, "chunked", 2048, 256, 0, 1, 1, 300,
                               120, 0, 120, 3, 0, 1000, 30000))
        step += 1
        t += dt
        if rng.random() < rps / sps:
            rid += 1
            times = tuple(t - (out - i) * 6 * MS for i in range(out))
            tl.add_request(RequestRecord(f"r{rid}", times[0] - 50 * MS, 1000, out, times,
                                         "length"))
    return t, step, rid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps-per-s", type=float, default=150.0)
    ap.add_argument("--req-per-s", type=float, default=20.0)
    ap.add_argument("--output-len", type=int, default=250)
    ap.add_argument("--window", type=float, default=30.0, help="numbers window (s)")
    ap.add_argument("--refreshes", type=int, default=20)
    a = ap.parse_args(argv)
    rng = random.Random(0)
    t0 = 10**12
    tl = Timeline(origin_ns=t0, clock=lambda: t0)
    t, step, rid = feed(tl, t0, 0, 0, rng, 60, a.steps_per_s, a.req_per_s, a.output_len)
    steps, reqs = StepColumns(), RequestColumns()
    slos, pcts = {"ttft": 500.0, "tpot": 50.0}, (50.0, 99.0)
    snap = tl.snapshot(t)
    steps.extend(snap.steps)
    reqs.extend(snap)
    costs = []
    for _ in range(a.refreshes):
        t, step, rid = feed(tl, t, step, rid, rng, 1.0, a.steps_per_s, a.req_per_s, a.output_len)
        c0 = time.perf_counter()
        snap = tl.snapshot(t)
        steps.extend(snap.steps)
        reqs.extend(snap)
        n = compute_numbers_fast(snap, a.window, slos, pcts, steps, reqs)
        costs.append((time.perf_counter() - c0) * 1e3)
    c0 = time.perf_counter()
    ref = compute_numbers(snap, a.window, slos, pcts)
    full = (time.perf_counter() - c0) * 1e3
    assert ref.metrics.completed == n.metrics.completed
    print(f"numbers refresh ({a.window:g} s window, {a.steps_per_s:g} steps/s, "
          f"{a.req_per_s:g} req/s × {a.output_len} tokens; {n.metrics.completed} requests, "
          f"{n.metrics.num_steps} steps in the window): median "
          f"{statistics.median(costs):.2f} ms, max {max(costs):.2f} ms per refresh; "
          f"summarize over the window's records: {full:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
