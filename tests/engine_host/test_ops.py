"""ops.py against plain formulas and against transformers' own Llama functions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpuchef.engine_host import ops
from gpuchef.engine_host.vocab.errors import ConfigError

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama as hf_llama  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

LLAMA31 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=8192)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rms_norm_matches_hf(dtype):
    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(7, 64, generator=g)).to(dtype)
    ref = hf_llama.LlamaRMSNorm(64, eps=1e-5).to(dtype)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.1 * torch.randn(64, generator=g))
        want = ref(x)
    got = ops.rms_norm(x, ref.weight, 1e-5)
    assert got.dtype == dtype
    assert torch.equal(got, want)
    # and the formula itself, in float64
    x64, w64 = x.double(), ref.weight.double()
    plain = w64 * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)
    tol = {torch.float32: 1e-5, torch.float64: 1e-6, torch.bfloat16: 5e-2}[dtype]
    assert torch.allclose(got.double(), plain, atol=tol, rtol=tol)


def test_fused_add_rms_norm():
    g = torch.Generator().manual_seed(1)
    x, r, w = torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g), torch.rand(32)
    x0, r0 = x.clone(), r.clone()
    normed, new_r = ops.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(new_r, x0 + r0)
    assert torch.equal(normed, ops.rms_norm(x0 + r0, w, 1e-6))


def test_silu_and_mul_layout_gate_then_up():
    g = torch.Generator().manual_seed(2)
    gate, up = torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)
    got = ops.silu_and_mul(torch.cat([gate, up], dim=-1))
    assert got.shape == (6, 16)
    assert torch.allclose(got, gate * torch.sigmoid(gate) * up, atol=1e-6)
    # the chunk is a strided view, so SIMD paths may differ from F.silu by an ulp
    assert torch.allclose(got, F.silu(gate) * up, atol=1e-7, rtol=1e-6)


def _hf_config(head_dim, theta, scaling, max_pos=131072):
    params = {"rope_type": "default", "rope_theta": theta, **(scaling or {})}
    return transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4,
                                    head_dim=head_dim, max_position_embeddings=max_pos,
                                    rope_parameters=params)


@pytest.mark.parametrize("scaling", [None, dict(rope_type="linear", factor=4.0), LLAMA31])
def test_inv_freq_matches_hf(scaling):
    cfg = _hf_config(128, 500000.0, scaling)
    rope_type = (scaling or {}).get("rope_type", "default")
    fn = (hf_llama.LlamaRotaryEmbedding.compute_default_rope_parameters
          if rope_type == "default" else ROPE_INIT_FUNCTIONS[rope_type])
    want, attention_factor = fn(cfg)
    assert attention_factor == 1.0
    got = ops.rope_inv_freq(128, 500000.0, scaling)
    assert got.dtype == torch.float32 and got.shape == (64,)
    assert torch.allclose(got, want, rtol=1e-6, atol=0)


def test_llama3_scaling_regimes():
    """High frequencies kept, low ones divided by the factor, a smooth band between."""
    base = ops.rope_inv_freq(128, 500000.0)
    got = ops.rope_inv_freq(128, 500000.0, LLAMA31)
    wavelen = 2 * math.pi / base
    hi, lo = wavelen < 8192 / 4, wavelen > 8192 / 1
    assert hi.any() and lo.any() and (~hi & ~lo).any()
    assert torch.equal(got[hi], base[hi])
    assert torch.allclose(got[lo], base[lo] / 8)
    mid = ~hi & ~lo
    assert ((got[mid] <= base[mid]) & (got[mid] >= base[mid] / 8)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scaling", [None, LLAMA31])
def test_apply_rope_matches_hf(dtype, scaling):
    D, max_pos = 64, 4096
    cfg = _hf_config(D, 500000.0, scaling, max_pos=max_pos * 4)
    hf_rope = hf_llama.LlamaRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(3)
    positions = torch.tensor([0, 1, 7, 4095, 3, 1000, 2, 2], dtype=torch.int64)  # any order
    q = torch.randn(len(positions), 8, D, generator=g).to(dtype)
    k = torch.randn(len(positions), 2, D, generator=g).to(dtype)

    cos, sin = hf_rope(q, positions[None])  # [1, T, D]
    # transformers wants [B, H, T, D]
    wq, wk = hf_llama.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           cos, sin)
    wq, wk = wq[0].transpose(0, 1), wk[0].transpose(0, 1)

    rope = ops.RotaryEmbedding(D, max_pos, 500000.0, scaling)
    gq, gk = rope(q, k, positions)
    assert gq.dtype == dtype and gq.shape == q.shape and gk.shape == k.shape
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert torch.allclose(gq.float(), wq.float(), atol=tol, rtol=0)
    assert torch.allclose(gk.float(), wk.float(), atol=tol, rtol=0)


def test_apply_rope_plain_formula():
    """Pair (x_i, x_{i+D/2}) rotates by angle p·f_i (NeoX "rotate half" layout)."""
    D, theta = 8, 10000.0
    f = torch.tensor([theta ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    x = torch.randn(3, 1, D, dtype=torch.float64)
    pos = torch.tensor([0, 5, 11])
    got, _ = ops.RotaryEmbedding(D, 16, theta)(x, x[:, :, :], pos)
    a = pos[:, None].double() * f[None]  # [T, D/2]
    x1, x2 = x[:, 0, : D // 2], x[:, 0, D // 2:]
    want = torch.cat([x1 * a.cos() - x2 * a.sin(), x2 * a.cos() + x1 * a.sin()], dim=-1)
    assert torch.allclose(got[:, 0], want, atol=1e-6)
    assert torch.equal(got[0], x[0])  # position 0 is the identity


def test_rope_scaling_validation():
    assert ops.normalize_rope_scaling(None) is None
    assert ops.normalize_rope_scaling({"rope_type": "default", "rope_theta": 1.0}) is None
    assert ops.normalize_rope_scaling({"type": "linear", "factor": 2.0})["rope_type"] == "linear"
    with pytest.raises(ConfigError, match="'yarn'.*linear, llama3"):
        ops.normalize_rope_scaling({"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ConfigError, match="low_freq_factor"):
        ops.normalize_rope_scaling({"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ConfigError, match="head_dim 7"):
        ops.RotaryEmbedding(7, 16, 10000.0)
