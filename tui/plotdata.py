"""From a timeline snapshot to the numbers each waveform column shows (numpy, no Textual).

All waveforms share one :class:`TimeGrid`: ``cols`` equal slices ending at the slice that holds
"now". Slice edges sit on a fixed grid (multiples of the slice width from the session origin), so
the picture scrolls by whole columns and a column's value does not change once it is complete:
the UI redraws only when the grid advances or the last (partial) column got new data.

Step quantities are spread over each step's span ``[t_start_ns, t_end_ns]`` (a 260 ms prefill
step covers three 100 ms slices) by ``probes.timeline.spread_over_bins``, the report's waveform's
binning too; per-step figures (tokens per step, queue lengths, KV) come from the steps that
*ended* in the slice.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from gpuchef.engine_host.autopilot import ERROR_ENTER, FALLBACK, INFEASIBLE, LEARNING, STEERING
from gpuchef.engine_host.vocab.config import AUTO_BUDGET, parse_auto_budget, setting_label
from gpuchef.engine_host.vocab.phases import parse_phase_mark
from gpuchef.engine_host.vocab.records import EngineEvent, StepRecord
from gpuchef.probes.ab import parse_mark
from gpuchef.probes.metrics import GPU_SUMMARY_FIELDS, StepArrays, gpu_value, steered_itl_ms
from gpuchef.probes.timeline import TimelineSnapshot, spread_over_bins, step_compute_ns

NAN = float("nan")


GPU_FIELDS = GPU_SUMMARY_FIELDS  # probes/metrics.py owns the list and its NaN policy
# GpuColumns also keeps device memory used, % of total (from mem_used_bytes / mem_total_bytes)
_GPU_COLS = GPU_FIELDS + ("mem_used_pct",)


def _mem_pct(g) -> float:
    u, t = g.mem_used_bytes, g.mem_total_bytes
    return 100.0 * u / t if u is not None and t else np.nan


@dataclass(frozen=True)
class TimeGrid:
    """``cols`` slices of ``bin_ns`` each; column ``i`` covers ``[t0_ns + i*bin_ns, +bin_ns)``.

    ``now_ns`` lies in the last column (it is partial). Raises ValueError for ``cols`` < 1 or a
    window shorter than ``cols`` ns.
    """

    t0_ns: int
    bin_ns: int
    cols: int
    now_ns: int

    @classmethod
    def ending_at(cls, now_ns: int, origin_ns: int, window_s: float, cols: int) -> "TimeGrid":
        """The grid whose last column holds ``now_ns``; edges on multiples of the slice width
        from ``origin_ns`` (window ``window_s`` seconds over ``cols`` columns)."""
        if cols < 1:
            raise ValueError(f"cols {cols} must be >= 1")
        bin_ns = int(window_s * 1e9) // cols
        if bin_ns < 1:
            raise ValueError(f"window {window_s} s is too short for {cols} columns")
        k = (now_ns - origin_ns) // bin_ns
        t1 = origin_ns + (k + 1) * bin_ns
        return cls(t1 - cols * bin_ns, bin_ns, cols, now_ns)

    @classmethod
    def spanning(cls, t0_ns: int, t1_ns: int, cols: int, now_ns: int | None = None) -> "TimeGrid":
        """A grid over a fixed range (an A/B window), ``cols`` columns."""
        cols = max(1, cols)
        bin_ns = max(1, (t1_ns - t0_ns) // cols)
        return cls(t0_ns, bin_ns, cols, t1_ns if now_ns is None else min(now_ns, t1_ns))

    @property
    def t1_ns(self) -> int:
        return self.t0_ns + self.cols * self.bin_ns

    @property
    def bin_s(self) -> float:
        return self.bin_ns / 1e9

    @property
    def window_s(self) -> float:
        return self.cols * self.bin_ns / 1e9

    def col_of(self, t_ns: int) -> int:
        """Column of ``t_ns`` (may be outside ``[0, cols)``)."""
        return (t_ns - self.t0_ns) // self.bin_ns

    def edges(self) -> np.ndarray:
        return self.t0_ns + self.bin_ns * np.arange(self.cols + 1, dtype=np.int64)

    def key(self) -> tuple[int, int, int]:
        """Changes exactly when the picture must scroll or be re-laid out."""
        return (self.t0_ns, self.bin_ns, self.cols)


@dataclass(frozen=True)
class Marker:
    """A change on the waveforms: column, short label, kind ("mode", "knob", "mark", "load",
    "ab", "phase": a phased workload's phase started, labelled with its name), the step at
    which it took effect and its time."""

    col: int
    label: str
    kind: str
    step: int
    t_ns: int


@dataclass
class WaveFrame:
    """Per-column values (float64 arrays of length ``grid.cols``; NaN = no data).

    Step waveform — share of each slice's time the engine computed (0–1), split by step kind:
    ``busy_prefill`` (steps with prefill tokens only), ``busy_mixed`` (prefill and decode in one
    step), ``busy_decode`` (decode only). Batch composition — ``prefill_per_step`` /
    ``decode_per_step``: the tokens of the largest step that ended in the slice (a real step,
    not an average: a prefill-only and a decode-only step must not blend into a fake mixed
    one), and ``budget`` (the largest ``max_num_batched_tokens`` in force there). Queue:
    ``running``, ``waiting`` and ``kv`` (KV blocks used / total, 0–1): the state after the last
    step ending in or before the slice — the queues change only at steps, so a slice with none
    (a long step in flight, an idle gap, a pause) holds it; NaN before any step is known —
    and ``preempted`` (preemptions in the slice). ``steps``: steps that ended in the slice.
    ``modes``: the mode in force at each column's end (a switch with no step yet counts; ""
    before any). GPU (means of the samples in the slice, all GPUs pooled): ``sm_active``,
    ``tensor_active``, ``gpu_util``, ``dram_bw_util`` (%), ``power_w`` (W), ``mem_used_pct``
    (% of device memory). ``per_gpu``: the same GPU
    series per NVML index, filled only when more than one GPU was sampled. ``markers``: changes
    inside the window. ``latest``: the newest step (:class:`LatestStep`), for the readouts;
    ``pending``: requests the load submitted since it (set by the screen; they are waiting —
    during an engine pause no step counts them).
    The autopilot (``StepRecord`` fields of the same names): ``allowance`` — the
    ``prefill_allowance`` of the step whose tokens the batch composition draws (the largest
    ending in the slice; NaN where it had none, the autopilot off); ``predicted_ms`` — mean
    ``predicted_ms`` of the steps ending in the slice that have one; ``step_ms`` — mean
    ``wall_ms`` of the steps ending in the slice (the actual step time the prediction is set
    against); ``autopilot``: the newest step's status (:class:`AutopilotStatus`; None before a
    step).
    """

    grid: TimeGrid
    busy_prefill: np.ndarray
    busy_mixed: np.ndarray
    busy_decode: np.ndarray
    prefill_per_step: np.ndarray
    decode_per_step: np.ndarray
    budget: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    preempted: np.ndarray
    kv: np.ndarray
    steps: np.ndarray
    modes: list[str]
    gpu: dict[str, np.ndarray] = field(default_factory=dict)
    per_gpu: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    markers: list[Marker] = field(default_factory=list)
    kv_blocks_total: int = 0
    latest: "LatestStep | None" = None
    pending: int = 0
    allowance: np.ndarray | None = None
    predicted_ms: np.ndarray | None = None
    step_ms: np.ndarray | None = None
    autopilot: "AutopilotStatus | None" = None

    @property
    def busy(self) -> np.ndarray:
        return self.busy_prefill + self.busy_mixed + self.busy_decode

    @property
    def age_s(self) -> float:
        """Seconds from the end of the newest step to the frame's now (NaN: no step yet)."""
        if self.latest is None:
            return NAN
        return max(0.0, (self.grid.now_ns - self.latest.t_end_ns) / 1e9)


