"""guidellm against `gpuchef serve`: its client-side TTFT / ITL / request latency beside gpuchef's
server-side figures for the same requests, and where the difference goes.

Starts ``gpuchef serve --device cpu --model tiny --port 0 --trace <tmp> --trace-prompts`` as a
subprocess, runs guidellm 0.8.1 (``guidellm run``: ``/v1/completions``, streamed, synthetic text
prompts, output lengths forced by guidellm's ``max_tokens`` + ``ignore_eos``, a constant rate,
``max_requests``) with its tokenizer pointed at the presets' bundled tokenizer, saves guidellm's
JSON, stops the server (SIGINT, as Ctrl-C) and reads its trace.

Definitions (guidellm: ``guidellm/schemas/base/request_stats.py`` and the weights in
``guidellm/benchmark/schemas/metrics.py``; gpuchef: ``engine_host/vocab/records.py``,
``probes/metrics.py``, vllm bench serve's):

* guidellm TTFT = the first SSE line with non-empty ``text`` parsed − ``request_start`` (httpx's
  "send request headers started" trace hook: the client's send; ``backends/openai/http.py``).
  gpuchef TTFT = end of the step that sampled the first token − ``arrival_ns``
  (``EngineHost.submit``, after the server read and parsed the body and tokenised the prompt).
* guidellm ITL = per request (last token − first token) / (output_tokens − 1); its mean and
  percentiles are over requests weighted by output_tokens − 1. gpuchef ITL = every gap between a
  request's output chunks (one value per chunk). guidellm's "TPOT" = (last token − send) /
  output_tokens (TTFT included); vllm's / gpuchef's TPOT = (last − first) / (n − 1) per request,
  unweighted. guidellm's percentiles are nearest-rank on the (weighted) CDF
  (``schemas/base/statistics.py`` ``Percentiles.from_pdf``); gpuchef's are numpy's (linear).
* guidellm request latency = end of the response (after ``[DONE]``) − send; gpuchef E2EL = the
  last token's step − arrival.

Clocks: guidellm stamps with ``time.time()`` (CLOCK_REALTIME), gpuchef with
``time.monotonic_ns()``. Where the wall clock is stepped or slewed (a VM: here it ran 0.5 % fast
of CLOCK_MONOTONIC and jumped ~2 s after a stall) guidellm's own durations inherit that. So this
script samples (realtime, monotonic) pairs every 20 ms during the run, maps each of guidellm's
stamps onto CLOCK_MONOTONIC and recomputes guidellm's figures there ("guidellm mono"): the
comparison and the per-request pieces (send → arrival, server first token → client parsed it, …)
use those. Requests are paired by start order (checked: each pair's output lengths agree).

Columns: guidellm's report; guidellm mono (TTFT, latency: numpy percentiles like gpuchef's;
ITL, TPOT: guidellm's weighted nearest-rank); gpuchef (``summarize`` over the same requests;
the row "ITL, guidellm's definition" recomputes the server's ITL the way guidellm does);
diff = guidellm mono − gpuchef.

Usage:
  .venv/bin/python benchmarks/bench_guidellm.py --rate 1.5 --num-requests 40 \\
      --out-dir benchmarks/results/2026-12-01-cpu
Writes, under --out-dir: guidellm.json (guidellm's own output), guidellm_vs_gpuchef.json (the
comparison; or --json PATH), guidellm.log (guidellm's console), serve.log (the server's stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BUNDLED_TOKENIZER = REPO / "engine_host" / "vocab" / "data" / "tokenizer-bundled.json"
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                    "eos_token": "</s>"}
NAN = float("nan")


# -- the server ---------------------------------------------------------------------------------
def gpuchef_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("gpuchef")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpuchef"]


def start_server(a: argparse.Namespace, trace: Path,
                 log_path: Path) -> tuple[subprocess.Popen, str]:
    cmd = gpuchef_cmd() + ["serve", "--device", a.device, "--model", a.model, "--port", "0",
                           "--trace", str(trace), "--trace-prompts"]
    log = open(log_path, "w")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         cwd=REPO)
    url: list[str] = []
    got = threading.Event()

    def pump() -> None:  # the server's stderr → serve.log; the URL from its banner
        for line in p.stderr:
            log.write(line)
            log.flush()
            if not url and (m := re.search(r"on (http://[0-9.:\[\]]+)", line)):
                url.append(m.group(1))
                got.set()
        log.close()
        got.set()

    threading.Thread(target=pump, daemon=True).start()
    if not got.wait(a.server_timeout) or not url:
        stop_server(p)
        raise SystemExit(f"gpuchef serve gave no URL in {a.server_timeout} s; see {log_path}")
    return p, url[0]


def stop_server(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGINT)  # as Ctrl-C: the trace gets its end record
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- guidellm -----------------------------------------------------------------------------------
def guidellm_argv(a: argparse.Namespace, url: str, tok_dir, out_json) -> list[str]:
    data = f"kind=synthetic_text,prompt_tokens={a.prompt_tokens}"
    if a.prompt_tokens_stdev:
        data += (f",prompt_tokens_stdev={a.prompt_tokens_stdev},"
                 f"prompt_tokens_min={a.prompt_tokens_min},prompt_tokens_max={a.prompt_tokens_max}")
    data += f",output_tokens={a.output_tokens}"
    if a.output_tokens_stdev:
        data += (f",output_tokens_stdev={a.output_tokens_stdev},"
                 f"output_tokens_min={a.output_tokens_min},output_tokens_max={a.output_tokens_max}")
    return [a.guidellm, "run",
            "--backend", f"kind=openai_http,target={url},model={a.model},"
                         "request_format=/v1/completions,stream=true",
            "--profile", f"kind=constant,rate={a.rate}",
            "--data", data,
            "--tokenizer", f"kind=huggingface_auto,model={tok_dir}",
            "--constraint", f"kind=max_requests,count={a.num_requests}",
            "--seed", f"kind=static,value={a.seed}",
            "--output", f"kind=json,path={out_json}",
            "--disable-progress"]


# -- clocks -------------------------------------------------------------------------------------
class ClockSampler:
    """(CLOCK_REALTIME, CLOCK_MONOTONIC) pairs every ``period_s`` on a thread; ``to_mono_ns``
    maps a ``time.time()`` stamp (s) onto CLOCK_MONOTONIC (ns), piecewise linear between pairs.
    CLOCK_MONOTONIC is one clock for every process of the machine (the server's trace uses it)."""

    def __init__(self, period_s: float = 0.02) -> None:
        self.period_s = period_s
        self.pairs: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        self.pairs.append((w, (m0 + m1) // 2))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period_s)

    def __enter__(self) -> "ClockSampler":
        self._sample()
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self._sample()

    def summary(self) -> dict:
        w = np.array([p[0] for p in self.pairs], dtype=np.float64)
        m = np.array([p[1] for p in self.pairs], dtype=np.float64)
        off = (w - m) / 1e6  # ms
        span = (m[-1] - m[0]) / 1e9
        jumps = np.diff(off)
        return {"samples": len(w), "span_s": span,
                "realtime_minus_monotonic_change_ms": float(off[-1] - off[0]),
                "realtime_rate_vs_monotonic_ppm": float((off[-1] - off[0]) / 1e3 / span * 1e6)
                if span > 0 else NAN,
                "largest_step_ms": float(jumps[np.argmax(np.abs(jumps))]) if len(jumps) else 0.0,
                "realtime_monotone": bool(np.all(np.diff(w) > 0))}

    def to_mono_ns(self, wall_s: float) -> float:
        w = np.array([p[0] for p in self.pairs], dtype=np.float64)
        m = np.array([p[1] for p in self.pairs], dtype=np.float64)
        return float(np.interp(wall_s * 1e9, w, m))


# -- statistics ---------------------------------------------------------------------------------
def np_stats(vals) -> dict:
    """mean, p50, p99 as gpuchef's summarize computes them (numpy, linear percentiles)."""
    a = np.asarray([v for v in vals if v is not None and math.isfinite(v)], dtype=np.float64)
    if not len(a):
        return {"mean": NAN, "p50": NAN, "p99": NAN, "n": 0}
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99)), "n": int(len(a))}


