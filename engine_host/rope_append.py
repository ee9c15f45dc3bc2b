"""RoPE on q and k and the paged K/V append in one Triton kernel (``ops.set_rope_append``).

The unfused path runs four kernels a layer for this work on CUDA: the copies that make q and k
contiguous (they are strided views of the fused qkv projection), FlashInfer's
``apply_rope_with_cos_sin_cache_inplace``, and ``append_paged_kv_cache`` (a decode step's
profile: docs/engine-graphs.md). FlashInfer 0.6.18 has no half-precision kernel that does both (its
``rope_quantize_fp8_append_paged_kv_cache`` writes FP8 only), so this is ours: one program per
(token, group of ``_HEADS`` heads) reads q, k or v straight from the strided views, rotates q and
k in float32, and writes q contiguous and rotated, k rotated and v as they are into the pages at
the token's slot.

Numerics equal FlashInfer's RoPE kernel: ``x·cos − x₂·sin`` / ``x₂·cos + x·sin`` on the
float32 ``[cos | sin]`` table (``ops.rope_cos_sin_cache``'s layout), rounded once to the output
dtype; the pages receive what ``attention.write_kv`` writes.

Triton is imported only when the kernel is first used (the CPU build of torch has none), and
``TRITON_INTERPRET=1`` runs it on the CPU for the tests.
"""

from __future__ import annotations

import functools

import torch

#: heads per program (a power of two): 4 × 128 dims keeps each program a few hundred bytes
_HEADS = 4


@functools.cache
def available() -> bool:
    """Whether triton imports (it ships with CUDA builds of torch, not with the CPU build)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def rope_append_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, slot_ptr, cs_ptr, qo_ptr, cache_ptr,
                           ntok_ptr, ntok, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sqo_t, sqo_h,
                           sc_blk, sc_kv, sc_off, sc_h, cs_t,
                           HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                           HALF_P: tl.constexpr, HB: tl.constexpr, BS: tl.constexpr,
                           HAS_NTOK: tl.constexpr):
        t = tl.program_id(0)
        g = tl.program_id(1)
        if HAS_NTOK:  # a graph's padding rows (t ≥ the step's token count) write nothing
            n = tl.load(ntok_ptr).to(tl.int32)
        else:
            n = ntok
        nqb = (HQ + HB - 1) // HB
        nkb = (HKV + HB - 1) // HB
        hh = tl.arange(0, HB)[:, None]
        dd = tl.arange(0, HALF_P)[None, :]
        dm = (dd < HALF) & ((dd * 0 + t) < n)  # a vector mask (the interpreter takes no scalar)
        tt = t % tl.maximum(n, 1)  # a padding row reads a live row's (and writes nothing)
        pos = tl.load(pos_ptr + tt).to(tl.int64)
        slot = tl.load(slot_ptr + tt).to(tl.int64)
        blk = slot // BS
        page_row = cache_ptr + blk * sc_blk + (slot - blk * BS) * sc_off
        out_ty = cache_ptr.dtype.element_ty
        if g < nqb + nkb:
            cos = tl.load(cs_ptr + pos * cs_t + dd, mask=dm, other=0.0)
            sin = tl.load(cs_ptr + pos * cs_t + HALF + dd, mask=dm, other=0.0)
            if g < nqb:
                h = g * HB + hh
                m = (h < HQ) & dm
                src = q_ptr + t.to(tl.int64) * sq_t + h * sq_h + dd
                dst = qo_ptr + t.to(tl.int64) * sqo_t + h * sqo_h + dd
            else:
                h = (g - nqb) * HB + hh
                m = (h < HKV) & dm
                src = k_ptr + t.to(tl.int64) * sk_t + h * sk_h + dd
                dst = page_row + h * sc_h + dd
            x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
            tl.store(dst, (x1 * cos - x2 * sin).to(out_ty), mask=m)
            tl.store(dst + HALF, (x2 * cos + x1 * sin).to(out_ty), mask=m)
        else:
            h = (g - nqb - nkb) * HB + hh
            m = (h < HKV) & dm
            src = v_ptr + t.to(tl.int64) * sv_t + h * sv_h + dd
            dst = page_row + sc_kv + h * sc_h + dd
            tl.store(dst, tl.load(src, mask=m, other=0.0).to(out_ty), mask=m)
            tl.store(dst + HALF, tl.load(src + HALF, mask=m, other=0.0).to(out_ty), mask=m)

    return rope_append_kernel, triton.next_power_of_2


def kernel_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              kv_cache: torch.Tensor) -> bool:
    """Whether :func:`rope_append_kv` runs for these tensors: Triton imports, CUDA, q, k, v in
    the cache's half-precision dtype, the cache's last dim contiguous."""
    return (available() and q.is_cuda and q.dtype == k.dtype == v.dtype == kv_cache.dtype
            and q.dtype in (torch.bfloat16, torch.float16) and kv_cache.stride(-1) == 1)


def rope_and_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                    cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, num_tokens: torch.Tensor | None = None,
                    q_out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`rope_append_kv` where :func:`kernel_ok`, else the same result from
    ``ops.apply_rope`` and ``attention.write_kv`` (CPU, float32/64; ``num_tokens`` then read on
    the host). Shapes and arguments as :func:`rope_append_kv`; returns the rotated q."""
    if kernel_ok(q, k, v, kv_cache):
        return rope_append_kv(q, k, v, positions, cos_sin_cache, kv_cache, slot_mapping, q_out,
                              num_tokens)
    from . import ops
    from .attention import write_kv

    n = q.shape[0] if num_tokens is None else int(num_tokens.reshape(-1)[0])
    qr, kr = ops.apply_rope(q, k, positions, cos_sin_cache)
    write_kv(kv_cache, kr[:n], v[:n], slot_mapping[:n])
    if q_out is None:
        return qr
    q_out.copy_(qr)
    return q_out


