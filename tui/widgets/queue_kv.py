"""Queue and KV cache on the shared time axis: running and waiting requests stacked, preemptions
marked ×, and KV blocks in use."""

from __future__ import annotations

import numpy as np
from textual.strip import Strip

from .. import theme
from ..chart import Cells, fmt_age, fmt_num
from ..plotdata import WaveFrame, nice_max
from .waveforms import BG, ChartPanel, _gutter, _right


class QueueKvPanel(ChartPanel):
    TITLE = "Queue and KV cache"
    UNIT = "requests; KV blocks used, %"
    SOURCE = "StepRecord queues, kv_blocks"
    UNIT_SHORT = "requests; KV %"
    LEGEND = (("running", theme.RUNNING), ("waiting", theme.WAITING),
              ("× preempted", theme.PREEMPTED, "× preempt"), ("KV", theme.KV))

    def draw(self, f: WaveFrame, cols: int, h: int) -> list[Strip]:
        hk = max(1, h // 3) if h >= 3 else 0
        hq = h - hk
        run, wait = self.fit(f.running, cols), self.fit(f.waiting, cols)
        if f.pending and cols:  # arrivals since the newest step wait in the newest column
            wait = wait.copy()
            wait[-1] = np.nan_to_num(wait[-1]) + f.pending
        pre = np.nan_to_num(self.fit(f.preempted, cols))
        kv = self.fit(f.kv, cols)
        top = nice_max(float(np.nanmax(run + wait)) if np.isfinite(run + wait).any() else 0.0, 4)
        c = Cells(hq, cols, [])
        c.stacked([run / top * hq, wait / top * hq], [theme.RUNNING, theme.WAITING])
        hit = np.nonzero(pre > 0)[0]
        if len(hit):
            c.chars[0, hit] = "×"
            c.fg[0, hit] = c.colour(theme.PREEMPTED)
        c.markers(self.marker_cols(f, cols))
        # readouts: the newest step's queues (+ arrivals since it, which wait) and its age, not
        # the last columns' (a long step in flight left them without a step: "R 0 / W 0")
        lt = f.latest
        r = lt.running if lt else float("nan")
        w = lt.waiting + f.pending if lt else (f.pending or float("nan"))
        npre = int(pre.sum())
        right = _right(hq, [(f"R {fmt_num(r)}", theme.RUNNING), (f"W {fmt_num(w)}", theme.WAITING),
                            (f"× {npre}", theme.PREEMPTED), (fmt_age(f.age_s), theme.LABEL)])
        rows = c.strips(_gutter(hq, fmt_num(top), "0"), right, BG)
        if hk:
            k = Cells(hk, cols, [])
            k.stacked([kv * hk], [theme.KV])
            k.markers(self.marker_cols(f, cols))
            cur = lt.kv * 100 if lt else float("nan")
            blocks = f" of {fmt_num(f.kv_blocks_total)}" if f.kv_blocks_total else ""
            rows += k.strips(_gutter(hk, "KV 100%", "0%" if hk > 1 else ""),
                             _right(hk, [(f"{cur:.0f}%" if cur == cur else "–", theme.KV),
                                         (blocks.strip(), theme.LABEL)]),
                             BG)
        return rows
