"""Workloads that shift: phased YAML files (engine_host/vocab/phases.py) through workload.generate.

The references are computed here, independently of the generator: expected counts from rate ×
duration (Poisson bounds of 5 standard deviations), the ramp's integral, the trace rows read
straight from the CSV, the range-ratio bounds from their definition."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.phases import (BUNDLED_WORKLOADS, PHASE_KEYS, load_workload,
                                              parse_phase_mark, phase_mark, phases_meta, schedule)
from gpuchef.engine_host.vocab.traces import dataset_path, load_trace_csv
from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate


def write(tmp_path, text, name="w.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def gen(path, **kw):
    kw.setdefault("vocab_size", 1000)
    return generate(WorkloadConfig(dataset=path, **kw))


def arrivals(specs, lo=-math.inf, hi=math.inf):
    return np.array([s.arrival_s for s in specs if lo <= s.arrival_s < hi and not s.is_probe])


def within_poisson(n, mean, k=5.0):
    return abs(n - mean) <= k * math.sqrt(mean) + 1


# ---- arrivals per phase --------------------------------------------------------------------

def test_each_phase_gets_rate_times_duration_arrivals(tmp_path):
    p = write(tmp_path, """
        phases:
          - {name: low, duration_s: 200, request_rate: 5, input_len: 4, output_len: 2}
          - {name: high, duration_s: 100, request_rate: 20, input_len: 4, output_len: 2}
          - {name: quiet, duration_s: 50, request_rate: 0, input_len: 4, output_len: 2}
          - {name: ramp, duration_s: 100, request_rate: 0, request_rate_end: 10,
             input_len: 4, output_len: 2}
        """)
    specs = gen(p, seed=3)
    a = arrivals(specs)
    assert (np.diff(a) >= 0).all() and a[0] >= 0 and a[-1] < 450
    assert within_poisson(len(arrivals(specs, 0, 200)), 5 * 200)
    assert within_poisson(len(arrivals(specs, 200, 300)), 20 * 100)
    assert len(arrivals(specs, 300, 350)) == 0
    # a linear ramp 0 → 10 req/s over 100 s: Λ(t) = 10 t² / 200; halves 125 and 375
    assert within_poisson(len(arrivals(specs, 350, 400)), 125)
    assert within_poisson(len(arrivals(specs, 400, 450)), 375)
    assert len(specs) == len(a) and [s.request_id for s in specs] == \
        [f"req-{i}" for i in range(len(specs))]


def test_burstiness_sets_the_gaps_cv2_within_a_phase(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 2000, request_rate: 20, burstiness: 0.25, input_len: 4, output_len: 2}
        """)
    g = np.diff(arrivals(gen(p, seed=1)))
    assert g.mean() == pytest.approx(1 / 20, rel=0.05)
    assert g.var() / g.mean() ** 2 == pytest.approx(4.0, rel=0.1)  # CV² = 1/burstiness


def test_constant_arrivals_are_evenly_spaced_and_exact(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 10, request_rate: 2, arrival: constant, input_len: 4, output_len: 2}
          - {duration_s: 5, request_rate: 4, arrival: constant, input_len: 4, output_len: 2}
        """)
    a = arrivals(gen(p))
    assert np.allclose(a[:20], (np.arange(20) + 0.5) / 2)
    assert np.allclose(a[20:], 10 + (np.arange(20) + 0.5) / 4)


def test_a_burst_is_count_requests_at_one_instant(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 10, request_rate: 0, input_len: 4, output_len: 2}
          - duration_s: 10
            request_rate: 0
            input_len: 64
            output_len: 3
            burst: [{at_s: 2.5, count: 7}, {at_s: 0, count: 2}]
        """)
    specs = gen(p)
    assert [s.arrival_s for s in specs] == [10.0] * 2 + [12.5] * 7
    assert {(s.prompt_len, s.output_len) for s in specs} == {(64, 3)}


# ---- lengths -------------------------------------------------------------------------------