def rope_append_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                   cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, q_out: torch.Tensor | None = None,
                   num_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate q and k by position, write k (rotated) and v into the pages, return rotated q.

    q: [T, Hq, D], k and v: [T, Hkv, D], any row/head strides with the last dim contiguous (the
    views ``qkv_proj(x).split(...)`` gives); positions, slot_mapping: int64 (or int32) [T] on
    the same device, slot = ``block * block_size + offset``; cos_sin_cache: float32
    [max_position, D] (``ops.rope_cos_sin_cache``); kv_cache: [num_blocks, 2, block_size, Hkv,
    D] with the last dim contiguous. ``q_out``: optional [T, Hq, D] in kv_cache's dtype, last
    dim contiguous, to write the rotated q into. ``num_tokens``: optional int32/int64 [1] on
    the device: only rows below it are rotated and written (a CUDA graph captured for T rows
    replays steps of fewer; the padding rows leave q_out and the pages alone). Returns q_out (a
    new contiguous tensor in kv_cache's dtype when not given). Raises ValueError on shapes that
    do not fit.
    """
    T, hq, d = q.shape
    hkv = k.shape[1]
    if (k.shape != (T, hkv, d) or v.shape != k.shape or d % 2 or kv_cache.dim() != 5
            or kv_cache.shape[1] != 2 or tuple(kv_cache.shape[3:]) != (hkv, d)
            or positions.shape != (T,) or slot_mapping.shape != (T,)
            or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != d):
        raise ValueError(f"rope_append_kv: q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                         f"{tuple(v.shape)}, kv_cache {tuple(kv_cache.shape)}, positions "
                         f"{tuple(positions.shape)}, slot_mapping {tuple(slot_mapping.shape)}, "
                         f"cos_sin_cache {tuple(cos_sin_cache.shape)} do not fit")
    if any(t.stride(-1) != 1 for t in (q, k, v, kv_cache)) or cos_sin_cache.stride(-1) != 1:
        raise ValueError("rope_append_kv: the last dim of q, k, v, kv_cache and cos_sin_cache "
                         "must be contiguous")
    if q_out is None:
        q_out = torch.empty((T, hq, d), dtype=kv_cache.dtype, device=q.device)
    if T == 0:
        return q_out
    kernel, next_pow2 = _kernel()
    hb = _HEADS
    groups = -(-hq // hb) + 2 * -(-hkv // hb)
    half = d // 2
    kernel[(T, groups)](q, k, v, positions, slot_mapping, cos_sin_cache, q_out, kv_cache,
                        positions if num_tokens is None else num_tokens, T,
                        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                        v.stride(1), q_out.stride(0), q_out.stride(1),
                        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
                        kv_cache.stride(3), cos_sin_cache.stride(0),
                        HQ=hq, HKV=hkv, HALF=half, HALF_P=next_pow2(half), HB=hb,
                        BS=kv_cache.shape[2], HAS_NTOK=num_tokens is not None)
    return q_out
