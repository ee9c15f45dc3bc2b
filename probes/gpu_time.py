"""Where a step's GPU time goes, from two kinds of record.

* A step's kernels by category (``benchmarks/profile_decode.py``): kernel records of
  ``torch.profiler`` (dicts with ``name``, ``start`` and ``us`` in µs, ``labels``: the profiler
  script's ``record_function`` labels around the launching op, innermost first, without its
  prefix) get a category from those labels and their name (:func:`categorize`, ``NAME_RULES``);
  per-step summaries, the bytes each category must move, and the tables the profiler prints.
* An offline run's steps against the roofline (``benchmarks/bench_vllm_host.py``):
  :func:`step_breakdown` over its ``StepRecord`` records.

Pure bookkeeping: no torch, no GPU, so it is tested on the CPU with records made by hand.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict

LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm", "norm")

#: Print order of the categories.
CATEGORIES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "attention", "kv_append", "rope",
              "rope_kv_append", "rmsnorm", "silu_and_mul", "embedding", "copies/elementwise", "attn_other",
              "lm_head", "logits_gather_cast", "sampling", "input_h2d", "plan_h2d",
              "gemm (unattributed)", "other")

#: Kernel name → category, first match wins (case-insensitive). Expected names on the H200:
#: - GEMMs (cuBLAS/cuBLASLt, bf16): "nvjet_tst_*", "sm90_xmma_gemm_*", "cutlass3x_sm90_*gemm*",
#:   "gemv2T_kernel*"/"gemvx*" at batch 1, plus "splitKreduce_kernel" when split-K is picked.
#: - FlashInfer attention: "BatchDecodeWithPagedKVCacheKernel*" (or, with tensor cores,
#:   "BatchPrefillWithPagedKVCacheKernel*"), "PersistentVariableLengthMergeStatesKernel"/
#:   "MergeStatesKernel" when the KV is split; K/V append: "AppendPagedKVCacheKernel".
#: - FlashInfer fused ops: "RMSNormKernel", "FusedAddRMSNormKernel", "act_and_mul_kernel"
#:   (silu_and_mul), "BatchQKApplyRotaryPosIdsCosSinCache*" (RoPE).
#: - Ours (Triton): "rope_append_kernel" (RoPE on q, k and the K/V append in one).
#: - PyTorch: "indexSelectLargeIndex"/"indexSelectSmallIndex" (embedding, row gather),
#:   "*elementwise_kernel*" (casts, .contiguous() copies, the append's index set-up),
#:   "*reduce_kernel*ArgMaxOps*" (greedy sampling), "Memcpy HtoD/DtoH", "Memset".
#: On the CPU the same rules see aten op names (aten::linear, aten::silu, ...).
NAME_RULES = (
    ("copies/elementwise", r"^memcpy|^memset"),
    ("attention", r"batchdecode|batchprefill|singledecode|singleprefill|persistentvariable|"
                  r"mergestates|fmha|flash_?attn|scaled_dot_product"),
    ("rope_kv_append", r"rope_append"),  # engine_host.rope_append's Triton kernel
    ("kv_append", r"appendpaged|append_paged"),
    ("rope", r"rope|rotary"),
    ("rmsnorm", r"rmsnorm|rms_norm"),
    ("silu_and_mul", r"act_and_mul|silu|swiglu"),
    ("sampling", r"argmax|topk|sampling|multinomial"),
    ("embedding", r"embedding|indexselect|index_select"),
    ("gemm (unattributed)", r"gemm|gemv|cutlass|xmma|nvjet|cublas|splitk|sm90_|sm100_|sm80_|"
                            r"ampere_|hopper|aten::mm$|aten::addmm|aten::linear|aten::matmul|"
                            r"aten::bmm"),
    ("copies/elementwise", r"copy|elementwise|catarray|aten::to$|aten::_to_copy|aten::contiguous|"
                           r"aten::cat|fill|aten::clone"),
)
_NAME_RULES = tuple((c, re.compile(p, re.I)) for c, p in NAME_RULES)
_GEMM = dict(_NAME_RULES)["gemm (unattributed)"]


def name_category(name: str) -> str:
    for cat, rx in _NAME_RULES:
        if rx.search(name):
            return cat
    return "other"


def categorize(name: str, labels: list[str]) -> str:
    """Category of a kernel from its name and the profiler's labels around the op that launched
    it (innermost first, without the script's prefix)."""
    for lab in labels:
        if lab.startswith("mod:"):
            leaf = lab.rsplit(".", 1)[-1]
            if leaf in LINEARS:
                return leaf  # everything cuBLAS launches for that Linear (split-K reduce included)
            by_name = name_category(name)
            if by_name not in ("other", "copies/elementwise", "gemm (unattributed)"):
                return by_name
            if leaf == "embed_tokens":
                return "embedding"
            if leaf in NORMS:
                return "rmsnorm"
            if leaf == "mlp":
                return "silu_and_mul"
            if leaf == "self_attn":
                return "copies/elementwise" if by_name == "copies/elementwise" else "attn_other"
            continue
        if lab == "logits":
            return "lm_head" if _GEMM.search(name) else "logits_gather_cast"
        if lab == "sample":
            return "sampling"
        if lab == "inputs":
            return "input_h2d"
        if lab == "plan":
            return "plan_h2d"
    return name_category(name)


def place_by_start(recs: list[dict], starts: list[tuple[float, int]],
                   steps: list[list[dict]]) -> tuple[int, list[dict]]:
    """Put each kernel record (``start`` µs) into ``steps[i]`` for the step whose CPU range
    began last at or before it (``starts``: sorted ``(start µs, step index)``); a record before
    the first step stays out. Returns (records placed, records left)."""
    times = [t for t, _ in starts]
    left, placed = [], 0
    for r in recs:
        k = bisect.bisect_right(times, r["start"]) - 1
        if k < 0:
            left.append(r)
            continue
        steps[starts[k][1]].append(r)
        placed += 1
    return placed, left


def align_graph_to_eager(graph_steps: list[list[dict]], eager_steps: list[list[dict]],
                         num_layers: int) -> str:
    """Give the kernels inside the graph replay (labelled only 'forward') the categories of the
    eager forward's kernels at the same position when the sequences have the same length and
    names; else GEMMs in the order qkv, o, gate_up, down per layer when their count is 4 × layers.
    Returns how it was done."""
    if not eager_steps or not eager_steps[0]:
        return "no eager kernels to align with"
    ref = [r for r in eager_steps[0] if "forward" in r["labels"]]
    how = set()
    for step in graph_steps:
        fwd = [r for r in step if "forward" in r["labels"]]
        if len(fwd) == len(ref):
            same = sum(a["name"] == b["name"] for a, b in zip(fwd, ref))
            for a, b in zip(fwd, ref):
                if a["name"] == b["name"]:
                    a["cat"] = b["cat"]
            how.add(f"positional ({same}/{len(ref)} kernel names equal to eager)")
            continue
        gemms = [r for r in fwd if r["cat"] == "gemm (unattributed)"]
        if len(gemms) == 4 * num_layers:
            for i, r in enumerate(gemms):
                r["cat"] = LINEARS[i % 4]
            how.add(f"GEMMs by order ({len(fwd)} graph kernels vs {len(ref)} eager)")
        else:
            how.add(f"by name only ({len(fwd)} graph kernels vs {len(ref)} eager, "
                    f"{len(gemms)} GEMMs)")
    return "; ".join(sorted(how))


def busy_and_span(recs: list[dict]) -> tuple[float, float]:
    """Union of the kernels' intervals and first start → last end, µs."""
    if not recs:
        return 0.0, 0.0
    iv = sorted((r["start"], r["start"] + r["us"]) for r in recs)
    busy, (cs, ce) = 0.0, iv[0]
    for s, e in iv[1:]:
        if s > ce:
            busy += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    busy += ce - cs
    return busy, iv[-1][1] - iv[0][0]


def summarize(steps: list[list[dict]]) -> dict:
    """Per-step means: by category (kernels, µs), the forward's busy time and span, unknowns."""
    n = max(len(steps), 1)
    cats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    unknown: dict[str, float] = defaultdict(float)
    busy = span = fbusy = fspan = 0.0
    for s in steps:
        for r in s:
            cats[r["cat"]][0] += 1
            cats[r["cat"]][1] += r["us"]
            if r["cat"] in ("other", "gemm (unattributed)"):
                unknown[r["name"]] += r["us"]
        b, sp = busy_and_span(s)
        fb, fs = busy_and_span([r for r in s if "forward" in r["labels"]])
        busy, span, fbusy, fspan = busy + b, span + sp, fbusy + fb, fspan + fs
    return dict(
        categories={c: dict(kernels=v[0] / n, us=v[1] / n) for c, v in cats.items()},
        kernels_per_step=sum(len(s) for s in steps) / n,
        forward_kernels_per_step=sum(sum("forward" in r["labels"] for r in s) for s in steps) / n,
        busy_us=busy / n, span_us=span / n, forward_busy_us=fbusy / n, forward_span_us=fspan / n,
        unknown_top=[dict(name=k, us_per_step=v / n)
                     for k, v in sorted(unknown.items(), key=lambda kv: -kv[1])[:5]])


#: A graphed (full or piecewise) profile whose forward holds fewer kernels per step than this
#: share of the eager forward's traced (almost) none inside its graph replays: CUPTI did not see
#: them (torch 2.11+cu130 on an H200).
#: A graph replays the eager kernels, so a traced one holds about as many.
GRAPH_TRACE_MIN_SHARE = 0.5
UNTRACED_NOTE = ("CUPTI traced no kernels inside graph replays on this build: the per-kernel "
                 "split is the eager profile's")


def graph_untraced(graphed: dict | None, eager: dict | None) -> bool:
    """Whether the graphed profile ``graphed`` (a :func:`summarize` dict) traced (almost) no
    forward kernels: fewer per step than ``GRAPH_TRACE_MIN_SHARE`` of the eager profile's. Its
    busy time, span and per-category µs then describe the few kernels outside the replays, not
    the step. False when either profile is missing or the eager forward has no kernels."""
    if not graphed or not eager or eager["forward_kernels_per_step"] <= 0:
        return False
    return graphed["forward_kernels_per_step"] < (GRAPH_TRACE_MIN_SHARE
                                                  * eager["forward_kernels_per_step"])


def untraced_line(said: set) -> str:
    """The note that graph kernels were not traced: in full the first time a run says it (``said``
    remembers), then short."""
    if "untraced" in said:
        return "  graph kernels not traced (see the NOTE above): the eager profile's split"
    said.add("untraced")
    return f"  NOTE: {UNTRACED_NOTE}"


def category_bytes(mc, itemsize: int, batch: int, kv_len: int) -> dict[str, int]:
    """Bytes a decode step must move per category: weight matrices once, KV read/written."""
    L, H, I, V = mc.num_hidden_layers, mc.hidden_size, mc.intermediate_size, mc.vocab_size
    q, kv = mc.q_size, mc.kv_size
    return {
        "qkv_proj": L * H * (q + 2 * kv) * itemsize,
        "o_proj": L * q * H * itemsize,
        "gate_up_proj": L * H * 2 * I * itemsize,
        "down_proj": L * I * H * itemsize,
        "lm_head": H * V * itemsize,
        "attention": L * batch * (kv_len + 1) * 2 * kv * itemsize,
        "kv_append": L * batch * 2 * kv * itemsize,
        # q, k, v read; q, k, v written (q contiguous, k and v into the pages)
        "rope_kv_append": L * batch * 2 * (q + 2 * kv) * itemsize,
    }




def print_table(res: dict, mem_bw: float, said: set | None = None) -> None:
    """One decode batch's kernel tables. When the graph profile traced no forward kernels
    (:func:`graph_untraced`) it says so once (``said``) and the tables are the eager profile's,
    timed against the eager step: no busy time, gaps or ideal-vs-measured from an empty set."""
    eager = res.get("eager_profile")
    graph = res.get("graph_profile")
    ph = res["phases"]
    if graph_untraced(graph, eager):
        print(untraced_line(set() if said is None else said))
        graph = None
        ph = res.get("eager_phases") or ph  # the eager kernels against the eager step's time
    primary = graph or eager
    byt = res["bytes"]
    cats = primary["categories"]
    total = sum(v["us"] for v in cats.values()) or 1.0
    src = "graph" if graph else "eager"
    print(f"\n  per step, {src} kernels{' (eager µs alongside)' if graph and eager else ''}:")
    print(f"  {'category':<20} {'kern':>5} {'µs':>9} {'%':>6} {'eager µs':>9} {'MB':>9} "
          f"{'TB/s':>6} {'% BW':>6}")
    order = [c for c in CATEGORIES if c in cats or (eager and c in eager["categories"])]
    order += sorted(set(cats) - set(order))
    for c in order:
        v = cats.get(c, dict(kernels=0, us=0.0))
        ev = eager["categories"].get(c, {}).get("us") if (graph and eager) else None
        b = byt.get(c)
        tbs = b / (v["us"] * 1e-6) / 1e12 if b and v["us"] else None
        print(f"  {c:<20} {v['kernels']:>5.0f} {v['us']:>9.1f} {100 * v['us'] / total:>5.1f}% "
              f"{'' if ev is None else f'{ev:.1f}':>9} {'' if b is None else f'{b / 1e6:.1f}':>9} "
              f"{'' if tbs is None else f'{tbs:.2f}':>6} "
              f"{'' if tbs is None else f'{100 * tbs * 1e12 / mem_bw:.0f}%':>6}")
    print(f"  {'total':<20} {primary['kernels_per_step']:>5.0f} {total:>9.1f}")
    for name, p in (("graph", graph), ("eager", eager)):
        if p:
            print(f"  {name}: {p['kernels_per_step']:.0f} kernels/step "
                  f"({p['forward_kernels_per_step']:.0f} in the forward); forward kernels busy "
                  f"{p['forward_busy_us']:.1f} µs over a {p['forward_span_us']:.1f} µs span "
                  f"(gaps {p['forward_span_us'] - p['forward_busy_us']:.1f} µs); whole step "
                  f"busy {p['busy_us']:.1f} µs")
    fb = primary["forward_busy_us"]
    print(f"  event-timed {'graph replay' if graph else 'forward'}: {ph['gpu_forward_ms'] * 1e3:.1f}"
          f" µs vs forward kernels busy {fb:.1f} µs → {ph['gpu_forward_ms'] * 1e3 - fb:.1f} µs "
          f"not in kernels (gaps, launch){' [profiled, so slower]' if not graph else ''}")
    if primary["unknown_top"]:
        print("  top unattributed kernel names (refine NAME_RULES):")
        for u in primary["unknown_top"]:
            print(f"    {u['us_per_step']:>9.1f} µs  {u['name'][:150]}")
    print(f"\n  ideal at {mem_bw / 1e12:.1f} TB/s vs measured ({src}), µs per step:")
    print(f"  {'category':<20} {'ideal':>9} {'measured':>9} {'gap':>9}")
    ideal_sum = meas_sum = 0.0
    for c in order:
        m = cats.get(c, {}).get("us", 0.0)
        ideal = byt[c] / mem_bw * 1e6 if c in byt else 0.0
        ideal_sum += ideal
        meas_sum += m
        print(f"  {c:<20} {ideal:>9.1f} {m:>9.1f} {m - ideal:>9.1f}")
    print(f"  {'kernels total':<20} {ideal_sum:>9.1f} {meas_sum:>9.1f} {meas_sum - ideal_sum:>9.1f}")
    extra = ph["wall_ms"] * 1e3 - meas_sum
    print(f"  {'+ not in kernels':<20} {'':>9} {extra:>9.1f} {extra:>9.1f}   (host, gaps, sync: "
          f"phased wall {ph['wall_ms'] * 1e3:.1f} µs − kernels)")
    print(f"  roofline as bench_engine_step counts it (all weights incl. the embedding table + KV): "
          f"{res['roofline_ms'] * 1e3:.1f} µs; wall {res['wall_ms'] * 1e3:.1f} µs "
          f"= {100 * res['roofline_ms'] / res['wall_ms']:.1f}% of roofline")


#: The host's enqueue time of the forward within this share of its event-timed GPU time: the
#: GPU waited on the launches (host-bound); a GPU-bound forward is enqueued well ahead of it.
HOST_BOUND_SHARE = 0.9


def enqueue_note(ph: dict) -> str:
    """``", host enqueue X ms: host-bound"`` (or ``GPU-bound``) from a phases dict's
    ``host_forward_ms`` (perf_counter around the forward's launches, no sync) against
    ``gpu_forward_ms`` (CUDA events around the same); "" without the host figure (old JSON, or
    the CPU, where the two are one clock: ``phased_step`` leaves it out there)."""
    hf, gf = ph.get("host_forward_ms"), ph.get("gpu_forward_ms")
    if hf is None or not gf:
        return ""
    verdict = "host-bound" if hf >= HOST_BOUND_SHARE * gf else "GPU-bound"
    return f", host enqueue {hf:.3f}: {verdict}"


def print_mixed(how: str, ph: dict, prof: dict, notes: list[str], eager: dict | None = None,
                said: set | None = None) -> None:
    """The phases and the forward's busy/span lines of one mixed step run ``how``. ``eager``: the
    same step's eager profile; when ``prof`` (graphed) traced no forward kernels
    (:func:`graph_untraced`), the note (once, ``said``) replaces its busy/span and verdict."""
    fb, fs = prof["forward_busy_us"], prof["forward_span_us"]
    print(f"  {how} phased: host inputs {ph['host_inputs_ms']:.3f} + plan {ph['host_plan_ms']:.3f}"
          f" + GPU {ph['gpu_total_ms']:.3f} [forward {ph['gpu_forward_ms']:.3f}{enqueue_note(ph)}, "
          f"logits {ph['gpu_logits_ms']:.3f}, sample+sync {ph['gpu_sample_ms']:.3f}] ms")
    if graph_untraced(prof, eager):
        print(untraced_line(set() if said is None else said))
        for note in notes:
            print(f"  NOTE ({how}): {note}")
        return
    print(f"  {how} forward kernels: {prof['forward_kernels_per_step']:.0f}/step, busy "
          f"{fb / 1e3:.3f} ms of a {fs / 1e3:.3f} ms span"
          + (f" ({100 * fb / fs:.0f}% busy: {'launch-bound' if fb < 0.7 * fs else 'kernel-bound'})"
             if fs > 0 else ""))
    for note in notes:
        print(f"  NOTE ({how}): {note}")


def step_breakdown(steps, *, layer_matmul_params: int, lm_head_params: int, weight_bytes: int,
                   kv_bytes_per_block: int, mem_bw: float, peak_flops: float) -> dict:
    """Where an offline run's GPU time goes, from its StepRecords.

    Each step's ideal time is the larger of its memory time (every weight byte plus the KV of
    the ``kv_blocks_used`` blocks, an upper bound of what the step reads, over ``mem_bw``
    bytes/s) and its compute time (2 FLOPs a token per ``layer_matmul_params``, plus the
    lm_head for each sampled row, over ``peak_flops``; attention FLOPs left out, so prefill's
    ideal is a lower bound). Steps are grouped by ``StepRecord.kind`` and by the bound
    ("compute" or "memory"). Returns {"by_kind": {kind: totals}, "by_bound": {bound: totals}},
    totals = steps, gpu_ms, wall_ms, ideal_ms, prefill_tokens, decode_rows, graph_steps, and
    efficiency = ideal_ms / gpu_ms (ms; fractions)."""
    def empty() -> dict:
        return dict(steps=0, gpu_ms=0.0, wall_ms=0.0, ideal_ms=0.0, prefill_tokens=0,
                    decode_rows=0, graph_steps=0)
    by_kind: dict[str, dict] = {}
    by_bound: dict[str, dict] = {}
    for s in steps:
        sampled = s.num_decode_reqs + s.num_prefill_reqs  # at most: a chunk samples at its end
        flops = 2 * s.num_tokens * layer_matmul_params + 2 * sampled * lm_head_params
        compute_ms = flops / peak_flops * 1e3
        memory_ms = (weight_bytes + s.kv_blocks_used * kv_bytes_per_block) / mem_bw * 1e3
        bound = "compute" if compute_ms > memory_ms else "memory"
        for group, key in ((by_kind, s.kind), (by_bound, bound)):
            t = group.setdefault(key, empty())
            t["steps"] += 1
            t["gpu_ms"] += s.gpu_ms
            t["wall_ms"] += s.wall_ms
            t["ideal_ms"] += max(compute_ms, memory_ms)
            t["prefill_tokens"] += s.num_prefill_tokens
            t["decode_rows"] += s.num_decode_reqs
            t["graph_steps"] += bool(s.cuda_graph)
    for group in (by_kind, by_bound):
        for t in group.values():
            t["efficiency"] = t["ideal_ms"] / t["gpu_ms"] if t["gpu_ms"] > 0 else None
    return {"by_kind": by_kind, "by_bound": by_bound}
