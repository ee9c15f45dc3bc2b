"""``--result-json`` when nothing succeeded: ``vllm bench serve`` writes 0.0 for a latency
statistic over no request (its ``calculate_metrics``: ``np.mean(ttfts or 0) * 1000``, likewise
std, median and each percentile of TTFT, TPOT, ITL and E2EL), not null; gpuchef's own NaN ("no
data") stays None everywhere else. The reference is that numpy expression on the empty lists."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_http_load import FakeServer

from gpuchef.commands.cli import _register, cli
from gpuchef.engine_host.vocab.records import RequestRecord
from gpuchef.probes.metrics import summarize

_register()

PCTS = (50.0, 99.0)


def vllm_empty(values: list) -> dict[str, float]:
    """vllm's statistics of one metric's values (s → ms), as calculate_metrics computes them."""
    out = {"mean": np.mean(values or 0) * 1000, "median": np.median(values or 0) * 1000,
           "std": np.std(values or 0) * 1000}
    out.update({f"p{int(p)}": np.percentile(values or 0, p) * 1000 for p in PCTS})
    return {k: float(v) for k, v in out.items()}


def latency_keys(d: dict, stem: str) -> dict[str, float]:
    return {k: d[f"{k}_{stem}_ms"] for k in ("mean", "median", "std", "p50", "p99")}


def test_nothing_completed_writes_vllms_zeros_not_null():
    failed = [RequestRecord(f"req-{i}", 1000 * i, 10, 0, (), "error", error="http: HTTP 500",
                            ended_ns=1000 * i + 5) for i in range(3)]
    m = summarize(failed, 1.0, percentiles=PCTS)
    d = m.to_dict(empty_as_zero=True)
    for stem in ("ttft", "tpot", "itl", "e2el"):
        assert latency_keys(d, stem) == vllm_empty([]), stem
    assert d["completed"] == 0 and d["failed"] == 3 and d["request_throughput"] == 0.0
    # not latency statistics: no data stays None (no steps, no probes)
    assert d["busy_fraction"] is None and d["median_probe_e2el_ms"] is None
    assert d["request_goodput"] is None  # vllm: None without --goodput
    assert m.to_dict()["mean_ttft_ms"] is None  # the figures themselves keep NaN = no data
    json.dumps(d, allow_nan=False)


def test_only_the_empty_metric_is_zero():
    """One-token requests: TTFT and E2EL measured, no TPOT or ITL (vllm: tpots and itls empty)."""
    a = 10**9
    one = [RequestRecord(f"req-{i}", a, 10, 1, (a + (i + 1) * 10**8,), "length")
           for i in range(2)]
    d = summarize(one, 1.0, percentiles=PCTS).to_dict(empty_as_zero=True)
    assert latency_keys(d, "tpot") == latency_keys(d, "itl") == vllm_empty([])
    assert latency_keys(d, "ttft") == pytest.approx(vllm_empty([0.1, 0.2]))
    assert d["mean_e2el_ms"] == pytest.approx(150.0)


def test_bench_and_ab_over_http_write_zeros_when_every_request_failed(tmp_path):
    s = FakeServer().start()
    ok = FakeServer().start()
    try:
        s.plan.update({f"req-{i}": "500" for i in range(3)})
        rj = tmp_path / "b.json"
        r = CliRunner().invoke(cli, ["bench", "--base-url", s.url, "--num-prompts", "3",
                                     "--input-len", "8", "--output-len", "3", "--vocab-size",
                                     "100", "--result-json", str(rj)], catch_exceptions=False)
        assert r.exit_code == 1 and "no request succeeded" in r.output, r.output
        d = json.loads(rj.read_text())
        assert d["completed"] == 0 and d["failed"] == 3
        for stem in ("ttft", "tpot", "itl", "e2el"):
            assert latency_keys(d, stem) == vllm_empty([]), stem
        # ab: B's results (vllm's keys) and its runs' metrics
        rj = tmp_path / "ab.json"
        r = CliRunner().invoke(cli, ["ab", "--a", f"url={ok.url}", "--b", f"url={s.url}",
                                     "--num-prompts", "3", "--input-len", "8", "--output-len",
                                     "3", "--vocab-size", "100", "--result-json", str(rj)],
                               catch_exceptions=False)
        assert r.exit_code == 1, r.output
        d = json.loads(rj.read_text())
        assert d["results"]["B"]["completed"] == 0
        assert d["results"]["B"]["mean_ttft_ms"] == d["results"]["B"]["p99_e2el_ms"] == 0.0
        assert d["results"]["A"]["mean_ttft_ms"] > 0.0
        assert [x["metrics"]["mean_ttft_ms"] for x in d["runs"] if x["label"] == "B"] == [0.0]
    finally:
        s.stop()
        ok.stop()