@dataclass(frozen=True)
class LatestStep:
    """What the newest StepRecord said, for the readouts: the queues after it (``running``,
    ``waiting``), KV blocks (``kv_used`` of ``kv_total``), its tokens (``prefill``,
    ``decode``) and the budget it ran under, and when it ended (``t_end_ns``). A readout shows
    this with its age (:attr:`WaveFrame.age_s`), never a 0 it did not measure."""

    t_end_ns: int
    running: int
    waiting: int
    kv_used: int
    kv_total: int
    prefill: int
    decode: int
    budget: int

    @property
    def kv(self) -> float:
        return self.kv_used / self.kv_total if self.kv_total > 0 else NAN


@dataclass(frozen=True)
class AutopilotStatus:
    """The autopilot as the newest StepRecord saw it: ``auto_budget`` (targets, "" = off),
    ``state`` (one of ``engine_host.autopilot.STATES``), ``fit_error`` (the model's tracked
    mean relative error, fraction; -1 = not tracked yet), ``allowance`` (tokens; -1 none),
    ``predicted_ms`` / ``wall_ms`` (ms; predicted -1 = none), ``budget``
    (``max_num_batched_tokens``) and ``mode`` (the scheduler mode) of that step."""

    auto_budget: str
    state: str
    fit_error: float
    allowance: int
    predicted_ms: float
    wall_ms: float
    budget: int
    mode: str = "chunked"
    achieved_ms: float = NAN

    @classmethod
    def of(cls, s: StepRecord, window: Sequence[StepRecord] = ()) -> "AutopilotStatus":
        """The status of the newest step ``s``; ``achieved_ms``: the ITL statistic of its
        targets over the steered steps of ``window`` (``probes.metrics.steered_itl_ms``)."""
        achieved = NAN
        if s.auto_budget and window:
            stat = parse_auto_budget(s.auto_budget).itl_stat
            achieved = steered_itl_ms((x for x in window if x.auto_budget == s.auto_budget),
                                      stat)
        return cls(s.auto_budget, s.autopilot_state, s.fit_error, s.prefill_allowance,
                   s.predicted_ms, s.wall_ms, s.max_num_batched_tokens, s.mode, achieved)

    @property
    def contract_text(self) -> str:
        """The promise against what the window's steered steps got: "P99 ITL 47.2 ≤ 50 ms:
        kept", "P99 ITL 61.0 > 50 ms: missed"; "" when no steered step had decode rows."""
        if self.achieved_ms != self.achieved_ms or not self.auto_budget:
            return ""
        spec = parse_auto_budget(self.auto_budget)
        stat = spec.itl_stat.upper() if spec.itl_stat.startswith("p") else spec.itl_stat
        kept = self.achieved_ms <= spec.itl_ms
        return (f"{stat} ITL {self.achieved_ms:.1f} {'≤' if kept else '>'} {spec.itl_ms:g} ms: "
                f"{'kept' if kept else 'missed'}")

    @property
    def itl_target_ms(self) -> float:
        """The ITL target in force (ms; NaN when off), from ``auto_budget``."""
        spec = parse_auto_budget(self.auto_budget) if self.auto_budget else None
        return spec.itl_ms if spec else NAN

    @property
    def error_text(self) -> str:
        """"7 %", or "–" while not tracked."""
        return f"{self.fit_error * 100:.0f} %" if self.fit_error >= 0 else "–"

    def line(self) -> str:
        """One status line: "steering itl_p99:50ms: P99 ITL 47.2 ≤ 50 ms: kept, err 7 %" (the
        window's steered steps against the promise), "infeasible: decodes
        alone over ITL 50 ms; static budget 2048 for TTFT (err 4 %)", "fallback: allowance 512
        of budget 2048 set by the measured ITL (err 62 %, steers again at ≤ 30 %)", "learning: not fitted, …", "off"."""
        if not self.auto_budget:
            return "off: the static budget (b turns it on)"
        if self.mode == "continuous":  # prompts are never split there: nothing to choose
            return (f"{self.auto_budget}: idle in continuous mode (it steers chunked steps; "
                    "m switches back)")
        if self.state == STEERING:
            kept = self.contract_text
            return (f"{STEERING} {self.auto_budget}: {kept or 'fitted'}, "
                    f"err {self.error_text}")
        if self.state == INFEASIBLE:
            return (f"{INFEASIBLE}: decodes alone over ITL {self.itl_target_ms:g} ms; static "
                    f"budget {self.budget} for TTFT (err {self.error_text})")
        if self.state == FALLBACK:
            return (f"{FALLBACK}: allowance {self.allowance} of budget {self.budget} set by the "
                    f"measured ITL (err {self.error_text}, steers again at ≤ {ERROR_ENTER:.0%})")
        if self.state == LEARNING:
            return (f"{LEARNING}: not fitted (err {self.error_text}); allowance 1/8–1/2 of "
                    f"budget {self.budget}")
        return f"{self.auto_budget}: no chunked step yet"  # on, but no step has chosen yet


