"""TTFT of short (<= 256 prompt tokens) and long prompts in the two lane traces here.
Run: python lane_ttft.py (from this folder)."""
import gzip, json
import numpy as np

for L in (4, 1):
    with gzip.open(f"lane_long{L}.jsonl.gz", "rt") as f:
        reqs = [json.loads(ln) for ln in f if '"type":"request"' in ln]
    def ttft(r): return (r["token_times_ns"][0] - r["arrival_ns"]) / 1e6
    short = [ttft(r) for r in reqs if r["prompt_len"] <= 256 and r["token_times_ns"]]
    long_ = [ttft(r) for r in reqs if r["prompt_len"] > 256 and r["token_times_ns"]]
    q = lambda a, p: float(np.percentile(a, p))
    print(f"max_long_partial_prefills={L}: {len(reqs)} requests; short ({len(short)}) TTFT P50 "
          f"{q(short, 50):.0f} P90 {q(short, 90):.0f} P99 {q(short, 99):.0f} ms; long "
          f"({len(long_)}) P50 {q(long_, 50):.0f} P90 {q(long_, 90):.0f} P99 {q(long_, 99):.0f} ms")
