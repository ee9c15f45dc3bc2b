"""`gpuchef serve`'s /metrics against vLLM's: the per-request histograms (token counts,
`max_tokens`, `n`, inference time, time per output token) read back with prometheus_client's
parser after requests sent with the openai client and held against the trace; every vLLM
histogram's buckets against a real vLLM 0.24 /metrics; and docs/serve.md's lists of the vLLM
series exported and not exported against the exporter and those real captures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serve_proc import ServeProc, wait_until
from test_serve import client, http

from gpuchef.probes.recorder import read_trace
from gpuchef.probes.scrape import VLLM_METRICS
from gpuchef.serve.metrics import ServeMetrics, build_1_2_5_buckets

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



#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
