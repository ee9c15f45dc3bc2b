"""vLLM under gpuchef's host against plain vLLM, and gpuchef's native engine, on one offline run.

The run is REFERENCE.md §4b's offline peer run: the Azure conversation trace's first
``--num-prompts`` (1000) requests submitted at once, prompt + forced output clipped to
``--max-model-len`` (8192), Llama-3-8B shapes with random bf16 weights. Three arms, each in its
own process (one GPU, each engine takes most of its memory), one after the other:

* ``plain``: vLLM as users run it offline — ``vllm.LLM(load_format="dummy",
  skip_tokenizer_init=True)`` and one ``LLM.generate`` call over token-id prompts with
  ``ignore_eos`` and the forced lengths (vLLM's engine core in its own process, its defaults:
  async scheduling, torch.compile, CUDA graphs).
* ``hosted``: the same vLLM (same knobs) as ``VllmEngine`` under gpuchef's ``EngineHost``, every
  step recorded (``gpuchef.sessions.headless.run_load``): the issue's bar is ≥ 98 % of ``plain``.
* ``native``: gpuchef's own engine, same load and knobs.

Throughput = completed requests, output tokens and all tokens over the wall time of the run
(``LLM.generate`` / ``run_load``); start-up and a short warm-up are outside it.

Usage on the H200 (see docs/vllm.md for installing vLLM there; one arm per command keeps each
under the machine's 10-minute limit, the JSON files collect in --out):

  python benchmarks/bench_vllm_host.py --run plain  --out bench-vllm
  python benchmarks/bench_vllm_host.py --run hosted --out bench-vllm
  python benchmarks/bench_vllm_host.py --run native --out bench-vllm
  python benchmarks/bench_vllm_host.py --report bench-vllm      # the table (docs/benchmarks.md)
  python benchmarks/bench_vllm_host.py --run all --out bench-vllm  # all three, one per process

Smaller smoke run: --model tiny --num-prompts 50 --max-model-len 2048 --enforce-eager.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("plain", "hosted", "native")
LABELS = {"plain": "plain vLLM (LLM.generate)", "hosted": "vLLM under gpuchef's host",
          "native": "gpuchef native engine"}


def load_specs(a: argparse.Namespace, vocab_size: int):
    """The offline run's requests: (prompt token ids, forced output length) pairs."""
    from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate

    cfg = WorkloadConfig(dataset=a.dataset, num_prompts=a.num_prompts, trace_speed=float("inf"),
                         max_model_len=a.max_model_len, vocab_size=vocab_size, seed=a.seed)
    return generate(cfg)


def _vocab(model: str) -> int:
    from gpuchef.engine_host.vocab.presets import PRESETS

    if model in PRESETS:
        return PRESETS[model]["vocab_size"]
    cfg = json.loads((Path(model) / "config.json").read_text())
    return int(cfg.get("text_config", cfg)["vocab_size"])


def _model_path(model: str) -> str:
    from gpuchef.engine_host.vocab.presets import PRESETS
    from gpuchef.engine_host.vllm_models import preset_model_folder

    return str(preset_model_folder(model)) if model in PRESETS else model


def _totals(prompt_lens, output_lens, wall_s: float) -> dict:
    n_in, n_out = sum(prompt_lens), sum(output_lens)
    return {"completed": len(output_lens), "duration_s": wall_s,
            "request_throughput": len(output_lens) / wall_s,
            "output_throughput": n_out / wall_s, "total_token_throughput": (n_in + n_out) / wall_s,
            "total_input_tokens": n_in, "total_output_tokens": n_out}


def run_plain(a: argparse.Namespace) -> dict:
    from vllm import LLM, SamplingParams

    specs = load_specs(a, _vocab(a.model))
    t0 = time.perf_counter()
    llm = LLM(model=_model_path(a.model), load_format="dummy" if a.model_is_preset else "auto",
              skip_tokenizer_init=True, dtype="bfloat16", seed=a.seed,
              max_model_len=a.max_model_len, max_num_batched_tokens=a.max_num_batched_tokens,
              max_num_seqs=a.max_num_seqs, gpu_memory_utilization=a.gpu_memory_utilization,
              enforce_eager=a.enforce_eager, enable_prefix_caching=a.prefix_caching,
              tensor_parallel_size=a.tensor_parallel_size,
              **({"block_size": a.block_size} if a.block_size else {}))
    startup = time.perf_counter() - t0
    sp = lambda n: SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0,  # noqa: E731
                                  detokenize=False)
    warm = [{"prompt_token_ids": s.prompt_token_ids.tolist()[:64]} for s in specs[:8]]
    llm.generate(warm, [sp(4)] * len(warm), use_tqdm=False)
    prompts = [{"prompt_token_ids": s.prompt_token_ids.tolist()} for s in specs]
    params = [sp(s.output_len) for s in specs]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    out_lens = [len(o.outputs[0].token_ids) for o in outs]
    sc = llm.llm_engine.vllm_config.scheduler_config
    d = _totals([s.prompt_len for s in specs], out_lens, wall)
    d.update(startup_s=startup, vllm_scheduler={"max_num_batched_tokens": sc.max_num_batched_tokens,
                                                "max_num_seqs": sc.max_num_seqs,
                                                "async_scheduling": sc.async_scheduling})
    return d


