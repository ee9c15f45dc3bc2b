"""Where a decode step's time goes: host vs graph replay vs logits, and GPU time per kernel kind
(and, with ``--mixed``, where a step carrying prefill tokens goes: issue 16's launch-bound
question).

For each decode batch (every request holding ``--kv-len`` tokens of KV, as in
``bench_engine_step.py``, whose helpers this reuses):

1. Step timing. The wall time of ``ModelRunner.execute`` (median, as bench_engine_step measures
   it), then the same step taken apart: host work (input building + H2D copies, FlashInfer
   ``plan``) with ``perf_counter``, and on the GPU, with CUDA events, the graph replay (or the
   eager forward), logits (row gather + lm_head + float cast) and sampling (argmax + the
   device-to-host copy and the sync's round trip).
2. Kernel profile (CUDA only). ``torch.profiler`` over a few steps run with CUDA graphs (kernels
   inside the replayed graph are traced by CUPTI) and the same steps run EAGER
   (``runner.graphs`` set to None). Every kernel gets a category: the model's modules are
   labelled with ``record_function`` through forward hooks, so a kernel launched inside
   ``qkv_proj`` is the qkv GEMM whatever cuBLAS names it; kernels the labels don't settle are
   classed by name (patterns in ``NAME_RULES``); graph kernels take the category of the eager
   kernel at the same position when the two sequences agree. Unknown kernels land in ``other``
   and the five costliest names are printed so the rules can be refined.
   Table: category, kernels/step, µs/step, % of the kernels' busy time, bytes that must move
   (weight matrices; KV read by attention; KV written by the append), achieved TB/s and % of
   ``--mem-bw``; then the kernels' busy time against the event-timed replay (the difference is
   the gaps between kernels inside the graph), and finally the ideal time per category at
   ``--mem-bw`` next to the measured one. Some builds' CUPTI traces no kernels inside graph
   replays (torch 2.11+cu130 on the H200): a graphed profile (full or piecewise) with (almost)
   no forward kernels (``graph_untraced``) says so once and the tables are the eager profile's,
   with no busy %, launch-bound verdict or ideal-vs-measured gap drawn from the empty set.

3. ``--mixed D+P,...`` (issue 16): steps of D decodes (each at ``--kv-len``) plus one prefill
   chunk of P fresh tokens, run eagerly and, when D + P is within the largest capture size,
   through the piecewise CUDA graphs (runner.CudaGraphPiecewise: the pieces between attention
   calls replayed, attention eager; docs/engine-graphs.md): for each, the wall time, the same
   phases, the forward's kernels busy time against its span (busy/span well under 1 = the GPU
   waits on the host: launch-bound, which graphs fix; near 1 = the kernels themselves),
   kernels per step, and the ideal time max(bytes read / ``--mem-bw``, linear FLOPs /
   ``--peak-tflops``); a last table puts eager and piecewise side by side. The decode batches
   also get a piecewise wall time (a decode-only step through the pieces instead of the full
   graph) for the question whether the full decode graph is still needed.
   ``--cudagraph-mode FULL_DECODE_ONLY`` leaves the piecewise column out;
   ``--cudagraph-capture-sizes`` sets its sizes.

Usage (H200): python benchmarks/profile_decode.py --model llama-3-8b --json OUT.json [--trace-dir DIR]
              python benchmarks/profile_decode.py --model llama-3-8b --batches 32 \
                  --mixed 0+16,0+128,0+512,0+2048,16+112,64+448,0+64,64+64 --json OUT.json
        (CPU smoke test): python benchmarks/profile_decode.py --model tiny --device cpu --batches 1,2 \
                  --mixed 0+16,4+32
On the CPU there are no graphs and no kernels: the "kernels" are the outermost aten ops under the
labels, timed on the CPU, so the bookkeeping is exercised; the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import signal
import statistics
import sys
import time
from contextlib import contextmanager

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_engine_step import make_req, time_step  # noqa: E402

from gpuchef.engine_host import ops  # noqa: E402
from gpuchef.engine_host.attention import AttentionMetadata  # noqa: E402
from gpuchef.engine_host.vocab.config import (CUDAGRAPH_MODES, PIECEWISE_CAPTURE_SIZES, CacheConfig,
                                              EngineConfig, parse_capture_sizes)
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.decode_inputs import build_decode_inputs  # noqa: E402
from gpuchef.engine_host.engine import LLMEngine  # noqa: E402
from gpuchef.engine_host.kv_cache import BlockPool, KVCacheManager, cdiv  # noqa: E402
from gpuchef.engine_host.runner import CudaGraphPiecewise  # noqa: E402
from gpuchef.engine_host.sampling import sample  # noqa: E402
from gpuchef.engine_host.scheduler import SchedulerOutput  # noqa: E402
from gpuchef.probes.gpu_time import (LINEARS, align_graph_to_eager, categorize,  # noqa: E402
                                     category_bytes, enqueue_note, graph_untraced, place_by_start,
                                     print_mixed, print_table, summarize)

P = "pd:"  # prefix of this script's record_function labels


# ----------------------------------------------------------------------------- the step, in parts


class Clock:
    """GPU timestamps with CUDA events, or wall time on the CPU (same interface)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