def test_random_lengths_stay_within_the_range_ratio(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 100, request_rate: 10, input_len: 5000, output_len: 100,
             range_ratio: 0.6}
        """)
    specs = gen(p)
    ins = np.array([s.prompt_len for s in specs])
    outs = np.array([s.output_len for s in specs])
    assert ins.min() >= 2000 and ins.max() <= 8000 and outs.min() >= 40 and outs.max() <= 160
    assert ins.min() < 2300 and ins.max() > 7700  # it covers the range
    assert ins.mean() == pytest.approx(5000, rel=0.05)


def test_a_mixture_draws_each_component_by_weight(tmp_path):
    p = write(tmp_path, """
        phases:
          - duration_s: 500
            request_rate: 10
            mix:
              - {weight: 4, dataset: azure-conv}
              - {weight: 1, input_len: 20000, output_len: 7}
        """)
    specs = gen(p, seed=5)
    rows = {(c, g) for _, c, g in load_trace_csv(dataset_path("azure-conv"))}
    long_ = [s for s in specs if (s.prompt_len, s.output_len) == (20000, 7)]
    conv = [s for s in specs if (s.prompt_len, s.output_len) != (20000, 7)]
    n = len(specs)
    # binomial(n, 0.2) within 5 sd
    assert abs(len(long_) - 0.2 * n) <= 5 * math.sqrt(n * 0.2 * 0.8)
    assert all((s.prompt_len, s.output_len) in rows for s in conv)


def test_a_trace_phase_replays_the_trace_and_the_next_one_continues_it(tmp_path):
    p = write(tmp_path, """
        phases:
          - {name: conv, duration_s: 30, arrival: trace, dataset: azure-conv, trace_speed: 2}
          - {name: gap, duration_s: 10, request_rate: 0}
          - {name: conv2, duration_s: 20, arrival: trace, dataset: azure-conv}
        """)
    specs = gen(p)
    rows = load_trace_csv(dataset_path("azure-conv"))
    want1 = [(t / 2, c, g) for t, c, g in rows if t < 60]  # 30 s at 2× = trace [0, 60)
    want3 = [(40 + (t - 60), c, g) for t, c, g in rows if 60 <= t < 80]  # continues at 60
    got = [(s.arrival_s, s.prompt_len, s.output_len) for s in specs]
    assert len(got) == len(want1) + len(want3)
    for (a, c, g), (wa, wc, wg) in zip(got, want1 + want3):
        assert a == pytest.approx(wa, abs=1e-6) and (c, g) == (wc, wg)


def test_a_trace_phase_loops_at_the_end_of_the_trace(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,1\n1,20,2\n2,30,3\n")
    p = write(tmp_path, f"""
        phases:
          - {{duration_s: 7, arrival: trace, dataset: {csv.name}}}
        """)
    # period = span 2 s + one mean gap 1 s: rows at 0,1,2, 3,4,5, 6
    got = [(s.arrival_s, s.prompt_len) for s in gen(p)]
    assert got == [(0, 10), (1, 20), (2, 30), (3, 10), (4, 20), (5, 30), (6, 10)]


# ---- the config around it ------------------------------------------------------------------

def test_same_file_and_seed_give_the_same_requests_token_ids_included(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 20, request_rate: 3, burstiness: 0.5, dataset: azure-conv,
             burst: {at_s: 1, count: 3}}
          - {duration_s: 20, request_rate: 3, mix: [{weight: 1, input_len: 50},
                                                   {weight: 1, dataset: azure-conv}]}
        """)
    a, b = gen(p, seed=11), gen(p, seed=11)
    assert [(s.request_id, s.arrival_s, s.output_len) for s in a] == \
        [(s.request_id, s.arrival_s, s.output_len) for s in b]
    assert all(tuple(x.prompt_token_ids) == tuple(y.prompt_token_ids) for x, y in zip(a, b))
    c = gen(p, seed=12)
    assert [s.arrival_s for s in c] != [s.arrival_s for s in a]


