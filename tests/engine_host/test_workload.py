"""The load generator's request stream (engine_host/vocab/workload.py)."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.traces import dataset_path, load_trace_csv
from gpuchef.engine_host.vocab.workload import (DATASET_NAMES, MIN_TOKEN_ID, PromptTokens,
                                                RequestSpec, WorkloadConfig, generate)

# The first rows of the bundled engine_host/vocab/data/azure_conv.csv.gz:
#   2023-11-16 18:15:46.6805900,374,44
#   2023-11-16 18:15:50.9951690,396,109
#   2023-11-16 18:15:51.2224670,879,55
#   2023-11-16 18:15:51.3910170,91,16
AZURE_FIRST = [(0.0, 374, 44), (4.314579, 396, 109), (4.541877, 879, 55), (4.710427, 91, 16)]
AZURE_ROWS = 19366
AZURE_LAST_S = 3501.721937  # 19:14:08.4025270 - 18:15:46.6805900


def _arrivals(specs):
    return np.array([s.arrival_s for s in specs])


def _gaps(specs):
    return np.diff(np.concatenate([[0.0], _arrivals(specs)]))


# ---- random dataset: arrivals -------------------------------------------------------------

@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_rate_and_cv2(burstiness):
    rate, n = 20.0, 40_000
    specs = generate(WorkloadConfig(num_prompts=n, request_rate=rate, burstiness=burstiness,
                                    input_len=4, output_len=2, seed=7))
    g = _gaps(specs)
    assert len(specs) == n
    # vllm rescales so the last request lands at exactly N/rate.
    assert specs[-1].arrival_s == pytest.approx(n / rate, rel=1e-12)
    assert g.mean() == pytest.approx(1.0 / rate, rel=1e-9)
    assert (g >= 0).all()
    cv2 = g.var() / g.mean() ** 2
    assert cv2 == pytest.approx(1.0 / burstiness, rel=0.06)


def test_gamma_arrivals_duration_only_rate():
    rate, dur = 50.0, 400.0
    specs = generate(WorkloadConfig(duration_s=dur, request_rate=rate, input_len=4,
                                    output_len=2, seed=3))
    a = _arrivals(specs)
    assert (a < dur).all() and a[-1] > dur - 1.0
    # Poisson count over 400 s at 50/s: sd = sqrt(20000) ~ 141, so 4 % is > 5 sd.
    assert len(specs) == pytest.approx(rate * dur, rel=0.04)
    g = _gaps(specs)
    assert g.var() / g.mean() ** 2 == pytest.approx(1.0, rel=0.06)


def test_constant_arrivals():
    specs = generate(WorkloadConfig(num_prompts=10, request_rate=4.0, arrival="constant",
                                    input_len=8, output_len=2))
    np.testing.assert_allclose(_arrivals(specs), [(i + 1) / 4.0 for i in range(10)], rtol=1e-12)
    # burstiness inf is vllm's constant spacing too
    specs2 = generate(WorkloadConfig(num_prompts=10, request_rate=4.0, burstiness=math.inf,
                                     input_len=8, output_len=2))
    np.testing.assert_allclose(_arrivals(specs2), _arrivals(specs), rtol=1e-12)


def test_infinite_rate_puts_everything_at_zero():
    specs = generate(WorkloadConfig(num_prompts=25, input_len=8, output_len=2))
    assert [s.arrival_s for s in specs] == [0.0] * 25


def test_arrivals_sorted_and_ids():
    specs = generate(WorkloadConfig(num_prompts=200, request_rate=10, burstiness=0.3))
    a = _arrivals(specs)
    assert (np.diff(a) >= 0).all()
    assert [s.request_id for s in specs] == [f"req-{i}" for i in range(200)]
    assert not any(s.is_probe for s in specs)


# ---- random dataset: lengths and token ids -------------------------------------------------

def test_random_lengths_fixed_and_range():
    fixed = generate(WorkloadConfig(num_prompts=50, input_len=100, output_len=20))
    assert {s.prompt_len for s in fixed} == {100} and {s.output_len for s in fixed} == {20}
    ranged = generate(WorkloadConfig(num_prompts=5000, input_len=100, output_len=21,
                                     range_ratio=0.5, seed=1))
    ins = np.array([s.prompt_len for s in ranged])
    outs = np.array([s.output_len for s in ranged])
    # vllm RandomDataset: integers in [floor(len*(1-r)), ceil(len*(1+r))]
    assert ins.min() == 50 and ins.max() == 150
    assert outs.min() == 10 and outs.max() == 32
    assert ins.mean() == pytest.approx(100, rel=0.02)
    assert len(np.unique(ins)) == 101


def test_output_len_at_least_one():
    specs = generate(WorkloadConfig(num_prompts=500, input_len=4, output_len=1, range_ratio=0.9))
    assert min(s.output_len for s in specs) >= 1
    assert min(s.prompt_len for s in specs) >= 1


def test_token_ids_range_and_types():
    specs = generate(WorkloadConfig(num_prompts=20, input_len=300, output_len=4, vocab_size=50))
    for s in specs:
        ids = list(s.prompt_token_ids)
        assert len(ids) == s.prompt_len == 300
        assert all(isinstance(t, int) for t in ids)
        assert min(ids) >= MIN_TOKEN_ID and max(ids) < 50
    ids = specs[0].prompt_token_ids
    assert isinstance(ids, PromptTokens)
    arr = np.asarray(ids)
    assert arr.dtype == np.int64 and arr.shape == (300,)
    assert ids[0] == arr[0] and ids[-1] == arr[-1] and ids[2:5] == tuple(arr[2:5].tolist())
    with pytest.raises(IndexError):
        ids[300]


def test_same_seed_same_stream_different_seed_different():
    cfg = dict(num_prompts=100, request_rate=5.0, burstiness=0.5, input_len=64, output_len=8,
               range_ratio=0.5, probe_interval_s=1.0)
    a = generate(WorkloadConfig(seed=11, **cfg))
    b = generate(WorkloadConfig(seed=11, **cfg))
    assert a == b  # A/B arms: identical requests
    assert [tuple(s.prompt_token_ids) for s in a] == [tuple(s.prompt_token_ids) for s in b]
    c = generate(WorkloadConfig(seed=12, **cfg))
    assert _arrivals(a).tolist() != _arrivals(c).tolist()
    assert list(a[0].prompt_token_ids) != list(c[0].prompt_token_ids)


def test_prompt_ids_do_not_depend_on_num_prompts():
    short = generate(WorkloadConfig(num_prompts=5, input_len=32, output_len=2, seed=5))
    long = generate(WorkloadConfig(num_prompts=50, input_len=32, output_len=2, seed=5))
    for s, l in zip(short, long):
        assert list(s.prompt_token_ids) == list(l.prompt_token_ids)


def test_prompt_tokens_equal_explicit_tuple():
    p = PromptTokens((1, 2, 3), 40, 1000)
    t = tuple(p)
    assert p == t and t == p and p == list(t)
    assert hash(p) == hash(PromptTokens((1, 2, 3), 40, 1000))
    # a RequestSpec may also carry explicit ids
    r = RequestSpec("x", 0.5, (11, 12, 13), 4)
    assert r.prompt_len == 3 and not r.is_probe


# ---- trace replay --------------------------------------------------------------------------

def test_load_bundled_trace():
    rows = load_trace_csv(dataset_path("azure-conv"))
    assert len(rows) == AZURE_ROWS
    for (t, c, g), (et, ec, eg) in zip(rows, AZURE_FIRST):
        assert t == pytest.approx(et, abs=1e-7) and (c, g) == (ec, eg)
    assert rows[-1] == (pytest.approx(AZURE_LAST_S, abs=1e-6), 197, 183)
    assert all(rows[i][0] <= rows[i + 1][0] for i in range(len(rows) - 1))


def test_trace_replay_times_lengths_and_speed():
    specs = generate(WorkloadConfig(dataset="azure-conv", num_prompts=4))
    assert [(s.prompt_len, s.output_len) for s in specs] == [(c, g) for _, c, g in AZURE_FIRST]
    np.testing.assert_allclose(_arrivals(specs), [t for t, _, _ in AZURE_FIRST], atol=1e-7)
    fast = generate(WorkloadConfig(dataset="azure-conv", num_prompts=4, trace_speed=2.0))
    np.testing.assert_allclose(_arrivals(fast), [t / 2 for t, _, _ in AZURE_FIRST], atol=1e-7)
    slow = generate(WorkloadConfig(dataset="azure-conv", num_prompts=4, trace_speed=0.5))
    np.testing.assert_allclose(_arrivals(slow), [t * 2 for t, _, _ in AZURE_FIRST], atol=1e-7)


def test_trace_ignores_request_rate_and_random_lengths():
    a = generate(WorkloadConfig(dataset="azure-conv", num_prompts=10))
    b = generate(WorkloadConfig(dataset="azure-conv", num_prompts=10, request_rate=1000.0,
                                burstiness=0.1, input_len=7, output_len=3, range_ratio=0.5))
    assert a == b


def test_trace_whole_file_when_unbounded():
    specs = generate(WorkloadConfig(dataset="azure-conv"))
    assert len(specs) == AZURE_ROWS
    assert specs[-1].arrival_s == pytest.approx(AZURE_LAST_S, abs=1e-6)


def test_trace_skip():
    specs = generate(WorkloadConfig(dataset="azure-conv", num_prompts=3, skip=1))
    np.testing.assert_allclose(_arrivals(specs), [0.0, 0.227298, 0.395848], atol=1e-7)
    assert [s.prompt_len for s in specs] == [396, 879, 91]
    with pytest.raises(ConfigError, match="--skip 19366"):
        generate(WorkloadConfig(dataset="azure-conv", skip=AZURE_ROWS))


def test_trace_duration_and_num_prompts_first_reached():
    rows = load_trace_csv(dataset_path("azure-conv"))
    n_in_60s = sum(1 for t, _, _ in rows if t < 60.0)
    by_dur = generate(WorkloadConfig(dataset="azure-conv", duration_s=60.0))
    assert len(by_dur) == n_in_60s and by_dur[-1].arrival_s < 60.0
    # at 4x speed, 15 s of replay is the same 60 s of trace
    fast = generate(WorkloadConfig(dataset="azure-conv", duration_s=15.0, trace_speed=4.0))
    assert len(fast) == n_in_60s
    both_n = generate(WorkloadConfig(dataset="azure-conv", duration_s=60.0, num_prompts=5))
    assert len(both_n) == 5
    both_d = generate(WorkloadConfig(dataset="azure-conv", duration_s=60.0, num_prompts=10**5))
    assert len(both_d) == n_in_60s


def test_random_num_prompts_and_duration_first_reached():
    cfg = dict(request_rate=10.0, input_len=4, output_len=2, seed=2)
    n_only = generate(WorkloadConfig(num_prompts=100, **cfg))  # last arrival at 10 s
    both = generate(WorkloadConfig(num_prompts=100, duration_s=5.0, **cfg))
    assert len(n_only) == 100
    assert len(both) == sum(1 for s in n_only if s.arrival_s < 5.0) < 100
    assert both == n_only[:len(both)]
    small_n = generate(WorkloadConfig(num_prompts=3, duration_s=50.0, **cfg))
    assert len(small_n) == 3


def test_clipping():
    specs = generate(WorkloadConfig(dataset="azure-conv", num_prompts=500, max_input_len=512,
                                    max_output_len=64))
    raw = load_trace_csv(dataset_path("azure-conv"))[:500]
    assert [s.prompt_len for s in specs] == [min(c, 512) for _, c, _ in raw]
    assert [s.output_len for s in specs] == [min(g, 64) for _, _, g in raw]
    assert any(c > 512 for _, c, _ in raw)

    mml = generate(WorkloadConfig(dataset="azure-conv", num_prompts=500, max_model_len=600))
    for s, (_, c, g) in zip(mml, raw):
        assert s.prompt_len + s.output_len <= 600
        assert s.output_len == min(g, 599)  # the output is kept, the prompt is shortened
        assert s.prompt_len == min(c, 600 - s.output_len)
    tiny = generate(WorkloadConfig(num_prompts=3, input_len=50, output_len=40, max_model_len=30))
    assert [(s.prompt_len, s.output_len) for s in tiny] == [(1, 29)] * 3


# ---- probes --------------------------------------------------------------------------------

def test_probes():
    specs = generate(WorkloadConfig(num_prompts=20, request_rate=2.0, input_len=64,
                                    output_len=4, probe_interval_s=1.5, probe_input_len=8))
    probes = [s for s in specs if s.is_probe]
    load = [s for s in specs if not s.is_probe]
    assert len(load) == 20
    horizon = load[-1].arrival_s  # 10 s: the last load arrival
    assert [p.arrival_s for p in probes] == pytest.approx(
        [1.5 * (k + 1) for k in range(int(horizon // 1.5))])
    assert all(p.output_len == 1 and p.prompt_len == 8 for p in probes)
    assert [p.request_id for p in probes] == [f"probe-{k}" for k in range(len(probes))]
    assert (np.diff(_arrivals(specs)) >= 0).all()
    # with --duration the probes run up to it
    d = generate(WorkloadConfig(num_prompts=3, request_rate=100.0, duration_s=6.0,
                                probe_interval_s=2.0, input_len=4, output_len=2))
    assert [p.arrival_s for p in d if p.is_probe] == [2.0, 4.0, 6.0]


# ---- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, needle", [
    (dict(request_rate=0), "--request-rate 0"),
    (dict(request_rate=-3.0), "--request-rate -3.0"),
    (dict(request_rate="fast"), "--request-rate must be a number, got 'fast'"),
    (dict(request_rate=float("nan")), "--request-rate"),
    (dict(burstiness=0), "--burstiness 0"),
    (dict(burstiness=-1.0), "--burstiness -1.0"),
    (dict(arrival="uniform"), "--arrival 'uniform' is not one of poisson, constant"),
    (dict(input_len=0), "--input-len=0 is out of range: allowed >= 1"),
    (dict(output_len=-5), "--output-len=-5 is out of range"),
    (dict(input_len=2.5), "--input-len must be an integer"),
    (dict(range_ratio=1.0), "--range-ratio 1.0 is out of range: allowed [0, 1)"),
    (dict(range_ratio=-0.1), "--range-ratio -0.1"),
    (dict(num_prompts=0), "--num-prompts=0 is out of range"),
    (dict(duration_s=0), "--duration 0 must be > 0"),
    (dict(trace_speed=0), "--trace-speed 0 must be > 0"),
    (dict(trace_speed=-2.0), "--trace-speed -2.0"),
    (dict(skip=-1), "--skip=-1 is out of range"),
    (dict(max_input_len=0), "--max-input-len=0"),
    (dict(max_output_len=0), "--max-output-len=0"),
    (dict(max_model_len=1), "--max-model-len=1 is out of range: allowed >= 2"),
    (dict(vocab_size=10), "--vocab-size=10 is out of range: allowed >= 11"),
    (dict(seed=-1), "--seed=-1"),
    (dict(probe_interval_s=0), "--probe-interval 0 must be > 0"),
    (dict(probe_input_len=0), "--probe-input-len=0"),
    (dict(dataset="sharegpt"), "'sharegpt' is not known: use one of random, azure-conv"),
    (dict(dataset="/nonexistent/trace.csv"), "no such file"),
])
def test_bad_parameters(kwargs, needle):
    base = dict(num_prompts=10)
    base.update(kwargs)
    with pytest.raises(ConfigError) as e:
        WorkloadConfig(**base)
    assert needle in str(e.value)


def test_random_needs_a_bound():
    with pytest.raises(ConfigError, match="--num-prompts or --duration"):
        WorkloadConfig()
    with pytest.raises(ConfigError, match="--request-rate inf"):
        WorkloadConfig(duration_s=10.0)
    WorkloadConfig(dataset="azure-conv")  # a trace is fine unbounded


def test_generate_revalidates_mutated_config():
    cfg = WorkloadConfig(num_prompts=5)
    cfg.request_rate = -1
    with pytest.raises(ConfigError, match="--request-rate -1"):
        generate(cfg)


def test_dataset_path():
    p = dataset_path("azure-conv")
    assert p.is_file() and p.name == "azure_conv.csv.gz"
    assert DATASET_NAMES == ("random", "azure-conv")
    with pytest.raises(ConfigError, match="random, azure-conv"):
        dataset_path("azure")
    with pytest.raises(ConfigError, match="no file"):
        dataset_path("random")


# ---- trace CSV: accepted forms and malformed files -----------------------------------------

def _write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_numeric_timestamps_and_variants(tmp_path):
    p = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n10.5,5,2\n11.0,6,3\n\n13.25,7,4\n")
    assert load_trace_csv(p) == [(0.0, 5, 2), (0.5, 6, 3), (2.75, 7, 4)]
    # column order, case, extra columns, a BOM, ISO 'T' and zones are accepted
    q = _write(tmp_path, "\ufeffgeneratedtokens,Extra,timestamp,contexttokens\n"
                         "2,x,2024-01-01T00:00:00.1234567Z,5\n"
                         "3,y,2024-01-01T01:00:01.1234567+01:00,6\n", "q.csv")
    rows = load_trace_csv(q)
    assert rows[0] == (0.0, 5, 2)
    assert rows[1][0] == pytest.approx(1.0, abs=1e-9) and rows[1][1:] == (6, 3)
    # tiny steps back (rounding in the source) are clamped, not refused
    r = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,5,2\n0.9999,5,2\n", "r.csv")
    assert [t for t, _, _ in load_trace_csv(r)] == [0.0, 0.0]


def test_trace_file_as_dataset(tmp_path):
    p = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n0,50,5\n2,60,6\n4,70,7\n")
    specs = generate(WorkloadConfig(dataset=str(p), trace_speed=2.0))
    assert [(s.arrival_s, s.prompt_len, s.output_len) for s in specs] == [
        (0.0, 50, 5), (1.0, 60, 6), (2.0, 70, 7)]


@pytest.mark.parametrize("text, needles", [
    ("", ["is empty", "TIMESTAMP, ContextTokens, GeneratedTokens"]),
    ("\n\n", ["is empty"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", ["header but no requests"]),
    ("time,prompt,output\n0,1,1\n", ["line 1", "bad header", "TIMESTAMP, ContextTokens, GeneratedTokens"]),
    ("TIMESTAMP,ContextTokens\n0,1\n", ["line 1", "bad header"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n1,abc,2\n", ["line 3", "ContextTokens 'abc'"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n1,5,2.5\n", ["line 3", "GeneratedTokens '2.5'"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\nnoon,5,2\n", ["line 3", "TIMESTAMP 'noon'"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n1,-4,2\n", ["line 3", "ContextTokens -4", ">= 1"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,0\n", ["line 2", "GeneratedTokens 0"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n1,5\n", ["line 3", "expected 3 fields", "got 2"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n1,5,2,9\n", ["line 3", "got 4"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n5,5,2\n\n3,5,2\n", ["line 5", "goes back 2.000000 s"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5,2\n3.0,5,2\n",
     ["line 3", "seconds value", "datetime"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46.68,5,2\n", ["line 2", "TIMESTAMP"]),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\ninf,5,2\n", ["line 2", "TIMESTAMP 'inf'"]),
])
def test_malformed_trace(tmp_path, text, needles):
    p = _write(tmp_path, text, "bad.csv")
    with pytest.raises(ConfigError) as e:
        load_trace_csv(p)
    msg = str(e.value)
    assert "bad.csv" in msg
    for n in needles:
        assert n in msg
    # and through the workload, as a user would hit it
    with pytest.raises(ConfigError, match="bad.csv"):
        generate(WorkloadConfig(dataset=str(p)))


def test_truncated_last_line(tmp_path):
    good = gzip.decompress(dataset_path("azure-conv").read_bytes()).decode().splitlines()[:6]
    p = _write(tmp_path, "\n".join(good) + "\n2023-11-16 18:15:53.01,37", "cut.csv")
    with pytest.raises(ConfigError, match=r"cut.csv', line 7: expected 3 fields"):
        load_trace_csv(p)


def test_missing_trace_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_trace_csv(tmp_path / "nope.csv")


def test_edited_file_is_reread(tmp_path):
    p = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n")
    assert load_trace_csv(p) == [(0.0, 5, 2)]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,2\n1,6,3\n")
    assert load_trace_csv(p) == [(0.0, 5, 2), (1.0, 6, 3)]


def test_trace_speed_inf_sends_everything_at_once():
    from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate
    specs = generate(WorkloadConfig(dataset="azure-conv", num_prompts=20, trace_speed=float("inf"),
                                    max_model_len=8192, vocab_size=4096))
    assert len(specs) == 20 and all(s.arrival_s == 0.0 for s in specs)


def test_trace_speed_nan_is_refused_without_contradicting_inf():
    """--trace-speed takes inf (all at once); NaN's message said "must be a finite number",
    which inf is not (a tester's report). NaN is refused, inf is taken."""
    import pytest

    from gpuchef.engine_host.vocab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--trace-speed must be a number \(inf allowed\), "
                                          r"not NaN, got nan"):
        WorkloadConfig(dataset="azure-conv", trace_speed=float("nan"))
    assert WorkloadConfig(dataset="azure-conv", trace_speed=math.inf).trace_speed == math.inf
    with pytest.raises(ConfigError, match=r"--request-rate must be a number \(inf allowed\)"):
        WorkloadConfig(request_rate=float("nan"))


def test_a_gzipped_trace_reads_as_the_csv_it_holds_and_a_broken_one_is_one_line(tmp_path):
    import gzip as _gzip

    from gpuchef.engine_host.vocab.traces import load_trace_csv

    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
            "2023-11-16 18:15:50.9951690,396,109\n")
    plain = tmp_path / "t.csv"
    plain.write_text(text)
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(_gzip.compress(text.encode()))
    assert load_trace_csv(gz) == load_trace_csv(plain) == [(0.0, 374, 44),
                                                           (pytest.approx(4.314579), 396, 109)]
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ConfigError, match="bad.csv.gz.*not readable as CSV") as e:
        load_trace_csv(bad)
    assert "\n" not in str(e.value)
