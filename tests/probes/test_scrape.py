"""/metrics scraping: gpuchef serve's own exposition (rendered by prometheus_client), SGLang's
documented names (a fixture built from its docs, both prefixes), intervals between scrapes, and
every way a scrape fails (one status line, the scraper goes on)."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from gpuchef.engine_host.vocab.records import RequestRecord, StepOutput, StepRecord
from gpuchef.probes import scrape
from gpuchef.probes.scrape import Scraper, delta, parse_metrics
from gpuchef.serve.metrics import ServeMetrics

DATA = Path(__file__).parent / "data"


def step(i, prefill, decode, running=3, waiting=1, kv=10):
    return StepRecord(i, i * 10_000_000, i * 10_000_000 + 5_000_000, 4.0, "chunked", 512, 256, 0,
                      1, 1 if prefill else 0, prefill, decode, 0, running, waiting, 0, kv, 100)


def test_gpuchefs_own_metrics_read_back_as_fed():
    m = ServeMetrics("tiny", kv_blocks_total=100)
    m.on_step(step(0, 64, 0))
    m.on_step(step(1, 32, 2, running=5, waiting=2, kv=40))
    m.on_output(StepOutput(1, 2_000_000_000, (("a", 1), ("b", 2)), (("a", 1_000_000_000, 7),)))
    m.on_output(StepOutput(2, 2_020_000_000, (("a", 3),), ()))
    m.on_request(RequestRecord("a", 1_000_000_000, 7, 2, (2_000_000_000, 2_020_000_000), "length"))
    s = parse_metrics(m.render().decode(), url="x")
    assert s.server == "gpuchef" and not s.error
    assert s.values["running"] == 5 and s.values["waiting"] == 2
    assert s.values["kv_usage"] == pytest.approx(0.4)
    assert s.values["generation_tokens"] == 3 and s.values["prompt_tokens"] == 7
    assert s.values["requests_finished"] == 1
    assert s.hists["ttft"].count == 1 and s.hists["ttft"].sum == pytest.approx(1.0)
    assert s.hists["itl"].count == 1 and s.hists["itl"].sum == pytest.approx(0.02)
    assert s.hists["step_prefill_tokens"].sum == 96
    assert s.hists["iteration_tokens"].count == 2 and s.hists["iteration_tokens"].sum == 98
    assert s.values["max_num_batched_tokens"] == 512


def test_sglang_names_both_prefixes_and_label_sets_summed():
    text = (DATA / "sglang_metrics.txt").read_text()
    s = parse_metrics(text)
    assert s.server == "sglang"
    assert s.values["prompt_tokens"] == 1500  # tp_rank 0 + 1
    assert s.values["running"] == 12 and s.values["waiting"] == 3
    assert s.values["kv_usage"] == pytest.approx(0.28)
    assert s.hists["ttft"].count == 6 and s.hists["itl"].sum == pytest.approx(0.5)
    new = parse_metrics(text.replace("sglang:", "sglang_"))
    assert new.values == s.values and new.hists == s.hists


def test_delta_rates_interval_histograms_and_a_restart():
    m = ServeMetrics("tiny", kv_blocks_total=100)
    a = parse_metrics(m.render().decode(), t_ns=0)
    for i in range(4):
        m.on_step(step(i, 100 if i % 2 else 0, 8))
    m.on_output(StepOutput(0, 10, tuple((f"r{k}", 1) for k in range(50)), ()))
    b = parse_metrics(m.render().decode(), t_ns=500_000_000)
    d = delta(a, b)
    assert d.dt_s == 0.5
    assert d.rates["generation_tokens"] == pytest.approx(100.0)  # 50 tokens / 0.5 s
    assert d.hist_count["iteration_tokens"] == 4
    assert d.hist_mean["iteration_tokens"] == pytest.approx((8 + 108 + 8 + 108) / 4)
    per_bucket = dict(d.hist_buckets["iteration_tokens"])
    assert per_bucket[8.0] == 2 and per_bucket[128.0] == 2 and sum(per_bucket.values()) == 4
    restarted = parse_metrics(ServeMetrics("tiny").render().decode(), t_ns=10**9)
    assert delta(b, restarted).rates["generation_tokens"] is None  # went down: no negative rate


def test_scraper_failures_are_one_status_line_and_it_goes_on():
    answers = iter(["not prometheus {{{", "# HELP foo x\n# TYPE foo gauge\nfoo 1\n",
                    (DATA / "sglang_metrics.txt").read_text()])
    got = []
    s = Scraper("http://127.0.0.1:9", hz=10, on_sample=got.append,
                fetch=lambda url, t: next(answers))
    assert s.url == "http://127.0.0.1:9/metrics"
    a = s.scrape_once()
    assert a.error.startswith("not Prometheus text format") and s.status
    b = s.scrape_once()
    assert "unknown server" in b.error
    c = s.scrape_once()
    assert not c.error and s.status == "" and s.n_ok == 1 and s.n_failed == 2
    assert got == [a, b, c]
    with pytest.raises(ValueError, match="scrape-hz"):
        Scraper("http://x", hz=0)


def test_scraper_against_real_sockets_refused_and_404():
    import http.server

    refused = Scraper("http://127.0.0.1:1", hz=4, timeout_s=1.0).scrape_once()
    assert refused.error.startswith("cannot reach it")

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        r = Scraper(f"http://127.0.0.1:{srv.server_port}", hz=4).scrape_once()
        assert r.error.startswith("HTTP 404") and "no /metrics" in r.error
    finally:
        srv.shutdown()
        srv.server_close()


def test_real_vllm_024_metrics_captured_on_the_h200():
    """vLLM 0.24's own /metrics text (plain `vllm serve`, dummy Llama-3-8B weights, under the
    load of `gpuchef bench --base-url`: the first 200 Azure requests at 3x, H200 2026-12-01,
    benchmarks/results/2026-12-01-h200-s5). The counters equal what that client sent and got
    (180,695 prompt and 47,050 output tokens, 200 requests); the interval from the scrape
    taken under load to the one after it is a positive generation rate."""
    after = parse_metrics((DATA / "vllm_0.24_metrics_after.txt").read_text(), t_ns=20 * 10**9)
    assert after.server == "vllm" and not after.error
    assert after.values["prompt_tokens"] == 180695
    assert after.values["generation_tokens"] == 47050
    assert after.values["requests_finished"] == 200
    assert after.values["running"] == 0 and after.values["waiting"] == 0
    assert after.hists["ttft"].count == 200
    assert after.hists["itl"].count == 47050 - 200  # vLLM: one per token after the first
    load = parse_metrics((DATA / "vllm_0.24_metrics_load.txt").read_text(), t_ns=5 * 10**9)
    assert load.values["running"] > 0 and 0 < load.values["kv_usage"] < 1
    d = delta(load, after)
    assert d.rates["generation_tokens"] > 0 and d.hist_count["iteration_tokens"] > 0


def test_one_table_of_vllm_names_matches_real_vllm_and_gpuchef_serve():
    """VLLM_METRICS is the one table of vLLM's family names: every entry is a family of the real
    vLLM 0.24 /metrics text captured on the H200 (so a typo fails here), and gpuchef serve
    exports each under that name with vLLM's help text (read back with prometheus_client's own
    parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpuchef.probes.scrape import GPUCHEF_METRICS, VLLM_METRICS

    real = sorted(DATA.glob("vllm_0.24_metrics_*.txt"))
    assert real
    vllm = {f.name: f for f in text_string_to_metric_families(real[-1].read_text())}
    ours = {f.name: f for f in text_string_to_metric_families(
        ServeMetrics("tiny", kv_blocks_total=10).render().decode())}
    kinds = {"gauge": "gauge", "counter": "counter", "hist": "histogram"}
    for key, m in VLLM_METRICS.items():
        assert m.name in vllm, (key, m.name)
        assert vllm[m.name].type == kinds[m.kind], (key, vllm[m.name].type)
        assert vllm[m.name].documentation == m.help, (key, vllm[m.name].documentation)
        assert m.name in ours and ours[m.name].type == kinds[m.kind], key
        assert ours[m.name].documentation == m.help, key
    for key, m in GPUCHEF_METRICS.items():
        assert m.name in ours and ours[m.name].type == kinds[m.kind], key


