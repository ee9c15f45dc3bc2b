"""`gpuchef serve` driven as users drive it: the official openai client, raw HTTP for the bad
input, Prometheus' own parser for /metrics, and the session trace as the reference.

Each server is a subprocess on a free loopback port (`serve_proc.ServeProc`), stopped by the test.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from serve_proc import ServeProc, run_cli, wait_until

openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpuchef.engine_host.vocab.tokenizer import load_tokenizer  # noqa: E402
from gpuchef.probes.recorder import read_trace  # noqa: E402

MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    trace = tmp_path_factory.mktemp("serve") / "serve.jsonl"
    with ServeProc("--max-model-len", str(MAX_MODEL_LEN), "--trace", str(trace),
                   "--trace-prompts", "--max-request-body-mb", "0.05",
                   "--served-model-name", "tiny-served") as s:
        s.trace = trace
        yield s


def client(s, **kw):
    return openai.OpenAI(base_url=s.url + "/v1", api_key=kw.pop("api_key", "none"),
                         max_retries=0, **kw)


def http(method: str, url: str, body=None, headers=None, raw: bytes | None = None):
    """(status, parsed JSON or text) for one request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def metrics(s) -> dict[str, dict[tuple, float]]:
    """``{sample name: {labels as sorted tuple: value}}`` parsed by prometheus_client."""
    _, text = http("GET", s.url + "/metrics")
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out.setdefault(smp.name, {})[tuple(sorted(smp.labels.items()))] = smp.value
    return out


def one(m, name, **labels):
    """The value of ``name`` whose labels include ``labels``, summed over the rest."""
    return sum(v for k, v in m.get(name, {}).items() if set(labels.items()) <= set(k))


def engine_greedy(prompt_ids: list[int], n: int) -> list[int]:
    """The native engine's own greedy tokens for ``prompt_ids`` (tiny, CPU, seed 0), the
    reference the server must equal."""
    return engine_sampled(prompt_ids, n, 0.0, None)


TOK = load_tokenizer("tiny", 4096)


def engine_sampled(prompt_ids: list[int], n: int, temperature: float,
                   seed: int | None) -> list[int]:
    """The native engine's own tokens for ``prompt_ids`` (tiny, CPU, model seed 0) at
    ``temperature`` with ``seed``."""
    from gpuchef.engine_host.vocab.config import EngineConfig
    from gpuchef.engine_host.engine import LLMEngine
    from gpuchef.engine_host.request import SamplingParams

    eng = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=MAX_MODEL_LEN))
    eng.add_request("r", prompt_ids, SamplingParams(max_tokens=n, ignore_eos=True, seed=seed,
                                                    temperature=temperature))
    while eng.has_unfinished():
        res = eng.step()
        if res.finished:
            return list(res.finished[0].output_token_ids)
    raise AssertionError("no output")


