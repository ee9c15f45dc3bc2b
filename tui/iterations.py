"""The vLLM plugin's iterations on the dashboard's time grid (numpy, no Textual).

One :class:`IterationColumns` per (server, engine_idx) stream takes that stream's rows
(``probes.plugin_steps.Iteration``) incrementally. The figures that mean the same as a hosted
engine's steps go through the hosted path: each row becomes a ``StepColumns`` row
(``tui.plotdata``; t_end = the batch's time, t_start = t_end − its interval where known,
prefill tokens, decode rows, running, waiting, preemptions, and the KV share as used/total out
of :data:`KV_SCALE`), binned by ``plotdata.steps_frame`` — so the batch composition (the
largest batch ending in each slice) and the queue/KV state (held between batches) are the
hosted panels' own figures. What only the plugin has is kept beside it: the interval between
output batches and the engine core's ITLs, per slice (:class:`IterationFrame`).

A row without SchedulerStats (``running`` -1) holds the previous row's running, waiting and KV
share (the queue panel's rule between steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gpuchef.probes.plugin_steps import Iteration

from .plotdata import StepColumns, TimeGrid, WaveFrame, steps_frame

NAN = float("nan")
#: the KV share's denominator in StepColumns rows (kv_blocks_used / kv_blocks_total = kv_usage)
KV_SCALE = 1_000_000
#: kind of an output batch, by what it held (the hosted waveform's step kinds)
KIND_PREFILL, KIND_MIXED, KIND_DECODE = 0, 1, 2
_COL = {f: i for i, f in enumerate(StepColumns.FIELDS)}


def _state(rows: Sequence[Iteration], last: tuple[int, int, int, int]):
    """Per row (running, waiting, kv used, kv total) with SchedulerStats-less rows holding the
    previous state (``last``: the state before the first row)."""
    out = []
    for r in rows:
        if r.running >= 0:
            kv = r.kv_usage
            last = (r.running, r.waiting, round(kv * KV_SCALE) if kv == kv else last[2],
                    KV_SCALE if kv == kv else last[3])
        out.append(last)
    return out, last


class IterationColumns:
    """One stream's rows as columns. ``next``: the number of the next row to ask the session
    for (``IterationLog.since``); ``steps``: the StepColumns the hosted figures are binned from;
    ``t``/``interval_ms``/``itl_sum_s``/``decode``/``first``/``prefill``: float64/int64 arrays
    per row, time ordered; ``prefill_scheduled``: the newest row's prefill was the step's
    scheduled tokens (vLLM's --cudagraph-metrics) rather than completed prompts."""

    def __init__(self, server: str, engine_idx: int, max_age_ns: int = 700 * 10**9) -> None:
        self.server, self.engine_idx = server, engine_idx
        self.max_age_ns = max_age_ns
        self.next = 0
        self.steps = StepColumns(max_age_ns)
        self.t = np.zeros(0, dtype=np.int64)
        self.interval_ms = np.zeros(0)
        self.itl_sum_s = np.zeros(0)
        self.decode = np.zeros(0, dtype=np.int64)
        self.first = np.zeros(0, dtype=np.int64)
        self.prefill = np.zeros(0, dtype=np.int64)
        self.prefill_scheduled = False
        self.latest: Iteration | None = None
        self._state = (0, 0, 0, 0)
        self._n = 0

    def __len__(self) -> int:
        return len(self.t)

    def extend(self, rows: Sequence[Iteration], next_n: int) -> None:
        """Add ``rows`` (the stream's, in order) and remember ``next_n`` for the next ask."""
        self.next = next_n
        m = len(rows)
        if not m:
            return
        state, self._state = _state(rows, self._state)
        ints = np.zeros((m, len(StepColumns.FIELDS)), dtype=np.int64)
        t = np.fromiter((r.t_ns for r in rows), np.int64, m)
        iv = np.fromiter((r.interval_ns for r in rows), np.int64, m)
        ints[:, _COL["t_end_ns"]] = t
        ints[:, _COL["t_start_ns"]] = np.where(iv >= 0, t - iv, t)
        ints[:, _COL["num_prefill_tokens"]] = [r.prefill_tokens for r in rows]
        ints[:, _COL["num_decode_reqs"]] = [r.decode_rows for r in rows]
        ints[:, _COL["num_preempted"]] = [r.preempted for r in rows]
        st = np.array(state, dtype=np.int64).reshape(m, 4)
        for k, f in enumerate(("num_running", "num_waiting", "kv_blocks_used", "kv_blocks_total")):
            ints[:, _COL[f]] = st[:, k]
        ints[:, _COL["max_num_batched_tokens"]] = -1  # vLLM's budget is not in the records
        ints[:, _COL["prefill_allowance"]] = -1
        ints[:, _COL["step"]] = np.arange(self._n, self._n + m)
        self._n += m
        self.steps.append(ints, np.zeros(m), np.full(m, -1.0), np.ones(m, dtype=np.int8))
        self.t = np.concatenate([self.t, t])
        self.interval_ms = np.concatenate([self.interval_ms, np.where(iv >= 0, iv / 1e6, NAN)])
        self.itl_sum_s = np.concatenate([self.itl_sum_s, [r.itl_sum_s for r in rows]])
        self.decode = np.concatenate([self.decode, ints[:, _COL["num_decode_reqs"]]])
        self.first = np.concatenate([self.first, [r.first_tokens for r in rows]])
        self.prefill = np.concatenate([self.prefill, ints[:, _COL["num_prefill_tokens"]]])
        self.latest = rows[-1]
        self.prefill_scheduled = rows[-1].prefill_scheduled
        cut = int(np.searchsorted(self.t, self.t[-1] - self.max_age_ns))
        if cut > 4096:  # trim in chunks, not every call
            for name in ("t", "interval_ms", "itl_sum_s", "decode", "first", "prefill"):
                setattr(self, name, getattr(self, name)[cut:])

    def frame(self, grid: TimeGrid) -> "IterationFrame":
        """This stream on ``grid`` (see :class:`IterationFrame`)."""
        wave = steps_frame(self.steps, grid)
        wave.kv_blocks_total = 0  # a share, not blocks: the queue panel shows no block count
        n = grid.cols
        i = int(np.searchsorted(self.t, grid.t0_ns))
        j = int(np.searchsorted(self.t, grid.t1_ns))
        col = (self.t[i:j] - grid.t0_ns) // grid.bin_ns
        iv = self.interval_ms[i:j]
        ok = np.isfinite(iv)
        cnt = np.bincount(col[ok], minlength=n)[:n]
        with np.errstate(invalid="ignore", divide="ignore"):
            interval = np.where(cnt > 0, np.bincount(col[ok], weights=iv[ok], minlength=n)[:n]
                                / np.maximum(cnt, 1), NAN)
            rows = np.bincount(col, weights=self.decode[i:j], minlength=n)[:n]
            itl = np.where(rows > 0, np.bincount(col, weights=self.itl_sum_s[i:j],
                                                 minlength=n)[:n] * 1e3 / np.maximum(rows, 1),
                           NAN)
        pre, dec = wave.prefill_per_step, wave.decode_per_step
        kind = np.where(np.isnan(pre), -1, np.where(
            (pre > 0) & (dec > 0), KIND_MIXED, np.where(pre > 0, KIND_PREFILL, KIND_DECODE)))
        return IterationFrame(self.server, self.engine_idx, wave, interval, itl, kind,
                              self.prefill_scheduled, self.latest)

    def window(self, now_ns: int, window_s: float) -> "StreamFigures":
        """The figures of the rows of the last ``window_s`` before ``now_ns``
        (:class:`StreamFigures`)."""
        t0 = now_ns - int(window_s * 1e9)
        i = int(np.searchsorted(self.t, t0, side="right"))
        j = int(np.searchsorted(self.t, now_ns, side="right"))
        n = j - i
        if n == 0:
            return StreamFigures(0, NAN, NAN, NAN, NAN, NAN, self.latest)
        span_s = max(1e-9, min(window_s, (now_ns - int(self.t[0])) / 1e9))
        iv = self.interval_ms[i:j]
        iv = iv[np.isfinite(iv)]
        rows = int(self.decode[i:j].sum())
        return StreamFigures(
            n, n / span_s, float(np.median(iv)) if len(iv) else NAN,
            float(self.itl_sum_s[i:j].sum() * 1e3 / rows) if rows else NAN,
            float(self.prefill[i:j].mean()), float(self.decode[i:j].mean()), self.latest)


@dataclass(frozen=True)
class StreamFigures:
    """One stream over the numbers panel's window: ``iterations`` (output batches),
    ``per_s`` (batches/s), ``interval_p50_ms`` (median front-end time between batches, the
    known intervals), ``itl_mean_ms`` (the engine core's ITL, mean over every decode row),
    ``prefill_per_it``/``decode_per_it`` (means per batch), ``latest``: the newest row (its
    running, waiting, KV share)."""

    iterations: int
    per_s: float
    interval_p50_ms: float
    itl_mean_ms: float
    prefill_per_it: float
    decode_per_it: float
    latest: Iteration | None


@dataclass
class IterationFrame:
    """One stream on a grid: ``wave`` (the hosted figures: ``prefill_per_step``/
    ``decode_per_step`` of the largest batch ending in each slice, ``running``/``waiting``/
    ``kv``/``preempted``, ``steps`` = batches ending in the slice, ``latest``); per slice
    ``interval_ms`` (mean front-end time between output batches, of the batches ending there
    whose interval is known), ``itl_ms`` (the engine core's ITL, mean over the decode rows of
    those batches) and ``kind`` (of the largest batch: KIND_*, -1 none). ``prefill_scheduled``:
    see :class:`IterationColumns`. ``off``: "" or why the stream has nothing to draw (a band
    for a server whose plugin sent no record yet)."""

    server: str
    engine_idx: int
    wave: WaveFrame | None
    interval_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    itl_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    kind: np.ndarray = field(default_factory=lambda: np.zeros(0))
    prefill_scheduled: bool = False
    latest: Iteration | None = None
    off: str = ""
    label: str = ""  # the band's label: "host:port · engine 0"

    @property
    def grid(self) -> TimeGrid | None:
        return self.wave.grid if self.wave is not None else None


def fmt_ms(v: float) -> str:
    """"12.3 ms", "1.25 s", "–" for NaN."""
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:.1f} ms" if v < 1000 else f"{v / 1000:.2f} s"


__all__ = ["IterationColumns", "IterationFrame", "KIND_DECODE", "KIND_MIXED", "KIND_PREFILL",
           "KV_SCALE", "StreamFigures", "fmt_ms"]
