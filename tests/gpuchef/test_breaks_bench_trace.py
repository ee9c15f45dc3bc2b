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
                            "file: the results would overwrite the trace")
    assert not (tmp_path / "same.json").exists()
    (tmp_path / "a.jsonl").write_text("")
    os.symlink(tmp_path / "a.jsonl", tmp_path / "b.json")   # one file under two names
    assert_refused_early(invoke("--trace", "a.jsonl", "--result-json", "b.json"),
                         "are the same file")


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
