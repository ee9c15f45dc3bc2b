"""gpuchef report, issue 15 §5: the step close-up counts the steps that overlap its stretch; a
`top` trace and its .part2 line up in the run table and part2 names the rate in force when it
began; traces of very different lengths are not squashed onto one time scale; CDF tick labels
and event labels do not overlap; -o refuses any existing gpuchef trace."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from click.testing import CliRunner

from gpuchef.cli import _register, cli
from gpuchef.engine_host.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes.recorder import TraceRecorder, read_trace

_register()

H200 = Path(__file__).parent / "data" / "h200_chunked_1s.jsonl"
S = 1_000_000_000


def step(i, t0_s, dur_s, prefill=0, decode=0):
    t = 10**12 + int(t0_s * S)
    return StepRecord(i, t, t + int(dur_s * S), dur_s * 1e3, "continuous", 2048, 256, 0, 1,
                      1 if prefill else 0, prefill, decode, 0, 1, 0, 0, 10, 100)


def test_closeup_counts_a_step_that_began_before_the_stretch():
    """A 4.4 s continuous prefill step from 0 s to 4.4 s, the stretch [1 s, 3 s): it fills
    the stretch (it was drawn as idle, "1 steps; model compute 13 %")."""
    from gpuchef.report.plots import closeup_stats, closeup_steps

    steps = [step(0, 0.0, 4.4, prefill=8000), step(1, 4.4, 0.02, decode=30),
             step(2, 3.5, 0.0)]
    a, b = 10**12 + 1 * S, 10**12 + 3 * S
    assert [s.step for s in closeup_steps(steps, a, b)] == [0]
    n, share = closeup_stats(steps, a, b)
    assert n == 1 and share == pytest.approx(1.0)
    # a step ending inside: only its part inside counts (0.5 s of a 2 s stretch)
    n, share = closeup_stats([step(0, 0.5, 1.0, prefill=100)], a, b)
    assert n == 1 and share == pytest.approx(0.25)


def _write(path, meta, events=(), steps=None, requests=None):
    src = read_trace(H200)
    rec = TraceRecorder(path, meta=meta)
    for r in (*(src.steps if steps is None else steps),
              *(src.requests if requests is None else requests), *events):
        rec.record(r)
    rec.close()
    return path


def _parts(tmp_path):
    """A top trace whose rate was changed to 0.26× and its .part2 (same session)."""
    src = read_trace(H200)
    t_end = max(s.t_end_ns for s in src.steps)
    wl = {"dataset": "azure-conv", "trace_speed": 0.5, "seed": 0}
    p1 = _write(tmp_path / "top.jsonl", {"command": "top", "workload": wl, "session_id": "s1",
                                         "ab": {"interleave": True}},
                events=[EngineEvent("mark", 1, t_end - 2 * S, "rate→0.3×"),
                        EngineEvent("mark", 2, t_end - S, "rate→0.26×"),
                        EngineEvent("mark", 3, t_end - S // 2, "ab:1:A:1"),
                        EngineEvent("mark", 4, t_end - S // 4, "ab:1:end")])
    p2 = _write(tmp_path / "top.part2.jsonl",
                {"command": "top", "workload": wl, "session_id": "s1", "part": 2,
                 "previous_part": str(p1)})
    return p1, p2


def test_part2_run_table_lines_up_and_names_the_rate_it_began_at(tmp_path):
    from gpuchef.report.html import _run_rows, run_table
    from gpuchef.report.data import build

    p1, p2 = _parts(tmp_path)
    data = build([p1, p2])
    v1, v2 = data.views
    head, rows = run_table(data.views)
    assert head == ["", "top", "top.part2"]
    by = {r[0]: r[1:] for r in rows}
    # every fact in its own trace's column (part2 has no A/B row: the rows below it shifted up)
    for col, v in enumerate((v1, v2)):
        for label, value in _run_rows(v, data.views):
            assert by[label][col] == value, label
    assert by["A/B settings"][1] == "" and by["Part"][0] == ""
    assert "part 2 began at 0.26× (the last rate change before it, in top.jsonl)" in by["Load"][1]
    assert by["Load"][1].startswith("azure-conv replayed at 0.5×")
    # part2 alone: the earlier part is read from beside it
    (only,) = build([p2]).views
    assert "part 2 began at 0.26×" in dict(_run_rows(only))["Load"]
    p1.unlink()
    (only,) = build([p2]).views
    assert "earlier part: top.jsonl (not found)" in dict(_run_rows(only))["Load"]


def test_traces_of_very_different_lengths_get_their_own_time_axis():
    from gpuchef.report.html import SHARE_SPAN_MIN, shared_span

    def view(span_s):
        return NS(end_ns=int(span_s * S), t=lambda t_ns: t_ns / S)

    assert shared_span([view(11), view(300)]) is None  # 11 s drawn flat to 300 s before
    assert shared_span([view(200), view(300)]) == pytest.approx(300)
    assert shared_span([view(300 * SHARE_SPAN_MIN), view(300)]) == pytest.approx(300)
    assert shared_span([view(300)]) is None


def _overlaps(texts, renderer):
    boxes = [t.get_window_extent(renderer) for t in texts]
    return [(texts[i].get_text(), texts[j].get_text())
            for i, j in itertools.combinations(range(len(boxes)), 2)
            if boxes[i].overlaps(boxes[j])]


def _draw(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_cdf_tick_labels_do_not_overlap():
    """ITLs from 2 µs to 0.5 s (a chunk's near-simultaneous tokens beside a prefill stall):
    the ITL axis spans 5+ decades, where 1-2-5 labels crowd into each other."""
    from gpuchef.report.plots import latency_figure

    t, toks = 10**12, []
    for gap_ns in (2_000, 20_000, 300_000, 5_000_000, 80_000_000, 500_000_000) * 20:
        t += gap_ns
        toks.append(t)
    reqs = [RequestRecord(f"r{i}", 10**12 - i * 10**7, 10, len(toks), tuple(toks), "length")
            for i in range(3)]
    groups = [NS(requests=reqs, color="#4C72B0", label="A"),
              NS(requests=reqs[:1], color="#DD8452", label="B")]
    fig = latency_figure(groups)
    r = _draw(fig)
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        labels = [lab for lab, loc in zip(ax.get_xticklabels(), ax.get_xticks())
                  if lab.get_text() and lo <= loc <= hi]
        assert len(labels) >= 2, ax.get_title()
        assert not _overlaps(labels, r), (ax.get_title(), [x.get_text() for x in labels])


def test_event_labels_above_the_waveforms_do_not_overlap(tmp_path):
    """Twelve rate changes 0.1 s apart in a 1 s trace: stacked in rows or elided, none drawn
    over another."""
    from gpuchef.report.data import build
    from gpuchef.report.plots import waveforms_figure

    src = read_trace(H200)
    t0 = min(s.t_start_ns for s in src.steps)
    ev = [EngineEvent("mark", i, t0 + i * S // 12, f"rate→{0.1 * (i + 1):.2f}×")
          for i in range(12)]
    p = _write(tmp_path / "rates.jsonl", {"command": "top"}, events=ev)
    (view,) = build([p]).views
    fig, _ = waveforms_figure(view)
    r = _draw(fig)
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().startswith(("rate", "+"))]
    assert len(labels) >= 4
    assert not _overlaps(labels + [ax.title], r), [t.get_text() for t in labels]


def test_report_o_refuses_any_existing_trace(tmp_path):
    other = tmp_path / "other_trace.jsonl"
    other.write_bytes(H200.read_bytes())
    before = other.read_bytes()
    r = CliRunner().invoke(cli, ["report", str(H200), "-o", str(other)])
    assert r.exit_code == 2, r.output
    assert "would overwrite the trace" in r.output and "other_trace.jsonl" in r.output
    assert other.read_bytes() == before
    # a file that is not a trace is an ordinary output
    old = tmp_path / "old.html"
    old.write_text("<html>old</html>")
    from gpuchef.report_cmd import is_trace_file
    assert is_trace_file(str(other)) and not is_trace_file(str(old))
    assert not is_trace_file(str(tmp_path / "missing.jsonl"))


def test_capacity_trace_is_cut_into_its_probes_and_grouped_by_setting(tmp_path):
    """A trace with capacity marks (A at 1 and 4 req/s, A stopped early, B at 1): segments are
    the probes (a stop mark does not cut), groups A and B hold the requests that arrived in
    their probes, and capacity_probes judges the same probes."""
    from gpuchef.report.data import build, capacity_probes

    src = read_trace(H200)
    arr = sorted(r.arrival_ns for r in src.requests)
    t0, t1, t2 = arr[0], arr[len(arr) // 3], arr[2 * len(arr) // 3]
    meta = {"command": "ab", "workload": {"dataset": "random", "request_rate": 1.0},
            "ab": {"capacity": True, "slo_spec": "itl_p99:500ms",
                   "settings": {"A": {"describe": "mode=chunked, max_num_batched_tokens=2048"},
                                "B": {"describe": "mode=chunked, max_num_batched_tokens=256"}}}}
    p = _write(tmp_path / "cap.jsonl", meta, events=[
        EngineEvent("mark", 0, t0, "capacity:A:1"), EngineEvent("mark", 1, t1, "capacity:A:4"),
        EngineEvent("mark", 2, (t1 + t2) // 2, "capacity:A:stopped:itl_p99 broken"),
        EngineEvent("mark", 3, t2, "capacity:B:1")])
    data = build([p])
    v = data.views[0]
    assert v.capacity and not v.ab
    assert [(s.label, s.name, s.probe_rate) for s in v.segments] == \
        [("A", "A@1", 1.0), ("A", "A@4", 4.0), ("B", "B@1", 1.0)]
    assert [g.short for g in data.groups] == ["A", "B"]
    assert data.groups[0].label == "A: mode=chunked, max_num_batched_tokens=2048"
    n_a = sum(1 for a in arr if a < t2)
    assert [len(g.requests) for g in data.groups] == [n_a, len(arr) - n_a]
    probes, slos = capacity_probes(v)
    assert [s.key for s in slos] == ["itl_p99"]
    assert [(x.label, x.target) for x in probes] == [("A", 1.0), ("A", 4.0), ("B", 1.0)]
    assert [bool(x.stopped_early) for x in probes] == [False, True, False]


def test_requests_withdrawn_by_an_early_stop_stay_in_their_probe(tmp_path):
    """A probe stopped early withdraws its requests not yet arrived; their planned arrivals lie
    in the next probe's time. The report must place them in the probe that withdrew them
    (where `gpuchef ab` judged them): on the H200 (2026-12-02) the next probe got 962 of them
    and the report called it saturated where the command had not."""
    from dataclasses import replace

    from gpuchef.report.data import build, capacity_probes

    src = read_trace(H200)
    reqs = sorted(src.requests, key=lambda r: r.arrival_ns)
    arr = [r.arrival_ns for r in reqs]
    t0, t1 = arr[0], arr[len(arr) // 2]
    stop = (t0 + t1) // 2
    # A's probe [t0, t1) stopped at `stop`: 7 requests planned after t1 were withdrawn then
    withdrawn = [replace(reqs[0], request_id=f"w-{i}", arrival_ns=t1 + (i + 1) * 1000,
                         token_times_ns=(), output_len=0, first_scheduled_ns=0,
                         finish_reason="early stop", ended_ns=stop + i) for i in range(7)]
    assert all(w.arrival_ns >= t1 > w.ended_ns and w.withdrawn for w in withdrawn)
    meta = {"command": "ab", "workload": {"dataset": "random", "request_rate": 1.0},
            "ab": {"capacity": True, "slo_spec": "itl_p99:500ms"}}
    p = _write(tmp_path / "cap.jsonl", meta, requests=[*reqs, *withdrawn], events=[
        EngineEvent("mark", 0, t0, "capacity:A:1"),
        EngineEvent("mark", 1, stop, "capacity:A:stopped:itl_p99 broken"),
        EngineEvent("mark", 2, t1, "capacity:B:1")])
    v = build([p]).views[0]
    a_seg, b_seg = v.segments
    assert {r.request_id for r in withdrawn} <= {r.request_id for r in a_seg.requests}
    assert not any(r.withdrawn for r in b_seg.requests)
    assert len(b_seg.requests) == sum(1 for x in arr if x >= t1)
    # B is judged on its own requests alone: every one of them finished
    probes, _ = capacity_probes(v)
    assert probes[1].label == "B" and probes[1].metrics.completed == len(b_seg.requests)
    assert not probes[1].metrics.failed
    # the round trip keeps the field; a withdrawn request is not a slice in the Perfetto trace
    back = read_trace(p)
    assert sorted(r.ended_ns for r in back.requests if r.withdrawn) == \
        sorted(w.ended_ns for w in withdrawn)
    from gpuchef.report.perfetto import trace_events
    names = {e.get("name") for e in trace_events(v, 0)}
    assert "w-0" not in names and reqs[0].request_id in names

    # a trace written before ended_ns: the withdrawn records follow, in the file, the
    # records that closed before the stop — placed by that, they stay in A's probe too
    done = replace(reqs[0], request_id="done", arrival_ns=t0 + 1000,
                   token_times_ns=(t0 + 2000, stop - 1000), output_len=2)  # closed before
    before = [done, *(r for r in reqs if r.closed_ns < stop)]
    after = [r for r in reqs if r.closed_ns >= stop]
    legacy = [replace(w, ended_ns=0) for w in withdrawn]
    p2 = _write(tmp_path / "cap_old.jsonl", meta, requests=[*before, *legacy, *after],
                events=[EngineEvent("mark", 0, t0, "capacity:A:1"),
                        EngineEvent("mark", 1, stop, "capacity:A:stopped:itl_p99 broken"),
                        EngineEvent("mark", 2, t1, "capacity:B:1")])
    a2, b2 = build([p2]).views[0].segments
    assert {r.request_id for r in legacy} <= {r.request_id for r in a2.requests}
    assert len(b2.requests) == len(b_seg.requests)


def test_results_table_b_minus_a_is_of_the_figures_not_of_their_rounded_cells(tmp_path):
    """The report's B − A and % come from the measured values (a tester found the last digit
    off in 7 of 15 rows: they were the difference of the 2-decimal cells); the cells are the
    results block's own, and the text block prints the same rows."""
    from gpuchef.probes.metrics import format_results_block, format_value, results_block_rows
    from gpuchef.report.data import build
    from gpuchef.report.html import results_rows

    src = read_trace(H200)
    arr = sorted(r.arrival_ns for r in src.requests)
    t_end = max(r.closed_ns for r in src.requests) + 1
    p = _write(tmp_path / "ab.jsonl", {"command": "ab"}, events=[
        EngineEvent("mark", 0, arr[0], "ab:1:A:1"), EngineEvent("mark", 1, arr[2], "ab:1:B:1"),
        EngineEvent("mark", 2, t_end, "ab:1:end")])
    groups = build([p]).groups
    assert len(groups) == 2
    ma, mb = groups[0].metrics, groups[1].metrics
    rows = {r[0]: r for r in results_rows(groups, delta=True) if isinstance(r, list)}
    a99 = dict(ma.percentiles_tpot_ms)[99.0]
    b99 = dict(mb.percentiles_tpot_ms)[99.0]
    r = rows["P99 TPOT (ms)"]
    assert r[1:3] == [format_value(a99).strip(), format_value(b99).strip()]
    assert r[3] == f"{b99 - a99:+.2f}" and r[4] == f"{(b99 - a99) / a99 * 100:+.1f} %"
    assert rows["Successful requests"][3] == f"{mb.completed - ma.completed:+d}"
    # the block and the rows: one list
    block = format_results_block(ma).splitlines()
    for _, label, v in results_block_rows(ma):
        assert any(ln.startswith(label) and ln[41:].strip() == format_value(v).strip()
                   for ln in block), label


