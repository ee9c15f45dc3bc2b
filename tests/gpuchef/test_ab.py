"""`gpuchef ab` on the CPU with the tiny model: both settings see the same requests, the block
has both columns, repetitions give a spread, interleaved windows alternate, bad specs are refused
with one clear message."""

from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner

from gpuchef.experiments.ab import Setting, compare, parse_setting, run_orders, windows_from_marks
from gpuchef.experiments.ab_text import side_by_side
from gpuchef.experiments.hosted import run_interleaved, run_sequential
from gpuchef.commands.cli import _register, cli
from gpuchef.engine_host.sinks import ListenerSink
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import EngineConfig, SchedulerConfig
from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate

_register()

SMALL = ["--device", "cpu", "--model", "tiny", "--num-prompts", "6", "--input-len", "48",
         "--output-len", "6", "--request-rate", "30", "--range-ratio", "0.5"]


@pytest.fixture(scope="module")
def engine():
    from gpuchef.engine_host.engine import LLMEngine
    return LLMEngine(EngineConfig(model="tiny", device="cpu", seed=0,
                                  scheduler=SchedulerConfig(max_num_batched_tokens=256)))


def _settings(base: SchedulerConfig) -> dict[str, Setting]:
    return {"A": parse_setting("mode=continuous", base, "A"),
            "B": parse_setting("mode=chunked,max_num_batched_tokens=32", base, "B")}


def _load(engine, n=6, rate=30.0, **kw):
    return generate(WorkloadConfig(num_prompts=n, request_rate=rate, input_len=48, output_len=6,
                                   range_ratio=0.5, vocab_size=engine.model_config.vocab_size,
                                   max_model_len=engine.max_model_len, **kw))


def _fingerprint(run):
    """Per request: (the load's id, prompt length, output length, arrival offset from the
    load's start); each id carries its side and repetition (``<side>/<id>#<rep>``), the load's
    id between them."""
    side, rest = zip(*(r.request_id.split("/", 1) for r in run.requests))
    assert set(side) == {run.label}, (run.name, side)
    base, rep = zip(*(x.rsplit("#", 1) for x in rest))
    assert set(rep) == {str(run.rep)}, (run.name, rep)
    return sorted((b, r.prompt_len, r.output_len, r.arrival_ns - run.load_t0_ns)
                  for b, r in zip(base, run.requests))


def test_both_settings_see_identical_requests(engine):
    specs = _load(engine)
    events = []
    runs = run_sequential(engine, specs, _settings(engine.scheduler_config), repetitions=2,
                          sinks=[ListenerSink(on_event=events.append)])
    assert [r.label for r in runs] == ["A", "B", "B", "A"]  # AB then BA: drift cancels
    fp = _fingerprint(runs[0])
    assert len(fp) == len(specs)
    assert fp == [(s.request_id, s.prompt_len, s.output_len, int(s.arrival_s * 1e9))
                  for s in sorted(specs, key=lambda s: s.request_id)]
    for run in runs[1:]:
        assert _fingerprint(run) == fp
    # each run ran under its own setting, from its first step to its last
    for run in runs:
        want = "continuous" if run.label == "A" else "chunked"
        assert {s.mode for s in run.steps} == {want}
        if run.label == "B":
            assert max(s.num_prefill_tokens + s.num_decode_reqs for s in run.steps) <= 32
    # KV cache empty after the experiment; marks open each run and close it
    assert engine.kv.usage().used == 0 and not engine.has_unfinished()
    marks = [e.name for e in events if e.kind == "mark"]
    assert marks == ["ab:1:A:1", "ab:1:B:1", "ab:1:B:2", "ab:1:A:2", "ab:1:end"]
    # the opening mark precedes every arrival of its run
    for run, name in zip(runs, marks):
        ev = next(e for e in events if e.kind == "mark" and e.name == name)
        assert ev.t_ns <= min(r.arrival_ns for r in run.requests)
        assert ev.step == run.steps[0].step


def test_repetitions_give_a_spread(engine):
    specs = _load(engine, n=4)
    runs = run_sequential(engine, specs, _settings(engine.scheduler_config), repetitions=2,
                          percentiles=(50, 99))
    cmp = compare(runs, (50, 99))
    row = {r.key: r for r in cmp.rows}
    ttft = row["mean_ttft_ms"]
    assert len(ttft.deltas) == 2 and all(math.isfinite(d) for d in ttft.deltas)
    lo, hi = ttft.spread
    assert lo <= hi and math.isfinite(ttft.stdev)
    assert ttft.verdict in ("B better", "B worse", "within spread")
    assert row["mean_tokens_per_step"].verdict in ("differs", "within spread")
    assert cmp.pooled["A"].completed == cmp.pooled["B"].completed == 2 * len(specs)
    one = compare(run_sequential(engine, specs, _settings(engine.scheduler_config), 1))
    assert {r.verdict for r in one.rows} <= {"not enough windows yet (1 of 2)", "n/a"}
    # the command's table, printed when the run is over, says so without a "yet" and how to get one
    from gpuchef.experiments.ab_text import format_deltas
    text = format_deltas(one)
    assert "not enough windows yet" not in text and "no verdict (1 of 2)" in text
    assert "a verdict needs 2 (--repetitions 2 or more)" in text
    assert "no verdict" not in format_deltas(cmp)