def test_a_temperature_above_2_is_taken_as_vllm_takes_it(server):
    """vLLM's SamplingParams asks only temperature >= 0 (OpenAI's cap of 2 is not vLLM's): 100
    is taken (it was a 400 "allowed [0, 2]") and reaches the engine: the server's seeded tokens
    are the engine's at 100 — for completions and chat."""
    c = client(server)
    ids = [40, 41, 42, 43]
    want = engine_sampled(ids, 8, 100.0, 7)
    r = c.completions.create(model="tiny-served", prompt=ids, max_tokens=8, temperature=100,
                             seed=7, extra_body={"ignore_eos": True})
    assert r.choices[0].text == TOK.decode(want)
    r = c.chat.completions.create(model="tiny-served", max_tokens=4, temperature=1e6, seed=1,
                                  messages=[{"role": "user", "content": "hi"}],
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4


def test_completions_text_and_token_ids_greedy_equal_the_engine(server):
    c = client(server)
    text = "The token budget is the knob between TTFT and ITL."
    ids = TOK.encode(text)
    ref = engine_greedy(ids, 12)
    r = c.completions.create(model="tiny-served", prompt=text, max_tokens=12, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 12
    assert r.choices[0].text == TOK.decode(ref)
    assert r.choices[0].finish_reason == "length"
    r2 = c.completions.create(model="tiny-served", prompt=ids, max_tokens=12, temperature=0,
                              extra_body={"ignore_eos": True})
    assert r2.choices[0].text == r.choices[0].text
    # streamed: the same text, and the usage chunk counts the tokens the trace has
    chunks = list(c.completions.create(model="tiny-served", prompt=ids, max_tokens=12,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}))
    with_choices = [ch for ch in chunks if ch.choices]
    assert with_choices[0].choices[0].text != "" or TOK.decode(ref[:1]) == ""
    assert "".join(ch.choices[0].text for ch in with_choices) == r.choices[0].text
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert all(ch.choices[0].finish_reason is None for ch in with_choices[:-1])
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_batch_prompt_gives_one_choice_per_prompt(server):
    c = client(server)
    r = c.completions.create(model="tiny-served", prompt=[[5, 6, 7], [8, 9]], max_tokens=3,
                             temperature=0, extra_body={"ignore_eos": True})
    assert [ch.index for ch in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 6
    assert r.choices[0].text == TOK.decode(engine_greedy([5, 6, 7], 3))


def test_chat_uses_the_chat_template_and_streams_role_with_the_first_token(server):
    c = client(server)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    prompt = TOK.encode(TOK.apply_chat_template(msgs), add_special_tokens=False)
    r = c.chat.completions.create(model="tiny-served", messages=msgs, max_completion_tokens=6,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(prompt)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == TOK.decode(engine_greedy(prompt, 6))
    chunks = list(c.chat.completions.create(model="tiny-served", messages=msgs, max_tokens=6,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    first = chunks[0].choices[0].delta
    assert first.role == "assistant"
    # the first chunk carries the first token: no empty role-only chunk before it
    assert first.content == TOK.decode(engine_greedy(prompt, 1)) or first.content
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content


def test_stop_string_and_stop_token_ids(server):
    c = client(server)
    ids = [10, 11, 12, 13]
    ref = engine_greedy(ids, 8)
    full = TOK.decode(ref)
    r = c.completions.create(model="tiny-served", prompt=ids, max_tokens=8, temperature=0,
                             extra_body={"stop_token_ids": [ref[2]], "ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == ref.index(ref[2]) + 1
    stop = full[len(full) // 2:len(full) // 2 + 2]
    if stop.strip():
        r = c.completions.create(model="tiny-served", prompt=ids, max_tokens=8, temperature=0,
                                 stop=[stop], extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].text == full[:full.index(stop)]


def test_stop_string_holds_back_only_what_could_start_it(server):
    c = client(server)
    kw = dict(model="tiny-served", prompt=[10, 11, 12, 13], temperature=0,
              extra_body={"ignore_eos": True})
    t1 = c.completions.create(**kw, max_tokens=1).choices[0].text  # the first token's text
    full = c.completions.create(**kw, max_tokens=6).choices[0].text
    assert t1 and full.startswith(t1), (t1, full)
    first = next(ch for ch in "~#@%^|" if ch not in full)

    def chunks(stop):  # (a chunk may hold several tokens when the writer falls behind)
        return [ch.choices[0].text for ch in c.completions.create(
            **kw, max_tokens=6, stream=True, stop=[stop])]

    # no end of the text can start the stop string: nothing is held, the first chunk has the
    # first token's text (it once held back len(stop) - 1 characters, often all of it)
    got = chunks(first + "zzzz")
    assert got[0].startswith(t1) and "".join(got) == full, got
    # the first token's last character could start it: only that is held, and comes later
    held = chunks(t1[-1] + first + "zz")
    assert held[0] == t1[:-1] or (len(held[0]) >= len(t1) and held[0].startswith(t1)), held
    assert "".join(held) == full, held


def test_models_health_version(server):
    st, body = http("GET", server.url + "/v1/models")
    assert st == 200 and body["data"][0]["id"] == "tiny-served"
    assert body["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert http("GET", server.url + "/health")[0] == 200
    st, body = http("GET", server.url + "/version")
    assert st == 200 and body["version"]


def test_retrieve_one_model_with_the_openai_client(server):
    """GET /v1/models/{id}, as openai's ``models.retrieve`` calls it: the served name's card
    (the one /v1/models lists); another name is 404 model_not_found naming both."""
    c = client(server)
    m = c.models.retrieve("tiny-served")
    assert m.id == "tiny-served" and m.object == "model"
    _, listed = http("GET", server.url + "/v1/models")
    assert m.model_dump()["max_model_len"] == listed["data"][0]["max_model_len"] == MAX_MODEL_LEN
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("meta-llama/Llama-3-8B")
    assert e.value.body["code"] == "model_not_found"
    assert "meta-llama/Llama-3-8B" in e.value.body["message"]
    assert "tiny-served" in e.value.body["message"]


BAD = [
    # (body or raw bytes, status, param, words in the message)
    (b"{not json", 400, None, "not valid JSON"),
    ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens", "integer"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"prompt": ""}, 400, "prompt", "empty"),
    ({"prompt": []}, 400, "prompt", "empty"),
    ({"prompt": 5}, 400, "prompt", "must be"),
    ({"prompt": [1, 2, 4096]}, 400, "prompt", "outside the vocabulary [0, 4096)"),
    ({"prompt": [1, -3]}, 400, "prompt", "outside the vocabulary"),
    ({"prompt": [1] * 500, "max_tokens": 100}, 400, "max_tokens", "maximum context length is 512"),
    # the prompt alone fills the context: the prompt is at fault, not max_tokens (vLLM)
    ({"prompt": [1] * 512, "max_tokens": 3}, 400, "prompt", "maximum context length is 512"),
    # not an exact integer as a float: refused, named as sent, not echoed as 309 digits
    ({"prompt": "x", "max_tokens": 1e308}, 400, "max_tokens", "must be an integer, got 1e+308"),
    ({"prompt": "x", "max_tokens": 10 ** 400}, 400, "max_tokens", "(401 characters)"),
    (b'{"prompt": "x", "temperature": NaN}', 400, "temperature", "finite number, got nan"),
    (b'{"prompt": "x", "top_p": Infinity}', 400, "top_p", "finite number, got inf"),
    ({"prompt": "x", "stop_token_ids": [3, 99999]}, 400, "stop_token_ids",
     "token id 99999 is outside the vocabulary [0, 4096)"),
    ({"prompt": "x", "n": 2}, 400, "n", "n=1"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature", "number"),
    ({"prompt": "x", "temperature": -0.5}, 400, "temperature",
     "'temperature' = -0.5 is out of range: allowed >= 0"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p", "out of range"),
    ({"prompt": "x", "stream": "yes"}, 400, "stream", "true or false"),
    ({"prompt": "x", "stop": [1]}, 400, "stop", "strings"),
    ({"prompt": "x", "logprobs": 3}, 400, "logprobs", "not supported"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "does not exist"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", "stream"),
    ({"max_tokens": 3}, 400, "prompt", "required"),
]


@pytest.mark.parametrize("body,status,param,words", BAD,
                         ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_completion_bodies_get_openai_errors(server, body, status, param, words):
    raw = body if isinstance(body, bytes) else None
    st, resp = http("POST", server.url + "/v1/completions", None if raw else body, raw=raw)
    assert st == status, resp
    err = resp["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and words in err["message"], err
    assert len(err["message"]) < 300, err


def test_bad_chat_bodies_and_routes(server):
    u = server.url
    for body, param in [({"messages": []}, "messages"),
                        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
                        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                         "messages[0].content"),
                        ({"messages": [{"role": "user", "content": "x"}],
                          "max_completion_tokens": -1}, "max_completion_tokens"),
                        # the context exceeded: the field that asked for the tokens, or the
                        # messages when they alone fill it
                        ({"messages": [{"role": "user", "content": "x"}],
                          "max_completion_tokens": 100000}, "max_completion_tokens"),
                        ({"messages": [{"role": "user", "content": "x"}],
                          "max_tokens": 100000}, "max_tokens"),
                        ({"messages": [{"role": "user", "content": "word " * 600}],
                          "max_tokens": 3}, "messages")]:
        st, resp = http("POST", u + "/v1/chat/completions", body)
        assert st == 400 and resp["error"]["param"] == param, resp
    st, resp = http("GET", u + "/v1/nothing")
    assert st == 404 and "no route" in resp["error"]["message"]
    st, resp = http("GET", u + "/v1/completions")
    assert st == 405 and "error" in resp
    # body over --max-request-body-mb 0.05
    st, resp = http("POST", u + "/v1/completions", {"prompt": "x" * 100_000})
    assert st == 413 and "over the limit" in resp["error"]["message"]
    # the server still answers
    c = client(server)
    assert c.completions.create(model="tiny-served", prompt=[1, 2], max_tokens=2).usage.completion_tokens >= 1


def test_openai_client_sees_errors_as_its_exceptions(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny-served", prompt="x", n=2)
    assert "n=1" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt="x")


def test_knob_endpoint_changes_the_budget_mid_stream_and_the_trace_shows_it(tmp_path):
    trace = tmp_path / "k.jsonl"
    with ServeProc("--trace", str(trace), "--max-num-batched-tokens", "64") as s:
        st, body = http("GET", s.url + "/gpuchef/v1/scheduler")
        assert st == 200 and body["max_num_batched_tokens"] == 64
        assert body["allowed"]["max_num_batched_tokens"]["flag"] == "--max-num-batched-tokens"
        c = client(s)
        stream = c.completions.create(model="tiny", prompt=[3] * 300, max_tokens=40,
                                      stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)
        st, body = http("PATCH", s.url + "/gpuchef/v1/scheduler", {"max_num_batched_tokens": 32})
        assert st == 200 and body["accepted"] == {"max_num_batched_tokens": 32}
        rest = list(it)
        assert rest[-1].choices[0].finish_reason == "length"
        st, body = http("PATCH", s.url + "/gpuchef/v1/scheduler", {"max_num_batched_tokens": 0})
        assert st == 400 and body["error"]["param"] == "max_num_batched_tokens"
        assert "allowed [1," in body["error"]["message"]
        st, body = http("PATCH", s.url + "/gpuchef/v1/scheduler", {"budget": 5})
        assert st == 400 and "unknown knob" in body["error"]["message"]
        st, body = http("PATCH", s.url + "/gpuchef/v1/scheduler", {"mode": "continuous"})
        assert st == 200
        assert http("GET", s.url + "/gpuchef/v1/scheduler")[1]["max_num_batched_tokens"] == 32
    t = read_trace(trace)
    ev = [e for e in t.events if e.kind == "knob" and e.name == "max_num_batched_tokens"]
    assert len(ev) == 1 and ev[0].source == "http" and (ev[0].old, ev[0].new) == (64, 32)
    before = [x for x in t.steps if x.step < ev[0].step]
    after = [x for x in t.steps if x.step >= ev[0].step]
    assert before and after
    assert {x.max_num_batched_tokens for x in before} == {64}
    assert {x.max_num_batched_tokens for x in after} == {32}
    assert max(x.num_tokens for x in after) <= 32


def test_disconnect_mid_stream_aborts_and_frees_kv(tmp_path):
    import http.client as hc
    from urllib.parse import urlparse

    trace = tmp_path / "d.jsonl"
    with ServeProc("--trace", str(trace)) as s:
        u = urlparse(s.url)
        conn = hc.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": [7] * 64, "max_tokens": 4000, "stream": True, "ignore_eos": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        got = resp.readline()
        assert got.startswith(b"data: ")
        m = metrics(s)
        assert one(m, "vllm:kv_cache_usage_perc") > 0
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        assert wait_until(lambda: one(metrics(s), "gpuchef:request_aborted_total") == 1)
        m = metrics(s)
        assert one(m, "vllm:kv_cache_usage_perc") == 0.0
        assert one(m, "vllm:num_requests_running") == 0
        # as vLLM 0.24: an aborted request is in no per-request series (test_serve_metrics)
        assert one(m, "vllm:request_success_total") == 0
    t = read_trace(trace)
    (r,) = t.requests
    assert r.finish_reason == "abort" and 0 < r.output_len < 4000
    assert t.steps[-1].kv_blocks_used > 0  # the KV freed by the abort shows on /metrics (above)


def test_metrics_match_the_requests_and_the_trace(tmp_path):
    trace = tmp_path / "m.jsonl"
    with ServeProc("--trace", str(trace), "--max-num-batched-tokens", "48") as s:
        c = client(s)
        sent = [(list(range(3, 3 + n)), k) for n, k in [(10, 4), (70, 6), (130, 2), (5, 9)]]
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(4) as ex:
            rs = list(ex.map(lambda a: c.completions.create(
                model="tiny", prompt=a[0], max_tokens=a[1], stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True}), sent))
        outs = [list(r) for r in rs]
        assert [o[-1].usage.completion_tokens for o in outs] == [k for _, k in sent]
        m = metrics(s)
    assert one(m, "vllm:request_success_total", finished_reason="length") == 4
    assert one(m, "vllm:prompt_tokens_total") == sum(len(p) for p, _ in sent)
    assert one(m, "vllm:generation_tokens_total") == sum(k for _, k in sent)
    assert one(m, "vllm:time_to_first_token_seconds_count") == 4
    assert one(m, "vllm:e2e_request_latency_seconds_count") == 4
    assert one(m, "vllm:inter_token_latency_seconds_count") == sum(k - 1 for _, k in sent)
    assert m["vllm:num_requests_running"] and one(m, "vllm:num_requests_waiting") == 0
    t = read_trace(trace)
    assert len(t.requests) == 4
    assert one(m, "vllm:iteration_tokens_total_count") == len(t.steps)
    assert one(m, "vllm:iteration_tokens_total_sum") == sum(x.num_tokens for x in t.steps)
    for kind, pred in [("prefill_only", lambda x: x.num_prefill_tokens and not x.num_decode_reqs),
                       ("mixed", lambda x: x.num_prefill_tokens and x.num_decode_reqs),
                       ("decode_only", lambda x: not x.num_prefill_tokens)]:
        steps = [x for x in t.steps if pred(x)]
        assert one(m, "gpuchef:step_duration_seconds_count", step_kind=kind) == len(steps)
        assert one(m, "gpuchef:step_prefill_tokens_sum", step_kind=kind) == \
            sum(x.num_prefill_tokens for x in steps)
        assert one(m, "gpuchef:step_decode_rows_sum", step_kind=kind) == \
            sum(x.num_decode_reqs for x in steps)
        assert one(m, "gpuchef:step_duration_seconds_sum", step_kind=kind) == \
            pytest.approx(sum(x.wall_ms for x in steps) / 1e3)
    assert one(m, "gpuchef:max_num_batched_tokens") == 48
    assert one(m, "gpuchef:scheduler_mode", mode="chunked") == 1
    # the ITL sum is the gaps between each request's token times in the trace
    gaps = sum(sum(r.itls_ms) for r in t.requests) / 1e3
    assert one(m, "vllm:inter_token_latency_seconds_sum") == pytest.approx(gaps, rel=1e-6)


def test_api_key_required_when_set():
    with ServeProc(env={"GPUCHEF_API_KEY": "sekrit"}) as s:
        st, resp = http("POST", s.url + "/v1/completions", {"prompt": [1], "max_tokens": 1})
        assert st == 401 and resp["error"]["type"] == "authentication_error"
        st, _ = http("POST", s.url + "/v1/completions", {"prompt": [1], "max_tokens": 1},
                     headers={"Authorization": "Bearer wrong"})
        assert st == 401
        assert http("PATCH", s.url + "/gpuchef/v1/scheduler", {"max_num_seqs": 3})[0] == 401
        with pytest.raises(openai.AuthenticationError):
            client(s, api_key="wrong").completions.create(model="tiny", prompt=[1], max_tokens=1)
        r = client(s, api_key="sekrit").completions.create(model="tiny", prompt=[1], max_tokens=1)
        assert r.usage.completion_tokens == 1
        assert http("GET", s.url + "/health")[0] == 200  # health and metrics stay open
        assert http("GET", s.url + "/metrics")[0] == 200
        assert s.url.startswith("http://127.0.0.1:")  # the default bind is loopback


def test_concurrency_cap_answers_503_not_a_hang():
    import http.client as hc
    from urllib.parse import urlparse

    with ServeProc("--max-concurrent-requests", "1") as s:
        u = urlparse(s.url)
        conn = hc.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": [7] * 16, "max_tokens": 3000, "stream": True, "ignore_eos": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.readline().startswith(b"data: ")
        st, body = http("POST", s.url + "/v1/completions", {"prompt": [1], "max_tokens": 1})
        assert st == 503 and "--max-concurrent-requests" in body["error"]["message"]
        conn.close()
        assert wait_until(lambda: http("POST", s.url + "/v1/completions",
                                       {"prompt": [1], "max_tokens": 1})[0] == 200)


def test_start_up_refusals_come_before_the_model_loads(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        r = run_cli("serve", "--device", "cpu", "--model", "tiny", "--port", str(port))
        assert r.returncode == 2 and "already in use" in r.stderr and "loaded" not in r.stderr
    finally:
        busy.close()
    r = run_cli("serve", "--device", "cpu", "--model", "tiny", "--host", "no-such-host.invalid")
    assert r.returncode == 2 and "--host" in r.stderr and "loaded" not in r.stderr
    r = run_cli("serve", "--device", "cpu", "--model", "tiny", "--port", "70000")
    assert r.returncode == 2 and "[0, 65535]" in r.stderr
    r = run_cli("serve", "--device", "cpu", "--model", "tiny", "--tokenizer", str(tmp_path))
    assert r.returncode == 2 and "has no tokenizer.json" in r.stderr and "loaded" not in r.stderr
    (tmp_path / "tokenizer.json").write_text("{broken")
    r = run_cli("serve", "--device", "cpu", "--model", "tiny", "--tokenizer", str(tmp_path))
    assert r.returncode == 2 and "cannot be read" in r.stderr


MORE_BAD = [
    ({"prompt": "hi", "seed": 2**64}, 400, "seed", "manual_seed"),
    ({"prompt": "hi", "seed": -(2**63) - 1}, 400, "seed", "manual_seed"),
    ({"prompt": "\ud800"}, 400, "prompt", "not valid Unicode"),
    ({"prompt": "x", "n": True}, 400, "n", "n=1"),
    ({"prompt": "x", "max_tokens": 4.5}, 400, "max_tokens", "integer"),
]


@pytest.mark.parametrize("body,status,param,words", MORE_BAD,
                         ids=[f"{i}-{b[2]}" for i, b in enumerate(MORE_BAD)])
def test_inputs_that_once_crashed_the_engine_or_gave_500(server, body, status, param, words):
    st, resp = http("POST", server.url + "/v1/completions", body)
    assert st == status, resp
    assert resp["error"]["param"] == param and words in resp["error"]["message"], resp
    assert http("GET", server.url + "/health")[0] == 200


def test_lenient_where_clients_are_and_a_tiny_temperature_is_greedy(server):
    c = client(server)
    ids = [21, 22, 23]
    r = c.completions.create(model="tiny-served", prompt=ids, max_tokens=5, temperature=1e-40,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].text == TOK.decode(engine_greedy(ids, 5))  # vLLM: < 1e-5 is greedy
    st, resp = http("POST", server.url + "/v1/completions",
                    {"prompt": ids, "max_tokens": 4.0, "response_format": {"type": "text"},
                     "suffix": "", "ignore_eos": True})
    assert st == 200 and resp["usage"]["completion_tokens"] == 4
    raw = "[" * 100_000 + "]" * 100_000
    st, resp = http("POST", server.url + "/v1/completions", raw=raw.encode()[:50_000])
    assert st == 400
    assert http("GET", server.url + "/health")[0] == 200


def test_stop_in_a_batch_ends_that_choice_when_found_and_counts_only_its_tokens(server):
    ids = [30, 31, 32, 33]
    ref = engine_greedy(ids, 40)
    pre = [TOK.decode(ref[:i]) for i in range(41)]
    # a stop string: the text of the first later token that does not occur before it
    n_stop, stop = next((i, pre[i][len(pre[i - 1]):]) for i in range(3, 41)
                        if pre[i].startswith(pre[i - 1]) and len(pre[i]) - len(pre[i - 1]) >= 2
                        and pre[i].find(pre[i][len(pre[i - 1]):]) == len(pre[i - 1])
                        and "\ufffd" not in pre[i])
    c = client(server)
    r = c.completions.create(model="tiny-served", prompt=[[40, 41], ids], max_tokens=40,
                             temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    ch = r.choices[1]
    assert ch.finish_reason == "stop" and ch.text == pre[n_stop - 1]
    assert r.usage.completion_tokens == 40 + n_stop  # choice 0 ran to 40, choice 1 to its stop


def test_stop_token_id_text_is_left_out_and_named_as_the_stop_reason(server):
    ids = [50, 51, 52]
    ref = engine_greedy(ids, 8)
    r = client(server).completions.create(model="tiny-served", prompt=ids, max_tokens=8,
                                          temperature=0,
                                          extra_body={"stop_token_ids": [ref[3]], "ignore_eos": True})
    n = ref.index(ref[3]) + 1
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and r.usage.completion_tokens == n
    assert ch.text == TOK.decode(ref[:n - 1])
    assert ch.model_extra.get("stop_reason") == ref[3]


def test_chat_stream_names_the_stop_reason_in_its_last_chunk(server):
    """vLLM's chat stream choice carries stop_reason on the final chunk, as its completions
    stream and the non-streamed chat do. Every id of the tiny vocabulary is a stop id, so the
    first token stops the request and is the stop reason; streamed and not must agree."""
    c = client(server)
    kw = dict(model="tiny-served", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
              temperature=0, extra_body={"stop_token_ids": list(range(TOK.vocab_size))})
    whole = c.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "stop"
    want = whole.model_extra.get("stop_reason")
    assert isinstance(want, int) and 0 <= want < TOK.vocab_size
    last = [ev.choices[0] for ev in c.chat.completions.create(**kw, stream=True)
            if ev.choices and ev.choices[0].finish_reason]
    assert len(last) == 1 and last[0].finish_reason == "stop"
    assert last[0].model_extra.get("stop_reason") == want


def test_a_batch_larger_than_the_cap_is_a_400_and_405_names_the_methods(server):
    st, resp = http("GET", server.url + "/v1/chat/completions")
    assert st == 405
    with urllib.request.urlopen(urllib.request.Request(server.url + "/v1/models")) as r:
        assert r.status == 200
    try:
        urllib.request.urlopen(urllib.request.Request(server.url + "/v1/completions", method="GET"))
    except urllib.error.HTTPError as e:
        assert "POST" in e.headers.get("Allow", "")


def test_knob_endpoint_types_and_which_knob_is_at_fault(tmp_path):
    with ServeProc("--max-concurrent-requests", "2") as s:
        st, body = http("POST", s.url + "/v1/completions", {"prompt": [[1], [2], [3]]})
        assert st == 400 and "--max-concurrent-requests" in body["error"]["message"]
        u = s.url + "/gpuchef/v1/scheduler"
        st, body = http("PATCH", u, {"max_num_batched_tokens": "512"})
        assert st == 400 and "JSON integer" in body["error"]["message"]
        st, body = http("PATCH", u, {"max_num_seqs": 8, "max_num_batched_tokens": 0})
        assert st == 400 and body["error"]["param"] == "max_num_batched_tokens"
        assert http("GET", u)[1]["max_num_seqs"] == 256  # nothing changed
        st, body = http("PATCH", u, {"auto_budget": "itl_p99:50ms"})
        assert st == 200, body
        st, body = http("PATCH", u, {"auto_budget": "itl_p99:-5ms"})
        assert st == 400 and body["error"]["param"] == "auto_budget"
        # named as the endpoint's key, not as the CLI flag (a tester's report)
        assert "auto_budget '" in body["error"]["message"], body
        assert "--auto-budget" not in body["error"]["message"], body
        st, body = http("PATCH", u, {"mode": 3})
        assert st == 400 and body["error"]["param"] == "mode"


def test_stop_prefix_len_equals_a_brute_force_search():
    import random

    from gpuchef.serve.server import stop_prefix_len

    def ref(text, stops):  # every k: the text's last k characters are a proper start of one
        return max([k for x in stops for k in range(1, min(len(x) - 1, len(text)) + 1)
                    if text.endswith(x[:k])], default=0)

    rng = random.Random(0)
    for _ in range(5000):
        t = "".join(rng.choice("ab") for _ in range(rng.randint(0, 8)))
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 5)))
                 for _ in range(rng.randint(1, 3))]
        assert stop_prefix_len(t, stops) == ref(t, stops), (t, stops)
    assert stop_prefix_len("x" * 10, ["y" * 100_000]) == 0  # a long stop string, no match


def test_patch_of_a_start_up_setting_says_it_is_fixed_and_names_the_live_knobs(server):
    """block_size is a real engine setting, not a typo: the 400 says it is fixed at start-up
    (with its flag) and lists the live knobs; a knob out of range names its flag too; a word
    that is no setting stays "unknown knob"; nothing changes."""
    u = server.url + "/gpuchef/v1/scheduler"
    before = http("GET", u)[1]
    st, body = http("PATCH", u, {"block_size": 32})
    err = body["error"]
    assert st == 400 and err["param"] == "block_size"
    assert err["message"].startswith("block_size is fixed at start-up (flag --block-size); "
                                     "live knobs are: max_num_batched_tokens, max_num_seqs"), err
    assert "unknown" not in err["message"] and "mode, auto_budget" in err["message"]
    st, body = http("PATCH", u, {"gpu_memory_utilization": 0.5})
    assert st == 400 and "fixed at start-up (flag --gpu-memory-utilization)" in \
        body["error"]["message"]
    st, body = http("PATCH", u, {"max_num_batched_tokens": 0})
    assert st == 400 and body["error"]["message"] == (
        "max_num_batched_tokens=0 is out of range: allowed [1, 1048576] "
        "(flag --max-num-batched-tokens)")
    st, body = http("PATCH", u, {"block_sise": 32})
    assert st == 400 and body["error"]["message"].startswith("unknown knob 'block_sise'")
    after = http("GET", u)[1]
    assert {k: v for k, v in after.items() if k != "step"} == \
        {k: v for k, v in before.items() if k != "step"}


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
