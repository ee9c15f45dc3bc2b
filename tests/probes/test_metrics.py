"""Serving metrics with vllm bench serve's definitions (probes/metrics.py)."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.records import RequestRecord, StepRecord
from gpuchef.probes.lanes import lane_ttft
from gpuchef.probes.metrics import (
    BenchMetrics,
    format_results_block,
    parse_goodput,
    parse_percentiles,
    percentile,
    summarize,
)

MS = 1_000_000  # ns per ms


def rec(rid, arrival_ms, token_ms, prompt_len=10, reason="length", output_len=None):
    times = tuple(int(t * MS) for t in token_ms)
    return RequestRecord(rid, int(arrival_ms * MS), prompt_len,
                         len(times) if output_len is None else output_len, times, reason)


def step(i, t0_ms, t1_ms, gpu_ms, prefill=0, decode=0, preempted=0):
    return StepRecord(step=i, t_start_ns=int(t0_ms * MS), t_end_ns=int(t1_ms * MS),
                      gpu_ms=gpu_ms, mode="chunked", max_num_batched_tokens=2048,
                      max_num_seqs=256, long_prefill_token_threshold=0,
                      max_num_partial_prefills=1, num_prefill_reqs=1 if prefill else 0,
                      num_prefill_tokens=prefill, num_decode_reqs=decode,
                      num_partial_prefills=0, num_running=decode, num_waiting=0,
                      num_preempted=preempted, kv_blocks_used=1, kv_blocks_total=100)


# Three completed requests, one aborted, one error, one probe; hand-computed below.
RECORDS = [
    rec("req-0", 0, [100, 150, 220]),         # ttft 100, e2el 220, tpot 60, itl 50,70
    rec("req-1", 50, [300], prompt_len=20, reason="stop"),  # ttft=e2el 250, one token
    rec("req-2", 1000, [1010, 1030, 1060, 1100], prompt_len=30),  # ttft 10, e2el 100, tpot 30
    rec("req-3", 0, [40], prompt_len=99, reason="abort"),
    rec("req-4", 0, [], prompt_len=99, reason="error", output_len=0),
    rec("probe-0", 500, [540], prompt_len=16),
]


# ---- percentile / parsing ------------------------------------------------------------------

def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    v = rng.exponential(5.0, size=101).tolist()
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(v, q) == pytest.approx(float(np.percentile(v, q)), rel=1e-12)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5  # linear interpolation
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ConfigError, match="percentile 101"):
        percentile([1.0], 101)


def test_parse_percentiles():
    assert parse_percentiles("50,90,99") == (50.0, 90.0, 99.0)
    assert parse_percentiles("99.9 50, 50") == (99.9, 50.0)
    assert parse_percentiles([25, 75]) == (25.0, 75.0)
    with pytest.raises(ConfigError, match="out of range"):
        parse_percentiles("50,120")
    with pytest.raises(ConfigError, match="'x'"):
        parse_percentiles("x")
    with pytest.raises(ConfigError):
        parse_percentiles("")


def test_parse_goodput():
    assert parse_goodput("ttft:500 tpot:50 e2el:2000") == {"ttft": 500.0, "tpot": 50.0,
                                                           "e2el": 2000.0}
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_goodput("TTFT:1.5,e2el:10") == {"ttft": 1.5, "e2el": 10.0}
    assert parse_goodput(None) == {} and parse_goodput("") == {}


@pytest.mark.parametrize("spec, needle", [
    ("itl:5", "key 'itl'"),
    ("ttft500", "'ttft500' is not KEY:VALUE"),
    ("ttft:fast", "'fast' is not a number"),
    ("ttft:-1", "out of range"),
    ("ttft:inf", "out of range"),
    ("ttft:1 ttft:2", "given twice"),
])
def test_parse_goodput_errors(spec, needle):
    with pytest.raises(ConfigError) as e:
        parse_goodput(spec)
    assert needle in str(e.value)


# ---- summarize: hand-computed ---------------------------------------------------------------

def test_summarize_hand_computed():
    m = summarize(RECORDS, 2.0, percentiles=(50, 99))
    assert (m.completed, m.failed) == (3, 2)
    assert m.total_input == 10 + 20 + 30
    assert m.total_output == 3 + 1 + 4
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(4.0)
    assert m.total_token_throughput == pytest.approx(34.0)
    assert m.request_goodput is None

    ttft = [100, 250, 10]
    assert m.mean_ttft_ms == pytest.approx(120.0)
    assert m.median_ttft_ms == pytest.approx(100.0)
    assert m.std_ttft_ms == pytest.approx(float(np.std(ttft)))
    assert m.percentiles_ttft_ms == [(50.0, pytest.approx(100.0)),
                                     (99.0, pytest.approx(float(np.percentile(ttft, 99))))]
    # TPOT only for output_len > 1: (220-100)/2 = 60, (100-10)/3 = 30
    assert m.mean_tpot_ms == pytest.approx(45.0)
    assert m.median_tpot_ms == pytest.approx(45.0)
    # ITL pools every gap: 50, 70 | 20, 30, 40
    itl = [50, 70, 20, 30, 40]
    assert m.mean_itl_ms == pytest.approx(42.0)
    assert m.median_itl_ms == pytest.approx(40.0)
    assert m.percentiles_itl_ms[1][1] == pytest.approx(float(np.percentile(itl, 99)))
    # E2EL: 220, 250, 100
    assert m.mean_e2el_ms == pytest.approx(190.0)
    assert m.median_e2el_ms == pytest.approx(220.0)
    # the probe is out of the load's figures and summarised apart
    assert (m.probe_completed, m.probe_failed) == (1, 0)
    assert m.median_probe_e2el_ms == pytest.approx(40.0)
    assert m.max_probe_e2el_ms == pytest.approx(40.0)
    # no steps given
    assert m.num_steps == 0 and math.isnan(m.busy_fraction)


def test_tpot_uses_output_len_as_vllm():
    # vllm: TPOT = (latency - ttft) / (output_len - 1), with output_len the token count
    r = rec("req-0", 0, [10, 20, 110], output_len=3)
    m = summarize([r], 1.0)
    assert m.mean_tpot_ms == pytest.approx((110 - 10) / 2)
    assert m.mean_tpot_ms == pytest.approx(r.tpot_ms)


@pytest.mark.parametrize("slos, good", [
    ({"ttft": 200}, 2),             # req-0 (100), req-2 (10); req-1 has 250
    ({"ttft": 250}, 3),             # <= is good
    ({"tpot": 40}, 2),              # req-1 counts as TPOT 0 (one token); req-2 30; req-0 60
    ({"e2el": 220}, 2),             # 220 and 100
    ({"ttft": 200, "tpot": 40}, 1),  # only req-2
    ({"ttft": 1, "tpot": 1, "e2el": 1}, 0),
])
def test_goodput(slos, good):
    m = summarize(RECORDS, 4.0, goodput=slos)
    assert m.request_goodput == pytest.approx(good / 4.0)
    assert m.goodput_slos_ms == slos


def test_goodput_unknown_key():
    with pytest.raises(ConfigError, match="'itl'"):
        summarize(RECORDS, 1.0, goodput={"itl": 5.0})


def test_against_numpy_on_random_records():
    rng = np.random.default_rng(42)
    recs = []
    for i in range(300):
        arr = float(rng.uniform(0, 10_000))
        n = int(rng.integers(1, 40))
        first = arr + float(rng.exponential(200))
        times = first + np.concatenate([[0.0], np.cumsum(rng.exponential(20, size=n - 1))])
        recs.append(rec(f"req-{i}", arr, times.tolist(), prompt_len=int(rng.integers(1, 500))))
    m = summarize(recs, 12.5, percentiles=(10, 50, 90, 99))
    ttft = [r.ttft_ms for r in recs]
    e2el = [r.e2el_ms for r in recs]
    tpot = [(r.e2el_ms - r.ttft_ms) / (r.output_len - 1) for r in recs if r.output_len > 1]
    itl = [g for r in recs for g in r.itls_ms]
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        assert getattr(m, f"mean_{name}_ms") == pytest.approx(float(np.mean(vals)))
        assert getattr(m, f"median_{name}_ms") == pytest.approx(float(np.median(vals)))
        for p, v in getattr(m, f"percentiles_{name}_ms"):
            assert v == pytest.approx(float(np.percentile(vals, p)))
    assert m.total_output == sum(r.output_len for r in recs)
    assert m.output_throughput == pytest.approx(m.total_output / 12.5)


def test_itls_are_each_requests_own_gaps_in_order():
    """The vectorised ITLs equal RequestRecord.itls_ms request by request, element for element:
    no gap across two requests, none for one-token, untimed, failed or probe requests."""
    from gpuchef.engine_host.vocab.workload import PROBE_ID_PREFIX
    from gpuchef.probes.metrics import _itls_ms

    rng = np.random.default_rng(7)
    recs = []
    for i in range(200):
        n = int(rng.integers(0, 6))
        t0 = int(rng.integers(0, 10**12))
        times = tuple(int(x) for x in t0 + np.cumsum(rng.integers(1, 10**8, size=n)))
        rid = f"{PROBE_ID_PREFIX}{i}" if i % 17 == 0 else f"req-{i}"
        reason = "abort" if i % 13 == 0 else "length"
        recs.append(RequestRecord(rid, t0, 10, n, times, reason))
    want = [g for r in recs if r.finish_reason != "abort" and not r.request_id.startswith(
        PROBE_ID_PREFIX) for g in r.itls_ms]
    got = summarize(recs, 1.0, percentiles=(0, 100))
    assert got.percentiles_itl_ms == [(0.0, min(want)), (100.0, max(want))]
    assert got.mean_itl_ms == pytest.approx(float(np.mean(want)))
    flat = _itls_ms([r.token_times_ns for r in recs if len(r.token_times_ns) > 1])
    assert flat.tolist() == [g for r in recs for g in r.itls_ms]  # exactly, in order
    assert _itls_ms([]).size == 0


def test_no_completed_requests_is_nan_not_crash():
    m = summarize([rec("req-0", 0, [], reason="abort", output_len=0)], 1.0,
                  goodput={"ttft": 100})
    assert m.completed == 0 and m.failed == 1
    assert math.isnan(m.mean_ttft_ms) and math.isnan(m.percentiles_e2el_ms[-1][1])
    assert m.request_goodput == 0.0
    assert "n/a" in format_results_block(m)


@pytest.mark.parametrize("dur", [0, -1.0, float("nan")])
def test_bad_duration(dur):
    with pytest.raises(ConfigError, match="duration"):
        summarize(RECORDS, dur)


# ---- steps ---------------------------------------------------------------------------------

def test_step_metrics():
    steps = [
        step(0, 0, 10, 8.0, prefill=512),                 # prefill only
        step(1, 20, 25, 4.0, decode=4),                   # idle gap 10..20, decode only
        step(2, 25, 40, 12.0, prefill=256, decode=4, preempted=1),  # mixed
        step(3, 40, 50, 6.0, decode=8, preempted=2),
    ]
    m = summarize(RECORDS, 2.0, steps=steps)
    assert m.num_steps == 4
    assert m.steps_span_s == pytest.approx(0.050)
    assert m.steps_per_s == pytest.approx(80.0)
    assert m.mean_step_ms == pytest.approx((10 + 5 + 15 + 10) / 4)
    assert m.mean_gpu_ms == pytest.approx(7.5)
    assert m.mean_prefill_tokens_per_step == pytest.approx(192.0)
    assert m.mean_decode_tokens_per_step == pytest.approx(4.0)
    assert m.mean_tokens_per_step == pytest.approx(196.0)
    assert m.num_mixed_steps == 1
    assert m.num_preemptions == 3
    assert m.busy_fraction == pytest.approx(30.0 / 50.0)


# ---- output --------------------------------------------------------------------------------

def test_results_block_names_and_layout():
    steps = [step(0, 0, 10, 8.0, prefill=512), step(1, 10, 20, 5.0, decode=4)]
    m = summarize(RECORDS, 2.0, percentiles=(50, 90, 99.9), goodput={"ttft": 200}, steps=steps)
    text = format_results_block(m, extra={"Scheduler mode": "chunked"})
    lines = text.splitlines()
    assert lines[0] == "{:=^50}".format(" Serving Benchmark Result ")
    assert lines[-1] == "=" * 50
    for name in [
        "Successful requests:", "Failed requests:", "Benchmark duration (s):",
        "Total input tokens:", "Total generated tokens:", "Request throughput (req/s):",
        "Request goodput (req/s):", "Output token throughput (tok/s):",
        "Total token throughput (tok/s):",
        "Mean TTFT (ms):", "Median TTFT (ms):", "P50 TTFT (ms):", "P90 TTFT (ms):",
        "P99.9 TTFT (ms):",
        "Mean TPOT (ms):", "Median TPOT (ms):", "P99.9 TPOT (ms):",
        "Mean ITL (ms):", "Median ITL (ms):", "P90 ITL (ms):",
        "Mean E2EL (ms):", "Median E2EL (ms):", "P50 E2EL (ms):",
        "Probe requests completed:", "Median probe E2EL (ms):", "P99 probe E2EL (ms):",
        "Engine steps:", "Steps per second:", "Mean step time (ms):",
        "Mean prefill tokens per step:", "Mean decode tokens per step:",
        "Mean tokens per step:", "Mixed prefill+decode steps:", "Preemptions:",
        "Compute busy fraction (%):", "Scheduler mode:",
    ]:
        assert sum(1 for ln in lines if ln.startswith(name)) == 1, name
    for head in ("Time to First Token", "Time per Output Token (excl. 1st token)",
                 "Inter-token Latency", "End-to-end Latency"):
        assert "{:-^50}".format(head) in lines
    rows = {ln[:40].strip(): ln[41:].strip() for ln in lines if len(ln) > 41 and ln[40] == " "}
    assert rows["Successful requests:"] == "3"
    assert rows["Benchmark duration (s):"] == "2.00"
    assert rows["Request throughput (req/s):"] == "1.50"
    assert rows["Request goodput (req/s):"] == "1.00"
    assert rows["Mean TTFT (ms):"] == "120.00"
    assert rows["Compute busy fraction (%):"] == "65.00"
    # vllm's order: goodput right after request throughput; sections in order
    idx = [next(i for i, ln in enumerate(lines) if ln.startswith(k)) for k in (
        "Successful requests:", "Scheduler mode:", "Benchmark duration (s):",
        "Request throughput (req/s):", "Request goodput (req/s):",
        "Output token throughput (tok/s):", "Mean TTFT (ms):", "Mean TPOT (ms):",
        "Mean ITL (ms):", "Mean E2EL (ms):", "Engine steps:")]
    assert idx == sorted(idx)


def test_results_block_without_goodput_or_probes():
    m = summarize(RECORDS[:3], 1.0)
    text = format_results_block(m, title="Custom")
    assert "Request goodput" not in text and "Probe requests" not in text
    assert text.splitlines()[0] == "{:=^50}".format(" Custom ")


def test_to_dict_is_strict_json():
    m = summarize(RECORDS, 2.0, percentiles=(50, 99.9), goodput={"ttft": 200},
                  steps=[step(0, 0, 10, 8.0, prefill=5)])
    d = m.to_dict()
    s = json.dumps(d, allow_nan=False)
    assert json.loads(s) == d
    for key in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99.9_ttft_ms",
                "p50_itl_ms", "mean_tpot_ms", "p50_e2el_ms", "num_steps", "busy_fraction",
                "num_preemptions", "mean_prefill_tokens_per_step"):
        assert key in d, key
    assert d["completed"] == 3 and d["p50_ttft_ms"] == pytest.approx(100.0)
    empty = summarize([], 1.0).to_dict()
    assert empty["mean_ttft_ms"] is None and empty["busy_fraction"] is None
    json.dumps(empty, allow_nan=False)
    assert isinstance(m, BenchMetrics)


def test_itls_of_times_past_int64_are_still_computed():
    """A trace may hold integers numpy's int64 cannot (a bogus clock): the ITLs are Python's."""
    from gpuchef.probes.metrics import _itls_ms

    big = 2**63 + 5
    got = _itls_ms([(big, big + 2_000_000, big + 5_000_000), (1, 3_000_001)])
    assert got.tolist() == [2.0, 3.0, 3.0]


def test_a_multi_token_chunk_is_one_itl_as_vllm_bench_serve_records_it():
    """A hosted-vLLM step (speculative / multi-step decoding) or an SSE chunk that carries 3
    tokens stamps them with one time: that is one ITL (vllm/benchmarks/lib/
    endpoint_request_func.py appends one ITL per chunk), not [60, 0, 0]. Then
    sum(ITL) = E2EL − TTFT per request, and TPOT still divides by output tokens − 1."""
    # arrival 0; first token at 100 ms; a 3-token chunk at 160 ms; one token at 190 ms
    r = rec("req-0", 0, [100, 160, 160, 160, 190])
    assert r.chunk_sizes == [1, 3, 1]
    assert r.itls_ms == [60.0, 30.0]
    assert sum(r.itls_ms) == pytest.approx(r.e2el_ms - r.ttft_ms)
    other = rec("req-1", 0, [10, 20, 30])  # one token per chunk: unchanged
    m = summarize([r, other], 1.0, percentiles=(0, 50, 100))
    assert m.percentiles_itl_ms == [(0.0, 10.0), (50.0, 20.0), (100.0, 60.0)]  # 60, 30, 10, 10
    assert m.mean_itl_ms == pytest.approx((60 + 30 + 10 + 10) / 4)
    assert m.mean_tpot_ms == pytest.approx(((190 - 100) / 4 + (30 - 10) / 2) / 2)
    assert m.total_output == 8
    # the vectorised path agrees with the record's own definition, request by request
    from gpuchef.probes.metrics import _itls_ms
    assert _itls_ms([r.token_times_ns, other.token_times_ns]).tolist() == \
        r.itls_ms + other.itls_ms


def test_steered_itl_is_the_pooled_per_token_itl_of_the_steered_steps():
    # the tiny engine with the autopilot on (its model hears a known step time, so that it
    # steers on a shared CPU): the statistic over the steps' itl_ms × decode rows equals the
    # one over the requests' own token gaps whose later token a steered step produced
    import random

    from gpuchef.engine_host.autopilot import STEERING
    from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
    from gpuchef.engine_host.engine import LLMEngine
    from gpuchef.engine_host.request import SamplingParams
    from gpuchef.probes.metrics import autopilot_totals, steered_itl_ms

    cfg = EngineConfig(model="tiny", device="cpu", max_model_len=512,
                       cache=CacheConfig(num_gpu_blocks=512),
                       scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=128,
                                                 max_num_seqs=8, auto_budget="itl_p99:6ms"))
    eng = LLMEngine(cfg)
    orig = eng.scheduler.observe
    # (no ITL fed back: the synthetic step time and the CPU's real gaps do not add up)
    eng.scheduler.observe = lambda out, ms, itl: orig(
        out, 1.0 + 0.5 * bool(out.prefills) + 0.05 * len(out.decodes)
        + 0.02 * out.num_prefill_tokens)
    rng = random.Random(3)
    for i in range(24):
        eng.add_request(f"q{i}", [rng.randrange(1, 500) for _ in range(rng.randint(40, 160))],
                        SamplingParams(max_tokens=rng.randint(10, 30), ignore_eos=True))
    steps, reqs = [], []
    while eng.has_unfinished():
        res = eng.step()
        if res.record is not None:
            steps.append(res.record)
        reqs += res.finished
    steered = [s for s in steps if s.autopilot_state == STEERING]
    assert len(steered) > 20
    gaps = []
    for r in reqs:
        t = r.token_times_ns
        for a, b in zip(t, t[1:]):
            s = next(s for s in steps if s.t_start_ns <= b <= s.t_end_ns)
            if s.autopilot_state == STEERING:
                gaps.append((b - a) / 1e6)
    assert len(gaps) == sum(s.num_decode_reqs for s in steered if s.itl_ms > 0)
    for stat, want in (("p99", np.percentile(gaps, 99)), ("median", np.percentile(gaps, 50)),
                       ("mean", np.mean(gaps))):
        assert steered_itl_ms(steps, stat) == pytest.approx(want, rel=1e-6)
    tot = autopilot_totals(steps)
    assert tot.itl_ms == pytest.approx(np.percentile(gaps, 99), rel=1e-6)
    kept = "≤ 6 ms: kept" if tot.itl_ms <= 6 else "> 6 ms: missed"
    assert f"steered: P99 ITL {tot.itl_ms:.1f} ms {kept}" in tot.line()
    assert math.isnan(steered_itl_ms([s for s in steps if s.autopilot_state != STEERING], "p99"))


# ---- lane_ttft: the long-prompt lane's short/long TTFT split, and benchmarks/lane_ttft.py -----

LANE_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "lane_ttft.py")

# a CPU autopilot run with a long-prompt lane (threshold 256), kept as a test fixture
LANE_TRACE = Path(__file__).parent.parent / "data" / "lane_long1.jsonl.gz"


def _lane_reference(path: Path, thr: int) -> dict:
    with gzip.open(path, "rt") as f:
        recs = [json.loads(ln) for ln in f]
    reqs = [r for r in recs if r["type"] == "request"]
    out = {}
    for side, keep in (("short", lambda n: n <= thr), ("long", lambda n: n > thr)):
        v = [(r["token_times_ns"][0] - r["arrival_ns"]) / 1e6 for r in reqs
             if r["token_times_ns"] and keep(r["prompt_len"])]
        out[side] = (len(v), *np.percentile(v, [50, 90, 99]))
    first = next(r for r in recs if r["type"] == "step")
    return out, first["long_prefill_token_threshold"], len(reqs)


def test_lane_ttft_split_and_percentiles_equal_the_raw_records():
    want, thr, n = _lane_reference(LANE_TRACE, 256)
    got = lane_ttft(str(LANE_TRACE))
    assert got["threshold"] == thr == 256 and got["requests"] == n
    for side in ("short", "long"):
        g = got[side]
        assert (g["n"], g["p50"], g["p90"], g["p99"]) == pytest.approx(want[side])
    got = lane_ttft(str(LANE_TRACE), short=1024)  # an explicit threshold wins
    want, _, _ = _lane_reference(LANE_TRACE, 1024)
    assert got["threshold"] == 1024 and got["short"]["n"] == want["short"][0]


def test_lane_ttft_script_bad_input_is_one_line(tmp_path):
    r = _lane_script(str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2
    err = r.stderr
    assert err.count("error:") == 1 and "missing.jsonl" in err
    r = _lane_script("--short", "0", str(LANE_TRACE))  # argparse's error: exit 2, usage on stderr
    assert r.returncode == 2 and "--short 0 must be" in r.stderr


def _lane_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, LANE_SCRIPT, *args], capture_output=True, text=True,
                          timeout=120)
