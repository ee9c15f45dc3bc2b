"""`gpuchef serve` against the engine's own speed and against `vllm serve`: the same arrivals
sent to each arm, one after another on the same machine, each arm's ``--result-json`` kept.

Arms (``--arms``, comma-separated, run in the order given):

* ``gpuchef_inproc``: ``gpuchef bench`` — gpuchef's load generator, no HTTP (the engine in its
  own process, as every command runs it); ``gpuchef_inproc_trace`` with ``--trace FILE``;
* ``gpuchef_inthread``: the same with the engine built in the command's process
  (``GPUCHEF_IN_PROCESS_ENGINE=1``): the engine's speed with no process boundary at all;
* ``gpuchef_serve`` / ``gpuchef_serve_trace`` (``--trace FILE``) / ``gpuchef_top_serve``
  (``top --serve`` with the dashboard drawing, in a pseudo-terminal from ``script``) /
  ``gpuchef_serve_engine_vllm`` (``serve --engine vllm``) / ``vllm_serve`` (plain ``vllm serve``
  with ``--load-format dummy``): a server started here, driven by ``gpuchef bench --base-url``
  from a separate process, then stopped.

Prints one line per arm and writes ``--json``: ``{"gpu", "date", LOAD: {arm: R}}`` where R
holds the result-JSON keys of issue 28's floors (``median_tpot_ms``, ``median_itl_ms``,
``p99_itl_ms``, ``median_ttft_ms``, ``p99_ttft_ms``, ``mean_e2el_ms``,
``total_token_throughput``). Loads (``--loads``): ``random_1024_256_at_10`` (random 1024/256
tokens, Poisson 10 req/s, 400 prompts) and ``azure_conv_3x_600`` (the bundled Azure
conversation trace at 3×, 600 prompts).

Usage (GPU)::

    python benchmarks/bench_serve_vs_peer.py --model llama-3-8b --json serve_vs_vllm.json \\
        --arms gpuchef_inproc,gpuchef_serve,gpuchef_serve_trace,gpuchef_top_serve
    # CPU, small
    python benchmarks/bench_serve_vs_peer.py --model tiny --device cpu --num-prompts 40 \\
        --loads random_1024_256_at_10 --input-len 128 --output-len 16 --request-rate 4
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date

KEYS = ("median_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_ttft_ms", "p99_ttft_ms",
        "mean_e2el_ms", "total_token_throughput")
ARMS = ("gpuchef_inproc", "gpuchef_inproc_trace", "gpuchef_inthread", "gpuchef_serve", "gpuchef_serve_trace",
        "gpuchef_top_serve", "gpuchef_serve_engine_vllm", "vllm_serve")


def load_flags(name: str, a: argparse.Namespace) -> list[str]:
    if name == "random_1024_256_at_10":
        return ["--dataset", "random", "--input-len", str(a.input_len), "--output-len",
                str(a.output_len), "--request-rate", str(a.request_rate), "--num-prompts",
                str(a.num_prompts or 400)]
    if name == "azure_conv_3x_600":
        return ["--dataset", "azure-conv", "--trace-speed", "3", "--num-prompts",
                str(a.num_prompts or 600)]
    raise SystemExit(f"--loads: {name!r} is not one of random_1024_256_at_10, azure_conv_3x_600")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not healthy within {timeout_s:g} s")


def engine_flags(a: argparse.Namespace) -> list[str]:
    f = ["--model", a.model, "--seed", "0"]
    if a.device:
        f += ["--device", a.device]
    return f + shlex.split(a.engine_args)


def server_cmd(arm: str, load: str, a: argparse.Namespace, port: int, tmp: str) -> list[str]:
    gp = [sys.executable, "-m", "gpuchef"]
    if arm == "vllm_serve":
        return shlex.split(a.vllm_cmd) + ["--port", str(port)]
    cmd = gp + ["serve", *engine_flags(a), "--port", str(port)]
    if arm == "gpuchef_serve_trace":
        cmd += ["--trace", os.path.join(tmp, f"{load}-{arm}.jsonl.gz")]
    if arm == "gpuchef_serve_engine_vllm":
        cmd += ["--engine", "vllm"]
    if arm == "gpuchef_top_serve":  # the dashboard draws in a pseudo-terminal
        cmd = gp + ["top", "--serve", *engine_flags(a), "--port", str(port)]
        return ["script", "-qfec", shlex.join(cmd), "/dev/null"]
    return cmd


def run_arm(arm: str, load: str, a: argparse.Namespace, tmp: str) -> dict:
    out = os.path.join(tmp, f"{load}-{arm}.json")
    lf = load_flags(load, a)
    gp = [sys.executable, "-m", "gpuchef"]
    env = dict(os.environ, COLUMNS="160", LINES="50", TERM="xterm-256color")
    if arm in ("gpuchef_inproc", "gpuchef_inproc_trace", "gpuchef_inthread"):
        if arm == "gpuchef_inthread":
            env["GPUCHEF_IN_PROCESS_ENGINE"] = "1"
        trace = ["--trace", os.path.join(tmp, f"{load}-{arm}.jsonl.gz")] \
            if arm.endswith("_trace") else []
        subprocess.run(gp + ["bench", *engine_flags(a), *lf, *trace, "--result-json", out],
                       env=env, check=True, stdout=subprocess.DEVNULL)
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        srv = subprocess.Popen(server_cmd(arm, load, a, port, tmp), env=env,
                               stdout=subprocess.DEVNULL, stderr=open(out + ".err", "w"),
                               start_new_session=True)
        try:
            wait_health(url, srv, a.start_timeout)
            model = a.served_model or a.model
            vocab = ["--vocab-size", str(a.vocab_size)] if a.vocab_size else []
            subprocess.run(gp + ["bench", "--base-url", url, "--model", model, *lf, *vocab,
                                 *shlex.split(a.http_args), "--result-json", out], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        finally:
            os.killpg(srv.pid, signal.SIGINT)
            try:
                srv.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(srv.pid, signal.SIGKILL)
                srv.wait(10)
    with open(out) as f:
        r = json.load(f)
    return {k: r.get(k) for k in KEYS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--device", default=None)
    ap.add_argument("--engine-args", default="", help="more engine flags for gpuchef's arms")
    ap.add_argument("--arms", default="gpuchef_inproc,gpuchef_serve")
    ap.add_argument("--loads", default="random_1024_256_at_10,azure_conv_3x_600")
    ap.add_argument("--num-prompts", type=int, default=None, help="default: 400 / 600 by load")
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--request-rate", type=float, default=10.0)
    ap.add_argument("--vllm-cmd", default="vllm serve /tmp/llama3 --load-format dummy "
                    "--skip-tokenizer-init", help="the plain vLLM server's command line")
    ap.add_argument("--served-model", default=None,
                    help="the model name the HTTP arms send (default --model)")
    ap.add_argument("--http-args", default="",
                    help="more flags for the HTTP arms' `gpuchef bench --base-url` (e.g. "
                         "'--temperature 1': sampled decoding instead of vllm bench's greedy)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="for the HTTP arms' token-id prompts, where the server does not say its "
                         "vocabulary (vllm serve --skip-tokenizer-init: 128256 for llama-3-8b)")
    ap.add_argument("--start-timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=None,
                    help="keep each arm's result JSON, server log and trace here "
                         "(default: a temporary folder, removed)")
    a = ap.parse_args()
    arms = [x for x in a.arms.split(",") if x]
    for x in arms:
        if x not in ARMS:
            raise SystemExit(f"--arms: {x!r} is not one of {', '.join(ARMS)}")
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.splitlines()[0].strip()
    except (OSError, IndexError):
        gpu = "cpu"
    res: dict = {"gpu": gpu, "date": date.today().isoformat()}
    if a.json and os.path.exists(a.json):
        with open(a.json) as f:
            res.update(json.load(f))
        res.update(gpu=gpu, date=date.today().isoformat())
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = a.out_dir or tmpd
        os.makedirs(tmp, exist_ok=True)
        for load in [x for x in a.loads.split(",") if x]:
            for arm in arms:
                t = time.monotonic()
                try:
                    r = run_arm(arm, load, a, tmp)
                except (subprocess.CalledProcessError, RuntimeError) as e:
                    print(f"{load} {arm}: failed: {e}", flush=True)
                    continue
                res.setdefault(load, {})[arm] = r
                print(f"{load} {arm} ({time.monotonic() - t:.0f} s): "
                      + " ".join(f"{k}={v:.2f}" for k, v in r.items() if v is not None),
                      flush=True)
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
