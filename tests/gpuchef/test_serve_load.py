"""`gpuchef serve` under the load a benchmark tool puts on it: 100 concurrent streams (the
official openai client's async API, completions and chat mixed) all complete with the tokens
asked and /metrics (prometheus_client's parser) agrees with what the clients were told; a
reader too slow for the engine (a 2 KiB receive buffer, not read for a while) gets every token,
equal to the native engine's greedy tokens; 40 streams whose clients go away are aborted and
free their KV blocks, and the server goes on serving.

The server is test_serve's module fixture (a `gpuchef serve` subprocess, tiny, CPU).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from urllib.parse import urlparse

import pytest

from serve_proc import wait_until
from test_serve import TOK, client, engine_greedy, metrics, one, server  # noqa: F401

openai = pytest.importorskip("openai")

MODEL = "tiny-served"
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


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
