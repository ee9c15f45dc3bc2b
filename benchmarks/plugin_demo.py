"""A stand-in vLLM front end for drawing `gpuchef top --attach URL --plugin HOST:PORT` on a
machine without vLLM (benchmarks/make_attach_screenshot.py --plugin-demo).

``DemoVllm(engines=2)`` runs, in one thread, a simulated chunked-prefill scheduler per
data-parallel engine (Poisson arrivals, a 512-token budget, one decode token per running request
a step, a step time that grows with the tokens scheduled) and hands each step's output to
gpuchef's real plugin (``gpuchef.vllm_plugin``, ``GPUCHEF_PUBLISH`` on a free loopback port)
through the fake vLLM 0.24 host of tests/gpuchef/test_vllm_plugin.py, with vLLM-shaped
``SchedulerStats`` (``--cudagraph-metrics`` on) and ``IterationStats``. The same simulation's
counters, gauges and histograms are served on ``/metrics`` under vLLM's names (and
``/v1/models``), so every panel of the attach screen reads one made-up server. ``url``: its base
URL; ``plugin``: the plugin's ``HOST:PORT``.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "gpuchef"))
from synthetic_feed import chunk_prefills  # noqa: E402
from test_vllm_plugin import (CUDAGraphStat, EngineCoreOutputs, FakeHost,  # noqa: E402
                              FinishedRequestStats, IterationStats, PromptTokenStats,
                              SchedulerStats)

BUDGET = 512
MAX_SEQS = 48
KV_TOKENS = 60_000
ITER_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


@dataclass
class _Req:
    arrival: float
    prompt: int
    out: int
    prefilled: int = 0
    made: int = 0
    last: float = 0.0


class _Hist:
    def __init__(self, bounds) -> None:
        self.bounds, self.counts, self.sum, self.n = bounds, [0] * len(bounds), 0.0, 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.n += 1
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1

    def text(self, name: str) -> list[str]:
        out = [f"# TYPE {name} histogram"]
        out += [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.bounds, self.counts)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.sum}",
                      f"{name}_count {self.n}"]


class _Engine:
    """One engine's simulated scheduler; :meth:`step` runs a step at ``now`` (monotonic s) and
    returns its output and how long it took, or None when there is nothing to run."""

    def __init__(self, idx: int, rate: float, rng: random.Random) -> None:
        self.idx, self.rate, self.rng = idx, rate, rng
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.next_arrival = time.monotonic() + rng.expovariate(rate)

    def step(self, now: float, m: "DemoVllm"):
        while self.next_arrival <= now:
            self.waiting.append(_Req(self.next_arrival, max(32, int(self.rng.lognormvariate(
                6.2, 0.6))), max(4, int(self.rng.expovariate(1 / 120)))))
            self.next_arrival += self.rng.expovariate(self.rate)
        if not self.running and not self.waiting:
            return None
        dec = [q for q in self.running if q.prefilled >= q.prompt]
        left, first = BUDGET - len(dec), []
        while self.waiting and len(self.running) < MAX_SEQS:
            self.running.append(self.waiting.pop(0))
        for q, c in chunk_prefills(self.running, left):
            left -= c
            if q.prefilled >= q.prompt:
                first.append(q)
        it = IterationStats()
        it.inter_token_latencies_iter = [now - q.last for q in dec]
        it.time_to_first_tokens_iter = [now - q.arrival for q in first]
        it.prompt_token_stats = PromptTokenStats(computed=sum(q.prompt for q in first),
                                                 total=sum(q.prompt for q in first))
        it.num_generation_tokens = len(dec) + len(first)
        for q in dec + first:
            q.made, q.last = q.made + 1, now
        done = [q for q in self.running if q.made >= q.out]
        it.finished_requests = [FinishedRequestStats("length") for _ in done]
        self.running = [q for q in self.running if q.made < q.out]
        scheduled = BUDGET - left if left < BUDGET else len(dec)
        kv = min(1.0, sum(q.prefilled + q.made for q in self.running) / KV_TOKENS)
        sched = SchedulerStats(num_running_reqs=len(self.running),
                               num_waiting_reqs=len(self.waiting), kv_cache_usage=kv,
                               cudagraph_stats=CUDAGraphStat(
                                   scheduled, scheduled, 0,
                                   "FULL" if scheduled == len(dec) else "PIECEWISE"))
        m.observe(self.idx, it, scheduled, sched)
        step_s = 0.006 + 0.000035 * scheduled + self.rng.uniform(0, 0.002)
        return EngineCoreOutputs(self.idx, it.num_generation_tokens, sched), it, step_s


class DemoVllm:
    """See the module docstring. ``with DemoVllm() as d: ...; d.start()``."""

    def __init__(self, engines: int = 2, rates=(9.0, 6.0), seed: int = 1) -> None:
        os.environ["GPUCHEF_PUBLISH"] = "127.0.0.1:0"
        self.host = FakeHost(_plugin_class(), list(range(engines)))
        self.plugin = self.host.instances[0].endpoint.removeprefix("tcp://")
        rng = random.Random(seed)
        self.engines = [_Engine(i, rates[i % len(rates)], rng) for i in range(engines)]
        self.lock = threading.Lock()
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "request_success": 0}
        self.gauges: dict[int, tuple[int, int, float]] = {}
        self.hists = {"iteration_tokens_total": _Hist(ITER_BUCKETS),
                      "time_to_first_token_seconds": _Hist(TTFT_BUCKETS),
                      "inter_token_latency_seconds": _Hist(ITL_BUCKETS)}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self, idx: int, it, scheduled: int, sched) -> None:
        with self.lock:
            self.counters["prompt_tokens"] += it.num_prompt_tokens
            self.counters["generation_tokens"] += it.num_generation_tokens
            self.counters["request_success"] += len(it.finished_requests)
            self.gauges[idx] = (sched.num_running_reqs, sched.num_waiting_reqs,
                                sched.kv_cache_usage)
            self.hists["iteration_tokens_total"].observe(scheduled)
            for v in it.time_to_first_tokens_iter:
                self.hists["time_to_first_token_seconds"].observe(v)
            for v in it.inter_token_latencies_iter:
                self.hists["inter_token_latency_seconds"].observe(v)

    def metrics_text(self) -> str:
        with self.lock:
            out = []
            for k, (name, pos) in enumerate((("num_requests_running", 0),
                                             ("num_requests_waiting", 1),
                                             ("kv_cache_usage_perc", 2))):
                out.append(f"# TYPE vllm:{name} gauge")
                out += [f'vllm:{name}{{engine="{e}"}} {g[pos]}' for e, g in self.gauges.items()]
            for name, v in self.counters.items():
                out += [f"# TYPE vllm:{name} counter", f"vllm:{name}_total {v}"]
            for name, h in self.hists.items():
                out += h.text(f"vllm:{name}")
        return "\n".join(out) + "\n"

    def _run(self) -> None:
        due = [time.monotonic()] * len(self.engines)
        while not self._stop.is_set():
            k = min(range(len(due)), key=due.__getitem__)
            time.sleep(max(0.0, due[k] - time.monotonic()))
            now = time.monotonic()
            got = self.engines[k].step(now, self)
            if got is None:
                due[k] = max(now, self.engines[k].next_arrival)
                continue
            out, it, step_s = got
            self.host.output(out, it)
            due[k] = now + step_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="demo-vllm", daemon=True)
        self._thread.start()

    # -- /metrics and /v1/models on a free loopback port ---------------------------------------
    async def _metrics(self, request):
        return web.Response(text=self.metrics_text())

    async def _models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": "demo (stand-in, made-up numbers)", "object": "model",
             "max_model_len": 8192}]})

    def __enter__(self) -> "DemoVllm":
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            self.loop.run_until_complete(web.SockSite(self.runner, sock).start())
            ready.set()
            self.loop.run_forever()

        self.server = threading.Thread(target=serve, daemon=True)
        self.server.start()
        ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.host.close()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.server.join(10)


def _plugin_class():
    import gpuchef.vllm_plugin as plugin_pkg

    return plugin_pkg.GpuchefStatLogger
