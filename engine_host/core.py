"""The engine core in a process of its own, as vLLM V1 runs its EngineCore (``EngineCoreProc``
beside ``EngineCoreClient``, vllm/v1/engine/core.py and core_client.py).

Why: the engine thread is Python that gives the GIL up around every CUDA wait. Any other
Python thread of the same process (an HTTP bridge pickling records, a dashboard, a trace
writer) takes it then and holds it up to the interpreter's switch interval, and the engine's
steps stretch (measured on an H100: TPOT under ``gpuchef serve`` was 2.2× the in-process
engine's when the bridge lived beside the engine). So the engine runs alone:

* **engine process** (``core_proc.engine_main``, ``EngineCoreProc``): builds the engine, then
  runs an ``EngineHost`` loop (scheduler + runner + async pipeline) whose one sink queues each
  loop turn's ``RecordBatch`` for sending. Its two other threads are I/O:
  the *input* thread is blocked in ``zmq`` ``recv`` with the GIL released and turns each
  message into the host call it names; the *output* thread encodes each batch with msgspec
  (C, no per-record Python) and sends it (GIL released).
* **client** (this module: ``RemoteEngine`` / ``EngineCoreClient``, in the caller's process): the
  engine's facts (model, device, KV cache, limits) for the surfaces, and a host with
  ``EngineHost``'s API whose sinks (``engine_host.sinks.RecordSink``: trace recorder, timeline,
  front door, /metrics, load results, A/B) a receiver thread hands each decoded batch, in the
  order of the list — the same batches an in-thread ``EngineHost`` would deliver.

The wire (``core_wire``): ZMQ PUSH/PULL over ``ipc://`` sockets in a private temporary folder
(the client binds the output socket, the engine binds the input socket), msgpack by msgspec.
One ``OutBatch`` per engine loop turn that emitted anything or changed the host's status;
inputs are tagged ``msgspec.Struct`` messages. Clock: ``time.monotonic_ns()`` is
CLOCK_MONOTONIC, one clock for all processes of a machine, so record times need no
translation.

Errors: a start-up failure (bad model folder, vLLM missing) is the ConfigError of the engine
process, raised here with its one line; a crash of the engine process afterwards (killed, a
segfault) sets ``host.error`` and sends one "error" EngineEvent naming it to the sinks (a batch
of its own), and ``wait_done`` returns.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import msgspec

from .vocab.errors import ConfigError
from .vocab.config import EngineConfig, SchedulerConfig, parse_value
from .core_proc import SUBSCRIBER_HWM, engine_facts, engine_main
from .core_wire import (Command, NewHost, OutBatch, Shutdown, Start, Stop, Submit, Subscribe,
                        Workload, batch_records, record_batch)
from .sinks import RecordBatch, RecordSink
from .vocab.records import EngineEvent
from .request import SamplingParams

#: how long the client waits for the engine process to build the engine (s): a first vLLM
#: start-up compiles for minutes (../gpu/README: ~4.5 min on an H100)
START_TIMEOUT_S = 1800.0
#: how often the receiver looks whether the engine process is still alive when nothing arrives
LIVENESS_POLL_MS = 200

# ---- the engine's facts, as the client's process sees them -------------------------------------

@dataclass(frozen=True)
class _Backend:
    name: str


@dataclass(frozen=True)
class KVUsage:
    used: int
    total: int


class _KV:
    def __init__(self, owner: "RemoteEngine", block_size: int) -> None:
        self._owner = owner
        self.block_size = block_size

    def usage(self) -> KVUsage:
        st = self._owner.state
        return KVUsage(st[2], st[3]) if st else KVUsage(0, self._owner.num_blocks)


def device_name(engine: Any) -> str:
    """The GPU's name for a trace's meta ("" on a CPU), without touching CUDA in a process
    that does not run the engine."""
    name = getattr(engine, "device_name", None)
    if name is not None:
        return name
    if engine.device.type != "cuda":
        return ""
    import torch

    return torch.cuda.get_device_name(engine.device)


# ---- the client --------------------------------------------------------------------------------

class EngineProcessError(RuntimeError):
    """The engine process died or its engine thread raised; the message says how."""


class RemoteEngine:
    """An engine running in its own process, as the client's process sees it: the read-only
    facts of the ``contract.Engine`` protocol (``config``, ``device``, ``dtype``, ``loaded``,
    ``model_config``, ``max_model_len``, ``num_blocks``, ``kv``, ``attn``, ``engine_name``,
    ``tensor_parallel_size``, ``async_scheduling``, ``scheduler_config``, ``step_id``) kept up to
    date from the record stream, and ``new_host(...)``, the ``EngineHost`` that drives it.

    ``RemoteEngine.spawn(cfg)`` starts the process and blocks until the engine is built.
    ``close()`` shuts the process down (idempotent).
    """

    def __init__(self, proc: Any, ctx: Any, push: Any, pull: Any, tmpdir: str,
                 facts: dict[str, Any]) -> None:
        import torch

        self._proc = proc
        self._ctx = ctx
        self._push = push
        self._pull = pull
        self._tmpdir = tmpdir
        self._send_lock = threading.Lock()
        self._enc = msgspec.msgpack.Encoder()
        self.config: EngineConfig = facts["config"]
        self.device = torch.device(facts["device"])
        self.dtype = getattr(torch, facts["dtype"])
        self.loaded = facts["loaded"]
        self.model_config = facts["model_config"]
        self.max_model_len: int = facts["max_model_len"]
        self.num_blocks: int = facts["num_blocks"]
        self.kv = _KV(self, facts["block_size"])
        self.attn = _Backend(facts["attn"])
        self.decode_attention = facts["decode_attention"]
        self.kernels = facts["kernels"]
        self.engine_name: str = facts["engine_name"]
        self.tensor_parallel_size: int = facts["tensor_parallel_size"]
        self.async_scheduling: bool = facts["async_scheduling"]
        self.scheduler_config: SchedulerConfig = facts["scheduler_config"]
        self.step_id: int = facts["step_id"]
        self.live_limits: dict[str, int] | None = facts["live_limits"]
        self.device_name: str = facts["device_name"]
        self.requests: dict[str, Any] = {}  # the engine's requests live in its process
        #: (running, waiting, KV blocks used, KV blocks total) after the latest step
        self.state: tuple[int, int, int, int] | None = None
        self.pid = proc.pid
        self._host: EngineCoreClient | None = None
        self._host_ids = 0
        self._closed = False
        self.error = ""
        self._rx = threading.Thread(target=self._receive, name="gpuchef-engine-rx", daemon=True)
        self._rx.start()

    # -- start-up ----------------------------------------------------------------------------
    @classmethod
    def spawn(cls, cfg: EngineConfig, progress: Callable[[str, int, int], None] | None = None,
              timeout_s: float = START_TIMEOUT_S) -> "RemoteEngine":
        """Start the engine process for ``cfg`` and wait until its engine is built.
        ``progress(stage, done, total)``: the engine's start-up stages, as ``make_engine``
        reports them. Raises ConfigError with the engine process's one line when it cannot
        build the engine (or when it dies or does not answer within ``timeout_s``)."""
        import multiprocessing as mp

        import zmq

        tmpdir = tempfile.mkdtemp(prefix="gpuchef-engine-")
        in_addr = f"ipc://{os.path.join(tmpdir, 'in')}"
        out_addr = f"ipc://{os.path.join(tmpdir, 'out')}"
        ctx = zmq.Context(io_threads=1)
        pull = ctx.socket(zmq.PULL)
        pull.bind(out_addr)
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(in_addr)
        mpc = mp.get_context("spawn")  # no fork: CUDA and threads do not survive one
        parent, child = mpc.Pipe(duplex=False)
        # not a daemon: vLLM's engine may start worker processes of its own (tensor
        # parallelism), which a daemonic process may not; an exit hook shuts it down instead,
        # and the engine process leaves by itself when this one is gone
        proc = mpc.Process(target=engine_main, args=(child, cfg, in_addr, out_addr),
                           name="gpuchef-engine", daemon=False)

        def fail(msg: str) -> ConfigError:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            push.close(linger=0)
            pull.close(linger=0)
            ctx.term()
            shutil.rmtree(tmpdir, ignore_errors=True)
            return ConfigError(msg)

        proc.start()
        child.close()
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise fail(f"the engine process did not build the engine within {timeout_s:g} s")
            try:
                if not parent.poll(min(left, 1.0)):
                    if not proc.is_alive():
                        raise fail(f"the engine process exited while starting ({exit_how(proc)})")
                    continue
                msg = parent.recv()
            except (EOFError, OSError):
                raise fail(f"the engine process exited while starting ({exit_how(proc)})") \
                    from None
            if msg[0] == "progress":
                if progress is not None:
                    progress(*msg[1:])
            elif msg[0] == "error":
                raise fail(msg[1])
            else:
                parent.close()
                eng = cls(proc, ctx, push, pull, tmpdir, msg[1])
                import atexit
                import weakref

                ref = weakref.ref(eng)
                atexit.register(lambda: (e := ref()) is not None and e.close(timeout=10.0))
                return eng

    # -- the contract's read side --------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return self.state[0] if self.state else 0

    @property
    def num_waiting(self) -> int:
        return self.state[1] if self.state else 0

    def has_unfinished(self) -> bool:
        return bool(self.state and (self.state[0] or self.state[1]))

    def validate_scheduler_config(self, cfg: SchedulerConfig) -> None:
        """Raise ConfigError if the engine cannot take ``cfg`` live (vLLM: a budget or
        max_num_seqs above its start-up value, ``vllm_mapping.check_live_knobs``)."""
        if self.live_limits:
            from .vllm_mapping import check_live_knobs

            check_live_knobs(cfg, **self.live_limits)

    # -- hosts -----------------------------------------------------------------------------------
    def new_host(self, sinks: Sequence[RecordSink] = ()) -> "EngineCoreClient":
        """A fresh host for the engine (the previous one, if any, must be stopped): the
        ``EngineHost`` API, its ``sinks`` called on this process's receiver thread."""
        if self._closed:
            raise EngineProcessError(self.error or "the engine process is closed")
        self._host_ids += 1
        h = EngineCoreClient(self, self._host_ids, sinks)
        self._host = h
        self._send(NewHost(h.host_id))
        return h

    def subscribe(self, addr: str, on: bool = True) -> None:
        """Have the engine process send its record stream to ``addr`` (a ZMQ PULL socket's
        ``ipc://`` or ``tcp://`` address, e.g. the HTTP server's process) as well, from the
        next batch on, as the same encoded ``OutBatch`` frames; ``on`` False stops it. Frames
        for a subscriber that stops reading are dropped once SUBSCRIBER_HWM are queued: it
        never holds the engine or this process's stream back."""
        self._send(Subscribe(addr, on))

    def _send(self, msg: Any) -> None:
        with self._send_lock:
            self._push.send(self._enc.encode(msg), copy=False)

    def _receive(self) -> None:
        import zmq

        dec = msgspec.msgpack.Decoder(OutBatch)
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while True:
            try:
                ready = poller.poll(LIVENESS_POLL_MS)
            except zmq.ZMQError:
                return
            if not ready:
                if self._closed:
                    return
                if not self._proc.is_alive():
                    self._died(f"the engine process is gone ({exit_how(self._proc)})")
                    return
                continue
            try:
                frame = self._pull.recv(copy=False)
            except zmq.ZMQError:
                return
            b = dec.decode(frame.buffer)
            self._apply(b)

    def _apply(self, b: OutBatch) -> None:
        if b.state is not None:
            self.state = tuple(b.state)
        self.step_id = b.step_id
        if b.sched is not None:
            self.scheduler_config = b.sched
        h = self._host
        if h is None or h.host_id != b.host:
            return
        h._receive(b)

    def _died(self, msg: str) -> None:
        self.error = msg
        h = self._host
        if h is not None:
            h._engine_died(msg)

    def close(self, timeout: float = 30.0) -> None:
        """Shut the engine process down (its engine releases what it holds) and wait for it;
        killed after ``timeout`` s. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._proc.is_alive():
            try:
                self._send(Shutdown())
            except Exception:  # noqa: BLE001 - the process may be gone already
                pass
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
        self._rx.join(2)
        self._push.close(linger=0)
        self._pull.close(linger=0)
        self._ctx.term()
        shutil.rmtree(self._tmpdir, ignore_errors=True)


def exit_how(proc: Any) -> str:
    """How a ``multiprocessing`` process ended, for one-line messages: "killed by SIGKILL",
    "exit code 1", or "still running" (``exitcode`` None)."""
    code = proc.exitcode
    if code is None:
        return "still running"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class EngineCoreClient:
    """``EngineHost``'s API for an engine in its own process (``RemoteEngine.new_host``).

    Requests and commands are messages to the engine process, applied there between steps in
    the order sent. Knob changes are validated here first (ConfigError naming the value and the
    allowed range; nothing is sent). ``sinks`` get each loop turn's ``RecordBatch`` on the
    receiver thread, in the order of the list (the same batches an in-thread ``EngineHost``
    delivers; a status-only turn delivers none). ``state``, ``step_id``, ``scheduler_config``,
    ``paused``, ``load_paused``: the latest the engine sent. ``error``: the engine thread's
    exception, or an EngineProcessError once the engine process is gone.
    """

    def __init__(self, engine: RemoteEngine, host_id: int,
                 sinks: Sequence[RecordSink] = ()) -> None:
        self.engine = engine
        self.host_id = host_id
        self.sinks = tuple(sinks)
        self.error: BaseException | None = None
        self.paused = False
        self.load_paused = False
        self.t0_ns = 0
        self.workload_total = 0
        self.submitted = 0  # requests this host sent (workload + submit)
        self._engine_submitted = 0
        self._engine_done = False
        self._done = threading.Event()
        self._final = threading.Event()
        self._started = False
        self._stopped = False
        self._sink_failed = False

    @property
    def state(self) -> tuple[int, int, int, int] | None:
        return self.engine.state

    @property
    def step_id(self) -> int:
        return self.engine.step_id

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self.engine.scheduler_config

    # -- load ---------------------------------------------------------------------------------
    def set_workload(self, specs: Iterable[Any], t0_ns: int | None = None) -> None:
        """As ``EngineHost.set_workload``: call before ``start``."""
        rows = [(s.request_id, float(s.arrival_s), list(s.prompt_token_ids), int(s.output_len))
                for s in specs]
        self.workload_total += len(rows)
        self.submitted += len(rows)
        self.engine._send(Workload(rows, t0_ns))

    def submit(self, request_id: str, prompt_token_ids: Iterable[int],
               sampling: SamplingParams | None = None, arrival_ns: int | None = None, *,
               load: bool = True) -> None:
        """As ``EngineHost.submit``; the arrival time is taken here, when not given."""
        self._done.clear()
        self.submitted += 1
        self.engine._send(Submit(request_id, list(prompt_token_ids), sampling or SamplingParams(),
                                 time.monotonic_ns() if arrival_ns is None else arrival_ns,
                                 load))

    # -- commands -----------------------------------------------------------------------------
    def _cmd(self, kind: str, *args: Any, **kwargs: Any) -> None:
        self.engine._send(Command(kind, list(args), kwargs))

    def _check(self, changes: dict[str, Any]) -> dict[str, Any]:
        parsed = {k: parse_value(k, v) for k, v in changes.items()}
        cfg = self.engine.scheduler_config.with_changes(**parsed)
        self.engine.validate_scheduler_config(cfg)
        return parsed

    def set_knob(self, name: str, value: Any, source: str = "") -> Any:
        v = self._check({name: value})[name]
        self._cmd("set_config", source=source, **{name: v})
        return v

    def set_config(self, source: str = "", **changes: Any) -> dict[str, Any]:
        parsed = self._check(changes)
        self._cmd("set_config", source=source, **parsed)
        return parsed

    def set_auto_budget(self, spec: Any) -> str:
        from .vocab.config import AUTO_BUDGET

        return self.set_knob(AUTO_BUDGET, "" if spec is None else spec)

    def set_mode(self, mode: str) -> str:
        return self.set_knob("mode", mode)

    def pause(self) -> None:
        self._cmd("pause")

    def resume(self) -> None:
        self._cmd("resume")

    def pause_load(self) -> None:
        self._cmd("pause_load")

    def resume_load(self) -> None:
        self._cmd("resume_load")

    def mark(self, label: str) -> None:
        self._cmd("mark", label)

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self._cmd("abort", request_id, reason)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, t0_ns: int | None = None) -> None:
        if self._started:
            raise RuntimeError("EngineHost already started")
        self._started = True
        self.t0_ns = time.monotonic_ns() if t0_ns is None else int(t0_ns)
        self.engine._send(Start(self.t0_ns))

    def stop(self, timeout: float | None = 10.0, *, abort_remaining: bool = False,
             abort_reason: str = "abort") -> None:
        """As ``EngineHost.stop``: returns once the engine process stopped the host and its last
        records (the withdrawn requests' too) went to the sinks, or after ``timeout``."""
        if self._stopped:
            return
        self._stopped = True
        if self.engine._closed or not self.engine._proc.is_alive():
            return
        self.engine._send(Stop(abort_remaining, abort_reason))
        self._final.wait(timeout)

    def wait_done(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    # -- the receiver thread ------------------------------------------------------------------
    def _receive(self, b: OutBatch) -> None:
        if b.order and not self._sink_failed:
            batch = record_batch(b)
            try:
                for s in self.sinks:
                    s.record(batch)
            except Exception as e:
                # as the in-thread host: the stream ends here with one "error" event, the
                # host is done, and the engine process stops this host's work
                self._sink_failed = True
                self._fail(e, f"engine thread died: {type(e).__name__}: {e}")
                return
        self.paused = b.paused
        self.load_paused = b.load_paused
        if b.error and self.error is None:
            self.error = EngineProcessError(b.error)
        self._engine_submitted = b.submitted
        if (b.done and b.submitted >= self.submitted) or b.error:
            self._done.set()
        if b.final:
            self._final.set()

    def _engine_died(self, msg: str) -> None:
        self._fail(EngineProcessError(msg), msg)

    def _fail(self, error: BaseException, msg: str) -> None:
        """End the stream: ``error`` kept (the first), one "error" EngineEvent to every sink
        (a sink that raises again is skipped), the host done; a live engine process is told to
        stop this host, abandoning its requests."""
        if self.error is None:
            self.error = error
        batch = RecordBatch([EngineEvent("error", self.engine.step_id, time.monotonic_ns(),
                                         "engine", message=msg)])
        for s in self.sinks:
            try:
                s.record(batch)
            except Exception:
                pass
        if not self._stopped and not self.engine._closed and self.engine._proc.is_alive():
            self._stopped = True
            self.engine._send(Stop(True, "abort"))
        self._done.set()
        self._final.set()


def make_host(engine: Any, sinks: Sequence[RecordSink] = ()) -> Any:
    """The host for ``engine``: ``RemoteEngine.new_host`` for an engine in its own process, an
    in-thread ``EngineHost`` for one built in this process (tests, benchmarks that compare
    the two); either hands each loop turn's ``RecordBatch`` to ``sinks``, in their order."""
    if isinstance(engine, RemoteEngine):
        return engine.new_host(sinks)
    from .host import EngineHost

    return EngineHost(engine, sinks=sinks)


__all__ = ["EngineCoreClient", "EngineProcessError", "OutBatch", "RemoteEngine", "device_name",
           "engine_facts", "exit_how", "make_host", "batch_records", "START_TIMEOUT_S",
           "SUBSCRIBER_HWM"]
