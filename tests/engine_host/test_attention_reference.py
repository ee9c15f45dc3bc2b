"""The reference attention against a row-by-row softmax written out here (float64)."""

from __future__ import annotations

import math

import torch

from gpuchef.engine_host.attention import AttentionMetadata, ReferenceAttention


def naive(q, k, v, kv_len):
    """Row i of a request with L query rows sees keys 0 .. kv_len - L + i (FlashInfer's causal
    rule, aligned to the end of the KV); a row that sees none is 0. q: [L, H, D]; k, v:
    [kv_len, H, D] (one KV head per query head). Plain Python loops, float64."""
    L, H, D = q.shape
    out = torch.zeros(L, H, D, dtype=torch.float64)
    for i in range(L):
        last = kv_len - L + i
        for h in range(H):
            s = [float(q[i, h] @ k[j, h]) / math.sqrt(D) for j in range(last + 1)]
            if not s:
                continue
            m = max(s)
            w = [math.exp(x - m) for x in s]
            for j, wj in enumerate(w):
                out[i, h] += wj / sum(w) * v[j, h]
    return out


def test_query_rows_without_keys_are_zero_and_the_rest_match():
    # request 0: 3 query rows over 2 keys (row 0 sees none); request 1: 4 rows over 6 keys
    bs, H, D = 4, 2, 8
    g = torch.Generator().manual_seed(0)
    kv = torch.zeros(4, 2, bs, H, D, dtype=torch.float64)
    qo, kvl = [3, 4], [2, 6]
    k = [torch.randn(n, H, D, generator=g, dtype=torch.float64) for n in kvl]
    v = [torch.randn(n, H, D, generator=g, dtype=torch.float64) for n in kvl]
    # request 0 in page 0; request 1 in pages 2, 3 (its first 2 tokens already cached)
    kv[0, 0, :2], kv[0, 1, :2] = k[0], v[0]
    kv[2, 0, :2], kv[2, 1, :2] = k[1][:2], v[1][:2]
    slots = [0, 1, 2] + [2 * bs + 2, 2 * bs + 3, 3 * bs, 3 * bs + 1]
    new_k = torch.cat([torch.cat([k[0], torch.zeros(1, H, D, dtype=torch.float64)]), k[1][2:]])
    new_v = torch.cat([torch.cat([v[0], torch.zeros(1, H, D, dtype=torch.float64)]), v[1][2:]])
    meta = AttentionMetadata(
        block_size=bs, qo_indptr=torch.tensor([0, 3, 7], dtype=torch.int32),
        kv_indptr=torch.tensor([0, 1, 3], dtype=torch.int32),
        kv_indices=torch.tensor([0, 2, 3], dtype=torch.int32),
        kv_last_page_len=torch.tensor([2, 2], dtype=torch.int32), kv_lens=kvl, qo_lens=qo,
        slot_mapping=torch.tensor(slots), positions=torch.tensor([0, 1, 2, 2, 3, 4, 5]),
        num_decodes=0)
    q = torch.randn(7, H, D, generator=g, dtype=torch.float64)
    attn = ReferenceAttention()
    attn.begin_step(meta)
    out = attn.forward(0, q, new_k, new_v, kv)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0], torch.zeros(H, D, dtype=torch.float64))
    torch.testing.assert_close(out[:3], naive(q[:3], k[0], v[0], 2))
    torch.testing.assert_close(out[3:], naive(q[3:], k[1], v[1], 6))
