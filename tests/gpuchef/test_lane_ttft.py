"""benchmarks/lane_ttft.py (the one owner of the lane's short/long TTFT split, issue 17 item 4)
on committed traces, against the split computed here from the raw JSONL with gzip/json/numpy."""
from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH))
import lane_ttft  # noqa: E402

# a CPU autopilot run with a long-prompt lane (threshold 256), kept as a test fixture
TRACE = Path(__file__).parent.parent / "data" / "lane_long1.jsonl.gz"


def _reference(path: Path, thr: int) -> dict:
    with gzip.open(path, "rt") as f:
        recs = [json.loads(ln) for ln in f]
    reqs = [r for r in recs if r["type"] == "request"]
    out = {}
    for side, keep in (("short", lambda n: n <= thr), ("long", lambda n: n > thr)):
        v = [(r["token_times_ns"][0] - r["arrival_ns"]) / 1e6 for r in reqs
             if r["token_times_ns"] and keep(r["prompt_len"])]
        out[side] = (len(v), *np.percentile(v, [50, 90, 99]))
    first = next(r for r in recs if r["type"] == "step")
    return out, first["long_prefill_token_threshold"], len(reqs)


def test_split_and_percentiles_equal_the_raw_records():
    want, thr, n = _reference(TRACE, 256)
    got = lane_ttft.lane_ttft(str(TRACE))
    assert got["threshold"] == thr == 256 and got["requests"] == n
    for side in ("short", "long"):
        g = got[side]
        assert (g["n"], g["p50"], g["p90"], g["p99"]) == pytest.approx(want[side])
    got = lane_ttft.lane_ttft(str(TRACE), short=1024)  # an explicit threshold wins
    want, _, _ = _reference(TRACE, 1024)
    assert got["threshold"] == 1024 and got["short"]["n"] == want["short"][0]


def test_bad_input_is_one_line(tmp_path, capsys):
    assert lane_ttft.main([str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "missing.jsonl" in err
    with pytest.raises(SystemExit):
        lane_ttft.main(["--short", "0", str(TRACE)])
