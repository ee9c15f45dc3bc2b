"""gpuchef's vLLM plugin records as iteration rows: the one owner of what a record means wherever
it is drawn (the attach screen, replay, the report).

A record (``probes.plugin_wire.PluginRecord``, as ``probes.plugin_reader.Received``) is one
``EngineCoreOutputs`` message of one engine that vLLM's API server processed (docs/attach.md,
"What 'per iteration' means in vLLM 0.24"). Per (server, engine_idx) stream,
:class:`IterationBuilder` turns each record that is an engine step's output into an
:class:`Iteration`:

- ``t_ns``: where the batch sits on this process's ``time.monotonic_ns()`` axis. The record's
  ``mono_ns`` (the API server's monotonic clock at ``record()``) keeps the spacing between
  batches exact; the offset to this clock is the smallest ``recv_mono_ns − mono_ns`` seen on
  the stream (the transport delay at its quickest; on one host both clocks are the same one
  and the offset is that delay). Rows never go back in time.
- ``interval_ns``: the API server's time between this output batch and the previous one of the
  same engine (``mono_ns`` difference): front-end time between output batches, not the GPU's
  step time (with async scheduling one step's compute overlaps the last one's output
  processing). -1 where it is not an iteration's length: the first record of a stream (or of
  a restarted vLLM), records lost right before it (``gap``), or the previous batch left the
  engine with nothing to run (running = waiting = 0: the interval holds the idle time until a
  request came).
- ``decode_rows`` = ``len(itls)`` (one ITL per decoding request in the batch);
  ``first_tokens`` = ``len(ttfts)``; ``itl_sum_s``/``itl_max_s``: of those ITLs (seconds; the
  engine core's time since each request's previous output).
- ``prefill_tokens``: with vLLM's ``--cudagraph-metrics`` the tokens the step scheduled minus
  its decode rows and the draft tokens it verified (``cg_unpadded_tokens − decode_rows −
  spec_draft_tokens``: ``prefill_scheduled`` True); without it the prompt tokens of the requests
  whose prefill completed in this batch, whole prompts counted at their last chunk
  (``prompt_tokens``: ``prefill_scheduled`` False).
- ``running``, ``waiting`` (-1: the record had no SchedulerStats), ``kv_usage`` (0–1, NaN:
  none); with async scheduling they were taken after the next step was scheduled.
- ``preempted``, ``finished``, ``generation_tokens``, ``prompt_tokens`` as the record has them.

A record with neither SchedulerStats nor tokens (an aborted request's finish output, a
data-parallel wave notice) is not an engine step: it makes no row and is counted in
``StreamCounts.not_steps``. :class:`IterationLog` holds the rows of every stream of a session,
fed from any thread, read incrementally by the dashboard (:meth:`IterationLog.since`).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from dataclasses import dataclass

from .plugin_reader import Received

NAN = float("nan")
#: rows kept per stream: the dashboard's longest window (10 min) at 160 batches/s
KEEP_ROWS = 100_000


@dataclass(frozen=True, slots=True)
class Iteration:
    """One engine output batch (see the module docstring for each field). Times: ns on this
    process's monotonic clock; ``*_s`` seconds; token and request counts."""

    server: str
    engine_idx: int
    seq: int
    t_ns: int
    interval_ns: int
    decode_rows: int
    first_tokens: int
    prefill_tokens: int
    prefill_scheduled: bool
    prompt_tokens: int
    generation_tokens: int
    running: int
    waiting: int
    kv_usage: float
    preempted: int
    finished: int
    itl_sum_s: float
    itl_max_s: float
    gap: int

    @property
    def key(self) -> tuple[str, int]:
        return self.server, self.engine_idx

    @property
    def tokens(self) -> int:
        """Prefill tokens plus decode rows: the batch's size as the batch panel draws it."""
        return self.prefill_tokens + self.decode_rows


@dataclass
class StreamCounts:
    """What one stream's records were: ``received`` (records that arrived), ``rows``
    (iterations made of them), ``not_steps`` (records that were not an engine step), ``lost``
    (seq numbers skipped before records that arrived), ``dropped`` (of those, the ones the
    publisher said it dropped for this reader: the reader was slow)."""

    received: int = 0
    rows: int = 0
    not_steps: int = 0
    lost: int = 0
    dropped: int = 0


class IterationBuilder:
    """The rows of one (server, engine_idx) stream, one record at a time, in the order the
    reader received them (see the module docstring)."""

    def __init__(self) -> None:
        self.counts = StreamCounts()
        self._offset: int | None = None
        self._pub = 0
        self._prev_mono: int | None = None
        self._prev_idle = False
        self._last_t = 0
        self._gap = 0

    def add(self, got: Received) -> Iteration | None:
        """The row of ``got``, or None when it is not an engine step's output."""
        r = got.record
        c = self.counts
        c.received += 1
        c.lost += got.gap
        c.dropped += got.gap_dropped
        if r.pub != self._pub or (got.restarted and c.received > 1):
            self._offset, self._prev_mono, self._pub = None, None, r.pub  # vLLM restarted
        self._gap += got.gap
        if not r.has_sched and not (r.prompt_tokens or r.generation_tokens or r.itls
                                    or r.ttfts):
            c.not_steps += 1
            return None
        if got.recv_mono_ns:
            d = got.recv_mono_ns - r.mono_ns
            self._offset = d if self._offset is None else min(self._offset, d)
        t = max(r.mono_ns + (self._offset or 0), self._last_t)
        known = self._prev_mono is not None and not self._gap and not self._prev_idle
        interval = r.mono_ns - self._prev_mono if known else -1
        row = _row(got, t, interval, self._gap)
        self._prev_mono, self._last_t, self._gap = r.mono_ns, t, 0
        if r.has_sched:
            self._prev_idle = row.running == 0 and row.waiting == 0
        c.rows += 1
        return row


