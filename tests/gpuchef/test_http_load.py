"""The HTTP load client (`gpuchef bench --base-url`) against a fake OpenAI-compatible streaming
server written here with aiohttp.web on 127.0.0.1 (a free port, its own thread and event loop).

The fake server sleeps known times between chunks and logs, on the same monotonic clock as the
client, when it received each request and when it wrote each chunk: the client's TTFT/ITL/E2EL
are checked against those logs (an independent reference) and against vLLM's formulas applied
by hand to the client's raw chunk times.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import numpy as np
import pytest
from aiohttp import web
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.client.http_load import (HttpLoadConfig, apply_ramp_up, error_counts, error_lines,
                                      normalize_base_url, ramp_up_rate, request_body,
                                      result_arrays, run_http_load, to_request_records)
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.workload import RequestSpec
from gpuchef.probes.metrics import format_results_block, summarize

_register()


class FakeServer:
    """A streaming /v1/completions and /v1/chat/completions on 127.0.0.1.

    Each request streams ``ceil(max_tokens / tokens_per_chunk)`` chunks: the first after
    ``ttft_s``, the rest ``itl_s`` apart, then (when asked) a usage chunk and ``data: [DONE]``.
    ``plan`` maps a request id (the x-request-id header) to a behaviour: "500", "400",
    "cut" (the connection is closed after 2 chunks), "nodone" (the stream ends cleanly without
    [DONE]), "sleep" (never answers in time), "streamerror" (an error event), "garbage" (not
    JSON), "empty" (a comment and [DONE], no token), "json" (a plain JSON body, no stream).
    ``log[request_id]`` = (receive ns, [ns just before each chunk's write]).
    """

    def __init__(self, *, ttft_s=0.0, itl_s=0.0, tokens_per_chunk=1, models=("fake-model",),
                 model_info=None, api_key=None):
        self.ttft_s, self.itl_s, self.tpc = ttft_s, itl_s, tokens_per_chunk
        self.models = list(models)
        self.model_info = model_info or {}
        self.api_key = api_key
        self.plan: dict[str, str] = {}
        self.log: dict[str, tuple[int, list[int]]] = {}
        self.bodies: dict[str, dict] = {}
        self.active = 0
        self.max_active = 0
        self.n_requests = 0

    # -- lifecycle
    def start(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self):
        app = web.Application()
        app.router.add_get("/v1/models", self.models_handler)
        app.router.add_post("/v1/completions", self.handler)
        app.router.add_post("/v1/chat/completions", self.handler)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    # -- handlers
    async def models_handler(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "root": m, **self.model_info} for m in self.models]})

    async def handler(self, request):
        t_recv = time.monotonic_ns()
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key", "type": "auth",
                                                "param": None, "code": 401}}, status=401)
        rid = request.headers.get("x-request-id", "")
        body = await request.json()
        self.bodies[rid] = body
        self.n_requests += 1
        what = self.plan.get(rid, "")
        if what == "500":
            return web.Response(status=500, text="boom")
        if what == "400":
            return web.json_response({"error": {"message": "max_tokens must be >= 1",
                                                "type": "BadRequestError", "param": "max_tokens",
                                                "code": 400}}, status=400)
        if what == "json":
            return web.json_response({"choices": [{"text": "x"}], "usage": {}})
        chat = request.path.endswith("chat/completions")
        n_tok = body.get("max_completion_tokens" if chat else "max_tokens")
        cont = bool(body.get("stream_options", {}).get("continuous_usage_stats"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        writes: list[int] = []
        self.log[rid] = (t_recv, writes)
        try:
            await resp.prepare(request)
            if what == "sleep":
                await asyncio.sleep(5)
            if what == "streamerror":
                await resp.write(b'data: {"error": {"message": "engine died", "code": 500}}\n\n')
                return resp
            if what == "garbage":
                await resp.write(b"data: {not json\n\n")
                return resp
            if what == "empty":
                await resp.write(b": ping\n\ndata: [DONE]\n\n")
                return resp
            sent = 0
            i = 0
            while sent < n_tok:
                await asyncio.sleep(self.ttft_s if i == 0 else self.itl_s)
                k = min(self.tpc, n_tok - sent)
                sent += k
                c = {"index": 0, "finish_reason": "length" if sent == n_tok else None}
                if chat:
                    c["delta"] = {"content": "x" * k}
                else:
                    c["text"] = "x" * k
                chunk = {"id": rid, "object": "text_completion", "choices": [c]}
                if cont:
                    chunk["usage"] = {"prompt_tokens": 7, "completion_tokens": sent,
                                      "total_tokens": 7 + sent}
                writes.append(time.monotonic_ns())  # before the write: the client reads after it
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                i += 1
                if what == "cut" and i == 2:
                    request.transport.close()
                    return resp
            if what == "nodone":
                await resp.write_eof()
                return resp
            if body.get("stream_options", {}).get("include_usage"):
                u = {"prompt_tokens": 7, "completion_tokens": sent, "total_tokens": 7 + sent}
                await resp.write(b"data: " + json.dumps({"choices": [], "usage": u}).encode()
                                 + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.active -= 1


@pytest.fixture
def server(request):
    kw = getattr(request, "param", {})
    s = FakeServer(**kw).start()
    yield s
    s.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def specs(n, *, rate=None, out=4, prompt=5, probes=()):
    gap = 0.0 if rate is None else 1.0 / rate
    sp = [RequestSpec(f"req-{i}", i * gap, tuple(range(10, 10 + prompt)), out) for i in range(n)]
    sp += [RequestSpec(f"probe-{k}", t, (11, 12), 1, True) for k, t in enumerate(probes)]
    return sorted(sp, key=lambda s: s.arrival_s)


def cfg_for(s, **kw):
    return HttpLoadConfig(base_url=s.url, model="fake-model", **kw)


# ---------------------------------------------------------------------------------------------
# timing


@pytest.mark.parametrize("server", [{"ttft_s": 0.08, "itl_s": 0.03}], indirect=True)
def test_metrics_match_the_servers_known_timings(server):
    run = run_http_load(specs(4, rate=20, out=5), cfg_for(server))
    assert all(r.success for r in run.results), [r.error for r in run.results]
    recs = to_request_records(run.results)
    m = summarize(recs, run.duration_s, percentiles=(50, 99))
    # vLLM's formulas by hand on the raw chunk times (endpoint_request_func.py, serve.py)
    ttft, itl, e2el, tpot = [], [], [], []
    for r in run.results:
        t = np.asarray(r.chunk_times_ns) / 1e6
        st = r.start_ns / 1e6
        ttft.append(t[0] - st)
        e2el.append(t[-1] - st)
        itl += list(np.diff(t))
        tpot.append((t[-1] - t[0]) / (r.output_tokens - 1))
    assert m.completed == 4 and m.total_output == 20 and m.total_input == 4 * 7  # usage's 7
    assert m.mean_ttft_ms == pytest.approx(np.mean(ttft))
    assert m.median_itl_ms == pytest.approx(np.median(itl))
    assert m.mean_e2el_ms == pytest.approx(np.mean(e2el))
    assert m.mean_tpot_ms == pytest.approx(np.mean(tpot))
    # and against the server's own clock: the client sees each chunk just after it was written
    lags = []
    for r in run.results:
        recv, writes = server.log[r.request_id]
        assert len(writes) == len(r.chunk_times_ns) == 5
        lag = np.asarray(r.chunk_times_ns) - np.asarray(writes)
        assert (lag >= 0).all(), lag  # never before the server wrote it
        lags += list(lag)
        assert recv >= r.start_ns
    # a loaded 2-core CI machine can hold one chunk back (122 ms seen once): the typical lag is
    # what tells a client that timestamps late from one that does not
    assert np.median(lags) < 20e6 and np.percentile(lags, 90) < 50e6, sorted(lags)
    # and the sleeps the server was told to make (timers fire late, never early)
    assert 80 <= m.median_ttft_ms < 80 + 60
    assert 30 <= m.median_itl_ms < 30 + 40
    assert m.mean_tpot_ms == pytest.approx(m.mean_itl_ms, rel=0.05)


@pytest.mark.parametrize("server", [{"itl_s": 0.02, "tokens_per_chunk": 3}], indirect=True)
def test_multi_token_chunks_are_one_itl_each_with_their_count(server):
    run = run_http_load(specs(3, out=8), cfg_for(server))
    res = run.results
    assert all(r.success for r in res)
    for r in res:
        assert r.chunk_tokens == [3, 3, 2] and r.output_tokens == 8
        assert len(r.itls_s) == 2  # one per chunk after the first, no zeros
    recs = to_request_records(res)
    assert [len(x.token_times_ns) for x in recs] == [8, 8, 8]
    m = summarize(recs, run.duration_s)
    all_itls = [x * 1e3 for r in res for x in r.itls_s]
    assert min(all_itls) > 10  # 20 ms sleeps: no silent zero among them
    assert m.median_itl_ms == pytest.approx(float(np.median(all_itls)))
    r = res[0]
    assert m.total_output == 24
    tpot0 = (r.latency_s - r.ttft_s) / 7 * 1e3
    assert recs[0].e2el_ms == pytest.approx(r.latency_s * 1e3, abs=1e-3)
    assert tpot0 == pytest.approx((recs[0].e2el_ms - recs[0].ttft_ms) / 7)
    arr = result_arrays(res)
    assert arr["chunk_tokens"][0] == [3, 3, 2] and arr["output_lens"] == [8, 8, 8]


def test_without_continuous_usage_a_chunk_counts_one_and_usage_gives_the_total(server):
    server.tpc = 2
    run = run_http_load(specs(2, out=6), cfg_for(server, continuous_usage=False))
    r = run.results[0]
    assert r.success and r.chunk_tokens == [1, 1, 1] and r.output_tokens == 6
    rec = to_request_records([r])[0]
    assert rec.output_len == 6 and len(rec.itls_ms) == 2


# ---------------------------------------------------------------------------------------------
# failures


@pytest.mark.parametrize("server", [{"itl_s": 0.01}], indirect=True)
def test_errors_are_counted_by_kind_and_the_run_goes_on(server):
    server.plan = {"req-1": "500", "req-2": "400", "req-3": "cut", "req-4": "nodone",
                   "req-6": "500"}
    run = run_http_load(specs(8, rate=100, out=4), cfg_for(server))
    by_id = {r.request_id: r for r in run.results}
    assert by_id["req-1"].error_kind == "http" and by_id["req-1"].status == 500
    assert by_id["req-2"].error_kind == "http" and "max_tokens must be >= 1" in by_id["req-2"].error
    assert by_id["req-3"].error_kind == "stream_cut"
    assert by_id["req-4"].error_kind == "stream_cut"
    for ok in ("req-0", "req-5", "req-7"):
        assert by_id[ok].success, by_id[ok].error
    assert error_counts(run.results) == {"HTTP 400": 1, "HTTP 500": 2,
                                         "stream closed early (no [DONE])": 2}
    lines = error_lines(run.results)
    assert len(lines) == 3 and "Traceback" not in "\n".join(lines)
    m = summarize(to_request_records(run.results), run.duration_s)
    assert (m.completed, m.failed) == (3, 5) and m.total_output == 12


def test_broken_streams_are_counted_by_kind(server):
    server.plan = {"req-0": "streamerror", "req-1": "garbage", "req-2": "empty", "req-3": "json"}
    run = run_http_load(specs(5), cfg_for(server))
    kinds = [r.error_kind for r in run.results]
    assert kinds == ["stream_error", "bad_stream", "no_token", "bad_stream", ""]
    assert "engine died" in run.results[0].error and "not an SSE stream" in run.results[3].error
    assert len(error_lines(run.results)) == 3


def test_connection_refused_is_counted_not_raised():
    cfg = HttpLoadConfig(base_url=f"http://127.0.0.1:{free_port()}", model="m")
    run = run_http_load(specs(3), cfg)
    assert [r.error_kind for r in run.results] == ["refused"] * 3
    assert error_lines(run.results)[0].startswith("3 requests: connection refused")


def test_a_request_past_the_timeout_is_counted(server):
    server.plan = {"req-0": "sleep"}
    run = run_http_load(specs(2), cfg_for(server, request_timeout_s=0.5))
    assert run.results[0].error_kind == "timeout" and run.results[1].success


# ---------------------------------------------------------------------------------------------
# concurrency and arrivals


@pytest.mark.parametrize("server", [{"ttft_s": 0.05, "itl_s": 0.01}], indirect=True)
def test_max_concurrency_is_respected_and_reached(server):
    run = run_http_load(specs(12, out=3), cfg_for(server, max_concurrency=3))
    assert all(r.success for r in run.results)
    assert server.max_active == 3
    assert max(r.queue_time_s for r in run.results) > 0.05  # later ones waited for a slot


@pytest.mark.parametrize("server", [{"ttft_s": 0.05, "itl_s": 0.01}], indirect=True)
def test_probes_bypass_max_concurrency(server):
    run = run_http_load(specs(4, out=3, probes=(0.0,)), cfg_for(server, max_concurrency=1))
    assert server.max_active == 2
    probe = next(r for r in run.results if r.is_probe)
    assert probe.success and probe.queue_time_s < 0.03


@pytest.mark.slow  # 10 s of arrivals
def test_arrivals_keep_to_absolute_time_over_2000_requests_at_200_per_s(server):
    sp = specs(2000, rate=200, out=1)
    run = run_http_load(sp, cfg_for(server))
    assert sum(r.success for r in run.results) == 2000
    late = np.array([r.lateness_ms for r in run.results])
    # a client that slept one gap after each send would drift by its per-request cost x 2000
    first, last = np.median(late[:200]), np.median(late[-200:])
    assert last - first < 3.0, (first, last)
    # (one-sided: a busy shared machine can make the first seconds late, never the drift
    # negative; a drifting client grows by ~its cost per request x 200 per s, ~50 ms/s)
    slope_ms_per_s = np.polyfit([s.arrival_s for s in sp], late, 1)[0]
    assert slope_ms_per_s < 0.5
    assert np.percentile(late, 50) < 5.0
    # the last request left when it was due, ~9.995 s after the first: within 20 ms, plus that
    # one request's own stall beyond its neighbours' (a loaded 2-core machine can hold one send
    # for tens of ms; a drift would move the neighbours too, which the median checks above see)
    span = (run.results[-1].dispatch_ns - run.results[0].dispatch_ns) / 1e9
    stall_s = max(0.0, late[-1] - np.median(late[-200:])) / 1e3
    assert span == pytest.approx(sp[-1].arrival_s, abs=0.02 + stall_s)


def test_ramp_up_rates_and_arrivals_follow_vllm():
    assert ramp_up_rate("linear", 2, 10, 0, 5) == 2 and ramp_up_rate("linear", 2, 10, 4, 5) == 10
    assert ramp_up_rate("exponential", 1, 16, 2, 5) == pytest.approx(4.0)
    sp = apply_ramp_up(specs(400), "linear", 10, 100, burstiness=float("inf"),
                       arrival="poisson", seed=0)
    gaps = np.diff([0.0] + [s.arrival_s for s in sp])
    assert gaps[0] == pytest.approx(1 / 10) and gaps[-1] == pytest.approx(1 / 100)
    assert np.all(np.diff(gaps) <= 1e-12)  # the rate only rises
    a = apply_ramp_up(specs(50), "exponential", 1, 20, burstiness=1.0, arrival="poisson", seed=3)
    b = apply_ramp_up(specs(50), "exponential", 1, 20, burstiness=1.0, arrival="poisson", seed=3)
    assert a == b


# ---------------------------------------------------------------------------------------------
# requests, config


def test_request_body_is_vllms(server):
    run_http_load(specs(1, out=3), cfg_for(server))
    b = server.bodies["req-0"]
    assert b["prompt"] == [10, 11, 12, 13, 14] and b["max_tokens"] == 3
    assert b["stream"] is True and b["ignore_eos"] is True and b["model"] == "fake-model"
    assert b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    # greedy unless asked, as vllm bench serve sends it (a server's own default is 1)
    assert b["temperature"] == 0.0 and "top_p" not in b and "top_k" not in b
    cfg = HttpLoadConfig(base_url=server.url, model="m", temperature=0.7, top_p=0.9, top_k=20)
    sent = json.loads(request_body(specs(1)[0], cfg))
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.7, 0.9, 20)
    cfg = HttpLoadConfig(base_url=server.url, endpoint="/v1/chat/completions", model="m")
    chat = json.loads(request_body(specs(1)[0], cfg, tok=_ToyTok()))
    assert chat["messages"][0]["role"] == "user" and chat["max_completion_tokens"] == 4


class _ToyTok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"t{i}" for i in ids)

    def encode(self, text, add_special_tokens=False):
        class E:
            ids = [int(w[1:]) for w in text.split()]
        return E()


@pytest.mark.parametrize("url,want", [("http://h:8000/v1", "http://h:8000"),
                                      ("http://h:8000/", "http://h:8000"),
                                      ("https://h/p/v1/", "https://h/p")])
def test_base_url_is_normalised(url, want):
    assert normalize_base_url(url) == want


@pytest.mark.parametrize("kw,msg", [({"base_url": "ftp://h"}, "must be http"),
                                    ({"base_url": "http://h:99999"}, "is not a URL"),
                                    ({"base_url": "http://h", "endpoint": "/v1/embeddings"},
                                     "is not one of"),
                                    ({"base_url": "http://h", "max_concurrency": 0}, ">= 1"),
                                    ({"base_url": "http://h", "request_timeout_s": 0}, "> 0"),
                                    ({"base_url": "http://h", "temperature": -1},
                                     "--temperature -1 must be a number >= 0"),
                                    ({"base_url": "http://h", "top_p": 1.5},
                                     "--top-p 1.5 is out of range"),
                                    ({"base_url": "http://h", "top_k": -2},
                                     "--top-k -2 must be an integer >= 1")])
def test_bad_config_is_one_clear_error(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        HttpLoadConfig(**kw)


# ---------------------------------------------------------------------------------------------
# the command


def bench(args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


@pytest.mark.parametrize("server", [{"itl_s": 0.002, "model_info": {"max_model_len": 512,
                                                                    "vocab_size": 4096}}],
                         indirect=True)
def test_bench_base_url_prints_the_block_and_writes_vllms_keys(server, tmp_path):
    server.plan = {"req-2": "500"}
    out = tmp_path / "r.json"
    r = bench(["--base-url", server.url + "/v1", "--dataset", "azure-conv", "--num-prompts", "6",
               "--max-output-len", "5", "--trace-speed", "50", "--probe-interval", "0.05",
               "--max-concurrency", "4", "--goodput", "ttft:5000", "--result-json", str(out)])
    assert r.exit_code == 0, r.output
    assert "Successful requests:                     5" in r.output
    assert "Failed requests:                         1" in r.output
    assert "Maximum request concurrency:             4" in r.output
    assert "Engine steps" not in r.output and "Traceback" not in r.output
    assert "1 request: HTTP 500" in r.output
    d = json.loads(out.read_text())
    for k in ("date", "backend", "model_id", "num_prompts", "request_rate", "burstiness",
              "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
              "total_output_tokens", "request_throughput", "request_goodput",
              "output_throughput", "total_token_throughput", "input_lens", "output_lens",
              "ttfts", "itls", "latencies", "start_times", "queue_times", "generated_texts",
              "errors", "max_output_tokens_per_s", "max_concurrent_requests", "mean_ttft_ms",
              "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
              "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms",
              "median_e2el_ms", "p99_e2el_ms", "probe_completed", "lateness_p99_ms"):
        assert k in d, k
    assert d["completed"] == 5 and d["failed"] == 1 and d["max_concurrency"] == 4
    assert d["model_id"] == "fake-model" and d["num_prompts"] == 6
    assert len(d["ttfts"]) == len(d["itls"]) == len(d["errors"]) == 6
    assert d["errors"][2].startswith("HTTP 500") and d["output_lens"][2] == 0
    assert d["total_output_tokens"] == sum(d["output_lens"])
    assert d["error_counts"] == {"HTTP 500": 1}
    assert "num_steps" not in d
    assert d["probe_completed"] >= 1
    # forced lengths reached the server as max_tokens + ignore_eos
    assert all(b["max_tokens"] <= 5 and b["ignore_eos"] for b in server.bodies.values())
    # the server's vocab_size bounds the prompt ids; its max_model_len clips the load
    loads = [b for rid, b in server.bodies.items() if rid.startswith("req-")]
    assert max(max(b["prompt"]) for b in loads) < 4096
    assert max(len(b["prompt"]) + b["max_tokens"] for b in loads) == 512  # trace prompts > 512


def test_bench_base_url_refuses_engine_flags_and_http_flags_alone(server):
    r = bench(["--base-url", server.url, "--mode", "continuous", "--device", "cpu",
               "--vocab-size", "100"])
    assert r.exit_code == 2 and "--device, --mode do not apply with --base-url" in r.output
    r = bench(["--max-concurrency", "4", "--device", "cpu"])
    assert r.exit_code == 2 and "--max-concurrency needs --base-url" in r.output
    r = bench(["--temperature", "0.8", "--device", "cpu"])
    assert r.exit_code == 2 and "--temperature needs --base-url" in r.output
    r = bench(["--base-url", server.url, "--cudagraph-mode", "FULL_DECODE_ONLY",
               "--cudagraph-capture-sizes", "16", "--vocab-size", "100"])
    assert r.exit_code == 2 and ("--cudagraph-mode, --cudagraph-capture-sizes do not apply "
                                 "with --base-url") in r.output


def test_bench_base_url_one_line_for_bad_input(server):
    r = bench(["--base-url", server.url, "--num-prompts", "2"])  # no vocab size anywhere
    assert r.exit_code == 2 and "--vocab-size" in r.output and "Traceback" not in r.output
    r = bench(["--base-url", server.url, "--model", "other", "--vocab-size", "100"])
    assert r.exit_code == 2 and "not served" in r.output and "fake-model" in r.output
    r = bench(["--base-url", server.url, "--endpoint", "/v1/chat/completions"])
    assert r.exit_code == 2 and "--tokenizer" in r.output
    r = bench(["--base-url", server.url, "--vocab-size", "100", "--top-p", "0"])
    assert r.exit_code == 2 and "--top-p 0.0 is out of range: allowed (0, 1]" in r.output
    r = bench(["--base-url", f"http://127.0.0.1:{free_port()}", "--vocab-size", "100"])
    assert r.exit_code == 2 and "cannot connect" in r.output
    r = bench(["--base-url", server.url, "--vocab-size", "100", "--ramp-up-strategy", "linear",
               "--ramp-up-start-rps", "5"])
    assert r.exit_code == 2 and "--ramp-up-end-rps" in r.output
    r = bench(["--base-url", server.url, "--vocab-size", "100", "--ramp-up-strategy", "linear",
               "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2", "--request-rate", "3"])
    assert r.exit_code == 2 and "leave --request-rate out" in r.output


@pytest.mark.parametrize("server", [{"api_key": "sekret"}], indirect=True)
def test_api_key_from_flag_or_environment(server, monkeypatch):
    args = ["--base-url", server.url, "--vocab-size", "100", "--num-prompts", "2",
            "--output-len", "2", "--input-len", "4"]
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    r = bench(args)
    assert r.exit_code == 1 and "HTTP 401" in r.output and "no request succeeded" in r.output
    r = bench([*args, "--api-key", "sekret"])
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("OPENAI_API_KEY", "sekret")
    assert bench(args).exit_code == 0


def test_engine_section_is_left_out_of_the_http_block():
    """No steps measured (a client's view): no Engine Steps section, not rows of 0
    (probes.metrics.results_block_rows, which the report's table reads too)."""
    s = format_results_block(summarize([], 1.0))
    assert "Engine" not in s and "Preemptions" not in s and "Mean E2EL (ms):" in s
    assert s.endswith("=" * 50)


# ---------------------------------------------------------------------------------------------
# text prompts from a local tokenizer


@pytest.fixture
def tokenizer_json(tmp_path):
    """A small byte-level BPE tokenizer trained here (offline) and saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([f"the quick brown fox jumps over the lazy dog {i}"
                             for i in range(200)], trainer)
    p = tmp_path / "tok" / "tokenizer.json"
    p.parent.mkdir()
    tok.save(str(p))
    return p


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_text_prompts_have_the_loads_lengths(server, tokenizer_json, endpoint):
    from tokenizers import Tokenizer

    r = bench(["--base-url", server.url, "--endpoint", endpoint, "--tokenizer",
               str(tokenizer_json.parent), "--num-prompts", "4", "--input-len", "60",
               "--output-len", "3", "--range-ratio", "0.5"])
    assert r.exit_code == 0, r.output
    tok = Tokenizer.from_file(str(tokenizer_json))
    chat = endpoint.endswith("chat/completions")
    assert len(server.bodies) == 4
    for b in server.bodies.values():
        text = b["messages"][0]["content"] if chat else b["prompt"]
        assert isinstance(text, str)
        n = len(tok.encode(text, add_special_tokens=False).ids)
        assert 30 - 3 <= n <= 90  # --input-len 60, --range-ratio 0.5; a cut may lose 1-2
        assert 1 <= b[("max_completion_tokens" if chat else "max_tokens")] <= 5
    assert "Successful requests:                     4" in r.output


def test_a_bad_tokenizer_path_is_one_line(server, tmp_path):
    r = bench(["--base-url", server.url, "--tokenizer", str(tmp_path)])
    assert r.exit_code == 2 and "has no tokenizer.json" in r.output
    (tmp_path / "tokenizer.json").write_text("{not json")
    r = bench(["--base-url", server.url, "--tokenizer", str(tmp_path)])
    assert r.exit_code == 2 and "cannot be read" in r.output and "Traceback" not in r.output


def test_text_prompt_encodes_to_about_the_target_length(tokenizer_json):
    from gpuchef.client.http_load import load_tokenizer, text_prompt, tokenizer_vocab_size

    tok = load_tokenizer(str(tokenizer_json))
    rng = np.random.default_rng(1)
    for n in (1, 2, 7, 64, 333, 1500):
        for _ in range(3):
            ids = rng.integers(10, tokenizer_vocab_size(tok), n).tolist()
            got = len(tok.encode(text_prompt(tok, ids, n), add_special_tokens=False).ids)
            assert n - 3 <= got <= n, (n, got)


def test_peak_output_rate_and_concurrency_as_vllm_buckets_them():
    from gpuchef.client.http_load import ClientResult, peak_stats

    def res(start, chunks):
        r = ClientResult("req-x", False, 1, 9, start_ns=int(start * 1e9))
        r.chunk_times_ns = [int(t * 1e9) for t, _ in chunks]
        r.chunk_tokens = [k for _, k in chunks]
        return r

    a = res(0.0, [(0.5, 1), (1.2, 3), (1.7, 1)])
    b = res(1.0, [(1.1, 2), (1.9, 1), (3.5, 1)])
    failed = res(1.0, [(1.5, 50)])
    failed.fail("http", "HTTP 500")
    # 1-s buckets from the first start: [0,1) 1 token, [1,2) 3+1+2+1, [3,4) 1
    assert peak_stats([a, b, failed]) == (7.0, 2)
    assert peak_stats([failed]) == (0.0, 0)


def test_bench_ramp_up_end_to_end(server, tmp_path):
    out = tmp_path / "r.json"
    r = bench(["--base-url", server.url, "--vocab-size", "100", "--num-prompts", "30",
               "--input-len", "4", "--output-len", "2", "--ramp-up-strategy", "linear",
               "--ramp-up-start-rps", "20", "--ramp-up-end-rps", "60", "--burstiness", "inf",
               "--result-json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert (d["ramp_up_strategy"], d["ramp_up_start_rps"], d["ramp_up_end_rps"]) == \
        ("linear", 20, 60)
    assert [e["rps"] for e in d["rps_change_events"]] == list(range(20, 61))
    # constant gaps 1/rate_i: the sends are spaced as the ramp says (vLLM, not rescaled)
    want = np.cumsum([1 / (20 + 40 * i / 29) for i in range(30)])
    got = np.asarray(d["start_times"]) - d["start_times"][0]
    # robust to a few sends made late by a loaded machine (the fresh-clone suite once saw one
    # 29 ms late): aligned on the median offset, 80 % of the sends within 15 ms of the ramp —
    # evenly spaced sends at the mean rate would be off by up to ~50 ms mid-ramp
    resid = got - (want - want[0])
    resid -= np.median(resid)
    assert np.percentile(np.abs(resid), 80) < 0.015, resid
    even = np.linspace(0, want[-1] - want[0], 30)
    assert np.percentile(np.abs(even - (want - want[0]) - np.median(even - (want - want[0]))),
                         80) > 0.015  # the check can tell a ramp from even spacing


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
