"""One A/B trace, three surfaces: `gpuchef ab` (its result JSON), `gpuchef report` (the trace)
and the dashboard's live A/B screen (tui.ab_live.ABAnalyser over a timeline filled from the trace)
give the same windows and the same numbers. Before probes/ab.py they disagreed on the same
trace (ab: "spread over 2 windows", 1.05/1.17 req/s; report: "A · 4 windows / B · 3 windows",
1.28/1.40 req/s)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli

_register()

KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "completed",
        "mean_ttft_ms", "median_ttft_ms", "mean_itl_ms", "mean_tpot_ms", "mean_e2el_ms",
        "num_steps", "steps_per_s", "busy_fraction")


def _same(x, y) -> bool:
    if x is None or isinstance(x, (str, list, dict)):
        return x == y
    if isinstance(x, float) and math.isnan(x):
        return isinstance(y, float) and math.isnan(y)
    return x == pytest.approx(y, rel=1e-9, abs=1e-12)


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("agree")
    trace, out = d / "ab.jsonl", d / "ab.json"
    r = CliRunner().invoke(cli, [
        "ab", "--device", "cpu", "--model", "tiny", "--num-prompts", "48", "--input-len", "48",
        "--output-len", "8", "--request-rate", "12", "--range-ratio", "0.5", "--interleave",
        "--window", "0.5", "--b", "mode=chunked,max_num_batched_tokens=32", "--sample-hz", "0",
        "--trace", str(trace), "--result-json", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return trace, json.loads(out.read_text()), r.output


def _live(trace):
    from gpuchef.probes.recorder import read_trace
    from gpuchef.probes.timeline import Timeline
    from gpuchef.tui.ab_live import ABAnalyser
    from gpuchef.tui.session import ABState

    tr = read_trace(trace)
    tl = Timeline(max_steps=len(tr.steps) + 1, max_requests=len(tr.requests) + 1,
                  max_request_tokens=sum(len(r.token_times_ns) for r in tr.requests) + 1,
                  max_events=len(tr.events) + 1,
                  origin_ns=min(r.arrival_ns for r in tr.requests) - 10**9)
    for s in sorted(tr.steps, key=lambda s: s.t_end_ns):
        tl.add_step(s)
    for e in sorted(tr.events, key=lambda e: e.t_ns):
        tl.add_event(e)
    for q in sorted(tr.requests, key=lambda q: q.token_times_ns[-1] if q.token_times_ns
                    else q.arrival_ns):
        tl.add_request(q)
    end = max(max(s.t_end_ns for s in tr.steps), max(e.t_ns for e in tr.events)) + 1
    st = ABState(False, {"A": {}, "B": {}}, 0.5, None, "", 0, 0, 1, 0.0)
    return ABAnalyser({}, (50.0, 99.0)).analyse(tl.snapshot(end), st)


def test_ab_report_and_live_screen_agree_on_one_trace(ab_run):
    from gpuchef.report.data import build

    trace, res, text = ab_run
    counted = [x for x in res["runs"] if x["counted"]]
    n = {k: sum(1 for x in counted if x["label"] == k) for k in "AB"}
    assert n["A"] >= 2 and n["B"] >= 2
    data = build([trace], percentiles=(50.0, 99.0))
    groups = {g.short: g for g in data.groups}
    live = _live(trace)
    assert {k: len(groups[k].segments) for k in "AB"} == n
    assert {k: len(live.settings[k].windows) for k in "AB"} == n
    assert f"({n['A']} windows of A and {n['B']} of B counted" in text
    for k in "AB":
        ref = res["pooled"][k]
        rep = groups[k].metrics.to_dict()
        lv = live.settings[k].pooled.to_dict()
        assert all(ref[key] is not None for key in KEYS)
        assert set(ref) == set(rep) == set(lv)
        for key in ref:  # every figure of the results block: throughputs, P50/P99s, steps
            assert _same(ref[key], rep[key]), (k, key, ref[key], rep[key])
            assert _same(ref[key], lv[key]), (k, key, ref[key], lv[key])
    # the B − A rows (pooled and per window) and verdicts: ab's JSON and the live screen's
    rows_ab = {r["key"]: r for r in res["deltas"]}
    for row in live.rows:
        ref = rows_ab[row.key]
        assert _same(ref["delta"] if ref["delta"] is not None else math.nan, row.delta), row.key
        assert [(-1 if v is None else v) for v in ref["deltas"]] == pytest.approx(
            [(-1 if math.isnan(v) else v) for v in row.deltas]), row.key
        assert ref["verdict"] == row.verdict
    # the report's per-window table is built from the same windows
    v = data.views[0]
    assert sorted(s.name for s in v.segments if s.counted) == \
        sorted(f"{x['label']}{x['rep']}" for x in counted)


def test_sequential_ab_trace_has_unique_ids_and_the_report_agrees(tmp_path):
    """A hosted sequential A/B sends one load to A and to B per repetition: their records were
    both ``req-0#1``. Now ``A/req-0#1`` and ``B/req-0#1`` (the mirrored A/B's naming), unique in
    the trace; ``load_id`` still pairs the two copies, and the report's pooled figures are
    ab's own (counted from the trace, not echoed)."""
    from gpuchef.probes.ab import load_id, side_of
    from gpuchef.probes.recorder import read_trace
    from gpuchef.report.data import build

    trace, out = tmp_path / "ab.jsonl", tmp_path / "ab.json"
    r = CliRunner().invoke(cli, [
        "ab", "--device", "cpu", "--model", "tiny", "--num-prompts", "6", "--input-len", "16",
        "--output-len", "4", "--repetitions", "2", "--b", "mode=chunked,max_num_batched_tokens=32",
        "--sample-hz", "0", "--trace", str(trace), "--result-json", str(out)],
        catch_exceptions=False)
    assert r.exit_code == 0, r.output
    res = json.loads(out.read_text())
    ids = [q.request_id for q in read_trace(str(trace)).requests]
    assert len(ids) == 2 * 2 * 6 and len(set(ids)) == len(ids), ids
    assert {side_of(i) for i in ids} == {"A", "B"}
    for rep in (1, 2):  # both sides of a repetition hold the same load
        loads = {k: {load_id(i) for i in ids if side_of(i) == k and i.endswith(f"#{rep}")}
                 for k in "AB"}
        assert loads["A"] == loads["B"] == {f"req-{n}" for n in range(6)}
    groups = {g.short: g for g in build([trace], percentiles=(50.0, 99.0)).groups}
    for k in "AB":
        ref, rep = res["pooled"][k], groups[k].metrics.to_dict()
        assert ref["completed"] == 12
        for key in ref:
            assert _same(ref[key], rep[key]), (k, key, ref[key], rep[key])


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