def test_untyped_counters_and_gauges_are_read_by_name():
    """No `# TYPE` lines: prometheus_client reads every sample as an "unknown" family, a counter
    under its whole `_total` name; the values are those of the text."""
    text = ("vllm:num_requests_running 3\nvllm:num_requests_waiting 2\n"
            'vllm:prompt_tokens_total{engine="0"} 100\nvllm:prompt_tokens_total{engine="1"} 20\n'
            "vllm:generation_tokens_total 7\n")
    a = parse_metrics(text, t_ns=0)
    assert a.values == {"running": 3, "waiting": 2, "prompt_tokens": 120, "generation_tokens": 7}
    assert not a.bad and a.server == "vllm"
    b = parse_metrics(text.replace(" 100", " 140"), t_ns=2 * 10**9)
    assert delta(a, b).rates["prompt_tokens"] == pytest.approx(40 / 2)
    # a typed family that is not a counter is not read as one under its _total name
    typed = "# TYPE vllm:prompt_tokens_total gauge\nvllm:prompt_tokens_total 5\n"
    assert "prompt_tokens" not in parse_metrics(typed).values


@pytest.mark.parametrize("series,quantity,value,ok", [
    ("vllm:num_requests_waiting", "waiting", "-5", False),
    ("vllm:num_requests_waiting", "waiting", "NaN", False),
    ("vllm:num_requests_running", "running", "+Inf", False),
    ("vllm:kv_cache_usage_perc", "kv_usage", "1e308", False),
    ("vllm:kv_cache_usage_perc", "kv_usage", "1.5", False),
    ("vllm:kv_cache_usage_perc", "kv_usage", "1.0004", True),  # float sums over engines
    ("vllm:kv_cache_usage_perc", "kv_usage", "0", True),
    ("vllm:prompt_tokens_total", "prompt_tokens", "-1", False),
])
def test_impossible_values_are_refused_with_a_line_naming_the_series(series, quantity, value, ok):
    kind = "counter" if series.endswith("_total") else "gauge"
    text = (f"# TYPE {series} {kind}\n{series} {value}\n"
            "# TYPE vllm:num_requests_swapped gauge\nvllm:num_requests_swapped 0\n"
            "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 1\n")
    s = parse_metrics(text)
    if ok:
        assert s.values[quantity] == pytest.approx(float(value)) and not s.bad
        return
    assert quantity not in s.values and quantity in s.exported
    assert series in s.bad[quantity] and repr(float(value)) in s.bad[quantity]
    # the scraper's status line names it; the other series still come through
    sc = Scraper("http://h:1", fetch=lambda url, t: text)
    got = sc.scrape_once()
    assert not got.error and got.values["generation_tokens"] == 1
    assert sc.status == f"http://h:1/metrics: {s.bad[quantity]}"
    # and the trace keeps the refusal
    from gpuchef.probes.scrape import sample_from_json, sample_to_json
    back = sample_from_json(sample_to_json(got))
    assert back.bad == got.bad and back.exported == got.exported


