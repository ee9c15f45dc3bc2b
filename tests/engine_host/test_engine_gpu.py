"""The GPU engine path on CUDA (run on the GPU machine with `pytest -m gpu`): FlashInfer's fused
ops against their PyTorch paths, the FlashInfer engine's logits against the reference engine on
the same weights, and CUDA-graph decode against eager decode."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gpuchef.engine_host import ops
from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.request import SamplingParams

pytestmark = pytest.mark.gpu


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


@pytest.fixture
def fused():
    pytest.importorskip("flashinfer")
    assert ops.use_flashinfer_ops(True)
    yield
    ops.use_flashinfer_ops(False)


def both(fn):
    """fn() with FlashInfer's kernels, then with the PyTorch path."""
    ops.use_flashinfer_ops(True)
    a = fn()
    ops.use_flashinfer_ops(False)
    b = fn()
    return a, b


@pytest.mark.parametrize("T", [1, 7, 300])
def test_fused_ops_equal_pytorch(fused, T):
    dev, bf = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(T)
    H, I, D = 4096, 1024, 128
    x = torch.randn(T, H, device=dev, dtype=bf, generator=g)
    res = torch.randn(T, H, device=dev, dtype=bf, generator=g)
    w = (1 + 0.1 * torch.randn(H, device=dev, generator=g)).to(bf)
    a, b = both(lambda: ops.rms_norm(x.clone(), w, 1e-5))
    assert rel_err(a, b) <= 1e-2
    a, b = both(lambda: ops.fused_add_rms_norm(x.clone(), res.clone(), w, 1e-5))
    assert rel_err(a[0], b[0]) <= 1e-2 and rel_err(a[1], b[1]) <= 1e-2
    gu = torch.randn(T, 2 * I, device=dev, dtype=bf, generator=g)
    a, b = both(lambda: ops.silu_and_mul(gu.clone()))
    assert rel_err(a, b) <= 1e-2
    for scaling in (None, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                               high_freq_factor=4.0, original_max_position_embeddings=8192)):
        rope = ops.RotaryEmbedding(D, 131072, 500000.0, scaling)
        qkv = torch.randn(T, (32 + 16) * D, device=dev, dtype=bf, generator=g)
        pos = torch.randint(0, 131072, (T,), device=dev, generator=g)

        def f():
            q, k = qkv.clone().split([32 * D, 16 * D], dim=-1)
            return rope(q.view(T, 32, D), k.view(T, 16, D), pos)
        a, b = both(f)
        assert rel_err(a[0], b[0]) <= 1e-2 and rel_err(a[1], b[1]) <= 1e-2


def engine(backend, eager=False, mode="chunked", blocks=512, max_model_len=2048,
           async_scheduling=False, block_size=16):
    return LLMEngine(EngineConfig(
        model="tiny", device="cuda", dtype="bfloat16", attention_backend=backend,
        enforce_eager=eager, max_model_len=max_model_len, async_scheduling=async_scheduling,
        cache=CacheConfig(num_gpu_blocks=blocks, block_size=block_size),
        scheduler=SchedulerConfig(mode=mode, max_num_batched_tokens=512)))


PROMPTS = [[11 + (i * 37 + j * 11) % 4000 for j in range(n)] for i, n in
           enumerate([5, 130, 17, 64, 1, 300, 33, 16])]


@pytest.fixture(params=["copied-qk", "strided-qk", "fused-rope-append"])
def qk_layout(request):
    """The ways of handing q/k to FlashInfer: copies before FlashInfer's RoPE, the experiment
    that passes strided views of the fused qkv output (ops.use_strided_qk), and RoPE fused with
    the K/V append in one Triton kernel (ops.set_rope_append("fused"))."""
    prev = ops.rope_append_mode()
    ops.use_strided_qk(request.param == "strided-qk")
    ops.set_rope_append("fused" if request.param == "fused-rope-append" else "separate")
    yield request.param
    ops.use_strided_qk(False)
    ops.set_rope_append(prev)


def test_flashinfer_engine_logits_match_reference(qk_layout):
    pytest.importorskip("flashinfer")
    check_logits_match_reference(block_size=16)


@pytest.mark.parametrize("block_size", [32, 64])
def test_larger_kv_pages_match_reference_and_graphs_equal_eager(block_size):
    """--block-size 32 and 64: FlashInfer's plans with those page sizes (prefill, decode and
    the fused RoPE + append's slots) against the reference backend's logits, and the CUDA
    graphs (decode and piecewise) give the eager run's greedy tokens."""
    pytest.importorskip("flashinfer")
    check_logits_match_reference(block_size=block_size)
    eager, g0 = greedy_run(engine("flashinfer", eager=True, block_size=block_size))
    graphs, g1 = greedy_run(engine("flashinfer", eager=False, block_size=block_size))
    ops.use_flashinfer_ops(False)
    assert g0 == 0 and g1 > 10, "decode steps should replay graphs"
    assert graphs == eager


