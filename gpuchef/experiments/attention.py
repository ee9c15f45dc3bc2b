"""Attention alone, timed: FlashInfer (paged) vs PyTorch SDPA vs naive (`gpuchef bench-attention`,
gpuchef/commands/bench_attention.py, is its command).

Three cases, each a batch of ``--batch-size`` requests of ``--seq-len`` tokens of KV:

* ``prefill``: every request computes all its ``seq_len`` tokens (causal);
* ``decode``: every request adds one token over ``seq_len`` tokens of KV;
* ``mixed``: the first half of the requests decode, the second half append a chunk of
  ``--chunk-len`` tokens on ``seq_len − chunk_len`` cached ones (causal, aligned to the end of the
  KV, FlashInfer's rule).

Defaults: batch 16, seq 2048, 32 q and 32 kv heads, head_dim 128, bf16, chunks of 512. On a CPU
those shapes would take minutes and ~20 GB (the naive scores alone are 16·32·2048² elements),
so there the batch, sequence, chunk and iteration flags that were not given default to
``CPU_DEFAULTS``, and a case whose estimated memory exceeds what the machine has free is
skipped with its estimate.

FlashInfer reads a paged pool of ``--page-size`` tokens a page (pages shuffled, as in a
long-running server) through ``FlashInferAttention``, planned once outside the timing (plan is
once per step, not per layer; its CPU cost is reported apart). SDPA and naive read contiguous
``[B, H, L, D]`` tensors; naive materialises the scores (the Hugging Face eager recipe: matmul,
mask, float32 softmax, matmul).

Work counted per case, the same for every backend (useful work, not what a kernel does):

* bytes = element size × (Q read + O written: 2·Σqo·Hq·D, plus K and V read: 2·Σkv·Hkv·D);
* FLOPs = 4·D·Hq·(visible query–key pairs): QKᵀ and PV are 2 FLOPs per multiply-add each.
  Under the causal rule a chunk of ``qo`` rows over ``kv`` keys sees
  ``qo·(kv − qo) + qo·(qo + 1)/2`` pairs, so a full prefill counts about half of ``qo·kv``; a
  decode row sees all ``kv`` keys.

Ceilings default to what was measured on an H200 (docs/benchmarks.md): 4.3 TB/s
device-to-device copy, 790 TFLOP/s bf16 matmul. Times are medians over ``--iters`` runs timed
with CUDA events, L2 flushed before each (the method of ``triton.testing.do_bench``).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

CASES = ("prefill", "decode", "mixed")
BACKENDS = ("flashinfer", "sdpa", "naive")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# CPU-sized defaults for the flags not given: ~20 s and < 1 GB on 2 cores (naive prefill scores
# 4·32·512² elements); the GPU defaults would take ~20 GB there.
CPU_DEFAULTS = {"batch_size": 4, "seq_len": 512, "chunk_len": 128, "iters": 5}


@dataclass
class Result:
    """One (case, backend) measurement; times in ms, rates in TB/s and TFLOP/s."""

    case: str
    backend: str
    ms: float | None
    bytes: int
    flops: int
    tbps: float | None = None
    tflops: float | None = None
    frac_bw: float | None = None
    frac_flops: float | None = None
    speedup_vs_naive: float | None = None
    first_call_s: float | None = None
    rel_err_vs_sdpa: float | None = None
    error: str | None = None


@dataclass
class Case:
    """Requests of a case as ``(qo_len, kv_len)`` groups of equal shape, decodes first."""

    name: str
    groups: list[tuple[int, int, int]]  # (num_requests, qo_len, kv_len)
    notes: list[str] = field(default_factory=list)

    @property
    def reqs(self) -> list[tuple[int, int]]:
        return [(qo, kv) for n, qo, kv in self.groups for _ in range(n)]


def peak_bytes(case: Case, backend: str, hq: int, hkv: int, d: int, elt: int) -> int:
    """Estimated peak memory of one (case, backend) measurement, bytes: the case's Q, K, V (and
    the contiguous copies SDPA and naive make), plus for naive the largest group's materialised
    scores: ``n·Hq·qo·kv`` elements held as scores, masked scores and probabilities (``elt`` each)
    and the float32 softmax (4). A lower bound for FlashInfer's pool, which is about K and V."""
    io = sum(n * (qo * hq + 2 * kv * hkv) * d * elt for n, qo, kv in case.groups)
    if backend == "naive":
        scores = max(n * hq * qo * kv for n, qo, kv in case.groups) * (3 * elt + 4)
        expand = max(2 * n * kv * hq * d * elt for n, qo, kv in case.groups) if hq != hkv else 0
        return 2 * io + scores + expand
    return 2 * io


