"""Engine step times against the hardware's limits (issue 3's roofline figures).

Decode-only steps at several batch sizes (each request with ``--kv-len`` tokens of KV) against
the memory roofline ``(weight bytes + KV bytes read) / --mem-bw``; prefill steps of N new tokens
against ``--peak-tflops``; one mixed step (decodes + a prefill chunk filling the budget).

Each step is the engine's real step minus scheduling: ``ModelRunner.execute`` (batch assembly,
attention planning, forward, logits, sampling, synchronise), timed on the host around the call
(median of ``--iters``). Request state is set up directly (pages allocated, KV length set) so that
no prefill is needed to reach a KV length; step time does not depend on the KV values.

``--steady``: instead, the engine's whole step (``LLMEngine.step``: schedule, inputs, plan,
forward, sample, post-process) on B real requests decoding with ~``--kv-len`` tokens of KV, sync
vs ``--async-scheduling`` (step N+1 scheduled and launched while N runs): ms per step from the
StepRecords (t_end to t_end over ``--steady-steps`` decode-only steps), against the roofline.

Usage (H200): python benchmarks/bench_engine_step.py --model llama-3-8b [--enforce-eager]
              python benchmarks/bench_engine_step.py --model llama-3-8b --steady
        (CPU smoke test): python benchmarks/bench_engine_step.py --model tiny --device cpu
Ceilings default to the H200 figures measured in ../shared/gpu/README.md (4.3 TB/s, 790 TFLOP/s).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import statistics
import sys
import time

import torch

from gpuchef.engine_host import ops
from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.kv_cache import BlockPool, KVCacheManager, cdiv
from gpuchef.engine_host.request import Request, RequestStatus, SamplingParams
from gpuchef.engine_host.scheduler import SchedulerOutput


def make_req(eng: LLMEngine, i: int, kv_len: int, new_tokens: int,
             temperature: float = 0.0) -> Request:
    """A running request with ``kv_len`` tokens already in the cache and ``new_tokens`` to run:
    a decode (one sampled token fed back) when ``new_tokens`` is 1 and ``kv_len`` > 0, else a
    prefill chunk that ends its prompt (so the step samples one token for it)."""
    decode = new_tokens == 1 and kv_len > 0
    prompt = kv_len if decode else kv_len + new_tokens
    r = Request(f"b{i}", [11] * prompt,
                SamplingParams(max_tokens=1 << 20, ignore_eos=True, temperature=temperature), 0)
    if decode:
        r.output_token_ids = [12]
    r.prefill_target = prompt
    r.num_computed_tokens = kv_len
    r.status = RequestStatus.RUNNING
    r.block_ids = eng.kv.pool.allocate(cdiv(kv_len + new_tokens, eng.kv.block_size))
    return r


def time_step(eng: LLMEngine, out: SchedulerOutput, iters: int, warmup: int = 3) -> float:
    """Median wall ms of ``runner.execute(out)`` (it synchronises)."""
    for _ in range(warmup):
        eng.runner.execute(out)
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        eng.runner.execute(out)
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def steady_decode(eng: LLMEngine, b: int, kv_len: int, steps: int, async_on: bool,
                  temperature: float = 0.0) -> dict:
    """``b`` requests (prompt ``kv_len``) prefilled, then ``steps`` + 5 decode-only engine steps;
    returns ms/step (record t_end to t_end, the first 5 dropped) and the median GPU ms."""
    while eng.has_step_in_flight:
        eng.drain()
    eng.config.async_scheduling = async_on
    ids = [f"s{b}-{int(async_on)}-{i}" for i in range(b)]
    for i, rid in enumerate(ids):
        eng.add_request(rid, [11 + (i + j) % 1000 for j in range(kv_len)],
                        SamplingParams(max_tokens=steps + 40, ignore_eos=True,
                                       temperature=temperature))
    recs = []
    for _ in range(100 * (steps + 5) + 10 * b):
        rec = eng.step().record
        if rec is not None and rec.num_prefill_reqs == 0 and rec.num_decode_reqs == b:
            recs.append(rec)
            if len(recs) == steps + 5:
                break
    for rid in ids:
        eng.abort(rid)
    while eng.has_step_in_flight:
        eng.drain()
    recs = recs[5:]
    ms = (recs[-1].t_end_ns - recs[0].t_end_ns) / 1e6 / (len(recs) - 1)
    return dict(ms=ms, gpu_ms=statistics.median(r.gpu_ms for r in recs),
                graphs=all(r.cuda_graph for r in recs))


def per_proj_blas(model: torch.nn.Module, choice: dict[str, str], lib=None) -> None:
    """Forward hooks that set ``torch.backends.cuda.preferred_blas_library`` (``lib``) to
    ``choice[leaf]`` around each Linear whose name ends in a key of ``choice`` (and put it back
    after); the engine's warm-up and capture run after this, so the graphs hold the chosen
    kernels. The logits projection is not a module call (``compute_logits``): "lm_head" wraps
    that."""
    lib = lib or torch.backends.cuda.preferred_blas_library

    def around(fn, want):
        def call(*args, **kw):
            prev = lib()
            lib(want)
            try:
                return fn(*args, **kw)
            finally:
                lib(prev)
        return call

    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in choice and leaf != "lm_head":
            mod.forward = around(mod.forward, choice[leaf])
    if "lm_head" in choice:
        model.compute_logits = around(model.compute_logits, choice["lm_head"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--decode-batches", default="1,8,32,64,128,256")
    ap.add_argument("--kv-len", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16,
                    help="tokens per KV page (the engine's --block-size)")
    ap.add_argument("--prefill-lens", default="512,2048,8192")
    ap.add_argument("--mixed", default="64:2048", help="DECODES:BUDGET for the mixed step")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="every request's temperature (0: greedy; 1: sampled, what an OpenAI "
                         "request gets by default: the sampler's cost per row)")
    ap.add_argument("--mem-bw", type=float, default=4.3e12, help="bytes/s ceiling")
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--steady", action="store_true",
                    help="engine steps on real decoding requests, sync vs --async-scheduling")
    ap.add_argument("--steady-steps", type=int, default=50)
    ap.add_argument("--strided-qk", action="store_true",
                    help="experiment: q/k reach FlashInfer as strided views, not copies "
                         "(ops.use_strided_qk)")
    ap.add_argument("--rope-append", choices=ops.ROPE_APPEND, default=ops.rope_append_mode(),
                    help="RoPE and the K/V append in one Triton kernel, in every forward or "
                         "all but the piecewise one, or separate kernels (ops.set_rope_append; "
                         "default: GPUCHEF_ROPE_APPEND or fused)")
    ap.add_argument("--tunableop", default=None, metavar="CSV",
                    help="experiment: PyTorch TunableOp picks each GEMM's kernel during the "
                         "warm-up (before capture), results written to CSV")
    ap.add_argument("--blas", choices=("default", "cublas", "cublaslt"), default="default",
                    help="experiment: torch.backends.cuda.preferred_blas_library for the GEMMs")
    ap.add_argument("--blas-proj", default="", metavar="PROJ=LIB,...",
                    help="experiment: the BLAS library per projection (qkv_proj, o_proj, "
                         "gate_up_proj, down_proj, lm_head = cublas|cublaslt), set around each "
                         "call by forward hooks, so CUDA graphs capture the choice")
    a = ap.parse_args(argv)
    if a.blas != "default":
        torch.backends.cuda.preferred_blas_library(a.blas)
    try:
        blas_proj = dict(kv.split("=") for kv in a.blas_proj.split(",") if kv)
    except ValueError:
        ap.error(f"--blas-proj {a.blas_proj!r}: expected PROJ=LIB pairs, e.g. o_proj=cublaslt")
    bad = {k: v for k, v in blas_proj.items()
           if k not in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
           or v not in ("cublas", "cublaslt")}
    if bad:
        ap.error(f"--blas-proj: {bad}: projections qkv_proj, o_proj, gate_up_proj, down_proj, "
                 "lm_head; libraries cublas, cublaslt")
    ops.use_strided_qk(a.strided_qk)  # before the engine: its CUDA graphs capture the path
    ops.set_rope_append(a.rope_append)
    if a.tunableop:
        # torch.cuda.tunable: tuning happens on each GEMM shape's first call (the engine's
        # eager warm-up, before CUDA graphs capture); the file keeps the choices
        import torch.cuda.tunable as tunable
        tunable.enable(True)
        tunable.tuning_enable(True)
        tunable.set_filename(a.tunableop)
        tunable.set_max_tuning_duration(30)
    # a run stopped by `timeout` says where it was (the start-up once seemed to hang on the H200)
    faulthandler.register(signal.SIGTERM, all_threads=True)

    batches = [int(x) for x in a.decode_batches.split(",") if x]
    prefills = [int(x) for x in a.prefill_lens.split(",") if x]
    mix_dec, mix_budget = (int(x) for x in a.mixed.split(":"))
    bs = a.block_size
    t_start = time.perf_counter()

    def progress(stage: str, done: int, total: int) -> None:  # where start-up spends its time
        if done in (0, total):
            print(f"[{time.perf_counter() - t_start:7.1f} s] {stage}: {done}/{total}",
                  file=sys.stderr, flush=True)

    blocks = max(max(batches) * cdiv(a.kv_len + 1, bs), cdiv(max(prefills), bs),
                 mix_dec * cdiv(a.kv_len + 1, bs) + cdiv(mix_budget, bs)) + 64
    max_len = max(max(prefills), a.kv_len + 1)
    if a.steady:
        max_len = a.kv_len + a.steady_steps + 48
        blocks = max(batches) * cdiv(max_len, bs) + 64
    if blas_proj:  # hooks on the model as loaded, before the engine warms up and captures
        import gpuchef.engine_host.engine as engine_mod
        inner_load = engine_mod.load_model

        def load_model(*args, **kw):
            loaded = inner_load(*args, **kw)
            per_proj_blas(loaded.model, blas_proj)
            return loaded
        engine_mod.load_model = load_model
    eng = LLMEngine(EngineConfig(model=a.model, device=a.device, dtype=a.dtype,
                                 enforce_eager=a.enforce_eager,
                                 attention_backend=a.attention_backend,
                                 max_model_len=max_len,
                                 cache=CacheConfig(block_size=bs, num_gpu_blocks=blocks),
                                 scheduler=SchedulerConfig(mode="chunked",
                                                           max_num_batched_tokens=8192)),
                    progress=progress)
    mc = eng.model_config
    itemsize = torch.empty((), dtype=eng.dtype).element_size()
    weight_bytes = eng.loaded.weight_bytes
    kv_bytes_per_token = KVCacheManager.bytes_per_block(  # a block of one token
        mc.num_hidden_layers, 1, mc.num_key_value_heads, mc.head_dim, eng.dtype)
    layer_params = mc.layer_matmul_params  # every token goes through them (lm_head: samples only)
    lm_head_params = mc.hidden_size * mc.vocab_size
    graphs = getattr(eng.runner, "cuda_graphs_enabled", False)
    head = (f"{a.model} ({'random weights' if eng.loaded.random_weights else eng.loaded.source}), "
            f"{eng.dtype}, {eng.device}"
            f"{' (' + torch.cuda.get_device_name(eng.device) + ')' if eng.device.type == 'cuda' else ''}, "
            f"attention {eng.attn.name}, CUDA graphs {'on' if graphs else 'off'}"
            f"{', strided q/k' if a.strided_qk else ''}"
            f", RoPE + K/V append {a.rope_append}"
            f"{', TunableOp' if a.tunableop else ''}"
            f"{', BLAS ' + a.blas if a.blas != 'default' else ''}"
            f"{', BLAS per projection ' + a.blas_proj if a.blas_proj else ''}")
    print(head)
    rows = []

    def reset():
        eng.kv.pool = BlockPool(eng.kv.num_blocks)

    if a.steady:
        print(f"\n{'decode batch':>12} {'KV/req':>7} {'sync ms':>9} {'async ms':>9} "
              f"{'gpu ms':>8} {'roofline ms':>11} {'% roof sync':>11} {'% roof async':>12}")
        kv_mid = a.kv_len + a.steady_steps // 2 + 5
        for b in batches:
            res = {m: steady_decode(eng, b, a.kv_len, a.steady_steps, m, a.temperature) for m in (False, True)}
            s_, as_ = res[False], res[True]
            roof = (weight_bytes + b * kv_mid * kv_bytes_per_token) / a.mem_bw * 1e3
            rows.append(dict(kind="steady", batch=b, kv_len=kv_mid, sync_ms=s_["ms"],
                             async_ms=as_["ms"], gpu_ms=as_["gpu_ms"],
                             sync_gpu_ms=s_["gpu_ms"], roofline_ms=roof,
                             frac_sync=roof / s_["ms"], frac_async=roof / as_["ms"],
                             cuda_graph=as_["graphs"]))
            print(f"{b:>12} {kv_mid:>7} {s_['ms']:>9.3f} {as_['ms']:>9.3f} {as_['gpu_ms']:>8.3f} "
                  f"{roof:>11.3f} {100 * roof / s_['ms']:>10.1f}% {100 * roof / as_['ms']:>11.1f}%")
        write_json(a, head, rows)
        return 0

    print(f"\n{'decode batch':>12} {'KV/req':>7} {'step ms':>9} {'roofline ms':>11} {'% roofline':>10} {'tok/s':>10}")
    for b in batches:
        reset()
        reqs = [make_req(eng, i, a.kv_len, 1, a.temperature) for i in range(b)]
        ms = time_step(eng, SchedulerOutput(decodes=reqs), a.iters)
        bytes_read = weight_bytes + b * (a.kv_len + 1) * kv_bytes_per_token
        roof = bytes_read / a.mem_bw * 1e3
        rows.append(dict(kind="decode", batch=b, kv_len=a.kv_len, ms=ms, roofline_ms=roof,
                         frac=roof / ms))
        print(f"{b:>12} {a.kv_len:>7} {ms:>9.3f} {roof:>11.3f} {100 * roof / ms:>9.1f}% {b / ms * 1e3:>10.0f}")

    print(f"\n{'prefill tokens':>14} {'step ms':>9} {'TFLOP/s':>9} {'% peak':>7}")
    for n in prefills:
        reset()
        r = make_req(eng, 0, 0, n, a.temperature)
        ms = time_step(eng, SchedulerOutput(prefills=[(r, n)]), max(3, a.iters // 4))
        flops = (2 * n * layer_params + 2 * lm_head_params
                 + 4 * mc.num_hidden_layers * mc.num_attention_heads * mc.head_dim * n * n / 2)
        tf = flops / (ms * 1e-3) / 1e12
        rows.append(dict(kind="prefill", tokens=n, ms=ms, tflops=tf, frac=tf / a.peak_tflops))
        print(f"{n:>14} {ms:>9.3f} {tf:>9.1f} {100 * tf / a.peak_tflops:>6.1f}%")

    reset()
    decs = [make_req(eng, i, a.kv_len, 1, a.temperature) for i in range(mix_dec)]
    chunk = mix_budget - mix_dec
    p = make_req(eng, mix_dec, a.kv_len, chunk, a.temperature)
    ms = time_step(eng, SchedulerOutput(decodes=decs, prefills=[(p, chunk)]), a.iters)
    rows.append(dict(kind="mixed", decodes=mix_dec, chunk=chunk, chunk_kv=a.kv_len, ms=ms))
    print(f"\nmixed step: {mix_dec} decodes (KV {a.kv_len}) + a {chunk}-token chunk on {a.kv_len} "
          f"cached: {ms:.3f} ms")
    write_json(a, head, rows)
    return 0


def write_json(a: argparse.Namespace, head: str, rows: list[dict]) -> None:
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(header=head, rows=rows, args=vars(a)), f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
