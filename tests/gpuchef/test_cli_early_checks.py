"""Bad input to `bench`, `ab` and `bench-attention` is refused before any work (before the model
loads), with one `error:` line naming the value and what is allowed, exit code 2; and the
results say what `--async-scheduling` and `--max-model-len` did."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli

_register()

BASE = ["--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len", "8",
        "--output-len", "2"]


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def assert_refused_early(r, needle):
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert needle in out, r.output
    assert "Traceback" not in r.output
    assert "loaded tiny" not in r.output  # refused before the model loaded
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.output


def _good_csv(tmp_path):
    p = tmp_path / "good.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,12,5\n")
    return p


def _bad_csv(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,ten,5\n")
    return p


@pytest.mark.parametrize("cmd", ["bench", "ab"])
@pytest.mark.parametrize("case", [
    "result_json_unwritable", "result_json_is_folder", "trace_unwritable", "trace_is_folder",
    "result_json_under_a_file", "trace_under_a_file",
    "sample_hz", "sample_hz_negative", "gpus", "dataset_missing", "dataset_contents",
    "kv_cache_memory_neg", "kv_cache_memory_zero", "num_gpu_blocks_zero", "num_gpu_blocks_neg",
    "gpu_mem_util_zero", "gpu_mem_util_high", "trace_is_result_json", "trace_is_dataset",
])
def test_refused_before_loading(cmd, case, tmp_path):
    args, needle = {
        "result_json_unwritable": (["--result-json", "/proc/r.json"],
                                   "--result-json '/proc/r.json': cannot write a file there"),
        "trace_is_folder": (["--trace", str(tmp_path)], "is a folder: give a file path"),
        "result_json_under_a_file": (["--result-json", str(_good_csv(tmp_path) / "no" / "r.json")],
                                     "is a file, not a folder"),
        "trace_under_a_file": (["--trace", str(_good_csv(tmp_path) / "t.jsonl")],
                               "is a file, not a folder"),
        "result_json_is_folder": (["--result-json", str(tmp_path)], "is a folder"),
        "trace_unwritable": (["--trace", "/proc/t.jsonl"], "--trace '/proc/t.jsonl'"),
        "sample_hz": (["--sample-hz", "1000"],
                      "--sample-hz 1000 is out of range: allowed 0 (off) or [1, 100] Hz"),
        "sample_hz_negative": (["--sample-hz", "-1"], "allowed 0 (off) or [1, 100] Hz"),
        "gpus": (["--gpus", "abc"], "--gpus 'abc': 'abc' is not a GPU index"),
        "dataset_missing": (["--dataset", str(tmp_path / "none.csv")], "no such file"),
        "dataset_contents": (["--dataset", str(_bad_csv(tmp_path))], "line 3: ContextTokens 'ten'"),
        "kv_cache_memory_neg": (["--kv-cache-memory", "-1"], "--kv-cache-memory -1 must be > 0 GiB"),
        "kv_cache_memory_zero": (["--kv-cache-memory", "0"], "--kv-cache-memory 0 must be > 0 GiB"),
        "num_gpu_blocks_zero": (["--num-gpu-blocks", "0"], "--num-gpu-blocks 0 must be > 0"),
        "num_gpu_blocks_neg": (["--num-gpu-blocks", "-1"], "--num-gpu-blocks -1 must be > 0"),
        "gpu_mem_util_zero": (["--gpu-memory-utilization", "0"],
                              "--gpu-memory-utilization 0 is out of range: allowed (0, 1]"),
        "gpu_mem_util_high": (["--gpu-memory-utilization", "1.5"],
                              "--gpu-memory-utilization 1.5 is out of range: allowed (0, 1]"),
        "trace_is_result_json": (["--trace", str(tmp_path / "x"), "--result-json",
                                  str(tmp_path / "x")], "are the same file"),
        "trace_is_dataset": (["--dataset", str(_good_csv(tmp_path)), "--trace",
                              str(_good_csv(tmp_path))], "would overwrite the dataset it reads"),
    }[case]
    r = invoke(cmd, *BASE, *args)
    assert_refused_early(r, needle)
    assert not (tmp_path / "no").exists()


def test_result_json_check_leaves_no_file(tmp_path):
    from gpuchef.engine_host.vocab.errors import ConfigError
    from gpuchef.commands.options import check_output_path

    p = tmp_path / "r.json"
    check_output_path(str(p), "--result-json")
    assert not p.exists()  # the probe file is removed again
    p.write_text("keep")
    check_output_path(str(p), "--result-json")
    assert p.read_text() == "keep"  # an existing file is not truncated by the check
    check_output_path(str(tmp_path / "a" / "t.jsonl"), "--trace")
    assert (tmp_path / "a").is_dir()
    with pytest.raises(ConfigError, match="is a folder"):
        check_output_path(str(tmp_path), "--trace")


def test_every_output_flag_creates_a_missing_folder(tmp_path):
    """--trace, --result-json (bench, ab) and report -o into folders that do not exist yet: each
    is created and the file written there (--result-json refused a missing folder while --trace
    made it; `vllm bench serve --result-dir` makes it)."""
    from gpuchef.probes.recorder import read_trace

    t, rj = tmp_path / "a" / "b" / "t.jsonl", tmp_path / "c" / "r.json"
    r = invoke("bench", *BASE, "--trace", str(t), "--result-json", str(rj))
    assert r.exit_code == 0, r.output
    assert json.loads(rj.read_text())["completed"] == 2
    assert len(read_trace(str(t)).requests) == 2
    t2, rj2 = tmp_path / "d" / "t.jsonl", tmp_path / "e" / "r.json"
    r = invoke("ab", *BASE, "--trace", str(t2), "--result-json", str(rj2))
    assert r.exit_code == 0, r.output
    assert json.loads(rj2.read_text()) and read_trace(str(t2)).requests
    out = tmp_path / "f" / "g" / "run.perfetto.json"
    r = invoke("report", str(t), "--format", "perfetto", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())
    # report -o under a file: one clear message, before the trace is read
    r = invoke("report", str(t), "--format", "perfetto", "-o", str(rj / "x.json"))
    assert r.exit_code != 0 and "is a file, not a folder" in r.output, r.output
    assert "Traceback" not in r.output


def test_bench_shows_async_scheduling_and_clipping(tmp_path):
    out = tmp_path / "r.json"
    r = invoke("bench", *BASE, "--async-scheduling", "--max-model-len", "6",
               "--result-json", str(out))
    assert r.exit_code == 0, r.output
    assert "Scheduling:" in r.output and "async (step N+1 launched while N runs" in r.output
    assert "no overlap to gain on CPU" in r.output
    warn = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert warn == ["warning: --max-model-len 6 clipped 2 of 2 prompts (to <= 4 tokens) so that "
                    "prompt + output fits; raise it or shorten the load (--max-input-len, "
                    "--max-output-len)"], r.output
    d = json.loads(out.read_text())
    assert d["config"]["async_scheduling"] is True and d["config"]["scheduling"] == "async"
    assert d["config"]["max_model_len"] == 6

    r = invoke("bench", *BASE, "--result-json", str(out))
    assert r.exit_code == 0, r.output
    assert "warning:" not in r.output
    assert any(ln.split() == ["Scheduling:", "sync"] for ln in r.output.splitlines()), r.output
    assert json.loads(out.read_text())["config"]["async_scheduling"] is False


def test_bench_warns_when_a_trace_is_clipped():
    r = invoke("bench", "--device", "cpu", "--model", "tiny", "--dataset", "azure-conv",
               "--num-prompts", "5", "--max-model-len", "10", "--trace-speed", "inf",
               "--max-output-len", "4")
    assert r.exit_code == 0, r.output
    warn = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and warn[0].startswith(
        "warning: --max-model-len 10 clipped 5 of 5 prompts (to <= 6 tokens)"), r.output


def test_ab_shows_async_scheduling(tmp_path):
    out = tmp_path / "ab.json"
    r = invoke("ab", *BASE, "--async-scheduling", "--result-json", str(out))
    assert r.exit_code == 0, r.output
    assert "Scheduling: async (step N+1 launched while N runs" in r.output
    assert json.loads(out.read_text())["config"]["async_scheduling"] is True


def test_bench_sample_hz_help_and_top_range_unchanged():
    r = invoke("bench", "--help")
    assert "0 = sampler off" in r.output
    assert "clipped" in " ".join(r.output.split())  # --max-model-len says what it does


# ---- bench-attention -------------------------------------------------------------------------

SMALL_ATTN = ["bench-attention", "--batch-size", "2", "--num-heads", "2", "--num-kv-heads", "2",
              "--head-dim", "16", "--iters", "1"]


def test_bench_attention_cpu_short_seq_runs(tmp_path):
    out = tmp_path / "a.json"
    r = invoke(*SMALL_ATTN, "--device", "cpu", "--seq-len", "32", "--json", str(out))
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["config"]["chunk_len"] == 32  # min(512, --seq-len)
    assert any("FlashInfer needs a CUDA device" in n for n in d["notes"])


def test_bench_attention_device_defaults_to_auto():
    r = invoke("bench-attention", "--help")
    text = " ".join(r.output.split())
    assert "[default: auto]" in text
    assert "../shared" not in text
    assert "measured on an H200: 4.3 TB/s device copy, 790 TFLOP/s bf16 matmul " \
           "(docs/benchmarks.md)" in text


@pytest.mark.parametrize("args,needle", [
    (["--device", "cpu", "--backends", "flashinfer"],
     "--backends flashinfer cannot run here: FlashInfer needs a CUDA device"),
    (["--device", "cpu", "--seq-len", "16", "--chunk-len", "32"],
     "--chunk-len 32 must not exceed --seq-len 16"),
    (["--device", "cpu", "--json", "/proc/a.json"], "--json '/proc/a.json': cannot write"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--device", "cpu", "--num-kv-heads", "3"], "--num-heads 2 must be a multiple of"),
    (["--device", "cpu", "--peak-tbps", "0"], "--peak-tbps 0 must be a finite number > 0"),
])
def test_bench_attention_bad_input(args, needle):
    r = invoke(*SMALL_ATTN, *args)
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split()), r.output
    assert r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1, r.output


def test_top_refuses_an_unwritable_trace_before_loading():
    from click.testing import CliRunner

    from gpuchef.commands.cli import _register, cli

    _register()
    r = CliRunner().invoke(cli, ["top", "--device", "cpu", "--trace", "/proc/t.jsonl"])
    assert r.exit_code == 2 and "--trace" in r.output and "/proc/t.jsonl" in r.output
    assert "loaded tiny" not in r.output and "Traceback" not in r.output


def test_output_paths_under_a_file_and_with_a_tilde(tmp_path, monkeypatch):
    """A path whose folder is a file says so (it said the folder "does not exist"), and
    --result-json=~/x (no shell expansion after '=') is written where it was checked: $HOME."""
    from gpuchef.engine_host.vocab.errors import ConfigError
    from gpuchef.commands.options import check_output_path, write_json

    f = tmp_path / "t.jsonl"
    f.write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_output_path(str(f / "out.json"), "--result-json")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    check_output_path("~/r.json", "--result-json")
    write_json("~/r.json", {"a": 1}, "--result-json")
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": 1}
    assert not (tmp_path / "~").exists()


def test_top_refuses_a_trace_that_is_its_dataset(tmp_path):
    csv = _good_csv(tmp_path)
    before = csv.read_text()
    r = invoke("top", "--device", "cpu", "--model", "tiny", "--dataset", str(csv),
               "--trace", str(csv))
    assert_refused_early(r, "would overwrite the dataset it reads")
    assert csv.read_text() == before


@pytest.mark.parametrize("trace, needle", [
    ("{dir}", "--trace '{dir}' is a folder: give a file path"),
    ("{dir}/", "--trace '{dir}/' ends in '/': give a file path"),
    ("{csv}/t.jsonl", "is a file, not a folder"),
], ids=["folder", "slash", "under-a-file"])
@pytest.mark.parametrize("cmd", [
    ("serve", "--device", "cpu", "--model", "tiny", "--port", "0"),
    ("top", "--device", "cpu", "--model", "tiny"),
    ("top", "--attach", "http://127.0.0.1:9"),  # refused before any scrape: nothing listens
], ids=["serve", "top", "top-attach"])
def test_trace_paths_get_the_output_path_messages(tmp_path, cmd, trace, needle):
    """serve's and top's --trace go through options.check_output_path as bench's does: a folder
    gets gpuchef's own line, not click's 'Invalid value for '--trace': File ... is a
    directory'."""
    csv = _good_csv(tmp_path)
    fill = dict(dir=str(tmp_path), csv=str(csv))
    r = invoke(*cmd, "--trace", trace.format(**fill))
    assert_refused_early(r, needle.format(**fill))
    assert "Invalid value" not in r.output


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