def visible_pairs(qo: int, kv: int) -> int:
    """Query–key pairs a chunk of ``qo`` rows at the end of ``kv`` keys sees (causal rule)."""
    return qo * (kv - qo) + qo * (qo + 1) // 2


def case_work(case: Case, hq: int, hkv: int, d: int, elt: int) -> tuple[int, int]:
    """(bytes, FLOPs) of a case, by the formulas in the module docstring."""
    sq = sum(qo for qo, _ in case.reqs)
    skv = sum(kv for _, kv in case.reqs)
    nbytes = elt * (2 * sq * hq * d + 2 * skv * hkv * d)
    flops = 4 * d * hq * sum(visible_pairs(qo, kv) for qo, kv in case.reqs)
    return nbytes, flops


def build_cases(names, batch: int, seq: int, chunk: int) -> list[Case]:
    out = []
    for name in names:
        if name == "prefill":
            out.append(Case(name, [(batch, seq, seq)]))
        elif name == "decode":
            out.append(Case(name, [(batch, 1, seq)]))
        else:
            nd = batch // 2
            groups = [(nd, 1, seq), (batch - nd, chunk, seq)]
            out.append(Case(name, [g for g in groups if g[0] > 0]))
    return out


# ---- timing --------------------------------------------------------------------------------

def _timer(torch, device, iters: int, warmup: int = 3):
    """Return ``time(fn) -> median ms`` for ``device`` (CUDA events + L2 flush, or wall clock)."""
    if device.type == "cuda":
        flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=device)

        def time_cuda(fn):
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize(device)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
            for s, e in zip(starts, ends):
                flush.zero_()  # cold L2, like triton.testing.do_bench
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize(device)
            return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
        return time_cuda

    def time_cpu(fn):
        for _ in range(min(warmup, 1)):
            fn()
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    return time_cpu


def _first_call(torch, device, fn) -> float:
    """Wall seconds of one call, synchronised (includes any JIT compile or load)."""
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


# ---- backends -------------------------------------------------------------------------------

def _make_data(torch, case: Case, hq, hkv, d, dtype, device, gen):
    """Per group: q [n, qo, Hq, D], k/v [n, kv, Hkv, D] (token-major, contiguous)."""
    data = []
    for n, qo, kv in case.groups:
        q = torch.randn(n, qo, hq, d, generator=gen, device=device, dtype=dtype)
        k = torch.randn(n, kv, hkv, d, generator=gen, device=device, dtype=dtype)
        v = torch.randn(n, kv, hkv, d, generator=gen, device=device, dtype=dtype)
        data.append((q, k, v))
    return data


def _sdpa_fn(torch, case, data, hq, hkv):
    """SDPA on contiguous [B, H, L, D]; chunks use a lower-right causal bias."""
    F = torch.nn.functional
    gqa = hq != hkv
    calls = []
    for (n, qo, kv), (q, k, v) in zip(case.groups, data):
        qt = q.transpose(1, 2).contiguous()
        kt = k.transpose(1, 2).contiguous()
        vt = v.transpose(1, 2).contiguous()
        kw = {}
        if qo == kv and qo > 1:
            kw["is_causal"] = True
        elif qo > 1:
            from torch.nn.attention.bias import causal_lower_right
            kw["attn_mask"] = causal_lower_right(qo, kv)
        calls.append((qt, kt, vt, kw))
    use_gqa = gqa
    if gqa:
        try:
            F.scaled_dot_product_attention(calls[0][0][:1, :, :1], calls[0][1][:1, :, :1],
                                           calls[0][2][:1, :, :1], enable_gqa=True)
        except TypeError:  # torch < 2.5: repeat the KV heads (inside the timing)
            use_gqa = False

    def run():
        outs = []
        for qt, kt, vt, kw in calls:
            if gqa and use_gqa:
                kw = dict(kw, enable_gqa=True)
            elif gqa:
                kt = kt.repeat_interleave(hq // hkv, dim=1)
                vt = vt.repeat_interleave(hq // hkv, dim=1)
            outs.append(F.scaled_dot_product_attention(qt, kt, vt, **kw))
        return outs
    return run


def _naive_fn(torch, case, data, hq, hkv, d):
    """Materialised scores: (Q Kᵀ)·scale, masked, float32 softmax, then P V."""
    scale = 1.0 / math.sqrt(d)
    calls = []
    for (n, qo, kv), (q, k, v) in zip(case.groups, data):
        qt = q.transpose(1, 2).contiguous()
        kt = k.transpose(1, 2).contiguous()
        vt = v.transpose(1, 2).contiguous()
        mask = None
        if qo > 1:
            rows = torch.arange(qo, device=q.device).unsqueeze(1)
            cols = torch.arange(kv, device=q.device).unsqueeze(0)
            mask = cols > (kv - qo) + rows  # True = hidden
        calls.append((qt, kt, vt, mask))
    group = hq // hkv

    def run():
        outs = []
        for qt, kt, vt, mask in calls:
            if group > 1:
                b, h, s, dd = kt.shape
                kt = kt[:, :, None].expand(b, h, group, s, dd).reshape(b, h * group, s, dd)
                vt = vt[:, :, None].expand(b, h, group, s, dd).reshape(b, h * group, s, dd)
            scores = torch.matmul(qt, kt.transpose(-1, -2)) * scale
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))
            p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(qt.dtype)
            outs.append(torch.matmul(p, vt))
        return outs
    return run