def test_trace_speed_scales_the_whole_schedule_and_duration_cuts_it(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 20, request_rate: 5, input_len: 4, output_len: 2}
          - {duration_s: 20, request_rate: 10, input_len: 4, output_len: 2}
        """)
    one = arrivals(gen(p))
    two = arrivals(gen(p, trace_speed=2.0))
    assert np.allclose(two, one / 2)
    cut = arrivals(gen(p, duration_s=25.0))
    assert np.array_equal(cut, one[one < 25])
    assert len(gen(p, num_prompts=7)) == 7
    assert (arrivals(gen(p, trace_speed=math.inf)) == 0).all()


def test_probes_run_to_the_end_of_a_quiet_last_phase(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 4, request_rate: 2, input_len: 4, output_len: 2}
          - {duration_s: 6, request_rate: 0}
        """)
    probes = [s.arrival_s for s in gen(p, probe_interval_s=1.0) if s.is_probe]
    assert probes == [float(k) for k in range(1, 11)]


def test_clipping_applies_to_phased_lengths(tmp_path):
    p = write(tmp_path, """
        phases:
          - {duration_s: 10, request_rate: 5, input_len: 5000, output_len: 300}
        """)
    specs = gen(p, max_input_len=100, max_output_len=20)
    assert {(s.prompt_len, s.output_len) for s in specs} == {(100, 20)}


def test_schedule_and_meta_record_each_phase_start_and_end(tmp_path):
    p = write(tmp_path, """
        name: demo
        description: three phases
        phases:
          - {name: a, duration_s: 10, request_rate: 1}
          - {name: b, duration_s: 5, arrival: trace, dataset: azure-conv}
          - {name: c, duration_s: 10, request_rate: 2, request_rate_end: 4}
        """)
    wl = load_workload(p)
    assert schedule(wl) == [{"name": "a", "start_s": 0.0, "end_s": 10.0},
                            {"name": "b", "start_s": 10.0, "end_s": 15.0},
                            {"name": "c", "start_s": 15.0, "end_s": 25.0}]
    assert schedule(wl, 2.0, duration_s=6.0) == [{"name": "a", "start_s": 0.0, "end_s": 5.0},
                                                 {"name": "b", "start_s": 5.0, "end_s": 6.0}]
    meta = json.loads(json.dumps(phases_meta(wl, 2.0)))  # the trace writes JSON
    assert meta["name"] == "demo" and meta["description"] == "three phases"
    assert [(x["name"], x["start_s"], x["end_s"]) for x in meta["phases"]] == \
        [("a", 0.0, 5.0), ("b", 5.0, 7.5), ("c", 7.5, 12.5)]
    assert meta["phases"][2]["request_rate_end"] == 4.0
    assert "request_rate" not in meta["phases"][1] and meta["phases"][1]["trace_speed"] == 1.0


def test_phase_marks_round_trip():
    assert parse_phase_mark(phase_mark("long burst")) == "long burst"
    assert parse_phase_mark("ab:1:A:1") is None and parse_phase_mark("rate→2 req/s") is None


@pytest.mark.parametrize("name", sorted(BUNDLED_WORKLOADS))
def test_bundled_workloads_load_by_name_and_generate(name):
    wl = load_workload(name)
    specs = generate(WorkloadConfig(dataset=name, vocab_size=1000))
    assert len(wl.phases) >= 3 and specs
    assert specs[-1].arrival_s < wl.duration_s
    for ph in wl.phases:  # every phase sends something
        assert len(arrivals(specs, ph.start_s, ph.end_s)) > 0, ph.name


def test_conv_long_burst_is_conversation_then_long_prompts_then_conversation():
    wl = load_workload("conv_long_burst")
    specs = generate(WorkloadConfig(dataset="conv_long_burst", vocab_size=1000))
    long_ = [s for s in specs if wl.phases[1].start_s <= s.arrival_s < wl.phases[1].end_s]
    assert all(2000 <= s.prompt_len <= 8000 for s in long_)
    assert sum(1 for s in long_ if s.arrival_s == wl.phases[1].start_s) >= 8  # the burst


# ---- bad input: one ConfigError naming the value and what is allowed -----------------------

