"""The model runner: turns a SchedulerOutput into one forward pass and the sampled tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .attention import AttentionBackend, AttentionMetadata
from .kv_cache import KVCacheManager
from .request import Request
from .sampling import sample
from .scheduler import SchedulerOutput


@dataclass
class StepBatch:
    """Flat token-major inputs of one step (decodes first, then prefill chunks)."""

    input_ids: torch.Tensor  # int64 [T]
    meta: AttentionMetadata
    sample_rows: list[int]  # row of each request that samples this step
    sample_reqs: list[Request]


class ModelRunner:
    """Assembles the batch, runs the model over the paged KV cache, samples.

    ``model`` has ``forward(input_ids [T], positions [T], kv_caches, attn) -> [T, hidden]`` and
    ``compute_logits(hidden [S, hidden]) -> [S, vocab]``.
    """

    def __init__(self, model: torch.nn.Module, kv: KVCacheManager, attn: AttentionBackend,
                 device: torch.device, engine_seed: int = 0) -> None:
        self.model = model
        self.kv = kv
        self.attn = attn
        self.device = device
        self.engine_seed = engine_seed
        self.is_cuda = device.type == "cuda"

    def prepare(self, out: SchedulerOutput) -> StepBatch:
        """Build the step's inputs and page table from the scheduled requests (CPU work)."""
        kv = self.kv
        reqs: list[Request] = []
        qo_lens: list[int] = []
        for r in out.decodes:
            reqs.append(r)
            qo_lens.append(1)
        for r, n in out.prefills:
            reqs.append(r)
            qo_lens.append(n)
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        kv_lens: list[int] = []
        qo_indptr = [0]
        sample_rows: list[int] = []
        sample_reqs: list[Request] = []
        for r, n in zip(reqs, qo_lens):
            start = r.num_computed_tokens
            ids.extend(r.token_slice(start, n))
            pos.extend(range(start, start + n))
            slots.extend(kv.slots(r, start, n))
            kv_lens.append(start + n)
            qo_indptr.append(qo_indptr[-1] + n)
            if start + n == r.num_tokens:  # caught up: this step samples its next token
                sample_rows.append(qo_indptr[-1] - 1)
                sample_reqs.append(r)
        kv_indptr, kv_indices, last_page_len = kv.page_table(reqs, kv_lens)
        dev = self.device
        meta = AttentionMetadata(
            block_size=kv.block_size,
            qo_indptr=torch.tensor(qo_indptr, dtype=torch.int32),
            kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len,
            kv_lens=kv_lens, qo_lens=qo_lens,
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.tensor(pos, dtype=torch.int64).to(dev, non_blocking=True),
            num_decodes=len(out.decodes),
        )
        input_ids = torch.tensor(ids, dtype=torch.int64).to(dev, non_blocking=True)
        return StepBatch(input_ids, meta, sample_rows, sample_reqs)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> tuple[list[tuple[Request, int]], float]:
        """Run one step. Returns ``([(request, sampled token)], forward ms)``.

        The forward time is measured with CUDA events on GPU, wall clock on CPU; it covers
        attention planning, the forward pass, the logits and sampling.
        """
        batch = self.prepare(out)
        if self.is_cuda:
            t0 = torch.cuda.Event(enable_timing=True)
            t1 = torch.cuda.Event(enable_timing=True)
            t0.record()
        else:
            c0 = time.perf_counter()
        self.attn.begin_step(batch.meta)
        hidden = self.model(batch.input_ids, batch.meta.positions, self.kv.kv_caches, self.attn)
        tokens: list[int] = []
        if batch.sample_rows:
            rows = torch.tensor(batch.sample_rows, dtype=torch.int64, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, rows))
            tokens = sample(logits, batch.sample_reqs, self.engine_seed)  # syncs on GPU
        if self.is_cuda:
            t1.record()
            t1.synchronize()
            ms = t0.elapsed_time(t1)
        else:
            ms = (time.perf_counter() - c0) * 1e3
        return list(zip(batch.sample_reqs, tokens)), ms
