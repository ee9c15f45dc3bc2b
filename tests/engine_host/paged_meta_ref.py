"""An independent builder of a step's paged-attention metadata, for tests that check the model
(HF logits, the piecewise split) without going through the runner's ``prepare``."""

from __future__ import annotations

import torch

from gpuchef.engine_host.attention import AttentionMetadata


def build_meta(reqs, block_size: int, device="cpu") -> AttentionMetadata:
    """reqs: list of (pages, start, n_new) — the request's page list, tokens already in the KV
    cache, and new tokens this step. Decode requests (n_new == 1 with start > 0) come first.
    The CSR page table (FlashInfer's layout), slots and positions of the step."""
    qo, kvp, idx, last, kv_lens, qo_lens, slots, pos = [0], [0], [], [], [], [], [], []
    num_decodes = 0
    for pages, start, n in reqs:
        kv_len = start + n
        npages = -(-kv_len // block_size)
        assert npages <= len(pages)
        qo.append(qo[-1] + n)
        kvp.append(kvp[-1] + npages)
        idx += pages[:npages]
        last.append(kv_len - (npages - 1) * block_size)
        kv_lens.append(kv_len)
        qo_lens.append(n)
        for p in range(start, kv_len):
            slots.append(pages[p // block_size] * block_size + p % block_size)
            pos.append(p)
        if n == 1 and start > 0 and num_decodes == len(qo_lens) - 1:
            num_decodes += 1
    i32 = dict(dtype=torch.int32)
    return AttentionMetadata(
        block_size=block_size, qo_indptr=torch.tensor(qo, **i32),
        kv_indptr=torch.tensor(kvp, **i32),
        kv_indices=torch.tensor(idx, **i32), kv_last_page_len=torch.tensor(last, **i32),
        kv_lens=kv_lens, qo_lens=qo_lens,
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=torch.tensor(pos, dtype=torch.int64, device=device), num_decodes=num_decodes)
