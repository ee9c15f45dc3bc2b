"""tui/iterations.py: the vLLM plugin's iteration rows on the dashboard's time grid. The batch
and queue figures are the hosted ones (``plotdata.steps_frame`` over StepColumns rows), the
interval and ITL are the plugin's own; every number here is worked out by hand."""

from __future__ import annotations

import math

import numpy as np

from gpuchef.probes.plugin_steps import Iteration
from gpuchef.tui.iterations import KIND_DECODE, KIND_MIXED, KIND_PREFILL, IterationColumns
from gpuchef.tui.plotdata import TimeGrid

MS = 1_000_000
NAN = float("nan")


def it(seq, t_ms, interval_ms, prefill, decode, *, running=4, waiting=1, kv=0.5, itl_s=0.02,
       preempted=0) -> Iteration:
    return Iteration("tcp://h:1", 0, seq, int(t_ms * MS),
                     -1 if interval_ms is None else int(interval_ms * MS), decode, 0, prefill,
                     True, 0, decode, running, waiting, kv, preempted, 0, itl_s * decode,
                     itl_s if decode else NAN, 0)


def test_slices_show_the_largest_batch_mean_interval_and_mean_itl_of_their_batches():
    c = IterationColumns("tcp://h:1", 0)
    rows = [it(0, 5, None, 512, 0, itl_s=0),        # slice 0: a prefill-only batch, no interval
            it(1, 15, 10, 0, 8, itl_s=0.010),       # slice 1: two decode-only batches
            it(2, 18, 3, 0, 4, itl_s=0.040),
            it(3, 25, 7, 100, 6, preempted=2),      # slice 2: a mixed batch, 2 preempted
            it(4, 45, 20, 0, 2, running=-1, waiting=-1, kv=NAN)]  # slice 4: no SchedulerStats
    c.extend(rows[:2], 2)
    c.extend(rows[2:], 5)
    assert c.next == 5 and len(c) == 5 and len(c.steps) == 5
    grid = TimeGrid(0, 10 * MS, 5, 49 * MS)
    f = c.frame(grid)
    w = f.wave
    # the largest batch ending in each slice, prefill under decode rows
    assert list(np.nan_to_num(w.prefill_per_step, nan=-1)) == [512, 0, 100, -1, 0]
    assert list(np.nan_to_num(w.decode_per_step, nan=-1)) == [0, 8, 6, -1, 2]
    assert list(f.kind) == [KIND_PREFILL, KIND_DECODE, KIND_MIXED, -1, KIND_DECODE]
    assert list(w.steps) == [1, 2, 1, 0, 1] and list(w.preempted) == [0, 0, 2, 0, 0]
    # the interval: mean of the known ones ending in the slice
    assert math.isnan(f.interval_ms[0]) and f.interval_ms[1] == 6.5 and f.interval_ms[2] == 7
    # the ITL: over every decode row of the slice's batches: (8 × 10 + 4 × 40) / 12 ms
    assert math.isclose(f.itl_ms[1], (8 * 10 + 4 * 40) / 12)
    assert math.isnan(f.itl_ms[0]) and math.isnan(f.itl_ms[3])
    # the queue state is held between batches, and through a batch without SchedulerStats
    assert list(w.running) == [4, 4, 4, 4, 4] and list(w.waiting) == [1, 1, 1, 1, 1]
    assert np.allclose(w.kv, 0.5)
    assert np.isnan(w.budget).all()  # vLLM's budget is not in the records: no budget line
    assert w.kv_blocks_total == 0 and f.latest is rows[-1]
    assert w.latest.running == 4 and math.isclose(w.latest.kv, 0.5)


def test_the_numbers_window_counts_batches_and_their_rates():
    c = IterationColumns("tcp://h:1", 1)
    c.extend([it(k, 100 * k, 100 if k else None, 10 * (k % 2), 4, itl_s=0.025)
              for k in range(30)], 30)
    figs = c.window(now_ns=2_950 * MS, window_s=1.0)  # rows at 2.0, 2.1, ..., 2.9 s
    assert figs.iterations == 10 and math.isclose(figs.per_s, 10.0)
    assert figs.interval_p50_ms == 100 and math.isclose(figs.itl_mean_ms, 25.0)
    assert figs.prefill_per_it == 5 and figs.decode_per_it == 4
    assert figs.latest.seq == 29
    empty = IterationColumns("tcp://h:1", 2).window(10**9, 1.0)
    assert empty.iterations == 0 and math.isnan(empty.per_s)