def test_interleaved_windows_alternate_on_one_arrival_stream(engine):
    specs = _load(engine, n=24, rate=12.0)  # ~2 s of arrivals
    events = []
    runs, straddle = run_interleaved(
        engine, specs, _settings(engine.scheduler_config), window_s=0.5,
        sinks=[ListenerSink(on_event=events.append)])
    labels = [r.label for r in runs]
    assert labels[:4] == ["A", "B", "A", "B"]
    assert 0.0 <= straddle <= 1.0
    # every request counted once, by its arrival
    ids = [r.request_id for run in runs for r in run.requests]
    assert len(ids) == len(set(ids))
    for run in runs:
        assert all(run.t0_ns <= r.arrival_ns < run.t1_ns for r in run.requests)
        want = "continuous" if run.label == "A" else "chunked"
        modes = [s.mode for s in run.steps]
        # the setting and the mark are queued back to back: allow one step on the old one
        assert sum(m != want for m in modes) <= 1, (run.label, modes)
    wins = windows_from_marks(events, 1, max(r.t1_ns for r in runs) + 1)
    assert [w[0] for w in wins][:4] == ["A", "B", "A", "B"]
    assert [e.name for e in events if e.kind == "mark"][-1] == "ab:1:end"


def test_cli_block_has_both_columns_and_deltas(tmp_path):
    out = tmp_path / "ab.json"
    trace = tmp_path / "ab.jsonl"
    r = CliRunner().invoke(cli, ["ab", *SMALL, "--repetitions", "2", "--b",
                                 "mode=chunked,max_num_batched_tokens=32", "--goodput",
                                 "ttft:5000", "--trace", str(trace), "--result-json", str(out)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    text = r.output
    assert "A/B Serving Benchmark Result" in text
    assert re.search(r"^\s+A\s+B$", text, re.M)
    assert re.search(r"^Mode:\s+continuous\s+chunked$", text, re.M)
    assert re.search(r"^max_num_batched_tokens:\s+\d+\s+32$", text, re.M)
    assert re.search(r"^Successful requests:\s+12\s+12$", text, re.M)
    for name in ("P99 TTFT (ms):", "Mean ITL (ms):", "Request goodput (req/s):", "Engine steps:"):
        line = next(ln for ln in text.splitlines() if ln.startswith(name))
        assert len(line.split()) >= 2 + len(name.split()) - 1, line  # two values
    assert "B − A: pooled over 2 repetitions of A and 2 repetitions of B; per repetition: " \
        "2 pairs" in text
    assert re.search(r"^P99 TTFT \(ms\)\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+\s+[+-][\d.]+%\s+│\s+"
                     r"[+-][\d.]+\s+\S+\.\.\S+", text, re.M)
    d = json.loads(out.read_text())
    assert [x["label"] for x in d["runs"]] == ["A", "B", "B", "A"]
    assert d["settings"]["B"]["scheduler"]["max_num_batched_tokens"] == 32
    row = next(x for x in d["deltas"] if x["key"] == "p99_ttft_ms")
    assert len(row["deltas"]) == 2 and row["delta_min"] <= row["delta_max"]
    from gpuchef.probes.recorder import read_trace
    tr = read_trace(trace)
    assert tr.complete and not tr.problems and tr.meta["command"] == "ab"
    assert [e.name for e in tr.events if e.kind == "mark"] == \
        ["ab:1:A:1", "ab:1:B:1", "ab:1:B:2", "ab:1:A:2", "ab:1:end"]
    assert len(tr.requests) == 4 * 6
    # the trace's ids: each side's prefixed (A/), each repetition's suffixed (#rep), unique in
    # the whole trace, the load's between them
    from gpuchef.probes import ab as abdef
    res = abdef.analyse(tr.events, tr.requests, tr.steps, whole_loads=True)[3]
    for k in "AB":
        ids = [q.request_id for w in res if w.label == k for q in w.requests]
        assert len(ids) == len(set(ids)) == 12, (k, ids)
        assert sorted(ids) == sorted(f"{k}/req-{i}#{n}" for i in range(6) for n in (1, 2))
        assert all(q.request_id.endswith(f"#{w.rep}") for w in res if w.label == k
                   for q in w.requests)
    assert {e.name for e in tr.events if e.kind in ("knob", "mode")} >= \
        {"mode", "max_num_batched_tokens"}


@pytest.mark.parametrize("flag,spec,needle", [
    ("--a", "mode=fast", "--a 'mode=fast': mode 'fast' is not one of continuous, chunked"),
    ("--b", "max_num_batched_tokens=0",
     "max_num_batched_tokens=0 is out of range: allowed [1, 1048576]"),
    ("--b", "max_num_seqs=lots", "max_num_seqs must be an integer in [1, 4096], got 'lots'"),
    ("--a", "block_size=32", "block_size is fixed at start-up (flag --block-size); live knobs "
                             "are: mode, max_num_batched_tokens (budget), max_num_seqs (seqs), "
                             "long_prefill_token_threshold (chunk)"),
    ("--a", "budget=0", "--a 'budget=0': max_num_batched_tokens=0 is out of range: allowed "
                        "[1, 1048576] (flag --max-num-batched-tokens)"),
    ("--b", "Seqs=lots", "max_num_seqs must be an integer in [1, 4096], got 'lots'"),
    ("--a", "budget", "'budget' is not KNOB=VALUE"),
    ("--b", "mode=chunked,mode=continuous", "mode is given twice"),
])
def test_cli_bad_spec_is_one_clear_message(flag, spec, needle):
    r = CliRunner().invoke(cli, ["ab", *SMALL, flag, spec])
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split()), r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1
    assert "Traceback" not in r.output and "loaded" not in r.output  # refused before loading


def test_parse_setting_forms():
    base = SchedulerConfig(mode="chunked", max_num_batched_tokens=2048)
    s = parse_setting("--max-num-batched-tokens=512, continuous", base, "A")
    assert s.changes == {"max_num_batched_tokens": 512, "mode": "continuous"}
    assert s.config.max_num_seqs == base.max_num_seqs
    assert s.describe() == "max_num_batched_tokens=512, mode=continuous"
    assert parse_setting("", base, "B").config == base
    assert run_orders(3) == [("A", "B"), ("B", "A"), ("A", "B")]
    with pytest.raises(ConfigError, match="--a"):
        parse_setting("long_prefill_token_threshold=-1", base, "A")


def test_side_by_side_matches_rows_by_label():
    a = "=== T ===\nSuccessful requests:                     3\n--- S ---\nX:" + " " * 39 + "1\n==="
    b = "=== T ===\nSuccessful requests:                     4\n--- S ---\nX:" + " " * 39 + "2\n==="
    merged = side_by_side(a, b, "AB")
    assert re.search(r"^Successful requests:\s+3\s+4$", merged, re.M)
    assert re.search(r"^X:\s+1\s+2$", merged, re.M)


def test_palette_short_names_work_in_specs():
    from gpuchef.engine_host.vocab.config import KNOBS, SETTINGS

    base = SchedulerConfig(mode="chunked", max_num_batched_tokens=2048)
    s = parse_setting("budget=512,chunk=64,seqs=8,partial=2", base, "A")
    assert s.changes == {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 64,
                         "max_num_seqs": 8, "max_num_partial_prefills": 2}
    assert s.config.max_num_batched_tokens == 512
    assert s.describe().startswith("max_num_batched_tokens=512, ")
    for name, spec in {**KNOBS, **SETTINGS}.items():  # every name the palette takes
        val = {"mode": "continuous", "auto_budget": "itl_p99:50ms"}.get(name, "3")
        for word in (spec.short, name):
            assert list(parse_setting(f"{word}={val}", base, "B").changes) == [name]
    with pytest.raises(ConfigError, match="max_num_batched_tokens is given twice"):
        parse_setting("budget=512,max_num_batched_tokens=256", base, "A")


def test_cli_same_setting_twice_is_an_a_a_run_with_a_note():
    """Two settings that are the same over the base settings (aliases and explicit defaults
    included) are allowed on purpose: an A/A run measures the run-to-run noise."""
    r = CliRunner().invoke(cli, ["ab", *SMALL, "--mode", "continuous",
                                 "--max-num-batched-tokens", "2048", "--a", "chunked",
                                 "--b", "mode=chunked,budget=2048"])
    assert r.exit_code == 0, r.output
    assert "an A/A run" in " ".join(r.output.split())


def test_side_by_side_keeps_a_row_with_an_empty_value_and_widens_for_long_values():
    """An empty value ("X:" after rstrip) is a row, not a section header (it turned B's column
    blank below it); a value wider than the column widens both columns."""
    long_v = "itl_p99:50ms,ttft_p99:2000ms"
    a = ("=== T ===\nX:\n" + "Y:" + " " * 39 + "1\n--- S ---\nZ:" + " " * 39 + "5\n===")
    b = ("=== T ===\nX:" + " " * 39 + long_v + "\nY:" + " " * 39 + "2\n--- S ---\nZ:" + " " * 39
         + "6\n===")
    merged = side_by_side(a, b, "AB")
    lines = merged.splitlines()
    assert re.search(r"^X:\s+" + re.escape(long_v) + "$", merged, re.M)
    assert re.search(r"^Y:\s+1\s+2$", merged, re.M) and re.search(r"^Z:\s+5\s+6$", merged, re.M)
    # the columns line up: every row ends at the same width, B's values right-aligned there
    widths = {len(ln) for ln in lines if ln[:1] in "XYZ"}
    assert len(widths) == 1 and widths.pop() >= 41 + 2 * (len(long_v) + 2) - 1


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
