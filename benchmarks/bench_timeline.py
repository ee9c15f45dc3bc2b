"""The timeline over a long session: memory held, snapshot cost, and what snapshots cost the engine.

Run:  python benchmarks/bench_timeline.py [--minutes 60] [--steps-per-s 140] [--gpus 1]
      [--sample-hz 20] [--req-rate 12] [--output-len 260] [--json OUT]

Issue 4 asks for ring buffers whose memory stays flat over an hour and for snapshots that do not
block the engine thread. This feeds a ``probes.timeline.Timeline`` (default caps) with records at
a GPU's rates — the defaults are llama-3-8b on one H200 as measured (140 steps/s, the Azure trace
at 3×: ~12 finished requests/s of ~260 output tokens) — for ``--minutes`` of simulated time, as fast
as the CPU allows on a synthetic clock, and every ``--every`` simulated minutes prints:

* ``heap MiB``: Python memory held by the timeline and its records (``tracemalloc``, the
  generator's transient objects excluded: they are freed before each reading);
* records held per stream (steps, GPU samples, requests, output tokens of those requests);
* ``feed s``: wall time the generator took for that stretch (not a cost of the timeline).

At the end, with every ring full and ``tracemalloc`` off: one ``Timeline.snapshot()`` (median of
9; the copy runs in C with the GIL held, so this is how long a reader stops every other Python
thread) and ``snapshot().step_waveform`` over the last 60 s / 10 s in 160 bins (the report's
waveform binning, the one the dashboard's step waveform shares).

Then ``--engine-check`` (default on) measures what a reader taking 10 snapshots a second of the
full timeline costs an engine-like thread: each "step" does ``--engine-py-ms`` of pure-Python work
(scheduling, bookkeeping) and then waits ``--engine-gpu-ms`` without the GIL (``time.sleep``, as
a CUDA synchronize does); ``late`` is how much later than asked the wait returned (it must win the
GIL back). Alternating off/on segments; steps/s and the lateness percentiles are reported.
Runs on any machine (no GPU); numbers depend on the CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import threading
import time
import tracemalloc

import numpy as np

from gpuchef.engine_host.host import DEFAULT_SWITCH_INTERVAL_S
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes.sampler import HostSample
from gpuchef.probes.nvml import GpuSample
from gpuchef.probes.timeline import Timeline

S = 1_000_000_000


def feed(tl: Timeline, t0: int, t1: int, state: dict, a: argparse.Namespace) -> None:
    """Add the records of simulated time ``[t0, t1)`` (ns) to ``tl`` at the configured rates."""
    rng: random.Random = state["rng"]
    step_ns = int(S / a.steps_per_s)
    tick_ns = int(S / a.sample_hz)
    t = state["t_step"]
    while t < t1:
        i = state["step"]
        tl.add_step(StepRecord(i, t, t + step_ns - 50_000, step_ns / 1e6 * 0.85, "chunked", 2048,
                               256, 0, 1, 1, 120 + i % 400, 40 + i % 30, i % 2, 45, 3, 0, 9000,
                               54915, i % 3, True))
        state["step"] = i + 1
        t += step_ns
    state["t_step"] = t
    t = state["t_gpu"]
    while t < t1:
        for g in range(a.gpus):
            tl.add_gpu_sample(GpuSample(t, g, 90, 40, 100 << 30, 141 << 30, 510.5, 1980, 2619, 45,
                                        1024, 2048, 74.0, 31.0, 44.0, 38.0))
        t += tick_ns
    state["t_gpu"] = t
    t = state["t_host"]
    while t < t1:
        tl.add_host_sample(HostSample(t, 105.0, 3 << 30, 12.0, 40, 16))
        t += S // 2
    state["t_host"] = t
    t = state["t_req"]
    while t < t1:
        n = max(1, int(rng.expovariate(1 / a.output_len)))
        first = t + 40_000_000
        times = tuple(first + k * 12_000_000 for k in range(n))
        tl.add_request(RequestRecord(f"r{state['req']}", t - 3 * S, 1000, n, times, "length",
                                     max_tokens=n, output_token_ids=tuple(range(n))))
        state["req"] += 1
        t += int(rng.expovariate(a.req_rate) * S) + 1
    state["t_req"] = t
    t = state["t_event"]
    while t < t1:
        tl.add_event(EngineEvent("knob", state["step"], t, {"max_num_batched_tokens": 2048}))
        t += 30 * S
    state["t_event"] = t


def waveform(tl: Timeline, seconds: float, bins: int = 160):
    """The last ``seconds`` of ``tl`` binned as the report's waveform bins it (one snapshot)."""
    snap = tl.snapshot()
    return snap.step_waveform(snap.t_ns - int(seconds * S), snap.t_ns + 1, bins)


