"""Where an engine's time goes, step by step, from session traces: one row per trace.

For each trace: how many steps ran; for decode-only steps in a band of batch sizes, the median
wall time of a step (``t_end_ns - t_start_ns``: host scheduling + launch + the forward and
sampling it waits for) beside its GPU time (``gpu_ms``: CUDA events around the forward) — a wall
time that grows while the GPU time does not is host time, e.g. the engine thread waiting for
the GIL; the gap between one step's end and the next one's start while requests were running
(the loop's own overhead: records out, commands in); and the fraction of the run's wall time the
engine spent inside steps.

Usage::

    python benchmarks/step_timeline.py old-serve.jsonl.gz new-serve.jsonl.gz inproc.jsonl.gz \\
        [--batch 40-60]
"""

from __future__ import annotations

import argparse
import statistics


def summarize(path: str, lo: int, hi: int) -> dict[str, float]:
    from gpuchef.probes.recorder import read_trace

    tr = read_trace(path)
    steps = sorted(tr.steps, key=lambda s: s.t_start_ns)
    band = [s for s in steps if s.num_prefill_tokens == 0 and lo <= s.num_decode_reqs <= hi]
    gaps = [(b.t_start_ns - a.t_end_ns) / 1e6 for a, b in zip(steps, steps[1:])
            if a.num_running > 0]
    busy = sum(s.t_end_ns - s.t_start_ns for s in steps)
    span = (steps[-1].t_end_ns - steps[0].t_start_ns) if steps else 0

    def med(v: list[float]) -> float:
        return statistics.median(v) if v else float("nan")

    def p99(v: list[float]) -> float:
        return sorted(v)[int(0.99 * (len(v) - 1))] if v else float("nan")

    return {"steps": len(steps), "band_steps": len(band),
            "decode_wall_ms_p50": med([s.wall_ms for s in band]),
            "decode_wall_ms_p99": p99([s.wall_ms for s in band]),
            "decode_gpu_ms_p50": med([s.gpu_ms for s in band]),
            "gap_ms_p50": med(gaps), "gap_ms_p99": p99(gaps),
            "busy_pct": 100.0 * busy / span if span else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--batch", default="40-60",
                    help="decode rows of the decode-only steps compared (LO-HI)")
    a = ap.parse_args()
    lo, _, hi = a.batch.partition("-")
    for p in a.traces:
        r = summarize(p, int(lo), int(hi or lo))
        print(f"{p}: " + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in r.items()))


if __name__ == "__main__":
    main()
