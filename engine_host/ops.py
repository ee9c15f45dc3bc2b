"""The fused-op seam: RMSNorm, residual-add + RMSNorm, SiLU-and-mul, rotary embedding (RoPE).

PyTorch implementations that match Hugging Face transformers' Llama code op for op (the float32
norm, the cos/sin computed in float32 then cast), so that logits agree with transformers to
rounding. On CUDA half-precision tensors, once ``use_flashinfer_ops(True)`` has been called,
FlashInfer's kernels run instead (``flashinfer.rmsnorm``, ``fused_add_rmsnorm``,
``silu_and_mul``, ``apply_rope_with_cos_sin_cache_inplace``) behind the same signatures.

Sources of the formulas:
- RMSNorm: Zhang & Sennrich 2019; the dtype handling is transformers' ``LlamaRMSNorm``.
- SwiGLU MLP: Shazeer 2020, ``down(silu(gate(x)) * up(x))`` as in ``LlamaMLP``.
- RoPE: Su et al. 2021 (RoFormer), in the "rotate half" (GPT-NeoX, non-interleaved) layout that
  transformers' ``apply_rotary_pos_emb`` uses; inverse frequencies and their scaling as in
  transformers' ``modeling_rope_utils`` (``linear``; ``llama3`` from the Llama 3 paper, §3 and
  Meta's reference code: wavelengths below ``orig/high_freq_factor`` kept, above
  ``orig/low_freq_factor`` divided by ``factor``, smooth interpolation between).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F

from .vocab.errors import ConfigError

ROPE_TYPES = ("default", "linear", "llama3")

# FlashInfer's fused kernels replace the PyTorch paths below for CUDA bf16/fp16 tensors once the
# engine turns them on (``use_flashinfer_ops(True)``, done when the attention backend is
# flashinfer). Off by default, so CPU runs and tests never import flashinfer.
_fi = None


def use_flashinfer_ops(on: bool) -> bool:
    """Route rms_norm, fused_add_rms_norm, silu_and_mul and RoPE through FlashInfer kernels for
    CUDA half-precision tensors (``on=True``) or back to PyTorch. Returns whether they are on:
    False when flashinfer does not import."""
    global _fi
    if not on:
        _fi = None
        return False
    try:
        import flashinfer
    except Exception:  # optional [gpu] extra; the PyTorch paths still work
        _fi = None
        return False
    _fi = flashinfer
    return True


# Experiment, off by default (no step-time gain shown yet: ``bench_engine_step.py --strided-qk``
# measures it): hand q and k to FlashInfer's RoPE, KV-append and attention kernels as strided
# views of the fused qkv output instead of copying them first. Those kernels take row/head
# strides and need only the last dim contiguous (flashinfer csrc rope.cu, page.cu,
# batch_prefill.cu: CHECK_LAST_DIM_CONTIGUOUS, q_stride_n/h), which saves two copy kernels per
# layer (64 per step at 32 layers).
_strided_qk = False


def use_strided_qk(on: bool) -> bool:
    """Turn the strided-q/k experiment on or off (process-wide; set it before an engine is
    built, since CUDA graphs capture whichever path is in force). Returns the new setting."""
    global _strided_qk
    _strided_qk = bool(on)
    return _strided_qk


def strided_qk() -> bool:
    return _strided_qk


# RoPE can move from the model's qkv into one Triton kernel with the K/V append
# (``rope_append.rope_append_kv``) instead of four (q and k copies, RoPE, append). The monolithic
# forward (the full decode graphs, eager steps) hands unrotated q, k to the attention backend
# (``forward(rope=...)``): FlashInfer runs the kernel, other backends rotate first, then append,
# with the same arithmetic as before. The piecewise forward runs the kernel at the end of each
# piece, inside its graph (``model.piece(kv_append=...)``), and only attends between the pieces.
# GPUCHEF_ROPE_APPEND (read once, here): fused (both), fused-except-piecewise (the default: what
# the H200 measured and tested, docs/benchmarks.md; the in-piece kernel is CPU-tested only so
# far), separate (neither); ``bench_engine_step.py --rope-append`` and ``profile_decode.py
# --rope-append`` measure them.
ROPE_APPEND = ("fused", "fused-except-piecewise", "separate")
_rope_append = os.environ.get("GPUCHEF_ROPE_APPEND", "fused-except-piecewise")
# a bad value is refused when an engine is built (check_rope_append_env), not at import: an
# import-time error would be a traceback from whatever imported the package first
_rope_append_env_error = None
if _rope_append not in ROPE_APPEND:
    _rope_append_env_error = (f"GPUCHEF_ROPE_APPEND={_rope_append!r}: allowed "
                              f"{', '.join(ROPE_APPEND)}")
    _rope_append = "fused-except-piecewise"


def check_rope_append_env() -> None:
    """Raise ConfigError naming GPUCHEF_ROPE_APPEND's value and what is allowed when the
    environment gave a value ``ROPE_APPEND`` does not hold (the engine calls it first)."""
    if _rope_append_env_error is not None:
        raise ConfigError(_rope_append_env_error)


def set_rope_append(mode: str) -> None:
    """Set the RoPE + K/V append mode, one of ``ROPE_APPEND`` (process-wide; set it before an
    engine is built, since CUDA graphs capture whichever path is in force). Raises
    ConfigError for another value."""
    global _rope_append
    if mode not in ROPE_APPEND:
        raise ConfigError(f"rope append {mode!r}: allowed {', '.join(ROPE_APPEND)}")
    _rope_append = mode


def rope_append_mode() -> str:
    """The mode in force, as ``ROPE_APPEND`` names it."""
    return _rope_append


def fused_rope_append(piecewise: bool = False) -> bool:
    """Whether RoPE is applied with the K/V append rather than by ``model.Attention.qkv``: in
    the monolithic forward (by the attention backend, ``forward(..., rope=...)``), or
    (``piecewise``) inside the piecewise graphs' pieces."""
    return _rope_append == "fused" if piecewise else _rope_append != "separate"