_STEP_FIELDS = ("t_start_ns", "t_end_ns", "num_prefill_tokens", "num_decode_reqs", "num_running",
                "num_waiting", "num_preempted", "kv_blocks_used", "kv_blocks_total",
                "max_num_batched_tokens", "step", "prefill_allowance")
_ALLOWANCE = _STEP_FIELDS.index("prefill_allowance")
_MODE_CODE = {"continuous": 0, "chunked": 1}
_MODES = ("continuous", "chunked")


class StepColumns:
    """StepRecords as numpy columns (int64, plus ``gpu_ms`` and ``predicted_ms`` float64 and a
    mode code), appended
    incrementally: each record is converted once, so a redraw costs numpy slicing, not a Python
    pass over every step in the window. ``max_age_ns``: steps ending longer ago than this before
    the newest one are dropped (the longest window plus a margin).
    """

    #: the int64 columns, in order (:meth:`append` takes rows of them)
    FIELDS = _STEP_FIELDS

    def __init__(self, max_age_ns: int = 700 * 10**9) -> None:
        self.max_age_ns = max_age_ns
        self.ints = np.zeros((0, len(_STEP_FIELDS)), dtype=np.int64)
        self.gpu_ms = np.zeros(0)
        self.predicted_ms = np.zeros(0)
        self.mode = np.zeros(0, dtype=np.int8)
        self.last_step = -1

    @classmethod
    def from_steps(cls, steps: Sequence[StepRecord]) -> "StepColumns":
        c = cls(max_age_ns=1 << 62)
        c.extend(steps)
        return c

    def extend(self, steps: Sequence[StepRecord]) -> None:
        """Add the steps of ``steps`` (time ordered) newer than the last one added."""
        if not steps:
            return
        if steps[-1].step <= self.last_step:
            return
        i = bisect_left(steps, self.last_step + 1, key=_step_id) if self.last_step >= 0 else 0
        new = steps[i:]
        m = len(new)
        ints = np.array([[getattr(s, f) for f in _STEP_FIELDS] for s in new],
                        dtype=np.int64).reshape(m, len(_STEP_FIELDS))
        gpu = np.fromiter((s.gpu_ms for s in new), np.float64, m)
        pred = np.fromiter((s.predicted_ms for s in new), np.float64, m)
        mode = np.fromiter((_MODE_CODE.get(s.mode, 1) for s in new), np.int8, m)
        self.append(ints, gpu, pred, mode)

    def append(self, ints: np.ndarray, gpu_ms: np.ndarray, predicted_ms: np.ndarray,
               mode: np.ndarray) -> None:
        """Rows already converted (``ints``: (n, len(FIELDS)) int64 in that order, time
        ordered, after the rows held; float64 ``gpu_ms``/``predicted_ms``, int8 mode codes):
        how rows that are not StepRecords join (the vLLM plugin's iterations,
        ``tui.iterations``)."""
        if not len(ints):
            return
        self.ints = np.concatenate([self.ints, ints])
        self.gpu_ms = np.concatenate([self.gpu_ms, gpu_ms])
        self.predicted_ms = np.concatenate([self.predicted_ms, predicted_ms])
        self.mode = np.concatenate([self.mode, mode])
        self.last_step = int(ints[-1, _STEP_FIELDS.index("step")])
        cut = int(np.searchsorted(self.ints[:, 1], self.ints[-1, 1] - self.max_age_ns))
        if cut > 4096:  # trim in chunks, not every call
            self.ints, self.gpu_ms, self.mode = self.ints[cut:], self.gpu_ms[cut:], self.mode[cut:]
            self.predicted_ms = self.predicted_ms[cut:]

    def __len__(self) -> int:
        return len(self.gpu_ms)

    def col(self, name: str) -> np.ndarray:
        """The int64 column of StepRecord field ``name`` (one of ``_STEP_FIELDS``)."""
        return self.ints[:, _STEP_FIELDS.index(name)]

    def ending_between(self, t0: int, t1: int) -> slice:
        """Rows of the steps with ``t0 <= t_end_ns < t1`` (``TimelineSnapshot.steps_between``)."""
        te = self.ints[:, 1]
        return slice(int(np.searchsorted(te, t0)), int(np.searchsorted(te, t1)))

    def arrays(self, sl: slice) -> StepArrays:
        """Rows ``sl`` as ``probes.metrics.StepArrays`` (the step metrics' input)."""
        c = self.col
        return StepArrays(c("t_start_ns")[sl], c("t_end_ns")[sl], self.gpu_ms[sl],
                          c("num_prefill_tokens")[sl], c("num_decode_reqs")[sl],
                          c("num_preempted")[sl])

    def overlapping(self, t0: int, t1: int) -> slice:
        """Rows of the steps overlapping ``[t0, t1)``: those ending in it, and the one running
        across ``t1`` (it ends later but covers part of the window)."""
        te = self.ints[:, 1]
        i = int(np.searchsorted(te, t0, side="left"))
        j = int(np.searchsorted(te, t1, side="left"))
        if j < len(te) and self.ints[j, 0] < t1:
            j += 1
        return slice(i, j)


