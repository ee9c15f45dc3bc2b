"""Decode attention alone, against the memory roofline, under the kernels FlashInfer 0.6 offers on
Hopper (issue 16 item 3: with the GEMMs at 74-93 % of 4.3 TB/s, session 9's decode step at batch
32 still spent ~2 ms a step outside them, most of it FlashInfer's decode attention, whose KV reads
ideally take 1.0 ms).

A decode step's attention: ``B`` requests, one query row each (``Hq`` heads), over ``kv_len``
tokens of paged KV (``Hkv`` heads, ``block_size`` tokens a page, pages scattered over the pool as
a running server leaves them). One pool per layer (``[num_blocks, 2, block_size, Hkv, D]``, the
engine's NHD layout; ``--kv-layout HND``: ``[num_blocks, 2, Hkv, block_size, D]``); the kernels
of ``--layers`` layers are captured in one CUDA graph and replayed, so launch gaps do not count
and every layer's KV comes from HBM (each is bigger than L2 at the batches measured). Kernels
(``--kernels``):

* ``fi_tc``: ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)`` in CUDA-graph mode,
  FlashInfer's FA2 tensor-core template with its split-KV plan: what the engine runs today;
* ``fi_tc_nosplit``: ``fi_tc`` planned with ``disable_split_kv=True`` (one CTA a request and
  head group, no merge kernel): what ``GPUCHEF_DECODE_SPLIT_KV=off`` sets in the engine (a fixed
  split, ``fixed_split_size``, is not CUDA-graph safe: its plan failed on the H200 in graph mode);
* ``fi_tc_fa3``: the same wrapper with ``backend="fa3"`` (FlashInfer's Hopper FA3 template);
* ``fi_cuda``: ``use_tensor_cores=False`` (FlashInfer's CUDA-core decode kernel);
* ``xqa``: ``flashinfer.decode.xqa_batch_decode_with_kv_cache`` (TensorRT-LLM's XQA decode
  kernel, what ``trtllm_batch_decode_with_kv_cache(backend="auto")`` picks on SM90): no plan, a
  page table ``[B, max_pages]`` and the KV lengths on the device;
* ``xqa_wide``: XQA with the page table as wide as ``--max-model-len`` allows (what a CUDA graph
  captured once for every step would hold), to see what the fixed width costs.

Printed per batch: µs per layer call, TB/s (KV + q + out bytes over time), % of ``--mem-bw``,
the time against ``fi_tc``, the host time to make the step's plan or page table, and the largest
difference from a float32 PyTorch reference over the first requests (``max err``). ``--json``
writes the same. ``--kv-dist uniform`` draws each request's KV length from
``[kv_len/2, 3 kv_len/2]`` instead of ``kv_len`` for all. No GPU: ``--device cpu`` runs the
reference alone, a dry run of the set-up (pages, lengths, the reference) whose times mean nothing.

Example (H200): python benchmarks/bench_decode_attention.py --model llama-3-8b --batches 32,64,128
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KERNELS = ("fi_tc", "fi_tc_nosplit", "fi_tc_fa3", "fi_cuda", "xqa", "xqa_wide")
#: XQA's semaphores take the first 8 MiB of its workspace (flashinfer.decode); the rest is the
#: multi-block scratch.
XQA_WORKSPACE_BYTES = 136 * 2**20


class Batch:
    """One decode batch's paged KV: per-layer pools and the page table in every form used.

    ``kv_lens`` [B] tokens (this step's included); pages of all requests are a random permutation
    of the pool's pages (block 0 stays free, as the engine's scratch block).
    """

    def __init__(self, kv_lens: list[int], block_size: int, hkv: int, hq: int, d: int,
                 layers: int, dtype: torch.dtype, device: torch.device, max_pages: int,
                 seed: int = 0, kv_layout: str = "NHD"):
        g = torch.Generator().manual_seed(seed)
        self.kv_lens, self.bs, self.hkv, self.hq, self.d = kv_lens, block_size, hkv, hq, d
        self.device, self.dtype, self.kv_layout = device, dtype, kv_layout
        pages = [-(-n // block_size) for n in kv_lens]
        total = sum(pages)
        perm = (torch.randperm(total, generator=g) + 1).to(torch.int32)
        self.indptr = torch.zeros(len(kv_lens) + 1, dtype=torch.int32)
        self.indptr[1:] = torch.cumsum(torch.tensor(pages, dtype=torch.int32), 0)
        self.indices = perm
        self.last_page_len = torch.tensor([n - (p - 1) * block_size for n, p in zip(kv_lens, pages)],
                                          dtype=torch.int32)
        from gpuchef.engine_host.attention import padded_block_table

        self.block_table = torch.from_numpy(padded_block_table(
            self.indptr.numpy(), perm.numpy(), width=max(max(pages), max_pages)))
        self.num_blocks = total + 1
        torch.manual_seed(seed)  # the pools are drawn on the device: GBs at batch 128
        page = (block_size, hkv) if kv_layout == "NHD" else (hkv, block_size)
        self.pools = [torch.randn(self.num_blocks, 2, *page, d, device=device,
                                  dtype=dtype) for _ in range(layers)]
        self.qs = [torch.randn(len(kv_lens), hq, d, device=device, dtype=dtype)
                   for _ in range(layers)]
        self.outs = [torch.empty_like(q) for q in self.qs]

    def bytes_per_call(self) -> int:
        item = torch.finfo(self.dtype).bits // 8
        kv = sum(self.kv_lens) * 2 * self.hkv * self.d * item
        return kv + 2 * len(self.kv_lens) * self.hq * self.d * item

    def reference(self, layer: int, rows: int) -> torch.Tensor:
        """float32 attention of the first ``rows`` requests of ``layer``: [rows, Hq, D]."""
        pool, q = self.pools[layer].float(), self.qs[layer].float()
        if self.kv_layout == "HND":  # [blocks, 2, Hkv, bs, D] → the NHD view
            pool = pool.transpose(2, 3)
        out = []
        for b in range(rows):
            pg = self.indices[int(self.indptr[b]):int(self.indptr[b + 1])].long()
            kv = pool[pg.to(pool.device)]                      # [p, 2, bs, Hkv, D]
            n = self.kv_lens[b]
            k = kv[:, 0].reshape(-1, self.hkv, self.d)[:n]      # [n, Hkv, D]
            v = kv[:, 1].reshape(-1, self.hkv, self.d)[:n]
            g = self.hq // self.hkv
            qb = q[b].view(self.hkv, g, self.d)                 # head h = kv head h // g
            s = torch.einsum("kgd,nkd->kgn", qb, k) / math.sqrt(self.d)
            o = torch.einsum("kgn,nkd->kgd", s.softmax(-1), v)
            out.append(o.reshape(self.hq, self.d))
        return torch.stack(out)


def make_kernel(name: str, batch: Batch, workspace: torch.Tensor, xqa_ws: torch.Tensor):
    """(host seconds to plan / build the page table, callable(layer) running one layer)."""
    import flashinfer
    from flashinfer.decode import xqa_batch_decode_with_kv_cache

    dev, B = batch.device, len(batch.kv_lens)
    if name.startswith("fi_"):
        kw = dict(use_tensor_cores=name != "fi_cuda")
        if name == "fi_tc_fa3":
            kw["backend"] = "fa3"
        i32 = dict(dtype=torch.int32, device=dev)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, batch.kv_layout, use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(B + 1, **i32),
            paged_kv_indices_buffer=torch.zeros(batch.indices.numel(), **i32),
            paged_kv_last_page_len_buffer=torch.zeros(B, **i32), **kw)
        split = {}
        if name == "fi_tc_nosplit":
            split["disable_split_kv"] = True
        t0 = time.perf_counter()
        w.plan(batch.indptr, batch.indices, batch.last_page_len, batch.hq, batch.hkv, batch.d,
               batch.bs, pos_encoding_mode="NONE", q_data_type=batch.dtype,
               kv_data_type=batch.dtype, **split)
        host = time.perf_counter() - t0

        def run(layer: int) -> None:
            w.run(batch.qs[layer], batch.pools[layer], out=batch.outs[layer])
        return host, run
    if name in ("xqa", "xqa_wide"):
        t0 = time.perf_counter()
        table = batch.block_table if name == "xqa_wide" else \
            batch.block_table[:, :int((batch.indptr[1:] - batch.indptr[:-1]).max())]
        table = table.contiguous().to(dev, non_blocking=True)
        # int32: XQA reads the lengths as uint32 through a raw pointer (xqa_wrapper.cu)
        lens = torch.tensor(batch.kv_lens, dtype=torch.int32).to(dev)
        host = time.perf_counter() - t0
        max_seq = table.shape[1] * batch.bs
        scale = 1.0 / math.sqrt(batch.d)

        def run(layer: int) -> None:
            xqa_batch_decode_with_kv_cache(batch.qs[layer], batch.pools[layer], xqa_ws, table,
                                           lens, max_seq, bmm1_scale=scale,
                                           out=batch.outs[layer], kv_layout=batch.kv_layout)
        return host, run
    raise ValueError(f"unknown kernel {name!r}: allowed {', '.join(KERNELS)}")


def time_graph(run, layers: int, iters: int) -> float:
    """µs per layer call: ``layers`` calls captured in one CUDA graph, replayed ``iters`` times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for layer in range(layers):   # warm-up outside capture (lazy init, smem attributes)
            run(layer)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for layer in range(layers):
            run(layer)
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(iters):
        g.replay()
    t1.record()
    t1.synchronize()
    return t0.elapsed_time(t1) * 1e3 / (iters * layers)


