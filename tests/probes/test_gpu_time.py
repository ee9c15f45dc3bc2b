"""probes.gpu_time, where an offline run's GPU time goes: the kernel categoriser and tables, and
the step breakdown (``step_breakdown``) against a computation by hand; and, on the CPU, the
scripts that use them: benchmarks/profile_decode.py (the decode-step profiler) and
benchmarks/bench_vllm_host.py's native arm (--block-size reaches the engine; a breakdown of
every step of the run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpuchef.engine_host.vocab.records import StepRecord
from gpuchef.probes import gpu_time as gt
from gpuchef.probes.gpu_time import step_breakdown

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
SCRIPT = os.path.join(BENCH, "profile_decode.py")


def run_script(*args: str) -> subprocess.CompletedProcess:
    """benchmarks/profile_decode.py in a process of its own: stdout, stderr and return code."""
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("name,labels,cat", [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", ["mod:model.layers.3.self_attn.qkv_proj"],
     "qkv_proj"),
    ("splitKreduce_kernel", ["mod:model.layers.3.mlp.down_proj", "mod:model.layers.3.mlp"],
     "down_proj"),
    ("flashinfer::BatchDecodeWithPagedKVCacheKernel<...>", ["mod:model.layers.0.self_attn"],
     "attention"),
    ("void flashinfer::AppendPagedKVCacheKernel<...>", ["mod:model.layers.0.self_attn"],
     "kv_append"),
    ("BatchQKApplyRotaryPosIdsCosSinCacheHeadParallelismKernel", ["mod:model.layers.0.self_attn"],
     "rope"),
    ("void at::native::elementwise_kernel<...>", ["mod:model.layers.0.self_attn"],
     "copies/elementwise"),
    ("flashinfer::norm::FusedAddRMSNormKernel", ["mod:model.layers.1.input_layernorm"], "rmsnorm"),
    ("act_and_mul_kernel", ["mod:model.layers.1.mlp"], "silu_and_mul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", ["logits", "step0"], "lm_head"),
    ("void at::native::unrolled_elementwise_kernel<...>", ["logits", "step0"], "logits_gather_cast"),
    ("Memcpy DtoH (Device -> Pageable)", ["sample", "step0"], "sampling"),
    ("Memcpy HtoD (Pageable -> Device)", ["plan", "step0"], "plan_h2d"),
    # inside a CUDA graph there are no module labels: names only
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", ["forward", "step0"], "gemm (unattributed)"),
    ("void at::native::reduce_kernel<ArgMaxOps>", ["step0"], "sampling"),
    ("some_new_kernel", ["forward", "step0"], "other"),
])
def test_categorize(name, labels, cat):
    assert gt.categorize(name, labels) == cat


def test_align_graph_gemms_by_order():
    def rec(name, cat):
        return dict(name=name, start=0.0, us=1.0, labels=["forward", "step0"], cat=cat)
    eager = [[rec("k", "rmsnorm")]]
    graph = [[rec(f"gemm{i}", "gemm (unattributed)") for i in range(8)]]
    assert "order" in gt.align_graph_to_eager(graph, eager, num_layers=2)
    assert [r["cat"] for r in graph[0]] == list(gt.LINEARS) * 2


def test_busy_and_span():
    recs = [dict(start=0.0, us=2.0), dict(start=1.0, us=2.0), dict(start=5.0, us=1.0)]
    assert gt.busy_and_span(recs) == (4.0, 6.0)


def test_profile_decode_cpu_smoke(tmp_path):
    out = tmp_path / "pd.json"
    r = run_script("--model", "tiny", "--device", "cpu", "--batches", "1,2", "--kv-len", "32",
                   "--iters", "3", "--prof-iters", "1", "--json", str(out),
                   "--trace-dir", str(tmp_path / "traces"))
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    assert {"header", "args", "model", "batches", "mem_bw"} <= set(d)
    assert [b["batch"] for b in d["batches"]] == [1, 2]
    for b in d["batches"]:
        assert b["wall_ms"] > 0 and b["roofline_ms"] > 0
        ph = b["phases"]
        for k in ("wall_ms", "host_inputs_ms", "host_plan_ms", "gpu_forward_ms", "gpu_logits_ms",
                  "gpu_sample_ms", "gpu_total_ms"):
            assert ph[k] > 0, k
        assert "host_forward_ms" not in ph  # one clock on the CPU: no host-bound verdict
        assert b["graph_profile"] is None  # no graphs on the CPU
        ep = b["eager_profile"]
        assert ep["kernels_per_step"] > 0 and ep["busy_us"] > 0
        cats = ep["categories"]
        for c in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"):
            assert cats[c]["kernels"] == d["model"]["layers"] or c == "lm_head"
            assert cats[c]["us"] > 0
        assert set(b["bytes"]) >= {"qkv_proj", "lm_head", "attention"}
        assert os.path.getsize(b["trace"]) > 0
    text = r.stdout
    assert "ideal at 4.3 TB/s" in text and "decode batch 2" in text


def test_profile_decode_mixed_eager_and_piecewise_columns(tmp_path):
    """``--mixed``: each shape eager and, within the largest capture size, through the pieces
    (on the CPU run eagerly, padded: the bookkeeping only); the side-by-side table."""
    out = tmp_path / "pd.json"
    proc = run_script("--model", "tiny", "--device", "cpu", "--batches", "1", "--kv-len", "32",
                      "--iters", "2", "--prof-iters", "1", "--mixed", "0+16,4+30,0+60",
                      "--cudagraph-capture-sizes", "48,16", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(out.read_text())
    m = {(r["decodes"], r["prefill_tokens"]): r for r in d["mixed"]}
    assert set(m) == {(0, 16), (4, 30), (0, 60)}
    assert m[0, 16]["piecewise"]["padded_tokens"] == 16
    assert m[4, 30]["piecewise"]["padded_tokens"] == 48
    assert m[0, 60]["piecewise"] is None  # above the largest size: eager only
    for r in m.values():
        assert r["wall_ms"] > 0 and r["ideal_ms"] > 0
        assert r["eager_profile"]["forward_kernels_per_step"] > 0
    for k in ((0, 16), (4, 30)):
        p = m[k]["piecewise"]
        assert p["wall_ms"] > 0 and p["phases"]["gpu_forward_ms"] > 0
        assert p["profile"]["forward_kernels_per_step"] > 0
    assert d["batches"][0]["piecewise_wall_ms"] > 0
    text = proc.stdout
    assert "piecewise 16,48 tokens (CPU: pieces run eagerly, padded)" in text
    assert "decodes+prefill" in text and "piecewise graphs (48 tokens padded)" in text


def test_profile_decode_full_decode_only_has_no_piecewise_column(tmp_path):
    out = tmp_path / "pd.json"
    assert run_script("--model", "tiny", "--device", "cpu", "--batches", "1", "--kv-len", "8",
                      "--iters", "1", "--prof-iters", "1", "--mixed", "0+16",
                      "--cudagraph-mode", "FULL_DECODE_ONLY", "--json", str(out)).returncode == 0
    d = json.loads(out.read_text())
    assert d["mixed"][0]["piecewise"] is None and d["batches"][0]["piecewise_wall_ms"] is None


def test_profile_decode_refuses_bad_capture_sizes():
    r = run_script("--model", "tiny", "--device", "cpu", "--cudagraph-capture-sizes", "16,x")
    assert r.returncode == 2
    assert "--cudagraph-capture-sizes '16,x' must be comma-separated" in r.stderr


# ---- graphed profiles that traced no kernels inside the replays (CUPTI on torch 2.11+cu130) ----


def _k(name, cat, start, us, *labels):
    return dict(name=name, cat=cat, start=float(start), us=float(us), labels=[*labels, "step0"])


def _eager_step():
    """An eager decode step: four GEMMs in the forward, then lm_head and sampling."""
    return [_k("gemm", "qkv_proj", 0, 30, "forward"), _k("gemm", "o_proj", 40, 20, "forward"),
            _k("gemm", "gate_up_proj", 70, 60, "forward"), _k("gemm", "down_proj", 140, 40, "forward"),
            _k("gemm", "lm_head", 200, 25, "logits"), _k("argmax", "sampling", 230, 5, "sample")]


def _untraced_graph_step():
    """What the H200 build traced of a graphed step: the kernels outside the replay only."""
    return [_k("gemm", "lm_head", 0, 25, "logits"), _k("argmax", "sampling", 30, 5, "sample")]


def _res(graph_steps):
    return dict(batch=32, wall_ms=1.0, roofline_ms=0.5, bytes={"qkv_proj": 10**6, "lm_head": 10**6},
                phases=dict(wall_ms=1.0, gpu_forward_ms=0.8),
                eager_phases=dict(wall_ms=2.0, gpu_forward_ms=1.5),
                graph_profile=gt.summarize(graph_steps) if graph_steps else None,
                eager_profile=gt.summarize([_eager_step()]))


def test_graph_untraced_rule():
    eager = gt.summarize([_eager_step()])
    assert eager["forward_kernels_per_step"] == 4
    assert gt.graph_untraced(gt.summarize([_untraced_graph_step()]), eager)
    assert not gt.graph_untraced(gt.summarize([_eager_step()]), eager)  # traced: as many kernels
    one = _untraced_graph_step() + [_k("attn", "attention", 50, 3, "forward")]  # 1 of 4 < 50 %
    assert gt.graph_untraced(gt.summarize([one]), eager)
    two = one + [_k("attn", "attention", 60, 3, "forward")]  # 2 of 4: not below the share
    assert not gt.graph_untraced(gt.summarize([two]), eager)
    assert not gt.graph_untraced(None, eager) and not gt.graph_untraced(eager, None)


def test_untraced_decode_table_is_the_eager_profile_said_once(capsys):
    said: set = set()
    gt.print_table(_res([_untraced_graph_step()]), 4.3e12, said)
    text = capsys.readouterr().out
    assert text.count(gt.UNTRACED_NOTE) == 1
    assert "per step, eager kernels:" in text and "graph kernels" not in text
    assert "  graph: " not in text and "event-timed graph replay" not in text
    split, ideal = text.split("ideal at")
    # the per-category table: the eager kernels' µs per step (30 for qkv), not the graph's 0
    assert [ln.split()[1:3] for ln in split.splitlines() if ln.startswith("  qkv_proj")] == [
        ["1", "30.0"]]
    rows = {ln.split()[0]: ln.split() for ln in ideal.splitlines()
            if ln.startswith("  kernels")}
    # ideal vs measured (eager): measured 30 µs against 10^6 B / 4.3 TB/s = 0.2 µs, no -374 gap
    ideal_rows = [ln.split() for ln in ideal.splitlines() if ln.startswith("  qkv_proj")]
    assert ideal_rows == [["qkv_proj", f"{1e6 / 4.3e12 * 1e6:.1f}", "30.0",
                           f"{30 - 1e6 / 4.3e12 * 1e6:.1f}"]]
    # kernels total: the eager step's 150 µs of forward + 30 of logits and sampling
    assert rows["kernels"][2:4] == [f"{2 * 1e6 / 4.3e12 * 1e6:.1f}", "180.0"]
    # the time not in kernels is against the eager step's wall (2 ms), not the graph's
    assert "phased wall 2000.0 µs − kernels" in text and f"{2000 - 180:.1f}" in text
    assert "event-timed forward: 1500.0 µs vs forward kernels busy 150.0 µs" in text
    gt.print_table(_res([_untraced_graph_step()]), 4.3e12, said)
    again = capsys.readouterr().out
    assert gt.UNTRACED_NOTE not in again and "see the NOTE above" in again


def test_traced_graph_decode_table_is_the_graphs(capsys):
    gt.print_table(_res([_eager_step()]), 4.3e12, set())
    text = capsys.readouterr().out
    assert gt.UNTRACED_NOTE not in text
    assert "per step, graph kernels (eager µs alongside):" in text
    assert "graph: 6 kernels/step (4 in the forward)" in text


def test_untraced_piecewise_mixed_step_gives_no_busy_verdict(capsys):
    eager = gt.summarize([_eager_step()])
    ph = dict(host_inputs_ms=0.1, host_plan_ms=0.1, gpu_total_ms=1.0, gpu_forward_ms=0.8,
              gpu_logits_ms=0.1, gpu_sample_ms=0.1)
    said: set = set()
    gt.print_mixed("piecewise", ph, gt.summarize([_untraced_graph_step()]), ["n of m outside"],
                   eager=eager, said=said)
    text = capsys.readouterr().out
    assert text.count(gt.UNTRACED_NOTE) == 1 and "NOTE (piecewise): n of m outside" in text
    assert "busy" not in text and "launch-bound" not in text and "kernel-bound" not in text
    # a traced step: busy 2 × 10 µs of a 100 µs span → 20 % busy, launch-bound
    traced = [_k("a", "attention", 0, 10, "forward"), _k("b", "attention", 90, 10, "forward")]
    gt.print_mixed("piecewise", ph, gt.summarize([traced]), [], eager=gt.summarize([traced]),
                   said=said)
    text = capsys.readouterr().out
    assert "forward kernels: 2/step, busy 0.020 ms of a 0.100 ms span (20% busy: launch-bound)" \
        in text


def test_enqueue_note_calls_a_forward_host_bound_only_when_the_gpu_waited_on_it():
    # the GPU's forward took as long as the host took to enqueue it: it waited on the launches
    assert gt.enqueue_note(dict(host_forward_ms=5.8, gpu_forward_ms=6.0)) == \
        ", host enqueue 5.800: host-bound"
    # enqueued well ahead of the GPU (one graph replay): GPU-bound
    assert gt.enqueue_note(dict(host_forward_ms=0.05, gpu_forward_ms=6.2)).endswith("GPU-bound")
    edge = gt.HOST_BOUND_SHARE * 4.0
    assert gt.enqueue_note(dict(host_forward_ms=edge, gpu_forward_ms=4.0)).endswith("host-bound")
    assert gt.enqueue_note(dict(host_forward_ms=edge - 0.01, gpu_forward_ms=4.0)).endswith(
        "GPU-bound")
    # no host figure (the CPU, old JSON) or no GPU time: nothing said
    assert gt.enqueue_note(dict(gpu_forward_ms=6.0)) == ""
    assert gt.enqueue_note(dict(host_forward_ms=1.0, gpu_forward_ms=0.0)) == ""


def test_profile_decode_times_each_mixed_attention(tmp_path):
    """``--mixed-attention split,single``: the piecewise timing once per mode (its own entry in
    the JSON, the first mode the one recorded as ``piecewise``) and their table."""
    out = tmp_path / "pd.json"
    r = run_script("--model", "tiny", "--device", "cpu", "--batches", "1", "--kv-len", "16",
                   "--iters", "1", "--prof-iters", "1", "--mixed", "2+14",
                   "--cudagraph-capture-sizes", "16", "--mixed-attention", "split,single",
                   "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads(out.read_text())["mixed"][0]
    assert m["piecewise"]["mixed_attention"] == "split"
    assert set(m["piecewise_by_attention"]) == {"split", "single"}
    assert all(v["wall_ms"] > 0 for v in m["piecewise_by_attention"].values())
    assert "by mixed-step attention (split, single)" in r.stdout


def test_profile_decode_refuses_unknown_mixed_attention():
    r = run_script("--model", "tiny", "--device", "cpu", "--mixed-attention", "split,fused")
    assert r.returncode == 2
    assert "--mixed-attention 'split,fused': allowed split, single" in r.stderr


def test_profile_decode_refuses_unknown_decode_attention():
    r = run_script("--model", "tiny", "--device", "cpu", "--decode-attention", "fast")
    assert r.returncode == 2
    assert "--decode-attention 'fast' is not one of auto, flashinfer, xqa" in r.stderr


def test_kernels_without_a_launching_op_are_placed_in_their_step_by_start_time():
    # FlashInfer's kernels come through TVM-FFI, not a torch op: the profiler cannot tie them
    # to a step, so they go to the step whose CPU range began last before them
    steps = [[], [], []]
    recs = [dict(name="BatchPrefillWithPagedKVCacheKernel", start=s, us=1.0)
            for s in (5.0, 10.0, 10.5, 29.9, 30.0, 99.0)]
    placed, left = gt.place_by_start(recs, [(10.0, 0), (20.0, 1), (30.0, 2)], steps)
    assert placed == 5 and [r["start"] for r in left] == [5.0]
    assert [[r["start"] for r in s] for s in steps] == [[10.0, 10.5], [29.9], [30.0, 99.0]]


# ---- step_breakdown and benchmarks/bench_vllm_host.py's native arm -------------------------------

def step_rec(step, prefill, decodes, blocks, gpu_ms, graph=False, prefill_reqs=None):
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
    steps = [step_rec(0, 2000, 0, 100, 5.0),          # compute 4.0 + 0.0002, memory 2.1
             step_rec(1, 0, 32, 500, 4.0, graph=True),  # compute 0.064 + 0.0064, memory 2.5
             step_rec(2, 100, 10, 300, 3.0)]           # compute 0.22 + 0.0022, memory 2.3
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