def _t_end(s: StepRecord) -> int:
    return s.t_end_ns


def _step_id(s: StepRecord) -> int:
    return s.step


def resume_index(seq, last, item, key, last_key: int | None) -> int:
    """Where new entries of ``seq`` (a ring buffer's snapshot, ascending ``key``) start after
    ``last``, the last one already folded in: found by identity from the end (the tail may be
    cut, entries may share a key), or, when ``last`` fell out of the ring, by ``last_key``.
    ``item(e)`` is the object compared with ``last``; 0 when nothing was folded in yet."""
    if last is None:
        return 0
    i = len(seq)
    while i > 0 and item(seq[i - 1]) is not last:
        i -= 1
    if i == 0 and seq and last_key is not None:
        i = bisect_left(seq, last_key + 1, key=key)
    return i


def _t_ns(s) -> int:
    return s.t_ns


class GpuColumns:
    """GpuSamples as numpy columns (``t_ns`` and :data:`GPU_FIELDS`, NaN where a field was not
    available, plus ``mem_used_pct``) and the NVML index ``g``, appended incrementally like
    :class:`StepColumns`. :meth:`binned` pools all GPUs; :meth:`binned_per_gpu` keeps them apart.
    ``indices``: the GPUs seen so far (sorted)."""

    def __init__(self, max_age_ns: int = 700 * 10**9) -> None:
        self.max_age_ns = max_age_ns
        self.t = np.zeros(0, dtype=np.int64)
        self.g = np.zeros(0, dtype=np.int64)
        self.v = np.zeros((0, len(_GPU_COLS)))
        self._last = None
        self.indices: list[int] = []

    def extend(self, snap: TimelineSnapshot) -> None:
        """Add the samples of ``snap`` after the last one added (found by identity, from the
        end: the snapshot's tail may be cut at its time, and GPUs share a tick's time)."""
        gs = snap.gpu_samples
        i = resume_index(gs, self._last, lambda g: g, _t_ns,
                         int(self.t[-1]) if len(self.t) else None)
        fresh = gs[i:]
        new = len(fresh)
        if new == 0:
            return
        self._last = fresh[-1]
        t = np.fromiter((g.t_ns for g in fresh), np.int64, new)
        gi = np.fromiter((g.gpu for g in fresh), np.int64, new)
        v = np.array([[gpu_value(getattr(g, f)) for f in GPU_FIELDS] + [_mem_pct(g)]
                      for g in fresh],
                     dtype=np.float64).reshape(new, len(_GPU_COLS))
        order = np.argsort(t, kind="stable")  # several GPUs may interleave a little
        self.t = np.concatenate([self.t, t[order]])
        self.g = np.concatenate([self.g, gi[order]])
        self.v = np.concatenate([self.v, v[order]])
        if not set(gi.tolist()) <= set(self.indices):
            self.indices = sorted(set(self.indices) | set(gi.tolist()))
        cut = int(np.searchsorted(self.t, self.t[-1] - self.max_age_ns))
        if cut > 4096:
            self.t, self.g, self.v = self.t[cut:], self.g[cut:], self.v[cut:]

    def binned(self, grid: "TimeGrid", gpu: int | None = None) -> dict[str, np.ndarray]:
        """Mean of each field per column of ``grid`` (NaN where a column has no value), over
        all GPUs or only NVML index ``gpu``."""
        i = int(np.searchsorted(self.t, grid.t0_ns))
        j = int(np.searchsorted(self.t, grid.t1_ns))
        n = grid.cols
        col = (self.t[i:j] - grid.t0_ns) // grid.bin_ns
        mine = np.ones(j - i, bool) if gpu is None else self.g[i:j] == gpu
        out = {}
        for k, f in enumerate(_GPU_COLS):
            v = self.v[i:j, k]
            ok = np.isfinite(v) & mine
            sums = np.bincount(col[ok], weights=v[ok], minlength=n)[:n]
            cnts = np.bincount(col[ok], minlength=n)[:n]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[f] = np.where(cnts > 0, sums / np.maximum(cnts, 1), NAN)
        return out

    def binned_per_gpu(self, grid: "TimeGrid") -> dict[int, dict[str, np.ndarray]]:
        """:meth:`binned` for each GPU seen, by NVML index."""
        return {k: self.binned(grid, k) for k in self.indices}