def g_stats(vals, weights=None) -> dict:
    """mean, p50, p99 as guidellm computes them: weighted mean, nearest rank on the weighted
    CDF (guidellm/schemas/base/statistics.py ``Percentiles.from_pdf``)."""
    v = np.asarray(vals, dtype=np.float64)
    w = np.ones(len(v)) if weights is None else np.asarray(weights, dtype=np.float64)
    ok = np.isfinite(v) & (w > 0)
    v, w = v[ok], w[ok]
    if not len(v):
        return {"mean": NAN, "p50": NAN, "p99": NAN, "n": 0}
    o = np.argsort(v, kind="stable")
    v, w = v[o], w[o]
    cdf = np.cumsum(w) / w.sum()

    def q(p: float) -> float:
        return float(v[min(int(np.searchsorted(cdf, p, side="left")), len(v) - 1)])

    return {"mean": float((v * w).sum() / w.sum()), "p50": q(0.5), "p99": q(0.99),
            "n": int(len(v))}


def g_report(metrics: dict, key: str, scale: float = 1.0) -> dict:
    """guidellm's own mean / p50 / p99 (successful requests) of one metric."""
    s = metrics[key]["successful"]
    return {"mean": s["mean"] * scale, "p50": s["percentiles"]["p50"] * scale,
            "p99": s["percentiles"]["p99"] * scale, "n": s["count"]}


