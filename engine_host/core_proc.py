"""The engine process (vLLM V1's ``EngineCoreProc``): ``engine_main`` builds the engine, says
ready with its facts, then serves the input socket until Shutdown.

Threads: the *engine* thread runs an ``EngineHost`` loop (scheduler + runner + async pipeline)
whose one sink is this process's sender (``EngineCoreProc.record``): each loop turn's
``RecordBatch``, with the host's status after the turn, goes onto a ``queue.SimpleQueue`` (one
put; a turn that emitted nothing but changed the status puts the status alone); the *input*
thread (the process's main thread) is blocked in ``zmq`` ``recv`` with the GIL released and
turns each message into the host call it names (``submit``, ``abort``, knob changes,
``pause``…); the *output* thread is blocked on the batch queue and encodes each batch with
msgspec (C, no per-record Python but splitting the batch by type) and sends it as one
``OutBatch``. The client's side is ``core.RemoteEngine``; the messages are ``core_wire``'s.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

import msgspec

from .vocab.errors import ConfigError
from .vocab.config import EngineConfig, SchedulerConfig
from .core_wire import (CODES, Command, Inbound, NewHost, OutBatch, Shutdown, Start, Stop,
                        Submit, Subscribe, Workload)
from .sinks import RecordBatch

#: a subscriber's queue (frames) before frames for it are dropped: minutes of steps; only a
#: subscriber that stopped reading fills it, and it must never hold the engine's stream back
SUBSCRIBER_HWM = 100_000


@dataclass(frozen=True)
class LoadedInfo:
    """``loader.LoadedModel`` without the model: what the surfaces name."""

    name: str
    random_weights: bool
    source: str
    num_params: int
    weight_bytes: int


def engine_facts(engine: Any) -> dict[str, Any]:
    """What the client's process needs to know of a built engine (sent once, pickled)."""
    lm = engine.loaded
    facts = {
        "config": engine.config, "device": str(engine.device),
        "dtype": str(engine.dtype).replace("torch.", ""),
        "loaded": LoadedInfo(lm.name, lm.random_weights, lm.source, lm.num_params,
                             getattr(lm, "weight_bytes", 0)),
        "model_config": engine.model_config, "max_model_len": engine.max_model_len,
        "num_blocks": engine.num_blocks, "block_size": engine.kv.block_size,
        "attn": engine.attn.name, "decode_attention": getattr(engine, "decode_attention", None),
        "kernels": getattr(engine, "kernels", None), "engine_name": engine.engine_name,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "async_scheduling": bool(engine.async_scheduling),
        "scheduler_config": engine.scheduler_config, "step_id": engine.step_id,
        "live_limits": None, "device_name": "",
    }
    lim = getattr(engine, "max_num_batched_tokens_limit", None)
    if lim is not None:  # vLLM: the budget and max_num_seqs at most their start-up values
        facts["live_limits"] = {"max_num_batched_tokens": lim,
                                "max_num_seqs": engine.max_num_seqs_limit}
    if engine.device.type == "cuda":
        import torch

        facts["device_name"] = torch.cuda.get_device_name(engine.device)
    return facts


def engine_main(conn: Any, cfg: EngineConfig, in_addr: str, out_addr: str) -> None:
    """The engine process: build, say ready, then serve its input socket until Shutdown."""
    import signal

    # Ctrl-C goes to the whole process group; the client decides how a session ends (it
    # stops the host: requests withdrawn, records flushed) and then shuts this process down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from .factory import make_engine

    def progress(stage: str, done: int, total: int) -> None:
        conn.send(("progress", stage, done, total))

    try:
        engine = make_engine(cfg, progress=progress)
        facts = engine_facts(engine)
    except ConfigError as e:
        conn.send(("error", str(e)))
        return
    except BaseException as e:  # noqa: BLE001 - one line to the parent, whatever it was
        conn.send(("error", f"the engine could not start: {type(e).__name__}: {e}"))
        return
    EngineCoreProc(engine, in_addr, out_addr).run(lambda: conn.send(("ready", facts)))