def test_a_capacity_trace_cut_inside_a_probe_does_not_judge_that_probe_as_whole(tmp_path):
    """The recording stopped inside B's probe (no end record): that probe is shown as cut
    short and not met — judged on part of its requests it read 'meets yes' at an offered rate
    the command never measured (a tester's report); the probes before it stand. A trace that
    does not record its rules says that today's judge it."""
    from gpuchef.experiments.capacity import judging_rules, rules_note
    from gpuchef.report.data import build, capacity_probes

    src = read_trace(H200)
    arr = sorted(r.arrival_ns for r in src.requests)
    meta = {"command": "ab", "ab": {"capacity": True, "slo_spec": "itl_p99:5000ms"}}
    p = _write(tmp_path / "cap.jsonl", meta, events=[
        EngineEvent("mark", 0, arr[0], "capacity:A:1"), EngineEvent("mark", 1, arr[2],
                                                                    "capacity:B:1")])
    whole = capacity_probes(build([p]).views[0])[0]
    assert [x.met for x in whole] == [True, True]
    lines = p.read_text().splitlines(keepends=True)
    assert '"type":"end"' in lines[-1].replace(" ", "")
    p.write_text("".join(lines[:-1]))  # killed before the end record
    v = build([p]).views[0]
    cut = capacity_probes(v)[0]
    assert cut[0].met and not cut[1].met
    assert cut[1].fails[0].startswith("cut short: the trace ends inside this probe")
    assert "does not record the rules" in rules_note(v.meta["ab"].get("rules"))
    assert rules_note(judging_rules()) == ""
    assert "saturation_tolerance 0.1 then" in rules_note({**judging_rules(),
                                                         "saturation_tolerance": 0.1})
