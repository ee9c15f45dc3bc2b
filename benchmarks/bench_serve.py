"""The front door's cost: the same seeded arrivals and lengths sent to the same engine in-process
and over HTTP (`gpuchef serve`'s front door, streamed), interleaved over ``--rounds``.

* in-process: ``gpuchef.sessions.headless.run_load`` — the host admits each request at its arrival time
  (the engine in its own process, as every command runs it; no HTTP).
* HTTP: the front door on the same engine, in its own process as `gpuchef serve` runs it
  (``--server-thread`` adds the same server on a thread of this process); the load from
  `gpuchef bench --base-url` in a *separate* process (as a user's load tool would be), token-id prompts,
  ``ignore_eos`` with the forced lengths, streamed. Its figures are client-side (vllm bench
  serve's definitions); the server-side records of the same requests are summarised beside them
  (the difference is the HTTP path: client → server → first chunk back).

Printed and written (``--json``): total token throughput of each arm and their ratio (HTTP /
in-process), P50/P99 TTFT and ITL, and the server's token hand-over lag (engine token time → the
stream's writer, P50/P99 ms).

Usage:
  python benchmarks/bench_serve.py --device cpu --model tiny --dataset azure-conv \\
      --trace-speed 3 --num-prompts 120 --max-input-len 512 --max-output-len 64
  # H200 (the issue's floor: HTTP >= 97 % of in-process throughput at 3x, P50 TTFT within +2 ms)
  python benchmarks/bench_serve.py --model llama-3-8b --dataset azure-conv --trace-speed 3 \\
      --num-prompts 600 --rounds 2 --json serve_3x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dataset", default="azure-conv")
    ap.add_argument("--trace-speed", type=float, default=3.0)
    ap.add_argument("--num-prompts", type=int, default=600)
    ap.add_argument("--max-input-len", type=int, default=None)
    ap.add_argument("--max-output-len", type=int, default=None)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                    help="default: the engine's (on for CUDA, off for CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--server-thread", action="store_true",
                    help="also the front door on a thread of the engine's process (the first "
                         "design; the GIL it takes from the engine is why process.py exists)")
    a = ap.parse_args()

    from rich.console import Console

    from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
    from gpuchef.engine_host.core import make_host
    from gpuchef.engine_host.vocab.tokenizer import load_tokenizer
    from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate
    from gpuchef.probes.metrics import summarize
    from gpuchef.serve.process import ChildArgs, ServeProcess
    from gpuchef.serve.server import bind_socket
    from gpuchef.engine_host.sinks import ListenerSink
    from gpuchef.serve.session import make_front_door
    from gpuchef.sessions.headless import build_engine, run_load

    err = Console(stderr=True)
    ecfg = EngineConfig(model=a.model, device=a.device, seed=a.seed, max_model_len=a.max_model_len,
                        async_scheduling=a.async_scheduling, cache=CacheConfig(),
                        scheduler=SchedulerConfig(max_num_batched_tokens=a.max_num_batched_tokens))
    engine = build_engine(ecfg, err)
    wcfg = WorkloadConfig(dataset=a.dataset, trace_speed=a.trace_speed, num_prompts=a.num_prompts,
                          max_input_len=a.max_input_len, max_output_len=a.max_output_len,
                          max_model_len=engine.max_model_len,
                          vocab_size=engine.model_config.vocab_size, seed=a.seed)
    specs = generate(wcfg)
    # warm-up outside the clock (first-call allocations, JIT)
    run_load(engine, specs[:8], console=err)

    def inproc() -> dict:
        res = run_load(engine, specs, console=err)
        m = summarize(res.requests, res.duration_s, percentiles=(50, 99))
        return _row(m)

    def http(thread: bool) -> dict:
        server_recs = []
        kept = ListenerSink(on_request=server_recs.append)
        if thread:  # the front door on a thread of this process (the design before process.py)
            # the engine in its own process, as every command runs it; its sinks once the front
            # door, which needs the host, is built (before the host starts)
            host = make_host(engine)
            tok = load_tokenizer(a.model, engine.model_config.vocab_size)
            front, metrics = make_front_door(host, engine, tokenizer=tok, served_model_name=None,
                                             model=a.model, api_key=None,
                                             max_concurrent=1 << 20, max_body_bytes=256 << 20)
            # /metrics before the front door: a request is counted before its stream ends
            host.sinks = (metrics, front, kept)
            front.record_send_lag = True
            sock = bind_socket("127.0.0.1", 0)
            host.start()
            front.start(sock)
        else:  # what gpuchef serve runs: the server in its own process
            front = ServeProcess(ChildArgs("127.0.0.1", 0, a.model, engine.model_config.vocab_size,
                                           None, None, None, 1 << 20, 256 << 20, "bench")).start()
            host = make_host(engine, [front, kept])
            host.start()
            front.attach(host, engine)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            cmd = [sys.executable, "-m", "gpuchef", "bench", "--base-url", front.url,
                   "--dataset", a.dataset, "--trace-speed", str(a.trace_speed),
                   "--num-prompts", str(a.num_prompts), "--seed", str(a.seed),
                   "--metric-percentiles", "50,99", "--result-json", out]
            for flag, v in (("--max-input-len", a.max_input_len),
                            ("--max-output-len", a.max_output_len)):
                if v is not None:
                    cmd += [flag, str(v)]
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"bench --base-url failed:\n{p.stdout}\n{p.stderr}")
            client = json.load(open(out))
        front.stop()
        host.stop()
        lag = sorted(getattr(front, "send_lag_ns", []))
        srv = [r for r in server_recs if r.token_times_ns]
        span = (max(r.token_times_ns[-1] for r in srv) - min(r.arrival_ns for r in srv)) / 1e9
        ms = summarize(srv, span, percentiles=(50, 99))
        row = {"total_token_throughput": client["total_token_throughput"],
               "output_throughput": client["output_throughput"],
               "completed": client["completed"],
               "median_ttft_ms": client["median_ttft_ms"], "p99_ttft_ms": client["p99_ttft_ms"],
               "median_itl_ms": client["median_itl_ms"], "p99_itl_ms": client["p99_itl_ms"],
               "median_tpot_ms": client["median_tpot_ms"],
               "server": _row(ms),
               "handover_lag_ms_p50": lag[len(lag) // 2] / 1e6 if lag else None,
               "handover_lag_ms_p99": lag[int(len(lag) * 0.99)] / 1e6 if lag else None,
               "wall_s": time.monotonic() - t0}
        return row

    arms = [("inproc", inproc), ("http", lambda: http(False))]
    if a.server_thread:
        arms.append(("http_thread", lambda: http(True)))
    rows = {k: [] for k, _ in arms}
    for r in range(a.rounds):
        for arm, fn in (arms if r % 2 == 0 else arms[::-1]):
            rows[arm].append(fn())
            err.print(f"round {r + 1} {arm}: {rows[arm][-1]['total_token_throughput']:.1f} tok/s, "
                      f"TTFT p50 {rows[arm][-1]['median_ttft_ms']:.2f} ms")

    def med(arm: str, key: str) -> float:
        return statistics.median(x[key] for x in rows[arm])

    summary = {
        "ratio_total_tok_s": med("http", "total_token_throughput") / med("inproc", "total_token_throughput"),
        "ttft_p50_diff_ms": med("http", "median_ttft_ms") - med("inproc", "median_ttft_ms"),
        "ttft_p99_diff_ms": med("http", "p99_ttft_ms") - med("inproc", "p99_ttft_ms"),
        "itl_p50_diff_ms": med("http", "median_itl_ms") - med("inproc", "median_itl_ms"),
        "itl_p99_diff_ms": med("http", "p99_itl_ms") - med("inproc", "p99_itl_ms"),
    }
    if a.server_thread:
        summary["thread_ratio_total_tok_s"] = (med("http_thread", "total_token_throughput")
                                               / med("inproc", "total_token_throughput"))
        summary["thread_itl_p50_diff_ms"] = (med("http_thread", "median_itl_ms")
                                             - med("inproc", "median_itl_ms"))
    result = {"args": vars(a), "device": str(engine.device), "rows": rows, "summary": summary}
    print(json.dumps(summary, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


def _row(m) -> dict:
    p = dict(m.percentiles_ttft_ms)
    q = dict(m.percentiles_itl_ms)
    return {"total_token_throughput": m.total_token_throughput,
            "output_throughput": m.output_throughput, "completed": m.completed,
            "median_ttft_ms": m.median_ttft_ms, "p99_ttft_ms": p.get(99.0, float("nan")),
            "median_itl_ms": m.median_itl_ms, "p99_itl_ms": q.get(99.0, float("nan")),
            "median_tpot_ms": m.median_tpot_ms}


if __name__ == "__main__":
    main()
