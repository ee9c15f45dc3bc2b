"""`gpuchef serve`'s /metrics against vLLM's: the per-request token histograms
(`vllm:request_prompt_tokens`, `vllm:request_generation_tokens`) read back with prometheus_client's
parser after requests sent with the openai client, their buckets against a real vLLM 0.24
/metrics, and docs/serve.md's lists of the vLLM series exported and not exported against the
exporter and those real captures.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from serve_proc import ServeProc, wait_until
from test_serve import client, http

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


def test_request_token_histograms_count_each_finished_request():
    prompts = [(list(range(3, 3 + n)), k) for n, k in [(1, 1), (7, 3), (40, 12), (130, 2)]]
    with ServeProc("--max-model-len", "512") as s:
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
    for name, values in [("vllm:request_prompt_tokens", [len(p) for p, _ in prompts]),
                         ("vllm:request_generation_tokens", [k for _, k in prompts])]:
        assert fams[name].type == "histogram"
        b, count, total = hist(fams[name])
        assert count == len(prompts) and total == sum(values), name
        # vLLM's 1-2-5 layout up to max_model_len 512, each bucket counting the values <= le
        les = [1, 2, 5, 10, 20, 50, 100, 200, 500]
        assert [le for le, _ in b] == [repr(float(x)) for x in les] + ["+Inf"], name
        assert [n for _, n in b] == [sum(v <= le for v in values) for le in les] + [count]


def test_buckets_are_vllms_for_its_max_model_len():
    """The H200 capture's own max_model_len (KV tokens / max concurrency) gives its buckets."""
    text = (ROOT / "tests/probes/data/vllm_0.24_h200_after_bench.txt").read_text()
    fams = families(text)
    info = fams["vllm:cache_config_info"].samples[0].labels
    max_model_len = round(float(info["kv_cache_size_tokens"])
                          / float(info["kv_cache_max_concurrency"]))
    assert max_model_len == 8192
    ours = families(ServeMetrics("m", max_model_len=max_model_len).render().decode())
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        vllm_les = [le for le, _ in hist(fams[name])[0]]
        assert vllm_les == [le for le, _ in hist(ours[name])[0]], name
        assert vllm_les[:-1] == [repr(float(x)) for x in build_1_2_5_buckets(max_model_len)]


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

