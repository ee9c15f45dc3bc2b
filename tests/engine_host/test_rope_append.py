"""RoPE moved into the K/V append (ops.use_fused_rope_append, engine_host.rope_append).

The kernel against an independent reference — RoPE in float32 from the formula (rotate half,
the ``[cos | sin]`` table) and ``attention.write_kv`` into a cache of sentinels — on strided q/k/v
views of one fused projection, GQA, a head count that is not a multiple of the kernel's head
group, a head dim whose half is not a power of two, and scattered slots. Run by Triton's
interpreter on the CPU (skipped where triton is not installed, as in the CPU CI); the GPU test
(test_flashinfer_gpu.py) runs it compiled against FlashInfer's own RoPE and append.

The plumbing without Triton: with the switch on, the model hands unrotated q, k and the rope
arguments to attention (monolithic and piecewise forward), and the logits and KV cache equal the
switch-off forward bit for bit (float32, CPU) and transformers' logits.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from gpuchef.engine_host import ops, rope_append
from gpuchef.engine_host.attention import write_kv
from gpuchef.engine_host.runner import CudaGraphPiecewise

from test_piecewise import empty_kv, monolithic, piecewise, tiny, two_steps  # noqa: F401


@pytest.fixture
def fused():
    prev = ops.rope_append_mode()
    ops.set_rope_append("fused")
    yield
    ops.set_rope_append(prev)


def _rope_ref(x: torch.Tensor, pos: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE in float32, rounded once to x's dtype (FlashInfer's numerics)."""
    c = cs[pos]
    cos, sin = (t[:, None] for t in c.chunk(2, dim=-1))
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@pytest.fixture
def interpreted(monkeypatch):
    """Triton's kernel on this machine: compiled on CUDA, interpreted on the CPU."""
    if not rope_append.available():
        pytest.skip("triton is not installed (the CPU build of torch ships none)")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    rope_append._kernel.cache_clear()  # decorated again under this setting
    yield torch.device(dev)
    rope_append._kernel.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 64), (6, 3, 80), (4, 4, 32)],
                         ids=["gqa4", "heads-not-a-group-multiple-half40", "mha"])
