"""A phased workload on the dashboard's time axis (issue 30 item 2): each phase's start is a
tick on the mode strip and its name on the changes row, in the phase colour. Driven with
Textual's Pilot: over a static session whose timeline holds the phase marks of a workload's
schedule (fake clock), and end to end through `gpuchef top` on the CPU with a phased file."""

from __future__ import annotations

import asyncio
import textwrap
import time

import pytest
from tui_fakes import StaticSession, settle

from gpuchef.engine_host.vocab.phases import load_workload, phase_mark, schedule
from gpuchef.engine_host.vocab.records import EngineEvent
from gpuchef.tui import theme
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.plotdata import event_label
from gpuchef.tui.widgets.waveforms import change_labels, label_cells

S = 1_000_000_000


def _hex(style) -> str:
    c = style.color
    return (c.triplet.hex if c.triplet is not None else c.name).lower()


def axis_rows(axis) -> list[list]:
    return [list(strip) for strip in axis._strips]


def coloured_text(row, colour: str) -> str:
    """The text of a strip's segments drawn in ``colour``."""
    return "".join(seg.text for seg in row if seg.style and seg.style.color
                   and _hex(seg.style) == colour.lower())


def test_a_phase_mark_is_its_own_kind_of_marker():
    assert event_label(EngineEvent("mark", 3, 0, phase_mark("long burst"))) == \
        ("long burst", "phase")
    assert event_label(EngineEvent("mark", 3, 0, "rate→2 req/s")) == ("rate→2 req/s", "mark")


def test_label_cells_finds_where_change_labels_put_a_label():
    line = change_labels([(2, "conversation"), (40, "long burst"), (59, "end")], 60)
    assert label_cells(line, 2, "conversation") == [(2, 15)]
    assert label_cells(line, 40, "long burst") == [(40, 51)]
    assert label_cells(line, 59, "end") == [(56, 60)]  # right-aligned at the edge: "end▲"
    assert label_cells(line, 30, "absent") == []


def test_the_time_axis_names_each_phase_of_a_phased_workload(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(textwrap.dedent("""
        phases:
          - {name: conversation, duration_s: 20, arrival: trace, dataset: azure-conv}
          - {name: long burst, duration_s: 15, request_rate: 2, input_len: 5000}
          - {name: calm, duration_s: 20, request_rate: 1}
        """))
    sched = schedule(load_workload(str(p)))
    s = StaticSession(gpu=False, seconds=70.0)
    t0 = s.now - 57 * S  # the load started 57 s before the fake clock's now (window 60 s)
    for k, ph in enumerate(sched):
        s.timeline.add_event(EngineEvent("mark", 10 * k, t0 + int(ph["start_s"] * S),
                                         phase_mark(ph["name"])))

    async def go():
        app = GpuchefApp(s, window_s=60.0, show_ui_cost=False)
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            axis = app.screen.query_one("#axis")
            marks = [(m.label, m.kind) for m in axis._frame.markers]
            assert [m for m in marks if m[1] == "phase"] == \
                [("conversation", "phase"), ("long burst", "phase"), ("calm", "phase")]
            rows = axis_rows(axis)
            changes = "".join(seg.text for seg in rows[1])
            for name in ("conversation", "long burst", "calm"):
                assert name in changes, changes
            assert "mode→chunked" in changes  # the session's own changes stay
            # the names (with their ▲) and the ticks in the phase colour; the other labels keep
            # the title colour
            phase_text = coloured_text(rows[1], theme.PHASE).replace(" ", "")
            assert phase_text.replace("▲", "") == "conversationlongburstcalm", phase_text
            assert phase_text.count("▲") == 3
            assert coloured_text(rows[0], theme.PHASE) == "┃┃┃"
    asyncio.run(go())


@pytest.mark.slow  # starts the engine process
def test_top_with_a_phased_workload_marks_its_phases_on_the_time_axis(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from gpuchef.commands import top as top_cmd
    from gpuchef.commands.cli import _register, cli

    p = tmp_path / "w.yaml"
    p.write_text(textwrap.dedent("""
        phases:
          - {name: warm, duration_s: 1.5, request_rate: 4, input_len: 16, output_len: 2}
          - {name: spike, duration_s: 1.5, request_rate: 0, input_len: 64, output_len: 2,
             burst: {at_s: 0, count: 6}}
          - {name: calm, duration_s: 30, request_rate: 1, input_len: 16, output_len: 2}
        """))
    seen: dict = {}

    def fake_run(app, *a, **k):  # instead of the terminal: Pilot, until the marks are drawn
        async def go():
            async with app.run_test(size=(160, 48)) as pilot:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    await pilot.pause(0.25)
                    f = getattr(app.screen.query_one("#axis"), "_frame", None)
                    names = [m.label for m in f.markers if m.kind == "phase"] if f else []
                    if len(names) >= 3:
                        break
                await settle(pilot)
                axis = app.screen.query_one("#axis")
                seen["names"] = [m.label for m in axis._frame.markers if m.kind == "phase"]
                seen["changes"] = "".join(seg.text for seg in axis_rows(axis)[1])
                seen["load"] = app.session.load.state().describe()
        asyncio.run(go())

    monkeypatch.setattr(GpuchefApp, "run", fake_run)
    monkeypatch.setattr(top_cmd, "stdout_is_terminal", lambda: True)
    _register()
    # a 10 s window: 1.5 s phases are ~20 columns apart, room for each name
    r = CliRunner().invoke(cli, ["top", "--device", "cpu", "--model", "tiny", "--sample-hz", "1",
                                 "--window", "10s", "--dataset", str(p),
                                 "--screenshot-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert seen["names"][:3] == ["warm", "spike", "calm"], seen
    for name in ("warm", "spike", "calm"):
        assert name in seen["changes"], seen["changes"]
    assert seen["load"].startswith(f"{p} ×1.00, phase calm"), seen["load"]
