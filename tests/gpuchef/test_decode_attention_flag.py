"""``--decode-attention``: the flag reaches the engine config, a bad value or one the chosen
engine cannot take is one clear message, and what ran is written down (the result JSON's
``config`` and the trace's meta) — on the CPU, where the reference backend has one path."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import EngineConfig

_register()

SMALL = ["--device", "cpu", "--model", "tiny", "--num-prompts", "3", "--input-len", "16",
         "--output-len", "3", "--request-rate", "inf"]


def test_config_refuses_an_unknown_kernel_naming_the_allowed_ones():
    with pytest.raises(ConfigError, match="--decode-attention 'trtllm' is not one of auto, "
                                          "flashinfer, xqa"):
        EngineConfig(decode_attention="trtllm")


def test_config_refuses_a_kernel_choice_for_vllm():
    with pytest.raises(ConfigError, match="--engine vllm chooses its own"):
        EngineConfig(engine="vllm", decode_attention="xqa")
    assert EngineConfig(engine="vllm").decode_attention == "auto"


def test_bad_flag_value_is_one_message():
    r = CliRunner().invoke(cli, ["bench", *SMALL, "--decode-attention", "fast"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "'fast' is not one of 'auto', 'flashinfer', 'xqa'" in r.output


def test_what_ran_is_in_the_result_json_and_the_trace(tmp_path):
    res, trace = tmp_path / "r.json", tmp_path / "t.jsonl.gz"
    r = CliRunner().invoke(cli, ["bench", *SMALL, "--decode-attention", "flashinfer",
                                 "--result-json", str(res), "--trace", str(trace)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    cfg = json.loads(res.read_text())["config"]
    # the CPU runs the PyTorch reference: its one path is what decode rows ran on
    assert cfg["attention_backend"] == "reference" and cfg["decode_attention"] == "reference"
    with gzip.open(trace, "rt") as f:
        meta = json.loads(f.readline())
    assert meta["decode_attention"] == "reference"
    assert meta["engine_config"]["decode_attention"] == "flashinfer"  # as asked
    # the other kernel choices: no BLAS library off CUDA, the RoPE + K/V append mode in force
    from gpuchef.engine_host import ops
    want = {"blas": None, "rope_append": ops.rope_append_mode()}
    assert cfg["kernels"] == meta["kernels"] == want
    assert "Device / attention:                      cpu / reference" in r.output
    # the kernel asked for cannot run here: one warning says so, the run goes on
    assert ("warning: --decode-attention flashinfer has no effect on cpu: decode rows run on "
            "the PyTorch reference attention") in " ".join(r.output.split())


def test_no_warning_for_the_default():
    r = CliRunner().invoke(cli, ["bench", *SMALL], catch_exceptions=False)
    assert r.exit_code == 0 and "--decode-attention" not in r.output


#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