# -- main ---------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--guidellm", default="/tmp/glv/bin/guidellm")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rate", type=float, default=1.5, help="constant request rate (req/s)")
    ap.add_argument("--num-requests", type=int, default=40)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens-stdev", type=int, default=0)
    ap.add_argument("--prompt-tokens-min", type=int, default=192)
    ap.add_argument("--prompt-tokens-max", type=int, default=320)
    ap.add_argument("--output-tokens", type=int, default=48)
    ap.add_argument("--output-tokens-stdev", type=int, default=10)
    ap.add_argument("--output-tokens-min", type=int, default=32)
    ap.add_argument("--output-tokens-max", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--workers", type=int, default=2,
                    help="guidellm worker processes (GUIDELLM__MAX_WORKER_PROCESSES; its default "
                         "10 is too many for a 2-core machine)")
    ap.add_argument("--server-timeout", type=float, default=120.0)
    ap.add_argument("--out-dir", default=None, help="where guidellm.json, the logs and the "
                    "comparison go (default: a temporary folder)")
    ap.add_argument("--json", default=None, help="the comparison JSON (default OUT_DIR/"
                    "guidellm_vs_gpuchef.json)")
    a = ap.parse_args()

    from gpuchef.engine_host.vocab.tokenizer import load_tokenizer
    from gpuchef.probes.metrics import summarize
    from gpuchef.probes.recorder import read_trace

    tmp = Path(tempfile.mkdtemp(prefix="bench_guidellm-"))
    out = Path(a.out_dir).resolve() if a.out_dir else tmp
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = tmp / "tokenizer"
    tok_dir.mkdir()
    shutil.copy(BUNDLED_TOKENIZER, tok_dir / "tokenizer.json")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    trace_path = tmp / "serve.jsonl"
    g_json = out / "guidellm.json"
    g_log = out / "guidellm.log"

    print(f"starting gpuchef serve ({a.model}, {a.device}) ...", file=sys.stderr, flush=True)
    server, url = start_server(a, trace_path, out / "serve.log")
    clock = ClockSampler()
    try:
        argv = guidellm_argv(a, url, tok_dir, g_json)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   GUIDELLM__MAX_WORKER_PROCESSES=str(a.workers))
        print(f"server {url}; guidellm: {a.num_requests} requests at {a.rate} req/s ...",
              file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with open(g_log, "w") as lf, clock:
            lf.write(f"$ GUIDELLM__MAX_WORKER_PROCESSES={a.workers} " + " ".join(argv) + "\n")
            lf.flush()
            r = subprocess.run(argv, stdout=lf, stderr=subprocess.STDOUT, env=env, cwd=tmp,
                               timeout=max(120.0, 10 * a.num_requests / a.rate))
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise SystemExit(f"guidellm exited {r.returncode}; see {g_log}")
    finally:
        stop_server(server)
        time.sleep(0.2)  # the pump's last lines

    tr = read_trace(trace_path)
    g = json.load(open(g_json))
    bench = g["benchmarks"][0]
    gm = bench["metrics"]
    g_ok = bench["requests"]["successful"]
    g_err = bench["requests"]["errored"]
    g_inc = bench["requests"]["incomplete"]
    s_all = [q for q in tr.requests if q.request_id.startswith("http-")]
    s_done = sorted((q for q in s_all if q.finish_reason != "abort"), key=lambda q: q.arrival_ns)
    g_sorted = sorted(g_ok, key=lambda q: q["info"]["timings"]["request_start"])
    # pair each of guidellm's requests with the trace's first unpaired arrival after its send
    # (on CLOCK_MONOTONIC) whose output length is guidellm's
    pairs, free = [], list(s_done)
    for gq in g_sorted:
        send = clock.to_mono_ns(gq["info"]["timings"]["request_start"])
        cand = [q for q in free if q.output_len == gq["output_tokens"]]
        if not cand:
            continue
        sq = min(cand, key=lambda q: abs(q.arrival_ns - send))
        free.remove(sq)
        pairs.append((gq, sq))
    if not pairs:
        raise SystemExit("no guidellm request pairs with a request of the trace")

    # which output tokens have text: guidellm times only chunks with non-empty "text" (a token
    # that ends mid UTF-8 character, or a special id, streams as "")
    tk = load_tokenizer(a.model, 1 << 30)

    def first_text(ids) -> int | None:
        if not ids:
            return None
        d = tk.decoder()
        return next((i for i, t in enumerate(ids) if d.step(t)), len(ids) - 1)

    # -- per request, on CLOCK_MONOTONIC (ms) --------------------------------------------------
    rows = []
    for gq, sq in pairs:
        t = gq["info"]["timings"]
        mono = {k: clock.to_mono_ns(t[k]) / 1e6 for k in
                ("request_start", "first_token_iteration", "last_token_iteration", "request_end")}
        send, first_c, last_c, end_c = (mono["request_start"], mono["first_token_iteration"],
                                        mono["last_token_iteration"], mono["request_end"])
        tt = sq.token_times_ns
        arr, first_s, last_s = sq.arrival_ns / 1e6, tt[0] / 1e6, tt[-1] / 1e6
        n_g, n = gq["output_tokens"], sq.output_len
        i0 = first_text(sq.output_token_ids)
        rows.append({
            "server_id": sq.request_id, "guidellm_response_id": gq.get("response_id"),
            "g_output_tokens": n_g, "s_output_len": n, "s_token_times": len(tt),
            "g_text_chunks": t["token_iterations"],
            "g_prompt_tokens": gq["prompt_tokens"], "s_prompt_len": sq.prompt_len,
            # guidellm's figures as it reports them (time.time())
            "g_ttft": gq["time_to_first_token_ms"], "g_itl": gq["inter_token_latency_ms"],
            "g_tpot": gq["time_per_output_token_ms"], "g_latency": gq["request_latency"] * 1e3,
            # the same, recomputed on CLOCK_MONOTONIC
            "gm_ttft": first_c - send,
            "gm_itl": (last_c - first_c) / (n_g - 1) if n_g > 1 else NAN,
            "gm_tpot": (last_c - send) / n_g if n_g else NAN,
            "gm_latency": end_c - send,
            # server side
            "s_ttft": sq.ttft_ms, "s_e2el": sq.e2el_ms,
            "s_itl_req": (tt[-1] - tt[0]) / 1e6 / (n - 1) if n > 1 else NAN,
            "s_queue": (sq.first_scheduled_ns - sq.arrival_ns) / 1e6
            if sq.first_scheduled_ns else NAN,
            "s_prefill": (tt[0] - sq.first_scheduled_ns) / 1e6 if sq.first_scheduled_ns else NAN,
            # the pieces between the two
            "send_to_arrival": arr - send,
            "first_token_to_client": first_c - first_s,
            "first_text_token_index": i0,
            "first_text_token_to_client": first_c - tt[i0] / 1e6 if i0 is not None else NAN,
            "last_token_to_client": last_c - last_s,
            "last_token_to_response_end": end_c - last_c,
        })
        r_ = rows[-1]
        r_["ttft_diff"] = r_["gm_ttft"] - r_["s_ttft"]
        r_["latency_diff"] = r_["gm_latency"] - r_["s_e2el"]
        r_["clock_error_ttft"] = r_["g_ttft"] - r_["gm_ttft"]
        r_["clock_error_latency"] = r_["g_latency"] - r_["gm_latency"]

    def col(k):
        return [r[k] for r in rows]

    # -- server-side figures: summarize over the same requests -------------------------------
    same = [sq for _, sq in pairs]
    span_ns = max(q.token_times_ns[-1] for q in same) - min(q.arrival_ns for q in same)
    m = summarize(same, span_ns / 1e9, percentiles=(50.0, 99.0), steps=tr.steps or None)

    def mstat(stem: str) -> dict:
        pc = dict(getattr(m, f"percentiles_{stem}_ms"))
        return {"mean": getattr(m, f"mean_{stem}_ms"), "p50": pc[50.0], "p99": pc[99.0]}

    itl_w = [max(x - 1, 0) for x in col("g_output_tokens")]
    table = {  # name: (guidellm report, guidellm mono, gpuchef)
        "TTFT": (g_report(gm, "time_to_first_token_ms"), np_stats(col("gm_ttft")), mstat("ttft")),
        "ITL (gpuchef: per chunk)": (g_report(gm, "inter_token_latency_ms"),
                                     g_stats(col("gm_itl"), itl_w), mstat("itl")),
        "ITL, guidellm's definition": (g_report(gm, "inter_token_latency_ms"),
                                       g_stats(col("gm_itl"), itl_w),
                                       g_stats(col("s_itl_req"),
                                               [max(x - 1, 0) for x in col("s_output_len")])),
        "TPOT (guidellm's incl. TTFT; vllm's)": (g_report(gm, "time_per_output_token_ms"),
                                                 g_stats(col("gm_tpot"), col("g_output_tokens")),
                                                 mstat("tpot")),
        "request latency / E2EL": (g_report(gm, "request_latency", 1e3),
                                   np_stats(col("gm_latency")), mstat("e2el")),
    }
    comp = {k: {"guidellm_report": gr, "guidellm_mono": gmo, "gpuchef": sv,
                "diff_mono_minus_gpuchef": {s: gmo[s] - sv[s] for s in ("mean", "p50", "p99")}}
            for k, (gr, gmo, sv) in table.items()}
    parts = {k: np_stats(col(k)) for k in
             ("ttft_diff", "latency_diff", "send_to_arrival", "first_token_to_client",
              "first_text_token_to_client", "last_token_to_client", "last_token_to_response_end",
              "s_queue", "s_prefill", "clock_error_ttft", "clock_error_latency")}
    tok = {
        "guidellm_output_tokens_total": int(sum(col("g_output_tokens"))),
        "server_output_len_total": int(sum(col("s_output_len"))),
        "server_token_times_total": int(sum(col("s_token_times"))),
        "per_request_mismatches": [r["server_id"] for r in rows
                                   if r["g_output_tokens"] != r["s_output_len"]],
        "guidellm_text_chunks_total": int(sum(col("g_text_chunks"))),
        "requests_whose_first_token_streams_no_text": [
            r["server_id"] for r in rows if r["first_text_token_index"] not in (0, None)],
        "guidellm_prompt_tokens_total": int(sum(col("g_prompt_tokens"))),
        "server_prompt_len_total": int(sum(col("s_prompt_len"))),
    }
    counts = {"guidellm_successful": len(g_ok), "guidellm_errored": len(g_err),
              "guidellm_incomplete": len(g_inc), "server_requests": len(s_all),
              "server_finish_reasons": {fr: sum(q.finish_reason == fr for q in s_all)
                                        for fr in sorted({q.finish_reason for q in s_all})},
              "paired": len(rows),
              "guidellm_unpaired": len(g_ok) - len(rows),
              "server_requests_not_in_guidellm_results": [
                  {"id": q.request_id,
                   "arrival_s_after_first": (q.arrival_ns - s_done[0].arrival_ns) / 1e9,
                   "output_len": q.output_len, "finish_reason": q.finish_reason}
                  for q in free],
              "guidellm_scheduler_state": {k: bench["scheduler_state"].get(k) for k in (
                  "created_requests", "processing_requests", "processed_requests",
                  "successful_requests", "errored_requests", "cancelled_requests")},
              "pairs_with_arrival_before_send": [r["server_id"] for r in rows
                                                 if r["send_to_arrival"] < 0]}
    errors = [{"error": q["info"].get("error"), "request_args": q.get("request_args")}
              for q in g_err + g_inc][:5]
    result = {
        "config": {"model": a.model, "device": a.device, "rate": a.rate,
                   "num_requests": a.num_requests, "prompt_tokens": a.prompt_tokens,
                   "output_tokens_mean_stdev_min_max": [a.output_tokens, a.output_tokens_stdev,
                                                        a.output_tokens_min, a.output_tokens_max],
                   "guidellm_workers": a.workers,
                   "guidellm_version": g["metadata"]["guidellm_version"],
                   "guidellm_argv": guidellm_argv(a, url, "TOKENIZER_DIR", "guidellm.json"),
                   "wall_s": wall, "loadavg_after": open("/proc/loadavg").read().split()[:3]},
        "clock": clock.summary(),
        "counts": counts, "tokens": tok, "comparison_ms": comp, "per_request_stats_ms": parts,
        "server_run": {"duration_s": m.duration_s, "request_throughput": m.request_throughput,
                       "output_throughput": m.output_throughput, "num_steps": m.num_steps,
                       "mean_step_ms": m.mean_step_ms, "busy_fraction": m.busy_fraction,
                       "num_mixed_steps": m.num_mixed_steps},
        "guidellm_errors": errors, "trace_problems": tr.problems[:10],
        "per_request": rows,
    }

    # -- print ---------------------------------------------------------------------------------
    def f(x):
        return "     n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:8.2f}"

    print(f"guidellm {result['config']['guidellm_version']} vs gpuchef serve ({a.model}, "
          f"{a.device}): {len(rows)} requests at {a.rate} req/s")
    print(f"{'ms':38} {'':4} {'g report':>8} {'g mono':>8} {'gpuchef':>8} {'diff':>8}")
    for k, c in comp.items():
        for s in ("mean", "p50", "p99"):
            print(f"{k if s == 'mean' else '':38} {s:4} {f(c['guidellm_report'][s])} "
                  f"{f(c['guidellm_mono'][s])} {f(c['gpuchef'][s])} "
                  f"{f(c['diff_mono_minus_gpuchef'][s])}")
    print(f"{'per request, paired (ms)':43} {'mean':>8} {'p50':>8} {'p99':>8}")
    for k, p in parts.items():
        print(f"  {k:41} {f(p['mean'])} {f(p['p50'])} {f(p['p99'])}")
    print(f"requests: guidellm ok {counts['guidellm_successful']} / errored "
          f"{counts['guidellm_errored']} / incomplete {counts['guidellm_incomplete']}; server "
          f"{counts['server_requests']} {counts['server_finish_reasons']}")
    print(f"output tokens: guidellm {tok['guidellm_output_tokens_total']}, server "
          f"{tok['server_output_len_total']} (token times {tok['server_token_times_total']}); "
          f"per-request mismatches {len(tok['per_request_mismatches'])}; guidellm text chunks "
          f"{tok['guidellm_text_chunks_total']}; first token without text: "
          f"{len(tok['requests_whose_first_token_streams_no_text'])}")
    print(f"prompt tokens: guidellm {tok['guidellm_prompt_tokens_total']}, server "
          f"{tok['server_prompt_len_total']}")
    sr, ck = result["server_run"], result["clock"]
    print(f"server: {sr['num_steps']} steps, mean step {sr['mean_step_ms']:.2f} ms, busy "
          f"{sr['busy_fraction']:.2f}, {sr['num_mixed_steps']} mixed steps")
    print(f"clock: CLOCK_REALTIME - CLOCK_MONOTONIC moved "
          f"{ck['realtime_minus_monotonic_change_ms']:.1f} ms over {ck['span_s']:.1f} s ({ck['realtime_rate_vs_monotonic_ppm']:.0f} ppm), largest"
          f" step {ck['largest_step_ms']:.1f} ms")
    if free:
        print(f"NOTE: {len(free)} request(s) the server finished are not in guidellm's results: "
              f"{[q['id'] for q in counts['server_requests_not_in_guidellm_results']]} "
              f"(guidellm scheduler state: {counts['guidellm_scheduler_state']})")
    if counts["pairs_with_arrival_before_send"]:
        print(f"WARNING: {len(counts['pairs_with_arrival_before_send'])} pairs arrive before "
              "they were sent: the clock mapping is off there")

    jp = Path(a.json) if a.json else out / "guidellm_vs_gpuchef.json"
    jp.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(f"wrote {jp} ({g_json}, {g_log}, {out / 'serve.log'})", file=sys.stderr)
    if out != tmp:
        shutil.rmtree(tmp, ignore_errors=True)  # the tokenizer folder and the trace


if __name__ == "__main__":
    main()
