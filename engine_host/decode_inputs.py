"""Host-side inputs of a padded decode step (the CUDA-graph path), built with numpy.

A decode step of ``B`` requests replayed from the graph captured for ``n ≥ B`` rows needs, per
row, the token to decode, its position, the KV slot it writes, and the paged-KV page table. The
straightforward per-request Python loop (``indices.extend(block_ids[:pages])`` then
``torch.tensor``) is host time that grows with the batch and the context, paid every decode
step (what it cost and what this saves: docs/benchmarks.md, "Engine step against the
roofline"); here each request's block table is kept as a cached int32 numpy array and the page
table is one ``np.concatenate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .request import Request


@dataclass
class DecodeInputs:
    """CPU inputs of one padded decode step of ``B`` requests in ``n`` rows (``n ≥ B``).

    Rows ``0 … B−1`` are the requests, rows ``B … n−1`` padding (token 0 at position 0, writing
    slot ``scratch_block · block_size``, one page: the scratch block, last page length 1).

    - ``input_ids``: int64 ``[n]``, the token each row decodes.
    - ``positions``: int64 ``[n]``, its position (the request's ``num_computed_tokens``).
    - ``slot_mapping``: int64 ``[n]``, flat KV slot ``block · block_size + offset`` it writes.
    - ``kv_indptr``: int32 ``[n + 1]``, CSR offsets into ``kv_indices``.
    - ``kv_indices``: int32 ``[Σ pages + (n − B)]``, row ``i``'s pages are its first
      ``positions[i] // block_size + 1`` block ids.
    - ``kv_last_page_len``: int32 ``[n]``, tokens in the row's last page (1 … block_size).
    - ``kv_lens``: ``n`` Python ints, the KV length after the step (``positions + 1``; 1 for
      padding rows).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_lens: list[int]


class BlockTableCache:
    """Per-request int32 numpy copies of ``Request.block_ids``.

    An entry is reused only while the request still holds *the same list object* (the entry
    keeps a reference to it, so its id cannot be recycled) with the same length and the same
    last block. ``KVCacheManager`` only ever appends to a block table (``grow``) or replaces it
    with a new list (``free`` on finish/preemption, then ``grow`` again), so any change is seen:
    growth changes the length, replacement the identity. Entries of requests absent from a batch
    are dropped once the cache holds more than twice the batch (plus a margin).
    """

    def __init__(self) -> None:
        self._d: dict[Request, tuple[list[int], int, int, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._d)

    def get(self, r: Request) -> np.ndarray:
        """The block table of ``r`` as a read-only int32 array (rebuilt if it changed)."""
        bl = r.block_ids
        nb = len(bl)
        e = self._d.get(r)
        if e is None or e[0] is not bl or e[1] != nb or (nb and e[2] != bl[-1]):
            arr = np.array(bl, dtype=np.int32)
            arr.flags.writeable = False
            e = (bl, nb, bl[-1] if nb else -1, arr)
            self._d[r] = e
        return e[3]

    def prune(self, keep: Sequence[Request]) -> None:
        if len(self._d) > 2 * len(keep) + 64:
            d = self._d
            self._d = {r: d[r] for r in keep if r in d}


def build_decode_inputs(reqs: Sequence[Request], n: int, block_size: int, scratch_block: int,
                        cache: BlockTableCache | None = None) -> DecodeInputs:
    """Inputs of a decode step of ``reqs`` (each decodes the token at its
    ``num_computed_tokens``) padded to ``n`` rows; see :class:`DecodeInputs` for shapes/dtypes.

    ``cache`` keeps block tables as numpy arrays across steps (a fresh one is used if None).
    Raises IndexError if a request's block table does not cover its position (as the list-based
    code did) and ValueError if ``n < len(reqs)``.
    """
    B = len(reqs)
    pad = n - B
    if pad < 0:
        raise ValueError(f"n={n} is smaller than the batch of {B} requests")
    if cache is None:
        cache = BlockTableCache()
    bs = block_size
    get = cache.get
    pos_l = [r.num_computed_tokens for r in reqs]
    ids_l = [r.token_slice(p, 1)[0] for r, p in zip(reqs, pos_l)]
    chunks = []
    append = chunks.append
    for r, p in zip(reqs, pos_l):
        arr = get(r)
        k = p // bs + 1
        if k > arr.shape[0] or p < 0:
            raise IndexError(f"request {r.request_id}: position {p} is outside its "
                             f"{arr.shape[0]} blocks of {bs}")
        append(arr[:k])
    cache.prune(reqs)
    append(np.full(pad, scratch_block, dtype=np.int32))
    indices = np.concatenate(chunks)

    pos = np.zeros(n, dtype=np.int64)
    pos[:B] = pos_l
    ids = np.zeros(n, dtype=np.int64)
    ids[:B] = ids_l
    off = pos % bs  # padding rows: 0
    indptr = np.empty(n + 1, dtype=np.int32)
    indptr[0] = 0
    np.cumsum(pos[:B] // bs + 1, out=indptr[1:B + 1])
    indptr[B + 1:] = indptr[B] + np.arange(1, pad + 1, dtype=np.int32)
    # Row i's slot is in its last page: indices[indptr[i + 1] − 1] (the scratch block for padding).
    slots = indices[indptr[1:] - 1].astype(np.int64) * bs + off
    last = (off + 1).astype(np.int32)
    kv_lens = (pos + 1).tolist()
    f = torch.from_numpy
    return DecodeInputs(input_ids=f(ids), positions=f(pos), slot_mapping=f(slots),
                        kv_indptr=f(indptr), kv_indices=f(indices), kv_last_page_len=f(last),
                        kv_lens=kv_lens)
