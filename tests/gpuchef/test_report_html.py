"""gpuchef.report.html: a `top` trace and its .part2 line up in the run table and part2 names
the rate in force when it began; traces of very different lengths are not squashed onto one
time scale; the results table's B − A is of the figures, not of their rounded cells."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from gpuchef.engine_host.vocab.records import EngineEvent
from gpuchef.probes.recorder import read_trace
from test_report_data import H200, write_trace

S = 1_000_000_000


def _parts(tmp_path):
    """A top trace whose rate was changed to 0.26× and its .part2 (same session)."""
    src = read_trace(H200)
    t_end = max(s.t_end_ns for s in src.steps)
    wl = {"dataset": "azure-conv", "trace_speed": 0.5, "seed": 0}
    p1 = write_trace(tmp_path / "top.jsonl", {"command": "top", "workload": wl, "session_id": "s1",
                                         "ab": {"interleave": True}},
                events=[EngineEvent("mark", 1, t_end - 2 * S, "rate→0.3×"),
                        EngineEvent("mark", 2, t_end - S, "rate→0.26×"),
                        EngineEvent("mark", 3, t_end - S // 2, "ab:1:A:1"),
                        EngineEvent("mark", 4, t_end - S // 4, "ab:1:end")])
    p2 = write_trace(tmp_path / "top.part2.jsonl",
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
    p = write_trace(tmp_path / "ab.jsonl", {"command": "ab"}, events=[
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
