"""RoPE moved into the K/V append (ops.set_rope_append, engine_host.rope_append).

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


def test_rope_args_follow_the_switch(fused):
    from gpuchef.engine_host.loader import load_model
    model = load_model("tiny", dtype=torch.float32, device="cpu", seed=3).model
    rotary = model.model.layers[0].self_attn.rotary
    pos = torch.arange(5)
    p, cs = rotary.rope_args(pos)
    assert p is pos and torch.equal(cs, rotary.cos_sin_cache)
    assert ops.fused_rope_append(piecewise=True)
    ops.set_rope_append("fused-except-piecewise")
    assert rotary.rope_args(pos) is not None and not ops.fused_rope_append(piecewise=True)
    assert ops.rope_append_mode() == "fused-except-piecewise"
    ops.set_rope_append("separate")
    assert rotary.rope_args(pos) is None and not ops.fused_rope_append(piecewise=True)


def test_bad_rope_append_mode_is_refused(fused):
    from gpuchef.engine_host.vocab.errors import ConfigError
    with pytest.raises(ConfigError, match="rope append 'fast': allowed fused, "
                                          "fused-except-piecewise, separate"):
        ops.set_rope_append("fast")
    assert ops.rope_append_mode() == "fused"  # unchanged


def test_bad_env_value_does_not_break_import():
    """GPUCHEF_ROPE_APPEND=yes: importing works (no traceback from whatever imports first); the
    engine's start refuses it in one line (test_decode_split_kv.py, with the other kernel
    switches)."""
    import subprocess
    import sys
    env = {**os.environ, "GPUCHEF_ROPE_APPEND": "yes"}
    r = subprocess.run([sys.executable, "-c", "import gpuchef.engine_host.ops"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("mode", ["fused", "fused-except-piecewise"])
def test_forward_with_rope_in_attention_is_bit_identical(tiny, mode):
    """Monolithic and piecewise forwards, RoPE in the model (separate) vs in the reference
    backend's forward, and (fused) in the pieces with the K/V append, padding rows writing
    nothing: logits and every KV page identical, float32."""
    runs, prev = {}, ops.rope_append_mode()
    for m in ("separate", mode):
        ops.set_rope_append(m)
        try:
            pw = CudaGraphPiecewise(SimpleNamespace(model=tiny, device=torch.device("cpu")),
                                    (32, 48), capture=False)
            assert pw.fuse_append == (m == "fused")
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


def test_kernel_writes_only_rows_below_num_tokens(interpreted):
    """``num_tokens`` (a device scalar, as a CUDA graph reads it at replay): rows at or past it
    are padding — their q_out rows and their slots (here real slots, to show it) untouched."""
    dev = interpreted
    g = torch.Generator().manual_seed(7)
    T, hq, hkv, d, bs, nb, n = 9, 8, 2, 64, 16, 4, 5
    q, k, v = (torch.randn(T, h, d, generator=g).to(torch.bfloat16) for h in (hq, hkv, hkv))
    pos = torch.randint(0, 200, (T,), generator=g)
    slots = torch.randperm(nb * bs, generator=g)[:T]
    cs = ops.rope_cos_sin_cache(d, 10000.0, None, 256)
    cache = torch.full((nb, 2, bs, hkv, d), 7.0, dtype=torch.bfloat16)
    want = cache.clone()
    write_kv(want, _rope_ref(k[:n], pos[:n], cs), v[:n], slots[:n])
    q_out = torch.full((T, hq, d), -3.0, dtype=torch.bfloat16, device=dev)
    got = cache.to(dev)
    for _ in range(2):  # the same num_tokens buffer read again: idempotent
        rope_append.rope_append_kv(q.to(dev), k.to(dev), v.to(dev), pos.to(dev), cs.to(dev),
                                   got, slots.to(dev), q_out=q_out,
                                   num_tokens=torch.tensor([n], device=dev))
    got, q_out = got.cpu(), q_out.cpu()
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)
    assert (q_out[n:] == -3.0).all()
    torch.testing.assert_close(q_out[:n].float(), _rope_ref(q[:n], pos[:n], cs).float(),
                               rtol=2 ** -7, atol=1e-6)
    zero = torch.full((nb, 2, bs, hkv, d), 7.0, dtype=torch.bfloat16, device=dev)
    rope_append.rope_append_kv(q.to(dev), k.to(dev), v.to(dev), pos.to(dev), cs.to(dev), zero,
                               slots.to(dev), num_tokens=torch.tensor([0], device=dev))
    assert (zero.cpu() == 7.0).all()  # a capture's warm-up (num_tokens 0) writes no page


def test_rope_and_append_fallback_equals_the_kernel_contract():
    """Off CUDA, rope_and_append rotates with ops.apply_rope and writes the first num_tokens
    rows with write_kv (what the kernel does; the CPU piecewise tests run this path)."""
    g = torch.Generator().manual_seed(3)
    T, hq, hkv, d, bs, nb, n = 6, 4, 2, 32, 8, 4, 4
    q, k, v = (torch.randn(T, h, d, generator=g) for h in (hq, hkv, hkv))
    pos, slots = torch.arange(T) * 3, torch.randperm(nb * bs, generator=g)[:T]
    cs = ops.rope_cos_sin_cache(d, 10000.0, None, 64)
    cache = torch.zeros(nb, 2, bs, hkv, d)
    got_q = rope_append.rope_and_append(q, k, v, pos, cs, cache, slots, torch.tensor([n]))
    want = torch.zeros_like(cache)
    write_kv(want, _rope_ref(k[:n], pos[:n], cs), v[:n], slots[:n])
    assert torch.equal(cache, want)
    assert torch.equal(got_q, _rope_ref(q, pos, cs))
