"""The front door in its own process, as vLLM runs its API server apart from its engine core.

Measured on an H200 (docs/benchmarks.md, "The engine process and the HTTP front door"):
with the HTTP server on a thread of the engine's process, its per-token Python work
(a task wake-up, a detokenise step, a JSON chunk and a socket write per stream per step) took the
GIL from the engine thread — the engine's own P50 ITL went from 10 to 40 ms at 3× the Azure
trace. So the server runs in a child process
(``multiprocessing`` spawn: no fork after CUDA), and the engine's process keeps only a bridge:

* engine side (``ServeProcess``): a host's sink that appends each record to a deque (the engine
  thread's whole cost), a sender thread that ships them in one pickled batch per wake-up, and a
  receiver thread that turns the child's requests into ``EngineHost.submit`` / ``abort`` /
  ``set_config`` calls — the same host API the load generator uses — and the profile requests
  (``POST /start_profile``, ``/stop_profile``) into calls of ``ServeProcess.profiler``
  (profile.py: the trace recorders live in this process);
* server side (``_child_main``): the FrontDoor and ServeMetrics of server.py / metrics.py over a
  ``RemoteHost`` that looks like the EngineHost to them.

The child binds the port and loads the tokenizer before the engine's model loads, so a port in
use or a bad tokenizer is one line at once (ConfigError from ``ServeProcess``).
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..engine_host.vocab.errors import ConfigError
from ..engine_host.vocab.config import SchedulerConfig
from ..engine_host.sinks import RecordBatch
from ..engine_host.vocab.records import EngineEvent, RequestRecord, StepOutput, StepRecord
from .profile import ProfileError

#: the sender's longest sleep (s) when the engine is idle; a step wakes it at once
SEND_IDLE_S = 0.05
RPC_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class EngineFacts:
    """What the server needs of the engine, sent once it is built."""

    max_model_len: int
    vocab_size: int
    num_blocks: int
    scheduler: SchedulerConfig
    step_id: int
    #: the engine's process (its ``process_*`` series on /metrics); None: not known
    engine_pid: int | None = None
    #: where the server's process receives the engine's record stream itself
    #: (``RemoteEngine.subscribe``); "" for an engine in this process: the bridge forwards
    stream_addr: str = ""


@dataclass(frozen=True)
class ChildArgs:
    http_host: str
    port: int
    model: str
    model_vocab_size: int
    tokenizer_path: str | None
    served_model_name: str | None
    api_key: str | None
    max_concurrent: int | None  # None: no limit (requests wait in the engine's queue)
    max_body_bytes: int
    version: str


class ServeProcess:
    """Engine side of the front door. ``start()`` spawns the server process and waits until it
    listens (ConfigError with its one line when it cannot bind or read the tokenizer);
    ``attach(host, engine)`` connects it to the host once the engine is built; ``stop()``.

    ``record(batch)`` is the host's sink (``engine_host.sinks``) and ``on_gpu_sample`` the
    samplers' listener: each costs the delivering thread deque appends and nothing else.

    ``profiler``: a ``profile.ProfileSwitch`` (`gpuchef serve` sets it) or None, then
    ``POST /start_profile`` answers 501.
    """

    def __init__(self, args: ChildArgs) -> None:
        self.args = args
        self.url = ""
        self.host: Any = None
        self._q: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._proc: Any = None
        self._conn: Any = None
        self._threads: list[threading.Thread] = []
        self._send_lock = threading.Lock()
        self.child_error = ""
        self.profiler: Any = None
        #: ids the server submitted whose RequestRecord has not come back yet
        self._in_flight: set[str] = set()
        #: the engine runs in its own process and sends its stream to the server's process
        #: directly (attach): the bridge then carries only requests, replies and GPU samples
        self._direct = False
        self._engine: Any = None
        self._stream_dir = ""

    # -- the host's sink, the samplers' listener ------------------------------------------------
    def record(self, batch: RecordBatch) -> None:
        for r in batch.requests:
            self._in_flight.discard(r.request_id)
        if self._direct:  # the engine sends the server its stream itself
            return
        q = self._q
        for x in batch.records:
            if not isinstance(x, EngineEvent):
                q.append(x)
            elif x.kind in ("knob", "mode"):  # the knobs in force, for GET
                q.append(("sched", self.host.scheduler_config if self.host else None))
        if batch.outputs or batch.requests:
            self._wake.set()

    def on_gpu_sample(self, s: Any) -> None:
        if hasattr(s, "sm_active"):
            self._q.append(s)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> "ServeProcess":
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_child_main, args=(child, self.args),
                                 name="gpuchef-http", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(timeout_s):
            self._proc.kill()
            raise ConfigError(f"the HTTP server process did not start within {timeout_s:g} s")
        try:
            kind, value = parent.recv()
        except EOFError:
            raise ConfigError("the HTTP server process exited while starting") from None
        if kind == "bind_error":
            self._proc.join(5)
            raise ConfigError(value)
        host, port = value[0], value[1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self

    def attach(self, host: Any, engine: Any) -> None:
        """Connect the server to ``host`` (the EngineHost of ``engine``): from now on it
        answers requests."""
        self.host = host
        # RemoteEngine.pid: the engine's own process; an engine built in this process (no pid
        # of its own) runs in this one
        pid = getattr(engine, "pid", None) or os.getpid()
        addr = ""
        if hasattr(engine, "subscribe"):  # engine_host.core.RemoteEngine
            import tempfile

            self._stream_dir = tempfile.mkdtemp(prefix="gpuchef-http-")
            addr = f"ipc://{os.path.join(self._stream_dir, 'stream')}"
            self._engine = engine
        facts = EngineFacts(engine.max_model_len, engine.model_config.vocab_size,
                            engine.num_blocks, host.scheduler_config, host.step_id, pid, addr)
        self._send([("ready", facts)])
        if addr:
            engine.subscribe(addr)  # frames queue for the server until it binds
            self._direct = True
        for target, name in ((self._sender, "gpuchef-http-send"),
                             (self._receiver, "gpuchef-http-recv")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (its clients get what was made), then the bridge threads."""
        if self._proc is None:
            return
        self._stop.set()
        self._wake.set()
        try:
            self._send([("stop", None)])
        except (OSError, ValueError):
            pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(2)
        for t in self._threads:
            t.join(2)
        try:
            self._conn.close()
        except OSError:
            pass
        self._proc = None
        self._unsubscribe()

    def _unsubscribe(self) -> None:
        if self._engine is not None:
            try:
                self._engine.subscribe(f"ipc://{os.path.join(self._stream_dir, 'stream')}",
                                       on=False)
            except Exception:  # noqa: BLE001 - the engine's process may be gone already
                pass
            self._engine = None
            import shutil

            shutil.rmtree(self._stream_dir, ignore_errors=True)

    def failure(self) -> str:
        """"" while the HTTP server process serves (or before ``start``, or once ``stop`` was
        asked); else one line saying that it is gone and how it ended (killed by a signal, e.g.
        the OOM killer's SIGKILL, or its exit code) — nothing listens on ``url`` any more. The
        bridge threads notice first (the pipe closes: ``child_error``); the process's own end
        is read here too."""
        p = self._proc
        if p is None or self._stop.is_set():
            return ""
        if not self.child_error and p.is_alive():
            return ""
        p.join(1.0)  # the pipe closes a moment before the process is reaped
        from ..engine_host.core import exit_how

        how = "its pipe to the engine closed" if p.exitcode is None else exit_how(p)
        return f"the HTTP server process is gone ({how}): nothing listens on {self.url}"

    # -- bridge threads ------------------------------------------------------------------------
    def _gone(self) -> None:
        """The child's end of the pipe closed without ``stop``: the HTTP server is gone, but the
        engine may go on (`top --serve`'s dashboard keeps running). Its clients are gone with
        it, so their requests are aborted (as a client that disconnects aborts its own), and the
        records it would have been sent are dropped from now on (the queue no longer grows)."""
        if self._stop.is_set():
            return
        self.child_error = "the HTTP server process is gone"
        self._q = collections.deque(maxlen=0)  # the listeners' appends now keep nothing
        self._unsubscribe()  # the engine stops sending it its stream
        for rid in list(self._in_flight):
            self.host.abort(rid, "abort")

    def _send(self, batch: list) -> None:
        with self._send_lock:
            self._conn.send(batch)

    def _sender(self) -> None:
        q = self._q
        last_err = None
        while not self._stop.is_set():
            self._wake.wait(SEND_IDLE_S)
            self._wake.clear()
            batch = []
            while q:
                batch.append(q.popleft())
            host = self.host
            err = host.error
            if err is not None and last_err is None:
                last_err = err
                batch.append(("error", f"{type(err).__name__}: {err}"))
            if not self._direct:  # else the stream carries the state
                batch.append(("state", host.state))
            if not batch:
                continue
            try:
                self._send(batch)
            except (OSError, ValueError, BrokenPipeError):
                self._gone()
                return

    def _receiver(self) -> None:
        host = self.host
        conn = self._conn
        while not self._stop.is_set():
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self._gone()
                return
            kind = msg[0]
            if kind == "submit":
                _, rid, ids, sp = msg
                self._in_flight.add(rid)
                host.submit(rid, ids, sp, load=False)
            elif kind == "abort":
                host.abort(msg[1], msg[2])
            elif kind == "set":
                _, rpc, changes = msg
                try:
                    parsed = host.set_config(source="http", **changes)
                    reply = ("reply", rpc, True, parsed)
                except ConfigError as e:
                    reply = ("reply", rpc, False, str(e))
                try:
                    self._send([reply])
                except (OSError, ValueError):
                    return
            elif kind == "profile":
                # a thread of its own: closing a trace waits for its writer, and this thread
                # must go on taking submits meanwhile
                threading.Thread(target=self._profile, args=msg[1:], name="gpuchef-profile",
                                 daemon=True).start()

    def _profile(self, rpc: int, action: str) -> None:
        p = self.profiler
        try:
            if p is None:
                raise ProfileError(501, "this server writes no profiles (`gpuchef top --serve`: "
                                        "the dashboard's --trace is the session's trace)")
            reply = ("reply", rpc, True, p.start() if action == "start" else p.stop())
        except ProfileError as e:
            reply = ("reply", rpc, False, (e.status, str(e)))
        except Exception as e:  # noqa: BLE001 - the client gets it as a 500, the bridge goes on
            reply = ("reply", rpc, False, (500, f"{type(e).__name__}: {e}"))
        try:
            self._send([reply])
        except (OSError, ValueError):
            pass


