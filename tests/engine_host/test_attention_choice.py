"""Choosing the attention backend: bad choices are one clear ConfigError (exit 2 in the CLI)."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.engine_host.attention_choice import make_backend
from gpuchef.engine_host.vocab.errors import ConfigError

_register()  # the subcommands are registered lazily by the entry point


def test_reference_and_auto_on_cpu():
    assert make_backend("reference", "cpu").name == "reference"
    assert make_backend("auto", "cpu").name == "reference"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_flashinfer_on_cpu_is_a_config_error():
    with pytest.raises(ConfigError, match="flashinfer needs a CUDA device; this run is on cpu"):
        make_backend("flashinfer", "cpu")


def test_unknown_backend_names_the_choices():
    with pytest.raises(ConfigError, match="'sdpa' is not one of auto, reference, flashinfer"):
        make_backend("sdpa", "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
@pytest.mark.parametrize("cmd", ["bench", "ab"])
def test_cli_flashinfer_on_cpu_exits_2_with_one_line(cmd):
    r = CliRunner().invoke(cli, [cmd, "--device", "cpu", "--model", "tiny",
                                 "--attention-backend", "flashinfer", "--num-prompts", "2"])
    assert r.exit_code == 2, r.output
    assert "error: --attention-backend flashinfer needs a CUDA device" in r.output
    assert "Traceback" not in r.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_engine_refuses_flashinfer_on_cpu_before_loading_weights(monkeypatch):
    """The refusal comes before the weights load (minutes for a real model), not after."""
    from gpuchef.engine_host import engine as engine_mod
    from gpuchef.engine_host.vocab.config import EngineConfig

    def no_load(*a, **kw):
        raise AssertionError("weights were loaded before the backend was checked")

    monkeypatch.setattr(engine_mod, "load_model", no_load)
    with pytest.raises(ConfigError, match="flashinfer needs a CUDA device"):
        engine_mod.LLMEngine(EngineConfig(model="tiny", device="cpu",
                                          attention_backend="flashinfer"))


def test_flashinfer_not_installed_is_refused_before_loading(monkeypatch):
    """On a CUDA machine without flashinfer, the same one line, before the weights load."""
    import importlib.util

    from gpuchef.engine_host import attention_choice

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "flashinfer" else real(n, *a))
    monkeypatch.setattr(torch, "device", lambda d: type("D", (), {"type": "cuda"})())
    with pytest.raises(ConfigError, match="flashinfer is not installed; install the \\[gpu\\]"):
        attention_choice.check_backend("flashinfer", "cuda")