BAD = [
    ("phases: []", "'phases' must be a non-empty list"),
    ("phase: []", "unknown key 'phase' in the file: allowed name, description, phases"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, rate: 2}",
     "phase 1 ('phase 1'): unknown key 'rate' in a phase: allowed name, duration_s"),
    ("phases:\n  - {name: x, duration_s: -5, request_rate: 1}",
     "phase 1 ('x'): duration_s -5 must be > 0 (s)"),
    ("phases:\n  - {request_rate: 1}", "duration_s is missing"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, arrival: weibull}",
     "arrival 'weibull' is not one of poisson, constant, trace"),
    ("phases:\n  - {duration_s: 5}", "request_rate is missing"),
    ("phases:\n  - {duration_s: 5, request_rate: -1}", "request_rate -1 must be >= 0"),
    ("phases:\n  - {duration_s: 5, request_rate: fast}",
     "request_rate must be a number, got 'fast'"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, range_ratio: 1.5}",
     "range_ratio 1.5 is out of range: allowed [0, 1)"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, input_len: 0}",
     "input_len=0 is out of range: allowed >= 1"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, burstiness: 0}", "burstiness 0 must be > 0"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, trace_speed: 2}",
     "trace_speed applies to arrival: trace only"),
    ("phases:\n  - {duration_s: 5, arrival: trace}", "arrival: trace needs dataset"),
    ("phases:\n  - {duration_s: 5, arrival: trace, dataset: azure-conv, request_rate: 3}",
     "request_rate does not apply to arrival: trace"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, dataset: azure-conv, input_len: 9}",
     "input_len applies to dataset random only"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, dataset: sharegpt}",
     "dataset 'sharegpt' is not known: use random, azure-conv or a path to a trace CSV"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, dataset: nope.csv}",
     "dataset 'nope.csv': no such file"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, mix: [{weight: 0, input_len: 5}]}",
     "mix 1: weight 0 must be > 0"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, mix: [{input_len: 5}]}",
     "mix 1: weight is missing"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, input_len: 9, mix: [{weight: 1}]}",
     "give either mix or input_len, not both"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, mix: [{weight: 1, size: 3}]}",
     "unknown key 'size' in a mix component: allowed weight, dataset"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, burst: {at_s: 5, count: 3}}",
     "burst: at_s 5 is out of range: allowed [0, 5) (s into the phase)"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, burst: {at_s: 1}}", "burst: count is missing"),
    ("phases:\n  - {duration_s: 5, request_rate: 1, burst: {at_s: 1, count: 0}}",
     "count=0 is out of range: allowed [1, 1000000]"),
    ("phases:\n  - {duration_s: 1e6, request_rate: 10}",
     "about 10000000 requests: allowed <= 1000000"),
    ("phases:\n  - [1, 2]", "a phase must be a mapping (key: value), got [1, 2]"),
    ("phases: [{duration_s: 5, request_rate: 1}", "not valid YAML"),
    ("", "is empty: expected 'phases:'"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_workload_files_are_one_clear_error(tmp_path, text, needle):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        WorkloadConfig(dataset=p)
    msg = str(e.value)
    assert needle in msg, msg
    assert p in msg and "\n" not in msg  # names the file; one line


def test_bad_yaml_names_the_line(tmp_path):
    p = write(tmp_path, "phases:\n  - duration_s: 5\n    request_rate: [1\n")
    with pytest.raises(ConfigError, match=r"not valid YAML \(.* at line \d+, column \d+\)"):
        load_workload(p)


def test_a_missing_workload_file_or_unknown_name_lists_the_bundled_ones(tmp_path):
    with pytest.raises(ConfigError, match="no such workload file.*conv_long_burst"):
        WorkloadConfig(dataset=str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="is not known.*conv_long_burst.*workload .yaml"):
        WorkloadConfig(dataset="conv_long_brust")


def test_every_phase_key_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "workloads.md").read_text()
    for k in PHASE_KEYS:
        assert f"`{k}`" in doc, k
