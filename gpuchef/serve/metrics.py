"""``/metrics``: the engine's records as Prometheus series, vLLM's names first.

The values come from the records the trace gets — StepRecord, StepOutput, RequestRecord, and
the NVML sampler's GpuSample — fed by the EngineHost's listeners: one source of truth. The
listeners (engine and sampler threads) only append to a deque; the counting happens on the
server's thread (``drain``, at each scrape and a few times a second), so that /metrics costs
the engine thread one append per record.

vLLM names, labels (``model_name``, ``engine``) and bucket boundaries are vLLM V1's
(vllm/v1/metrics/loggers.py) for the families of ``VLLM_METRICS``, a subset of vLLM's
(docs/serve.md lists the ones not exported: a Grafana panel on those stays empty). Deviations:
``vllm:iteration_tokens_total`` counts every token of a step (prefill chunk + decode rows),
which is what vLLM PR #51261 makes it count. A request aborted (client gone, shutdown), queued
or running, is in none of vLLM's per-request series, as in vLLM 0.24 (``probes.metrics.
is_completed`` owns the rule); ``gpuchef:request_aborted_total`` counts it. ``gpuchef:`` series
are what no peer exports: the per-step split by step kind, the knobs in force, aborts, and GPM
saturation per GPU (docs/serve.md).

Beside them, as vLLM's API server exports them: ``process_*`` (prometheus_client's
ProcessCollector) of the server's own process, the same series of the engine's process under
``gpuchef:engine_process_*`` (vLLM's /metrics has its API server's process only), and
``http_requests_total{handler,method,status}`` as prometheus-fastapi-instrumentator counts it
for vLLM (status grouped ``2xx``, ``4xx``, …; handler the route, ``none`` for no route; the
polling routes of ``HTTP_UNCOUNTED`` left out).
"""

from __future__ import annotations

import bisect
import collections
import math
import threading
from typing import Any, Iterable

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from ..engine_host.vocab.config import KNOBS, MODES
from ..engine_host.vocab.records import (STEP_KINDS, EngineEvent, RequestRecord, StepOutput,
                                         StepRecord)
from ..probes.metrics import is_completed
from ..probes.nvml.fields import PROMETHEUS_GAUGES
from ..probes.scrape import GPUCHEF_METRICS, VLLM_METRICS

# vLLM V1's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_N_BUCKETS = (1, 2, 5, 10, 20)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's buckets for per-request token counts (``build_1_2_5_buckets(max_model_len)``):
    1, 2, 5, 10, 20, 50, … up to and including ``max_value`` tokens."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


# gpuchef's step series: step durations from a graphed decode (ms) to a long prefill (s)
STEP_SECONDS_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05,
                        0.075, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
#: the finished_reason labels of vllm:request_success_total ("abort" stays 0, as in vLLM 0.24)
FINISHED_REASONS = ("stop", "length", "abort")
ABORT_REASON = "abort"
#: GpuSample field → gpuchef gauge name (percent unless the name says otherwise): the table of
#: GPU fields' ``prometheus`` column (probes/nvml/fields.py)
GPU_GAUGES = PROMETHEUS_GAUGES
#: routes http_requests_total leaves out: vLLM's instrumentator's excluded handlers (polls and
#: scrapes, which would count themselves)
HTTP_UNCOUNTED = frozenset(("/metrics", "/health", "/load", "/ping", "/version"))
#: the engine process's ProcessCollector namespace: its series are gpuchef:engine_process_*
ENGINE_PROCESS_NAMESPACE = "gpuchef:engine"


