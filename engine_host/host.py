"""EngineHost: the engine's step loop in a background thread, fed by a load schedule and steered
by commands that take effect between steps.

Everything the host emits — StepRecord, StepOutput (each step's new tokens), RequestRecord,
EngineEvent — is gathered over one loop turn and handed to its sinks as one ``RecordBatch``
(``engine_host.sinks``), in the order emitted: the commands applied before the step, the step,
its outputs, then the requests that finished in it. Sinks are called on the engine thread, in
the order of the list, and must be cheap (append to a ring buffer or a queue). The host never
knows who listens. The engine in its own process (``core_proc``) runs this same host with one
sink, the sender of its record stream, so both deliver the same batches.

Usage::

    host = EngineHost(engine, sinks=[timeline, recorder])
    host.set_workload(generate(workload_cfg))
    host.start()
    host.set_knob("max_num_batched_tokens", 512)   # validated now, in force from the next step
    host.wait_done(); host.stop()
"""

from __future__ import annotations

import heapq
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from .vocab.config import AUTO_BUDGET, parse_value
from .vocab.errors import ConfigError
from .contract import Engine
from .vocab.records import EngineEvent, RequestRecord
from .sinks import RecordBatch, RecordSink
from .request import SamplingParams
from .scheduler import Scheduler

# vLLM runs its engine core in another process to keep the GIL away from it; gpuchef hosts it
# in-process, and a short switch interval gives the engine thread the GIL back promptly after
# each synchronize (beside a busy UI thread: 61 % → 87 % of the engine's steps/s alone).
DEFAULT_SWITCH_INTERVAL_S = 0.0005


@dataclass(frozen=True)
class _Command:
    kind: str  # "set", "pause", "resume", "pause_load", "resume_load", "mark", "abort"
    changes: tuple[tuple[str, Any], ...] = ()
    label: str = ""
    source: str = ""  # who asked ("http" for the knob endpoint; "" the dashboard or a command)


@dataclass(frozen=True)
class _Arrival:
    """A request due at ``arrival_ns`` (monotonic ns), from the workload or ``submit``."""

    arrival_ns: int
    seq: int
    request_id: str
    prompt_token_ids: Sequence[int]  # materialised only when the request is admitted
    sampling: SamplingParams
    load: bool = True  # part of the load: held while the load is paused (False: e.g. HTTP)

    def __lt__(self, other: "_Arrival") -> bool:
        return (self.arrival_ns, self.seq) < (other.arrival_ns, other.seq)