def test_a_family_with_no_sample_yet_is_exported_not_absent():
    """A labelled histogram with no child yet has only its HELP/TYPE lines: exported (the
    server has the series, nothing happened), not in ``hists``."""
    text = ("# HELP vllm:iteration_tokens_total x\n# TYPE vllm:iteration_tokens_total histogram\n"
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
    s = parse_metrics(text)
    assert "iteration_tokens" in s.exported and "iteration_tokens" not in s.hists
    assert "waiting" not in s.exported


def test_vllm_024_h200_scrapes_around_a_bench_match_its_client():
    """vLLM 0.24's /metrics on the H200 right before and right after `gpuchef bench --base-url`
    (600 Azure requests at 3×, session 9, results/2026-12-02-h200-s9): the interval's counter
    deltas equal what the client sent and got (its result JSON: 553,386 prompt and 156,892
    generated tokens, 600 requests), and the server's TTFT/ITL interval means lie just under
    the client's (73.6 / 9.49 ms: the client adds its HTTP round trip to TTFT)."""
    a = parse_metrics((DATA / "vllm_0.24_h200_before_bench.txt").read_text(), t_ns=0)
    b = parse_metrics((DATA / "vllm_0.24_h200_after_bench.txt").read_text(), t_ns=10**9)
    assert a.server == b.server == "vllm" and not a.error and not b.error
    d = delta(a, b)
    assert d.rates["prompt_tokens"] == 553386
    assert d.rates["generation_tokens"] == 156892
    assert d.rates["requests_finished"] == 600
    assert d.hist_count["ttft"] == d.hist_count["e2e"] == 600
    # one ITL per generated token after the first of each request
    assert d.hist_count["itl"] == 156892 - 600
    assert 0.060 < d.hist_mean["ttft"] < 0.0736
    assert 0.0090 < d.hist_mean["itl"] < 0.0095
    assert d.gauges["running"] == d.gauges["waiting"] == 0


# -- percentiles from a histogram: the bucket, not only the interpolated point ------------------

#: vLLM V1's vllm:e2e_request_latency_seconds buckets (s), as its /metrics exports them
E2E_LE = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
          120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _e2e_text(obs) -> str:
    """vLLM's E2E histogram holding the observations ``obs`` (s): cumulative bucket counts,
    counted here independently of probes.scrape."""
    lab = 'engine="0",model_name="m"'
    lines = ["# TYPE vllm:e2e_request_latency_seconds histogram"]
    for le in (*E2E_LE, math.inf):
        n = sum(1 for x in obs if x <= le)
        le_s = "+Inf" if le == math.inf else str(le)
        lines.append(f'vllm:e2e_request_latency_seconds_bucket{{le="{le_s}",{lab}}} {n}')
    lines += [f"vllm:e2e_request_latency_seconds_count{{{lab}}} {len(obs)}",
              f"vllm:e2e_request_latency_seconds_sum{{{lab}}} {sum(obs)}", ""]
    return "\n".join(lines)


def _interval_p(obs, q):
    """``q``-quantile of the E2E histogram's interval counts between an empty scrape and one
    holding ``obs``."""
    d = delta(parse_metrics(_e2e_text([]), t_ns=0), parse_metrics(_e2e_text(obs), t_ns=10**9))
    return scrape.bucket_quantile(d.hist_buckets["e2e"], q)


def test_histogram_p99_gives_its_bucket_bounds_not_only_the_interpolated_point():
    # 95 requests under 2.5 s, 5 in (2.5, 5] s near 2.85 s: the true p99 (the 99th smallest of
    # 100, nearest rank) is 2.85 s; Prometheus' interpolation puts it at 4.5 s
    obs = [0.4] * 60 + [1.2] * 35 + [2.6, 2.7, 2.8, 2.85, 2.9]
    true_p99 = sorted(obs)[99 - 1]
    assert true_p99 == 2.85
    p = _interval_p(obs, 0.99)
    assert p.value == pytest.approx(4.5)  # 2.5 + (5 - 2.5) · (99 - 95) / 5
    assert (p.lower, p.upper) == (2.5, 5.0) and not p.open_ended
    assert p.lower < true_p99 <= p.upper
    assert scrape.hist_quantile_text(p) == "2.5–5 s"
    # under 1 s the bounds read in ms; the first bucket's lower bound is 0
    p50 = _interval_p(obs, 0.5)
    assert (p50.lower, p50.upper) == (0.3, 0.5) and scrape.hist_quantile_text(p50) == "300–500 ms"
    assert scrape.hist_quantile_text(_interval_p([0.1] * 3, 0.5)) == "0–300 ms"


def test_histogram_percentile_in_the_inf_bucket_has_only_a_lower_bound():
    obs = [1.0] * 90 + [9000.0] * 10  # 10 % beyond the last finite bucket (7680 s)
    p = _interval_p(obs, 0.99)
    assert p.open_ended and p.lower == 7680.0 and p.upper == float("inf")
    assert p.value == 7680.0  # Prometheus' answer: the highest finite bound
    assert scrape.hist_quantile_text(p) == "> 7,680 s"


def test_empty_histogram_percentile_is_empty_not_zero():
    p = _interval_p([], 0.99)
    assert p.empty and math.isnan(p.lower) and math.isnan(p.upper)
    assert scrape.hist_quantile_text(p) == "–"
    assert scrape.bucket_quantile((), 0.5).empty
