"""Async scheduling's default: on for CUDA, off for CPU, unless `--async-scheduling` /
`--no-async-scheduling` says; the header and the trace's meta say which ran.

The CUDA side (the default on, tokens equal to sync) runs on the GPU machine:
tests/engine_host/test_engine_gpu.py -k async."""

from __future__ import annotations

import json

import click
import pytest
import torch
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import EngineConfig, SchedulerConfig
from gpuchef.engine_host.engine import LLMEngine, resolve_async_scheduling
from gpuchef.commands.options import engine_config, engine_options, scheduler_options

_register()

BASE = ["--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len", "8",
        "--output-len", "2"]


def parsed(*args) -> dict:
    """The options `engine_options` + `scheduler_options` parse from ``args``."""
    seen = {}

    @click.command()
    @engine_options
    @scheduler_options
    def cmd(**o):
        seen.update(o)
    r = CliRunner().invoke(cmd, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return seen


@pytest.mark.parametrize("args,flag", [((), None), (("--async-scheduling",), True),
                                       (("--no-async-scheduling",), False)])
def test_flag_parses_to_on_off_or_the_device_default(args, flag):
    o = parsed(*args)
    assert o["async_scheduling"] is flag
    assert engine_config(o).async_scheduling is flag


@pytest.mark.parametrize("flag,device,on", [
    (None, "cuda", True), (None, "cuda:1", True), (None, "cpu", False),
    (False, "cuda", False), (True, "cpu", True), (True, "cuda", True), (False, "cpu", False)])
def test_default_resolves_by_device(flag, device, on):
    assert resolve_async_scheduling(flag, torch.device(device)) is on


def test_a_bad_value_is_refused_with_what_is_allowed():
    with pytest.raises(ConfigError, match=r"async_scheduling='yes' must be True, False or None"):
        EngineConfig(async_scheduling="yes")
    with pytest.raises(ConfigError, match="must be True, False or None"):
        EngineConfig(async_scheduling=1)


@pytest.mark.parametrize("flag,on", [(None, False), (True, True), (False, False)])
def test_cpu_engine_runs_as_resolved_and_says_so(flag, on):
    from gpuchef.sessions.headless import trace_meta

    ecfg = EngineConfig(model="tiny", device="cpu", async_scheduling=flag,
                        scheduler=SchedulerConfig())
    eng = LLMEngine(ecfg)
    assert eng.async_scheduling is on and eng.config.async_scheduling is on
    assert ecfg.async_scheduling is flag  # the caller's config is not changed
    eng.add_request("r", [1, 2, 3])
    eng.step()
    assert eng.has_step_in_flight is on  # async keeps the launched next step in flight
    meta = trace_meta(eng, ecfg, None, "bench")
    assert meta["engine_config"]["async_scheduling"] is on


def test_bench_on_cpu_defaults_to_sync_and_no_flag_turns_it_off(tmp_path):
    out = tmp_path / "r.json"
    for args, want in (((), "sync"), (("--no-async-scheduling",), "sync"),
                       (("--async-scheduling",), "async")):
        r = CliRunner().invoke(cli, ["bench", *BASE, *args, "--result-json", str(out)],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert json.loads(out.read_text())["config"]["scheduling"] == want, args
        line = next(ln for ln in r.output.splitlines() if ln.startswith("Scheduling:"))
        assert line.split()[1] == want, line


def test_header_labels_sync_or_async():
    from gpuchef.tui.session import ABState, LoadState, SessionInfo
    from gpuchef.tui.widgets.header import HeaderState, header_text

    def shown(asy):
        info = SessionInfo("tiny", True, "cuda:0", "flashinfer", async_scheduling=asy)
        st = HeaderState(info, SchedulerConfig(), LoadState("random", "random", 1.0), 0, None,
                         "", ABState())
        return header_text(st).plain.split("\n")[0].split()

    assert "async" in shown(True) and "sync" not in shown(True)
    assert "sync" in shown(False) and "async" not in shown(False)
    assert "sync" not in shown(None) and "async" not in shown(None)  # not known: not shown


def test_replay_header_reads_it_from_the_trace_meta():
    from gpuchef.sessions.replay import _info

    class T:
        problems, complete = [], True

    for ec, want in (({"async_scheduling": True}, True), ({"async_scheduling": False}, False),
                     ({}, None), ({"async_scheduling": "on"}, None), (None, None)):
        T.meta = {"engine_config": ec} if ec is not None else {}
        assert _info(T).async_scheduling is want, ec


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
