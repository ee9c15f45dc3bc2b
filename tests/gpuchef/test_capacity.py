"""Capacity search (Sarathi-Serve's bisection over request rate) against synthetic latency
models whose capacity is known in closed form, plus SLO/tolerance parsing and the CLI path."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuchef.capacity import (SLO, CapacityResult, Tolerance, capacity_ratio, capacity_search,
                              parse_slos, parse_tolerance)
from gpuchef.cli import _register, cli
from gpuchef.engine_host.config import ConfigError

_register()


def queueing_model(base_ms: float, cap_rps: float):
    """itl_p99 = base / (1 − rate/cap): an M/M/1-like blow-up at ``cap`` (inf beyond)."""
    def measure(rate: float) -> dict[str, float]:
        u = rate / cap_rps
        return {"itl_p99": base_ms / (1 - u) if u < 1 else math.inf}
    return measure


def known_capacity(base_ms: float, cap_rps: float, slo_ms: float) -> float:
    # base/(1 − r/cap) <= slo  <=>  r <= cap·(1 − base/slo)
    return cap_rps * (1 - base_ms / slo_ms)


def test_bisection_converges_to_the_known_capacity():
    slos = parse_slos("itl_p99:100ms")
    truth = known_capacity(20.0, 10.0, 100.0)  # 8 req/s
    res = capacity_search(queueing_model(20.0, 10.0), slos, 0.5, 64.0, Tolerance(rel=0.01))
    assert res.converged and not res.at_upper_bound
    lo, hi = res.bracket
    assert lo <= truth <= hi
    assert hi / lo - 1 <= 0.01
    assert res.capacity == pytest.approx(truth, rel=0.01)
    # every probe agrees with the model
    for p in res.probes:
        assert p.met == (p.rate <= truth)


def test_absolute_tolerance_and_probe_count():
    slos = parse_slos("itl_p99:50")
    truth = known_capacity(10.0, 40.0, 50.0)  # 32 req/s
    res = capacity_search(queueing_model(10.0, 40.0), slos, 1.0, 100.0, parse_tolerance("0.25"))
    assert res.bracket[1] - res.bracket[0] <= 0.25
    assert abs(res.capacity - truth) <= 0.25
    # geometric bisection: log2(log(100)/log(1 + 0.25/32)) ≈ 10 midpoints + the two ends
    assert len(res.probes) <= 13


@settings(max_examples=40, deadline=None)
@given(base=st.floats(1.0, 50.0), cap=st.floats(0.5, 500.0), factor=st.floats(1.5, 20.0))
def test_bisection_brackets_the_truth_for_any_model(base, cap, factor):
    slo = base * factor
    truth = known_capacity(base, cap, slo)
    lo, hi = truth / 7.0, truth * 5.0
    res = capacity_search(queueing_model(base, cap), [SLO("itl", "p99", slo)], lo, hi,
                          Tolerance(rel=0.02), max_probes=40)
    a, b = res.bracket
    assert a <= truth * (1 + 1e-9) and b >= truth * (1 - 1e-9)
    assert b / a - 1 <= 0.02


def test_a_setting_that_never_meets_the_slo_reports_none():
    slos = parse_slos("itl_p99:100ms")
    res = capacity_search(lambda r: {"itl_p99": 500.0}, slos, 0.5, 32.0)
    assert res.capacity is None
    assert len(res.probes) == 1  # fails at rate_lo: nothing more to try
    assert "none" in res.describe() and "0.5 req/s" in res.describe()
    ok = capacity_search(queueing_model(20.0, 10.0), slos, 0.5, 32.0)
    assert capacity_ratio(res, ok)[1].startswith("∞")
    assert capacity_ratio(ok, res)[0] == 0.0
    assert capacity_ratio(res, res)[0] is None and "neither" in capacity_ratio(res, res)[1]


def test_no_data_does_not_meet_an_slo():
    res = capacity_search(lambda r: {"itl_p99": float("nan")}, parse_slos("itl_p99:100"), 1, 2)
    assert res.capacity is None


def test_met_at_the_upper_bound_is_a_lower_bound():
    res = capacity_search(lambda r: {"itl_p99": 1.0}, parse_slos("itl_p99:100"), 1.0, 8.0)
    assert res.capacity == 8.0 and res.at_upper_bound
    assert res.describe().startswith("≥ 8")
    b = capacity_search(queueing_model(20.0, 10.0), parse_slos("itl_p99:100"), 1.0, 8.5)
    assert capacity_ratio(b, res)[1].startswith("≥ ")


def test_every_slo_must_hold():
    slos = parse_slos("itl_p99:100ms,ttft_p99:2s")
    truth_itl = known_capacity(20.0, 10.0, 100.0)  # 8

    def measure(rate):
        return {"itl_p99": queueing_model(20.0, 10.0)(rate)["itl_p99"],
                "ttft_p99": 100.0 * rate}  # 2000 ms at 20 req/s: ITL binds first

    res = capacity_search(measure, slos, 1.0, 64.0, Tolerance(rel=0.01))
    assert res.capacity == pytest.approx(truth_itl, rel=0.01)

    def measure2(rate):
        return {"itl_p99": 1.0, "ttft_p99": 400.0 * rate}  # TTFT binds at 5 req/s

    assert capacity_search(measure2, slos, 1.0, 64.0, Tolerance(rel=0.01)).capacity == \
        pytest.approx(5.0, rel=0.01)


def test_probe_limit_reports_not_converged():
    res = capacity_search(queueing_model(20.0, 10.0), parse_slos("itl_p99:100"), 0.01, 1e5,
                          Tolerance(rel=1e-6), max_probes=5)
    assert not res.converged and len(res.probes) == 5
    assert "not converged" in res.describe()
    assert isinstance(res, CapacityResult)


def test_slo_values_from_bench_metrics():
    from gpuchef.probes.metrics import summarize
    from gpuchef.engine_host.records import RequestRecord

    ms = 1_000_000
    recs = [RequestRecord(f"req-{i}", 0, 10, 3, (100 * ms, 110 * ms, 130 * ms), "length")
            for i in range(3)]
    m = summarize(recs, 1.0, percentiles=(50, 90, 99))
    s = parse_slos("ttft_p90:150ms itl_mean:15 e2el_median:0.2s tpot_p50:14")
    assert [x.value(m) for x in s] == pytest.approx([100.0, 15.0, 130.0, 15.0])
    assert [x.met(m) for x in s] == [True, True, True, False]


@pytest.mark.parametrize("spec,needle", [
    ("itl:100", "METRIC_STAT:VALUE"),
    ("latency_p99:100", "metric one of ttft, tpot, itl, e2el"),
    ("itl_p99", "METRIC_STAT:VALUE"),
    ("itl_p101:100", "out of range: allowed [0, 100]"),
    ("itl_p99:fast", "'fast' is not a duration"),
    ("itl_p99:0ms", "must be > 0"),
    ("itl_p99:1,itl_p99:2", "given twice"),
    ("", "empty"),
])
def test_bad_slo_is_one_clear_message(spec, needle):
    with pytest.raises(ConfigError, match=None) as e:
        parse_slos(spec)
    assert needle in str(e.value)


def test_tolerance_parsing():
    assert parse_tolerance("5%") == Tolerance(rel=0.05, abs_rps=None)
    assert parse_tolerance("0.5") == Tolerance(rel=None, abs_rps=0.5)
    for bad in ("-1", "0%", "150%", "lots"):
        with pytest.raises(ConfigError):
            parse_tolerance(bad)


def test_cli_capacity_on_cpu(tmp_path):
    """The whole path on the tiny model: both settings searched, a ratio, JSON with probes."""
    out = tmp_path / "cap.json"
    r = CliRunner().invoke(cli, [
        "ab", "--device", "cpu", "--model", "tiny", "--num-prompts", "6", "--input-len", "64",
        "--output-len", "8", "--capacity", "--slo", "ttft_p99:5s,itl_p99:5s", "--rate-lo", "8",
        "--rate-hi", "16", "--tolerance", "60%", "--result-json", str(out)],
        catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "Capacity A:" in r.output and "Capacity B:" in r.output
    assert "Capacity ratio B/A:" in r.output
    d = json.loads(out.read_text())
    assert set(d["capacity"]) == {"A", "B"}
    for k in "AB":
        assert d["capacity"][k]["probes"], k
        assert d["capacity"][k]["probes"][0]["rate_rps"] == 8.0


@pytest.mark.parametrize("args,needle", [
    (["--capacity"], "--capacity needs --slo"),
    (["--capacity", "--slo", "itl_p99:100", "--rate-lo", "5", "--rate-hi", "2"],
     "--rate-lo 5 must be below --rate-hi 2"),
    (["--capacity", "--slo", "itl_p99:100", "--interleave"], "drop --interleave"),
    (["--slo", "itl_p99:100"], "--slo is for --capacity"),
    (["--capacity", "--slo", "itl_p99:100", "--tolerance", "x"], "--tolerance 'x'"),
])
def test_cli_capacity_bad_flags(args, needle):
    r = CliRunner().invoke(cli, ["ab", "--device", "cpu", "--model", "tiny", "--num-prompts", "2",
                                 *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_short_probes_that_met_are_flagged():
    """20 requests at 32 req/s arrive in 0.6 s: "met" there says nothing about sustaining it."""
    from types import SimpleNamespace as NS

    from gpuchef.capacity import MIN_PROBE_SPAN_S, Probe

    long_run = Probe(2.0, True, {}, NS(completed=60))      # 30 s of arrivals
    short_met = Probe(32.0, True, {}, NS(completed=20))    # 0.6 s
    short_failed = Probe(16.0, False, {}, NS(completed=20))
    res = CapacityResult(32.0, True, (32.0, None), [long_run, short_met, short_failed])
    assert res.short_probes() == [short_met]
    assert f"< {MIN_PROBE_SPAN_S:g} s" in res.describe() and "--duration" in res.describe()
    ok = CapacityResult(2.0, False, (2.0, 4.0), [long_run])
    assert "warning" not in ok.describe()
