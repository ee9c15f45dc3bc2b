"""The paged KV cache: a pool of fixed-size blocks over one preallocated tensor per layer.

Layout per layer (FlashInfer ``NHD``): ``[num_blocks, 2, block_size, num_kv_heads, head_dim]``,
K at index 0 and V at index 1 of dim 1. A request owns a block table (list of block ids); its
token at position ``p`` lives in block ``block_ids[p // block_size]`` at offset
``p % block_size``. Preemption frees a request's blocks (vLLM's RECOMPUTE policy).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockPool:
    """Free list of block ids ``0 … num_blocks − 1``. Freed blocks go to the back (FIFO reuse)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks. Raises RuntimeError if fewer are free (callers check first)."""
        if n > len(self._free):
            raise RuntimeError(f"KV block pool exhausted: asked for {n}, {len(self._free)} free")
        return [self._free.popleft() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(blocks)


@dataclass(frozen=True)
class KVUsage:
    """Blocks in use and in total, and the used fraction (0..1)."""

    used: int
    total: int

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total else 0.0


class KVCacheManager:
    """Owns the per-layer KV tensors and the block tables.

    ``kv_caches[i]``: layer ``i``'s tensor ``[num_blocks + 1, 2, block_size, Hkv, D]`` of
    ``dtype`` on ``device`` (the last block is ``scratch_block``, outside the pool). Memory:
    ``2 · num_layers · (num_blocks + 1) · block_size · Hkv · D · itemsize`` bytes.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.pool = BlockPool(num_blocks)
        # One extra block outside the pool: padding rows of CUDA-graph batches and warm-up
        # steps write their K/V there, never into a request's pages.
        self.scratch_block = num_blocks
        shape = (num_blocks + 1, 2, block_size, num_kv_heads, head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def usage(self) -> KVUsage:
        return KVUsage(self.num_blocks - self.pool.num_free, self.num_blocks)

    def blocks_to_grow(self, req: Request, num_new_tokens: int) -> int:
        """Extra blocks ``req`` needs to hold ``num_new_tokens`` more tokens."""
        need = cdiv(req.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, need - len(req.block_ids))

    def tokens_that_fit(self, req: Request, reserve: int = 0) -> int:
        """How many new tokens ``req`` could take with the free blocks less ``reserve`` blocks."""
        free = max(0, self.pool.num_free - reserve)
        capacity = (len(req.block_ids) + free) * self.block_size
        return max(0, capacity - req.num_computed_tokens)

    def can_grow(self, req: Request, num_new_tokens: int, reserve: int = 0) -> bool:
        return self.blocks_to_grow(req, num_new_tokens) <= self.pool.num_free - reserve

    def grow(self, req: Request, num_new_tokens: int) -> None:
        """Allocate the blocks ``req`` needs for ``num_new_tokens`` more tokens."""
        n = self.blocks_to_grow(req, num_new_tokens)
        if n:
            req.block_ids.extend(self.pool.allocate(n))

    def free(self, req: Request) -> None:
        """Return all of ``req``'s blocks to the pool."""
        if req.block_ids:
            self.pool.free(req.block_ids)
            req.block_ids = []

    def page_table(self, reqs: list[Request], kv_lens: list[int]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """CSR page table for ``reqs`` with KV lengths ``kv_lens`` (tokens, after this step).

        Returns CPU int32 ``(kv_indptr [B+1], kv_indices [nnz], kv_last_page_len [B])`` with
        ``kv_last_page_len`` in ``1 … block_size`` (FlashInfer's convention).
        """
        bs = self.block_size
        indptr = [0]
        indices: list[int] = []
        last = []
        for req, n in zip(reqs, kv_lens):
            pages = cdiv(n, bs)
            indices.extend(req.block_ids[:pages])
            indptr.append(len(indices))
            last.append(n - (pages - 1) * bs)
        i32 = torch.int32
        return (torch.tensor(indptr, dtype=i32), torch.tensor(indices, dtype=i32),
                torch.tensor(last, dtype=i32))

    def slots(self, req: Request, start: int, n: int) -> list[int]:
        """Flat slots ``block * block_size + offset`` for positions ``[start, start + n)``."""
        bs = self.block_size
        ids = req.block_ids
        return [ids[p // bs] * bs + p % bs for p in range(start, start + n)]
