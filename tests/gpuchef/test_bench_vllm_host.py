"""benchmarks/bench_vllm_host.py's native arm on the CPU: --block-size reaches the engine, and
the step breakdown (probes.gpu_time.step_breakdown: where an offline run's GPU time goes)
against a computation by hand from the run's own step records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuchef.engine_host.records import StepRecord
from gpuchef.probes.gpu_time import step_breakdown

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def rec(step, prefill, decodes, blocks, gpu_ms, graph=False, prefill_reqs=None):
    return StepRecord(step=step, t_start_ns=0, t_end_ns=int(gpu_ms * 1.5e6), gpu_ms=gpu_ms,
                      mode="chunked", max_num_batched_tokens=2048, max_num_seqs=256,
                      long_prefill_token_threshold=0, max_num_partial_prefills=1,
                      num_prefill_reqs=(1 if prefill else 0) if prefill_reqs is None
                      else prefill_reqs, num_prefill_tokens=prefill,
                      num_decode_reqs=decodes, num_partial_prefills=0, num_running=decodes,
                      num_waiting=0, num_preempted=0, kv_blocks_used=blocks,
                      kv_blocks_total=1000, cuda_graph=graph)


def test_breakdown_against_a_hand_computation():
    # 1e9 matmul params, lm_head 1e8, 2e9 weight bytes, 1e6 bytes a block; 1e12 B/s, 1e15 FLOP/s
    kw = dict(layer_matmul_params=10**9, lm_head_params=10**8, weight_bytes=2 * 10**9,
              kv_bytes_per_block=10**6, mem_bw=1e12, peak_flops=1e15)
    # ms: compute = 2 × tokens × 1e9 / 1e15 + 2 × sampled rows × 1e8 / 1e15; memory = (2e9 +
    # blocks × 1e6) / 1e12
    steps = [rec(0, 2000, 0, 100, 5.0),          # compute 4.0 + 0.0002, memory 2.1
             rec(1, 0, 32, 500, 4.0, graph=True),  # compute 0.064 + 0.0064, memory 2.5
             rec(2, 100, 10, 300, 3.0)]           # compute 0.22 + 0.0022, memory 2.3
    bd = step_breakdown(steps, **kw)
    assert set(bd["by_kind"]) == {"prefill_only", "decode_only", "mixed"}
    p, d, m = (bd["by_kind"][k] for k in ("prefill_only", "decode_only", "mixed"))
    assert p["ideal_ms"] == pytest.approx(4.0 + 0.0002)
    assert d["ideal_ms"] == pytest.approx(2.5) and d["graph_steps"] == 1
    assert m["ideal_ms"] == pytest.approx(2.3)
    assert p["efficiency"] == pytest.approx(4.0002 / 5.0)
    assert bd["by_bound"]["compute"]["steps"] == 1
    mem = bd["by_bound"]["memory"]
    assert mem["steps"] == 2 and mem["gpu_ms"] == pytest.approx(7.0)
    assert mem["prefill_tokens"] == 100 and mem["decode_rows"] == 42
    assert mem["wall_ms"] == pytest.approx(1.5 * 7.0)


def test_native_arm_on_cpu_writes_block_size_and_a_breakdown_of_every_step(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_vllm_host.py"), "--run",
                        "native", "--model", "tiny", "--num-prompts", "6", "--max-model-len",
                        "1024", "--block-size", "32", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads((tmp_path / "native.json").read_text())
    assert d["block_size"] == 32 and d["completed"] == 6
    bd = d["step_breakdown"]
    assert sum(t["steps"] for t in bd["by_kind"].values()) == d["steps"]
    assert sum(t["steps"] for t in bd["by_bound"].values()) == d["steps"]
    gpu = sum(t["gpu_ms"] for t in bd["by_kind"].values())
    # the JSON's busy fraction is the same records' GPU time over the run's wall time
    assert gpu / 1e3 / d["duration_s"] == pytest.approx(d["gpu_busy_fraction"], rel=1e-3)
    assert sum(t["gpu_ms"] for t in bd["by_bound"].values()) == pytest.approx(gpu)
    assert sum(t["decode_rows"] for t in bd["by_kind"].values()) + 6 >= d["total_output_tokens"]
    out = subprocess.run([sys.executable, os.path.join(BENCH, "bench_vllm_host.py"),
                          "--report", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert "where the GPU time goes" in out.stdout and "memory-bound" in out.stdout


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
