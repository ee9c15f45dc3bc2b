"""Token sampling: greedy, temperature, top-k, top-p, with a generator per request; stop ids
masked out for a request short of its ``min_tokens`` (vLLM's ``MinTokensLogitsProcessor``).

Each request draws from its own ``torch.Generator`` (seeded from its ``seed``, or from the
engine seed and its arrival order), so its samples do not depend on what it is batched with —
the property that lets scheduling never change results.
"""

from __future__ import annotations

import zlib

import torch

from .request import Request


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask ``logits`` [V] outside the top-k and outside the smallest set with mass ≥ top_p
    (the nucleus of Holtzman et al. 2020; vLLM keeps the token that crosses the threshold)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        cum = torch.cumsum(probs, dim=-1)
        drop = (cum - probs) > top_p  # mass before this token already exceeds top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, idx, sorted_logits)
    return logits


def mask_min_tokens(logits: torch.Tensor, reqs: list[Request]) -> None:
    """Set to -inf, in place, the logits of each stop id (``Request.min_tokens_stop_ids``) in
    the rows of the requests short of their ``min_tokens`` (``Request.needs_min_tokens_mask``),
    as vLLM's ``MinTokensLogitsProcessor`` does before any sampling. Nothing to do (no device
    work) when no row needs it; the indices go to the device without a host sync."""
    rows: list[int] = []
    cols: list[int] = []
    V = logits.shape[-1]
    for i, r in enumerate(reqs):
        if r.needs_min_tokens_mask():
            ids = [t for t in r.min_tokens_stop_ids if 0 <= t < V]
            rows += [i] * len(ids)
            cols += ids
    if rows:
        idx = torch.tensor([rows, cols], dtype=torch.int64).to(logits.device, non_blocking=True)
        logits.index_put_((idx[0], idx[1]),
                          torch.full((), float("-inf"), dtype=logits.dtype, device=logits.device))


def sample(logits: torch.Tensor, reqs: list[Request], engine_seed: int = 0) -> list[int]:
    """Pick one token per row.

    logits: [S, V] float32/float64, row ``i`` belongs to ``reqs[i]``. Returns S token ids (ints).
    Greedy rows use argmax (ties → lowest id, as torch.argmax).
    """
    return sample_tensor(logits, reqs, engine_seed).tolist()


def sample_tensor(logits: torch.Tensor, reqs: list[Request], engine_seed: int = 0) -> torch.Tensor:
    """``sample`` without leaving the device: int64 ``[S]`` on ``logits.device``.

    No host synchronisation (no ``.item()``): greedy rows are one argmax, each sampled row's
    multinomial draw is copied into its slot on the device. The same ops in the same order as
    the host path, so the same tokens (and the same generator state) come out.
    """
    mask_min_tokens(logits, reqs)
    out = logits.argmax(dim=-1)
    if all(r.sampling.greedy for r in reqs):
        return out
    for i, r in enumerate(reqs):
        sp = r.sampling
        if sp.greedy:
            continue
        if r.generator is None:
            g = torch.Generator(device=logits.device)
            seed = sp.seed if sp.seed is not None else zlib.crc32(f"{engine_seed}:{r.request_id}".encode())
            g.manual_seed(seed)
            r.generator = g
        row = _filter_top_k_top_p(logits[i] / sp.temperature, sp.top_k, sp.top_p)
        probs = torch.softmax(row.float(), dim=-1)
        out[i:i + 1] = torch.multinomial(probs, 1, generator=r.generator)
    return out
