"""The report's autopilot figure from real `bench` traces (tiny, CPU): with the autopilot on, the
series drawn are the StepRecords' (allowance, predicted vs actual step time, fit error), checked
against the records read back from the trace by a plain loop; without it, no figure and the
page says why."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.probes.recorder import read_trace

_register()
TARGETS = "itl_p99:500ms,ttft_p99:5000ms"


def run(*args):
    r = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("ap")
    on, off = d / "auto.jsonl", d / "static.jsonl"
    # more prompts than the budget serves at once: the queue waits, the model gets its 24+ steps
    run("bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "24", "--input-len", "96",
        "--output-len", "24", "--request-rate", "inf", "--mode", "chunked",
        "--max-num-batched-tokens", "128", "--auto-budget", TARGETS, "--trace", on)
    run("bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "3", "--input-len", "16",
        "--output-len", "2", "--mode", "chunked", "--trace", off)
    return {"on": on, "off": off}


def _view(path):
    from gpuchef.report import build

    (v,) = build([path]).views
    return v


def _bins(view, steps, bin_s, nb):
    """Per bin (by step start), worked out here: the mean allowance, the mean actual and
    predicted step time of the steps with a prediction, the mean fit error (%)."""
    acc = [dict(allow=[], wall=[], pred=[], err=[]) for _ in range(nb)]
    for s in steps:
        if not s.auto_budget or s.prefill_allowance < 0:
            continue
        k = min(max(int((s.t_start_ns - view.origin_ns) / 1e9 / bin_s), 0), nb - 1)
        acc[k]["allow"].append(s.prefill_allowance)
        if s.predicted_ms >= 0:
            acc[k]["wall"].append((s.t_end_ns - s.t_start_ns) / 1e6)
            acc[k]["pred"].append(s.predicted_ms)
        if s.fit_error >= 0:
            acc[k]["err"].append(s.fit_error * 100)

    def mean(xs):
        return sum(xs) / len(xs) if xs else math.nan

    return {k: [mean(a[k]) for a in acc] for k in ("allow", "wall", "pred", "err")}


def _same(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    np.testing.assert_allclose(a[ok], b[ok], rtol=1e-9)


def test_series_and_figure_are_the_records(traces):
    from gpuchef.report import plots

    steps = read_trace(traces["on"]).steps
    ap = [s for s in steps if s.auto_budget]
    assert ap and all(s.auto_budget == TARGETS for s in ap)
    assert sum(s.predicted_ms >= 0 for s in ap) > 10  # the model predicted
    assert sum(s.num_waiting > 0 for s in ap) > len(ap) / 3  # a queue, not an idle engine
    v = _view(traces["on"])
    assert plots.autopilot_absent(v) is None
    d = plots.autopilot_series(v)
    want = _bins(v, steps, d["bin_s"], len(d["t_s"]))
    _same(d["allowance"], want["allow"])
    _same(d["wall_ms"], want["wall"])
    _same(d["predicted_ms"], want["pred"])
    _same(d["fit_error_pct"], want["err"])
    assert d["steps"] == len([s for s in ap if s.prefill_allowance >= 0])
    assert sum(d["states"].values()) == d["steps"]
    assert d["last"].step == max(s.step for s in ap if s.prefill_allowance >= 0)
    # the figure draws those series: its lines' data, not its pixels
    fig = plots.autopilot_figure(v)
    lines = {ln.get_label(): ln.get_ydata() for a in fig.axes for ln in a.get_lines()}
    _same(lines["prefill allowance (autopilot, mean)"], want["allow"])
    _same(lines["actual step time (wall_ms)"], want["wall"])
    _same(lines["predicted (predicted_ms)"], want["pred"])
    _same(lines["fit error (the model's tracked mean relative error)"], want["err"])
    # and the waveforms' tokens-per-step panel carries the same allowance
    wf, _ = plots.waveforms_figure(v)
    tok = {ln.get_label(): ln.get_ydata() for a in wf.axes for ln in a.get_lines()}
    _same(tok["prefill allowance (autopilot, mean)"], want["allow"])


def test_html_has_the_autopilot_figure_only_where_it_ran(traces, tmp_path):
    out = tmp_path / "r.html"
    run("report", traces["on"], traces["off"], "-o", out)
    text = out.read_text(encoding="utf-8")
    assert '<section id="autopilot">' in text
    assert 'id="fig-autopilot-auto"' in text
    assert 'id="fig-autopilot-static"' not in text
    last = [s for s in read_trace(traces["on"]).steps if s.prefill_allowance >= 0][-1]
    assert f"fit error at the end {last.fit_error * 100:.0f} %" in text
    assert "No autopilot figure: the autopilot was off throughout" in text


def test_a_trace_without_autopilot_steps_has_none_and_says_why(traces):
    from gpuchef.report import plots

    v = _view(traces["off"])
    assert "off throughout" in plots.autopilot_absent(v)
    assert plots.autopilot_series(v) is None and plots.autopilot(v) is None
    wf, _ = plots.waveforms_figure(v)
    assert not any("allowance" in ln.get_label() for a in wf.axes for ln in a.get_lines())


def test_autopilot_on_in_continuous_mode_is_said_idle(tmp_path):
    from gpuchef.report import plots

    t = Path(tmp_path) / "cont.jsonl"
    run("bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "2", "--input-len", "16",
        "--output-len", "2", "--mode", "continuous", "--auto-budget", "itl_p99:50ms",
        "--trace", t)
    assert "no chunked step ran" in plots.autopilot_absent(_view(t))


def test_infeasible_steps_are_shaded_and_named_in_the_legend(tmp_path):
    """The tiny engine on CPU with the autopilot's fit fed a known step time whose decodes alone
    take over the 5 ms ITL target: the trace's steps go learning → infeasible; the figure shades
    the infeasible bins and its legend says what the state means; the page's totals count it."""
    import random

    from gpuchef.engine_host.autopilot import INFEASIBLE, STATE_MEANING
    from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
    from gpuchef.engine_host.engine import LLMEngine
    from gpuchef.engine_host.request import SamplingParams
    from gpuchef.probes.recorder import TraceRecorder
    from gpuchef.report import plots

    eng = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=512,
                                 cache=CacheConfig(num_gpu_blocks=256),
                                 scheduler=SchedulerConfig(mode="chunked",
                                                           max_num_batched_tokens=256,
                                                           max_num_seqs=8,
                                                           auto_budget="itl_p99:5ms")))
    orig = eng.scheduler.observe
    eng.scheduler.observe = lambda out, ms, itl: orig(
        out, 6.0 + 0.5 * bool(out.prefills) + 0.1 * len(out.decodes) + 0.01 * out.num_prefill_tokens)
    rng = random.Random(2)
    for i in range(24):
        eng.add_request(f"q{i}", [rng.randrange(1, 500) for _ in range(rng.randint(60, 200))],
                        SamplingParams(max_tokens=rng.randint(20, 40), ignore_eos=True))
    path = tmp_path / "infeasible.jsonl"
    with TraceRecorder(path) as tr:
        while eng.has_unfinished():
            res = eng.step()
            if res.record is not None:
                tr.record(res.record)
    steps = read_trace(path).steps
    n_inf = sum(s.autopilot_state == INFEASIBLE for s in steps)
    assert n_inf > 10
    v = _view(path)
    d = plots.autopilot_series(v)
    assert d["states"][INFEASIBLE] == n_inf
    # per bin, the last step's state (by start), worked out here
    nb = len(d["t_s"])
    want = [""] * nb
    for s in sorted(steps, key=lambda s: s.t_start_ns):
        k = min(max(int((s.t_start_ns - v.origin_ns) / 1e9 / d["bin_s"]), 0), nb - 1)
        want[k] = s.autopilot_state
    assert d["state"] == want and INFEASIBLE in want
    fig = plots.autopilot_figure(v)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    inf_label = [t for t in labels if t.startswith(f"not steering: {INFEASIBLE}")]
    assert len(inf_label) == 1
    assert " ".join(inf_label[0].split()) == f"not steering: {INFEASIBLE} — {STATE_MEANING[INFEASIBLE]}"
    # the shading covers the infeasible bins: the band's polygons span their middles
    shaded = [c for c in fig.axes[0].collections if c.get_label() == inf_label[0]]
    assert len(shaded) == 1
    xs = np.concatenate([p.vertices[:, 0] for p in shaded[0].get_paths()])
    for t, st in zip(d["t_s"], d["state"]):
        if st == INFEASIBLE:
            assert xs.min() <= t <= xs.max()
    out = tmp_path / "r.html"
    run("report", path, "-o", out)
    assert f"{INFEASIBLE} {n_inf}" in out.read_text(encoding="utf-8")


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
