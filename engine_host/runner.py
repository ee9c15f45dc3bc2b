"""The model runner: turns a SchedulerOutput into one forward pass and the sampled tokens."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from . import ops, rope_append
from .attention import AttentionBackend, AttentionMetadata
from .vocab.config import PIECEWISE_CAPTURE_SIZES
from .decode_inputs import BlockTableCache, build_decode_inputs
from .kv_cache import KVCacheManager
from .request import Request
from .sampling import sample_tensor
from .scheduler import SchedulerOutput


@dataclass
class StepBatch:
    """Flat token-major inputs of one step (decodes first, then prefill chunks)."""

    input_ids: torch.Tensor  # int64 [T]
    meta: AttentionMetadata
    sample_rows: list[int]  # row of each request that samples this step
    sample_reqs: list[Request]
    pending_rows: list[int] = field(default_factory=list)  # decode rows whose input is pending


@dataclass(eq=False)
class StepHandle:
    """A launched step (``ModelRunner.launch``): what ``wait`` needs to hand back its tokens, and
    what the next launch needs to read this step's sampled tokens on the device.

    ``tokens``: int64 ``[S]`` on the device, row ``i`` sampled for ``sample_reqs[i]`` (None when
    the step samples nothing). On CUDA ``host_tokens`` is its pinned copy, made asynchronously;
    ``t1`` is recorded after that copy, so ``t1.synchronize()`` makes it readable.
    """

    sample_reqs: list[Request]
    used_graph: bool
    tokens: torch.Tensor | None = None
    host_tokens: torch.Tensor | None = None
    t0: Any = None  # CUDA events around the step's GPU work
    t1: Any = None
    c0: float = 0.0  # CPU: wall clock
    cpu_ms: float = 0.0
    inputs_ready: Any = None  # CUDA event after the step's input copies and attention plan
    _rows: dict | None = None

    def row_of(self, r: Request) -> int:
        """Row of ``r`` in ``tokens``. Raises KeyError if ``r`` does not sample in this step."""
        if self._rows is None:
            self._rows = {q: i for i, q in enumerate(self.sample_reqs)}
        return self._rows[r]


class ModelRunner:
    """Assembles the batch, runs the model over the paged KV cache, samples.

    ``model`` has ``forward(input_ids [T], positions [T], kv_caches, attn) -> [T, hidden]`` and
    ``compute_logits(hidden [S, hidden]) -> [S, vocab]``; for piecewise graphs also
    ``num_pieces`` and ``piece(j, ...)`` (``LlamaForCausalLM.piece``).

    A step runs through ``graphs`` (CudaGraphDecode) when it is decode-only and within its
    largest batch, else through ``piecewise`` (CudaGraphPiecewise) when its tokens are within
    its largest size, else eagerly; both are None on the CPU and with ``--enforce-eager``.
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
        self.piecewise: CudaGraphPiecewise | None = None
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

    def prepare(self, out: SchedulerOutput,
                into: tuple[torch.Tensor, torch.Tensor] | None = None) -> StepBatch:
        """Build the step's inputs and page table from the scheduled requests (CPU work).

        ``into``: static device buffers ``(input_ids, positions)`` (int64, ≥ T rows) to copy the
        step's token ids and positions into; the batch then holds views of their first T rows
        (the piecewise-graph path). Without it they are fresh device tensors."""
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
        pending: list[int] = []
        if ids and min(ids) < 0:  # async scheduling: tokens the step in flight samples
            pending = [j for j, t in enumerate(ids) if t < 0]
            if pending[-1] >= len(out.decodes):
                raise RuntimeError("a prefill row's input token is still pending")
            for j in pending:
                ids[j] = 0  # read on the device from the previous step's tokens
        kv_indptr, kv_indices, last_page_len = kv.page_table(reqs, kv_lens)
        dev = self.device
        if into is None:
            input_ids = torch.tensor(ids, dtype=torch.int64).to(dev, non_blocking=True)
            positions = torch.tensor(pos, dtype=torch.int64).to(dev, non_blocking=True)
        else:
            T = len(ids)
            input_ids = into[0][:T]
            input_ids.copy_(torch.tensor(ids, dtype=torch.int64), non_blocking=True)
            positions = into[1][:T]
            positions.copy_(torch.tensor(pos, dtype=torch.int64), non_blocking=True)
        meta = AttentionMetadata(
            block_size=kv.block_size,
            qo_indptr=torch.tensor(qo_indptr, dtype=torch.int32),
            kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len,
            kv_lens=kv_lens, qo_lens=qo_lens,
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            positions=positions, num_decodes=len(out.decodes),
        )
        return StepBatch(input_ids, meta, sample_rows, sample_reqs, pending)

    def execute(self, out: SchedulerOutput) -> tuple[list[tuple[Request, int]], float]:
        """Run one step. Returns ``([(request, sampled token)], forward ms)``.

        The forward time is measured with CUDA events on GPU, wall clock on CPU; it covers
        attention planning, the forward pass, the logits and sampling.
        """
        return self.wait(self.launch(out))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, prev: StepHandle | None = None) -> StepHandle:
        """Enqueue one step's GPU work without waiting for it (on CPU the work runs here).

        A decode row whose input token is still ``PLACEHOLDER_TOKEN`` (sampled by ``prev``, the
        step in flight) reads it on the device from ``prev.tokens``. Raises RuntimeError if
        such a row has no ``prev``, KeyError if ``prev`` did not sample that request.
        """
        if prev is not None and prev.inputs_ready is not None:
            # the host buffers prev's input copies and plan read from may be reused from here
            prev.inputs_ready.synchronize()
        if (self.graphs is not None and not out.prefills
                and len(out.decodes) <= self.graphs.max_batch_size):
            self.last_step_used_graph = True
            return self.graphs.launch(self, out, prev)
        if self.piecewise is not None and out.num_tokens <= self.piecewise.max_num_tokens:
            h = self.piecewise.launch(self, out, prev)
            self.last_step_used_graph = h.used_graph
            return h
        self.last_step_used_graph = False
        batch = self.prepare(out)
        h = StepHandle(batch.sample_reqs, used_graph=False)
        self.start_timing(h)
        self.attn.begin_step(batch.meta)
        if batch.pending_rows:
            self.gather_pending(batch.input_ids, batch.pending_rows, out.decodes, prev)
        self.mark_inputs_ready(h)
        hidden = self.model(batch.input_ids, batch.meta.positions, self.kv.kv_caches, self.attn)
        self.finish_launch(h, self.sample(batch, hidden))
        return h

    def sample(self, batch: StepBatch, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits of the rows that sample (``hidden`` [≥ T, hidden_size]) and their tokens:
        int64 [S] on the device, None when no row samples."""
        if not batch.sample_rows:
            return None
        # non_blocking: a blocking host→device copy would wait for the step in flight
        rows = torch.tensor(batch.sample_rows, dtype=torch.int64).to(self.device,
                                                                     non_blocking=True)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        return sample_tensor(logits, batch.sample_reqs, self.engine_seed)

    def wait(self, h: StepHandle) -> tuple[list[tuple[Request, int]], float]:
        """Block until ``h``'s step is done. Returns ``([(request, sampled token)], gpu ms)``."""
        if self.is_cuda:
            h.t1.synchronize()
            toks = h.host_tokens.tolist() if h.host_tokens is not None else []
            ms = h.t0.elapsed_time(h.t1)
        else:
            toks = h.tokens.tolist() if h.tokens is not None else []
            ms = h.cpu_ms
        return list(zip(h.sample_reqs, toks)), ms

    # -- launch helpers (shared with CudaGraphDecode) ------------------------------------------
    def start_timing(self, h: StepHandle) -> None:
        if self.is_cuda:
            h.t0 = torch.cuda.Event(enable_timing=True)
            h.t1 = torch.cuda.Event(enable_timing=True)
            h.t0.record()
        else:
            h.c0 = time.perf_counter()

    def mark_inputs_ready(self, h: StepHandle) -> None:
        if self.is_cuda:
            h.inputs_ready = torch.cuda.Event()
            h.inputs_ready.record()

    def gather_pending(self, input_ids: torch.Tensor, rows: list[int], reqs: list[Request],
                       prev: StepHandle | None) -> None:
        """``input_ids[rows[k]] = prev.tokens[row of reqs[rows[k]] in prev]``, on the device
        (stream-ordered after ``prev``'s sampling; the host does not wait)."""
        if prev is None or prev.tokens is None:
            raise RuntimeError("a decode input token is pending but no step is in flight")
        src = [prev.row_of(reqs[j]) for j in rows]
        idx = torch.tensor([rows, src], dtype=torch.int64).to(self.device, non_blocking=True)
        input_ids.index_copy_(0, idx[0], prev.tokens.index_select(0, idx[1]))

    def finish_launch(self, h: StepHandle, tokens: torch.Tensor | None) -> None:
        """Start the device→pinned-host copy of the sampled tokens and close the timing."""
        h.tokens = tokens
        if self.is_cuda:
            if tokens is not None:
                h.host_tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
                h.host_tokens.copy_(tokens, non_blocking=True)
            h.t1.record()
        else:
            h.cpu_ms = (time.perf_counter() - h.c0) * 1e3


#: Padded decode batch sizes to capture (vLLM captures 1, 2, 4, then multiples of 8).
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)



