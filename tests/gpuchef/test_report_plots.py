"""gpuchef.report.plots: the step close-up counts the steps that overlap its stretch; CDF tick
labels and the event labels above the waveforms do not overlap."""

from __future__ import annotations

import itertools
from types import SimpleNamespace as NS

import pytest

from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes.recorder import read_trace
from test_report_data import H200, write_trace

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
    p = write_trace(tmp_path / "rates.jsonl", {"command": "top"}, events=ev)
    (view,) = build([p]).views
    fig, _ = waveforms_figure(view)
    r = _draw(fig)
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text().startswith(("rate", "+"))]
    assert len(labels) >= 4
    assert not _overlaps(labels + [ax.title], r), [t.get_text() for t in labels]
