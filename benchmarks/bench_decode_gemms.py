"""The decode step's GEMMs alone, against the memory roofline, under the BLAS choices torch offers
(issue 16 item 3: session 8's profile put qkv at 72 % and o_proj at 59 % of 4.3 TB/s at batch 32,
o_proj as two kernels a layer — cuBLAS split-K — while gate_up reached 89 %).

For each projection of a preset (llama-3-8b: qkv 4096→6144, o 4096→4096, gate_up 4096→28672,
down 14336→4096, lm_head 4096→128256) and each row count M, ``x [M, in] @ W.T`` in the model dtype
is timed with CUDA events over ``--iters`` calls, cycling through enough copies of W that none is
in L2 when it is read (H200 L2: 50 MB). Variants:

* ``default``: ``torch.nn.functional.linear`` as the engine calls it (``W [out, in]``);
* ``no_reduced_reduction``: ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
  = False`` (and fp16's), which rules out split-K kernels that reduce in bf16;
* ``cublaslt``: ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
* ``w_in_out``: the weight stored ``[in, out]`` (``x @ W``), the other operand layout.

Prints µs per call, TB/s (weight + activation bytes over time) and % of ``--mem-bw``, and the
variant's time against ``default``. ``--json`` writes the same. No GPU: runs on the CPU with
``--device cpu`` as a dry run of the script (the numbers mean nothing there).

Example (H200): python benchmarks/bench_decode_gemms.py --model llama-3-8b --rows 1,32,64,128,256
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = ("default", "no_reduced_reduction", "cublaslt", "w_in_out")


def shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each decode projection of a HF config dict (a preset)."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "gate_up_proj": (h, 2 * i),
            "down_proj": (i, h), "lm_head": (h, cfg["vocab_size"])}


class _Blas:
    """Context: one variant's torch BLAS settings, restored on exit."""

    def __init__(self, variant: str):
        self.v = variant

    def __enter__(self):
        m = torch.backends.cuda.matmul
        self.saved = (m.allow_bf16_reduced_precision_reduction,
                      m.allow_fp16_reduced_precision_reduction)
        self.lib = None
        if self.v == "no_reduced_reduction":
            m.allow_bf16_reduced_precision_reduction = False
            m.allow_fp16_reduced_precision_reduction = False
        if self.v == "cublaslt" and torch.cuda.is_available():
            self.lib = torch.backends.cuda.preferred_blas_library()
            torch.backends.cuda.preferred_blas_library("cublaslt")
        return self

    def __exit__(self, *exc):
        m = torch.backends.cuda.matmul
        m.allow_bf16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction = \
            self.saved
        if self.lib is not None:
            torch.backends.cuda.preferred_blas_library(self.lib)


def time_gemm(k_in: int, n_out: int, m: int, variant: str, dtype, device, iters: int,
              l2_bytes: int) -> float:
    """Mean µs per call of one GEMM over ``iters`` calls, weights rotated so that
    each call reads its weight from HBM (copies enough to exceed ``l2_bytes`` twice)."""
    wbytes = k_in * n_out * torch.finfo(dtype).bits // 8
    copies = max(2, -(-2 * l2_bytes // wbytes)) if device.type == "cuda" else 1
    shape = (k_in, n_out) if variant == "w_in_out" else (n_out, k_in)
    ws = [torch.randn(shape, dtype=dtype, device=device) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k_in, dtype=dtype, device=device)
    if variant == "w_in_out":
        def call(w):
            return x @ w
    else:
        def call(w):
            return torch.nn.functional.linear(x, w)
    with _Blas(variant):
        for w in ws:  # warm-up: heuristics, workspaces
            call(w)
        if device.type == "cuda":
            torch.cuda.synchronize()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for j in range(iters):
                call(ws[j % copies])
            t1.record()
            t1.synchronize()
            return t0.elapsed_time(t1) * 1e3 / iters
        s = time.perf_counter()
        for j in range(iters):
            call(ws[j % copies])
        return (time.perf_counter() - s) * 1e6 / iters


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b", help="a preset (random-weight shapes)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", default="1,32,64,128,256", help="row counts M (decode batch)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--mem-bw", type=float, default=4.3e12, help="bytes/s ceiling")
    ap.add_argument("--l2-mb", type=float, default=50.0, help="L2 size the rotation defeats")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from gpuchef.engine_host.vocab.presets import PRESETS, get_preset

    if a.model not in PRESETS:
        ap.error(f"--model {a.model!r} is not a preset: allowed {', '.join(PRESETS)}")
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants {','.join(bad)}: allowed {','.join(VARIANTS)}")
    try:
        rows = [int(r) for r in a.rows.split(",")]
        assert rows and all(r >= 1 for r in rows)
    except (ValueError, AssertionError):
        ap.error(f"--rows {a.rows!r} must be positive integers, e.g. 1,32,64")
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    cfg = get_preset(a.model)
    item = torch.finfo(dtype).bits // 8
    out: list[dict] = []
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{a.model} {a.dtype} on {name}, torch {torch.__version__}; % of {a.mem_bw / 1e12:.1f} TB/s")
    print(f"{'proj':14}{'M':>5}" + "".join(f"{v:>24}" for v in variants))
    for proj, (k_in, n_out) in shapes(cfg).items():
        for m in rows:
            nbytes = (k_in * n_out + m * k_in + m * n_out) * item
            cells, row = [], {"proj": proj, "rows": m, "in": k_in, "out": n_out, "bytes": nbytes}
            base = None
            for v in variants:
                us = time_gemm(k_in, n_out, m, v, dtype, device, a.iters, int(a.l2_mb * 2**20))
                bw = nbytes / (us * 1e-6)
                base = us if base is None else base
                row[v] = {"us": us, "tb_s": bw / 1e12, "pct_bw": 100 * bw / a.mem_bw}
                cells.append(f"{us:9.1f} µs {100 * bw / a.mem_bw:5.1f}% {us / base:4.2f}×")
            print(f"{proj:14}{m:>5}" + "".join(f"{c:>24}" for c in cells), flush=True)
            out.append(row)
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "dtype": a.dtype, "device": name,
                                            "torch": torch.__version__, "mem_bw": a.mem_bw,
                                            "rows": out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
