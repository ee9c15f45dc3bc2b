"""Crash safety of the session trace, end to end: `gpuchef bench --trace` is killed with
SIGKILL mid-run and its trace reads back with at most the last second missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from gpuchef.probes.recorder import read_trace


def test_sigkilled_bench_trace_reads_back(tmp_path):
    path = tmp_path / "killed.jsonl"
    cmd = [sys.executable, "-m", "gpuchef", "bench", "--device", "cpu", "--model", "tiny",
           "--dataset", "random", "--request-rate", "20", "--num-prompts", "2000",
           "--input-len", "32", "--output-len", "256", "--trace", str(path)]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        # wait until the engine is stepping and the trace is being written
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > 20_000:
                break
            assert child.poll() is None, child.stderr.read().decode()
            time.sleep(0.1)
        time.sleep(2.5)
        killed_at = time.monotonic_ns()  # CLOCK_MONOTONIC is system-wide: same clock as the child
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    tr = read_trace(path)
    assert not tr.complete, "a killed run cannot have written its end record"
    assert all("truncated" in p for p in tr.problems), tr.problems  # only a cut last line
    assert len(tr.steps) > 20
    assert [s.step for s in tr.steps] == list(range(len(tr.steps))), "steps missing before the cut"
    last = max(s.t_end_ns for s in tr.steps)
    assert (killed_at - last) / 1e9 <= 1.0, "more than the last second of steps was lost"
    assert tr.meta["command"] == "bench" and tr.meta["model"]["name"] == "tiny"


import pytest  # noqa: E402

#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