class EngineHost:
    """Runs ``engine.step()`` in a daemon thread; thread-safe ``submit`` and commands.

    Commands are validated in the caller's thread (ConfigError naming the value and the allowed
    range; nothing changes) and applied by the engine thread before the next step, which the
    EngineEvent names. Requests the engine refuses (too long, bad ids) become RequestRecords
    with ``finish_reason="error"`` plus an "error" event; the others go on.
    """

    def __init__(self, engine: Engine, *, sinks: Sequence[RecordSink] = (),
                 on_flush: Callable[[], None] | None = None,
                 switch_interval_s: float | None = DEFAULT_SWITCH_INTERVAL_S) -> None:
        self.engine = engine
        #: the record stream's consumers, each given every loop turn's batch, in this order
        self.sinks = tuple(sinks)
        #: called on the engine thread at the end of every loop turn, after the turn's batch (if
        #: any) went to the sinks: the engine process sends the host's status with it there
        self.on_flush = on_flush
        self._buf: list[Any] = []  # this turn's records; one append each (atomic)
        self.switch_interval_s = switch_interval_s
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._arrivals: list[_Arrival] = []  # heap, engine thread only after start
        self._incoming: queue.SimpleQueue[_Arrival] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._seq_lock = threading.Lock()
        self.paused = False
        self.load_paused = False
        self._load_paused_at = 0
        self.workload_total = 0
        self.submitted = 0
        self.error: BaseException | None = None
        self.t0_ns = 0
        #: (running, waiting, KV blocks used, KV blocks total) after the latest step or abort,
        #: replaced whole (one reference: safe to read from any thread); None before any.
        self.state: tuple[int, int, int, int] | None = None
        sched = getattr(engine, "scheduler", None)
        if isinstance(sched, Scheduler):  # the autopilot's status lines, as events
            sched.notify = lambda kind, msg: self._emit(kind, AUTO_BUDGET, message=msg)

    # -- load ------------------------------------------------------------------------------
    def set_workload(self, specs: Iterable[Any], t0_ns: int | None = None) -> None:
        """Schedule workload requests (objects with ``request_id``, ``arrival_s``,
        ``prompt_token_ids``, ``output_len``) at ``t0_ns + arrival_s``; ``t0_ns`` defaults to
        the moment the host starts. Each is replayed with greedy sampling, ``ignore_eos`` and its
        forced output length. Call before ``start``."""
        self._pending_specs = list(specs)
        self._pending_t0 = t0_ns
        self.workload_total += len(self._pending_specs)

    def submit(self, request_id: str, prompt_token_ids: Iterable[int],
               sampling: SamplingParams | None = None, arrival_ns: int | None = None, *,
               load: bool = True) -> None:
        """Queue one request from any thread; it reaches the engine before the next step.
        ``load`` False: not part of the load (a request from the HTTP front door), so a paused
        load does not hold it."""
        a = _Arrival(arrival_ns if arrival_ns is not None else time.monotonic_ns(),
                     self._next_seq(), request_id, tuple(prompt_token_ids),
                     sampling or SamplingParams(), load)
        self._done.clear()
        self._incoming.put(a)
        self._wake.set()

    def _next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    # -- commands --------------------------------------------------------------------------
    def set_knob(self, name: str, value: Any, source: str = "") -> Any:
        """Validate now, apply between steps. Returns the parsed value; raises ConfigError.
        ``source`` goes into the change's EngineEvent (e.g. "http")."""
        v = parse_value(name, value)
        self._check_engine_limits({name: v})
        self._command(_Command("set", ((name, v),), source=source))
        return v

    def set_config(self, source: str = "", **changes: Any) -> dict[str, Any]:
        """Several knobs (and/or ``mode``) at once, in force from the same step."""
        parsed = {k: parse_value(k, v) for k, v in changes.items()}
        self._check_engine_limits(parsed)
        self._command(_Command("set", tuple(parsed.items()), source=source))
        return parsed

    def _check_engine_limits(self, changes: dict[str, Any]) -> None:
        # A bad change, and one an engine with narrower live ranges refuses (vLLM: budget and
        # max_num_seqs at most their start-up values), is refused now, in the caller's thread.
        cfg = self.engine.scheduler_config.with_changes(**changes)
        self.engine.validate_scheduler_config(cfg)

    def set_auto_budget(self, spec: Any) -> str:
        """Turn the autopilot on with targets ``spec`` (``itl_p99:50ms[,ttft_p99:2s]``, or an
        AutoBudgetSpec) or off (None, "" or "off"), from the next step. Recorded as a knob
        event (name "auto_budget"). Returns the canonical spec ("" = off); raises ConfigError
        for bad targets (nothing changes)."""
        return self.set_knob(AUTO_BUDGET, "" if spec is None else spec)

    def set_mode(self, mode: str) -> str:
        return self.set_knob("mode", mode)

    def pause(self) -> None:
        """Stop stepping (queued requests wait; their latency keeps counting)."""
        self._command(_Command("pause"))

    def resume(self) -> None:
        self._command(_Command("resume"))

    def pause_load(self) -> None:
        """Stop new arrivals; on resume the rest of the schedule is shifted by the pause."""
        self._command(_Command("pause_load"))

    def resume_load(self) -> None:
        self._command(_Command("resume_load"))

    def mark(self, label: str) -> None:
        """Put a labelled mark (e.g. an A/B window edge) at the next step."""
        self._command(_Command("mark", label=label))

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Stop a request (queued or running) before the next step; its KV blocks are freed then
        and its RequestRecord (``finish_reason`` = ``reason``) goes to the sinks. A request
        still waiting for its arrival time is dropped the same way. Unknown ids are ignored."""
        self._command(_Command("abort", (("reason", reason),), label=request_id))

    def _command(self, c: _Command) -> None:
        self._commands.put(c)
        self._wake.set()

    # -- thread ----------------------------------------------------------------------------
    def start(self, t0_ns: int | None = None) -> None:
        """Start the engine thread. ``t0_ns``: the session's clock origin (monotonic ns, which
        is one clock for every process of a machine); default now."""
        if self._thread is not None:
            raise RuntimeError("EngineHost already started")
        if self.switch_interval_s:
            sys.setswitchinterval(self.switch_interval_s)
        self.t0_ns = time.monotonic_ns() if t0_ns is None else int(t0_ns)
        specs = getattr(self, "_pending_specs", [])
        t0 = self._pending_t0 if getattr(self, "_pending_t0", None) is not None else self.t0_ns
        for s in specs:
            heapq.heappush(self._arrivals, _Arrival(
                t0 + int(s.arrival_s * 1e9), self._next_seq(), s.request_id,
                s.prompt_token_ids,
                SamplingParams(max_tokens=max(1, int(s.output_len)), ignore_eos=True)))
        self._pending_specs = []
        self._thread = threading.Thread(target=self._run, name="gpuchef-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0, *, abort_remaining: bool = False,
             abort_reason: str = "abort") -> None:
        """Stop after the current step and join the thread. ``abort_remaining``: then abort
        the requests still in the engine (a session closing), each RequestRecord
        (finish_reason ``abort_reason``) to the sinks, as one batch."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if abort_remaining and (self._thread is None or not self._thread.is_alive()):
            for rid in list(self.engine.requests):
                rec = self.engine.abort(rid, abort_reason)
                if rec is not None:
                    self._buf.append(rec)
            self._note_state()
            self._deliver()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until every request given so far (workload and ``submit``) has finished, or
        the loop died. True if done."""
        return self._done.wait(timeout)

    @property
    def step_id(self) -> int:
        return self.engine.step_id

    @property
    def scheduler_config(self):
        return self.engine.scheduler_config

    def _emit(self, kind: str, name: str = "", old: Any = None, new: Any = None,
              message: str = "", source: str = "") -> None:
        self._buf.append(EngineEvent(kind, self.engine.step_id, time.monotonic_ns(), name, old,
                                     new, message, source))

    def _apply(self, c: _Command) -> None:
        eng = self.engine
        if c.kind == "set":
            old = eng.scheduler_config
            try:
                new = old.with_changes(**dict(c.changes))
            except ConfigError as e:
                self._emit("error", message=str(e), source=c.source)
                return
            try:
                eng.set_scheduler_config(new)
            except ConfigError as e:  # the engine refused it (e.g. a limit it has live)
                self._emit("error", message=str(e), source=c.source)
                return
            for k, v in c.changes:
                prev = getattr(old, k)
                if prev != v:
                    self._emit("mode" if k == "mode" else "knob", k, prev, v, source=c.source)
        elif c.kind == "pause":
            if not self.paused:
                self.paused = True
                self._emit("pause", "engine")
        elif c.kind == "resume":
            if self.paused:
                self.paused = False
                self._emit("resume", "engine")
        elif c.kind == "pause_load":
            if not self.load_paused:
                self.load_paused = True
                self._load_paused_at = time.monotonic_ns()
                self._emit("pause", "load")
        elif c.kind == "resume_load":
            if self.load_paused:
                shift = time.monotonic_ns() - self._load_paused_at
                self._arrivals = [_Arrival(a.arrival_ns + shift, a.seq, a.request_id,
                                           a.prompt_token_ids, a.sampling, a.load)
                                  if a.load else a for a in self._arrivals]
                heapq.heapify(self._arrivals)
                self.load_paused = False
                self._emit("resume", "load")
        elif c.kind == "mark":
            self._emit("mark", c.label)
        elif c.kind == "abort":
            reason = dict(c.changes).get("reason", "abort")
            rec = eng.abort(c.label, reason)
            if rec is None:  # not admitted yet: drop it from the arrivals
                self._drain_incoming()
                for i, a in enumerate(self._arrivals):
                    if a.request_id == c.label:
                        self._arrivals.pop(i)
                        heapq.heapify(self._arrivals)
                        self.submitted += 1  # counted as handled, so wait_done can finish
                        # before its arrival time it never arrived: withdrawn (ended_ns earlier)
                        rec = RequestRecord(a.request_id, a.arrival_ns, len(a.prompt_token_ids), 0,
                                            (), reason, max_tokens=a.sampling.max_tokens,
                                            ended_ns=time.monotonic_ns())
                        break
            if rec is not None:
                self._note_state()
                self._buf.append(rec)

    def _drain_incoming(self) -> None:
        while True:
            try:
                heapq.heappush(self._arrivals, self._incoming.get_nowait())
            except queue.Empty:
                break

    def _admit_due(self, now: int) -> None:
        self._drain_incoming()
        # a paused load stops the load's arrivals from the pause on; requests that arrived
        # before it still run, and requests that are not part of the load (HTTP) go on
        held: list[_Arrival] = []
        admitted = False
        paused_at = self._load_paused_at if self.load_paused else None
        while self._arrivals and self._arrivals[0].arrival_ns <= now:
            a = heapq.heappop(self._arrivals)
            if paused_at is not None and a.load and a.arrival_ns > paused_at:
                held.append(a)
                continue
            self.submitted += 1
            admitted = True
            try:
                self.engine.add_request(a.request_id, a.prompt_token_ids, a.sampling, a.arrival_ns)
            except ConfigError as e:
                self._emit("error", a.request_id, message=str(e))
                self._buf.append(RequestRecord(
                    a.request_id, a.arrival_ns, len(a.prompt_token_ids), 0, (), "error",
                    max_tokens=a.sampling.max_tokens, error=str(e)))
        for a in held:
            heapq.heappush(self._arrivals, a)
        if admitted:  # the queue the surfaces show counts it now, not at the next step's end
            self._note_state()

    def _note_state(self) -> None:
        e = self.engine
        try:
            u = e.kv.usage()
            self.state = (e.num_running, e.num_waiting, u.used, u.total)
        except AttributeError:  # an engine without these: the step records still say it
            pass

    def _report(self, res: Any) -> None:
        r = res.record
        if r is not None:
            self.state = (r.num_running, r.num_waiting, r.kv_blocks_used, r.kv_blocks_total)
            self._buf.append(r)
        out = res.output
        if out is not None:
            self._buf.append(out)
        self._buf.extend(res.finished)

    def _deliver(self) -> None:
        """This turn's records, if any, to every sink as one batch, in the sinks' order."""
        if self._buf:
            batch = RecordBatch(self._buf)
            self._buf = []
            for s in self.sinks:
                s.record(batch)

    def _turn_end(self) -> None:
        self._deliver()
        if self.on_flush is not None:
            self.on_flush()

    def _run(self) -> None:
        eng = self.engine
        flush = self._turn_end
        try:
            while not self._stop.is_set():
                while True:
                    try:
                        self._apply(self._commands.get_nowait())
                    except queue.Empty:
                        break
                self._admit_due(time.monotonic_ns())
                if self.paused and eng.has_step_in_flight:
                    self._report(eng.drain())  # async scheduling: the launched step still reports
                    flush()
                    continue
                if self.paused or not eng.has_unfinished():
                    if not eng.has_unfinished() and not self._arrivals and self._incoming.empty() \
                            and self.submitted >= self.workload_total:
                        self._done.set()
                    flush()
                    timeout = 0.05
                    if self._arrivals and not self.load_paused and not self.paused:
                        timeout = min(timeout, max(0.0, (self._arrivals[0].arrival_ns
                                                         - time.monotonic_ns()) / 1e9))
                    self._wake.wait(timeout)
                    self._wake.clear()
                    continue
                res = eng.step()
                self._report(res)
                flush()
                if res.record is None:  # nothing could be scheduled (all blocked): don't spin
                    self._wake.wait(0.001)
                    self._wake.clear()
            flush()
        except BaseException as e:  # surface, don't swallow: the UI shows it
            self.error = e
            self._emit("error", "engine", message=f"engine thread died: {type(e).__name__}: {e}")
            self._done.set()
            flush()
            raise
