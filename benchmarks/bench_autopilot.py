"""The autopilot's own cost per step on the engine thread (issue 17: floor ≤ 50 µs).

Run:  python benchmarks/bench_autopilot.py [--decodes 256] [--waiting 64] [--steps 5000]
      [--json OUT] [--parts]

A scheduler with ``--decodes`` running decodes (contexts of 500-4000 tokens), one partial prefill
and ``--waiting`` queued prompts is scheduled over and over on a synthetic KV pool (no model);
each iteration times, with ``time.perf_counter_ns``:

* ``off``: ``Scheduler.schedule()`` with the autopilot off;
* ``on``: ``Scheduler.schedule()`` with ``auto_budget=itl_p99:50ms,ttft_p99:2s`` (the ITL rule,
  the TTFT scan of the line, the features) plus ``Scheduler.observe`` (the model's update), fed
  a synthetic step time (8 ms + 0.06 ms/decode + 0.02 ms/prefill token) under which the ITL rule
  stops short of the budget, so that the TTFT scan runs as often as it can (every
  ``TTFT_EVERY`` steps: the costliest path);

and reports the median and P99 of each, and the autopilot's cost per step as the difference of
the two medians (and of the two P99s: a difference of tails, which noise can make negative).
The two are timed in alternating blocks of 10 iterations, so that a neighbour's load hits both.
With ``--parts``, a second pass times the autopilot's own calls on the engine thread one by
one (``Autopilot.choose`` — its median is a step without the TTFT scan —, the TTFT scan
``_ttft_need`` alone, ``finish``, ``observe`` = the model's update, and the scheduler's
``_autopilot`` hook), each wrapped in ``perf_counter_ns`` (≈ 0.1 µs of its own per call).
The scheduler's output is thrown away after each iteration (the same requests are scheduled
again), so the figures are the hot path's, on whatever CPU runs this.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuchef.engine_host.autopilot import StepTimeModel  # noqa: E402
from gpuchef.engine_host.vocab.config import SchedulerConfig  # noqa: E402
from gpuchef.engine_host.kv_cache import KVCacheManager  # noqa: E402
from gpuchef.engine_host.request import Request, RequestStatus, SamplingParams  # noqa: E402
from gpuchef.engine_host.scheduler import Scheduler  # noqa: E402

BS = 16


def build(cfg: SchedulerConfig, decodes: int, waiting: int, seed: int = 0) -> Scheduler:
    rng = random.Random(seed)
    kv = KVCacheManager(1, 1 << 17, BS, 1, 1, torch.float32, torch.device("cpu"))
    sched = Scheduler(cfg, kv)
    for i in range(decodes + 1):
        n = rng.randint(500, 4000)
        r = Request(f"d{i}", [1] * n, SamplingParams(max_tokens=10_000, ignore_eos=True), 0)
        r.prefill_target = n
        r.status = RequestStatus.RUNNING
        kv.grow(r, n + BS)  # room for the decode token: the fast path, no block taken
        r.num_computed_tokens = n if i < decodes else n // 3  # the last one: a partial prefill
        sched.running.append(r)
    for i in range(waiting):
        sched.waiting.append(Request(f"w{i}", [1] * rng.randint(200, 3000),
                                     SamplingParams(max_tokens=100), time.monotonic_ns()))
    return sched


def reset(sched: Scheduler, out) -> None:
    """Undo what ``schedule()`` did, so the next iteration sees the same state."""
    for r, n in out.prefills:
        if r.num_computed_tokens == 0:  # admitted this step: back to the queue's head
            sched.running.remove(r)
            sched.kv.free(r)
            r.status = RequestStatus.WAITING
    admitted = [r for r, _ in out.prefills if r.status is RequestStatus.WAITING]
    sched.waiting.extendleft(reversed(admitted))


def synthetic_ms(out) -> float:
    return 8.0 + 2.0 * bool(out.prefills) + 0.06 * len(out.decodes) + 0.02 * out.num_prefill_tokens


def measure(sched: Scheduler, steps: int, with_observe: bool) -> list[int]:
    ts: list[int] = []
    pc = time.perf_counter_ns
    for i in range(steps):
        t0 = pc()
        out = sched.schedule()
        if with_observe:  # a step time that leaves the ITL rule short of the budget, so
            # the TTFT scan runs too (the costliest path)
            ms = synthetic_ms(out) * (1.0 + 0.02 * ((i % 5) - 2))
            sched.observe(out, ms, ms + 0.5 if out.decodes else -1.0)  # the feedback too
        ts.append(pc() - t0)
        reset(sched, out)
    return ts


def parts(sched: Scheduler, steps: int) -> dict[str, dict]:
    """Time the autopilot's calls one by one over ``steps`` iterations (µs per call)."""
    ap = sched.autopilot
    pc = time.perf_counter_ns
    acc: dict[str, list[int]] = {}

    def wrap(obj, attr, name):
        f = getattr(obj, attr)
        ts = acc.setdefault(name, [])

        def timed(*args):
            t0 = pc()
            r = f(*args)
            ts.append(pc() - t0)
            return r
        setattr(obj, attr, timed)

    wrap(ap, "_ttft_need", "TTFT scan (_ttft_need)")  # first: choose calls it through self
    wrap(ap, "choose", "choose")
    wrap(ap, "finish", "finish")
    wrap(ap, "observe", "observe (the model's update)")
    wrap(sched, "_autopilot", "Scheduler._autopilot")
    try:
        measure(sched, steps, True)
    finally:
        for obj in (ap, sched):  # the instance attributes go, the methods are back
            for attr in ("_ttft_need", "choose", "finish", "observe", "_autopilot"):
                obj.__dict__.pop(attr, None)
    return {k: {"median_us": statistics.median(v) / 1e3, "mean_us": statistics.fmean(v) / 1e3,
                "calls": len(v)} for k, v in acc.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decodes", type=int, default=256, help="running decodes (1-512: the synthetic KV pool holds 512 contexts of up to 4000 tokens)")
    ap.add_argument("--waiting", type=int, default=64, help="queued prompts (0-4096)")
    ap.add_argument("--steps", type=int, default=5000,
                    help="timed iterations of each (≥ 10, a multiple of 10: blocks of 10)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--parts", action="store_true",
                    help="also time the autopilot's calls one by one (median and mean, µs)")
    a = ap.parse_args()
    for name, v, lo, hi in (("--decodes", a.decodes, 1, 512), ("--waiting", a.waiting, 0, 4096),
                            ("--steps", a.steps, 10, 10**7)):
        if not lo <= v <= hi:
            ap.error(f"{name} {v} is out of range: allowed {lo}-{hi}")
    a.steps -= a.steps % 10
    base = dict(max_num_batched_tokens=2048, max_num_seqs=1024)
    off = build(SchedulerConfig(**base), a.decodes, a.waiting)
    on = build(SchedulerConfig(**base, auto_budget="itl_p99:50ms,ttft_p99:2s"), a.decodes,
               a.waiting)
    # the chunk of the partial prefill is re-granted each iteration, so the kv pool's use is flat
    measure(off, 200, False)
    measure(on, 50, True)  # warm-up: builds the autopilot
    rng = random.Random(1)
    for _ in range(200):  # then fits its model on varied steps (the bench's own are all alike)
        d, p = rng.randint(1, 300), rng.randint(0, 2048)
        on.autopilot.model.update(StepTimeModel.features(d, p, 2000 * d, p * p / 2),
                                  8.0 + 2.0 * bool(p) + 0.06 * d + 0.02 * p)
    measure(on, 200, True)
    rows = {}
    # interleaved in blocks of 10, so that both see the same machine (a shared VM's neighbours
    # moved two separate runs' medians by more than the autopilot costs)
    t_off: list[int] = []
    t_on: list[int] = []
    for _ in range(max(1, a.steps // 10)):
        t_off += measure(off, 10, False)
        t_on += measure(on, 10, True)
    for name, t in (("off", t_off), ("on", t_on)):
        q = statistics.quantiles(t, n=100)
        rows[name] = {"median_us": statistics.median(t) / 1e3, "p99_us": q[98] / 1e3}
    rows["autopilot_us"] = {k: rows["on"][k] - rows["off"][k] for k in ("median_us", "p99_us")}
    rows["active"] = bool(on.autopilot and on.autopilot.active)
    out = on.schedule()
    rows["allowance_in_force"] = out.autopilot.allowance
    rows["state"] = out.autopilot.state
    reset(on, out)
    if a.parts:
        rows["parts"] = parts(on, a.steps)
    rows["args"] = vars(a)
    print(f"schedule() with {a.decodes} decodes, 1 partial prefill, {a.waiting} waiting; "
          f"{a.steps} iterations (autopilot {rows['state']}, allowance "
          f"{rows['allowance_in_force']} of {2048 - a.decodes} left)")
    for name in ("off", "on", "autopilot_us"):
        r = rows[name]
        label = {"off": "schedule, autopilot off", "on": "schedule + observe, autopilot on",
                 "autopilot_us": "autopilot's cost per step"}[name]
        print(f"  {label:34s} median {r['median_us']:7.1f} µs   p99 {r['p99_us']:7.1f} µs")
    for name, r in rows.get("parts", {}).items():
        print(f"  part {name:29s} median {r['median_us']:7.1f} µs   mean {r['mean_us']:6.1f} µs "
              f"({r['calls']} calls)")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
