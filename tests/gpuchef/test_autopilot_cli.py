"""The autopilot's and the long-prompt lane's surfaces: A/B specs, the flags of bench/ab."""

from __future__ import annotations

import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import SchedulerConfig


def test_ab_spec_takes_auto_budget_with_its_comma():
    from gpuchef.experiments.ab import parse_setting

    s = parse_setting("mode=chunked,auto_budget=itl_p99:50ms,ttft_p99:2s,budget=1024",
                      SchedulerConfig(), "B")
    assert s.config.auto_budget == "itl_p99:50ms,ttft_p99:2000ms"
    assert s.config.max_num_batched_tokens == 1024
    with pytest.raises(ConfigError, match="--b .*out of range"):
        parse_setting("auto_budget=itl_p99:0", SchedulerConfig(), "B")


def test_ab_spec_auto_budget_off_reads_off_and_zero_is_refused_by_name():
    from gpuchef.experiments.ab import parse_setting

    s = parse_setting("mode=chunked,auto_budget=off", SchedulerConfig(), "B", "--b")
    assert s.config.auto_budget == ""
    assert s.describe() == "mode=chunked, auto_budget=off"
    with pytest.raises(ConfigError, match=r"--b 'auto_budget=0': auto_budget '0'.*or off"):
        parse_setting("auto_budget=0", SchedulerConfig(), "B", "--b")


def _invoke(*args):
    from click.testing import CliRunner

    from gpuchef.commands.cli import _register, cli

    _register()
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


BASE = ["--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len", "8",
        "--output-len", "2"]


@pytest.mark.parametrize("cmd, flag, value, says", [
    ("bench", "--auto-budget", "itl_p99:0ms", "out of range"),
    ("bench", "--auto-budget", "itl_p99:50ms,ttft_p99:10ms", "below one step"),
    ("bench", "--auto-budget", "latency:50", "not METRIC_STAT:DURATION"),
    ("ab", "--auto-budget", "itl_p99:-1ms", "negative"),
    ("bench", "--max-long-partial-prefills", "0", "max_long_partial_prefills=0 is out of range"),
])
def test_bad_flags_are_refused_before_the_model_loads(cmd, flag, value, says):
    r = _invoke(cmd, *BASE, flag, value)
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert says in out and "Traceback" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1


def test_bench_with_the_autopilot_records_its_choices(tmp_path):
    import json

    trace = tmp_path / "t.jsonl"
    r = _invoke("bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "6",
                "--input-len", "64", "--output-len", "40", "--max-num-batched-tokens", "64",
                "--auto-budget", "itl_p99:500ms", "--max-long-partial-prefills", "1",
                "--trace", str(trace))
    assert r.exit_code == 0, r.output
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    steps = [d for d in recs if d["type"] == "step"]
    assert steps and all(d["auto_budget"] == "itl_p99:500ms" for d in steps)
    assert all(0 <= d["prefill_allowance"] <= 64 for d in steps if d["mode"] == "chunked")
    assert any(d["type"] == "event" and d["name"] == "auto_budget" for d in recs)
    meta = recs[0]
    assert meta["engine_config"]["scheduler"]["auto_budget"] == "itl_p99:500ms"


def test_ab_says_the_autopilot_is_idle_in_continuous_mode():
    """A tester combined mode=continuous with auto_budget and got no hint that the autopilot
    (chunked steps' prefill allowance) does nothing there; the header says so, once."""
    from gpuchef.experiments.ab import parse_setting
    from gpuchef.engine_host.vocab.config import SchedulerConfig

    s = parse_setting("mode=continuous,auto_budget=itl_p99:50ms", SchedulerConfig(), "B")
    assert s.notes and "idle in continuous" in s.notes[0]
    assert not parse_setting("mode=chunked,auto_budget=itl_p99:50ms", SchedulerConfig(),
                             "A").notes
    r = _invoke("ab", *BASE, "--a", "mode=chunked", "--b",
                "mode=continuous,auto_budget=itl_p99:50ms", "--repetitions", "1")
    assert r.exit_code == 0, r.output
    assert r.output.count("note: B: the autopilot steers chunked steps only") == 1, r.output


def _rows(text: str) -> dict[str, str]:
    return {ln[:40].rstrip(): ln[41:].strip() for ln in text.splitlines()
            if len(ln) > 40 and ln[:40].rstrip().endswith(":")}


def test_bench_results_block_says_what_the_autopilot_did(tmp_path):
    """A tester found bench's output silent on the autopilot; its row counts the trace's own
    steps per state (read back independently from the JSONL)."""
    import json
    from collections import Counter

    trace = tmp_path / "t.jsonl"
    r = _invoke("bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "6",
                "--input-len", "64", "--output-len", "24", "--max-num-batched-tokens", "64",
                "--auto-budget", "itl_p99:500ms", "--trace", str(trace))
    assert r.exit_code == 0, r.output
    steps = [d for d in map(json.loads, trace.read_text().splitlines())
             if d["type"] == "step" and d["auto_budget"] and d["prefill_allowance"] >= 0]
    want = Counter(d["autopilot_state"] for d in steps)
    row = _rows(r.output)["Autopilot:"]
    assert row.startswith(f"itl_p99:500ms; {len(steps)} steps: "), row
    assert ", ".join(f"{k} {v}" for k, v in sorted(want.items())) in row
    assert "fit error at the end" in row


def test_bench_says_the_autopilot_is_idle_in_continuous_mode():
    r = _invoke("bench", *BASE, "--mode", "continuous", "--auto-budget", "itl_p99:50ms")
    assert r.exit_code == 0, r.output
    assert _rows(r.output)["Autopilot:"] == ("itl_p99:50ms; idle: no chunked step asked it "
                                             "(continuous mode)")


def test_ab_with_the_autopilot_on_one_side_keeps_both_columns(tmp_path):
    """A tester's report: with auto_budget on B only, A's empty auto_budget value made its row
    look like a section header, and B's column stayed blank from there (its duration,
    throughput and token counts). Every row now has both values; A's autopilot reads off."""
    import json

    trace = tmp_path / "ab.jsonl"
    r = _invoke("ab", "--device", "cpu", "--model", "tiny", "--num-prompts", "6",
                "--input-len", "64", "--output-len", "16", "--request-rate", "8",
                "--repetitions", "1", "--a", "mode=chunked,max_num_batched_tokens=512",
                "--b", "mode=chunked,max_num_batched_tokens=2048,auto_budget=itl_p99:50ms",
                "--trace", str(trace))
    assert r.exit_code == 0, r.output
    block = r.output[r.output.index("A/B Serving Benchmark Result"):]
    block = block[:block.index("\n=====")]
    two = [ln for ln in block.splitlines()[2:] if ln[:40].rstrip().endswith(":")]
    assert two and all(len(ln[40:].split()) >= 2 for ln in two), "\n".join(two)
    got = {ln[:40].rstrip(): ln[40:].split() for ln in two}
    assert got["auto_budget:"] == ["off", "itl_p99:50ms"]
    steps = [d for d in map(json.loads, trace.read_text().splitlines())
             if d["type"] == "step" and d["auto_budget"] and d["prefill_allowance"] >= 0]
    n_steer = sum(d["autopilot_state"] == "steering" for d in steps)
    assert got["Autopilot steps:"] == ["off", "steering", f"{n_steer}/{len(steps)}"]
    for label in ("Benchmark duration (s):", "Request throughput (req/s):",
                  "Total input tokens:"):
        assert len(got[label]) == 2, (label, got[label])


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
