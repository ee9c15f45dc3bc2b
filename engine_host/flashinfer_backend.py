"""FlashInfer attention over the paged KV pool (GPU only).

This module imports ``flashinfer`` at import time on purpose: ``attention_choice.make_backend`` imports it lazily
and turns an ImportError into a clear message, and nothing on the CPU path imports it.

One step, as the engine drives it::

    backend = FlashInferAttention(device)
    backend.configure(num_qo_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    backend.begin_step(meta)                  # plan once: decode rows + prefill chunks
    for layer in range(num_layers):
        o = backend.forward(layer, q, k, v, kv_cache[layer])   # append K/V, then attend

Decode rows (the first ``meta.num_decodes`` requests, one query row each) go through
``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)``; the prefill chunks after them
through ``BatchPrefillWithPagedKVCacheWrapper`` with ``causal=True`` (FlashInfer's causal rule is
aligned to the end of the KV, the same rule as ``ReferenceAttention``). Both wrappers share one
float workspace. Both are planned from the CPU int32 tensors of ``AttentionMetadata``, with
``q_data_type``/``kv_data_type`` set to the cache dtype (FlashInfer defaults to float16) and
``pos_encoding_mode="NONE"`` (the model applies RoPE itself).
Planning is host work, once per step, and does not wait for the GPU, so it overlaps the previous
step's kernels (its cost: docs/benchmarks.md, "Attention kernels"). That holds for the eager
wrappers; a CUDA-graph wrapper's plan copies CPU page indices into its device buffer with a
blocking copy, so under async scheduling the indices are handed over on the device
(``device_page_indices``, set by the engine).

CUDA graphs (decode-only steps; the capture itself belongs to the runner):

1. At start-up, for each padded batch size ``n`` to capture, call
   ``graph_decode_wrapper(n, max_pages, block_size)``: a decode wrapper built with
   ``use_cuda_graph=True`` and fixed device buffers for the page table (FlashInfer freezes the
   batch size of such a wrapper, hence one per size, as vLLM does), or for XQA
   (``decode_attention``) a fixed ``[n, max_pages_per_req]`` page table and KV lengths.
2. Keep ``q``, ``k``, ``v`` and ``meta.slot_mapping`` in static device tensors of ``n`` rows; pad a
   smaller decode batch up to ``n`` with dummy requests (e.g. kv_len 1 on a scratch page).
3. Each step: ``begin_step(meta)`` **outside** the graph (``plan`` copies the page table into the
   wrapper's fixed buffers; it must never run inside a graph), then copy the step's inputs into
   the static tensors and replay. ``begin_step`` picks the graph wrapper whenever the step is
   decode-only and a wrapper of exactly ``meta.num_decodes`` rows exists.
4. Capture once per size: ``begin_step(meta)`` with a padded meta, a warm-up ``forward``, then
   ``forward`` for every layer under ``torch.cuda.graph``. The K/V append's row indices are
   derived from ``meta.slot_mapping`` inside the first ``forward`` after ``begin_step``, so they are
   recorded in the graph and recomputed from the static ``slot_mapping`` on each replay.
"""

from __future__ import annotations

import math
import os

import flashinfer
import torch
from flashinfer.decode import xqa_batch_decode_with_kv_cache

from . import ops, rope_append
from .attention import (DECODE_ATTENTION, MIXED_ATTENTION, XQA_PAGE_SIZES, AttentionBackend,
                        AttentionMetadata, decode_split_kv_args, padded_block_table, write_kv)

#: Default float workspace: FlashInfer recommends 128 MiB; REFERENCE §4 shares 256 MiB between
#: the decode and prefill wrappers.
DEFAULT_WORKSPACE_BYTES = 256 * 1024 * 1024
#: XQA's own workspace (zeros at first use): its semaphores take the first 8 MiB
#: (``xqa_batch_decode_with_kv_cache``), the rest is its multi-block scratch. Not shared with the
#: wrappers' float workspace, whose contents they overwrite.
XQA_WORKSPACE_BYTES = 72 * 1024 * 1024


