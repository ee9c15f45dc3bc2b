"""`gpuchef bench-attention` on a CPU: GPU-sized defaults are replaced by CPU-sized ones (with a
line saying so and progress per run), and a run that would not fit in memory is skipped with its
estimate instead of growing the process to ~20 GB."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from gpuchef.experiments import attention as ba
from gpuchef.commands.cli import _register, cli

_register()


def invoke(*args):
    return CliRunner().invoke(cli, ["bench-attention", *args], catch_exceptions=False)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # --device auto → cpu


@pytest.fixture
def small_cpu_defaults(monkeypatch):
    # the real values take ~20 s on 2 cores; the rule is the same at any size
    monkeypatch.setattr(ba, "CPU_DEFAULTS", {"batch_size": 2, "seq_len": 24, "chunk_len": 8,
                                             "iters": 1})


def test_no_flags_on_a_cpu_run_cpu_sized_with_progress(tmp_path, no_cuda, small_cpu_defaults):
    out = tmp_path / "a.json"
    r = invoke("--head-dim", "16", "--num-heads", "2", "--num-kv-heads", "2", "--json", str(out))
    assert r.exit_code == 0, r.output
    cfg = json.loads(out.read_text())["config"]
    assert (cfg["batch_size"], cfg["seq_len"], cfg["chunk_len"], cfg["iters"]) == (2, 24, 8, 1)
    text = " ".join(r.output.split())
    assert ("GPU-sized defaults replaced by --batch-size 2, --seq-len 24, --chunk-len 8, "
            "--iters 1") in text
    for i, (case, backend) in enumerate([(c, b) for c in ba.CASES for b in ("sdpa", "naive")]):
        assert f"{case}: {backend} ({i + 1}/6)" in text
    assert all(row["ms"] > 0 for row in json.loads(out.read_text())["results"])


def test_flags_given_on_a_cpu_are_kept(tmp_path, no_cuda, small_cpu_defaults):
    out = tmp_path / "a.json"
    r = invoke("--head-dim", "16", "--num-heads", "2", "--num-kv-heads", "2", "--seq-len", "16",
               "--iters", "2", "--cases", "decode", "--json", str(out))
    assert r.exit_code == 0, r.output
    cfg = json.loads(out.read_text())["config"]
    assert (cfg["batch_size"], cfg["seq_len"], cfg["chunk_len"], cfg["iters"]) == (2, 16, 8, 2)
    assert "--seq-len" not in r.output.split("replaced by")[1].split("(give")[0]


def test_real_cpu_defaults_are_small_and_the_gpu_ones_are_not():
    hq = hkv = 32
    cpu = ba.build_cases(["prefill"], ba.CPU_DEFAULTS["batch_size"], ba.CPU_DEFAULTS["seq_len"],
                         128)[0]
    gpu = ba.build_cases(["prefill"], 16, 2048, 512)[0]
    # the naive scores alone, float32 for the softmax: B·H·L² elements × 4 bytes
    assert ba.peak_bytes(gpu, "naive", hq, hkv, 128, 2) > 16 * 32 * 2048 ** 2 * 4 > 8e9
    assert ba.peak_bytes(cpu, "naive", hq, hkv, 128, 2) < 1e9


def test_a_run_that_does_not_fit_is_skipped_with_its_estimate(tmp_path, monkeypatch):
    monkeypatch.setattr(ba, "_free_bytes", lambda: 50_000_000)
    out = tmp_path / "a.json"
    r = invoke("--device", "cpu", "--batch-size", "2", "--seq-len", "1024", "--num-heads", "8",
               "--num-kv-heads", "8", "--head-dim", "64", "--cases", "prefill", "--iters", "1",
               "--json", str(out))
    assert r.exit_code == 0, r.output
    rows = {row["backend"]: row for row in json.loads(out.read_text())["results"]}
    need = 2 * 8 * 1024 * 1024 * 4  # the float32 softmax of the naive scores alone
    assert rows["naive"]["ms"] is None
    assert rows["naive"]["error"].startswith("skipped: needs ~")
    assert float(rows["naive"]["error"].split("~")[1].split(" GB")[0]) * 1e9 >= need * 0.95
    assert rows["sdpa"]["ms"] > 0 and rows["sdpa"]["error"] is None


def test_the_command_is_registered_and_an_import_error_is_not_swallowed(monkeypatch):
    import sys

    from gpuchef.commands import cli as cli_mod

    assert "bench-attention" in cli.commands
    monkeypatch.setitem(sys.modules, "gpuchef.commands.bench_attention", None)  # its import fails
    monkeypatch.setattr(cli_mod.cli, "commands", {})
    with pytest.raises(ImportError, match="gpuchef.commands.bench_attention"):
        cli_mod._register()  # it used to drop the command without a word