class EngineCoreProc:
    """The engine process's loop: the host thread, the output thread, and the input loop on the
    main thread."""

    def __init__(self, engine: Any, in_addr: str, out_addr: str) -> None:
        import zmq

        self.engine = engine
        self.ctx = zmq.Context(io_threads=1)
        self.inp = self.ctx.socket(zmq.PULL)
        self.inp.bind(in_addr)
        self.out = self.ctx.socket(zmq.PUSH)
        self.out.setsockopt(zmq.LINGER, 2000)
        self.out.connect(out_addr)
        self.outq: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.subs: dict[str, Any] = {}  # addr -> PUSH socket (writer thread only)
        self.host: Any = None
        self.host_id = 0
        self._last_status: tuple = ()
        self._last_sched: SchedulerConfig | None = None

    # the host's one sink (the engine thread): its whole cost is the status tuple and one put
    def record(self, batch: RecordBatch) -> None:
        self._put(batch)

    def _flush(self, final: bool = False) -> None:
        """The host's ``on_flush`` (the end of every loop turn): the status alone, when it
        changed since the last batch (or ``final``: the host stopped)."""
        self._put(None, final)

    def _put(self, batch: RecordBatch | None, final: bool = False) -> None:
        h = self.host
        if h is None:
            return
        err = "" if h.error is None else f"{type(h.error).__name__}: {h.error}"
        status = (h.state, self.engine.step_id, h.submitted, h._done.is_set(), h.paused,
                  h.load_paused, err)
        if batch is None and status == self._last_status and not final:
            return
        sched = self.engine.scheduler_config
        if sched == self._last_sched:
            sched = None
        else:
            self._last_sched = sched
        self._last_status = status
        self.outq.put((self.host_id, batch, status, sched, final))

    def _subscribe(self, addr: str, on: bool) -> None:
        """The writer thread's part of Subscribe (sockets belong to the thread using them)."""
        import zmq

        old = self.subs.pop(addr, None)
        if old is not None:
            old.close(linger=0)
        if on:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, SUBSCRIBER_HWM)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(addr)
            self.subs[addr] = sock

    def _writer(self) -> None:
        import zmq

        enc = msgspec.msgpack.Encoder()
        while True:
            item = self.outq.get()
            if item is None:
                return
            if item[0] == "sub":
                self._subscribe(item[1], item[2])
                continue
            host_id, batch, status, sched, final = item
            if batch is None:
                order, steps, outs, reqs, evs = b"", [], [], [], []
            else:
                order = bytes(CODES[type(r)] for r in batch.records)
                steps, outs, reqs, evs = batch.steps, batch.outputs, batch.requests, batch.events
            state, step_id, submitted, done, paused, load_paused, err = status
            frame = enc.encode(OutBatch(host_id, order, steps, outs, reqs, evs, state, step_id,
                                        submitted, done, paused, load_paused, sched, err, final))
            self.out.send(frame, copy=False)
            for sock in self.subs.values():
                try:  # never wait for a subscriber: one that stopped reading loses frames
                    sock.send(frame, zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    pass

    def _new_host(self, host_id: int) -> None:
        from .host import EngineHost

        if self.host is not None:
            self.host.stop()
        self.host_id = host_id
        self._last_status = ()
        self.host = EngineHost(self.engine, sinks=(self,), on_flush=self._flush)

    def run(self, ready: Callable[[], None]) -> None:
        writer = threading.Thread(target=self._writer, name="gpuchef-engine-out", daemon=True)
        writer.start()
        ready()
        dec = msgspec.msgpack.Decoder(Inbound)
        parent = os.getppid()
        try:
            while True:
                if not self.inp.poll(1000):
                    if os.getppid() != parent:  # orphaned: the client's process is gone
                        break
                    continue
                msg = dec.decode(self.inp.recv(copy=False).buffer)
                if isinstance(msg, Shutdown):
                    break
                self._handle(msg)
        finally:
            if self.host is not None:
                self.host.stop()
            self.outq.put(None)
            writer.join(5)
            for sock in self.subs.values():
                sock.close(linger=0)
            self.engine.close()
            self.out.close()
            self.inp.close(linger=0)
            self.ctx.term()

    def _handle(self, msg: Any) -> None:
        h = self.host
        if isinstance(msg, Submit):
            h.submit(msg.request_id, msg.prompt_token_ids, msg.sampling, msg.arrival_ns,
                     load=msg.load)
        elif isinstance(msg, Command):
            try:
                getattr(h, msg.kind)(*msg.args, **msg.kwargs)
            except ConfigError as e:  # checked by the client already; say it if it slipped by
                h._emit("error", message=str(e), source=str(msg.kwargs.get("source", "")))
        elif isinstance(msg, NewHost):
            self._new_host(msg.host)
        elif isinstance(msg, Workload):
            h.set_workload([_Spec(*s) for s in msg.specs], msg.t0_ns)
        elif isinstance(msg, Start):
            h.start(msg.t0_ns)
        elif isinstance(msg, Subscribe):
            self.outq.put(("sub", msg.addr, msg.on))
        elif isinstance(msg, Stop):
            h.stop(abort_remaining=msg.abort_remaining, abort_reason=msg.abort_reason)
            self._flush(final=True)


@dataclass(frozen=True)
class _Spec:
    request_id: str
    arrival_s: float
    prompt_token_ids: list[int]
    output_len: int


__all__ = ["EngineCoreProc", "LoadedInfo", "SUBSCRIBER_HWM", "engine_facts", "engine_main"]