class FlashInferAttention(AttentionBackend):
    """FlashInfer paged attention: decode wrapper for decode rows, prefill wrapper for chunks.

    Args:
        device: a CUDA device (``torch.device`` or string).
        workspace_bytes: size of the float workspace shared by all wrappers, bytes
            (default 256 MiB, REFERENCE §4).
        kv_append: how ``forward`` writes this step's K/V into the pages: ``"flashinfer"``
            (default: ``flashinfer.append_paged_kv_cache``, one kernel per layer) or
            ``"scatter"`` (two ``index_copy_`` into a flat view of the pool). FlashInfer's is
            the default because it costs less GPU and host time a layer for a dearer index
            set-up once a step (the KV-append table under "Attention kernels" in
            docs/benchmarks.md), and it can be captured in a CUDA graph.
        mixed_attention: how a step holding both decode rows and prefill chunks attends:
            ``"split"`` (default: the decode wrapper for the decode rows, the prefill wrapper
            for the chunks, two kernels a layer) or ``"single"`` (the prefill wrapper over all
            rows, a decode row being a one-token causal chunk: one plan and one kernel a
            layer, as vLLM V1's FlashAttention backend runs a mixed batch). Decode-only and
            prefill-only steps are the same either way. Also settable on the instance
            between steps (``benchmarks/profile_decode.py --mixed-attention`` times both).
        decode_attention: the kernel for decode rows (``attention.DECODE_ATTENTION``):
            ``"flashinfer"`` (``BatchDecodeWithPagedKVCacheWrapper`` with tensor cores, planned
            per step), ``"xqa"`` (TensorRT-LLM's XQA decode kernel as FlashInfer ships it: no
            plan, a padded page table ``[B, max_pages]`` int32 and the KV lengths on the device)
            or ``"auto"`` (default: FlashInfer's wrapper; XQA's kernel alone is within ±5 % of
            it at batch 32-128, but the decode step through it measured 7 % slower on the
            H200). XQA takes page sizes ``XQA_PAGE_SIZES``, head dim ≤ 256, fp16/bf16. Prefill
            chunks always use the prefill wrapper. Fixed once CUDA graphs are captured.

    Raises:
        ValueError: ``device`` is not CUDA, or ``kv_append``, ``mixed_attention`` or
            ``decode_attention`` is unknown.

    Shapes: q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``, kv_cache ``[num_blocks, 2, block_size, Hkv, D]``
    (NHD), output ``[T, Hq, D]`` in q's dtype. Softmax scale ``1/sqrt(D)``.
    """

    name = "flashinfer"

    def __init__(self, device: torch.device | str,
                 workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                 kv_append: str = "flashinfer", mixed_attention: str = "split",
                 decode_attention: str = "auto") -> None:
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"FlashInferAttention needs a CUDA device, got {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if kv_append not in ("scatter", "flashinfer"):
            raise ValueError(f"kv_append must be 'scatter' or 'flashinfer', got {kv_append!r}")
        if mixed_attention not in MIXED_ATTENTION:
            raise ValueError(f"mixed_attention must be one of {', '.join(MIXED_ATTENTION)}, "
                             f"got {mixed_attention!r}")
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {', '.join(DECODE_ATTENTION)}, "
                             f"got {decode_attention!r}")
        self.device = dev
        self.mixed_attention = mixed_attention
        self.decode_attention = decode_attention
        self._sm_major = torch.cuda.get_device_capability(dev)[0]
        self._xqa_ws: torch.Tensor | None = None
        # XQA's CUDA-graph buffers per captured batch size: page table [n, W] int32 (W pages, the
        # most a request can hold) and KV lengths [n] int32; plan copies the step's into them
        self._xqa_graph: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._xqa_step: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self._decode_kernels: dict[int, str] = {}  # block size → kernel, once configured
        # Experiment (profile_decode.py): XQA with programmatic dependent launch off
        # (GPUCHEF_XQA_PDL=0); unset = FlashInfer's choice (on where the GPU supports it).
        pdl = os.environ.get("GPUCHEF_XQA_PDL")
        self.xqa_enable_pdl: bool | None = None if pdl in (None, "") else pdl != "0"
        self.decode_split_kv = decode_split_kv_args(os.environ.get("GPUCHEF_DECODE_SPLIT_KV"))
        self.kv_append = kv_append
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=dev)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=True)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self._graph_decode: dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}
        self._active_decode = self._decode
        # Set by the engine under async scheduling: a graph wrapper's plan copies CPU page indices
        # into its device buffer with a blocking copy (FlashInfer: non_blocking only for device
        # indices), which would make launching step N+1 wait for step N.
        self.device_page_indices = False
        # Model shape: set by configure() or, lazily, by the first forward() of a step.
        self.num_qo_heads: int | None = None
        self.num_kv_heads: int | None = None
        self.head_dim: int | None = None
        self.dtype: torch.dtype | None = None
        self.meta: AttentionMetadata | None = None
        self._planned = False
        self._num_decode_rows = 0
        self._kv_rows: torch.Tensor | None = None       # scatter path, per step
        self._kv_rows_v: torch.Tensor | None = None
        self._append_args: tuple | None = None           # flashinfer append path, per step
        self._arange: torch.Tensor | None = None         # static 0..N int32 for the append path
        self._retired: list[torch.Tensor] = []

    # ---- set-up -------------------------------------------------------------------------------

    def configure(self, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                  dtype: torch.dtype = torch.bfloat16) -> None:
        """Fix the attention shape once (the runner calls this at start-up).

        Without it, the first ``forward`` of the first step takes the shape from its tensors
        (q's heads and head_dim, the cache's KV heads and dtype) and plans then.
        ``dtype`` is the KV cache's dtype; FlashInfer runs q and the output in it too.

        Raises ValueError when ``num_qo_heads`` is not a multiple of ``num_kv_heads``.
        """
        if num_qo_heads % num_kv_heads:
            raise ValueError(f"num_qo_heads {num_qo_heads} is not a multiple of "
                             f"num_kv_heads {num_kv_heads}")
        self.num_qo_heads, self.num_kv_heads = int(num_qo_heads), int(num_kv_heads)
        self.head_dim, self.dtype = int(head_dim), dtype
        self._decode_kernels = {}  # the shape decides whether XQA applies

    @property
    def configured(self) -> bool:
        return self.dtype is not None

    def decode_kernel(self, block_size: int) -> str:
        """The kernel decode rows use with pages of ``block_size`` tokens: "flashinfer" or
        "xqa" (``decode_attention`` resolved: "auto" is FlashInfer's wrapper, which measured
        faster in the whole decode step on the H200 — docs/benchmarks.md, "Decode attention
        alone"). The first call for a page size with "xqa" after ``configure`` builds or loads
        XQA's module for the shape.

        Raises ValueError when ``decode_attention`` is "xqa" and XQA does not take this page
        size, head dim, dtype or GPU, or its module does not build.
        """
        if self.decode_attention != "xqa":
            return "flashinfer"
        got = self._decode_kernels.get(block_size)
        if got is not None:
            return got
        why = None
        if block_size not in XQA_PAGE_SIZES:
            why = f"block size {block_size} (XQA takes {', '.join(map(str, XQA_PAGE_SIZES))})"
        elif self._sm_major not in (9, 10, 12):
            why = f"compute capability {self._sm_major}.x (XQA runs on SM90, SM100, SM120)"
        elif not self.configured:
            return "xqa"  # the shape is checked once it is known
        elif self.head_dim > 256 or self.head_dim % 16:
            why = f"head dim {self.head_dim} (XQA takes multiples of 16 up to 256)"
        elif self.dtype not in (torch.float16, torch.bfloat16):
            why = f"KV dtype {self.dtype} (XQA takes float16, bfloat16)"
        else:
            why = self._load_xqa(block_size)
        if why:
            raise ValueError(f"decode_attention 'xqa' does not apply: {why}; use "
                             "'flashinfer' or 'auto'")
        got = self._decode_kernels[block_size] = "xqa"
        return got

    def _load_xqa(self, block_size: int) -> str | None:
        """Build or load XQA's module for this shape (a JIT compile on first use, minutes);
        None when it loads, else why not."""
        try:
            from flashinfer.xqa import get_xqa_module

            get_xqa_module(self.dtype, self.dtype, block_size, self.head_dim,
                           self.num_qo_heads // self.num_kv_heads, False, self.dtype, 1)
        except Exception as e:  # a build that fails must not take the engine down with it
            msg = str(e).strip().splitlines()
            return f"XQA's module did not build or load ({type(e).__name__}: " \
                   f"{msg[0][:200] if msg else ''})"
        return None

    def graph_decode_wrapper(self, batch_size: int, max_pages: int,
                             block_size: int | None = None, max_pages_per_req: int | None = None):
        """Return (creating once) what a CUDA graph of exactly ``batch_size`` decode rows reads.

        ``max_pages``: capacity of the fixed page-index buffer (int32 entries), i.e. the most
        pages that ``batch_size`` requests may hold together; ``max_pages_per_req`` the most one
        request may hold (default ``ceil(max_pages / batch_size)``). With ``block_size`` given
        and ``decode_kernel(block_size)`` "xqa": XQA's fixed page table ``[batch_size,
        max_pages_per_req]`` int32 and KV lengths ``[batch_size]`` int32 (a tuple); otherwise a
        decode wrapper built with ``use_cuda_graph=True``. While it exists, ``begin_step``
        plans it for decode-only steps of ``batch_size`` requests instead of the eager path. See
        the module docstring for the capture recipe.
        """
        xqa = (self.decode_kernel(block_size) == "xqa" if block_size is not None
               else self.decode_attention == "xqa")  # page size unknown: ready for both
        if xqa:
            e = self._xqa_graph.get(batch_size)
            if e is None:
                width = max_pages_per_req or -(-max_pages // batch_size)
                i32 = dict(dtype=torch.int32, device=self.device)
                e = (torch.zeros(batch_size, width, **i32), torch.ones(batch_size, **i32))
                self._xqa_graph[batch_size] = e
            if block_size is not None:
                return e
        w = self._graph_decode.get(batch_size)
        if w is None:
            i32 = dict(dtype=torch.int32, device=self.device)
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=torch.zeros(batch_size + 1, **i32),
                paged_kv_indices_buffer=torch.zeros(max_pages, **i32),
                paged_kv_last_page_len_buffer=torch.zeros(batch_size, **i32))
            self._graph_decode[batch_size] = w
        return w

    # ---- per step -----------------------------------------------------------------------------

    def begin_step(self, meta: AttentionMetadata) -> None:
        """Plan this step's decode and prefill wrappers (once; every layer reuses the plan).

        Index tensors are taken from ``meta`` as CPU int32 (device tensors are copied to the
        host, which blocks); with ``device_page_indices`` a CUDA-graph decode wrapper gets its
        page indices as a device tensor instead (async scheduling, see ``__init__``). Raises ValueError when a decode request has other than one query row.
        """
        self.meta = meta
        self._kv_rows = None
        self._append_args = None
        self._planned = False
        if self.configured:
            self._plan(meta)

    def _plan(self, meta: AttentionMetadata) -> None:
        qo = _host_i32(meta.qo_indptr)
        kvp = _host_i32(meta.kv_indptr)
        idx = _host_i32(meta.kv_indices)
        lpl = _host_i32(meta.kv_last_page_len)
        nd, nreq = meta.num_decodes, meta.num_reqs
        if int(qo[nd]) != nd:
            raise ValueError(f"the first {nd} requests are decodes but hold {int(qo[nd])} "
                             "query rows (one each expected)")
        common = dict(pos_encoding_mode="NONE", q_data_type=self.dtype,
                      kv_data_type=self.dtype)
        hq, hkv, d, ps = self.num_qo_heads, self.num_kv_heads, self.head_dim, meta.block_size
        self._active_decode = self._decode
        self._xqa_step = None
        if 0 < nd < nreq and self.mixed_attention == "single":
            # one causal prefill plan over every row: a decode row is a one-token chunk whose
            # causal window (aligned to the KV's end) is its whole KV
            self._prefill.plan(qo, kvp, idx, lpl, hq, hkv, d, ps, causal=True, **common)
            self._num_decode_rows = 0
            self._planned = True
            return
        if nd > 0 and self.decode_kernel(ps) == "xqa":
            self._plan_xqa(kvp, idx, meta.kv_lens, nd, ps, graph=nd == nreq)
        elif nd > 0:
            if nd == nreq and nd in self._graph_decode:
                self._active_decode = self._graph_decode[nd]
            p = int(kvp[nd])
            ind = idx[:p]
            if self.device_page_indices and self._active_decode is not self._decode:
                # pinned → device without waiting; the caching host allocator keeps the pinned
                # block until the copy has run
                ind = ind.pin_memory().to(self.device, non_blocking=True)
            self._active_decode.plan(kvp[:nd + 1], ind, lpl[:nd], hq, hkv, d, ps, **common,
                                     **self.decode_split_kv)
        if nd < nreq:
            # Prefill chunks are the tail of the batch: rebase their CSR arrays to 0.
            p0 = int(kvp[nd])
            self._prefill.plan(qo[nd:] - nd, kvp[nd:] - p0, idx[p0:], lpl[nd:], hq, hkv, d, ps,
                               causal=True, **common)
        self._num_decode_rows = nd
        self._planned = True

    def _plan_xqa(self, kvp: torch.Tensor, idx: torch.Tensor, kv_lens: list[int], nd: int,
                  ps: int, graph: bool) -> None:
        """XQA's inputs for the first ``nd`` requests: the CSR page table padded to a table
        ``[nd, W]`` and the KV lengths, copied to the device without waiting (pinned); into the
        CUDA-graph buffers of ``nd`` rows when they exist and ``graph``."""
        if self._xqa_ws is None:
            self._xqa_ws = torch.zeros(XQA_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        table = padded_block_table(kvp[:nd + 1].numpy(), idx.numpy())
        need = table.shape[1]
        table_h = torch.from_numpy(table).pin_memory()
        lens_h = torch.tensor(kv_lens[:nd], dtype=torch.int32).pin_memory()
        bufs = self._xqa_graph.get(nd) if graph else None
        if bufs is not None:
            tdev, ldev = bufs
            if need > tdev.shape[1]:
                raise ValueError(f"a decode request holds {need} pages; the CUDA-graph page "
                                 f"table holds {tdev.shape[1]} a request")
            # only the columns in use: the rest is never read (the kernel stops at each
            # request's KV length)
            tdev[:, :need].copy_(table_h, non_blocking=True)
            ldev.copy_(lens_h, non_blocking=True)
            self._xqa_step = (tdev, ldev, tdev.shape[1] * ps)
        else:
            self._xqa_step = (table_h.to(self.device, non_blocking=True),
                              lens_h.to(self.device, non_blocking=True), need * ps)

    # ---- per layer ----------------------------------------------------------------------------

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, out: torch.Tensor | None = None,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Append ``k``, ``v`` at ``meta.slot_mapping``, then attend (see the class docstring).

        ``out``: optional ``[T, Hq, D]`` tensor in the cache dtype to write into (``attend``).
        ``rope``: ``(positions, cos_sin_cache)`` for unrotated q and k: rotated and appended by
        one kernel (``rope_append.rope_append_kv``) where Triton and the dtypes allow, else
        ``ops.apply_rope`` then the append.
        Raises ValueError when the cache's page size differs from ``meta.block_size``.
        """
        meta = self.meta
        if kv_cache.shape[2] != meta.block_size:
            raise ValueError(f"kv_cache page size {kv_cache.shape[2]} != meta.block_size "
                             f"{meta.block_size}")
        if not self._planned:
            if not self.configured:
                self.configure(q.shape[1], kv_cache.shape[3], q.shape[2], kv_cache.dtype)
            self._plan(meta)
        if rope is not None:
            if rope_append.kernel_ok(q, k, v, kv_cache):
                q = rope_append.rope_append_kv(q, k, v, rope[0], rope[1], kv_cache,
                                               meta.slot_mapping)
                return self.attend(q, kv_cache, out=out)
            q, k = ops.apply_rope(q, k, *rope)
        self.append_kv(k, v, kv_cache)
        return self.attend(q, kv_cache, out=out)

    def append_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> None:
        """Write this step's K/V ``[T, Hkv, D]`` into the pages at ``meta.slot_mapping``.

        Same result as ``attention.write_kv``. The per-step index work is done by the first call
        after ``begin_step`` (on the device, from ``slot_mapping`` alone, so it can be captured in
        a CUDA graph) and reused by every layer.
        """
        meta = self.meta
        k = k.to(kv_cache.dtype)
        v = v.to(kv_cache.dtype)
        if self.kv_append == "flashinfer" and kv_cache.stride(-1) == 1:
            if self._append_args is None:
                self._append_args = self._slot_page_table(meta.slot_mapping, kv_cache.shape[2])
            flashinfer.append_paged_kv_cache(k, v, *self._append_args[:2], kv_cache,
                                             *self._append_args[2:], kv_layout="NHD")
            return
        if not kv_cache.is_contiguous():
            write_kv(kv_cache, k, v, meta.slot_mapping)
            return
        bs = kv_cache.shape[2]
        if self._kv_rows is None:
            # Row of slot s in the pool viewed as [num_blocks*2*bs, Hkv, D]:
            # block*2*bs + offset = s + block*bs. V sits bs rows further on.
            s = meta.slot_mapping
            self._kv_rows = s + torch.div(s, bs, rounding_mode="floor") * bs
            self._kv_rows_v = self._kv_rows + bs
        flat = kv_cache.view(-1, kv_cache.shape[3], kv_cache.shape[4])
        flat.index_copy_(0, self._kv_rows, k)
        flat.index_copy_(0, self._kv_rows_v, v)

    def _slot_page_table(self, slot_mapping: torch.Tensor, page_size: int) -> tuple:
        """``append_paged_kv_cache`` arguments that treat each new token as its own request.

        Token i becomes request i holding one page (its block ``slot // page_size``) at position
        ``slot % page_size``; so the kernel writes exactly where ``write_kv`` does, and nothing
        but ``slot_mapping`` has to reach the device (no host-to-device copy per step).
        Returns (batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len), int32.
        """
        T = slot_mapping.shape[0]
        if self._arange is None or self._arange.shape[0] < T + 1:
            if self._arange is not None:
                # A captured CUDA graph may still read the old buffer: keep it alive.
                self._retired.append(self._arange)
            self._arange = torch.arange(max(T + 1, 4096), dtype=torch.int32, device=self.device)
        s = slot_mapping.to(torch.int32)
        blk = torch.div(s, page_size, rounding_mode="floor")
        pos = s - blk * page_size
        return self._arange[:T], pos, blk, self._arange[:T + 1], pos + 1

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of ``q`` ``[T, Hq, D]`` over the pages as planned, without writing K/V.

        ``out``: optional ``[T, Hq, D]`` tensor in the cache dtype to write into. Returns the
        output in q's dtype (q is cast to the cache dtype for the kernels).
        Raises RuntimeError when called before a step is planned.
        """
        if not self._planned:
            raise RuntimeError("attend() before begin_step()/forward() planned this step")
        in_dtype = q.dtype
        if q.dtype != self.dtype:
            q = q.to(self.dtype)
        if not (ops.strided_qk() and q.stride(-1) == 1):
            q = q.contiguous()
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        nd = self._num_decode_rows
        T = q.shape[0]
        if nd > 0 and self._xqa_step is not None:
            table, lens, max_seq = self._xqa_step
            # XQA reads q and writes out as dense [B, 1, Hq, D]; it reads the lengths as uint32
            # through a raw pointer (xqa_wrapper.cu), which int32 lengths ≥ 1 equal bit for bit
            xqa_batch_decode_with_kv_cache(q[:nd].contiguous(), kv_cache, self._xqa_ws, table,
                                           lens, max_seq,
                                           bmm1_scale=1.0 / math.sqrt(self.head_dim),
                                           out=out[:nd], kv_layout="NHD",
                                           enable_pdl=self.xqa_enable_pdl)
        elif nd > 0:
            self._active_decode.run(q[:nd], kv_cache, out=out[:nd])
        if nd < T:
            self._prefill.run(q[nd:], kv_cache, out=out[nd:])
        return out if out.dtype == in_dtype else out.to(in_dtype)


def _host_i32(t: torch.Tensor) -> torch.Tensor:
    """The CPU int32 version of an index tensor (no copy when it already is one)."""
    if t.device.type != "cpu" or t.dtype != torch.int32:
        t = t.to("cpu", torch.int32)
    return t

