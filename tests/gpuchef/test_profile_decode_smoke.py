"""CPU smoke test of benchmarks/profile_decode.py (the H200 decode-step profiler) and its kernel
categoriser."""

from __future__ import annotations

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, os.path.abspath(BENCH))
import profile_decode as pd  # noqa: E402


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
    assert pd.categorize(name, labels) == cat


def test_align_graph_gemms_by_order():
    def rec(name, cat):
        return dict(name=name, start=0.0, us=1.0, labels=["forward", "step0"], cat=cat)
    eager = [[rec("k", "rmsnorm")]]
    graph = [[rec(f"gemm{i}", "gemm (unattributed)") for i in range(8)]]
    assert "order" in pd.align_graph_to_eager(graph, eager, num_layers=2)
    assert [r["cat"] for r in graph[0]] == list(pd.LINEARS) * 2


def test_busy_and_span():
    recs = [dict(start=0.0, us=2.0), dict(start=1.0, us=2.0), dict(start=5.0, us=1.0)]
    assert pd.busy_and_span(recs) == (4.0, 6.0)


def test_profile_decode_cpu_smoke(tmp_path, capsys):
    out = tmp_path / "pd.json"
    rc = pd.main(["--model", "tiny", "--device", "cpu", "--batches", "1,2", "--kv-len", "32",
                  "--iters", "3", "--prof-iters", "1", "--json", str(out),
                  "--trace-dir", str(tmp_path / "traces")])
    assert rc == 0
    d = json.loads(out.read_text())
    assert {"header", "args", "model", "batches", "mem_bw"} <= set(d)
    assert [b["batch"] for b in d["batches"]] == [1, 2]
    for b in d["batches"]:
        assert b["wall_ms"] > 0 and b["roofline_ms"] > 0
        ph = b["phases"]
        for k in ("wall_ms", "host_inputs_ms", "host_plan_ms", "gpu_forward_ms", "gpu_logits_ms",
                  "gpu_sample_ms", "gpu_total_ms"):
            assert ph[k] > 0, k
        assert b["graph_profile"] is None  # no graphs on the CPU
        ep = b["eager_profile"]
        assert ep["kernels_per_step"] > 0 and ep["busy_us"] > 0
        cats = ep["categories"]
        for c in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"):
            assert cats[c]["kernels"] == d["model"]["layers"] or c == "lm_head"
            assert cats[c]["us"] > 0
        assert set(b["bytes"]) >= {"qkv_proj", "lm_head", "attention"}
        assert os.path.getsize(b["trace"]) > 0
    text = capsys.readouterr().out
    assert "ideal at 4.3 TB/s" in text and "decode batch 2" in text


def test_profile_decode_mixed_eager_and_piecewise_columns(tmp_path, capsys):
    """``--mixed``: each shape eager and, within the largest capture size, through the pieces
    (on the CPU run eagerly, padded: the bookkeeping only); the side-by-side table."""
    out = tmp_path / "pd.json"
    rc = pd.main(["--model", "tiny", "--device", "cpu", "--batches", "1", "--kv-len", "32",
                  "--iters", "2", "--prof-iters", "1", "--mixed", "0+16,4+30,0+60",
                  "--cudagraph-capture-sizes", "48,16", "--json", str(out)])
    assert rc == 0
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
    text = capsys.readouterr().out
    assert "piecewise 16,48 tokens (CPU: pieces run eagerly, padded)" in text
    assert "decodes+prefill" in text and "piecewise graphs (48 tokens padded)" in text


def test_profile_decode_full_decode_only_has_no_piecewise_column(tmp_path):
    out = tmp_path / "pd.json"
    assert pd.main(["--model", "tiny", "--device", "cpu", "--batches", "1", "--kv-len", "8",
                    "--iters", "1", "--prof-iters", "1", "--mixed", "0+16",
                    "--cudagraph-mode", "FULL_DECODE_ONLY", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["mixed"][0]["piecewise"] is None and d["batches"][0]["piecewise_wall_ms"] is None


def test_profile_decode_refuses_bad_capture_sizes(capsys):
    with pytest.raises(SystemExit) as e:
        pd.main(["--model", "tiny", "--device", "cpu", "--cudagraph-capture-sizes", "16,x"])
    assert e.value.code == 2
    assert "--cudagraph-capture-sizes '16,x' must be comma-separated" in capsys.readouterr().err
