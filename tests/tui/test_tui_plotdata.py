"""The dashboard's numbers behind the pixels: time grid, binning of steps, drawing cells."""

import numpy as np
import pytest

from gpuchef.engine_host.vocab.records import EngineEvent, StepRecord
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.chart import GUTTER_L, GUTTER_R, Cells
from gpuchef.tui.plotdata import (StepColumns, TimeGrid, build_frame, event_label, markers_for,
                                  nice_max)

MS = 1_000_000
T0 = 10**12


def step(i, t0_ms, dur_ms, pre=0, dec=0, mode="chunked", budget=512, running=1, waiting=0,
         gpu_ms=None, preempted=0):
    t0 = T0 + int(t0_ms * MS)
    return StepRecord(i, t0, t0 + int(dur_ms * MS), dur_ms if gpu_ms is None else gpu_ms, mode,
                      budget, 256, 0, 1, 1 if pre else 0, pre, dec, 0, running, waiting, preempted,
                      10, 100)


def timeline(steps, events=()):
    tl = Timeline(origin_ns=T0, clock=lambda: T0 + 10**10)
    for s in steps:
        tl.add_step(s)
    for e in events:
        tl.add_event(e)
    return tl


def test_grid_edges_on_fixed_multiples_and_now_in_last_column():
    g = TimeGrid.ending_at(T0 + 12_345 * MS, T0, 10.0, 100)
    assert g.bin_ns == 100 * MS
    assert (g.t0_ns - T0) % g.bin_ns == 0
    assert g.col_of(g.now_ns) == g.cols - 1
    g2 = TimeGrid.ending_at(T0 + 12_399 * MS, T0, 10.0, 100)
    assert g2.key() == g.key()  # same column: nothing scrolls
    g3 = TimeGrid.ending_at(T0 + 12_400 * MS, T0, 10.0, 100)
    assert g3.t0_ns == g.t0_ns + g.bin_ns
    with pytest.raises(ValueError):
        TimeGrid.ending_at(T0, T0, 10.0, 0)


def test_busy_is_spread_over_step_spans_and_split_by_step_kind():
    # a 250 ms prefill-only step, then 5 decode steps of 20 ms, then idle
    steps = [step(0, 0, 250, pre=800)] + [step(1 + k, 250 + 20 * k, 20, dec=4) for k in range(5)]
    tl = timeline(steps)
    g = TimeGrid(T0, 100 * MS, 5, T0 + 500 * MS - 1)
    f = build_frame(tl.snapshot(g.now_ns), g, gpu=False)
    np.testing.assert_allclose(f.busy_prefill, [1, 1, 0.5, 0, 0], atol=1e-6)
    np.testing.assert_allclose(f.busy_decode, [0, 0, 0.5, 0.5, 0], atol=1e-6)
    assert not f.busy_mixed.any()
    # total compute time is kept: 250 ms + 100 ms
    assert f.busy.sum() * 100 == pytest.approx(350, abs=1e-3)