def _smallest_at_least(sizes: tuple[int, ...], n: int) -> int | None:
    """The smallest of the sorted ``sizes`` that is ≥ ``n`` (the padded size a graph replays),
    None when ``n`` is above them all; once per step, so a bisection."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None

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
                 progress: Callable[[str, int, int], None] | None = None,
                 pool: Any = None) -> None:
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
        # ``pool``: the memory pool shared with the piecewise graphs (one pool for all graphs;
        # their replays never overlap: one stream)
        self._capture(runner, progress, torch.cuda.graph_pool_handle() if pool is None else pool)

    @torch.inference_mode()
    def _capture(self, runner: ModelRunner, progress, pool) -> None:
        attn, model, kv = runner.attn, runner.model, runner.kv
        total = len(self.sizes)
        for i, n in enumerate(reversed(self.sizes)):  # largest first: smaller ones reuse its pool
            attn.graph_decode_wrapper(n, n * self.max_pages_per_req, block_size=kv.block_size,
                                      max_pages_per_req=self.max_pages_per_req)
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
        """The captured batch a decode batch of ``b`` rows replays: the smallest size ≥ b.
        Raises ValueError above the largest."""
        n = _smallest_at_least(self.sizes, b)
        if n is not None:
            return n
        raise ValueError(f"decode batch {b} exceeds the largest captured size {self.max_batch_size}")

    @torch.inference_mode()
    def launch(self, runner: ModelRunner, out: SchedulerOutput,
               prev: StepHandle | None = None) -> StepHandle:
        """Enqueue a decode-only step as a graph replay (see ``ModelRunner.launch``)."""
        kv = runner.kv
        bs = kv.block_size
        reqs = out.decodes
        B = len(reqs)
        n = self.padded_size(B)
        x = build_decode_inputs(reqs, n, bs, kv.scratch_block, self.block_tables)
        ids = x.input_ids.numpy()  # shares memory with x.input_ids
        pending: list[int] = []
        if B and ids[:B].min() < 0:  # async scheduling: tokens the step in flight samples
            pending = np.flatnonzero(ids[:B] < 0).tolist()
            ids[pending] = 0
        self.input_ids[:n].copy_(x.input_ids, non_blocking=True)
        self.positions[:n].copy_(x.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(x.slot_mapping, non_blocking=True)
        meta = AttentionMetadata(
            block_size=bs, qo_indptr=torch.arange(n + 1, dtype=torch.int32),
            kv_indptr=x.kv_indptr, kv_indices=x.kv_indices, kv_last_page_len=x.kv_last_page_len,
            kv_lens=x.kv_lens, qo_lens=[1] * n,
            slot_mapping=self.slot_mapping[:n], positions=self.positions[:n], num_decodes=n)
        h = StepHandle(list(reqs), used_graph=True)
        runner.start_timing(h)
        runner.attn.begin_step(meta)
        if pending:  # into the static buffer the graph reads, after the host copy above
            runner.gather_pending(self.input_ids, pending, reqs, prev)
        runner.mark_inputs_ready(h)
        g, hidden = self.graphs[n]
        g.replay()
        logits = runner.model.compute_logits(hidden[:B])
        runner.finish_launch(h, sample_tensor(logits, reqs, runner.engine_seed))
        return h


class CudaGraphPiecewise:
    """Steps of up to ``max_num_tokens`` tokens (prefill chunks, decode rows, both) run as vLLM
    V1's piecewise CUDA graphs: the forward split at attention (``model.piece``), each piece
    captured once per padded token count, attention run eagerly between the replays.

    A step of T tokens uses the pieces captured for the smallest size n ≥ T. All pieces read and
    write static buffers of ``max_num_tokens`` rows (token ids, positions, q/k/v, the residual
    stream, the attention output, the final hidden states), so the graphs of every size share
    them. Attention (FlashInfer's per-step plan in ``begin_step``, the K/V append and the
    kernels) runs on the first T rows only, so the n − T padding rows never reach the KV cache
    and, every other op being row-wise, never reach a real row; they are never sampled. Logits
    and sampling run eagerly on the sampling rows, as in ``CudaGraphDecode``.

    ``capture=False`` runs the pieces eagerly on the same buffers (the CPU path, used by the
    tests as the reference for the plumbing the graphs replay). Raises ValueError for an empty
    or non-positive ``sizes``.
    """

    def __init__(self, runner: ModelRunner, sizes: tuple[int, ...] = PIECEWISE_CAPTURE_SIZES,
                 capture: bool = True, progress: Callable[[str, int, int], None] | None = None,
                 pool: Any = None) -> None:
        sizes = tuple(sorted(set(int(n) for n in sizes)))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"piecewise capture sizes must be token counts ≥ 1, got {sizes!r}")
        self.sizes = sizes
        self.max_num_tokens = sizes[-1]
        model = runner.model
        cfg = model.config
        dev = runner.device
        dt = next(model.parameters()).dtype
        N = self.max_num_tokens
        self.num_pieces = model.num_pieces
        self.hq, self.d = cfg.num_attention_heads, cfg.head_dim
        # zeros: the padding rows read whatever a buffer holds, so it must be finite
        self.input_ids = torch.zeros(N, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(N, dtype=torch.int64, device=dev)
        self.q = torch.zeros(N, cfg.num_attention_heads, cfg.head_dim, dtype=dt, device=dev)
        self.k = torch.zeros(N, cfg.num_key_value_heads, cfg.head_dim, dtype=dt, device=dev)
        self.v = torch.zeros_like(self.k)
        self.residual = torch.zeros(N, cfg.hidden_size, dtype=dt, device=dev)
        # RoPE and the K/V append inside the pieces (ops.fused_rope_append(piecewise=True)):
        # the slot mapping and the step's token count in static buffers the graphs read; fixed
        # here, since the capture records one path. On CUDA only with the Triton kernel (its
        # fallback reads the token count on the host, which a graph cannot).
        self.fuse_append = ops.fused_rope_append(piecewise=True) and (
            dev.type != "cuda" or rope_append.available())
        self.slot_mapping = torch.zeros(N, dtype=torch.int64, device=dev)
        self.num_tokens = torch.zeros(1, dtype=torch.int64, device=dev)
        self.attn_out = torch.zeros(N, cfg.q_size, dtype=dt, device=dev)
        self.hidden = torch.zeros(N, cfg.hidden_size, dtype=dt, device=dev)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.graphed = bool(capture)
        # what the capture cost: seconds, and bytes the CUDA caching allocator reserved for it
        # (the pool's share of the graphs' memory; the static buffers above not included)
        self.capture_s = 0.0
        self.capture_bytes = 0
        if capture:
            self._capture(runner, progress, torch.cuda.graph_pool_handle() if pool is None
                          else pool)

    def padded_size(self, num_tokens: int) -> int:
        """The captured size a step of ``num_tokens`` tokens runs at: the smallest n ≥ it.
        Raises ValueError above ``max_num_tokens`` (such a step runs eagerly)."""
        n = _smallest_at_least(self.sizes, num_tokens)
        if n is not None:
            return n
        raise ValueError(f"a step of {num_tokens} tokens exceeds the largest piecewise size "
                         f"{self.max_num_tokens}")

    def run_piece(self, model: torch.nn.Module, j: int, n: int,
                  kv_caches: list[torch.Tensor] | None = None) -> None:
        """Piece ``j`` eagerly on the first ``n`` rows of the static buffers, its outputs copied
        into them (what a capture records). ``kv_caches``: the pages, when the pieces write
        K/V (``fuse_append``)."""
        last = j == self.num_pieces - 1
        fuse = self.fuse_append and not last
        kv_append = ((kv_caches, self.slot_mapping[:n], self.num_tokens, self.q[:n]) if fuse
                     else None)
        outs = model.piece(j, self.input_ids[:n], self.positions[:n], self.attn_out[:n],
                           self.residual[:n], kv_append=kv_append)
        dsts = ((self.hidden[:n],) if last else (self.q[:n], self.residual[:n]) if fuse else
                (self.q[:n], self.k[:n], self.v[:n], self.residual[:n]))
        for src, dst in zip(outs, dsts):
            # FlashInfer's fused norm updates the residual buffer in place: nothing to copy
            if src.data_ptr() != dst.data_ptr() or src.stride() != dst.stride():
                dst.copy_(src)

    @torch.inference_mode()
    def _capture(self, runner: ModelRunner, progress, pool) -> None:
        model = runner.model
        total = len(self.sizes)
        stage = (f"capture piecewise CUDA graphs ({self.num_pieces} pieces × "
                 f"{','.join(map(str, self.sizes))} tokens)")
        # torch.cuda.graph() empties the allocator's cache on entry: empty it first, so that
        # the delta is what the graphs' pool holds, not minus what was cached before
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        t0, reserved0 = time.perf_counter(), torch.cuda.memory_reserved()
        for i, n in enumerate(reversed(self.sizes)):  # largest first: smaller ones reuse its pool
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            # num_tokens stays 0 here: the warm-up's and the capture's rope + append write no
            # page (the slot buffer holds no step's slots yet)
            kvc = runner.kv.kv_caches
            with torch.cuda.stream(stream):  # warm-up outside the graph (cuBLAS, lazy tables)
                for j in range(self.num_pieces):
                    self.run_piece(model, j, n, kvc)
            torch.cuda.current_stream().wait_stream(stream)
            gs = []
            for j in range(self.num_pieces):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    self.run_piece(model, j, n, kvc)
                gs.append(g)
            self.graphs[n] = gs
            if progress:
                progress(stage, i + 1, total)
        torch.cuda.synchronize()
        self.capture_s = time.perf_counter() - t0
        self.capture_bytes = torch.cuda.memory_reserved() - reserved0

    def forward(self, model: torch.nn.Module, attn: AttentionBackend,
                kv_caches: list[torch.Tensor], num_tokens: int) -> torch.Tensor:
        """The forward of a step whose ``num_tokens`` token ids and positions are in the static
        buffers and whose attention ``begin_step`` has run: pieces (replayed, or eager without
        graphs) with attention between them. Returns a view of the final hidden states
        [num_tokens, hidden_size] in the static buffer (valid until the next step's pieces)."""
        T = num_tokens
        n = self.padded_size(T)
        gs = self.graphs.get(n) if self.graphed else None
        q, k, v = self.q[:T], self.k[:T], self.v[:T]
        o = self.attn_out[:T].view(T, self.hq, self.d)
        if self.fuse_append:  # what the pieces' rope + append kernels read at replay
            self.slot_mapping[:T].copy_(attn.meta.slot_mapping)
            self.num_tokens.fill_(T)
        for j in range(self.num_pieces):
            if j and self.fuse_append:
                attn.attend(q, kv_caches[j - 1], out=o)
            elif j:
                attn.forward(j - 1, q, k, v, kv_caches[j - 1], out=o)
            if gs is not None:
                gs[j].replay()
            else:
                self.run_piece(model, j, n, kv_caches)
        return self.hidden[:T]

    @torch.inference_mode()
    def launch(self, runner: ModelRunner, out: SchedulerOutput,
               prev: StepHandle | None = None) -> StepHandle:
        """Enqueue a step of ≤ ``max_num_tokens`` tokens through the pieces (see
        ``ModelRunner.launch``; a pending decode input is gathered into the static buffer)."""
        batch = runner.prepare(out, into=(self.input_ids, self.positions))
        h = StepHandle(batch.sample_reqs, used_graph=self.graphed)
        runner.start_timing(h)
        runner.attn.begin_step(batch.meta)  # FlashInfer's plan: host work, outside every graph
        if batch.pending_rows:
            runner.gather_pending(self.input_ids, batch.pending_rows, out.decodes, prev)
        runner.mark_inputs_ready(h)
        hidden = self.forward(runner.model, runner.attn, runner.kv.kv_caches,
                              batch.meta.num_tokens)
        runner.finish_launch(h, runner.sample(batch, hidden))
        return h
