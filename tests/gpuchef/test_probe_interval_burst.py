"""``--probe-interval`` with ``--request-rate inf``: probes arrive every interval up to the
load's last arrival, which a burst puts at 0 s, so none is sent. That was silent (a tester saw
``probe_completed 0`` and no probe section); now one warning line says why, hosted and over
HTTP, and a load that does carry probes gets none."""

from __future__ import annotations

import json

from click.testing import CliRunner
from serve_proc import ServeProc

from gpuchef.commands.cli import _register, cli

_register()

LOAD = ["--num-prompts", "6", "--input-len", "16", "--output-len", "4", "--probe-interval", "0.3"]
WARNING = ("warning: --probe-interval 0.3 sends no probe: probes arrive every 0.3 s up to the "
           "load's last arrival (--request-rate inf sends every request at 0 s); give --duration, "
           "a finite --request-rate or a shorter --probe-interval")


def bench(*args):
    r = CliRunner().invoke(cli, ["bench", *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def test_hosted_bench_burst_with_probe_interval_warns_once(tmp_path):
    hosted = ["--device", "cpu", "--model", "tiny", "--sample-hz", "0"]
    rj = tmp_path / "r.json"
    r = bench(*hosted, *LOAD, "--request-rate", "inf", "--result-json", rj)
    assert r.output.count(WARNING) == 1, r.output
    assert not json.loads(rj.read_text()).get("probe_completed")  # indeed no probe ran
    r = bench(*hosted, *LOAD, "--request-rate", "10", "--result-json", rj)
    assert "--probe-interval" not in r.output, r.output


def test_hosted_ab_burst_with_probe_interval_warns_once():
    r = CliRunner().invoke(cli, ["ab", "--device", "cpu", "--model", "tiny", *LOAD,
                                 "--request-rate", "inf", "--b", "mode=continuous"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.output.count(WARNING) == 1, r.output


def test_http_bench_burst_with_probe_interval_warns_once(tmp_path):
    with ServeProc("--max-model-len", "256") as srv:
        r = bench("--base-url", srv.url, *LOAD, "--request-rate", "inf", "--max-concurrency", "4")
        assert r.output.count(WARNING) == 1, r.output
        r = bench("--base-url", srv.url, *LOAD, "--request-rate", "10")
        assert "--probe-interval" not in r.output, r.output


def test_http_ab_over_two_servers_warns_once():
    with ServeProc("--max-model-len", "256") as a, ServeProc("--max-model-len", "256") as b:
        r = CliRunner().invoke(cli, ["ab", "--a", f"url={a.url}", "--b", f"url={b.url}", *LOAD,
                                     "--request-rate", "inf"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.output.count(WARNING) == 1, r.output


import pytest  # noqa: E402

#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