def build_frame(snap: TimelineSnapshot, grid: TimeGrid, *, gpu: bool = True,
                steps: StepColumns | None = None, gpus: GpuColumns | None = None) -> WaveFrame:
    """Bin ``snap`` on ``grid`` (see :class:`WaveFrame`). ``gpu`` False skips the GPU samples.
    ``steps``/``gpus``: the snapshot's records already converted (kept up to date by the
    caller); default: convert the ones in the window now."""
    t0, t1 = grid.t0_ns, grid.t1_ns
    if steps is None:
        steps = _window_steps(snap, grid)
    sl = steps.overlapping(t0, t1)
    c = _step_series(steps, sl, grid)
    running, waiting, kv = c.state[:, 0], c.state[:, 1], c.state[:, 2]
    modes = _modes_in_force(c.state[:, 3], c.t_state, snap, grid)
    gpu_series: dict[str, np.ndarray] = {}
    per_gpu: dict[int, dict[str, np.ndarray]] = {}
    if gpu and snap.gpu_samples:
        gpu_series, per_gpu = _gpu_series(snap, grid, gpus)
    autopilot = AutopilotStatus.of(snap.steps[-1], snap.steps) if snap.steps else None
    return WaveFrame(grid, c.busy_prefill, c.busy_mixed, c.busy_decode, c.prefill_per_step,
                     c.decode_per_step, c.budget, running, waiting, c.preempted, kv, c.steps,
                     modes, gpu_series, per_gpu, markers_for(snap.events_between(t0, t1), grid),
                     c.kv_blocks_total, _latest_step(steps), allowance=c.allowance,
                     predicted_ms=c.predicted_ms, step_ms=c.step_ms, autopilot=autopilot)