def test_the_dashboard_bins_steps_as_the_report_does():
    """One owner spreads steps over time bins (probes.timeline.spread_over_bins): on the same
    steps and bins the dashboard's busy (its three kinds summed) is the report's waveform's."""
    rng = np.random.default_rng(7)
    steps, t = [], 0.0
    for i in range(400):
        t += float(rng.exponential(3.0))  # idle gaps
        dur = float(rng.uniform(0.5, 40.0))
        pre, dec = int(rng.integers(0, 3)) * 300, int(rng.integers(0, 2)) * 16
        steps.append(step(i, t, dur, pre=pre, dec=dec, gpu_ms=dur * float(rng.uniform(0.3, 1.2))))
        t += dur
    g = TimeGrid(T0, 37 * MS, int(t // 37), T0 + int(t // 37) * 37 * MS)  # whole columns
    snap = timeline(steps).snapshot(g.now_ns)
    f = build_frame(snap, g, gpu=False)
    wf = snap.step_waveform(g.t0_ns, g.t1_ns, g.cols)
    assert wf.edges_ns.tolist() == g.edges().tolist()
    np.testing.assert_allclose(f.busy, wf.busy, rtol=0, atol=1e-9)
    assert f.busy.sum() > 0.3 * g.cols


def test_the_largest_step_of_a_column_is_drawn_not_a_blend():
    steps = [step(0, 0, 30, pre=500), step(1, 30, 10, dec=7), step(2, 40, 10, dec=7)]
    g = TimeGrid(T0, 100 * MS, 1, T0 + 100 * MS - 1)
    f = build_frame(timeline(steps).snapshot(g.now_ns), g, gpu=False)
    assert f.prefill_per_step[0] == 500 and f.decode_per_step[0] == 0  # the prefill-only step
    assert f.steps[0] == 3
    assert f.running[0] == 1


def test_mixed_steps_and_budget_and_mode_per_column():
    steps = [step(0, 0, 50, pre=400, dec=8, budget=512, mode="chunked"),
             step(1, 100, 50, pre=900, mode="continuous", budget=1024)]
    g = TimeGrid(T0, 100 * MS, 2, T0 + 200 * MS - 1)
    f = build_frame(timeline(steps).snapshot(g.now_ns), g, gpu=False)
    assert f.busy_mixed[0] == pytest.approx(0.5)
    assert f.busy_prefill[1] == pytest.approx(0.5)
    assert list(f.budget) == [512, 1024]
    assert f.modes == ["chunked", "continuous"]


def test_partial_last_column_is_measured_against_elapsed_time():
    steps = [step(0, 100, 40, dec=2)]
    g = TimeGrid(T0, 100 * MS, 2, T0 + 150 * MS)  # 50 ms into the last column
    f = build_frame(timeline(steps).snapshot(g.now_ns), g, gpu=False)
    assert f.busy_decode[1] == pytest.approx(0.8)


def test_incremental_columns_match_a_fresh_conversion():
    steps = [step(i, 10 * i, 8, pre=(i % 3) * 100, dec=i % 5) for i in range(300)]
    tl = timeline(steps[:100])
    cols = StepColumns()
    cols.extend(tl.snapshot().steps)
    for s in steps[100:]:
        tl.add_step(s)
    cols.extend(tl.snapshot().steps)
    cols.extend(tl.snapshot().steps)  # nothing new: no duplicates
    assert len(cols) == 300
    g = TimeGrid(T0, 50 * MS, 60, T0 + 3000 * MS - 1)
    snap = tl.snapshot(g.now_ns)
    a = build_frame(snap, g, gpu=False, steps=cols)
    b = build_frame(snap, g, gpu=False)
    for name in ("busy_prefill", "busy_mixed", "busy_decode", "prefill_per_step", "running"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name))


def test_changes_become_markers_at_their_column():
    evs = [EngineEvent("knob", 5, T0 + 150 * MS, "max_num_batched_tokens", 2048, 1024),
           EngineEvent("mode", 9, T0 + 350 * MS, "mode", "chunked", "continuous"),
           EngineEvent("error", 9, T0 + 360 * MS, message="refused"),
           EngineEvent("mark", 11, T0 + 420 * MS, "ab:1:B:2"),
           EngineEvent("knob", 12, T0 + 450 * MS, "long_prefill_token_threshold", 0, 256)]
    g = TimeGrid(T0, 100 * MS, 5, T0 + 500 * MS - 1)
    ms = markers_for(evs, g)
    assert [(m.col, m.label) for m in ms] == [(1, "budget 2048→1024"), (3, "mode→continuous"),
                                              (4, "B#2"), (4, "chunk off→256")]
    assert event_label(EngineEvent("pause", 1, 0, "load")) == ("load paused", "load")


def test_stacked_cells_heights_and_runs():
    c = Cells(4, 3, [])
    # column 0: 1.5 rows red under 1 row blue; column 1: empty; column 2: full red
    c.stacked([np.array([1.5, 0, 4]), np.array([1.0, 0, 0])], ["red", "blue"])
    assert "".join(c.chars[::-1, 0]) == "██▄ "  # top exact to 1/8 row; the split on a row
    red, blue = c.palette.index("red"), c.palette.index("blue")
    assert c.fg[::-1, 0].tolist()[:3] == [red, red, blue]
    assert c.chars[:, 1].tolist() == [" "] * 4
    assert "".join(c.chars[:, 2]) == "████"
    strips = c.strips(bg="black")
    assert all(s.cell_length == GUTTER_L + 3 + GUTTER_R for s in strips)


def test_nice_max():
    assert nice_max(0) == 1
    assert nice_max(1024) == 1200
    assert nice_max(512) == 600
    assert nice_max(97) == 100
    assert nice_max(float("nan"), 8) == 8


def test_gpu_columns_bin_like_the_timeline_and_skip_missing_fields():
    from gpuchef.probes.nvml import GpuSample
    from gpuchef.tui.plotdata import GpuColumns

    tl = timeline([])
    for k in range(40):
        for gpu in (0, 1):
            tl.add_gpu_sample(GpuSample(T0 + k * 25 * MS + gpu, gpu, gpu_util=100,
                                        sm_active=10.0 * gpu + k, power_w=None))
    g = TimeGrid(T0, 100 * MS, 10, T0 + 1000 * MS - 1)
    cols = GpuColumns()
    cols.extend(tl.snapshot())
    cols.extend(tl.snapshot())  # nothing new twice
    assert len(cols.t) == 80
    got = cols.binned(g)
    want = tl.snapshot().sample_waveform("sm_active", g.t0_ns, g.t1_ns, g.cols)[1]
    np.testing.assert_allclose(got["sm_active"], want)
    assert np.isnan(got["power_w"]).all()
