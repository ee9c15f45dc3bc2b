"""`gpuchef bench` as a user runs it: the results block for both modes, and one clear message
(exit code 2, no traceback) for each kind of bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuchef.cli import _register, cli

_register()

SMALL = ["--device", "cpu", "--model", "tiny", "--dataset", "azure-conv", "--num-prompts", "8",
         "--max-input-len", "256", "--max-output-len", "16", "--trace-speed", "4"]


def invoke(args):
    return CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)


@pytest.mark.parametrize("mode", ["continuous", "chunked"])
def test_bench_prints_the_results_block(mode, tmp_path):
    out_json = tmp_path / "r.json"
    r = invoke([*SMALL, "--mode", mode, "--max-num-batched-tokens", "256", "--goodput",
                "ttft:5000 tpot:500", "--result-json", str(out_json)])
    assert r.exit_code == 0, r.output
    for name in ["Successful requests:", "Benchmark duration (s):", "Total input tokens:",
                 "Total generated tokens:", "Request throughput (req/s):",
                 "Output token throughput (tok/s):", "Total token throughput (tok/s):",
                 "Mean TTFT (ms):", "Median TTFT (ms):", "P99 TTFT (ms):", "Mean TPOT (ms):",
                 "P99 ITL (ms):", "Mean E2EL (ms):", "Request goodput (req/s):",
                 "Engine steps:", "Mean prefill tokens per step:",
                 "Mean decode tokens per step:", "Preemptions:", "Compute busy fraction (%):"]:
        assert name in r.output, name
    assert f"Mode:                                    {mode}" in r.output
    d = json.loads(out_json.read_text())
    assert d["completed"] == 8 and d["mode"] == mode
    # forced output lengths: total generated = the sum of the clipped trace lengths
    from gpuchef.engine_host.workload import WorkloadConfig, generate
    specs = generate(WorkloadConfig(dataset="azure-conv", num_prompts=8, max_input_len=256,
                                    max_output_len=16, max_model_len=8192, vocab_size=4096))
    assert d["total_output_tokens"] == sum(s.output_len for s in specs)
    assert d["total_input_tokens"] == sum(s.prompt_len for s in specs)


@pytest.mark.parametrize("args,needle", [
    (["--max-num-batched-tokens", "0"], "max_num_batched_tokens=0 is out of range: allowed [1, "
                                        "1048576] (flag --max-num-batched-tokens)"),
    (["--max-num-seqs", "99999"], "max_num_seqs=99999 is out of range"),
    (["--model", "llama-9b"], "llama-9b"),
    (["--model", "/no/such/folder"], "/no/such/folder"),
    (["--dataset", "sharegpt"], "sharegpt"),
    (["--trace-speed", "0"], "--trace-speed 0.0 must be > 0"),
    (["--block-size", "12"], "--block-size 12"),
    (["--goodput", "latency:5"], "latency"),
])
def test_bench_bad_input_is_one_clear_message(args, needle):
    base = ["--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len", "8",
            "--output-len", "2"]
    r = invoke([*base, *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_bench_malformed_trace_names_the_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,ten,5\n")
    r = invoke(["--device", "cpu", "--model", "tiny", "--dataset", str(bad)])
    assert r.exit_code == 2
    assert "line 3" in r.output and "ten" in r.output


def test_bench_help_explains_every_flag():
    r = CliRunner().invoke(cli, ["bench", "--help"])
    assert r.exit_code == 0
    for flag in ["--mode", "--max-num-batched-tokens", "--max-num-seqs",
                 "--long-prefill-token-threshold", "--max-num-partial-prefills", "--block-size",
                 "--request-rate", "--burstiness", "--dataset", "--trace-speed", "--max-input-len",
                 "--input-len", "--output-len", "--range-ratio", "--num-prompts", "--duration",
                 "--seed", "--goodput", "--trace", "--probe-interval"]:
        assert flag in r.output, flag


def test_bench_sampler_off_and_bad_rate():
    base = ["--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len", "8",
            "--output-len", "2"]
    r = invoke([*base, "--sample-hz", "0"])
    assert r.exit_code == 0 and "NVML sampler off (--sample-hz 0)" in r.output
    r = invoke([*base, "--sample-hz", "500"])
    assert r.exit_code == 2 and "500" in r.output and "Traceback" not in r.output


def test_random_load_flags_with_a_trace_get_one_warning_and_the_trace_times(tmp_path):
    """``--request-rate`` / ``--input-len`` beside a trace replay: one warning line naming both
    (the trace brings its own times and lengths), and the run equals the one without them."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    r = invoke([*SMALL, "--request-rate", "5", "--input-len", "64", "--result-json", str(a)])
    assert r.exit_code == 0, r.output
    line = ("warning: --request-rate, --input-len have no effect with --dataset azure-conv: a "
            "trace brings its own arrival times and lengths (--trace-speed scales the times)")
    assert r.output.count(line) == 1, r.output
    r2 = invoke([*SMALL, "--result-json", str(b)])
    assert r2.exit_code == 0 and "warning: --request-rate" not in r2.output
    ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    for k in ("completed", "total_input_tokens", "total_output_tokens"):
        assert ja[k] == jb[k], k