def steps_frame(steps: StepColumns, grid: TimeGrid) -> WaveFrame:
    """The step figures of ``steps`` alone on ``grid``, as :func:`build_frame` bins them (no
    events, GPU samples or modes): rows that come from somewhere else than a timeline snapshot
    (the vLLM plugin's iterations, ``tui.iterations``)."""
    c = _step_series(steps, steps.overlapping(grid.t0_ns, grid.t1_ns), grid)
    return WaveFrame(grid, c.busy_prefill, c.busy_mixed, c.busy_decode, c.prefill_per_step,
                     c.decode_per_step, c.budget, c.state[:, 0], c.state[:, 1], c.preempted,
                     c.state[:, 2], c.steps, [""] * grid.cols, kv_blocks_total=c.kv_blocks_total,
                     latest=_latest_step(steps), allowance=c.allowance,
                     predicted_ms=c.predicted_ms, step_ms=c.step_ms)


def _window_steps(snap: TimelineSnapshot, grid: TimeGrid) -> StepColumns:
    """The snapshot's steps overlapping the grid's window, converted to columns."""
    t0, t1 = grid.t0_ns, grid.t1_ns
    s_all = snap.steps
    i = bisect_left(s_all, t0, key=_t_end)
    j = bisect_left(s_all, t1, key=_t_end)
    if j < len(s_all) and s_all[j].t_start_ns < t1:
        j += 1  # the step running across t1
    return StepColumns.from_steps(s_all[i:j])


@dataclass
class _StepSeries:
    """The step figures of one frame, per column (see :class:`WaveFrame` for each); ``state``:
    (cols, 4) running, waiting, KV share and mode code in force at each column; ``t_state``: the
    end of the step that set it (-1: none known)."""

    busy_prefill: np.ndarray
    busy_mixed: np.ndarray
    busy_decode: np.ndarray
    prefill_per_step: np.ndarray
    decode_per_step: np.ndarray
    budget: np.ndarray
    allowance: np.ndarray
    step_ms: np.ndarray
    predicted_ms: np.ndarray
    preempted: np.ndarray
    steps: np.ndarray
    state: np.ndarray
    t_state: np.ndarray
    kv_blocks_total: int


def _step_series(steps: StepColumns, sl: slice, grid: TimeGrid) -> _StepSeries:
    """The steps ``sl`` of ``steps`` (those overlapping the window) binned on ``grid``."""
    n = grid.cols
    cols = steps.ints[sl]
    # the state after the last step before the window (NaN: none known)
    prev = sl.start - 1 if 0 < sl.start <= len(steps) else -1
    before = np.full(4, NAN)
    before_t = -1
    if prev >= 0:
        p = steps.ints[prev:prev + 1]
        before = np.array([p[0, 4], p[0, 5], _kv_share(p)[0], steps.mode[prev]], dtype=np.float64)
        before_t = int(p[0, 1])
    if not len(cols):
        nan, z = np.full(n, NAN), np.zeros(n)
        return _StepSeries(z, z, z, nan, nan, nan, nan, nan, nan, z, z,
                           np.repeat(before[None, :], n, axis=0),
                           np.full(n, before_t, dtype=np.int64),
                           int(steps.ints[prev, 8]) if prev >= 0 else 0)
    busy_p, busy_m, busy_d = _busy_by_kind(cols, steps.gpu_ms[sl], grid)
    endc = (cols[:, 1] - grid.t0_ns) // grid.bin_ns  # per-step figures by the column each ended in
    inside = (endc >= 0) & (endc < n)
    idx = endc[inside]
    rows = np.nonzero(inside)[0]
    fig = _ended_in_columns(cols, steps.predicted_ms[sl], inside, idx, rows, n)
    state, t_state = _queue_state(cols, steps.mode[sl], idx, rows, n, before, before_t)
    return _StepSeries(busy_p, busy_m, busy_d, fig["pre_ps"], fig["dec_ps"], fig["budget"],
                       fig["allow"], fig["step_ms"], fig["predicted"], fig["preempted"],
                       fig["cnt"], state, t_state, int(cols[-1, 8]))


