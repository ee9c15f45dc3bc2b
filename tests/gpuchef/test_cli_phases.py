"""Phased workloads (`--dataset FILE.yaml`, engine_host/vocab/phases.py) through the commands: a bad
file is one line before anything is built, in bench, ab, top and bench --base-url; bench on the
CPU runs the phases and records them in the trace's meta and as marks; ab and bench --base-url
send the same requests as the generator makes."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate

_register()

TINY = ["--device", "cpu", "--model", "tiny"]
PHASES = """
    name: three
    phases:
      - {name: warm, duration_s: 1.0, request_rate: 6, arrival: constant, input_len: 24,
         output_len: 3}
      - {name: spike, duration_s: 1.0, request_rate: 0, input_len: 96, output_len: 2,
         burst: {at_s: 0.2, count: 5}}
      - {name: calm, duration_s: 1.0, request_rate: 3, arrival: constant,
         mix: [{weight: 1, input_len: 16, output_len: 2}, {weight: 1, dataset: azure-conv}]}
    """


def write(tmp_path, text=PHASES, name="w.yaml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def invoke(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.mark.parametrize("command", [["bench", *TINY], ["ab", *TINY], ["top", *TINY],
                                     ["bench", "--base-url", "http://127.0.0.1:9"]])
def test_a_bad_workload_file_is_one_line_in_every_command(tmp_path, command):
    p = write(tmp_path, "phases:\n  - {name: x, duration_s: -1, request_rate: 2}\n")
    r = invoke(*command, "--dataset", p)
    assert r.exit_code == 2, r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.output
    msg = " ".join(r.output.split())
    assert "phase 1 ('x'): duration_s -1 must be > 0 (s)" in msg and "w.yaml" in msg
    assert "Traceback" not in r.output


def test_an_unknown_workload_name_lists_the_bundled_ones():
    r = invoke("bench", *TINY, "--dataset", "conv_long_brust")
    assert r.exit_code == 2
    assert "conv_long_burst, diurnal, long_mix" in " ".join(r.output.split())


@pytest.mark.slow  # starts the engine process
def test_bench_runs_the_phases_and_records_them(tmp_path):
    p = write(tmp_path)
    trace, out = tmp_path / "t.jsonl", tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["bench", *TINY, "--dataset", p, "--max-input-len", "128",
                                 "--request-rate", "9", "--trace", str(trace),
                                 "--result-json", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    # the random-load flag is named as having no effect; the Load line names the phases
    assert "--request-rate has no effect with --dataset" in " ".join(r.output.split())
    assert "(warm → spike → calm)" in r.output
    specs = generate(WorkloadConfig(dataset=p, max_input_len=128, max_model_len=8192,
                                    vocab_size=1000))
    assert len(specs) == 6 + 5 + 3  # constant 6 req/s × 1 s, the burst, constant 3 × 1 s
    d = json.loads(out.read_text())
    assert d["completed"] == len(specs)
    assert d["total_input_tokens"] == sum(s.prompt_len for s in specs)
    assert d["total_output_tokens"] == sum(s.output_len for s in specs)

    from gpuchef.probes.recorder import read_trace
    tr = read_trace(trace)
    assert tr.complete and not tr.problems
    ph = tr.meta["phases"]
    assert ph["name"] == "three" and ph["file"].endswith("w.yaml")
    assert [(x["name"], x["start_s"], x["end_s"]) for x in ph["phases"]] == \
        [("warm", 0.0, 1.0), ("spike", 1.0, 2.0), ("calm", 2.0, 3.0)]
    assert ph["phases"][1]["bursts"] == [{"at_s": 0.2, "count": 5}]
    assert tr.meta["workload"]["dataset"] == p
    marks = [e for e in tr.events if e.kind == "mark"]
    assert [e.name for e in marks] == ["phase:warm", "phase:spike", "phase:calm"]
    # each mark no earlier than its phase's start after the load's start (the engine applies
    # it at its next step; no upper bound: a loaded machine may run that step late)
    t0 = next(e.t_ns for e in tr.events if e.kind == "load" and e.name == "start")
    for m, start_s in zip(marks, (0.0, 1.0, 2.0)):
        assert m.t_ns - t0 >= start_s * 1e9 - 1e6, (m.name, m.t_ns - t0)


@pytest.mark.slow  # starts the engine process
def test_ab_runs_both_settings_on_the_phased_load(tmp_path):
    p = write(tmp_path)
    trace = tmp_path / "ab.jsonl"
    r = CliRunner().invoke(cli, ["ab", *TINY, "--dataset", p, "--max-input-len", "128",
                                 "--trace-speed", "4", "--b", "mode=chunked",
                                 "--trace", str(trace)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "(warm → spike → calm)" in r.output
    n = len(generate(WorkloadConfig(dataset=p, vocab_size=1000)))
    assert re.search(rf"^Successful requests:\s+{n}\s+{n}$", r.output, re.M), r.output
    from gpuchef.probes.recorder import read_trace
    tr = read_trace(trace)
    assert [(x["name"], x["start_s"], x["end_s"]) for x in tr.meta["phases"]["phases"]] == \
        [("warm", 0.0, 0.25), ("spike", 0.25, 0.5), ("calm", 0.5, 0.75)]  # at 4×


def test_bench_base_url_sends_the_phased_requests(tmp_path):
    from test_http_load import FakeServer

    server = FakeServer(model_info={"max_model_len": 4096, "vocab_size": 4096}).start()
    try:
        p = write(tmp_path)
        out = tmp_path / "r.json"
        r = CliRunner().invoke(cli, ["bench", "--base-url", server.url, "--dataset", p,
                                     "--trace-speed", "4", "--result-json", str(out)],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert "(warm → spike → calm)" in r.output
    finally:
        server.stop()
    specs = generate(WorkloadConfig(dataset=p, trace_speed=4.0, max_model_len=4096,
                                    vocab_size=4096))
    got = {rid: (len(b["prompt"]), b["max_tokens"]) for rid, b in server.bodies.items()}
    assert got == {s.request_id: (s.prompt_len, s.output_len) for s in specs}
    assert json.loads(out.read_text())["completed"] == len(specs)