def prefer_blas(device: torch.device) -> str | None:
    """The BLAS library the engine's GEMMs use on ``device``: on CUDA cuBLASLt
    (``torch.backends.cuda.preferred_blas_library``, process-wide), which made the decode step
    faster on the H200 (docs/benchmarks.md, "Engine step against the roofline"), unless the user
    chose with torch's own TORCH_BLAS_PREFER_CUBLASLT (then left as torch set it). Returns
    "cublaslt" or "cublas"; None off CUDA."""
    if device.type != "cuda":
        return None
    lib = torch.backends.cuda.preferred_blas_library
    if os.environ.get("TORCH_BLAS_PREFER_CUBLASLT") is None:
        lib("cublaslt")
    return "cublaslt" if "lt" in str(lib()).lower() else "cublas"


def _fused(x: torch.Tensor) -> bool:
    return _fi is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------- norms and MLP


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: ``weight * (x / sqrt(mean(x²) + eps))``.

    x: [..., H] any float dtype; weight: [H]. The statistics are computed in float32 and the
    normalised value cast back to x.dtype before the weight multiply (transformers'
    ``LlamaRMSNorm``; float64 inputs are normalised in float32 too, as there). Returns [..., H]
    in the promoted dtype of x and weight (x.dtype when they match).
    """
    if _fused(x) and weight.dtype == x.dtype and x.dim() == 2:
        return _fi.rmsnorm(x.contiguous(), weight, eps)
    dtype = x.dtype
    x32 = x.to(torch.float32)
    var = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(var + eps)).to(dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = x + residual``, then ``rms_norm(residual)``.

    x, residual: [T, H] in the same dtype; weight: [H]. Returns ``(normed, new_residual)``, both
    [T, H]. The inputs are not modified (FlashInfer's kernel works in place; callers must not
    rely on either behaviour).
    """
    if (_fused(x) and weight.dtype == x.dtype == residual.dtype and x.dim() == 2
            and x.is_contiguous() and residual.is_contiguous()):
        _fi.fused_add_rmsnorm(x, residual, weight, eps)  # in place: residual += x; x = norm
        return x, residual
    residual = x + residual
    return rms_norm(residual, weight, eps), residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation: x [T, 2I] laid out ``[gate; up]`` → ``silu(gate) * up`` [T, I]."""
    if _fused(x) and x.is_contiguous():
        return _fi.silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# ----------------------------------------------------------------------------- RoPE


def normalize_rope_scaling(rope_scaling: dict[str, Any] | None,
                           where: str = "rope_scaling") -> dict[str, Any] | None:
    """Check one flat RoPE dict from a config and return what ``rope_inv_freq`` reads from it.

    The type is ``rope_type``, else the older ``type`` (transformers' order), else ``default``;
    ``None``, ``{}`` or type ``default`` → None. Otherwise returns ``{"rope_type": ...}`` plus the
    numbers that type needs (linear: ``factor``; llama3: ``factor``, ``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position_embeddings``); other keys (``rope_theta``, which
    the model config keeps apart, or another type's fields) are dropped. ``partial_rotary_factor``
    must be absent or 1: every head dim is rotated. Raises ConfigError naming ``where`` (the
    config field the dict came from), the bad value and what is allowed.
    """
    if not rope_scaling:
        return None
    if not isinstance(rope_scaling, dict):
        raise ConfigError(f"{where} must be a JSON object or null, got {rope_scaling!r}")
    prf = rope_scaling.get("partial_rotary_factor")
    if prf is not None and prf != 1:
        raise ConfigError(f"{where} partial_rotary_factor {prf!r} is not supported: allowed 1 "
                          "(gpuchef rotates the whole head)")
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"{where} rope_type {rope_type!r} is not supported; "
                          f"allowed: {', '.join(ROPE_TYPES)}")
    if rope_type == "default":
        return None
    need = ("factor",) if rope_type == "linear" else (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for key in need:
        v = rope_scaling.get(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise ConfigError(f"{where} of type {rope_type!r} needs a positive number {key!r}, "
                              f"got {v!r}")
    return {"rope_type": rope_type, **{key: rope_scaling[key] for key in need}}


def rope_inv_freq(head_dim: int, rope_theta: float,
                  rope_scaling: dict[str, Any] | None = None) -> torch.Tensor:
    """Inverse frequencies ``theta ** (-2i / D)`` for i in [0, D/2), float32 [D/2], scaled.

    ``linear``: divided by ``factor`` (Chen et al. 2023, position interpolation).
    ``llama3``: per Llama 3.1 — with ``wavelen = 2π / f``, ``low = orig / low_freq_factor``,
    ``high = orig / high_freq_factor``: f kept where wavelen < high, f / factor where wavelen >
    low, else ``(1 − s)·f/factor + s·f`` with ``s = (orig / wavelen − low_freq_factor) /
    (high_freq_factor − low_freq_factor)``. Computed in float32 on the CPU, as transformers does.
    """
    rs = normalize_rope_scaling(rope_scaling)
    exps = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32)
    inv_freq = 1.0 / (float(rope_theta) ** (exps / head_dim))
    if rs is None:
        return inv_freq
    factor = float(rs["factor"])
    if rs["rope_type"] == "linear":
        return inv_freq / factor
    lo_f, hi_f = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    orig = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > orig / lo_f, inv_freq / factor, inv_freq)
    smooth = (orig / wavelen - lo_f) / (hi_f - lo_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / hi_f) & (wavelen <= orig / lo_f)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin_cache(head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None,
                       max_position: int) -> torch.Tensor:
    """The cos/sin table for positions ``0 … max_position − 1``: float32 [max_position, D].

    Row p is ``[cos(p·f) | sin(p·f)]`` over the D/2 inverse frequencies f (the layout of vLLM's
    ``cos_sin_cache`` and FlashInfer's ``apply_rope_with_cos_sin_cache``). Built on the CPU.
    """
    inv_freq = rope_inv_freq(head_dim, rope_theta, rope_scaling)
    pos = torch.arange(max_position, dtype=torch.int64, device="cpu").to(torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # float32 product, as transformers computes it
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by their token's position ("rotate half" / NeoX layout).

    q: [T, Hq, D], k: [T, Hkv, D]; positions: int64 [T]; cos_sin_cache: float32 [max_pos, D]
    from ``rope_cos_sin_cache`` on q's device. ``x·cos + rotate_half(x)·sin`` with cos and sin
    cast to x.dtype first, as transformers does. Returns new ``(q, k)`` of the same shapes/dtype.
    """
    if _fused(q) and q.dtype == k.dtype:
        T, D = q.shape[0], q.shape[-1]
        if not (_strided_qk and q.stride(-1) == 1 and k.stride(-1) == 1):
            q, k = q.contiguous(), k.contiguous()  # views of the fused qkv output: copy once
        _fi.apply_rope_with_cos_sin_cache_inplace(positions, q.view(T, -1), k.view(T, -1), D,
                                                  cos_sin_cache, is_neox=True)
        return q, k
    cs = cos_sin_cache.index_select(0, positions)  # [T, D]
    cos, sin = cs.chunk(2, dim=-1)
    cos = torch.cat([cos, cos], dim=-1).to(q.dtype).unsqueeze(1)  # [T, 1, D]
    sin = torch.cat([sin, sin], dim=-1).to(q.dtype).unsqueeze(1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q, k


class RotaryEmbedding:
    """RoPE for one model: holds the float32 cos/sin table and applies it.

    Not an ``nn.Module`` on purpose: the table is derived from the config, never loaded, and must
    not be touched by ``model.to(dtype)`` or meta-device construction. It is built on the CPU and
    copied to a device on first use there.
    """

    def __init__(self, head_dim: int, max_position: int, rope_theta: float,
                 rope_scaling: dict[str, Any] | None = None) -> None:
        if head_dim % 2:
            raise ConfigError(f"head_dim {head_dim} must be even for rotary embeddings")
        self.head_dim = head_dim
        self.max_position = max_position
        self.cos_sin_cache = rope_cos_sin_cache(head_dim, rope_theta, rope_scaling, max_position)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def cache_on(self, device: torch.device) -> torch.Tensor:
        """The cos/sin table [max_position, D] float32 on ``device`` (copied once)."""
        t = self._on_device.get(device)
        if t is None:
            t = self._on_device[device] = self.cos_sin_cache.to(device)
        return t

    def rope_args(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """What ``AttentionBackend.forward(rope=...)`` takes when the backend rotates q and k
        (``fused_rope_append()`` on): ``(positions, cos_sin_cache on their device)``; None when
        the model rotates them itself."""
        if not fused_rope_append():
            return None
        return positions, self.cache_on(positions.device)

    def __call__(self, q: torch.Tensor, k: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``apply_rope(q [T,Hq,D], k [T,Hkv,D], positions int64 [T]) -> (q, k)``."""
        return apply_rope(q, k, positions, self.cache_on(q.device))