def test_kernel_matches_formula_and_write_kv(interpreted, dtype, hq, hkv, d):
    dev = interpreted
    g = torch.Generator().manual_seed(hq * 100 + d)
    T, bs, nb = 11, 16, 7
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=g).to(dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(T, hq, d), k.view(T, hkv, d), v.view(T, hkv, d)
    assert not q.is_contiguous()  # strided views, as the model hands them
    pos = torch.randint(0, 500, (T,), generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    cs = ops.rope_cos_sin_cache(d, 500000.0, {"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 128}, 512)
    cache = torch.full((nb, 2, bs, hkv, d), 7.0, dtype=dtype)
    want_cache = cache.clone()
    write_kv(want_cache, _rope_ref(k, pos, cs), v, slots)
    want_q = _rope_ref(q, pos, cs)
    on = dict(device=dev)
    got_cache = cache.to(**on)
    got_q = rope_append.rope_append_kv(q.to(**on), k.to(**on), v.to(**on), pos.to(**on),
                                       cs.to(**on), got_cache, slots.to(**on)).cpu()
    got_cache = got_cache.cpu()
    assert got_q.shape == (T, hq, d) and got_q.dtype == dtype and got_q.is_contiguous()
    if dtype == torch.float32 and dev.type == "cpu":
        assert torch.equal(got_q, want_q) and torch.equal(got_cache, want_cache)
    elif dtype == torch.float32:  # compiled, x·cos − x₂·sin contracts to an FMA: a few ulps
        for got, want in ((got_q, want_q), (got_cache, want_cache)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:  # the interpreter rounds float32 → bf16 its own way: within one bf16 step
        for got, want in ((got_q, want_q), (got_cache, want_cache)):
            torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)
    untouched = torch.ones(nb * bs, dtype=torch.bool)
    untouched[slots] = False
    flat = got_cache.permute(0, 2, 1, 3, 4).reshape(nb * bs, 2, hkv, d)
    assert (flat[untouched] == 7.0).all()  # no slot but the step's was written
    # v is copied as it is, bit for bit
    assert torch.equal(flat[slots, 1], v)


def test_kernel_refuses_shapes_that_do_not_fit():
    q, k = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8)
    cache = torch.zeros(5, 2, 4, 2, 8)
    pos = slots = torch.zeros(3, dtype=torch.int64)
    cs = torch.zeros(16, 8)
    with pytest.raises(ValueError, match=r"kv_cache \(5, 2, 4, 2, 6\)"):
        rope_append.rope_append_kv(q, k, k, pos, cs, torch.zeros(5, 2, 4, 2, 6), slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        rope_append.rope_append_kv(q, k, k, pos, cs, cache, slots[:2])
    with pytest.raises(ValueError, match="contiguous"):
        rope_append.rope_append_kv(q, k, k, pos, cs, torch.zeros(5, 2, 4, 8, 2).transpose(3, 4),
                                   slots)


def test_rope_args_follow_the_switch(tiny, fused):
    pos = torch.arange(5)
    for piecewise in (False, True):
        p, cs = tiny.rope_args(pos, piecewise)
        assert p is pos and torch.equal(cs, tiny.model.layers[0].self_attn.rotary.cos_sin_cache)
    ops.set_rope_append("fused-except-piecewise")
    assert tiny.rope_args(pos) is not None and tiny.rope_args(pos, piecewise=True) is None
    assert ops.rope_append_mode() == "fused-except-piecewise"
    ops.set_rope_append("separate")
    assert tiny.rope_args(pos) is None and tiny.rope_args(pos, piecewise=True) is None


def test_bad_rope_append_mode_is_refused(fused):
    from gpuchef.engine_host.config import ConfigError
    with pytest.raises(ConfigError, match="rope append 'fast': allowed fused, "
                                          "fused-except-piecewise, separate"):
        ops.set_rope_append("fast")
    assert ops.rope_append_mode() == "fused"  # unchanged


def test_bad_env_value_is_refused_at_import():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "import gpuchef.engine_host.ops"],
                       env={**os.environ, "GPUCHEF_ROPE_APPEND": "yes"}, capture_output=True,
                       text=True)
    assert r.returncode != 0
    assert "GPUCHEF_ROPE_APPEND='yes': allowed fused, fused-except-piecewise, separate" in r.stderr


@pytest.mark.parametrize("mode", ["fused", "fused-except-piecewise"])
def test_forward_with_rope_in_attention_is_bit_identical(tiny, mode):
    """Monolithic and piecewise forwards, RoPE in the model (separate) vs in the reference
    backend's forward: logits and every KV page identical, float32."""
    pw = CudaGraphPiecewise(SimpleNamespace(model=tiny, device=torch.device("cpu")), (32, 48),
                            capture=False)
    runs, prev = {}, ops.rope_append_mode()
    for m in ("separate", mode):
        ops.set_rope_append(m)
        try:
            with torch.inference_mode():
                kv_m, kv_p = empty_kv(tiny.config), empty_kv(tiny.config)
                runs[m] = (two_steps(tiny, monolithic, kv_m), kv_m,
                           two_steps(tiny, lambda m, kv, r, t: piecewise(pw, m, kv, r, t), kv_p),
                           kv_p)
        finally:
            ops.set_rope_append(prev)
    (m0, kvm0, p0, kvp0), (m1, kvm1, p1, kvp1) = runs["separate"], runs[mode]
    for a, b in zip(m0 + p0, m1 + p1):
        assert torch.equal(a, b)
    for a, b in zip(kvm0 + kvp0, kvm1 + kvp1):
        assert torch.equal(a, b)
    assert m0[1].abs().max() > 0.1


def test_qkv_returns_unrotated_q_k_when_told(tiny):
    """``qkv(rotate=False)`` (the backend rotates): its q, k at position p equal the rotated
    q, k only at p = 0, where RoPE is the identity; rotated by ops.apply_rope they are equal."""
    x = torch.randn(3, tiny.config.hidden_size)
    attn = tiny.model.layers[0].self_attn
    with torch.inference_mode():
        q1, k1, _ = attn.qkv(torch.tensor([0, 5, 9]), x, rotate=False)
        q0, k0, _ = attn.qkv(torch.tensor([0, 5, 9]), x, rotate=True)
    assert torch.equal(q1[0], q0[0]) and torch.equal(k1[0], k0[0])
    assert not torch.allclose(q1[1:], q0[1:])
    rq, rk = ops.apply_rope(q1, k1, torch.tensor([0, 5, 9]),
                            attn.rotary.cache_on(torch.device("cpu")))
    assert torch.equal(rq, q0) and torch.equal(rk, k0)



def test_prefer_blas_takes_cublaslt_unless_the_user_chose(monkeypatch):
    """ops.prefer_blas: cuBLASLt on CUDA unless TORCH_BLAS_PREFER_CUBLASLT is set (torch's own
    switch, then left alone); nothing off CUDA. torch's setter is replaced by a recorder (the
    CPU build refuses cuBLASLt)."""
    state = {"lib": "_BlasBackend.Cublas", "set": []}

    def lib(backend=None):
        if backend is not None:
            state["set"].append(backend)
            state["lib"] = "_BlasBackend.Cublaslt" if backend == "cublaslt" else state["lib"]
        return state["lib"]
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", lib)
    assert ops.prefer_blas(torch.device("cpu")) is None and state["set"] == []
    monkeypatch.setenv("TORCH_BLAS_PREFER_CUBLASLT", "0")
    assert ops.prefer_blas(torch.device("cuda")) == "cublas" and state["set"] == []
    monkeypatch.delenv("TORCH_BLAS_PREFER_CUBLASLT")
    assert ops.prefer_blas(torch.device("cuda")) == "cublaslt" and state["set"] == ["cublaslt"]
