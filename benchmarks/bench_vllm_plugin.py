"""gpuchef's vLLM stat-logger plugin in a real `vllm serve`: what it costs and whether its records
add up to vLLM's own counters (issue 29's floors).

Arms (``--arms``, comma-separated, run in the order given, one server start each):

* ``without``: ``vllm serve`` with the plugin off (``GPUCHEF_PUBLISH`` unset: the entry point
  is loaded, nothing is bound or published);
* ``with``: the same with ``GPUCHEF_PUBLISH=127.0.0.1:PORT`` and gpuchef's reader
  (``probes.plugin_reader.PluginReader``) reading every record while the load runs, as
  ``top --attach`` does;
* ``pair``: ``--servers`` (2) servers on the one GPU at ``0.84 / N`` of its memory each, each
  with its own publisher, one reader on all of them, the load split evenly: two columns.

Each arm drives the server with ``gpuchef bench --base-url`` (a separate process; the load of
``--load``: random 1024/256 at 10 req/s, 400 prompts, as bench_serve_vs_peer.py), and scrapes
``/metrics`` just before the load and once the server is idle again. For the plugin arms it
compares, per server, over the run:

* iterations: records carrying IterationStats vs the count of ``vllm:iteration_tokens_total``
  (vLLM observes it once per ``record()`` call that has IterationStats);
* prompt / generation tokens: the records' sums vs ``vllm:prompt_tokens_total`` /
  ``vllm:generation_tokens_total``;
* dropped: the publisher's count of records it could not hand to this reader, and the
  sequence gaps it could not explain (``StreamStats``).

Writes ``--json`` (``benchmarks/results/peer/vllm_plugin.json``'s keys: ``gpu``, ``date``,
``tok_s_without``, ``tok_s_with``, ``iterations_vllm``, ``iterations_plugin``,
``prefill_tokens_vllm``, ``prefill_tokens_plugin``, ``dropped``, plus each arm's latency
figures) and, with ``--out-dir``, each arm's result JSON, server log and the plugin's records as
``ARM-records.jsonl.gz`` (one msgspec-JSON PluginRecord a line, with ``server`` and ``recv_ns``).

Usage (GPU, vLLM and gpuchef installed in one environment; benchmarks/device/jobs/vllm_peer.txt)::

    python benchmarks/bench_vllm_plugin.py --arms without,with --json vllm_plugin.json \\
        --out-dir plugin-runs
    # no vLLM (a dry run of the harness against gpuchef serve: no records arrive)
    python benchmarks/bench_vllm_plugin.py --arms with --model tiny \\
        --vllm-cmd "python -m gpuchef serve --model tiny --device cpu" --num-prompts 8 \\
        --input-len 64 --output-len 8 --request-rate 4
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import date

import msgspec

from gpuchef.probes.plugin_reader import PluginReader
from gpuchef.probes.scrape import parse_metrics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve_vs_peer import KEYS, free_port, load_flags, wait_health  # noqa: E402

ARMS = ("without", "with", "pair")


def scrape(url: str):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode(), url=url)


def wait_idle(url: str, timeout_s: float = 60.0) -> None:
    """Until the server runs and queues nothing (its last outputs have been recorded)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        s = scrape(url)
        if s.values.get("running", 0) == 0 and s.values.get("waiting", 0) == 0:
            return
        time.sleep(0.5)


def counters(s) -> dict:
    h = s.hists.get("iteration_tokens")
    return {"prompt_tokens": s.values.get("prompt_tokens", 0.0),
            "generation_tokens": s.values.get("generation_tokens", 0.0),
            "iterations": h.count if h is not None else 0.0,
            "iteration_tokens": h.sum if h is not None else 0.0}