def check_logits_match_reference(block_size: int) -> None:
    logits = {}
    for backend in ("flashinfer", "reference"):
        eng = engine(backend, eager=True, block_size=block_size)
        for i, p in enumerate(PROMPTS):
            eng.add_request(f"r{i}", p, SamplingParams(max_tokens=4, ignore_eos=True))
        ops.use_flashinfer_ops(backend == "flashinfer")
        rows = []
        with torch.inference_mode():
            for _ in range(3):  # a prefill step, then decodes: both attention paths
                out = eng.scheduler.schedule()
                batch = eng.runner.prepare(out)
                eng.attn.begin_step(batch.meta)
                h = eng.runner.model(batch.input_ids, batch.meta.positions, eng.kv.kv_caches,
                                     eng.attn)
                rows.append(eng.runner.model.compute_logits(h))
                eng.scheduler.advance(out, 0, 0)  # the scheduler's own booking of the step
                for r in out.decodes + [r for r, _ in out.prefills]:
                    if r.num_computed_tokens == r.num_tokens:
                        r.output_token_ids.append(20)
        logits[backend] = rows
    ops.use_flashinfer_ops(False)
    for a, b in zip(logits["flashinfer"], logits["reference"]):
        assert a.shape == b.shape
        assert rel_err(a, b) <= 2e-2


def greedy_run(eng, n_out=24):
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=n_out, ignore_eos=True))
    outs, graph_steps = {}, 0
    while eng.has_unfinished():
        res = eng.step()
        graph_steps += bool(res.record and res.record.cuda_graph)
        for f in res.finished:
            outs[f.request_id] = f.output_token_ids
    return outs, graph_steps


def test_cuda_graph_decode_equals_eager(qk_layout):
    pytest.importorskip("flashinfer")
    eager, g0 = greedy_run(engine("flashinfer", eager=True))
    graphs, g1 = greedy_run(engine("flashinfer", eager=False))
    ops.use_flashinfer_ops(False)
    assert g0 == 0 and g1 > 10, "decode steps should replay graphs"
    assert graphs == eager


def test_cuda_graph_engine_serves_both_modes_and_preemption():
    """Graph replays with a changing batch (finishing requests, preemption, mode switch) give
    every request its forced length and return every page."""
    pytest.importorskip("flashinfer")
    eng = engine("flashinfer", blocks=40, mode="continuous", max_model_len=400)
    for i, p in enumerate(PROMPTS * 3):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=40 + i, ignore_eos=True))
    done, pre = run_with_mode_switch(eng)
    ops.use_flashinfer_ops(False)
    assert pre > 0
    assert eng.kv.pool.num_free == 40
    assert {k: f.output_len for k, f in done.items()} == {f"r{i}": 40 + i
                                                         for i in range(len(PROMPTS) * 3)}


def run_with_mode_switch(eng, at=30):
    """Step to the end, switching to chunked before call ``at``. Returns the finished records
    by id and the preemptions made."""
    done, k, pre = {}, 0, 0
    while eng.has_unfinished():
        if k == at:
            eng.set_scheduler_config(eng.scheduler_config.with_changes(mode="chunked"))
        res = eng.step()
        pre += res.record.num_preempted if res.record else 0
        for f in res.finished:
            done[f.request_id] = f
        k += 1
    return done, pre


@pytest.mark.parametrize("backend,eager", [("flashinfer", False), ("flashinfer", True),
                                           ("reference", True)])
def test_async_scheduling_equals_sync(backend, eager):
    """Async scheduling (step N+1 launched before N's tokens reach the host; its decode inputs
    gathered on the device, into the CUDA graph's static input buffer) gives the sync tokens."""
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    sync, g0 = greedy_run(engine(backend, eager=eager))
    eng = engine(backend, eager=eager, async_scheduling=True)
    got, g1 = greedy_run(eng)
    ops.use_flashinfer_ops(False)
    assert got == sync
    assert g1 == g0
    if not eager:
        assert g1 > 10, "decode steps should replay graphs"
    assert eng.kv.pool.num_free == 512


def test_async_scheduling_with_eos_preemption_and_sampling():
    """Tiny pool (preemption falls back to sync), EOS stops mid-pipeline, seeded sampling, a
    mode switch: every request ends as it should and every page comes back. (Batches differ
    from the sync run's here — a stopped request's row rides one more step — and bfloat16 GEMMs
    may round differently per batch size, so tokens are compared by the CPU float64 tests.)"""
    pytest.importorskip("flashinfer")

    def run(async_on):
        eng = engine("flashinfer", blocks=40, mode="continuous", max_model_len=400,
                     async_scheduling=async_on)
        for i, p in enumerate(PROMPTS * 3):
            sp = (SamplingParams(max_tokens=40 + i, temperature=0.8, top_k=50, seed=i)
                  if i % 3 == 0 else SamplingParams(max_tokens=40 + i, ignore_eos=i % 3 == 1))
            eng.add_request(f"r{i}", p, sp)
        done, pre = run_with_mode_switch(eng)
        assert eng.kv.pool.num_free == 40
        eos = eng.model_config.eos_token_ids
        for i in range(len(PROMPTS) * 3):
            f = done[f"r{i}"]
            if f.finish_reason == "length":
                assert f.output_len == 40 + i
            else:
                assert f.finish_reason == "stop" and f.output_token_ids[-1] in eos
                assert i % 3 != 1 and f.output_len <= 40 + i
        return pre
    assert run(False) > 0
    assert run(True) > 0
    ops.use_flashinfer_ops(False)


def test_async_scheduling_is_the_default_on_cuda():
    """No --async-scheduling / --no-async-scheduling on CUDA: async (issue 16), with the greedy
    tokens of --no-async-scheduling."""
    backend = "flashinfer" if importlib.util.find_spec("flashinfer") else "reference"
    eng = engine(backend, async_scheduling=None)
    assert eng.async_scheduling is True and eng.config.async_scheduling is True
    got, _ = greedy_run(eng)
    sync, _ = greedy_run(engine(backend, async_scheduling=False))
    ops.use_flashinfer_ops(False)
    assert got == sync