class RemoteHost:
    """The EngineHost as the server process sees it: ``submit``/``abort`` are messages,
    ``set_config`` a round trip (validated by the engine's process, ConfigError as there),
    ``profile`` a round trip to ``ServeProcess.profiler``,
    ``scheduler_config``/``step_id``/``state``/``error`` the latest the engine sent."""

    def __init__(self, conn: Any, facts: EngineFacts) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.scheduler_config = facts.scheduler
        self.step_id = facts.step_id
        self.state: tuple[int, int, int, int] | None = None
        self.error: Any = None
        self._rpc = itertools.count()
        self._replies: dict[int, Any] = {}
        self._reply_cv = threading.Condition()

    def _send(self, msg: tuple) -> None:
        with self._lock:
            self._conn.send(msg)

    def submit(self, rid: str, ids: Any, sp: Any, load: bool = False) -> None:
        self._send(("submit", rid, list(ids), sp))

    def abort(self, rid: str, reason: str = "abort") -> None:
        self._send(("abort", rid, reason))

    def _call(self, kind: str, arg: Any, what: str) -> tuple[bool, Any]:
        """Send ``(kind, n, arg)`` and wait for the engine's process's ``(ok, value)`` for it;
        ConfigError naming ``what`` after RPC_TIMEOUT_S."""
        n = next(self._rpc)
        self._send((kind, n, arg))
        end = time.monotonic() + RPC_TIMEOUT_S
        with self._reply_cv:
            while n not in self._replies:
                left = end - time.monotonic()
                if left <= 0:
                    raise ConfigError(f"the engine did not answer {what} in time")
                self._reply_cv.wait(left)
            return self._replies.pop(n)

    def set_config(self, source: str = "http", **changes: Any) -> dict[str, Any]:
        ok, value = self._call("set", changes, "the knob change")
        if not ok:
            raise ConfigError(value)
        self.scheduler_config = self.scheduler_config.with_changes(**value)
        return value

    def profile(self, action: str) -> str:
        """``action`` "start" or "stop" a profile in the engine's process: the trace file's
        path; ProfileError with the HTTP status to answer when refused. Blocks (up to
        RPC_TIMEOUT_S): call it off the event loop."""
        try:
            ok, value = self._call("profile", action, f"{action}_profile")
        except ConfigError as e:
            raise ProfileError(500, str(e)) from None
        if not ok:
            raise ProfileError(*value)
        return value

    def reply(self, n: int, ok: bool, value: Any) -> None:
        with self._reply_cv:
            self._replies[n] = (ok, value)
            self._reply_cv.notify_all()