def _flashinfer_setup(torch, case, data, hq, hkv, d, dtype, device, page_size):
    """Fill a shuffled paged pool with the case's K/V; return (backend, run, plan)."""
    from gpuchef.engine_host.attention import AttentionMetadata, write_kv
    from gpuchef.engine_host.flashinfer_backend import FlashInferAttention

    reqs = case.reqs
    pages_per = [-(-kv // page_size) for _, kv in reqs]
    num_pages = sum(pages_per)
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(0))
    cache = torch.empty(num_pages, 2, page_size, hkv, d, dtype=dtype, device=device)
    qo_indptr, kv_indptr, last, all_slots, new_slots = [0], [0], [], [], []
    q_rows, k_rows, v_rows = [], [], []
    p = 0
    for (n, qo, kv), (q, k, v) in zip(case.groups, data):
        for r in range(n):
            pages = perm[p:p + -(-kv // page_size)]
            p += len(pages)
            slots = (pages.repeat_interleave(page_size) * page_size
                     + torch.arange(page_size).repeat(len(pages)))[:kv]
            all_slots.append(slots)
            new_slots.append(slots[kv - qo:])
            qo_indptr.append(qo_indptr[-1] + qo)
            kv_indptr.append(kv_indptr[-1] + len(pages))
            last.append((kv - 1) % page_size + 1)
            q_rows.append(q[r])
            k_rows.append(k[r])
            v_rows.append(v[r])
    write_kv(cache, torch.cat(k_rows), torch.cat(v_rows), torch.cat(all_slots).to(device))
    i32 = dict(dtype=torch.int32)
    meta = AttentionMetadata(
        block_size=page_size, qo_indptr=torch.tensor(qo_indptr, **i32),
        kv_indptr=torch.tensor(kv_indptr, **i32), kv_indices=perm.to(torch.int32),
        kv_last_page_len=torch.tensor(last, **i32), kv_lens=[kv for _, kv in reqs],
        qo_lens=[qo for qo, _ in reqs], slot_mapping=torch.cat(new_slots).to(device),
        positions=torch.zeros(qo_indptr[-1], dtype=torch.int64, device=device),
        num_decodes=_leading_decodes(reqs),
    )
    be = FlashInferAttention(device)
    be.configure(hq, hkv, d, dtype)
    qf = torch.cat(q_rows)
    out = torch.empty_like(qf)

    def plan():
        be.begin_step(meta)

    def run():
        return be.attend(qf, cache, out=out)
    return be, run, plan


def _leading_decodes(reqs) -> int:
    """How many requests at the front have one query row (FlashInfer's decode wrapper takes them)."""
    n = 0
    for qo, _ in reqs:
        if qo != 1:
            break
        n += 1
    return n


def _to_token_major(torch, outs):
    """SDPA/naive outputs [n, H, L, D] per group → [ΣL, H, D] in request order."""
    return torch.cat([o.transpose(1, 2).reshape(-1, o.shape[1], o.shape[3]) for o in outs])


def _free_bytes() -> int:
    """Memory this process may still take, bytes (psutil's ``available``: free + reclaimable)."""
    import psutil

    return int(psutil.virtual_memory().available)


def _measure(torch, case: Case, backend: str, data, dims: tuple, dev, page_size: int,
             time_fn: Callable, notes: list[str], outs: dict[str, Any]) -> Result:
    """One backend's run of ``case``: its first call, then the median time (``time_fn``);
    ``outs`` gets SDPA's and FlashInfer's outputs (token-major) for the error check. An
    exception is the result's ``error``, not a traceback."""
    hq, hkv, d, tdtype, elt = dims
    nbytes, flops = case_work(case, hq, hkv, d, elt)
    res = Result(case.name, backend, None, nbytes, flops)
    fn = plan = be = None
    try:
        if backend == "flashinfer":
            be, fn, plan = _flashinfer_setup(torch, case, data, hq, hkv, d, tdtype, dev,
                                             page_size)
            res.first_call_s = _first_call(torch, dev, lambda: (plan(), fn()))
            t0 = time.perf_counter()
            for _ in range(20):
                plan()
            plan_ms = (time.perf_counter() - t0) / 20 * 1e3
            notes.append(f"{case.name}: FlashInfer plan (CPU, once per step) "
                         f"{plan_ms:.3f} ms; first plan+run {res.first_call_s:.1f} s.")
            outs["flashinfer"] = fn().clone()
        else:
            make = _sdpa_fn if backend == "sdpa" else _naive_fn
            args = (torch, case, data, hq, hkv) + ((d,) if backend == "naive" else ())
            fn = make(*args)
            res.first_call_s = _first_call(torch, dev, fn)
            if backend == "sdpa":
                outs["sdpa"] = _to_token_major(torch, fn())
        res.ms = time_fn(fn)
    except torch.cuda.OutOfMemoryError:
        res.error = "out of memory"
    except Exception as e:  # keep the other columns; report, don't trace back
        res.error = f"{type(e).__name__}: {e}"[:120]
    finally:
        fn = plan = be = None  # noqa: F841  (free the pool and workspace before the next backend)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return res


def _rates(res: Result, dev, peak_tbps: float, peak_tflops: float) -> None:
    """The achieved TB/s and TFLOP/s of a timed result, and (CUDA) their share of the ceilings."""
    if res.ms:
        res.tbps = res.bytes / (res.ms * 1e-3) / 1e12
        res.tflops = res.flops / (res.ms * 1e-3) / 1e12
        if dev.type == "cuda":
            res.frac_bw = res.tbps / peak_tbps
            res.frac_flops = res.tflops / peak_tflops


def run_cases(torch, todo: list[Case], backends: list[str], dims: tuple, dev, page_size: int,
              time_fn: Callable, peak_tbps: float, peak_tflops: float, notes: list[str],
              say: Callable[[str], None], free: int | None = None) -> list[Result]:
    """Every backend on every case of ``todo``, in order; ``dims``: (Hq, Hkv, D, torch dtype,
    element size). ``free``: bytes this process may take (CPU): a backend whose estimate
    (:func:`peak_bytes`) exceeds it is skipped with the estimate. ``say(line)``: progress.
    Speed-up against naive and FlashInfer's error against SDPA are filled in per case."""
    hq, hkv, d, tdtype, elt = dims
    results: list[Result] = []
    runs, done = len(todo) * len(backends), 0
    for case in todo:
        need = {b: peak_bytes(case, b, hq, hkv, d, elt) for b in backends}
        gen = torch.Generator(device=dev).manual_seed(0)
        if free is not None and min(need.values()) > free:
            data = None  # not even the inputs fit
        else:
            data = _make_data(torch, case, hq, hkv, d, tdtype, dev, gen)
        outs: dict[str, Any] = {}
        case_results: dict[str, Result] = {}
        for backend in backends:
            done += 1
            if free is not None and need[backend] > free:
                nbytes, flops = case_work(case, hq, hkv, d, elt)
                res = Result(case.name, backend, None, nbytes, flops)
                res.error = (f"skipped: needs ~{need[backend] / 1e9:.1f} GB, "
                             f"{free / 1e9:.1f} GB free")
                say(f"{case.name}: {backend} ({done}/{runs}) {res.error}")
                case_results[backend] = res
                continue
            if backend == "flashinfer":
                say(f"{case.name}: FlashInfer ({done}/{runs}) plan + first run "
                    "(first use compiles kernels, can take minutes)…")
            else:
                say(f"{case.name}: {backend} ({done}/{runs})…")
            res = _measure(torch, case, backend, data, dims, dev, page_size, time_fn, notes, outs)
            _rates(res, dev, peak_tbps, peak_tflops)
            case_results[backend] = res
        if "flashinfer" in outs and "sdpa" in outs:
            ref = outs["sdpa"].float()
            case_results["flashinfer"].rel_err_vs_sdpa = (
                (outs["flashinfer"].float() - ref).norm() / ref.norm()).item()
        naive = case_results.get("naive")
        for res in case_results.values():
            if naive and naive.ms and res.ms:
                res.speedup_vs_naive = naive.ms / res.ms
            results.append(res)
        del data, outs
    return results
