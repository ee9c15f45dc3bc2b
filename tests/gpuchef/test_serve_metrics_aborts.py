"""`gpuchef serve`'s /metrics and aborted requests, as vLLM 0.24 counts them (read back with
prometheus_client's parser).

vLLM 0.24 observes its per-request series (``vllm:request_success_total`` and every per-request
histogram: token counts, ``request_params_*``, e2e, queue, prefill, decode, inference, time per
output token) from ``FinishedRequestStats``, which only a request finishing in its output
processor gets (vllm/v1/engine/output_processor.py ``process_outputs`` →
``_update_stats_from_finished``); a client abort goes through ``AsyncLLM.abort`` →
``OutputProcessor.abort_requests``, which drops the request with no stats, queued or running
(vLLM issues #31503, #55634). What the request computed is still counted step by step
(``prompt_tokens_total`` at its first token, ``generation_tokens_total``, TTFT, ITL). gpuchef once
counted aborts in ``request_success_total{finished_reason="abort"}`` and the token histograms but
not in the timing ones.
"""

from __future__ import annotations

import json
import socket
import http.client as hc
from urllib.parse import urlparse

from prometheus_client.parser import text_string_to_metric_families

from serve_proc import ServeProc, wait_until
from test_serve import http, metrics, one

from gpuchef.engine_host.records import RequestRecord, StepOutput
from gpuchef.probes.scrape import VLLM_METRICS
from gpuchef.serve.metrics import ServeMetrics

S = 10 ** 9
#: every per-request vLLM histogram gpuchef exports (VLLM_METRICS keys)
PER_REQUEST = ("e2e", "queue_time", "prefill_time", "decode_time", "inference_time",
               "request_tpot", "request_prompt_tokens", "request_generation_tokens",
               "request_max_num_generation_tokens", "request_params_n",
               "request_params_max_tokens")


def samples(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_aborted_requests_queued_or_running_are_in_no_per_request_series():
    m = ServeMetrics("m")
    done = RequestRecord("a", 0, 10, 2, (1 * S, 2 * S), "length", max_tokens=2,
                         first_scheduled_ns=S // 2)
    mid = RequestRecord("b", 0, 20, 1, (3 * S // 2,), "abort", max_tokens=8,
                        first_scheduled_ns=S // 2)
    queued = RequestRecord("c", 0, 30, 0, (), "abort", max_tokens=8)
    for x in (StepOutput(1, 1 * S, (("a", 5),), (("a", 0, 10),)),
              StepOutput(2, 3 * S // 2, (("b", 7),), (("b", 0, 20),)),
              StepOutput(3, 2 * S, (("a", 6),), (), (done,)), done, mid, queued):
        (m.on_output if isinstance(x, StepOutput) else m.on_request)(x)
    got = samples(m.render().decode())

    def value(name, **labels):
        return one(got, name, **labels)

    for key in PER_REQUEST:  # the finished request alone
        name = VLLM_METRICS[key].name
        assert value(name + "_count") == 1, name
    assert value("vllm:request_prompt_tokens_sum") == 10
    assert value("vllm:e2e_request_latency_seconds_sum") == 2.0
    assert value("vllm:request_queue_time_seconds_sum") == 0.5
    assert value("vllm:request_success_total", finished_reason="length") == 1
    assert value("vllm:request_success_total", finished_reason="abort") == 0
    assert value("gpuchef:request_aborted_total") == 2
    assert value("gpuchef:request_errors_total") == 0
    # step by step, as vLLM: the aborted request's first token and prompt count
    assert value("vllm:prompt_tokens_total") == 30
    assert value("vllm:generation_tokens_total") == 3
    assert value("vllm:time_to_first_token_seconds_count") == 2
    assert value("vllm:inter_token_latency_seconds_count") == 1


def _stream(u, body):
    conn = hc.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json"})
    return conn


def _gone(conn):
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def test_a_request_aborted_while_queued_counts_nowhere_but_the_abort_counter():
    # one running request at most: the second waits in the queue until its client goes away
    with ServeProc("--max-num-seqs", "1", "--max-model-len", "4096") as s:
        u = urlparse(s.url)
        running = _stream(u, {"prompt": [7] * 16, "max_tokens": 4000, "ignore_eos": True})
        resp = running.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        queued = _stream(u, {"prompt": [9] * 40, "max_tokens": 8, "ignore_eos": True})
        assert wait_until(lambda: one(metrics(s), "vllm:num_requests_waiting") == 1)
        _gone(queued)
        assert wait_until(lambda: one(metrics(s), "gpuchef:request_aborted_total") == 1)
        m = metrics(s)
        assert one(m, "vllm:num_requests_waiting") == 0
        assert one(m, "vllm:num_requests_running") == 1
        for key in PER_REQUEST:
            assert one(m, VLLM_METRICS[key].name + "_count") == 0, key
        assert one(m, "vllm:request_success_total") == 0
        assert one(m, "vllm:prompt_tokens_total") == 16  # the running one's alone
        assert one(m, "vllm:time_to_first_token_seconds_count") == 1
        _gone(running)
        assert wait_until(lambda: one(metrics(s), "gpuchef:request_aborted_total") == 2)
        # a request that finishes is counted in all of them
        st, body = http("POST", s.url + "/v1/completions",
                        {"prompt": [5] * 4, "max_tokens": 3, "ignore_eos": True})
        assert st == 200, body
        assert wait_until(lambda: one(metrics(s), "vllm:request_success_total",
                                      finished_reason="length") == 1)
        m = metrics(s)
        for key in PER_REQUEST:
            assert one(m, VLLM_METRICS[key].name + "_count") == 1, key
        assert one(m, "vllm:request_prompt_tokens_sum") == 4
        assert one(m, "vllm:request_success_total", finished_reason="abort") == 0


import pytest  # noqa: E402

#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
