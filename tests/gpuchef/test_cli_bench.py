"""`gpuchef bench` as a user runs it: the results block for both modes, and one clear message
(exit code 2, no traceback) for each kind of bad input — among them --trace and --result-json
paths that would lose the trace or overwrite the dataset, refused before the model loads; a trace
that fails mid-run is a warning and the results still print."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.probes.recorder import TraceRecorder, read_trace

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
    from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate
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


# ---- --trace / --result-json paths: a bad one is one error before the model loads -------

TINY_RUN = ["bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len",
            "8", "--output-len", "2", "--sample-hz", "0"]


def invoke_tiny(*args):
    """`bench` of 2 tiny requests with ``args``."""
    return CliRunner().invoke(cli, [*TINY_RUN, *args], catch_exceptions=False)


def assert_refused_early(r, needle):
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split()), r.output
    assert "loaded tiny" not in r.output and "Traceback" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1, r.output


def test_trace_and_result_json_on_one_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke_tiny("--trace", "same.json", "--result-json", "./same.json")
    assert_refused_early(r, "--trace 'same.json' and --result-json './same.json' are the same "
                            "file: the results would overwrite the trace; give another path")
    assert not (tmp_path / "same.json").exists()
    (tmp_path / "a.jsonl").write_text("")
    os.symlink(tmp_path / "a.jsonl", tmp_path / "b.json")   # one file under two names
    assert_refused_early(invoke_tiny("--trace", "a.jsonl", "--result-json", "b.json"),
                         "are the same file")


@pytest.mark.parametrize("flag", ["--trace", "--result-json"])
def test_an_output_on_the_dataset_csv_is_refused_and_the_csv_kept(tmp_path, monkeypatch, flag):
    # `--dataset my.csv --trace my.csv` (the word "trace" names both) read the CSV, then
    # replaced it with the session trace: the user's dataset was gone
    monkeypatch.chdir(tmp_path)
    csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,20,5\n"
    (tmp_path / "my.csv").write_text(csv)
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--sample-hz",
                                 "0", "--dataset", "my.csv", flag, "./my.csv"],
                           catch_exceptions=False)
    assert_refused_early(r, f"{flag} './my.csv' and --dataset 'my.csv' are the same file: "
                            f"{flag} would overwrite the dataset it reads")
    assert (tmp_path / "my.csv").read_text() == csv


@pytest.mark.parametrize("flag", ["--trace", "--result-json"])
def test_a_path_ending_in_a_slash_is_refused_not_made_a_file(tmp_path, flag):
    d = str(tmp_path / "out") + "/"
    assert_refused_early(invoke_tiny(flag, d), f"{flag} {d!r} ends in '/': give a file path")
    assert not (tmp_path / "out").exists()


def test_tilde_in_trace_and_result_json_is_the_home_folder(tmp_path, monkeypatch):
    # `--trace=~/t.jsonl` reaches gpuchef unexpanded; the check looked at $HOME/t.jsonl while
    # the files went to ./~/t.jsonl
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    r = invoke_tiny("--trace=~/t.jsonl", "--result-json=~/r.json")
    assert r.exit_code == 0, r.output
    assert not (cwd / "~").exists()
    assert read_trace(home / "t.jsonl").complete
    assert json.loads((home / "r.json").read_text())["completed"] == 2


def _no_space(self):
    raise OSError(28, "No space left on device")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_trace_on_a_full_disk_is_one_error_not_a_traceback(tmp_path):
    # the meta record's flush failed, then close() flushed again and raised out of the recorder
    from gpuchef.engine_host.vocab.errors import ConfigError

    with pytest.raises(ConfigError, match="--trace '/dev/full': cannot write: No space left"):
        TraceRecorder("/dev/full")
    r = invoke_tiny("--trace", "/dev/full")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert [ln for ln in r.output.splitlines() if ln.startswith("error:")] == [
        "error: --trace '/dev/full': cannot write: No space left on device"]


def test_a_trace_that_fails_mid_run_is_a_warning_and_the_results_still_print(tmp_path,
                                                                             monkeypatch):
    # before: the results printed and nothing said the trace had stopped being written
    monkeypatch.setattr(TraceRecorder, "_flush", _no_space)
    p = tmp_path / "t.jsonl"
    r = invoke_tiny("--trace", str(p))
    assert r.exit_code == 0, r.output
    assert "Successful requests:" in r.output
    warn = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert warn == [f"warning: --trace {str(p)!r}: trace flush failed: [Errno 28] No space left "
                    "on device; the trace stops where that happened"], r.output


def test_trace_prompts_stores_what_its_help_says(tmp_path):
    # the help said "Store prompt token ids in the trace"; what it stores is each request's
    # output token ids (RequestRecord has no prompt ids): a user after the prompts got neither
    # the prompts nor a word about it
    help_text = " ".join(CliRunner().invoke(cli, ["bench", "--help"]).output.split())
    assert "--trace-prompts Also store each request's generated (output) token ids" in help_text
    assert "prompt token ids are never stored" in help_text
    plain, tp = tmp_path / "plain.jsonl", tmp_path / "tp.jsonl"
    assert invoke_tiny("--trace", str(plain)).exit_code == 0
    assert invoke_tiny("--trace", str(tp), "--trace-prompts").exit_code == 0
    assert "token_ids" not in plain.read_text() and "prompt_token" not in tp.read_text()
    reqs = [json.loads(ln) for ln in tp.read_text().splitlines() if '"type":"request"' in ln]
    assert len(reqs) == 2
    assert all(len(r["output_token_ids"]) == r["output_len"] == 2 for r in reqs)
    assert read_trace(tp).meta["trace_prompts"] is True


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