def start_servers(a, n: int, publish: bool, tmp: str, arm: str):
    procs = []
    for i in range(n):
        port, pub = free_port(), free_port()
        cmd = shlex.split(a.vllm_cmd) + ["--port", str(port)]
        if n > 1:
            cmd += ["--gpu-memory-utilization", f"{a.pair_memory / n:.3f}"]
        env = dict(os.environ)
        env.pop("GPUCHEF_PUBLISH", None)
        if publish:
            env["GPUCHEF_PUBLISH"] = f"127.0.0.1:{pub}"
        err = open(os.path.join(tmp, f"{arm}-server{i}.log"), "w")
        p = subprocess.Popen(cmd, env=env, stdout=err, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append((p, f"http://127.0.0.1:{port}", f"tcp://127.0.0.1:{pub}"))
    return procs


def stop(procs) -> None:
    for p, _, _ in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
    for p, _, _ in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def run_arm(arm: str, a, tmp: str) -> dict:
    n = a.servers if arm == "pair" else 1
    publish = arm != "without"
    procs = start_servers(a, n, publish, tmp, arm)
    reader = None
    try:
        for p, url, _ in procs:
            wait_health(url, p, a.start_timeout)
        if publish:
            # keep every record: the sums below are over all of them
            reader = PluginReader([pub for _, _, pub in procs], keep=10_000_000).start()
            time.sleep(2.5)  # two HELLOs: the publishers know the reader before the load
        t_before_ns = time.time_ns()
        before = {url: counters(scrape(url)) for _, url, _ in procs}
        lf = load_flags(a.load, a)
        if n > 1:  # split the arrivals: each server gets rate / n and prompts / n
            lf = load_flags(a.load, argparse.Namespace(**{
                **vars(a), "request_rate": a.request_rate / n,
                "num_prompts": (a.num_prompts or 400) // n}))
        gp = [sys.executable, "-m", "gpuchef", "bench", "--model", a.served_model or a.model]
        outs = [os.path.join(tmp, f"{arm}-{i}.json") for i in range(n)]
        t0 = time.monotonic()
        vocab = ["--vocab-size", str(a.vocab_size)] if a.vocab_size else []
        loads = [subprocess.Popen(gp + ["--base-url", url, *lf, *vocab, "--seed", str(i),
                                        "--result-json", out], stdout=subprocess.DEVNULL)
                 for i, ((_, url, _), out) in enumerate(zip(procs, outs))]
        for q in loads:
            if q.wait() != 0:
                raise RuntimeError(f"gpuchef bench exited with {q.returncode}")
        wall = time.monotonic() - t0
        for _, url, _ in procs:
            wait_idle(url)
        time.sleep(1.0)  # the last records reach the reader
        after = {url: counters(scrape(url)) for _, url, _ in procs}
        got = {"wall_s": wall}
        res = []
        for out in outs:
            with open(out) as f:
                res.append(json.load(f))
        got["total_token_throughput"] = sum(r["total_token_throughput"] for r in res)
        for k in KEYS:
            if k != "total_token_throughput":
                got[k] = res[0].get(k)
        got["servers"] = {}
        snap = reader.snapshot() if reader is not None else None
        # the records made after the first scrape (an idle server makes none; to be sure)
        recs = sorted((r for ring in (snap.recent.values() if snap is not None else ())
                       for r in ring if r.recv_ns >= t_before_ns), key=lambda r: r.recv_ns)
        per_server: dict[str, list] = {}
        for r in recs:
            per_server.setdefault(r.server, []).append(r)
        for p, url, pub in procs:
            d = {k: after[url][k] - before[url][k] for k in after[url]}
            rs = per_server.get(pub, [])
            d["records"] = len(rs)
            d["iterations_plugin"] = sum(1 for r in rs if r.record.has_iter)
            d["prompt_tokens_plugin"] = sum(r.record.prompt_tokens for r in rs)
            d["generation_tokens_plugin"] = sum(r.record.generation_tokens for r in rs)
            d["engines"] = sorted({r.record.engine_idx for r in rs})
            got["servers"][url] = d
        if snap is not None:
            got["reader"] = snap.totals()
        if reader is not None and a.out_dir:
            path = os.path.join(tmp, f"{arm}-records.jsonl.gz")
            enc = msgspec.json.Encoder()
            with gzip.open(path, "wb") as f:
                for r in recs:
                    row = msgspec.to_builtins(r.record)
                    row.update(server=r.server, recv_ns=r.recv_ns, gap=r.gap,
                               dropped=r.dropped)
                    f.write(enc.encode(row) + b"\n")
        return got
    finally:
        if reader is not None:
            reader.close()
        stop(procs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--arms", default="without,with")
    ap.add_argument("--model", default="llama-3-8b", help="the model name the load sends")
    ap.add_argument("--served-model", default=None)
    ap.add_argument("--load", default="random_1024_256_at_10",
                    help="random_1024_256_at_10 or azure_conv_3x_600")
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--request-rate", type=float, default=10.0)
    ap.add_argument("--vllm-cmd", default="vllm serve /tmp/llama3 --load-format dummy "
                    "--skip-tokenizer-init --served-model-name llama-3-8b")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="the token-id prompts' vocabulary, where the server does not say it "
                         "(vllm serve --skip-tokenizer-init: 128256 for llama-3-8b)")
    ap.add_argument("--servers", type=int, default=2, help="servers of the pair arm")
    ap.add_argument("--pair-memory", type=float, default=0.84,
                    help="GPU memory fraction the pair's servers share")
    ap.add_argument("--start-timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=None)
    a = ap.parse_args()
    arms = [x for x in a.arms.split(",") if x]
    for x in arms:
        if x not in ARMS:
            raise SystemExit(f"--arms: {x!r} is not one of {', '.join(ARMS)}")
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.splitlines()[0].strip()
    except (OSError, IndexError):
        gpu = "cpu"
    res: dict = {}
    if a.json and os.path.exists(a.json):
        with open(a.json) as f:
            res.update(json.load(f))
    res.update(gpu=gpu, date=date.today().isoformat(), load=a.load)
    tmp = a.out_dir or os.path.join("/tmp", f"bench_vllm_plugin_{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    for arm in arms:
        t = time.monotonic()
        try:
            r = run_arm(arm, a, tmp)
        except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
            print(f"{arm}: failed: {e}", flush=True)
            continue
        res.setdefault("arms", {})[arm] = r
        print(f"{arm} ({time.monotonic() - t:.0f} s): {json.dumps(r)}", flush=True)
        if arm == "without":
            res["tok_s_without"] = r["total_token_throughput"]
        if arm == "with":
            res["tok_s_with"] = r["total_token_throughput"]
            (s,) = r["servers"].values()
            res.update(iterations_vllm=s["iterations"], iterations_plugin=s["iterations_plugin"],
                       prefill_tokens_vllm=s["prompt_tokens"],
                       prefill_tokens_plugin=s["prompt_tokens_plugin"],
                       generation_tokens_vllm=s["generation_tokens"],
                       generation_tokens_plugin=s["generation_tokens_plugin"],
                       dropped=r.get("reader", {}).get("missing"))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