class _Hist:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v

    def buckets(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for b, c in zip(self.bounds, self.counts):
            acc += c
            out.append((_fmt(b), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


def _fmt(b: float) -> str:
    return repr(float(b))


class ServeMetrics:
    """Prometheus series over the host's records.

    ``model_name``: the ``model_name`` label (``--served-model-name``). ``max_model_len``
    (tokens) sets the per-request token histograms' buckets (1, 2, 5, 10, … up to it), as in
    vLLM. Listeners to give the
    EngineHost / samplers: ``on_step``, ``on_output``, ``on_request``, ``on_gpu_sample``.
    ``render()`` returns the text exposition (bytes; ``CONTENT_TYPE``). ``state``: a callable
    giving ``EngineHost.state`` (running, waiting, KV used, KV total), read at each scrape so
    that the gauges move when an abort frees KV with no step after it; None = the latest
    StepRecord's.

    ``process``: also export ``process_*`` of this process; ``engine_pid``: also export those of
    the engine's process (``gpuchef:engine_process_*``; None = not). ``count_http`` counts one
    HTTP response for ``http_requests_total`` (the server's thread).
    """

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, model_name: str, engine_label: str = "0",
                 kv_blocks_total: int | None = None, state: Any = None,
                 max_model_len: int = 8192, process: bool = False,
                 engine_pid: int | None = None) -> None:
        self.labels = {"model_name": model_name, "engine": engine_label}
        # () -> EngineHost.state: the gauges after an abort with no step since (KV freed)
        self._state = state
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.kv_used = 0
        self.kv_total = kv_blocks_total or 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        self.errors = 0
        self.aborted = 0
        self.ttft = _Hist(TTFT_BUCKETS)
        self.itl = _Hist(ITL_BUCKETS)
        self.e2e = _Hist(REQUEST_LATENCY_BUCKETS)
        self.queue = _Hist(REQUEST_LATENCY_BUCKETS)
        self.prefill_time = _Hist(REQUEST_LATENCY_BUCKETS)
        self.decode_time = _Hist(REQUEST_LATENCY_BUCKETS)
        self.iteration_tokens = _Hist(ITERATION_TOKEN_BUCKETS)
        tokens = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = _Hist(tokens)
        self.request_generation_tokens = _Hist(tokens)
        self.request_max_generation = _Hist(tokens)
        self.request_max_tokens = _Hist(tokens)
        self.request_n = _Hist(REQUEST_N_BUCKETS)
        self.inference_time = _Hist(REQUEST_LATENCY_BUCKETS)
        self.request_tpot = _Hist(ITL_BUCKETS)
        self.step_seconds = {k: _Hist(STEP_SECONDS_BUCKETS) for k in STEP_KINDS}
        self.step_prefill = {k: _Hist(ITERATION_TOKEN_BUCKETS) for k in STEP_KINDS}
        self.step_decode = {k: _Hist(ITERATION_TOKEN_BUCKETS) for k in STEP_KINDS}
        self.knobs: dict[str, int] = {}
        self.mode = ""
        self.gpu: dict[str, dict[str, float]] = {}
        self._last_token_ns: dict[str, int] = {}
        #: (handler, method, status class "2xx") -> responses
        self.http: dict[tuple[str, str, str], int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        if process:
            ProcessCollector(registry=self.registry)
        if engine_pid is not None:
            ProcessCollector(namespace=ENGINE_PROCESS_NAMESPACE, pid=lambda: engine_pid,
                             registry=self.registry)

    # -- the host's sink and listeners (any thread: one append) ------------------------------
    def record(self, batch: Any) -> None:
        """A loop turn's records (``engine_host.sinks.RecordBatch``): one extend."""
        self._pending.extend(x for x in batch.records if not isinstance(x, EngineEvent))

    def on_step(self, r: StepRecord) -> None:
        self._pending.append(r)

    def on_output(self, o: StepOutput) -> None:
        self._pending.append(o)

    def on_request(self, r: RequestRecord) -> None:
        self._pending.append(r)

    def on_gpu_sample(self, s: Any) -> None:
        if hasattr(s, "gpu") and hasattr(s, "sm_active"):
            self._pending.append(s)

    def count_http(self, handler: str, method: str, status: int) -> None:
        """One HTTP response of ``handler`` (the route, "none" for no route); the routes of
        HTTP_UNCOUNTED are not counted."""
        if handler in HTTP_UNCOUNTED:
            return
        key = (handler, method, f"{status // 100}xx")
        self.http[key] = self.http.get(key, 0) + 1

    def set_scheduler(self, cfg: Any) -> None:
        """The knobs in force before the first step (later ones come with each StepRecord)."""
        self.mode = cfg.mode
        self.knobs = {k: getattr(cfg, k) for k in KNOBS if hasattr(cfg, k)}

    # -- counting (server thread) ------------------------------------------------------------
    def drain(self) -> None:
        with self._lock:
            pend = self._pending
            last = self._last_token_ns
            while pend:
                x = pend.popleft()
                if isinstance(x, StepOutput):
                    t = x.t_ns
                    for rid, _ in x.tokens:
                        prev = last.get(rid)
                        if prev is not None and t > prev:
                            self.itl.observe((t - prev) / 1e9)
                        last[rid] = t
                    self.generation_tokens += len(x.tokens)
                    for _, arrival, plen in x.first_tokens:
                        self.ttft.observe(max(0, t - arrival) / 1e9)
                        self.prompt_tokens += plen
                elif isinstance(x, StepRecord):
                    self._step(x)
                elif isinstance(x, RequestRecord):
                    self._request(x)
                else:
                    self._gpu(x)

    def _step(self, r: StepRecord) -> None:
        self.running, self.waiting = r.num_running, r.num_waiting
        self.kv_used, self.kv_total = r.kv_blocks_used, r.kv_blocks_total
        self.preemptions += r.num_preempted
        self.iteration_tokens.observe(r.num_tokens)
        k = r.kind
        self.step_seconds[k].observe(r.wall_ms / 1e3)
        self.step_prefill[k].observe(r.num_prefill_tokens)
        self.step_decode[k].observe(r.num_decode_reqs)
        self.mode = r.mode
        for name in KNOBS:
            v = getattr(r, name, None)
            if v is not None:
                self.knobs[name] = v

    def _request(self, r: RequestRecord) -> None:
        self._last_token_ns.pop(r.request_id, None)
        if not is_completed(r.finish_reason):  # vLLM records no FinishedRequestStats for it
            if r.finish_reason == ABORT_REASON:
                self.aborted += 1
            else:
                self.errors += 1
            return
        self.success[r.finish_reason] += 1
        # per finished request, as vLLM observes them beside request_success;
        # n is always 1, so the most tokens of its sequences are its tokens
        self.request_prompt_tokens.observe(r.prompt_len)
        self.request_generation_tokens.observe(r.output_len)
        self.request_max_generation.observe(r.output_len)
        self.request_n.observe(1)
        if r.max_tokens:  # vLLM: only when the request has one
            self.request_max_tokens.observe(r.max_tokens)
        t = r.token_times_ns
        if not t:
            return
        self.e2e.observe(max(0, t[-1] - r.arrival_ns) / 1e9)
        if r.first_scheduled_ns:
            self.queue.observe(max(0, r.first_scheduled_ns - r.arrival_ns) / 1e9)
            self.prefill_time.observe(max(0, t[0] - r.first_scheduled_ns) / 1e9)
            self.inference_time.observe(max(0, t[-1] - r.first_scheduled_ns) / 1e9)
        self.decode_time.observe(max(0, t[-1] - t[0]) / 1e9)
        # vLLM: decode time / (tokens - 1), 0 for a one-token request
        self.request_tpot.observe(
            max(0, t[-1] - t[0]) / 1e9 / (len(t) - 1) if len(t) > 1 else 0.0)

    def _gpu(self, s: Any) -> None:
        g = self.gpu.setdefault(str(s.gpu), {})
        for f in GPU_GAUGES:
            v = getattr(s, f, None)
            if v is not None and v == v:  # None = not read; NaN = a GPM window not computed
                g[f] = float(v)

    # -- exposition --------------------------------------------------------------------------
    def render(self) -> bytes:
        from prometheus_client.exposition import generate_latest

        self.drain()
        return generate_latest(self.registry)

    def collect(self):  # prometheus_client's Collector protocol
        st = self._state() if self._state is not None else None
        with self._lock:
            if st is not None:
                self.running, self.waiting, self.kv_used, self.kv_total = st
            yield from self._families()

    def _families(self):
        L = self.labels
        names, values = list(L), list(L.values())

        def gauge(name: str, doc: str, v: float, extra: dict[str, str] | None = None):
            extra = extra or {}
            g = GaugeMetricFamily(name, doc, labels=names + list(extra))
            g.add_metric(values + list(extra.values()), v)
            return g

        def counter(name: str, doc: str, v: float):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, v)
            return c

        def hist(name: str, doc: str, h: _Hist | dict[str, _Hist], label: str | None = None):
            f = HistogramMetricFamily(name, doc, labels=names + ([label] if label else []))
            for key, hh in (h.items() if isinstance(h, dict) else [(None, h)]):
                f.add_metric(values + ([key] if label else []), hh.buckets(), hh.sum)
            return f

        V, G = VLLM_METRICS, GPUCHEF_METRICS
        # prometheus-fastapi-instrumentator's series and help, as vLLM exports it
        http = CounterMetricFamily("http_requests", "Total number of requests by method, "
                                   "status and handler.", labels=["handler", "method", "status"])
        for key, n in sorted(self.http.items()):
            http.add_metric(list(key), n)
        yield http
        yield gauge(V["running"].name, V["running"].help, self.running)
        yield gauge(V["waiting"].name, V["waiting"].help, self.waiting)
        yield gauge(V["kv_usage"].name, V["kv_usage"].help,
                    self.kv_used / self.kv_total if self.kv_total else 0.0)
        yield counter(V["preemptions"].name, V["preemptions"].help, self.preemptions)
        yield counter(V["prompt_tokens"].name, V["prompt_tokens"].help, self.prompt_tokens)
        yield counter(V["generation_tokens"].name, V["generation_tokens"].help,
                      self.generation_tokens)
        c = CounterMetricFamily(V["requests_finished"].name, V["requests_finished"].help,
                                labels=names + ["finished_reason"])
        for reason, n in self.success.items():
            c.add_metric(values + [reason], n)
        yield c
        for key, h in (("ttft", self.ttft), ("itl", self.itl), ("e2e", self.e2e),
                       ("queue_time", self.queue), ("prefill_time", self.prefill_time),
                       ("decode_time", self.decode_time),
                       ("inference_time", self.inference_time),
                       ("request_tpot", self.request_tpot),
                       ("request_prompt_tokens", self.request_prompt_tokens),
                       ("request_generation_tokens", self.request_generation_tokens),
                       ("request_max_num_generation_tokens", self.request_max_generation),
                       ("request_params_n", self.request_n),
                       ("request_params_max_tokens", self.request_max_tokens),
                       ("iteration_tokens", self.iteration_tokens)):
            yield hist(V[key].name, V[key].help, h)
        # gpuchef's own
        yield counter("gpuchef:request_errors", "Requests refused by the engine (bad prompt, too "
                      "long for the KV cache).", self.errors)
        yield counter("gpuchef:request_aborted", "Requests aborted before they finished (client "
                      "gone, shutdown), queued or running; vLLM's per-request series leave them "
                      "out.", self.aborted)
        for key, h in (("step_duration", self.step_seconds), ("step_prefill_tokens",
                                                              self.step_prefill),
                       ("step_decode_rows", self.step_decode)):
            yield hist(G[key].name, G[key].help, h, "step_kind")
        m = GaugeMetricFamily("gpuchef:scheduler_mode", "The scheduler mode in force (1 for the "
                              "mode named).", labels=names + ["mode"])
        for mode in MODES:
            m.add_metric(values + [mode], 1.0 if mode == self.mode else 0.0)
        yield m
        for name, v in self.knobs.items():
            yield gauge(f"gpuchef:{name}", KNOBS[name].help, v)
        for field, metric in GPU_GAUGES.items():
            g = GaugeMetricFamily(metric, f"GPU {field} (NVML/GPM, latest sample).",
                                  labels=names + ["gpu"])
            for gpu, vals in self.gpu.items():
                if field in vals and math.isfinite(vals[field]):
                    g.add_metric(values + [gpu], vals[field])
            yield g
