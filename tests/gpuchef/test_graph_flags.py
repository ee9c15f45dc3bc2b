"""The CUDA-graph flags (--enforce-eager, --cudagraph-mode, --cudagraph-capture-sizes) where they
cannot change the run: one warning line naming them and why, and the run goes on; their values
still checked with a message naming the value (gpuchef/commands/options.py graph_flags_warning)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.commands.options import engine_config, engine_options, scheduler_options

_register()


def _invoke(args: list[str]) -> tuple[list[str], object]:
    """Run engine_config(o) under a click command with the shared options; returns the
    warnings it gave and the EngineConfig (or the ConfigError's message)."""
    warned: list[str] = []
    got: dict = {}

    @click.command()
    @engine_options
    @scheduler_options
    def cmd(**o):
        try:
            got["cfg"] = engine_config(o, warn=warned.append)
        except ConfigError as e:
            got["cfg"] = str(e)

    r = CliRunner().invoke(cmd, args)
    assert r.exit_code == 0, r.output
    return warned, got["cfg"]


@pytest.mark.parametrize("args, flags", [
    (["--cudagraph-mode", "FULL_DECODE_ONLY"], "--cudagraph-mode has"),
    (["--cudagraph-capture-sizes", "16,32"], "--cudagraph-capture-sizes has"),
    (["--enforce-eager"], "--enforce-eager has"),
    # the default value typed out is still a flag given that does nothing here
    (["--cudagraph-mode", "FULL_AND_PIECEWISE", "--enforce-eager"],
     "--enforce-eager, --cudagraph-mode have"),
])
def test_graph_flags_on_cpu_warn_once(args, flags):
    warned, cfg = _invoke(["--device", "cpu", *args])
    assert warned == [f"{flags} no effect on cpu: CUDA graphs are CUDA only (every step runs "
                      "eagerly)"]
    assert not isinstance(cfg, str)  # the config is built: the session goes on


def test_no_warning_without_graph_flags():
    assert _invoke(["--device", "cpu"])[0] == []
    assert _invoke(["--device", "cpu", "--max-num-seqs", "8"])[0] == []


def test_reference_attention_on_cuda_warns(monkeypatch):
    """On CUDA the native engine's graphs need FlashInfer: with the reference backend the
    flags do nothing either (device resolution stubbed: no GPU here)."""
    import torch

    import gpuchef.engine_host.engine as eng
    monkeypatch.setattr(eng, "resolve_device", lambda name: torch.device("cuda"))
    warned, _ = _invoke(["--device", "cuda", "--attention-backend", "reference",
                         "--cudagraph-mode", "FULL_DECODE_ONLY"])
    assert warned == ["--cudagraph-mode has no effect with --attention-backend reference: the "
                      "native engine's CUDA graphs need FlashInfer attention (every step runs "
                      "eagerly)"]
    warned, _ = _invoke(["--device", "cuda", "--enforce-eager",
                         "--cudagraph-capture-sizes", "16"])
    assert warned == ["--cudagraph-capture-sizes has no effect with --enforce-eager: no CUDA "
                      "graphs are captured"]
    assert _invoke(["--device", "cuda", "--enforce-eager"])[0] == []  # it does something there
    assert _invoke(["--device", "cuda", "--cudagraph-mode", "FULL_DECODE_ONLY"])[0] == []


def test_outside_a_click_command_a_non_default_value_counts_as_given():
    o = {"model": "tiny", "device": "cpu", "dtype": "auto", "seed": 0, "max_model_len": None,
         "attention_backend": "auto", "enforce_eager": False, "block_size": 16,
         "num_gpu_blocks": None, "kv_cache_memory_gb": None, "gpu_memory_utilization": 0.9,
         "mode": "chunked", "cudagraph_mode": "FULL_DECODE_ONLY"}
    warned: list[str] = []
    engine_config(o, warn=warned.append)
    assert warned == ["--cudagraph-mode has no effect on cpu: CUDA graphs are CUDA only "
                      "(every step runs eagerly)"]


@pytest.mark.parametrize("sizes, msg", [
    ("-16,32", "--cudagraph-capture-sizes -16,32 must be a non-empty list of token counts "
               "in [1, 16384]"),
    ("0", "--cudagraph-capture-sizes 0 must be a non-empty list of token counts in "
          "[1, 16384]"),
    ("16,,32", "--cudagraph-capture-sizes '16,,32' must be comma-separated token counts, "
               "e.g. 16,32,64,128,256,512"),
    ("16,99999", "--cudagraph-capture-sizes 16,99999 must be a non-empty list of token "
                 "counts in [1, 16384]"),
])
def test_bad_capture_sizes_are_refused_on_cpu_too(sizes, msg):
    """The values are checked before the device matters: a bad list is an error on any
    machine (the warning is for good flags that do nothing here)."""
    warned, err = _invoke(["--device", "cpu", "--cudagraph-capture-sizes", sizes])
    assert err == msg and warned == []


def test_unsorted_and_duplicate_sizes_are_normalised():
    _, cfg = _invoke(["--device", "cpu", "--cudagraph-capture-sizes", "64,16,64,32"])
    assert cfg.cudagraph_capture_sizes == (16, 32, 64)


def test_bench_on_cpu_with_graph_flags_warns_and_runs():
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--num-prompts",
                                 "2", "--input-len", "16", "--output-len", "2",
                                 "--cudagraph-mode", "FULL_DECODE_ONLY", "--enforce-eager"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert lines == ["warning: --enforce-eager, --cudagraph-mode have no effect on cpu: CUDA "
                     "graphs are CUDA only (every step runs eagerly)"]
    assert "Successful requests:                     2" in r.stdout


def test_serve_on_cpu_with_graph_flags_warns_and_serves():
    import json
    import urllib.request

    from serve_proc import ServeProc

    with ServeProc("--cudagraph-capture-sizes", "16,32") as s:
        with urllib.request.urlopen(s.url + "/v1/models", timeout=30) as r:
            assert json.loads(r.read())["data"]
        assert [ln.strip() for ln in s.lines if ln.startswith("warning:")] == [
            "warning: --cudagraph-capture-sizes has no effect on cpu: CUDA graphs are CUDA only "
            "(every step runs eagerly)"]


def test_top_on_cpu_says_the_graph_flags_warning_in_its_header_too(capsys):
    """A tester: under the dashboard the stderr line is hidden until quitting; the header's
    note carries it (the flags and why, without the detail after the colon)."""
    import io

    from rich.console import Console

    from gpuchef.commands.top import _build, top

    ctx = top.make_context("top", ["--device", "cpu", "--model", "tiny", "--enforce-eager",
                                   "--cudagraph-mode", "FULL_DECODE_ONLY", "--num-prompts", "4"])
    app = _build(ctx, dict(ctx.params), Console(file=io.StringIO()))
    try:
        err = capsys.readouterr().err
        assert err.count("warning: --enforce-eager, --cudagraph-mode have no effect on cpu") == 1
        assert "--enforce-eager, --cudagraph-mode have no effect on cpu" in app.session.info.note
    finally:
        app.session.close()


def test_vllm_none_mode_points_at_enforce_eager():
    """vLLM users type --cudagraph-mode NONE; the refusal says what the native engine calls it."""
    from click.testing import CliRunner

    from gpuchef.commands.cli import _register, cli

    _register()
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--cudagraph-mode", "NONE"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    out = " ".join(r.output.split())
    assert "'NONE' is not one of 'FULL_AND_PIECEWISE', 'FULL_DECODE_ONLY'" in out
    assert "is --enforce-eager here" in out
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--cudagraph-mode", "bogus"])
    assert r.exit_code == 2 and "--enforce-eager" not in r.output


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