@contextmanager
def paths(eng: LLMEngine, graphs, piecewise):
    """Run with ``runner.graphs`` / ``runner.piecewise`` set to these (None = that path off),
    then put the engine's own back."""
    runner = eng.runner
    saved = runner.graphs, runner.piecewise
    runner.graphs, runner.piecewise = graphs, piecewise
    try:
        yield
    finally:
        runner.graphs, runner.piecewise = saved


@contextmanager
def label(name: str, on: bool):
    if on:
        with record_function(P + name):
            yield
    else:
        yield


@torch.inference_mode()
def phased_step(eng: LLMEngine, out: SchedulerOutput, labels: bool = False) -> dict[str, float]:
    """One step as ``ModelRunner.launch`` dispatches it (CudaGraphDecode for a decode-only step
    when ``runner.graphs`` is set, CudaGraphPiecewise for a step within ``runner.piecewise``'s
    largest size, else the eager branch), timed in parts. Returns ms per part."""
    runner = eng.runner
    gr = runner.graphs
    clock = Clock(runner.is_cuda)
    if out.prefills or (gr is not None and len(out.decodes) > gr.max_batch_size):
        gr = None  # no full graph covers it
    pw = runner.piecewise
    if gr is not None or (pw is not None and out.num_tokens > pw.max_num_tokens):
        pw = None
    reqs = out.decodes
    B = len(reqs)
    h0 = time.perf_counter()
    with label("inputs", labels):
        if gr is not None:
            kv = runner.kv
            n = gr.padded_size(B)
            x = build_decode_inputs(reqs, n, kv.block_size, kv.scratch_block, gr.block_tables)
            gr.input_ids[:n].copy_(x.input_ids, non_blocking=True)
            gr.positions[:n].copy_(x.positions, non_blocking=True)
            gr.slot_mapping[:n].copy_(x.slot_mapping, non_blocking=True)
            meta = AttentionMetadata(
                block_size=kv.block_size, qo_indptr=torch.arange(n + 1, dtype=torch.int32),
                kv_indptr=x.kv_indptr, kv_indices=x.kv_indices,
                kv_last_page_len=x.kv_last_page_len, kv_lens=x.kv_lens, qo_lens=[1] * n,
                slot_mapping=gr.slot_mapping[:n], positions=gr.positions[:n], num_decodes=n)
        else:
            batch = runner.prepare(out, into=None if pw is None else (pw.input_ids, pw.positions))
            meta = batch.meta
            reqs = batch.sample_reqs
    h1 = time.perf_counter()
    with label("plan", labels):
        runner.attn.begin_step(meta)
    h2 = time.perf_counter()
    e0 = clock.mark()
    hf0 = time.perf_counter()
    with label("forward", labels):
        if gr is not None:
            g, hidden = gr.graphs[n]
            g.replay()
            hidden = hidden[:B]
        elif pw is not None:  # the pieces replayed, attention eager between them
            hidden = pw.forward(runner.model, runner.attn, runner.kv.kv_caches, meta.num_tokens)
        else:
            hidden = runner.model(batch.input_ids, meta.positions, runner.kv.kv_caches, runner.attn)
    hf1 = time.perf_counter()
    e1 = clock.mark()
    with label("logits", labels):
        if gr is None:
            rows = torch.tensor(batch.sample_rows, dtype=torch.int64, device=runner.device)
            hidden = hidden.index_select(0, rows)
        logits = runner.model.compute_logits(hidden)
    e2 = clock.mark()
    with label("sample", labels):
        sample(logits, reqs, runner.engine_seed)  # .tolist(): syncs
    e3 = clock.mark()
    if runner.is_cuda:
        e3.synchronize()
    h3 = time.perf_counter()
    host = dict(host_forward_ms=(hf1 - hf0) * 1e3) if runner.is_cuda else {}
    return dict(wall_ms=(h3 - h0) * 1e3, host_inputs_ms=(h1 - h0) * 1e3,
                host_plan_ms=(h2 - h1) * 1e3, **host, gpu_forward_ms=clock.ms(e0, e1),
                gpu_logits_ms=clock.ms(e1, e2), gpu_sample_ms=clock.ms(e2, e3),
                gpu_total_ms=clock.ms(e0, e3))


