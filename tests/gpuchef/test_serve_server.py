"""gpuchef.serve.server, `gpuchef serve`'s front door, driven over real HTTP (aiohttp's client,
urllib, http.client, the official openai client) against `gpuchef serve --device cpu --model
tiny` on a free loopback port:

* vLLM-compatible extras (a server of their own, ``extras_server``): no concurrency cap by
  default (requests wait in the engine's queue) and the opt-in cap's 503 with Retry-After;
  X-Request-Id echoed; a stream's status and headers sent while its request is still queued;
  /tokenize, /detokenize, /ping, /load, /reset_prefix_cache, /start_profile and /stop_profile in
  vLLM's shapes; process_* and http_requests_total on /metrics; a 30 MB prompt refused at once
  while /health and the other streams go on;
* the load a benchmark tool puts on it (test_serve's module fixture, ``server``): 100 concurrent
  streams (the openai client's async API, completions and chat mixed) all complete with the
  tokens asked and /metrics agrees with what the clients were told; a reader too slow for the
  engine (a 2 KiB receive buffer, not read for a while) gets every token, equal to the native
  engine's greedy tokens; 40 streams whose clients go away are aborted and free their KV blocks,
  and the server goes on serving;
* stopping it (SIGTERM, as Ctrl-C) with requests in flight: each ends with finish_reason "abort"
  — a stream with its last chunk and ``data: [DONE]``, a non-streaming request with its response
  — and the exit leaves no asyncio task behind. The trace (written by the engine's process) is
  the reference for which requests were in flight.
"""

from __future__ import annotations

import asyncio
import http.client as hc
import json
import random
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import psutil
import pytest

from serve_proc import ServeProc, wait_until
from test_serve import TOK, client, engine_greedy, http, metrics, one, server  # noqa: F401

openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpuchef.probes.recorder import read_trace  # noqa: E402
from gpuchef.serve.server import SHUTDOWN_GRACE_S  # noqa: E402


# ---- vLLM-compatible extras ----------------------------------------------------------------------

