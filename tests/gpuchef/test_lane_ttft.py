"""probes.metrics.lane_ttft (the one owner of the lane's short/long TTFT split) and its script
benchmarks/lane_ttft.py on committed traces, against the split computed here from the raw JSONL
with gzip/json/numpy."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuchef.probes.metrics import lane_ttft

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "lane_ttft.py")

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
    got = lane_ttft(str(TRACE))
    assert got["threshold"] == thr == 256 and got["requests"] == n
    for side in ("short", "long"):
        g = got[side]
        assert (g["n"], g["p50"], g["p90"], g["p99"]) == pytest.approx(want[side])
    got = lane_ttft(str(TRACE), short=1024)  # an explicit threshold wins
    want, _, _ = _reference(TRACE, 1024)
    assert got["threshold"] == 1024 and got["short"]["n"] == want["short"][0]


def test_bad_input_is_one_line(tmp_path):
    r = _script(str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2
    err = r.stderr
    assert err.count("error:") == 1 and "missing.jsonl" in err
    r = _script("--short", "0", str(TRACE))  # argparse's error: exit 2, usage on stderr
    assert r.returncode == 2 and "--short 0 must be" in r.stderr


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=120)