def _engine_config(a: argparse.Namespace, engine: str):
    from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig

    eager = a.enforce_eager or (engine == "native" and a.native_enforce_eager)
    return EngineConfig(
        engine=engine, model=a.model, dtype="auto", seed=a.seed, max_model_len=a.max_model_len,
        enforce_eager=eager, tensor_parallel_size=a.tensor_parallel_size if engine == "vllm" else 1,
        decode_attention=a.decode_attention if engine == "native" else "auto",
        cache=CacheConfig(gpu_memory_utilization=a.gpu_memory_utilization,
                          **({"block_size": a.block_size} if a.block_size else {})),
        scheduler=SchedulerConfig(mode=a.mode, max_num_batched_tokens=a.max_num_batched_tokens,
                                  max_num_seqs=a.max_num_seqs))


def run_gpuchef(a: argparse.Namespace, engine: str) -> dict:
    from rich.console import Console

    from gpuchef.engine_host.request import SamplingParams
    from gpuchef.sessions.headless import run_load

    t0 = time.perf_counter()
    if engine == "vllm":
        from gpuchef.engine_host.vllm_engine import VllmEngine

        eng = VllmEngine(_engine_config(a, "vllm"), tensor_parallel_size=a.tensor_parallel_size,
                         enable_prefix_caching=a.prefix_caching)
    else:
        from gpuchef.engine_host.factory import make_engine

        eng = make_engine(_engine_config(a, "native"))
    startup = time.perf_counter() - t0
    specs = load_specs(a, eng.model_config.vocab_size)
    for i, s in enumerate(specs[:8]):  # warm-up, as for plain
        eng.add_request(f"warm{i}", s.prompt_token_ids.tolist()[:64],
                        SamplingParams(max_tokens=4, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    quiet = Console(stderr=True, quiet=True)
    t0 = time.perf_counter()
    res = run_load(eng, specs, console=quiet)
    wall = time.perf_counter() - t0
    reqs = sorted(res.requests, key=lambda r: r.request_id)
    d = _totals([r.prompt_len for r in reqs], [r.output_len for r in reqs], wall)
    steps = res.steps
    d.update(startup_s=startup, run_load_duration_s=res.duration_s, steps=len(steps),
             mean_step_ms=sum(s.wall_ms for s in steps) / max(1, len(steps)),
             gpu_busy_fraction=sum(s.gpu_ms for s in steps) / 1e3 / max(1e-9, wall),
             preemptions=sum(s.num_preempted for s in steps), mode=a.mode,
             attention=eng.attn.name, block_size=eng.kv.block_size
             if hasattr(eng, "kv") else a.block_size)
    if engine == "native":
        from gpuchef.engine_host.kv_cache import KVCacheManager
        from gpuchef.probes.gpu_time import step_breakdown

        mc = eng.model_config
        d["step_breakdown"] = step_breakdown(
            steps, layer_matmul_params=mc.layer_matmul_params,
            lm_head_params=mc.hidden_size * mc.vocab_size, weight_bytes=eng.loaded.weight_bytes,
            kv_bytes_per_block=KVCacheManager.bytes_per_block(
                mc.num_hidden_layers, eng.kv.block_size, mc.num_key_value_heads, mc.head_dim,
                eng.dtype),
            mem_bw=a.mem_bw, peak_flops=a.peak_tflops * 1e12)
    if hasattr(eng, "close"):
        eng.close()
    return d


def report(folder: Path) -> str:
    rows = {arm: json.loads((folder / f"{arm}.json").read_text())
            for arm in ARMS if (folder / f"{arm}.json").is_file()}
    if not rows:
        return f"no results in {folder}"
    base = rows.get("plain")
    lines = ["| run | requests | duration (s) | req/s | output tok/s | total tok/s | vs plain vLLM |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for arm, d in rows.items():
        ratio = (f"{100 * d['total_token_throughput'] / base['total_token_throughput']:.1f} %"
                 if base else "–")
        lines.append(f"| {LABELS[arm]} | {d['completed']} | {d['duration_s']:.1f} | "
                     f"{d['request_throughput']:.2f} | {d['output_throughput']:,.0f} | "
                     f"{d['total_token_throughput']:,.0f} | {ratio} |")
    notes = []
    for arm, d in rows.items():
        extra = f"start-up {d.get('startup_s', 0):.0f} s"
        if "steps" in d:
            extra += (f", {d['steps']} steps of {d['mean_step_ms']:.1f} ms mean, GPU busy "
                      f"{100 * d['gpu_busy_fraction']:.0f} %, {d['preemptions']} preemptions")
        notes.append(f"- {LABELS[arm]}: {extra}")
    for arm, d in rows.items():
        bd = d.get("step_breakdown")
        if not bd:
            continue
        notes += ["", f"{LABELS[arm]}, where the GPU time goes (ideal: max(memory, compute) a "
                  "step; attention FLOPs left out):", "",
                  "| steps | count | GPU s | ideal s | of ideal | prefill tokens | decode rows "
                  "| graphed |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for group, suffix in (("by_kind", ""), ("by_bound", "-bound")):
            for key, t in bd[group].items():
                key = key + suffix
                eff = f"{100 * t['efficiency']:.0f} %" if t["efficiency"] is not None else "–"
                notes.append(f"| {key} | {t['steps']} | {t['gpu_ms'] / 1e3:.2f} | "
                             f"{t['ideal_ms'] / 1e3:.2f} | {eff} | {t['prefill_tokens']:,} | "
                             f"{t['decode_rows']:,} | {t['graph_steps']} |")
    return "\n".join(lines + [""] + notes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", choices=[*ARMS, "all"], default=None)
    ap.add_argument("--report", default=None, metavar="DIR", help="print the table of DIR's runs")
    ap.add_argument("--out", default="bench-vllm", help="folder for <arm>.json")
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--dataset", default="azure-conv")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--max-model-len", type=int, default=8192)
    # vLLM 0.24's offline defaults on a ≥70 GiB GPU (REFERENCE.md §2), given to every arm
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--mode", default="chunked", choices=["chunked", "continuous"],
                    help="gpuchef arms' scheduler mode (plain vLLM is always its own chunked)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--block-size", type=int, default=None,
                    help="tokens per KV page, every arm (default: each engine's own, 16)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--enforce-eager", action="store_true", help="every arm: no CUDA graphs")
    from gpuchef.engine_host.attention import DECODE_ATTENTION

    ap.add_argument("--decode-attention", default="auto", choices=DECODE_ATTENTION,
                    help="the native arm's decode kernel (EngineConfig.decode_attention)")
    ap.add_argument("--native-enforce-eager", action="store_true",
                    help="the native arm only: no CUDA graphs (its graph capture at large "
                         "--max-num-seqs can outlast a short device lease)")
    ap.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                    help="vLLM arms: prefix cache off (default on, vLLM's own default; the "
                         "trace's prompts are random ids, so it never hits)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mem-bw", type=float, default=4.3e12,
                    help="bytes/s ceiling for the native arm's step breakdown")
    ap.add_argument("--peak-tflops", type=float, default=790.0,
                    help="bf16 matmul ceiling for the native arm's step breakdown")
    ap.add_argument("--timeout", type=float, default=1800, help="per arm, with --run all (s)")
    a = ap.parse_args(argv)
    from gpuchef.engine_host.vocab.presets import PRESETS

    a.model_is_preset = a.model in PRESETS
    if a.report:
        print(report(Path(a.report)))
        return 0
    if a.run is None:
        ap.error("give --run ARM or --report DIR")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.run == "all":
        given = list(argv if argv is not None else sys.argv[1:])
        rest, skip = [], False
        for x in given:  # drop "--run all" / "--run=all"
            if skip or x.startswith("--run="):
                skip = False
                continue
            if x == "--run":
                skip = True
                continue
            rest.append(x)
        for arm in ARMS:
            cmd = [sys.executable, __file__, *rest, "--run", arm]
            print(f"== {arm}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            r = subprocess.run(cmd, timeout=a.timeout, env=os.environ.copy())
            if r.returncode:
                print(f"== {arm} failed (exit {r.returncode})", file=sys.stderr)
        print(report(out))
        return 0
    d = run_plain(a) if a.run == "plain" else run_gpuchef(a, "vllm" if a.run == "hosted"
                                                         else "native")
    d.update(arm=a.run, model=a.model, num_prompts=a.num_prompts, max_model_len=a.max_model_len,
             max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
             prefix_caching=a.prefix_caching, enforce_eager=a.enforce_eager or (
                 a.run == "native" and a.native_enforce_eager),
             date=time.strftime("%Y-%m-%d"))
    try:
        import torch
        d["gpu"] = torch.cuda.get_device_name(0)
        d["torch"] = torch.__version__
        import importlib.metadata as md
        d["vllm"] = md.version("vllm")
    except Exception:
        pass
    (out / f"{a.run}.json").write_text(json.dumps(d, indent=2))
    print(json.dumps(d, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