def kv_lengths(b: int, kv_len: int, dist: str, seed: int) -> list[int]:
    if dist == "fixed":
        return [kv_len] * b
    g = torch.Generator().manual_seed(seed)
    return torch.randint(max(1, kv_len // 2), kv_len * 3 // 2 + 1, (b,), generator=g).tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b", help="a preset (its attention shape)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", default="32,64,128", help="decode batch sizes")
    ap.add_argument("--kv-len", type=int, default=1024, help="KV tokens per request")
    ap.add_argument("--kv-dist", choices=("fixed", "uniform"), default="fixed")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
    ap.add_argument("--kv-layout", choices=("NHD", "HND"), default="NHD",
                    help="a page's layout: NHD [tokens, heads, D] (the engine's) or HND "
                         "[heads, tokens, D] (a head's tokens contiguous)")
    ap.add_argument("--max-model-len", type=int, default=8192,
                    help="xqa_wide's page-table width, tokens")
    ap.add_argument("--layers", type=int, default=32, help="layer calls per captured graph")
    ap.add_argument("--iters", type=int, default=20, help="graph replays timed")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--check-rows", type=int, default=4, help="requests checked against torch")
    ap.add_argument("--mem-bw", type=float, default=4.3e12, help="bytes/s ceiling")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from gpuchef.engine_host.vocab.presets import PRESETS, get_preset

    if a.model not in PRESETS:
        ap.error(f"--model {a.model!r} is not a preset: allowed {', '.join(PRESETS)}")
    kernels = [k.strip() for k in a.kernels.split(",") if k.strip()]
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        ap.error(f"--kernels {','.join(bad)}: allowed {','.join(KERNELS)}")
    try:
        batches = [int(x) for x in a.batches.split(",")]
        assert batches and all(x >= 1 for x in batches)
    except (ValueError, AssertionError):
        ap.error(f"--batches {a.batches!r} must be positive integers, e.g. 32,64")
    if a.block_size not in (16, 32, 64, 128):
        ap.error(f"--block-size {a.block_size}: allowed 16, 32, 64, 128 (XQA's page sizes)")
    if a.kv_len < 1 or a.layers < 1 or a.iters < 1:
        ap.error("--kv-len, --layers and --iters must be ≥ 1")
    cfg = get_preset(a.model)
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // hq
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"{a.model}: Hq {hq}, Hkv {hkv}, D {d}, {a.dtype}, block {a.block_size} {a.kv_layout}, KV {a.kv_len} "
          f"({a.kv_dist}), {a.layers} layers a graph, on {name}; % of {a.mem_bw / 1e12:.1f} TB/s")
    if cuda:
        workspace = torch.zeros(256 * 2**20, dtype=torch.uint8, device=device)
        xqa_ws = torch.zeros(XQA_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    else:
        kernels = []
        print("no CUDA: the reference alone (a dry run; times mean nothing)")
    rows_out: list[dict] = []
    for b in batches:
        lens = kv_lengths(b, a.kv_len, a.kv_dist, seed=b)
        layers = a.layers if cuda else 1
        batch = Batch(lens, a.block_size, hkv, hq, d, layers, dtype, device,
                      max_pages=a.max_model_len // a.block_size, seed=b,
                      kv_layout=a.kv_layout)
        nb = batch.bytes_per_call()
        ideal = nb / a.mem_bw * 1e6
        rows = min(a.check_rows, b)
        t0 = time.perf_counter()
        ref = batch.reference(0, rows)
        ref_s = time.perf_counter() - t0
        row = {"batch": b, "kv_lens_mean": sum(lens) / b, "bytes": nb, "ideal_us": ideal,
               "kernels": {}}
        print(f"\nbatch {b}: KV {sum(lens) / b:.0f} tokens/request on average, "
              f"{nb / 1e6:.1f} MB a layer, ideal {ideal:.1f} µs (torch reference of {rows} "
              f"rows {ref_s * 1e3:.1f} ms)")
        print(f"  {'kernel':10}{'µs':>9}{'TB/s':>7}{'% BW':>7}{'vs fi_tc':>9}{'host µs':>9}"
              f"{'max err':>9}")
        base = None
        for k in kernels:
            try:
                host, run = make_kernel(k, batch, workspace, xqa_ws)
                us = time_graph(run, layers, a.iters)
                torch.cuda.synchronize()
                err = (batch.outs[0][:rows].float() - ref).abs().max().item()
            except Exception as e:  # a kernel this build lacks: say so, go on with the rest
                print(f"  {k:10} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                row["kernels"][k] = {"error": f"{type(e).__name__}: {e}"[:400]}
                continue
            base = us if base is None else base
            bw = nb / (us * 1e-6)
            row["kernels"][k] = {"us": us, "tb_s": bw / 1e12, "pct_bw": 100 * bw / a.mem_bw,
                                 "host_us": host * 1e6, "max_err": err}
            print(f"  {k:10}{us:9.1f}{bw / 1e12:7.2f}{100 * bw / a.mem_bw:6.1f}%"
                  f"{us / base:8.2f}×{host * 1e6:9.0f}{err:9.4f}", flush=True)
        rows_out.append(row)
        del batch
        if cuda:
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"model": a.model, "dtype": a.dtype, "device": name, "block_size": a.block_size,
             "kv_layout": a.kv_layout,
             "kv_len": a.kv_len, "kv_dist": a.kv_dist, "layers": a.layers,
             "mem_bw": a.mem_bw, "torch": torch.__version__, "rows": rows_out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