class _EngineError(Exception):
    pass


def _child_main(conn: Any, a: ChildArgs) -> None:
    """The server process: bind, read the tokenizer, say so, wait for the engine, serve.
    Ctrl-C reaches this process too (same process group): it is ignored here, as the engine's
    process stops this one with "stop" after the streams in flight got their end."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ..engine_host.vocab.tokenizer import load_tokenizer
    from .metrics import ServeMetrics
    from .server import FrontDoor, bind_socket

    try:
        tok = load_tokenizer(a.model, a.model_vocab_size, a.tokenizer_path)
        sock = bind_socket(a.http_host, a.port)
    except ConfigError as e:
        conn.send(("bind_error", str(e)))
        conn.close()
        return
    conn.send(("bound", sock.getsockname()[:2]))
    try:
        first = conn.recv()
    except EOFError:
        return
    kind, facts = first[0]
    if kind != "ready":
        return
    remote = RemoteHost(conn, facts)
    name = a.served_model_name or a.model
    metrics = ServeMetrics(name, kv_blocks_total=facts.num_blocks, state=lambda: remote.state,
                           max_model_len=facts.max_model_len, process=True,
                           engine_pid=facts.engine_pid)
    metrics.set_scheduler(facts.scheduler)
    front = FrontDoor(remote, tokenizer=tok, model_name=name, model_root=a.model,
                      max_model_len=facts.max_model_len, vocab_size=facts.vocab_size,
                      metrics=metrics, api_key=a.api_key, max_concurrent=a.max_concurrent,
                      max_body_bytes=a.max_body_bytes, version=a.version)
    front.start(sock)
    stream = _EngineStream(facts.stream_addr, front, metrics, remote) \
        if facts.stream_addr else None
    try:
        while True:
            if stream is not None and not stream.wait(conn):
                continue
            try:
                batch = conn.recv()
            except EOFError:
                break
            stop = False
            for item in batch:
                if _to_server(item, front, metrics):
                    if isinstance(item, StepRecord):
                        remote.step_id = item.step + 1
                elif isinstance(item, tuple):
                    k = item[0]
                    if k == "state":
                        remote.state = item[1]
                    elif k == "reply":
                        remote.reply(item[1], item[2], item[3])
                    elif k == "sched" and item[1] is not None:
                        remote.scheduler_config = item[1]
                    elif k == "error":
                        remote.error = _EngineError(item[1])
                    elif k == "stop":
                        stop = True
                else:
                    metrics.on_gpu_sample(item)
            if stop:
                break
    finally:
        front.stop()
        if stream is not None:
            stream.close()


#: what the front door and /metrics take of the engine's records (events go elsewhere)
_ENGINE_RECORDS = (StepOutput, RequestRecord, StepRecord)


def _to_server(item: Any, front: Any, metrics: Any) -> bool:
    """Hand one engine record to /metrics and the front door (streams); False when ``item``
    is not an engine record (the bridge's own messages, GPU samples)."""
    if not isinstance(item, _ENGINE_RECORDS):
        return False
    _records_to_server(RecordBatch((item,)), front, metrics)
    return True


def _records_to_server(batch: RecordBatch, front: Any, metrics: Any) -> None:
    """Hand engine records (one loop turn's, in the engine's order) to its sinks here: /metrics
    first, then the front door. A stream ends with its request's last StepOutput, and its
    RequestRecord comes after it in the same turn, so /metrics takes the whole turn first — a
    client that has read the end of its stream and then scrapes /metrics finds its request
    counted."""
    for sink in (metrics, front):
        sink.record(batch)


class _EngineStream:
    """The server process's own subscription to the engine's record stream
    (``RemoteEngine.subscribe``): each OutBatch frame, decoded by msgspec, goes record by record
    to the front door and /metrics, and its status to the RemoteHost — no hop through the
    client's process. ``wait(conn)`` serves stream frames until the bridge's pipe has a message
    (True) or the wait times out (False)."""

    def __init__(self, addr: str, front: Any, metrics: Any, remote: "RemoteHost") -> None:
        import msgspec
        import zmq

        from ..engine_host.core_wire import OutBatch

        self.ctx = zmq.Context(io_threads=1)
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.bind(addr)
        self.poller = zmq.Poller()
        self.poller.register(self.sock, zmq.POLLIN)
        self.dec = msgspec.msgpack.Decoder(OutBatch)
        self.front, self.metrics, self.remote = front, metrics, remote
        self._pipe_registered = False

    def wait(self, conn: Any) -> bool:
        import zmq

        if not self._pipe_registered:
            self.poller.register(conn.fileno(), zmq.POLLIN)
            self._pipe_registered = True
        for s, _ in self.poller.poll(1000):
            if s is self.sock:
                while True:
                    try:
                        frame = self.sock.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._apply(self.dec.decode(frame.buffer))
        return conn.poll()

    def _apply(self, b: Any) -> None:
        from ..engine_host.core_wire import record_batch

        remote = self.remote
        if b.order:
            _records_to_server(record_batch(b), self.front, self.metrics)
        remote.step_id = b.step_id
        if b.state is not None:
            remote.state = tuple(b.state)
        if b.sched is not None:
            remote.scheduler_config = b.sched
        if b.error and remote.error is None:
            remote.error = _EngineError(b.error)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