def test_random_load_flags_without_a_trace_get_no_warning():
    r = invoke(["--device", "cpu", "--model", "tiny", "--num-prompts", "3", "--input-len", "8",
                "--output-len", "2", "--request-rate", "50"])
    assert r.exit_code == 0, r.output
    assert "no effect with --dataset" not in r.output


def test_bench_whose_engine_process_dies_is_one_line_and_a_closed_trace(tmp_path):
    """The engine runs in its own process: killed mid-run (the OOM killer's SIGKILL), `bench`
    exits 1 with one line naming it, no traceback, and its trace ends with the error event and
    the end record."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    trace = tmp_path / "t.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "gpuchef", "bench", "--device", "cpu", "--model",
                          "tiny", "--dataset", "random", "--request-rate", "20", "--num-prompts",
                          "2000", "--input-len", "64", "--output-len", "64", "--sample-hz", "0",
                          "--trace", str(trace)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        engine = None
        t0 = time.monotonic()
        while engine is None and time.monotonic() - t0 < 120:  # its one spawned child
            kids = [k for k in psutil.Process(p.pid).children()
                    if "spawn_main" in " ".join(k.cmdline())]
            if kids and trace.exists() and '"type":"step"' in trace.read_text():
                engine = kids[0]
            time.sleep(0.2)
        assert engine is not None, "the run never stepped"
        os.kill(engine.pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, out
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if "error:" in ln]
    assert lines == ["error: the engine process is gone (killed by SIGKILL)"], out
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    assert recs[-1]["type"] == "end"
    errs = [r for r in recs if r["type"] == "event" and r["kind"] == "error"]
    assert len(errs) == 1 and "killed by SIGKILL" in errs[0]["message"]


def test_ctrl_c_prints_the_results_of_what_finished_and_a_partial_json(tmp_path):
    """Ctrl-C in `bench`: "interrupted", the results block of what finished, the result JSON
    marked partial, and the requests in flight recorded as withdrawn ("session end") in the
    trace — not a silent exit 1."""
    import signal
    import subprocess
    import sys
    import time

    trace, out_json = tmp_path / "t.jsonl", tmp_path / "r.json"
    p = subprocess.Popen([sys.executable, "-m", "gpuchef", "bench", "--device", "cpu", "--model",
                          "tiny", "--dataset", "random", "--request-rate", "40", "--num-prompts",
                          "2000", "--input-len", "64", "--output-len", "64", "--sample-hz", "0",
                          "--trace", str(trace), "--result-json", str(out_json)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:  # until some requests finished
            if trace.exists() and trace.read_text().count('"type":"request"') >= 3:
                break
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out
    assert "interrupted:" in out and "Traceback" not in out
    assert "Successful requests:" in out
    d = json.loads(out_json.read_text())
    assert d["partial"] is True and d["completed"] >= 3
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    reqs = [r for r in recs if r["type"] == "request"]
    ended = [r for r in reqs if r["finish_reason"] == "session end"]
    assert ended, "the requests in flight were not recorded as withdrawn"
    done = [r for r in reqs if r["finish_reason"] == "length"]
    assert d["completed"] == len(done)
    assert recs[-1]["type"] == "end"


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
