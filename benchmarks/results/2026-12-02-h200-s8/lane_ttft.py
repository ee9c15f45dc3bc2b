"""TTFT of short (<= SHORT prompt tokens) and long prompts in the two lane traces here.
Run: python lane_ttft.py [SHORT] (from this folder; SHORT = the runs' --long-prefill-token-threshold)."""
import gzip, json, sys
import numpy as np

SHORT = int(sys.argv[1]) if len(sys.argv) > 1 else 256  # the lane threshold of the runs: 256 (CPU), 1024 (H200)
for L in (4, 1):
    with gzip.open(f"s8_lane_long{L}.jsonl.gz", "rt") as f:
        reqs = [json.loads(ln) for ln in f if '"type":"request"' in ln]
    def ttft(r): return (r["token_times_ns"][0] - r["arrival_ns"]) / 1e6
    short = [ttft(r) for r in reqs if r["prompt_len"] <= SHORT and r["token_times_ns"]]
    long_ = [ttft(r) for r in reqs if r["prompt_len"] > SHORT and r["token_times_ns"]]
    q = lambda a, p: float(np.percentile(a, p))
    print(f"max_long_partial_prefills={L}: {len(reqs)} requests; short ({len(short)}) TTFT P50 "
          f"{q(short, 50):.0f} P90 {q(short, 90):.0f} P99 {q(short, 99):.0f} ms; long "
          f"({len(long_)}) P50 {q(long_, 50):.0f} P90 {q(long_, 90):.0f} P99 {q(long_, 99):.0f} ms")
