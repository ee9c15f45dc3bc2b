"""`gpuchef bench --trace` paths that used to lose the trace or write it somewhere else than the
path that was checked (fresh-eyes breakage pass). Each bad one: one `error:` line, exit 2,
before the model loads."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from gpuchef.cli import _register, cli
from gpuchef.probes.recorder import TraceRecorder, read_trace

_register()

BASE = ["bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len", "8",
        "--output-len", "2", "--sample-hz", "0"]


def invoke(*args):
    return CliRunner().invoke(cli, [*BASE, *args], catch_exceptions=False)


def assert_refused_early(r, needle):
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split()), r.output
    assert "loaded tiny" not in r.output and "Traceback" not in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1, r.output


def test_trace_and_result_json_on_one_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("--trace", "same.json", "--result-json", "./same.json")
    assert_refused_early(r, "--trace 'same.json' and --result-json './same.json' are the same "
                            "file: the results would overwrite the trace; give another path")
    assert not (tmp_path / "same.json").exists()
    (tmp_path / "a.jsonl").write_text("")
    os.symlink(tmp_path / "a.jsonl", tmp_path / "b.json")   # one file under two names
    assert_refused_early(invoke("--trace", "a.jsonl", "--result-json", "b.json"),
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
    assert_refused_early(invoke(flag, d), f"{flag} {d!r} ends in '/': give a file path")
    assert not (tmp_path / "out").exists()


def test_tilde_in_trace_and_result_json_is_the_home_folder(tmp_path, monkeypatch):
    # `--trace=~/t.jsonl` reaches gpuchef unexpanded; the check looked at $HOME/t.jsonl while
    # the files went to ./~/t.jsonl
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    r = invoke("--trace=~/t.jsonl", "--result-json=~/r.json")
    assert r.exit_code == 0, r.output
    assert not (cwd / "~").exists()
    assert read_trace(home / "t.jsonl").complete
    assert json.loads((home / "r.json").read_text())["completed"] == 2


def test_recorder_expands_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # where a literal ./~ folder would go
    with TraceRecorder("~/a.jsonl") as rec:
        assert rec.path == tmp_path / "a.jsonl"
        assert rec.rotate("~/b.jsonl") == tmp_path / "a.jsonl"
    assert read_trace(tmp_path / "a.jsonl").complete and read_trace(tmp_path / "b.jsonl").complete


def _no_space(self):
    raise OSError(28, "No space left on device")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_trace_on_a_full_disk_is_one_error_not_a_traceback(tmp_path):
    # the meta record's flush failed, then close() flushed again and raised out of the recorder
    from gpuchef.engine_host.config import ConfigError

    with pytest.raises(ConfigError, match="--trace '/dev/full': cannot write: No space left"):
        TraceRecorder("/dev/full")
    r = invoke("--trace", "/dev/full")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert [ln for ln in r.output.splitlines() if ln.startswith("error:")] == [
        "error: --trace '/dev/full': cannot write: No space left on device"]


def test_a_trace_that_fails_mid_run_is_a_warning_and_the_results_still_print(tmp_path,
                                                                             monkeypatch):
    # before: the results printed and nothing said the trace had stopped being written
    monkeypatch.setattr(TraceRecorder, "_flush", _no_space)
    p = tmp_path / "t.jsonl"
    r = invoke("--trace", str(p))
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
    assert invoke("--trace", str(plain)).exit_code == 0
    assert invoke("--trace", str(tp), "--trace-prompts").exit_code == 0
    assert "token_ids" not in plain.read_text() and "prompt_token" not in tp.read_text()
    reqs = [json.loads(ln) for ln in tp.read_text().splitlines() if '"type":"request"' in ln]
    assert len(reqs) == 2
    assert all(len(r["output_token_ids"]) == r["output_len"] == 2 for r in reqs)
    assert read_trace(tp).meta["trace_prompts"] is True


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