def median_ms(fn, n: int = 5) -> float:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(out)


def engine_like(stop: threading.Event, py_ms: float, gpu_ms: float, out: dict) -> None:
    """Steps of ``py_ms`` pure Python then a GIL-free wait of ``gpu_ms``; records lateness."""
    late, steps = [], 0
    n_py = out["n_py"]  # loop iterations that take py_ms (calibrate_py)
    while not stop.is_set():
        x = 0
        for i in range(n_py):
            x += i
        t0 = time.perf_counter_ns()
        time.sleep(gpu_ms / 1e3)
        late.append((time.perf_counter_ns() - t0) / 1e6 - gpu_ms)
        steps += 1
    out["late"], out["steps"] = late, steps


def calibrate_py(py_ms: float) -> int:
    n = 100_000
    t0 = time.perf_counter_ns()
    x = 0
    for i in range(n):
        x += i
    per = (time.perf_counter_ns() - t0) / n
    return max(1, int(py_ms * 1e6 / per))


def engine_check(tl: Timeline, a: argparse.Namespace) -> dict:
    n_py = calibrate_py(a.engine_py_ms)
    runs: dict[str, list] = {"off": [], "on": []}
    for _ in range(a.rounds):
        for kind in ("off", "on"):
            stop, res = threading.Event(), {"n_py": n_py}
            th = threading.Thread(target=engine_like,
                                  args=(stop, a.engine_py_ms, a.engine_gpu_ms, res))
            snaps = []
            t_end = time.perf_counter() + a.seconds
            th.start()
            t0 = time.perf_counter()
            while time.perf_counter() < t_end:
                if kind == "on":
                    s0 = time.perf_counter_ns()
                    snap = tl.snapshot()
                    snaps.append((time.perf_counter_ns() - s0) / 1e6)
                    del snap
                time.sleep(0.1)
            stop.set()
            th.join()
            dt = time.perf_counter() - t0
            runs[kind].append({"steps_per_s": res["steps"] / dt, "late": res["late"],
                               "snap_ms": snaps})
    out = {}
    for kind, rs in runs.items():
        late = np.concatenate([np.asarray(r["late"]) for r in rs])
        snap = [x for r in rs for x in r["snap_ms"]]
        out[kind] = {"steps_per_s": float(np.median([r["steps_per_s"] for r in rs])),
                     "late_ms_p50": float(np.percentile(late, 50)),
                     "late_ms_p99": float(np.percentile(late, 99)),
                     "late_ms_max": float(late.max()),
                     "snapshot_ms_median": float(np.median(snap)) if snap else None,
                     "snapshots": len(snap)}
    out["ratio_pct"] = 100.0 * out["on"]["steps_per_s"] / out["off"]["steps_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="simulated session (default 60)")
    ap.add_argument("--every", type=float, default=5.0, help="report every N simulated minutes")
    ap.add_argument("--steps-per-s", type=float, default=140.0)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--sample-hz", type=float, default=20.0)
    ap.add_argument("--req-rate", type=float, default=12.0, help="finished requests per s")
    ap.add_argument("--output-len", type=float, default=260.0, help="mean output tokens")
    ap.add_argument("--no-engine-check", dest="engine_check", action="store_false")
    ap.add_argument("--engine-py-ms", type=float, default=1.0,
                    help="pure-Python ms per engine-like step (default 1.0)")
    ap.add_argument("--engine-gpu-ms", type=float, default=6.0,
                    help="GIL-free wait per engine-like step, ms (default 6.0)")
    ap.add_argument("--seconds", type=float, default=3.0, help="per engine-check segment")
    ap.add_argument("--rounds", type=int, default=4, help="off/on engine-check pairs")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    for name in ("minutes", "every", "steps_per_s", "sample_hz", "req_rate", "output_len",
                 "engine_gpu_ms", "seconds"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be > 0")
    if a.gpus < 1 or a.rounds < 1 or a.engine_py_ms < 0:
        ap.error("--gpus and --rounds must be >= 1, --engine-py-ms >= 0")
    sys.setswitchinterval(DEFAULT_SWITCH_INTERVAL_S)  # as every gpuchef session runs

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tl = Timeline(clock=lambda: state["now"], origin_ns=0)
    state = {"rng": random.Random(0), "now": 0, "step": 0, "req": 0, "t_step": 0, "t_gpu": 0,
             "t_host": 0, "t_req": 0, "t_event": 0}
    print(f"# simulated: {a.steps_per_s:g} steps/s, {a.gpus} GPU(s) at {a.sample_hz:g} Hz, "
          f"{a.req_rate:g} req/s of ~{a.output_len:g} tokens; default caps; "
          f"python {sys.version.split()[0]}")
    hdr = (f"{'min':>5} {'heap MiB':>9} {'steps':>7} {'gpu':>7} {'reqs':>6} {'tokens':>8} "
           f"{'feed s':>7}")
    print(hdr)
    print("-" * len(hdr))
    rows = []
    t = 0
    every = int(a.every * 60 * S)
    end = int(a.minutes * 60 * S)
    while t < end:
        t1 = min(end, t + every)
        w0 = time.perf_counter()
        # feed in 1-s slices so that the generator's garbage never piles up
        for s0 in range(t, t1, S):
            feed(tl, s0, min(t1, s0 + S), state, a)
        feed_s = time.perf_counter() - w0
        t = state["now"] = t1
        gc.collect()
        heap = (tracemalloc.get_traced_memory()[0] - base) / 2**20
        snap = tl.snapshot()
        tokens = sum(len(r.token_times_ns) for r in snap.requests)
        n = (len(snap.steps), len(snap.gpu_samples), len(snap.requests))
        del snap
        row = {"minute": t / 60 / S, "heap_mib": heap, "steps": n[0], "gpu_samples": n[1],
               "requests": n[2], "tokens": tokens, "feed_s": feed_s}
        rows.append(row)
        print(f"{row['minute']:5.0f} {heap:9.1f} {n[0]:7d} {n[1]:7d} {n[2]:6d} {tokens:8d} "
              f"{feed_s:7.1f}")
    tracemalloc.stop()  # the reads are timed without its per-allocation hook
    gc.collect()
    reads = {"snapshot_ms": median_ms(tl.snapshot, 9),
             "waveform_60s_ms": median_ms(lambda: waveform(tl, 60.0)),
             "waveform_10s_ms": median_ms(lambda: waveform(tl, 10.0))}
    print(f"# at the end, full rings: snapshot() {reads['snapshot_ms']:.2f} ms (GIL held); "
          f"snapshot().step_waveform, last 60 s {reads['waveform_60s_ms']:.1f} ms, last 10 s "
          f"{reads['waveform_10s_ms']:.1f} ms (160 bins; medians)")
    out = {"args": {k: v for k, v in vars(a).items()}, "rows": rows, "reads": reads,
           "python": sys.version.split()[0]}
    if a.engine_check:
        ec = engine_check(tl, a)
        out["engine_check"] = ec
        print(f"\n# engine-like thread: {a.engine_py_ms:g} ms Python + {a.engine_gpu_ms:g} ms "
              f"GIL-free wait a step; reader: full snapshots at 10 Hz; {a.rounds} pairs of "
              f"{a.seconds:g} s; switch interval {DEFAULT_SWITCH_INTERVAL_S * 1e3:g} ms")
        print(f"{'reader':>7} {'steps/s':>8} {'late p50 ms':>11} {'p99':>6} {'max':>6} "
              f"{'snapshot ms':>11}")
        for kind in ("off", "on"):
            r = ec[kind]
            sm = f"{r['snapshot_ms_median']:11.2f}" if r["snapshot_ms_median"] else f"{'-':>11}"
            print(f"{kind:>7} {r['steps_per_s']:8.1f} {r['late_ms_p50']:11.3f} "
                  f"{r['late_ms_p99']:6.3f} {r['late_ms_max']:6.2f} {sm}")
        print(f"# engine-like steps/s with the reader: {ec['ratio_pct']:.1f} % of without")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