MAX_MODEL_LEN = 4096
LONG = {"prompt": [7] * 16, "max_tokens": 4000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def extras_server(tmp_path_factory):
    """A server of its own for the vLLM-compatible extras: a 4096-token context, a profile
    folder, no GPU sampling."""
    d = tmp_path_factory.mktemp("endpoints")
    trace = d / "serve.jsonl"
    with ServeProc("--max-model-len", str(MAX_MODEL_LEN), "--trace", str(trace),
                   "--profile-dir", str(d / "profiles"), "--sample-hz", "0") as s:
        s.trace = trace
        s.profiles = d / "profiles"
        yield s


def samples(url: str) -> dict[str, dict[tuple, float]]:
    """``{sample name: {sorted labels: value}}`` of ``url``/metrics, parsed by prometheus_client."""
    out: dict[str, dict[tuple, float]] = {}
    text = http("GET", url + "/metrics")[1]
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out.setdefault(smp.name, {})[tuple(sorted(smp.labels.items()))] = smp.value
    return out


def waiting(url: str) -> float:
    return sum(samples(url).get("vllm:num_requests_waiting", {}).values())


def headers_of(method: str, url: str, body=None, headers=None):
    """(status, response headers, body text) for one request over urllib."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


# -- 1 + 3: no cap by default; a stream's headers while it is queued ------------------------------

def test_requests_past_max_num_seqs_queue_and_a_stream_gets_its_headers_while_queued(
        extras_server):
    """max_num_seqs=1 and one long stream running: a second stream is answered 200 with its
    headers (X-Request-Id echoed) while it waits in the engine's queue, before any token; a
    third request is queued too (no 503: there is no cap by default); /load counts the three.
    When the first goes, the others run."""
    u = extras_server.url
    assert http("PATCH", u + "/gpuchef/v1/scheduler", {"max_num_seqs": 1})[0] == 200

    async def run() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as sess:
            a = await sess.post(u + "/v1/completions", json=LONG)
            assert a.status == 200
            assert (await a.content.readline()).startswith(b"data: ")  # A runs
            # before, the headers came with the first token: this waited for A to end
            b = await asyncio.wait_for(sess.post(
                u + "/v1/completions", headers={"X-Request-Id": "queued-b-1"},
                json={**LONG, "max_tokens": 3}), 10)
            # the status and headers are here, and B is in the engine's queue, tokenless
            assert b.status == 200
            assert b.headers["Content-Type"].startswith("text/event-stream")
            assert b.headers["X-Request-Id"] == "queued-b-1"
            assert await asyncio.to_thread(wait_until, lambda: waiting(u) == 1, 10)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(b.content.readline(), 0.5)
            c = asyncio.ensure_future(sess.post(u + "/v1/completions", json={
                "prompt": [5] * 8, "max_tokens": 2, "ignore_eos": True}))
            assert await asyncio.to_thread(wait_until, lambda: waiting(u) == 2, 10)
            st, load = await asyncio.to_thread(http, "GET", u + "/load")
            assert st == 200 and load == {"server_load": 3}
            assert not c.done()
            a.close()  # A goes: its slot frees, B and C run
            lines = [ln async for ln in b.content if ln.strip()]
            assert lines[0].startswith(b"data: {") and lines[-1] == b"data: [DONE]\n"
            rc = await c
            assert rc.status == 200 and (await rc.json())["usage"]["completion_tokens"] == 2
        st, load = await asyncio.to_thread(http, "GET", u + "/load")
        assert load == {"server_load": 0}

    try:
        asyncio.run(run())
    finally:
        http("PATCH", u + "/gpuchef/v1/scheduler", {"max_num_seqs": 256})


def test_opt_in_cap_answers_503_with_retry_after_and_http_requests_total_counts_it():
    """--max-concurrent-requests 1 (the opt-in): a second request while one streams is a 503
    with Retry-After and code overloaded; http_requests_total counts it (5xx), the bad request
    and the missing key (4xx), the route that does not exist (handler "none") and the successes
    (2xx). With --api-key the admin routes that write or change state need the key, the
    tokenizer's do not (as vLLM's key guards /v1 only)."""
    import http.client as hc
    from urllib.parse import urlparse

    key = {"Authorization": "Bearer k3y"}
    with ServeProc("--max-concurrent-requests", "1", "--sample-hz", "0", "--api-key", "k3y") as s:
        u = urlparse(s.url)
        conn = hc.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps({**LONG, "max_tokens": 500}),
                     {"Content-Type": "application/json", **key})
        resp = conn.getresponse()
        assert resp.readline().startswith(b"data: ")
        st, hdrs, body = headers_of("POST", s.url + "/v1/completions",
                                    {"prompt": [1], "max_tokens": 1},
                                    headers={"X-Request-Id": "over-1", **key})
        err = json.loads(body)["error"]
        assert st == 503 and hdrs["Retry-After"] == "1" and err["code"] == "overloaded"
        assert "--max-concurrent-requests" in err["message"]
        assert hdrs["X-Request-Id"] == "over-1"  # error responses echo it too
        conn.close()
        assert wait_until(lambda: http("POST", s.url + "/v1/completions",
                                       {"prompt": [1], "max_tokens": 1}, key)[0] == 200)
        assert http("POST", s.url + "/v1/completions", {"prompt": []}, key)[0] == 400
        assert http("GET", s.url + "/no/such/route")[0] == 404
        assert http("GET", s.url + "/v1/models/tiny", headers=key)[0] == 200
        for path in ("/start_profile", "/stop_profile", "/reset_prefix_cache"):
            assert http("POST", s.url + path)[0] == 401, path
        assert http("POST", s.url + "/tokenize", {"prompt": "a"})[0] == 200
        assert http("GET", s.url + "/ping")[0] == 200
        m = samples(s.url)["http_requests_total"]

    def n(handler, method, status):
        return m.get((("handler", handler), ("method", method), ("status", status)), 0)

    assert n("/v1/completions", "POST", "5xx") == 1
    assert n("/v1/completions", "POST", "4xx") == 1
    assert n("/v1/completions", "POST", "2xx") >= 2  # the stream and the one after it
    assert n("none", "GET", "4xx") == 1
    assert n("/start_profile", "POST", "4xx") == 1 and n("/tokenize", "POST", "2xx") == 1
    assert n("/v1/models/{model}", "GET", "2xx") == 1
    # the polls are left out, as vLLM's instrumentator leaves them out
    assert not any(dict(k)["handler"] in ("/health", "/metrics") for k in m)


# -- 2: X-Request-Id ----------------------------------------------------------------------------

def test_x_request_id_is_echoed_on_every_response(extras_server):
    u = extras_server.url
    for method, path, body in [("POST", "/v1/completions", {"prompt": [3, 4], "max_tokens": 2}),
                               ("POST", "/v1/completions", {"prompt": [3], "max_tokens": 0}),
                               ("GET", "/health", None), ("POST", "/tokenize", {"prompt": "a"}),
                               ("GET", "/nowhere", None)]:
        st, hdrs, _ = headers_of(method, u + path, body, {"X-Request-Id": f"id {path} 7"})
        assert hdrs["X-Request-Id"] == f"id {path} 7", (path, st)
    st, hdrs, _ = headers_of("GET", u + "/health")
    assert st == 200 and "X-Request-Id" not in hdrs  # echoed, not made up
    # the openai client's raw response carries it
    raw = client(extras_server).completions.with_raw_response.create(
        model="tiny", prompt=[5, 6], max_tokens=2, extra_headers={"X-Request-Id": "sdk-9"})
    assert raw.headers["x-request-id"] == "sdk-9"


# -- 4: vLLM's extra endpoints ------------------------------------------------------------------

def test_tokenize_and_detokenize_in_vllms_shapes(extras_server):
    u = extras_server.url
    text = "Chunked prefill trades TTFT for ITL."
    st, r = http("POST", u + "/tokenize", {"model": "tiny", "prompt": text})
    assert st == 200 and r == {"count": len(TOK.encode(text)), "max_model_len": MAX_MODEL_LEN,
                               "tokens": TOK.encode(text), "token_strs": None}
    # the prompt completions build from the same text has the same tokens
    done = client(extras_server).completions.create(model="tiny", prompt=text, max_tokens=1)
    assert done.usage.prompt_tokens == r["count"]
    st, r2 = http("POST", u + "/tokenize", {"prompt": text, "add_special_tokens": False,
                                            "return_token_strs": True})
    assert r2["tokens"] == r["tokens"][1:]  # no BOS
    assert r2["token_strs"] == [TOK.tok.id_to_token(i) for i in r2["tokens"]]
    # messages: the chat endpoint's prompt
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    st, rc = http("POST", u + "/tokenize", {"messages": msgs})
    chat = client(extras_server).chat.completions.create(model="tiny", messages=msgs, max_tokens=1)
    assert st == 200 and rc["count"] == chat.usage.prompt_tokens == len(rc["tokens"])
    st, rn = http("POST", u + "/tokenize", {"messages": msgs, "add_generation_prompt": False})
    assert rn["count"] < rc["count"]
    # detokenize: the text back; special tokens stay in it (the tokenizer's decode default)
    st, d = http("POST", u + "/detokenize", {"model": "tiny", "tokens": r["tokens"]})
    assert st == 200 and d == {"prompt": "<s>" + text}
    assert http("POST", u + "/detokenize", {"tokens": []}) == (200, {"prompt": ""})
    # refusals: OpenAI's error body, naming the field
    for path, body, status, param in [
            ("/tokenize", {"prompt": [1, 2]}, 400, "prompt"),
            ("/tokenize", {}, 400, "prompt"),
            ("/tokenize", {"prompt": "a", "messages": msgs}, 400, "messages"),
            ("/tokenize", {"messages": msgs, "continue_final_message": True}, 400,
             "continue_final_message"),
            ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
            ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
            ("/detokenize", {"tokens": [1 << 20]}, 400, "tokens"),
            ("/detokenize", {}, 400, "tokens")]:
        st, e = http("POST", u + path, body)
        assert st == status and e["error"]["param"] == param, (path, body, e)


def test_ping_load_and_reset_prefix_cache_answer_as_vllm(extras_server):
    u = extras_server.url
    assert http("GET", u + "/ping") == (200, "")
    assert http("POST", u + "/ping") == (200, "")
    assert http("GET", u + "/load") == (200, {"server_load": 0})
    assert http("POST", u + "/reset_prefix_cache") == (200, "")  # no prefix cache: nothing to do
    # vLLM's methods: the admin routes are POST only
    for path in ("/reset_prefix_cache", "/start_profile", "/stop_profile"):
        st, e = http("GET", u + path)
        assert st == 405 and "not allowed" in e["error"]["message"]


def test_start_and_stop_profile_write_a_trace_of_the_requests_in_between(extras_server):
    u = extras_server.url
    c = client(extras_server)

    def ask(n: int) -> None:  # a prompt of n tokens: its RequestRecord's prompt_len
        assert c.completions.create(model="tiny", prompt=[9] * n, max_tokens=2).usage

    ask(11)
    st, r = http("POST", u + "/start_profile")
    assert st == 200 and r["profile"] == "started", r
    path = r["path"]
    assert path.startswith(str(extras_server.profiles)) and path.endswith(".jsonl")
    st, e = http("POST", u + "/start_profile")  # one at a time
    assert st == 409 and path in e["error"]["message"]
    ask(12)
    ask(13)
    st, r = http("POST", u + "/stop_profile")
    assert (st, r) == (200, {"profile": "stopped", "path": path})
    assert http("POST", u + "/stop_profile")[0] == 409
    ask(14)
    tr = read_trace(path)
    assert tr.complete and tr.meta["profile"] is True and tr.meta["command"] == "serve"
    assert sorted(q.prompt_len for q in tr.requests) == [12, 13]
    assert all(q.request_id.startswith("http-") for q in tr.requests)
    assert tr.steps  # the steps of the window too
    # the --trace of the whole session is written beside it (flushed every 0.5 s) all along
    ids = {q.request_id for q in tr.requests}
    assert wait_until(
        lambda: ids <= {q.request_id for q in read_trace(extras_server.trace).requests},
        timeout=5)


# -- 5: process_* ---------------------------------------------------------------------------------

def test_metrics_carry_process_series_of_the_http_and_the_engine_process(extras_server):
    m = samples(extras_server.url)
    port = int(extras_server.url.rsplit(":", 1)[-1])
    kids = psutil.Process(extras_server.proc.pid).children()
    http_proc = [k for k in kids if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                                        for c in k.net_connections("tcp"))]
    assert len(http_proc) == 1
    engine = [k for k in kids if k.pid != http_proc[0].pid and k.is_running()
              and "python" in k.name().lower()]
    starts = {k.pid: k.create_time() for k in engine}
    for name in ("resident_memory_bytes", "virtual_memory_bytes", "start_time_seconds",
                 "cpu_seconds_total", "open_fds", "max_fds"):
        assert ("process_" + name) in m and ("gpuchef:engine_process_" + name) in m, name
    (http_start,) = m["process_start_time_seconds"].values()
    (engine_start,) = m["gpuchef:engine_process_start_time_seconds"].values()
    # each is the process it names: its start time as the kernel has it
    assert http_start == pytest.approx(http_proc[0].create_time(), abs=0.05)
    assert any(engine_start == pytest.approx(t, abs=0.05) for t in starts.values()), starts
    assert abs(engine_start - http_start) > 0.05 or len(starts) == 1


# -- 6: a huge prompt ---------------------------------------------------------------------------

def test_a_30mb_prompt_is_refused_at_once_while_health_and_streams_go_on(extras_server):
    u = extras_server.url
    huge = "lorem ipsum " * 2_500_000  # 30 MB
    results: dict = {}

    def post(kind: str, body: dict) -> None:
        t0 = time.monotonic()
        results[kind] = (*http("POST", u + f"/v1/{kind}", body), time.monotonic() - t0)

    # a stream in flight: its chunks keep coming while the huge bodies are read and refused
    gaps: list[float] = []
    stop = threading.Event()

    def stream() -> None:
        req = urllib.request.Request(u + "/v1/completions", method="POST", data=json.dumps(
            {**LONG, "max_tokens": 3000}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            last = time.monotonic()
            for line in r:
                now = time.monotonic()
                if line.strip():
                    gaps.append(now - last)
                    last = now
                if stop.is_set():
                    return

    st = threading.Thread(target=stream, daemon=True)
    st.start()
    assert wait_until(lambda: len(gaps) >= 3, 30)
    health: list[float] = []
    workers = [threading.Thread(target=post, args=("completions", {"prompt": huge,
                                                                   "max_tokens": 4})),
               threading.Thread(target=post, args=("chat/completions", {
                   "messages": [{"role": "user", "content": huge}], "max_tokens": 4}))]
    n_before = len(gaps)
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        t0 = time.monotonic()
        assert http("GET", u + "/health")[0] == 200
        health.append(time.monotonic() - t0)
        time.sleep(0.05)
    stop.set()
    during = gaps[n_before:]
    assert health and max(health) < 1.0, health
    assert during and max(during) < 1.0, during
    for kind, param, where in (("completions", "prompt", "the prompt holds"),
                               ("chat/completions", "messages", "the messages hold")):
        status, body, took = results[kind]
        err = body["error"]
        assert status == 400 and err["code"] == "context_length_exceeded", body
        assert err["param"] == param and where in err["message"]
        assert "maximum context length is 4096 tokens" in err["message"]
        assert took < 10, took


def test_tokenising_megabytes_lets_health_answer(extras_server):
    """/tokenize has no length bound (as vLLM's): 2 MB of text is tokenised with the GIL let
    go (tokenizers' encode held it: /health waited seconds); the count is the tokenizer's."""
    u = extras_server.url
    text = "the quick brown fox jumps. " * 75_000  # 2 MB
    out: dict = {}

    def tok() -> None:
        out["r"] = http("POST", u + "/tokenize", {"prompt": text})

    t = threading.Thread(target=tok)
    t.start()
    health = []
    while t.is_alive():
        t0 = time.monotonic()
        assert http("GET", u + "/health")[0] == 200
        health.append(time.monotonic() - t0)
        time.sleep(0.05)
    st, r = out["r"]
    assert st == 200 and r["tokens"] == TOK.encode(text) and r["count"] == len(r["tokens"])
    assert len(health) >= 3 and max(health) < 1.0, health


# ---- under a load tool's load --------------------------------------------------------------------

MODEL = "tiny-served"  # test_serve's --served-model-name
#: the series whose change must equal what the clients were told
COUNTED = ("vllm:request_success_total", "vllm:prompt_tokens_total",
           "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_count",
           "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
           "vllm:request_params_max_tokens_sum", "vllm:request_generation_tokens_sum",
           "vllm:request_prompt_tokens_sum", "gpuchef:request_aborted_total")


def counted(s) -> dict[str, float]:
    m = metrics(s)
    return {k: one(m, k) for k in COUNTED}


def histograms_consistent(s) -> list:
    """Every histogram's buckets: cumulative, ending at +Inf = its _count (what a Prometheus
    server relies on); returns the ones that are not."""
    m = metrics(s)
    bad = []
    for name, samples in m.items():
        if not name.endswith("_bucket"):
            continue
        base = name[:-len("_bucket")]
        series: dict[tuple, list] = {}
        for labels, v in samples.items():
            d = dict(labels)
            le = float(d.pop("le"))
            series.setdefault(tuple(sorted(d.items())), []).append((le, v))
        for labels, b in series.items():
            b.sort()
            counts = [v for _, v in b]
            if (counts != sorted(counts) or b[-1][0] != float("inf")
                    or b[-1][1] != m[base + "_count"][labels]):
                bad.append((base, labels))
    return bad


def test_100_concurrent_streams_complete_and_metrics_agree(server):  # noqa: F811
    rng = random.Random(0)
    asked = [rng.randint(1, 24) for _ in range(100)]
    before = counted(server)

    async def run():
        ac = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0,
                                timeout=300)

        async def one_stream(i: int, mt: int):
            extra = {"ignore_eos": True}
            so = {"include_usage": True}
            if i % 2:
                s = await ac.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"request {i}"}],
                    max_tokens=mt, stream=True, stream_options=so, extra_body=extra)
            else:
                s = await ac.completions.create(model=MODEL, prompt=f"request {i} " * (i % 9 + 1),
                                                max_tokens=mt, stream=True, stream_options=so,
                                                extra_body=extra)
            finish, usage = [], None
            async for ch in s:
                finish += [c.finish_reason for c in ch.choices if c.finish_reason]
                usage = ch.usage or usage
            return finish, usage

        try:
            return await asyncio.gather(*(one_stream(i, mt) for i, mt in enumerate(asked)))
        finally:
            await ac.close()

    res = asyncio.run(run())
    assert [f for f, _ in res] == [["length"]] * 100
    assert [u.completion_tokens for _, u in res] == asked
    prompt_tokens = sum(u.prompt_tokens for _, u in res)
    want = {"vllm:request_success_total": 100, "vllm:prompt_tokens_total": prompt_tokens,
            "vllm:generation_tokens_total": sum(asked),
            "vllm:e2e_request_latency_seconds_count": 100,
            "vllm:time_to_first_token_seconds_count": 100,
            "vllm:inter_token_latency_seconds_count": sum(asked) - 100,
            "vllm:request_params_max_tokens_sum": sum(asked),
            "vllm:request_generation_tokens_sum": sum(asked),
            "vllm:request_prompt_tokens_sum": prompt_tokens, "gpuchef:request_aborted_total": 0}

    def delta():
        now = counted(server)
        return {k: now[k] - before[k] for k in COUNTED}

    # the counting runs every 250 ms on the server: wait for the last request to show
    wait_until(lambda: delta()["vllm:request_success_total"] >= 100, timeout=30)
    assert delta() == want
    m = metrics(server)
    assert one(m, "vllm:num_requests_running") == 0 and one(m, "vllm:num_requests_waiting") == 0
    assert one(m, "vllm:kv_cache_usage_perc") == 0
    assert histograms_consistent(server) == []


def _sse_events(raw: bytes) -> list[dict | str]:
    """The ``data:`` payloads of a chunked HTTP/1.1 SSE response read whole from a socket."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"chunked" in head.lower(), head
    out = b""
    while body:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, body = out + body[:n], body[n + 2:]
    events = [e[len("data: "):] for e in out.decode().split("\n\n") if e.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def test_a_slow_reader_gets_every_token_as_the_engine_made_them(server):  # noqa: F811
    ids, n = [3, 4, 5], 120
    u = urlparse(server.url)
    body = json.dumps({"model": MODEL, "prompt": ids, "max_tokens": n, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    made_before = one(metrics(server), "vllm:generation_tokens_total")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # the server's writes block
    sock.settimeout(120)
    sock.connect((u.hostname, u.port))
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body)
        # not read until the engine is done with it: its tokens pile up behind the socket
        assert wait_until(lambda: one(metrics(server), "vllm:generation_tokens_total")
                          - made_before == n, timeout=120)
        raw = b""
        while chunk := sock.recv(512):
            raw += chunk
            time.sleep(0.001)  # a slow reader, still
    finally:
        sock.close()
    events = _sse_events(raw)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == n
    chunks = events[:-2]
    assert all(len(e["choices"]) == 1 for e in chunks)
    assert "".join(e["choices"][0]["text"] for e in chunks) == TOK.decode(engine_greedy(ids, n))
    assert [e["choices"][0]["finish_reason"] for e in chunks] == [None] * (len(chunks) - 1) + \
        ["length"]


def test_forty_clients_gone_mid_stream_are_aborted_and_free_their_kv(server):  # noqa: F811
    import http.client as hc

    u = urlparse(server.url)
    before = counted(server)
    conns = []
    for i in range(40):
        conn = hc.HTTPConnection(u.hostname, u.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": MODEL, "prompt": [5, 6, i], "max_tokens": 500, "stream": True,
             "ignore_eos": True}), {"Content-Type": "application/json"})
        conns.append(conn)
    for conn in conns:
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
    assert one(metrics(server), "vllm:kv_cache_usage_perc") > 0
    for conn in conns:
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()

    def aborted():
        return counted(server)["gpuchef:request_aborted_total"] - before[
            "gpuchef:request_aborted_total"]

    assert wait_until(lambda: aborted() == 40, timeout=60), aborted()
    m = metrics(server)
    assert one(m, "vllm:num_requests_running") == 0 and one(m, "vllm:kv_cache_usage_perc") == 0
    after = counted(server)
    assert after["vllm:request_success_total"] == before["vllm:request_success_total"]
    r = client(server).completions.create(model=MODEL, prompt=[1, 2], max_tokens=3,
                                          extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


# ---- shutdown with requests in flight ------------------------------------------------------------

BODY = {"prompt": [7] * 32, "max_tokens": 4000, "ignore_eos": True}


def _post(u, body) -> hc.HTTPConnection:
    conn = hc.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    return conn


def test_sigterm_ends_streams_and_whole_requests_with_abort_then_exits(tmp_path):
    trace = tmp_path / "s.jsonl"
    s = ServeProc("--trace", str(trace)).__enter__()
    try:
        u = urlparse(s.url)
        # a client that goes away mid-request (non-streaming): its waiter was once left pending
        gone = _post(u, BODY)
        assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") == 1)
        gone.sock.shutdown(socket.SHUT_RDWR)
        gone.close()
        assert wait_until(lambda: one(metrics(s), "gpuchef:request_aborted_total") == 1)
        # in flight at the signal: one stream, one whole request
        conn = _post(u, {**BODY, "stream": True})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        whole: list = []
        t = threading.Thread(target=lambda: whole.append(
            http("POST", s.url + "/v1/completions", BODY)), daemon=True)
        t.start()
        assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") == 2)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        rest = resp.read().decode()  # raises IncompleteRead when the stream is cut
        t.join(30)
        rc = s.proc.wait(30)
        took = time.monotonic() - t0
    finally:
        s.stop()
    events = [ln[len("data: "):] for ln in rest.split("\n\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]", rest[-300:]
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "abort", last
    assert all(json.loads(e)["choices"][0]["finish_reason"] is None for e in events[:-2])
    (st, body), = whole
    assert st == 200, body
    assert body["choices"][0]["finish_reason"] == "abort"
    assert 0 < body["usage"]["completion_tokens"] < 4000
    assert rc == 0 and took < SHUTDOWN_GRACE_S + 15, (rc, took)
    assert "Task was destroyed" not in s.stderr, s.stderr
    assert "Traceback" not in s.stderr, s.stderr
    reqs = read_trace(trace).requests
    assert len(reqs) == 3 and {r.finish_reason for r in reqs} == {"abort"}


def test_no_pending_task_left_at_exit_after_clients_went_away():
    with ServeProc() as s:
        u = urlparse(s.url)
        for body in (BODY, {**BODY, "prompt": [[7] * 32, [8] * 32]}):  # one choice, a batch
            gone = _post(u, body)
            assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") >= 1)
            gone.sock.shutdown(socket.SHUT_RDWR)
            gone.close()
            assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") == 0)
        assert s.stop() == 0
    assert "Task was destroyed" not in s.stderr, s.stderr


#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
