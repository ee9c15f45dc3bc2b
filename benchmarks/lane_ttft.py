"""TTFT of short and long prompts in gpuchef traces: what the long-prompt lane
(`--max-long-partial-prefills`, issue 17 item 4) is for.

A prompt is *long* when it has more than the lane's threshold of tokens
(``--long-prefill-token-threshold``: by default the one the trace's first step ran with, else
``--short``). For each trace (JSONL or .jsonl.gz, read with ``probes.recorder.read_trace``) it
prints the number of requests and, for short and long prompts, the count and TTFT P50 / P90 /
P99 (ms, ``RequestRecord.ttft_ms``; requests without a first token are left out and counted).

Example (the session-8 H200 pair, 4 and 1 long partial prefills):
    python benchmarks/lane_ttft.py benchmarks/results/2026-12-02-h200-s8/s8_lane_long4.jsonl.gz \\
        benchmarks/results/2026-12-02-h200-s8/s8_lane_long1.jsonl.gz
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", help="gpuchef traces (.jsonl or .jsonl.gz)")
    ap.add_argument("--short", type=int, default=None,
                    help="prompts of ≤ this many tokens are short (default: the trace's "
                         "long_prefill_token_threshold)")
    a = ap.parse_args(argv)
    if a.short is not None and a.short < 1:
        ap.error(f"--short {a.short} must be ≥ 1 (tokens)")
    from gpuchef.probes.lanes import lane_ttft
    from gpuchef.probes.recorder import TraceReadError

    for path in a.traces:
        try:
            d = lane_ttft(path, a.short)
        except (OSError, ValueError, TraceReadError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        s, lg = d["short"], d["long"]
        print(f"{path}: max_long_partial_prefills={d['max_long_partial_prefills']}, "
              f"{d['requests']} requests ({d['no_first_token']} without a first token); short "
              f"(≤ {d['threshold']} tokens, {s['n']}) TTFT P50 {s['p50']:.0f} P90 {s['p90']:.0f} "
              f"P99 {s['p99']:.0f} ms; long ({lg['n']}) P50 {lg['p50']:.0f} P90 {lg['p90']:.0f} "
              f"P99 {lg['p99']:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
