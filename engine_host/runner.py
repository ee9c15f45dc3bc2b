"""The model runner: turns a SchedulerOutput into one forward pass and the sampled tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from .attention import AttentionBackend, AttentionMetadata
from .decode_inputs import BlockTableCache, build_decode_inputs
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
        self.graphs: CudaGraphDecode | None = None
        self.last_step_used_graph = False

    @property
    def cuda_graphs_enabled(self) -> bool:
        return self.graphs is not None

    def scratch_meta(self, num_reqs: int, qo_len: int, positions: torch.Tensor | None = None,
                     slot_mapping: torch.Tensor | None = None) -> AttentionMetadata:
        """Metadata for ``num_reqs`` dummy requests of ``qo_len`` new tokens each (≤ block size),
        all on the scratch block: for warm-up and CUDA-graph capture. Their K/V lands in the
        scratch block only."""
        bs = self.kv.block_size
        assert 1 <= qo_len <= bs
        sb = self.kv.scratch_block
        i32 = torch.int32
        T = num_reqs * qo_len
        if slot_mapping is None:
            slot_mapping = (sb * bs + torch.arange(qo_len).repeat(num_reqs)).to(self.device)
        if positions is None:
            positions = torch.arange(qo_len).repeat(num_reqs).to(self.device)
        return AttentionMetadata(
            block_size=bs,
            qo_indptr=torch.arange(0, T + 1, qo_len, dtype=i32),
            kv_indptr=torch.arange(num_reqs + 1, dtype=i32),
            kv_indices=torch.full((num_reqs,), sb, dtype=i32),
            kv_last_page_len=torch.full((num_reqs,), qo_len, dtype=i32),
            kv_lens=[qo_len] * num_reqs, qo_lens=[qo_len] * num_reqs,
            slot_mapping=slot_mapping, positions=positions,
            num_decodes=num_reqs if qo_len == 1 else 0)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Run one prefill and one decode on the scratch block, eagerly, so that JIT kernels
        (FlashInfer compiles on first use: minutes the first time) are built before load."""
        bs = self.kv.block_size
        for n, q in ((1, bs), (4, 1)):
            meta = self.scratch_meta(n, q)
            ids = torch.zeros(n * q, dtype=torch.int64, device=self.device)
            self.attn.begin_step(meta)
            h = self.model(ids, meta.positions, self.kv.kv_caches, self.attn)
            self.model.compute_logits(h[:1]).argmax(-1).tolist()

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
        if (self.graphs is not None and not out.prefills
                and len(out.decodes) <= self.graphs.max_batch_size):
            self.last_step_used_graph = True
            return self.graphs.execute(self, out)
        self.last_step_used_graph = False
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


#: Padded decode batch sizes to capture (vLLM captures 1, 2, 4, then multiples of 8).
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class CudaGraphDecode:
    """Decode-only steps replayed from CUDA graphs, one per padded batch size.

    A decode step of B requests runs the graph of the smallest captured size n ≥ B; the n − B
    padding rows decode a dummy token on the scratch block. Inputs go through static device
    buffers; attention is planned outside the graph (FlashInfer's ``plan`` copies the page table
    into the graph wrapper's fixed buffers, one wrapper per size, as vLLM does). Logits and
    sampling run eagerly on the B real rows.
    """

    def __init__(self, runner: ModelRunner, max_model_len: int,
                 sizes: tuple[int, ...] = GRAPH_BATCH_SIZES,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
        self.sizes = tuple(sorted(sizes))
        self.max_batch_size = self.sizes[-1]
        dev = runner.device
        n_max = self.max_batch_size
        self.input_ids = torch.zeros(n_max, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n_max, dtype=torch.int64, device=dev)
        bs = runner.kv.block_size
        self.slot_mapping = torch.full((n_max,), runner.kv.scratch_block * bs, dtype=torch.int64,
                                       device=dev)
        self.max_pages_per_req = -(-max_model_len // bs)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.block_tables = BlockTableCache()  # numpy block tables for build_decode_inputs
        self._capture(runner, progress)

    @torch.inference_mode()
    def _capture(self, runner: ModelRunner, progress) -> None:
        pool = torch.cuda.graph_pool_handle()
        attn, model, kv = runner.attn, runner.model, runner.kv
        total = len(self.sizes)
        for i, n in enumerate(reversed(self.sizes)):  # largest first: smaller ones reuse its pool
            attn.graph_decode_wrapper(n, n * self.max_pages_per_req)
            meta = runner.scratch_meta(n, 1, self.positions[:n], self.slot_mapping[:n])
            ids = self.input_ids[:n]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                attn.begin_step(meta)
                model(ids, meta.positions, kv.kv_caches, attn)  # warm-up outside the graph
            torch.cuda.current_stream().wait_stream(stream)
            attn.begin_step(meta)  # fresh per-step state: index set-up is recorded in the graph
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                hidden = model(ids, meta.positions, kv.kv_caches, attn)
            self.graphs[n] = (g, hidden)
            if progress:
                progress("capture CUDA graphs", i + 1, total)
        torch.cuda.synchronize()

    def padded_size(self, b: int) -> int:
        for n in self.sizes:
            if n >= b:
                return n
        raise ValueError(f"decode batch {b} exceeds the largest captured size {self.max_batch_size}")

    @torch.inference_mode()
    def execute(self, runner: ModelRunner, out: SchedulerOutput
                ) -> tuple[list[tuple[Request, int]], float]:
        kv = runner.kv
        bs = kv.block_size
        reqs = out.decodes
        B = len(reqs)
        n = self.padded_size(B)
        x = build_decode_inputs(reqs, n, bs, kv.scratch_block, self.block_tables)
        self.input_ids[:n].copy_(x.input_ids, non_blocking=True)
        self.positions[:n].copy_(x.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(x.slot_mapping, non_blocking=True)
        meta = AttentionMetadata(
            block_size=bs, qo_indptr=torch.arange(n + 1, dtype=torch.int32),
            kv_indptr=x.kv_indptr, kv_indices=x.kv_indices, kv_last_page_len=x.kv_last_page_len,
            kv_lens=x.kv_lens, qo_lens=[1] * n,
            slot_mapping=self.slot_mapping[:n], positions=self.positions[:n], num_decodes=n)
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        runner.attn.begin_step(meta)
        g, hidden = self.graphs[n]
        g.replay()
        logits = runner.model.compute_logits(hidden[:B])
        tokens = sample(logits, reqs, runner.engine_seed)
        t1.record()
        t1.synchronize()
        return list(zip(reqs, tokens)), t0.elapsed_time(t1)
