"""gpuchef.serve.metrics: `gpuchef serve`'s /metrics against vLLM's, read back with
prometheus_client's parser: the per-request histograms (token counts, `max_tokens`, `n`,
inference time, time per output token) after requests sent with the openai client and held
against the trace; every vLLM histogram's buckets against a real vLLM 0.24 /metrics;
docs/serve.md's lists of the vLLM series exported and not exported against the exporter and
those real captures; and aborted requests, as vLLM 0.24 counts them.

vLLM 0.24 observes its per-request series (``vllm:request_success_total`` and every per-request
histogram: token counts, ``request_params_*``, e2e, queue, prefill, decode, inference, time per
output token) from ``FinishedRequestStats``, which only a request finishing in its output
processor gets (vllm/v1/engine/output_processor.py ``process_outputs`` →
``_update_stats_from_finished``); a client abort goes through ``AsyncLLM.abort`` →
``OutputProcessor.abort_requests``, which drops the request with no stats, queued or running
(vLLM issues #31503, #55634). What the request computed is still counted step by step
(``prompt_tokens_total`` at its first token, ``generation_tokens_total``, TTFT, ITL): an abort
is in no per-request series.
"""

from __future__ import annotations

import http.client as hc
import json
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_proc import ServeProc, wait_until
from test_serve import client, http, metrics, one

from gpuchef.engine_host.vocab.records import RequestRecord, StepOutput
from gpuchef.probes.recorder import read_trace
from gpuchef.probes.scrape import VLLM_METRICS
from gpuchef.serve.metrics import ServeMetrics, build_1_2_5_buckets


# ---- the per-request histograms, the buckets, the docs' lists ------------------------------------

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted((ROOT / "tests/probes/data").glob("vllm_0.24_*.txt"))


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def hist(fam) -> tuple[list[tuple[str, float]], float, float]:
    """(cumulative (le, count) in order, count, sum) of a histogram family of one label set."""
    b = [(s.labels["le"], s.value) for s in fam.samples if s.name.endswith("_bucket")]
    count = next(s.value for s in fam.samples if s.name.endswith("_count"))
    total = next(s.value for s in fam.samples if s.name.endswith("_sum"))
    return b, count, total


def test_per_request_histograms_count_each_finished_request(tmp_path):
    prompts = [(list(range(3, 3 + n)), k) for n, k in [(1, 1), (7, 3), (40, 12), (130, 2)]]
    trace = tmp_path / "t.jsonl"
    with ServeProc("--max-model-len", "512", "--trace", str(trace)) as s:
        c = client(s)
        for ids, k in prompts:
            r = c.completions.create(model="tiny", prompt=ids, max_tokens=k,
                                     extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == k

        def scraped():  # the last request's record may reach /metrics just after its response
            fams = families(http("GET", s.url + "/metrics")[1])
            return fams if hist(fams["vllm:request_generation_tokens"])[1] == 4 else None

        fams = wait_until(scraped, timeout=10)
    assert fams, "the 4 requests never showed on /metrics"
    les = [1, 2, 5, 10, 20, 50, 100, 200, 500]  # vLLM's 1-2-5 layout up to max_model_len 512
    outs = [k for _, k in prompts]
    for name, values, bounds in [
            ("vllm:request_prompt_tokens", [len(p) for p, _ in prompts], les),
            ("vllm:request_generation_tokens", outs, les),
            ("vllm:request_max_num_generation_tokens", outs, les),  # n = 1
            ("vllm:request_params_max_tokens", outs, les),
            ("vllm:request_params_n", [1] * 4, [1, 2, 5, 10, 20])]:
        assert fams[name].type == "histogram"
        b, count, total = hist(fams[name])
        assert count == len(prompts) and total == sum(values), name
        assert [le for le, _ in b] == [repr(float(x)) for x in bounds] + ["+Inf"], name
        assert [n for _, n in b] == [sum(v <= le for v in values) for le in bounds] + [count]
    # the timings are the trace's RequestRecords', as vLLM defines them
    reqs = read_trace(trace).requests
    assert len(reqs) == 4
    _, count, total = hist(fams["vllm:request_inference_time_seconds"])
    assert count == 4 and total == pytest.approx(
        sum(r.token_times_ns[-1] - r.first_scheduled_ns for r in reqs) / 1e9, rel=1e-6)
    _, count, total = hist(fams["vllm:request_time_per_output_token_seconds"])
    assert count == 4 and total == pytest.approx(  # a one-token request counts 0, as in vLLM
        sum((r.tpot_ms or 0.0) / 1e3 for r in reqs), rel=1e-6)
    assert sum(r.tpot_ms is None for r in reqs) == 1


def test_buckets_are_vllms_for_its_max_model_len():
    """Every vLLM histogram gpuchef exports has the buckets of the H200 capture's, whose
    max_model_len (KV tokens / max concurrency) sets the token-count ones."""
    text = (ROOT / "tests/probes/data/vllm_0.24_h200_after_bench.txt").read_text()
    fams = families(text)
    info = fams["vllm:cache_config_info"].samples[0].labels
    max_model_len = round(float(info["kv_cache_size_tokens"])
                          / float(info["kv_cache_max_concurrency"]))
    assert max_model_len == 8192
    ours = families(ServeMetrics("m", max_model_len=max_model_len).render().decode())
    hists = [m.name for m in VLLM_METRICS.values() if m.kind == "hist"]
    assert "vllm:request_prompt_tokens" in hists and "vllm:request_params_n" in hists
    for name in hists:
        assert [le for le, _ in hist(fams[name])[0]] == [le for le, _ in hist(ours[name])[0]], \
            name
    les = [le for le, _ in hist(fams["vllm:request_prompt_tokens"])[0]]
    assert les[:-1] == [repr(float(x)) for x in build_1_2_5_buckets(max_model_len)]


def exposed(name: str, kind: str) -> str:
    """The name a family is written under: a counter's with ``_total``."""
    return name + "_total" if kind == "counter" else name


def test_docs_list_exactly_the_vllm_series_exported_and_not():
    doc = (ROOT / "docs/serve.md").read_text()
    section = doc[doc.index("## Metrics"):doc.index("## Driving it")]
    table = {m.group(1) for m in re.finditer(r"^\| `(vllm:[a-z0-9_]+)", section, re.M)}
    rest = section[section.index("**vLLM series not exported**"):]
    not_listed = set(re.findall(r"`(vllm:[a-z0-9_]+)`", rest[:rest.index("Nor the series")]))
    # the table is the names table and what the exporter writes
    names = {exposed(m.name, m.kind) for m in VLLM_METRICS.values()}
    assert table == names
    ours = families(ServeMetrics("m").render().decode())
    written = {exposed(f.name, f.type) for f in ours.values() if f.name.startswith("vllm:")}
    assert written == names
    # the "not exported" list is what vLLM 0.24 wrote and gpuchef does not
    vllm = set()
    for path in CAPTURES:
        for f in text_string_to_metric_families(path.read_text()):
            if f.name.startswith("vllm:") and not f.name.endswith("_created"):
                vllm.add(exposed(f.name, f.type))
    assert names <= vllm, names - vllm
    assert not_listed == vllm - names


# ---- aborted requests ----------------------------------------------------------------------------

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


#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