def _row(got: Received, t_ns: int, interval_ns: int, gap: int) -> Iteration:
    r = got.record
    decode = len(r.itls)
    if r.cg_unpadded_tokens is not None:
        prefill = max(0, r.cg_unpadded_tokens - decode - (r.spec_draft_tokens or 0))
        scheduled = True
    else:
        prefill, scheduled = r.prompt_tokens, False
    return Iteration(
        server=got.server, engine_idx=r.engine_idx, seq=r.seq, t_ns=t_ns,
        interval_ns=max(-1, interval_ns), decode_rows=decode, first_tokens=len(r.ttfts),
        prefill_tokens=prefill, prefill_scheduled=scheduled, prompt_tokens=r.prompt_tokens,
        generation_tokens=r.generation_tokens,
        running=-1 if r.running is None else r.running,
        waiting=-1 if r.waiting is None else r.waiting,
        kv_usage=NAN if r.kv_usage is None else float(r.kv_usage),
        preempted=r.preempted, finished=r.finished, itl_sum_s=float(sum(r.itls)),
        itl_max_s=float(max(r.itls)) if r.itls else NAN, gap=gap)


class IterationLog:
    """The rows of every (server, engine_idx) stream of a session. :meth:`add` from any thread
    (the plugin reader's); :meth:`since` reads a stream's rows incrementally (the dashboard
    keeps how many it has). Each stream keeps its newest ``keep`` rows; rows are numbered from
    0 over the stream's life, so a reader that fell behind the kept rows resumes at the
    oldest kept."""

    def __init__(self, keep: int = KEEP_ROWS) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._builders: dict[tuple[str, int], IterationBuilder] = {}
        self._rows: dict[tuple[str, int], list[Iteration]] = {}
        self._base: dict[tuple[str, int], int] = {}

    def add(self, got: Received) -> Iteration | None:
        """Convert and keep ``got``; returns its row (None: not an engine step)."""
        key = (got.server, got.record.engine_idx)
        with self._lock:
            b = self._builders.get(key)
            if b is None:
                b = self._builders[key] = IterationBuilder()
                self._rows[key], self._base[key] = [], 0
            row = b.add(got)
            if row is not None:
                rows = self._rows[key]
                rows.append(row)
                if len(rows) > 2 * self.keep:  # trim in chunks, not every call
                    cut = len(rows) - self.keep
                    del rows[:cut]
                    self._base[key] += cut
        return row

    def keys(self) -> list[tuple[str, int]]:
        """The streams seen, by server (first seen first), then engine index."""
        with self._lock:
            keys = list(self._builders)
        order = {s: i for i, s in enumerate(dict.fromkeys(k[0] for k in keys))}
        return sorted(keys, key=lambda k: (order[k[0]], k[1]))

    def counts(self, key: tuple[str, int]) -> StreamCounts:
        """A copy of the stream's :class:`StreamCounts` (zeros for a stream not seen)."""
        with self._lock:
            b = self._builders.get(key)
            return StreamCounts(**vars(b.counts)) if b is not None else StreamCounts()

    def since(self, key: tuple[str, int], n: int,
              until_ns: int | None = None) -> tuple[list[Iteration], int]:
        """The stream's rows numbered ``n`` and up (from the oldest kept when ``n`` is older),
        those with ``t_ns <= until_ns`` when given (a replay's position), and the number after
        the last one returned."""
        with self._lock:
            rows = self._rows.get(key, [])
            base = self._base.get(key, 0)
            i = max(0, n - base)
            j = len(rows) if until_ns is None else bisect_right(rows, until_ns, key=_t_ns)
            got = rows[i:j] if j > i else []
        return got, base + i + len(got)

    def rows(self, key: tuple[str, int]) -> list[Iteration]:
        """Every kept row of the stream (a copy)."""
        with self._lock:
            return list(self._rows.get(key, []))


def _t_ns(x: Iteration) -> int:
    return x.t_ns


def iterations_of(records: list[Received]) -> IterationLog:
    """An IterationLog of ``records`` (a trace's ``plugin`` records), fed in the order this
    process received them, as the live session fed its own (replay and the report draw the same
    rows the dashboard drew)."""
    log = IterationLog(keep=max(1, len(records)))
    for got in sorted(records, key=lambda g: g.recv_mono_ns):
        log.add(got)
    return log


__all__ = ["Iteration", "IterationBuilder", "IterationLog", "KEEP_ROWS", "StreamCounts",
           "iterations_of"]
