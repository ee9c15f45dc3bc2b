"""Rolling timelines: bounded ring buffers of everything measured, and steps spread over time bins.

Producers call ``record`` (the host's sink: a loop turn's records) or ``add_step`` /
``add_request`` / ``add_gpu_sample`` / ``add_host_sample`` / ``add_event`` (the samplers): O(1) a
record — an append to a :class:`Ring` under a lock held for microseconds (requests: a
``deque.append``, atomic under the GIL). The UI thread calls :meth:`Timeline.snapshot` (~10
times a second; it copies chunk references, not records, so it never stops the engine thread for
more than microseconds) and computes from the immutable :class:`TimelineSnapshot`: the records
of a time range (``steps_between``, …), the binned step waveform
(:meth:`~TimelineSnapshot.step_waveform`) and GPU sample means per bin
(:meth:`~TimelineSnapshot.sample_waveform`). Latency and throughput definitions are
``probes.metrics``' (vllm bench serve's); nothing is redefined here.

This module owns spreading steps over time bins (:func:`spread_over_bins`, with each step's model
compute capped at its span by :func:`step_compute_ns`): the report's waveform, the dashboard's
step waveform (``tui.plotdata``) and the busy fraction of a time range (:func:`busy_fraction`,
the report's step close-ups) all come from it.

Memory stays flat: every buffer has a maximum length, and finished requests also a budget of
output tokens (their ``token_times_ns`` are most of their size). Defaults keep ~100 MB at most:
65 536 steps (~430 B each), 65 536 GPU samples (~250 B), 16 384 requests / 1 M output tokens
(~40 B a token), 8 192 host samples and events. At 100 steps/s that is the last ~11 minutes of
steps, at 10 Hz × 1 GPU the last ~1.8 hours of GPU samples; the trace file keeps everything.

Window membership (half-open ``[t0, t1)``, monotonic ns): a step by ``t_end_ns``, a sample or
event by ``t_ns``, a request by when it finished (its last token, or its arrival if it has none),
made non-decreasing in arrival order so that it can be searched by bisection.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain, islice
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.sinks import RecordBatch
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord

from .sampler import HostSample
from .metrics import DEFAULT_PERCENTILES
from .nvml import GpuSample

NAN = float("nan")


def _copy(d: deque) -> tuple:
    """An atomic copy of a deque: ``tuple(d)`` runs in C without releasing the GIL; the retry
    only matters on an interpreter without a GIL (a concurrent append raises RuntimeError)."""
    for _ in range(100):
        try:
            return tuple(d)
        except RuntimeError:
            continue
    return tuple(list(d))


class RingView(Sequence):
    """A read-only sequence over a :class:`Ring`'s chunks at one instant: the records of a
    :class:`TimelineSnapshot` stream, oldest first.

    Supports ``len``, indexing (negative too), iteration, ``bisect`` and ``==`` with any sequence;
    a slice with step 1 is another view (no record is copied; it keeps only the chunks it
    covers), any other slice a tuple.
    ``tuple(view)`` copies. Immutable: the chunks are tuples and the view never changes.
    """

    __slots__ = ("_chunks", "_size", "_off", "_len")

    def __init__(self, chunks: tuple[tuple, ...], size: int, off: int, n: int) -> None:
        self._chunks = chunks  # every chunk but the last holds exactly ``size`` records
        self._size = size
        self._off = off        # index of the view's first record in the concatenated chunks
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            a, b, step = i.indices(self._len)
            if step != 1:
                return tuple(self[k] for k in range(a, b, step))
            n = max(0, b - a)
            if n == 0:
                return RingView((), self._size, 0, 0)
            # keep only the chunks it covers: a small slice kept for long (an A/B window's
            # steps) must not pin the whole ring it was cut from
            g = self._off + a
            k0, k1 = g // self._size, (g + n - 1) // self._size
            return RingView(self._chunks[k0:k1 + 1], self._size, g - k0 * self._size, n)
        n = self._len
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("RingView index out of range")
        g = i + self._off
        return self._chunks[g // self._size][g % self._size]

    def __iter__(self):
        if not self._len:
            return iter(())
        k, o = divmod(self._off, self._size)
        return islice(chain.from_iterable(self._chunks[k:]), o, o + self._len)

    def __reversed__(self):
        return (self[i] for i in range(self._len - 1, -1, -1))

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._len and all(x == y for x, y in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RingView({self._len} records)"


class Ring:
    """A bounded buffer of records (oldest dropped first) whose snapshot costs O(chunks), not
    O(records).

    Records go into an open list; every ``chunk`` records it is frozen into a tuple and moved to a
    deque of frozen chunks, and the oldest chunk is dropped once the others hold ``maxlen``. A
    :meth:`view` copies only the references to the frozen chunks and the open list's records
    (``maxlen / chunk + chunk`` references), so a reader never holds the GIL for a copy of every
    record — with full rings of 65 536 records a copy of each ring took 2.4 ms on the H200
    host (benchmarks/bench_timeline.py), during which no other Python thread ran. A lock (held
    for microseconds) orders appends and views; any thread may append.
    """

    __slots__ = ("maxlen", "chunk", "_frozen", "_open", "_lock")

    def __init__(self, maxlen: int, chunk: int | None = None) -> None:
        self.maxlen = int(maxlen)
        self.chunk = int(chunk) if chunk else max(1, min(1024, self.maxlen // 16 or 1))
        self._frozen: deque[tuple] = deque()
        self._open: list = []
        self._lock = threading.Lock()

    def append(self, rec: Any) -> None:
        with self._lock:
            o = self._open
            o.append(rec)
            if len(o) >= self.chunk:
                f = self._frozen
                f.append(tuple(o))
                self._open = []
                while (len(f) - 1) * self.chunk >= self.maxlen:
                    f.popleft()

    def __len__(self) -> int:
        return min(self.maxlen, len(self._frozen) * self.chunk + len(self._open))

    def view(self) -> RingView:
        """The last ``maxlen`` records as an immutable :class:`RingView`."""
        with self._lock:
            chunks = (*self._frozen, tuple(self._open))
        total = (len(chunks) - 1) * self.chunk + len(chunks[-1])
        n = min(total, self.maxlen)
        return RingView(chunks, self.chunk, total - n, n)




@dataclass(frozen=True)
class Waveform:
    """Step activity binned into equal time slices of ``[t0_ns, t1_ns)``.

    ``edges_ns``: int64 (n_bins + 1,), monotonic ns. ``busy``: float64 (n_bins,), share of each
    bin in [0, 1] covered by model compute (each step's ``gpu_ms`` spread evenly over its wall
    span ``[t_start_ns, t_end_ns]``). ``prefill_tokens`` / ``decode_tokens``: float64 (n_bins,),
    tokens computed in each bin (a step's tokens spread evenly over its span, so the sums equal
    the window's totals for steps inside it). ``steps``: int64 (n_bins,), steps that ended in
    each bin. The dashboard's step waveform draws ``busy`` and the prefill/decode split.
    """

    t0_ns: int
    t1_ns: int
    edges_ns: np.ndarray
    busy: np.ndarray
    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    steps: np.ndarray

    @property
    def bin_s(self) -> float:
        return (self.t1_ns - self.t0_ns) / 1e9 / max(1, len(self.busy))


def step_compute_ns(t_start_ns, t_end_ns, gpu_ms) -> np.ndarray:
    """Each step's model compute in ns (float64): its ``gpu_ms``, capped at its wall span (a step
    cannot compute longer than it ran; a zero-length step keeps its ``gpu_ms``)."""
    ts = np.asarray(t_start_ns, dtype=np.int64)
    wall = (np.maximum(np.asarray(t_end_ns, dtype=np.int64), ts) - ts).astype(np.float64)
    gpu = np.asarray(gpu_ms, dtype=np.float64) * 1e6
    return np.minimum(gpu, np.where(wall > 0, wall, gpu))


def spread_over_bins(t_start_ns, t_end_ns, edges_ns, *amounts) -> tuple[np.ndarray, ...]:
    """Each step's ``amounts`` spread evenly over its span ``[t_start_ns, t_end_ns]`` and summed
    per bin of ``edges_ns`` (ascending, n_bins + 1): a 260 ms prefill step covers three 100 ms
    bins, each getting its overlap's share; the sums over bins that cover every step equal the
    totals. One float64 array (n_bins,) per amount.

    Steps in any order. One engine's steps never overlap; should they, each is cut to start where
    the one before it (by start) ended, so that the knots stay sorted. A zero-length span lands in
    the bin holding its end.
    """
    edges = np.asarray(edges_ns, dtype=np.int64)
    n_bins = len(edges) - 1
    ts = np.asarray(t_start_ns, dtype=np.int64)
    if len(ts) == 0:
        return tuple(np.zeros(n_bins) for _ in amounts)
    te = np.maximum(np.asarray(t_end_ns, dtype=np.int64), ts)
    order = np.argsort(ts, kind="stable")
    ts, te = ts[order], te[order]
    te = np.maximum.accumulate(te)
    ts[1:] = np.maximum(ts[1:], te[:-1])
    te = np.maximum(te, ts)
    # each amount's cumulative sum is piecewise linear with knots at the step boundaries, so a
    # bin's share is F(edge1) - F(edge0); times relative to the first edge keep float64 exact
    knots = np.empty(2 * len(ts), dtype=np.int64)
    knots[0::2], knots[1::2] = ts, te
    x = (knots - edges[0]).astype(np.float64)
    xe = (edges - edges[0]).astype(np.float64)
    out = []
    for a in amounts:
        v = np.asarray(a, dtype=np.float64)[order]
        c = np.cumsum(v)
        y = np.empty(len(knots))
        y[0::2] = c - v
        y[1::2] = c
        out.append(np.diff(np.interp(xe, x, y, left=0.0, right=float(c[-1]))))
    return tuple(out)


def busy_fraction(steps: Sequence[StepRecord], t0_ns: int, t1_ns: int) -> float:
    """Share of ``[t0_ns, t1_ns)`` the model computed (0–1): each step's compute
    (:func:`step_compute_ns`) counted for the part of its span inside the range — idle time
    before the first or after the last step counts, unlike ``BenchMetrics.busy_fraction`` (the
    steps' own span). NaN for an empty range."""
    if t1_ns <= t0_ns:
        return NAN
    if not steps:
        return 0.0
    ts = np.fromiter((s.t_start_ns for s in steps), np.int64, len(steps))
    te = np.fromiter((s.t_end_ns for s in steps), np.int64, len(steps))
    gpu = np.fromiter((s.gpu_ms for s in steps), np.float64, len(steps))
    (busy,) = spread_over_bins(ts, te, [t0_ns, t1_ns], step_compute_ns(ts, te, gpu))
    return float(busy[0]) / (t1_ns - t0_ns)


class TimelineSnapshot:
    """An immutable view of a :class:`Timeline` cut at ``t_ns``: sequences, oldest first.

    ``steps``, ``gpu_samples``, ``host_samples``, ``events``: :class:`RingView` (len, index,
    slice, iterate, bisect; ``tuple()`` to copy); ``requests``: a tuple. What the buffers held
    at the cut (records stamped after ``t_ns`` are left out, so streams agree on one instant).
    ``totals``: records ever added per stream (``totals[k] - len(...)`` fell out of the ring).
    ``percentiles``: the timeline's. Cheap to take (tens of µs with full default rings,
    benchmarks/bench_timeline.py), so a UI frame that draws several panels takes one snapshot and
    computes them all from it.
    """

    def __init__(self, t_ns: int, origin_ns: int, steps: Sequence, gpu_samples: Sequence,
                 host_samples: Sequence, req_pairs: tuple, events: Sequence,
                 totals: dict[str, int], percentiles: tuple[float, ...]) -> None:
        self.t_ns = t_ns
        self.origin_ns = origin_ns
        self.steps: Sequence[StepRecord] = steps
        self.gpu_samples: Sequence[GpuSample] = gpu_samples
        self.host_samples: Sequence[HostSample] = host_samples
        self._req_pairs = req_pairs  # ((monotone finish ns, RequestRecord), ...)
        self.events: Sequence[EngineEvent] = events
        self.totals = totals
        self.percentiles = percentiles

    @cached_property
    def requests(self) -> tuple[RequestRecord, ...]:
        return tuple(r for _, r in self._req_pairs)

    # ---- range selection (bisection on each stream's time key) -------------------------------
    def steps_between(self, t0_ns: int, t1_ns: int) -> Sequence[StepRecord]:
        """Steps with ``t0 <= t_end_ns < t1``."""
        s = self.steps
        return s[bisect_left(s, t0_ns, key=_t_end):bisect_left(s, t1_ns, key=_t_end)]

    def gpu_samples_between(self, t0_ns: int, t1_ns: int,
                            gpu: int | None = None) -> Sequence[GpuSample]:
        s = self.gpu_samples
        out = s[bisect_left(s, t0_ns, key=_t):bisect_left(s, t1_ns, key=_t)]
        return out if gpu is None else tuple(x for x in out if x.gpu == gpu)

    def host_samples_between(self, t0_ns: int, t1_ns: int) -> Sequence[HostSample]:
        s = self.host_samples
        return s[bisect_left(s, t0_ns, key=_t):bisect_left(s, t1_ns, key=_t)]

    def events_between(self, t0_ns: int, t1_ns: int) -> Sequence[EngineEvent]:
        s = self.events
        return s[bisect_left(s, t0_ns, key=_t):bisect_left(s, t1_ns, key=_t)]

    def requests_between(self, t0_ns: int, t1_ns: int) -> tuple[RequestRecord, ...]:
        """Requests that finished in ``[t0, t1)`` (see the module docstring)."""
        p = self._req_pairs
        i, j = bisect_left(p, t0_ns, key=_first), bisect_left(p, t1_ns, key=_first)
        return tuple(r for _, r in p[i:j])

    # ---- binning ---------------------------------------------------------------------------
    def step_waveform(self, t0_ns: int, t1_ns: int, n_bins: int) -> Waveform:
        """Bin the steps overlapping ``[t0_ns, t1_ns)`` into ``n_bins`` equal slices.

        Returns a :class:`Waveform`. Raises ConfigError for ``n_bins`` outside [1, 100 000] or
        an empty range.
        """
        t0, t1 = int(t0_ns), int(t1_ns)
        if t1 <= t0:
            raise ConfigError(f"time range [{t0}, {t1}) ns is empty: t1 must be after t0")
        if not (isinstance(n_bins, (int, np.integer)) and 1 <= n_bins <= 100_000):
            raise ConfigError(f"n_bins {n_bins!r} is out of range: allowed [1, 100000]")
        edges = np.linspace(t0, t1, int(n_bins) + 1).astype(np.int64)
        edges[-1] = t1
        s = self.steps
        i = bisect_left(s, t0, key=_t_end)
        sel = []
        for st in s[i:]:
            if st.t_start_ns >= t1:
                break
            sel.append(st)
        ts = np.fromiter((x.t_start_ns for x in sel), np.int64, len(sel))
        te = np.fromiter((x.t_end_ns for x in sel), np.int64, len(sel))
        gpu = step_compute_ns(ts, te, np.fromiter((x.gpu_ms for x in sel), np.float64, len(sel)))
        pre = np.fromiter((x.num_prefill_tokens for x in sel), np.float64, len(sel))
        dec = np.fromiter((x.num_decode_reqs for x in sel), np.float64, len(sel))
        busy_ns, pre_b, dec_b = spread_over_bins(ts, te, edges, gpu, pre, dec)
        bin_ns = np.diff(edges).astype(np.float64)
        busy = np.clip(busy_ns / np.where(bin_ns > 0, bin_ns, 1.0), 0.0, 1.0)
        inside = (te >= t0) & (te < t1)
        idx = np.searchsorted(edges, te[inside], side="right") - 1
        steps = np.bincount(np.clip(idx, 0, n_bins - 1), minlength=n_bins).astype(np.int64)
        return Waveform(t0, t1, edges, busy, pre_b, dec_b, steps)

    def sample_waveform(self, field_name: str, t0_ns: int, t1_ns: int, n_bins: int,
                        gpu: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Mean of a GpuSample field (e.g. "sm_active") per bin of ``[t0, t1)``.

        Returns ``(edges_ns int64 (n_bins+1,), means float64 (n_bins,))``, NaN where a bin has no
        value. ``gpu`` None pools all GPUs. Raises ConfigError for an unknown field.
        """
        if field_name not in GpuSample.__dataclass_fields__ or field_name in ("t_ns", "gpu"):
            raise ConfigError(f"{field_name!r} is not a GPU sample field")
        t0, t1 = int(t0_ns), int(t1_ns)
        if t1 <= t0 or not 1 <= int(n_bins) <= 100_000:
            raise ConfigError(f"bad waveform range [{t0}, {t1}) or n_bins {n_bins!r}")
        edges = np.linspace(t0, t1, int(n_bins) + 1).astype(np.int64)
        edges[-1] = t1
        pts = [(s.t_ns, v) for s in self.gpu_samples_between(t0, t1, gpu)
               if (v := getattr(s, field_name)) is not None]
        if not pts:
            return edges, np.full(n_bins, NAN)
        t = np.fromiter((p[0] for p in pts), np.int64, len(pts))
        v = np.fromiter((p[1] for p in pts), np.float64, len(pts))
        idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, n_bins - 1)
        sums = np.bincount(idx, weights=v, minlength=n_bins)
        cnts = np.bincount(idx, minlength=n_bins)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(cnts > 0, sums / np.maximum(cnts, 1), NAN)
        return edges, means


def _t_end(s: StepRecord) -> int:
    return s.t_end_ns


def _t(s: Any) -> int:
    return s.t_ns


def _first(p: tuple) -> int:
    return p[0]


class Timeline:
    """Bounded ring buffers of steps, finished requests, GPU and host samples and events.

    ``max_steps``, ``max_requests``, ``max_gpu_samples``, ``max_host_samples``, ``max_events``:
    ring lengths (each >= 1). ``max_request_tokens``: budget of output tokens over the kept
    requests (older requests are dropped first). ``percentiles``: the session's percentiles, carried
    on each snapshot (vllm's default 99 plus the median). ``clock``: gives the snapshot time
    (default ``time.monotonic_ns``); ``origin_ns``: session start (default: now).

    Thread-safety: any thread may call the ``add_*`` methods (one producer per stream keeps the
    ``totals`` counts exact, and is required for requests); any thread may take snapshots. The
    rings' locks are held for microseconds (see :class:`Ring`).
    """

    def __init__(self, *, max_steps: int = 65_536, max_requests: int = 16_384,
                 max_request_tokens: int = 1_000_000, max_gpu_samples: int = 65_536,
                 max_host_samples: int = 8_192, max_events: int = 8_192,
                 percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                 clock: Callable[[], int] = time.monotonic_ns,
                 origin_ns: int | None = None) -> None:
        for name, v in (("max_steps", max_steps), ("max_requests", max_requests),
                        ("max_request_tokens", max_request_tokens),
                        ("max_gpu_samples", max_gpu_samples),
                        ("max_host_samples", max_host_samples), ("max_events", max_events)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} {v!r} must be an integer >= 1")
        self.clock = clock
        self.origin_ns = clock() if origin_ns is None else int(origin_ns)
        self.percentiles = tuple(float(p) for p in percentiles)
        self._steps = Ring(max_steps)
        self._gpu = Ring(max_gpu_samples)
        self._host = Ring(max_host_samples)
        self._events = Ring(max_events)
        self._reqs: deque[tuple[int, RequestRecord]] = deque()  # bounded by hand: count + tokens
        self.max_requests = max_requests
        self.max_request_tokens = max_request_tokens
        self._req_tokens = 0
        self._req_key = -(1 << 62)
        self._n = {"step": 0, "request": 0, "gpu_sample": 0, "host_sample": 0, "event": 0}

    # ---- producers ---------------------------------------------------------------------------
    def record(self, batch: RecordBatch) -> None:
        """The host's sink (``engine_host.sinks``): one engine loop turn's steps, finished
        requests and events (its StepOutputs are the front door's, not kept here)."""
        for s in batch.steps:
            self._steps.append(s)
        self._n["step"] += len(batch.steps)
        for r in batch.requests:
            self.add_request(r)
        for e in batch.events:
            self._events.append(e)
        self._n["event"] += len(batch.events)

    def add_step(self, rec: StepRecord) -> None:
        self._steps.append(rec)
        self._n["step"] += 1

    def add_gpu_sample(self, s: GpuSample) -> None:
        self._gpu.append(s)
        self._n["gpu_sample"] += 1

    def add_host_sample(self, s: HostSample) -> None:
        self._host.append(s)
        self._n["host_sample"] += 1

    def add_event(self, ev: EngineEvent) -> None:
        self._events.append(ev)
        self._n["event"] += 1

    def add_request(self, rec: RequestRecord) -> None:
        """Keep a finished request (token ids are dropped to save memory; times are kept)."""
        if rec.output_token_ids:
            rec = replace(rec, output_token_ids=())
        key = rec.closed_ns
        if key < self._req_key:
            key = self._req_key  # keep keys sorted for bisection
        self._req_key = key
        d = self._reqs
        d.append((key, rec))
        self._req_tokens += len(rec.token_times_ns)
        while len(d) > 1 and (len(d) > self.max_requests
                              or self._req_tokens > self.max_request_tokens):
            _, old = d.popleft()
            self._req_tokens -= len(old.token_times_ns)
        self._n["request"] += 1

    def add(self, rec: Any) -> None:
        """Dispatch any record to its buffer (for replaying a trace). TypeError for others."""
        fn = self._dispatch.get(type(rec))
        if fn is None:
            raise TypeError(f"Timeline cannot keep a {type(rec).__name__}")
        fn(self, rec)

    _dispatch: dict[type, Callable[["Timeline", Any], None]] = {
        StepRecord: add_step, RequestRecord: add_request, GpuSample: add_gpu_sample,
        HostSample: add_host_sample, EngineEvent: add_event,
    }

    # ---- readers -----------------------------------------------------------------------------
    @property
    def totals(self) -> dict[str, int]:
        return dict(self._n)

    def __len__(self) -> int:
        return len(self._steps) + len(self._gpu) + len(self._host) + len(self._events) + \
            len(self._reqs)

    def snapshot(self, now_ns: int | None = None) -> TimelineSnapshot:
        """A consistent immutable view cut at ``now_ns`` (default: the clock now)."""
        t = self.clock() if now_ns is None else int(now_ns)
        steps = _cut(self._steps.view(), t, _t_end)
        gpu = _cut(self._gpu.view(), t, _t)
        host = _cut(self._host.view(), t, _t)
        events = _cut(self._events.view(), t, _t)
        reqs = _cut(_copy(self._reqs), t, _first)
        return TimelineSnapshot(t, self.origin_ns, steps, gpu, host, reqs, events,
                                dict(self._n), self.percentiles)

    def step_waveform(self, t0_ns: int, t1_ns: int, n_bins: int) -> Waveform:
        """``snapshot().step_waveform(t0_ns, t1_ns, n_bins)``."""
        return self.snapshot().step_waveform(t0_ns, t1_ns, n_bins)


def _cut(items: Sequence, t: int, key: Callable[[Any], int]) -> Sequence:
    """Drop the tail stamped after ``t`` (appended between the clock read and the copy)."""
    if not items or key(items[-1]) <= t:
        return items
    return items[:bisect_left(items, t + 1, key=key)]
