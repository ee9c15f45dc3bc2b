"""Attention over the paged KV pool: the per-step metadata and the PyTorch reference backend.

Every backend reads the same pool: one tensor per layer of shape
``[num_blocks, 2, block_size, num_kv_heads, head_dim]`` (FlashInfer's ``NHD`` layout; index 0 of
dim 1 is K, 1 is V). A step's batch is laid out request-major with all decode requests first
(one query row each), then prefill chunks; this is the order FlashInfer's split into a decode and
a prefill wrapper wants.

Causal rule (FlashInfer's, aligned to the end of the KV): query row ``i`` of a request with
``qo_len`` new tokens and ``kv_len`` tokens of KV (this step's included) sees keys
``0 … kv_len − qo_len + i``. A row that sees no key (``qo_len > kv_len``: the top rows)
outputs 0, as FlashAttention defines its bottom-right causal mask (Dao-AILab/flash-attention
#1778). The step's K/V are written into the pages before attention runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import ops
from .vocab.config import DECODE_ATTENTION
from .vocab.errors import ConfigError


@dataclass
class AttentionMetadata:
    """One step's batch, in the page-table form that FlashInfer's ``plan`` takes.

    Index tensors are int32 on the CPU (FlashInfer plans from host memory), except
    ``slot_mapping`` and ``positions`` (int64, on the model's device).

    - ``qo_indptr`` [B+1]: query rows of request b are ``qo_indptr[b]:qo_indptr[b+1]``.
    - ``kv_indptr`` [B+1], ``kv_indices`` [nnz_pages], ``kv_last_page_len`` [B] (1..block_size):
      the CSR page table after this step's tokens are appended.
    - ``kv_lens``: KV length per request after the append (tokens).
    - ``slot_mapping`` [T]: flat slot ``block * block_size + offset`` for each new token.
    - ``positions`` [T]: the position of each new token in its sequence.
    - ``num_decodes``: the first ``num_decodes`` requests have exactly one query row each.
    """

    block_size: int
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_lens: list[int]
    qo_lens: list[int]
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    num_decodes: int

    @property
    def num_reqs(self) -> int:
        return len(self.kv_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return self.num_decodes == self.num_reqs


#: How a step holding decode rows and prefill chunks attends on FlashInfer
#: (``FlashInferAttention(mixed_attention=...)``): two wrappers, or one prefill plan for all rows.
MIXED_ATTENTION = ("split", "single")

XQA_PAGE_SIZES = (16, 32, 64, 128)


def decode_split_kv_args(value: str | None) -> dict:
    """The split-KV keywords of FlashInfer's decode ``plan`` for ``GPUCHEF_DECODE_SPLIT_KV``
    (an experiment: benchmarks/bench_decode_attention.py's ``fi_tc_nosplit``): unset,
    "" or "auto" → {} (FlashInfer's own split); "off" → ``disable_split_kv=True`` (one CTA per
    request and KV head group, no merge kernel). Raises ConfigError naming the value otherwise.
    A fixed split (FlashInfer's ``fixed_split_size``) is refused: the engine replays decode steps
    from CUDA graphs, and a graph captured with a fixed split replays wrong outputs for steps of
    other lengths (seen on an H200; FlashInfer's scheduler says to disable CUDA graphs with it).
    """
    v = (value or "").strip().lower()
    if v in ("", "auto"):
        return {}
    if v == "off":
        return {"disable_split_kv": True}
    why = (" (a fixed split size is not CUDA-graph safe in FlashInfer's decode plan)"
           if v.isdigit() else "")
    raise ConfigError(f"GPUCHEF_DECODE_SPLIT_KV={value!r} is not allowed{why}: use auto or off")


def padded_block_table(kv_indptr: np.ndarray, kv_indices: np.ndarray,
                       width: int | None = None) -> np.ndarray:
    """The CSR page table (``kv_indptr`` [B+1], ``kv_indices`` [nnz], int) as the padded table
    XQA and FlashAttention-style kernels read: int32 ``[B, width]``, row b holding request b's
    pages in order then zeros (never read: a kernel stops at the request's KV length).

    ``width`` None = the most pages any request holds. Raises ValueError when a request holds
    more than ``width`` pages.
    """
    ptr = np.asarray(kv_indptr, dtype=np.int64)
    counts = np.diff(ptr)
    B = counts.shape[0]
    need = int(counts.max()) if B else 0
    width = need if width is None else int(width)
    if need > width:
        raise ValueError(f"a request holds {need} pages; the page table holds {width} a request")
    table = np.zeros((B, width), dtype=np.int32)
    total = int(ptr[-1]) - int(ptr[0])
    rows = np.repeat(np.arange(B), counts)
    cols = np.arange(total) - np.repeat(ptr[:-1] - ptr[0], counts)
    table[rows, cols] = np.asarray(kv_indices)[int(ptr[0]):int(ptr[-1])]
    return table


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V rows into the pages, in place.

    kv_cache: [num_blocks, 2, block_size, Hkv, D]; k, v: [T, Hkv, D]; slot_mapping: int64 [T]
    (flat slot ``block * block_size + offset``).
    """
    bs = kv_cache.shape[2]
    blk = torch.div(slot_mapping, bs, rounding_mode="floor")
    off = slot_mapping - blk * bs
    kv_cache[blk, 0, off] = k.to(kv_cache.dtype)
    kv_cache[blk, 1, off] = v.to(kv_cache.dtype)


class AttentionBackend:
    """Interface: ``begin_step`` once per step (plan), then ``forward`` once per layer."""

    name = "base"
    #: async scheduling: decode page tables built on the device (FlashInfer sets it up)
    device_page_indices = False

    def configure(self, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                  dtype: torch.dtype) -> None:
        """The model's attention shapes, once before the first step (a backend that plans
        per shape uses them; the reference needs nothing)."""

    def begin_step(self, meta: AttentionMetadata) -> None:
        self.meta = meta

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, out: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Append k, v at ``meta.slot_mapping`` then attend.

        q: [T, Hq, D]; k, v: [T, Hkv, D]; kv_cache: [num_blocks, 2, block_size, Hkv, D].
        ``out``: optional [T, Hq, D] tensor of q's dtype to write the result into (the
        piecewise-graph runner's static buffer); it is then the tensor returned.
        ``rope``: ``(positions int64 [T], cos_sin_cache float32 [max_pos, D])`` when q and k
        arrive unrotated (``ops.fused_rope_append``): the backend rotates them first
        (``ops.apply_rope``), or fused with the append where it has a kernel for that.
        Returns [T, Hq, D] in q's dtype. Softmax scale is 1/sqrt(D).
        """
        raise NotImplementedError

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of q [T, Hq, D] over the pages as ``forward`` does, without writing K/V:
        this step's K/V are already in the pages (the piecewise graphs write them,
        ``rope_append.rope_and_append``). Same ``out`` and return as ``forward``."""
        raise NotImplementedError


class ReferenceAttention(AttentionBackend):
    """Plain PyTorch attention over the paged pool, one request at a time.

    Scores and softmax are computed in float32 (float64 when the inputs are float64), keys are
    gathered page by page from the block table, GQA by repeating each KV head
    ``Hq / Hkv`` times. Used on CPU and as the oracle for the FlashInfer backend.
    """

    name = "reference"

    def begin_step(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        self._qo = meta.qo_indptr.tolist()
        self._kvp = meta.kv_indptr.tolist()
        self._pages = meta.kv_indices.to(torch.long)
        self._mask_cache: dict[tuple[int, int], torch.Tensor] = {}

    def _causal_mask(self, qo_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
        key = (qo_len, kv_len)
        m = self._mask_cache.get(key)
        if m is None:
            rows = torch.arange(qo_len, device=device).unsqueeze(1)
            cols = torch.arange(kv_len, device=device).unsqueeze(0)
            m = cols <= (kv_len - qo_len) + rows  # True = may attend
            self._mask_cache[key] = m
        return m

    def forward(self, layer, q, k, v, kv_cache, out=None, rope=None):
        if rope is not None:
            q, k = ops.apply_rope(q, k, *rope)
        write_kv(kv_cache, k, v, self.meta.slot_mapping)
        return self.attend(q, kv_cache, out=out)

    def attend(self, q, kv_cache, out=None):
        meta = self.meta
        T, hq, d = q.shape
        hkv = kv_cache.shape[3]
        bs = meta.block_size
        group = hq // hkv
        acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        scale = 1.0 / math.sqrt(d)
        if out is None:
            out = torch.empty_like(q)
        pages = self._pages.to(kv_cache.device)
        for b, kv_len in enumerate(meta.kv_lens):
            q0, q1 = self._qo[b], self._qo[b + 1]
            p0, p1 = self._kvp[b], self._kvp[b + 1]
            blk = pages[p0:p1]
            kb = kv_cache[blk, 0].reshape(-1, hkv, d)[:kv_len].to(acc_dtype)  # [kv_len, Hkv, D]
            vb = kv_cache[blk, 1].reshape(-1, hkv, d)[:kv_len].to(acc_dtype)
            L = q1 - q0
            # GQA without copying K/V: query head h uses KV head h // group
            qb = q[q0:q1].to(acc_dtype).view(L, hkv, group, d)
            scores = torch.einsum("lhgd,khd->hglk", qb, kb) * scale  # [Hkv, G, L, kv_len]
            if L > 1:
                mask = self._causal_mask(L, kv_len, q.device)
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            if L > 1 and L > kv_len:  # rows that see no key (softmax of all -inf is NaN): 0
                probs = probs.masked_fill(~mask.any(-1, keepdim=True), 0.0)
            out[q0:q1] = torch.einsum("hglk,khd->lhgd", probs, vb).reshape(L, hq, d).to(q.dtype)
        return out