def time_phases(eng: LLMEngine, out: SchedulerOutput, iters: int) -> dict[str, float]:
    for _ in range(3):
        phased_step(eng, out)
    runs = [phased_step(eng, out) for _ in range(iters)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


# ----------------------------------------------------------------------------- profiling


def add_module_labels(model: torch.nn.Module) -> list:
    """Forward hooks that wrap every named submodule's forward in ``record_function('pd:mod:NAME')``.
    Returns the hook handles (remove them when done)."""
    handles = []
    for name, mod in model.named_modules():
        if not name:
            continue
        tag = P + "mod:" + name

        def pre(m, args, tag=tag):
            rf = record_function(tag)
            rf.__enter__()
            m.__dict__.setdefault("_pd_rf", []).append(rf)

        def post(m, args, output):
            stack = m.__dict__.get("_pd_rf")
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    return handles


def _labels_of(ev) -> list[str]:
    out = []
    while ev is not None:
        if ev.name.startswith(P):
            out.append(ev.name[len(P):])
        ev = ev.cpu_parent
    return out


def kernel_records(prof, cuda: bool) -> list[dict]:
    """Kernels (CUDA) or outermost labelled aten ops (CPU) of a profile: name, start µs, µs,
    labels (innermost first). CUDA kernels are tied to the CPU op that launched them through the
    profiler's correlation ids."""
    evs = prof.events()
    recs: list[dict] = []
    if not cuda:
        for e in evs:
            if e.device_type != DeviceType.CPU or e.name.startswith(P):
                continue
            if e.cpu_parent is None or e.cpu_parent.name.startswith(P):
                labs = _labels_of(e)
                if labs:
                    recs.append(dict(name=e.name, start=e.time_range.start,
                                     us=e.time_range.elapsed_us(), labels=labs))
        return recs
    frontend = {}
    for e in evs:
        if (e.device_type == DeviceType.CPU and not e.is_async
                and getattr(e, "linked_correlation_id", 0) == 0):
            frontend.setdefault(e.id, e)
    dev = [e for e in evs if e.device_type == DeviceType.CUDA and not e.name.startswith(P)]
    if dev and hasattr(dev[0], "linked_correlation_id"):
        for e in dev:
            cpu = frontend.get(e.linked_correlation_id)
            recs.append(dict(name=e.name, start=e.time_range.start, us=e.time_range.elapsed_us(),
                             labels=_labels_of(cpu) if cpu is not None else []))
        return recs
    # older FunctionEvent without linked_correlation_id: read the raw kineto events
    for k in prof.profiler.kineto_results.events():
        if k.device_type() != DeviceType.CUDA or k.name().startswith(P):
            continue
        cpu = frontend.get(k.linked_correlation_id())
        recs.append(dict(name=k.name(), start=k.start_ns() / 1e3, us=k.duration_ns() / 1e3,
                         labels=_labels_of(cpu) if cpu is not None else []))
    return recs


def profile_steps(eng: LLMEngine, out: SchedulerOutput, iters: int, notes: list[str]
                  ) -> list[list[dict]]:
    """Profile ``iters`` phased steps (after warm-up). Returns per step its kernel records, sorted
    by start, each with a ``cat``; appends anything odd to ``notes``."""
    cuda = eng.runner.is_cuda
    for _ in range(2):
        phased_step(eng, out)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    handles = add_module_labels(eng.runner.model)
    try:
        with profile(activities=acts, record_shapes=False) as prof:
            for i in range(iters):
                with record_function(f"{P}step{i}"):
                    phased_step(eng, out, labels=True)
    finally:
        for h in handles:
            h.remove()
    steps: list[list[dict]] = [[] for _ in range(iters)]
    recs = kernel_records(prof, cuda)
    unlinked = []
    for r in recs:
        step = next((int(lab[4:]) for lab in r["labels"] if re.fullmatch(r"step\d+", lab)), None)
        r["cat"] = categorize(r["name"], r["labels"])
        (unlinked if step is None else steps[step]).append(r)
    if cuda and unlinked and len(unlinked) < len(recs):
        # Kernels launched outside any torch op (FlashInfer's TVM-FFI calls: attention, norms,
        # RoPE, the append) have no CPU op to tie them to; a phased step ends in a sync, so each
        # ran between its step's start and the next one's: place them by their GPU start.
        starts = sorted((e.time_range.start, int(e.name[len(P) + 4:])) for e in prof.events()
                        if e.device_type == DeviceType.CPU
                        and re.fullmatch(re.escape(P) + r"step\d+", e.name))
        placed, unlinked = place_by_start(unlinked, starts, steps)
        if placed:
            notes.append(f"{placed} kernels launched outside torch ops (FlashInfer's) placed in "
                         "their step by GPU start time, categorised by name")
    if recs and len(unlinked) == len(recs):
        # The profiler did not tie kernels to the CPU ops that launched them: pool them all (the
        # per-step means stay right; busy/span then cover every step and the gaps between them).
        steps = [unlinked] + [[] for _ in range(iters - 1)]
        notes.append(f"{len(recs)} kernels not tied to launching CPU ops: categories by name "
                     "only; busy/span cover all profiled steps")
    elif unlinked:
        notes.append(f"{len(unlinked)} of {len(recs)} kernels outside the labelled steps "
                     f"(ignored; {sum(r['us'] for r in unlinked):.0f} µs in all)")
    for s in steps:
        s.sort(key=lambda r: r["start"])
    return steps




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--kv-len", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16,
                    help="tokens per KV page (the engine's --block-size)")
    ap.add_argument("--iters", type=int, default=30, help="timed steps per batch")
    ap.add_argument("--prof-iters", type=int, default=5, help="profiled steps per batch and mode")
    ap.add_argument("--mem-bw", type=float, default=4.3e12, help="bytes/s ceiling")
    ap.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 matmul ceiling")
    ap.add_argument("--mixed", default="",
                    help="steps with prefill: D+P,... (D decodes at --kv-len + one P-token chunk)"
                         ", eager and through the piecewise graphs")
    ap.add_argument("--cudagraph-mode", default=CUDAGRAPH_MODES[0], choices=CUDAGRAPH_MODES,
                    help="FULL_DECODE_ONLY: no piecewise graphs (no piecewise column)")
    ap.add_argument("--cudagraph-capture-sizes", default=None, metavar="N,N,...",
                    help="the piecewise graphs' token counts (default: the engine's)")
    ap.add_argument("--mixed-attention", default="split", metavar="MODE,...",
                    help="how mixed steps attend (FlashInferAttention.mixed_attention: split, "
                         "single); with two, the piecewise timing is repeated with each and the "
                         "first is the one profiled")
    ap.add_argument("--decode-attention", default="auto",
                    help="the kernel for decode rows (EngineConfig.decode_attention: auto, "
                         "flashinfer, xqa); fixed for the run, since the graphs capture it")
    ap.add_argument("--json", default=None)
    ap.add_argument("--rope-append", choices=ops.ROPE_APPEND, default=ops.rope_append_mode(),
                    help="RoPE and the K/V append in one Triton kernel, in every forward or "
                         "all but the piecewise one, or separate kernels (ops.set_rope_append; "
                         "default: GPUCHEF_ROPE_APPEND or fused)")
    ap.add_argument("--trace-dir", default=None,
                    help="write one chrome trace per batch (one graph step + one eager step)")
    a = ap.parse_args(argv)
    ops.set_rope_append(a.rope_append)  # before the engine captures graphs
    # a run stopped by `timeout` says where it was
    try:
        faulthandler.register(signal.SIGTERM, all_threads=True)
    except (AttributeError, ValueError, RuntimeError):  # no SIGTERM / not the main thread
        pass
    t_start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", file=sys.stderr, flush=True)

    def progress(stage: str, done: int, total: int) -> None:
        if done in (0, total):
            say(f"{stage}: {done}/{total}")

    batches = [int(x) for x in a.batches.split(",") if x]
    try:
        mixed = [tuple(int(v) for v in x.split("+")) for x in a.mixed.split(",") if x]
        if any(len(m) != 2 or m[0] < 0 or m[1] < 1 for m in mixed):
            raise ValueError
    except ValueError:
        ap.error(f"--mixed {a.mixed!r}: expected D+P pairs (decodes ≥ 0, prefill tokens ≥ 1), "
                 "e.g. 0+128,16+112")
    from gpuchef.engine_host.attention import MIXED_ATTENTION
    mixed_modes = [m for m in a.mixed_attention.split(",") if m]
    bad = [m for m in mixed_modes if m not in MIXED_ATTENTION]
    if bad or not mixed_modes:
        ap.error(f"--mixed-attention {a.mixed_attention!r}: allowed {', '.join(MIXED_ATTENTION)}"
                 " (comma-separated)")
    bs = a.block_size
    blocks = max([*batches, *(d for d, _ in mixed), 1]) * cdiv(a.kv_len + 1, bs) + 64 \
        + max((cdiv(p, bs) for _, p in mixed), default=0)
    max_len = max([a.kv_len, *(p for _, p in mixed)]) + 1
    try:
        ecfg = EngineConfig(model=a.model, device=a.device, dtype=a.dtype,
                            attention_backend=a.attention_backend, max_model_len=max_len,
                            cache=CacheConfig(block_size=bs, num_gpu_blocks=blocks),
                            cudagraph_mode=a.cudagraph_mode, decode_attention=a.decode_attention,
                            cudagraph_capture_sizes=parse_capture_sizes(
                                a.cudagraph_capture_sizes))
    except ConfigError as e:
        ap.error(str(e))
    eng = LLMEngine(ecfg, progress=progress)
    mc = eng.model_config
    cuda = eng.runner.is_cuda
    itemsize = torch.empty((), dtype=eng.dtype).element_size()
    kv_per_token = KVCacheManager.bytes_per_block(  # a block of one token
        mc.num_hidden_layers, 1, mc.num_key_value_heads, mc.head_dim, eng.dtype)
    graphs = eng.runner.graphs
    pw = eng.runner.piecewise
    if pw is None and not cuda and a.cudagraph_mode == "FULL_AND_PIECEWISE":
        # the CPU captures nothing: run the pieces eagerly, padded, so that the piecewise
        # column's bookkeeping is exercised by the smoke test (its numbers mean nothing)
        pw = CudaGraphPiecewise(eng.runner, ecfg.cudagraph_capture_sizes
                                or PIECEWISE_CAPTURE_SIZES, capture=False)
    head = (f"{a.model} ({'random weights' if eng.loaded.random_weights else eng.loaded.source}), "
            f"{eng.dtype}, {eng.device}"
            f"{' (' + torch.cuda.get_device_name(eng.device) + ')' if cuda else ''}, "
            f"attention {eng.attn.name} (decode {eng.decode_attention}), fused ops {'on' if getattr(eng, 'fused_ops', False) else 'off'}, "
            f"CUDA graphs {'on' if graphs is not None else 'off'}"
            f"{', piecewise ' + ','.join(map(str, pw.sizes)) + ' tokens' if pw else ''}"
            f"{' (CPU: pieces run eagerly, padded)' if pw and not pw.graphed else ''}, "
            f"torch {torch.__version__}")
    print(head)
    if pw is not None and pw.graphed:
        print(f"piecewise capture: {pw.num_pieces} pieces × {len(pw.sizes)} sizes in "
              f"{pw.capture_s:.1f} s, {pw.capture_bytes / 2**20:.0f} MiB reserved by it")
    lin_bytes = sum(v for k, v in category_bytes(mc, itemsize, 0, 0).items() if k in LINEARS
                    or k == "lm_head")
    print(f"weights {eng.loaded.weight_bytes / 1e9:.2f} GB, of which a decode step reads "
          f"{lin_bytes / 1e9:.2f} GB (linears + lm_head; the embedding table only B rows); "
          f"KV {kv_per_token * (a.kv_len + 1) / 1e6:.1f} MB per request at KV {a.kv_len}")
    if not cuda:
        print("CPU run: no CUDA graphs or kernels; the 'kernels' below are aten ops timed on the "
              "CPU (smoke test of the bookkeeping only)")
    if a.trace_dir:
        os.makedirs(a.trace_dir, exist_ok=True)
    # All timing first, all profiling after: a profiler session can leave CUPTI attached and
    # slow later launches down.
    def decode_batch(b: int) -> SchedulerOutput:
        eng.kv.pool = BlockPool(eng.kv.num_blocks)
        return SchedulerOutput(decodes=[make_req(eng, i, a.kv_len, 1) for i in range(b)])

    results = []
    said: set = set()  # notes a run gives once
    # The decode section compares the full decode graph with eager: the piecewise path is off
    # there but for its own wall time.
    eng.runner.piecewise = None
    for b in batches:
        out = decode_batch(b)
        say(f"batch {b}: timing")
        wall = time_step(eng, out, a.iters)
        phases = time_phases(eng, out, a.iters)
        eager_phases = pw_wall = None
        if graphs is not None:
            with paths(eng, None, None):
                eager_phases = time_phases(eng, out, max(5, a.iters // 3))
        if pw is not None and b <= pw.max_num_tokens:
            with paths(eng, None, pw):
                pw_wall = time_step(eng, out, a.iters)
        roof = (eng.loaded.weight_bytes + b * (a.kv_len + 1) * kv_per_token) / a.mem_bw * 1e3
        byt = category_bytes(mc, itemsize, b, a.kv_len)
        results.append(dict(batch=b, kv_len=a.kv_len, wall_ms=wall, roofline_ms=roof,
                            roofline_read_ms=(lin_bytes + byt["attention"]) / a.mem_bw * 1e3,
                            phases=phases, eager_phases=eager_phases, bytes=byt,
                            graph_profile=None, eager_profile=None, graph_alignment=None,
                            cuda_graphs=graphs is not None, piecewise_wall_ms=pw_wall))
    for res in results:
        b, wall, roof, phases = res["batch"], res["wall_ms"], res["roofline_ms"], res["phases"]
        out = decode_batch(b)
        say(f"batch {b}: profiling")
        graph_steps = None
        if graphs is not None and b <= graphs.max_batch_size:
            graph_notes: list[str] = []
            graph_steps = profile_steps(eng, out, a.prof_iters, graph_notes)
        eng.runner.graphs = None
        try:
            eager_notes: list[str] = []
            eager_steps = profile_steps(eng, out, a.prof_iters, eager_notes)
        finally:
            eng.runner.graphs = graphs
        if graph_steps is not None:
            res["graph_alignment"] = align_graph_to_eager(graph_steps, eager_steps,
                                                          mc.num_hidden_layers)
            res["graph_profile"] = summarize(graph_steps)
            res["graph_profile"]["notes"] = graph_notes
        res["eager_profile"] = summarize(eager_steps)
        res["eager_profile"]["notes"] = eager_notes
        untraced = graph_untraced(res["graph_profile"], res["eager_profile"])
        if res["graph_profile"] is not None:
            res["graph_profile"]["untraced"] = untraced
        if a.trace_dir:  # one graph step then one eager step, small enough to open
            path = os.path.join(a.trace_dir, f"decode_b{b}.json")
            with profile(activities=[ProfilerActivity.CPU]
                         + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
                with record_function(f"{P}graph_step" if graphs else f"{P}step"):
                    phased_step(eng, out, labels=True)
                if graphs is not None:
                    eng.runner.graphs = None
                    try:
                        with record_function(f"{P}eager_step"):
                            phased_step(eng, out, labels=True)
                    finally:
                        eng.runner.graphs = graphs
            prof.export_chrome_trace(path)
            res["trace"] = path

        ph = phases
        print(f"\n=== decode batch {b}, KV {a.kv_len}/request: wall {wall:.3f} ms "
              f"(roofline {roof:.3f} ms, {100 * roof / wall:.1f}%; counting only the bytes a "
              f"decode reads: {res['roofline_read_ms']:.3f} ms, "
              f"{100 * res['roofline_read_ms'] / wall:.1f}%) ===")
        print(f"  phased step: wall {ph['wall_ms']:.3f} ms = host inputs {ph['host_inputs_ms']:.3f}"
              f" + plan {ph['host_plan_ms']:.3f} + GPU {ph['gpu_total_ms']:.3f} "
              f"[{'graph replay' if graphs else 'forward'} {ph['gpu_forward_ms']:.3f}{enqueue_note(ph)}, logits "
              f"{ph['gpu_logits_ms']:.3f}, sample+sync {ph['gpu_sample_ms']:.3f}] + rest "
              f"{ph['wall_ms'] - ph['host_inputs_ms'] - ph['host_plan_ms'] - ph['gpu_total_ms']:.3f}")
        if res.get("eager_phases"):
            ep = res["eager_phases"]
            print(f"  eager step:  wall {ep['wall_ms']:.3f} ms, forward {ep['gpu_forward_ms']:.3f} ms"
                  f"{enqueue_note(ep)}")
        if res.get("piecewise_wall_ms") is not None:
            print(f"  through the piecewise graphs instead of the full one: wall "
                  f"{res['piecewise_wall_ms']:.3f} ms (full graph {wall:.3f} ms)")
        if res["graph_alignment"] and not untraced:
            print(f"  graph kernels categorised: {res['graph_alignment']}")
        for mode in ("graph", "eager"):
            for note in (res[f"{mode}_profile"] or {}).get("notes", []):
                print(f"  NOTE ({mode} profile): {note}")
        print_table(res, a.mem_bw, said)

    eng.runner.piecewise = pw
    mixed_results = []

    def mixed_step(d: int, p: int) -> SchedulerOutput:
        eng.kv.pool = BlockPool(eng.kv.num_blocks)
        dec = [make_req(eng, i, a.kv_len, 1) for i in range(d)]
        return SchedulerOutput(decodes=dec, prefills=[(make_req(eng, d, 0, p), p)])

    # All timing first (eager, then piecewise where it applies), all profiling after, as above.
    for d, p in mixed:
        out = mixed_step(d, p)
        graphed = pw is not None and d + p <= pw.max_num_tokens
        say(f"mixed {d}+{p}: timing (eager{', piecewise' if graphed else ''})")
        with paths(eng, graphs, None):
            wall, phases = time_step(eng, out, a.iters), time_phases(eng, out, a.iters)
        res = dict(decodes=d, prefill_tokens=p, kv_len=a.kv_len, wall_ms=wall, phases=phases,
                   piecewise=None)
        if graphed:
            with paths(eng, graphs, pw):
                by_mode = {}
                for mode in mixed_modes:
                    if cuda and hasattr(eng.attn, "mixed_attention"):
                        eng.attn.mixed_attention = mode
                    by_mode[mode] = dict(wall_ms=time_step(eng, out, a.iters),
                                         phases=time_phases(eng, out, a.iters))
                    if len(mixed_modes) > 1 and d:
                        say(f"mixed {d}+{p}: piecewise, {mode} attention: "
                            f"{by_mode[mode]['wall_ms']:.3f} ms")
                if cuda and hasattr(eng.attn, "mixed_attention"):
                    eng.attn.mixed_attention = mixed_modes[0]
                res["piecewise"] = dict(padded_tokens=pw.padded_size(d + p),
                                        mixed_attention=mixed_modes[0],
                                        **by_mode[mixed_modes[0]])
                if len(mixed_modes) > 1:
                    res["piecewise_by_attention"] = by_mode
        mixed_results.append(res)
    for res in mixed_results:
        d, p = res["decodes"], res["prefill_tokens"]
        out = mixed_step(d, p)
        say(f"mixed {d}+{p}: profiling")
        notes: list[str] = []
        with paths(eng, graphs, None):
            prof = summarize(profile_steps(eng, out, a.prof_iters, notes))
        byt = category_bytes(mc, itemsize, d, a.kv_len)
        lm = byt.get("lm_head", 0) // itemsize
        lin = lin_bytes // itemsize - lm
        flops = 2 * lin * (d + p) + 2 * lm * (d + 1)  # attention's FLOPs left out
        ideal = max((lin_bytes + byt["attention"]) / a.mem_bw, flops / (a.peak_tflops * 1e12)) * 1e3
        res.update(ideal_ms=ideal, eager_profile=prof, notes=notes)
        wall = res["wall_ms"]
        print(f"\n=== mixed step: {d} decodes (KV {a.kv_len}) + {p} prefill tokens, eager: wall "
              f"{wall:.3f} ms, ideal {ideal:.3f} ms ({100 * ideal / wall:.1f}%) ===")
        print_mixed("eager", res["phases"], prof, notes)
        pres = res["piecewise"]
        if pres is not None:
            pnotes: list[str] = []
            with paths(eng, graphs, pw):
                pprof = summarize(profile_steps(eng, out, a.prof_iters, pnotes))
            pprof["untraced"] = graph_untraced(pprof, prof)
            pres.update(profile=pprof, notes=pnotes)
            print(f"  piecewise graphs ({pres['padded_tokens']} tokens padded): wall "
                  f"{pres['wall_ms']:.3f} ms ({wall / pres['wall_ms']:.2f}× eager; ideal "
                  f"{100 * ideal / pres['wall_ms']:.1f}%)")
            print_mixed("piecewise", pres["phases"], pprof, pnotes, eager=prof, said=said)
    if mixed_results:
        print("\n  mixed steps, wall ms (median of --iters execute calls):")
        print(f"  {'decodes+prefill':>16} {'ideal':>8} {'eager':>8} {'piecewise':>10} "
              f"{'padded':>7} {'speed-up':>9}")
        for res in mixed_results:
            pres = res["piecewise"]
            print(f"  {str(res['decodes']) + '+' + str(res['prefill_tokens']):>16} "
                  f"{res['ideal_ms']:8.3f} {res['wall_ms']:8.3f} "
                  + (f"{pres['wall_ms']:10.3f} {pres['padded_tokens']:7d} "
                     f"{res['wall_ms'] / pres['wall_ms']:8.2f}×" if pres else
                     f"{'–':>10} {'–':>7} {'–':>9}"))
        if len(mixed_modes) > 1:
            print(f"\n  piecewise wall ms by mixed-step attention ({', '.join(mixed_modes)}); "
                  "host = enqueue of the forward:")
            for res in mixed_results:
                by = res.get("piecewise_by_attention")
                if by:
                    print(f"  {str(res['decodes']) + '+' + str(res['prefill_tokens']):>16} "
                          + "  ".join(f"{m} {v['wall_ms']:.3f} (host "
                                      f"{v['phases'].get('host_forward_ms', float('nan')):.3f})"
                                      for m, v in by.items()))

    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(header=head, args=vars(a), mem_bw=a.mem_bw,
                           model=dict(name=a.model, layers=mc.num_hidden_layers,
                                      hidden=mc.hidden_size, intermediate=mc.intermediate_size,
                                      q_size=mc.q_size, kv_size=mc.kv_size, vocab=mc.vocab_size,
                                      itemsize=itemsize, weight_bytes=eng.loaded.weight_bytes,
                                      decode_weight_bytes=lin_bytes),
                           device=str(eng.device), cuda=cuda, batches=results,
                           piecewise_capture=None if pw is None or not pw.graphed else dict(
                               sizes=list(pw.sizes), pieces=pw.num_pieces, s=pw.capture_s,
                               reserved_bytes=pw.capture_bytes),
                           mixed=mixed_results), f, indent=2)
        say(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