def _busy_by_kind(cols: np.ndarray, gpu_ms: np.ndarray,
                  grid: TimeGrid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Share of each column the engine computed in prefill-only, mixed and decode-only steps
    (``probes.timeline.spread_over_bins``); the partial last column is measured against the
    time elapsed in it, not its width."""
    n = grid.cols
    busy_ns = step_compute_ns(cols[:, 0], cols[:, 1], gpu_ms)
    pre, dec = cols[:, 2], cols[:, 3]
    kind_pre = (pre > 0) & (dec == 0)
    kind_mix = (pre > 0) & (dec > 0)
    kind_dec = pre == 0
    span = np.full(n, float(grid.bin_ns))
    span[-1] = float(max(1, min(grid.bin_ns, grid.now_ns - (grid.t1_ns - grid.bin_ns))))
    busy_p, busy_m, busy_d = (np.clip(b / span, 0, 1) for b in spread_over_bins(
        cols[:, 0], cols[:, 1], grid.edges(), busy_ns * kind_pre, busy_ns * kind_mix,
        busy_ns * kind_dec))
    return busy_p, busy_m, busy_d


def _ended_in_columns(cols: np.ndarray, predicted_ms: np.ndarray, inside: np.ndarray,
                      idx: np.ndarray, rows: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Per-column figures of the steps that ended in each column (rows ``rows`` of ``cols``,
    ending in columns ``idx``): count, the largest step's prefill/decode split and allowance,
    mean step and predicted time, preemptions, the largest budget."""
    nan = np.full(n, NAN)
    pre, dec = cols[:, 2], cols[:, 3]
    cnt = np.bincount(idx, minlength=n).astype(np.float64)
    # the largest step of each column (by tokens): its prefill/decode split is drawn
    tok = (pre + dec)[inside]
    order = np.lexsort((tok, idx))          # by column, then tokens: the last of a column wins
    best = np.full(n, -1, dtype=np.int64)
    best[idx[order]] = rows[order]
    hasb = best >= 0
    pre_ps, dec_ps = nan.copy(), nan.copy()
    pre_ps[hasb] = pre[best[hasb]]
    dec_ps[hasb] = dec[best[hasb]]
    # the autopilot: the drawn step's allowance; predicted vs actual step time per slice
    allow = nan.copy()
    allow[hasb] = cols[best[hasb], _ALLOWANCE]
    allow[allow < 0] = NAN
    wall_ms = (cols[:, 1] - cols[:, 0]).astype(np.float64) / 1e6
    step_ms = np.where(cnt > 0, np.bincount(idx, weights=wall_ms[inside], minlength=n)
                       / np.maximum(cnt, 1), NAN)
    pred = predicted_ms[inside]
    hp = pred >= 0
    pn = np.bincount(idx[hp], minlength=n)
    predicted = np.where(pn > 0, np.bincount(idx[hp], weights=pred[hp], minlength=n)
                         / np.maximum(pn, 1), NAN)
    preempted = np.bincount(idx, weights=cols[inside, 6], minlength=n)
    budget_i = np.full(n, -1, dtype=np.int64)
    np.maximum.at(budget_i, idx, cols[inside, 9])
    budget = np.where(budget_i >= 0, budget_i.astype(np.float64), NAN)
    return {"cnt": cnt, "pre_ps": pre_ps, "dec_ps": dec_ps, "allow": allow, "step_ms": step_ms,
            "predicted": predicted, "preempted": preempted, "budget": budget}


def _queue_state(cols: np.ndarray, mode_codes: np.ndarray, idx: np.ndarray, rows: np.ndarray,
                 n: int, before: np.ndarray, before_t: int) -> tuple[np.ndarray, np.ndarray]:
    """(running, waiting, KV share, mode code) in force at each column and the end of the step
    that set it. The queues change only at steps: a column without a step ending in it (a long
    step in flight, an idle gap, a pause) holds the state after the last step before it
    (``before``, set at ``before_t``, for the columns before the window's first step)."""
    # last step of each column (steps are in time order: the last write wins)
    last = np.full(n, -1, dtype=np.int64)
    last[idx] = rows
    has = last >= 0
    li = last[has]
    ref = np.where(has, np.arange(n), -1)
    np.maximum.accumulate(ref, out=ref)
    known, r0 = ref >= 0, np.maximum(ref, 0)
    state = np.zeros((n, 4))
    state[has] = np.column_stack([cols[li, 4], cols[li, 5], _kv_share(cols[li]),
                                  mode_codes[li]])
    state = np.where(known[:, None], state[r0], before[None, :])
    t_state = np.where(known, np.where(has, cols[last, 1], 0)[r0], before_t)
    return state, t_state


def _gpu_series(snap: TimelineSnapshot, grid: TimeGrid, gpus: GpuColumns | None
                ) -> tuple[dict[str, np.ndarray], dict[int, dict[str, np.ndarray]]]:
    """The GPU means per column, pooled and (with more than one GPU) per GPU."""
    if gpus is None:
        gpus = GpuColumns(max_age_ns=1 << 62)
        gpus.extend(snap)
    per_gpu = gpus.binned_per_gpu(grid) if len(gpus.indices) > 1 else {}
    return gpus.binned(grid), per_gpu


def _latest_step(steps: StepColumns) -> "LatestStep | None":
    """The newest step of ``steps`` for the readouts (None: no step)."""
    if not len(steps):
        return None
    r = steps.ints[-1]
    return LatestStep(int(r[1]), int(r[4]), int(r[5]), int(r[7]), int(r[8]), int(r[2]),
                      int(r[3]), int(r[9]))


def _kv_share(rows: np.ndarray) -> np.ndarray:
    """KV blocks used / total (0–1) of StepColumns rows (0 where the total is unknown)."""
    tot = rows[:, 8].astype(np.float64)
    return np.where(tot > 0, rows[:, 7] / np.maximum(tot, 1), 0.0)


def _modes_in_force(codes: np.ndarray, t_state: np.ndarray, snap: TimelineSnapshot,
                    grid: TimeGrid) -> list[str]:
    """Per column, the mode in force at its end: the mode of the last step before it, unless a
    mode switch took effect after that step (a switch with no step yet, e.g. in a quiet
    stretch, shows the new mode at once). "" where neither is known."""
    out = [_MODES[int(c)] if c == c else "" for c in codes.tolist()]
    ev = snap.events
    j = bisect_left(ev, grid.t1_ns, key=_t_ns)
    i = j
    while i > 0 and ev[i - 1].t_ns >= grid.t0_ns:
        i -= 1
    k = i  # also the last switch before the window (a quiet stretch longer than the window)
    while k > 0 and ev[k - 1].kind != "mode":
        k -= 1
    switches = ([ev[k - 1]] if k > 0 else []) + [e for e in ev[i:j] if e.kind == "mode"]
    n = grid.cols
    for e in switches:
        c0 = max(0, int(grid.col_of(e.t_ns)))
        for c in range(c0, n):
            if t_state[c] < e.t_ns:
                out[c] = str(e.new)
    return out


def event_label(ev: EngineEvent) -> tuple[str, str] | None:
    """(label, kind) for an event drawn on the waveforms; None for ones that are not drawn
    (refused commands, warnings)."""
    if ev.kind == "mode":
        return f"mode→{ev.new}", "mode"
    if ev.kind == "knob":
        return f"{setting_label(ev.name)} {_fmt_knob(ev.name, ev.old)}→{_fmt_knob(ev.name, ev.new)}", "knob"
    if ev.kind in ("pause", "resume"):
        what = "load" if ev.name == "load" else "engine"
        return f"{what} {'paused' if ev.kind == 'pause' else 'resumed'}", "load"
    if ev.kind == "mark":
        name = str(ev.name)
        if name.startswith("ab:"):
            m = parse_mark(name)  # probes/ab.py owns the format
            if m is None:
                return None
            return ("A/B end" if m.label == "end" else f"{m.label}#{m.n}"), "ab"
        phase = parse_phase_mark(name)  # engine_host/vocab/phases.py owns the format
        if phase is not None:
            return phase, "phase"
        return name, "mark"
    return None


def _fmt_knob(name: str, v: Any) -> str:
    if name == "long_prefill_token_threshold" and v == 0:
        return "off"
    if name == AUTO_BUDGET:
        return str(v) or "off"
    return str(v)


def markers_for(events: Sequence[EngineEvent], grid: TimeGrid) -> list[Marker]:
    out: list[Marker] = []
    for ev in events:
        lk = event_label(ev)
        if lk is None:
            continue
        c = grid.col_of(ev.t_ns)
        if 0 <= c < grid.cols:
            out.append(Marker(int(c), lk[0], lk[1], ev.step, ev.t_ns))
    return out


def nice_max(v: float, floor: float = 1.0) -> float:
    """A round axis maximum >= ``v`` (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k), at least
    ``floor``."""
    v = max(float(v) if math.isfinite(v) else 0.0, floor)
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * e >= v:
            return m * e
    return 10 * e
