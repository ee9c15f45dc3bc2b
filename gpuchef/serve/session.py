"""The headless server's composition: engine + EngineHost + front door + /metrics + samplers +
trace (`gpuchef serve`). `gpuchef top --serve` composes the same front door into the dashboard's
LiveSession instead (gpuchef/top_cmd.py)."""

from __future__ import annotations

import socket
from typing import Any, Callable

from ..engine_host.host import EngineHost
from .metrics import ServeMetrics
from .server import FrontDoor


def fan(*fns: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """One listener calling each of ``fns`` (None skipped) in order."""
    fs = tuple(f for f in fns if f is not None)
    if len(fs) == 1:
        return fs[0]

    def call(x: Any) -> None:
        for f in fs:
            f(x)
    return call


def gpuchef_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuchef")
    except PackageNotFoundError:
        return "0+unknown"


def make_front_door(host: Any, engine: Any, *, tokenizer: Any, served_model_name: str | None,
                    model: str, api_key: str | None, max_concurrent: int,
                    max_body_bytes: int) -> tuple[FrontDoor, ServeMetrics]:
    """The FrontDoor and ServeMetrics for ``host``/``engine`` (not yet started or wired)."""
    name = served_model_name or model
    metrics = ServeMetrics(name, kv_blocks_total=engine.num_blocks, state=lambda: host.state)
    metrics.set_scheduler(engine.scheduler_config)
    front = FrontDoor(host, tokenizer=tokenizer, model_name=name, model_root=model,
                      max_model_len=engine.max_model_len,
                      vocab_size=engine.model_config.vocab_size, metrics=metrics,
                      api_key=api_key, max_concurrent=max_concurrent,
                      max_body_bytes=max_body_bytes, version=gpuchef_version())
    return front, metrics


class ServeSession:
    """`gpuchef serve`: the engine behind the front door until ``close``.

    ``sock``: the listening socket (``server.bind_socket``, made before the model loaded);
    ``recorder``: a TraceRecorder or None; ``samplers``: gpuchef.session.Samplers or None (its
    sink should include ``metrics.on_gpu_sample``: build it with ``sink=session.sample_sink``).
    """

    def __init__(self, engine: Any, sock: socket.socket, *, tokenizer: Any,
                 served_model_name: str | None, model: str, api_key: str | None = None,
                 max_concurrent: int, max_body_bytes: int, recorder: Any = None) -> None:
        self.engine = engine
        self.sock = sock
        self.recorder = recorder
        rec = recorder.record if recorder is not None else None
        self.host = EngineHost(engine)
        self.front, self.metrics = make_front_door(
            self.host, engine, tokenizer=tokenizer, served_model_name=served_model_name,
            model=model, api_key=api_key, max_concurrent=max_concurrent,
            max_body_bytes=max_body_bytes)
        f, m = self.front, self.metrics
        self.host.on_step = fan(m.on_step, rec)
        self.host.on_output = fan(f.on_output, m.on_output)
        self.host.on_request = fan(f.on_request, m.on_request, rec)
        self.host.on_event = fan(rec) if rec is not None else self.host.on_event
        self.sample_sink = fan(m.on_gpu_sample, rec)
        self.samplers: Any = None

    @property
    def url(self) -> str:
        return self.front.url

    def start(self) -> None:
        self.host.start()
        if self.samplers is not None:
            self.samplers.start()
        self.front.start(self.sock)

    def close(self) -> None:
        """Stop serving (requests in flight are aborted, their clients get what was made), stop
        the engine and samplers, finish the trace."""
        self.front.stop()
        self.host.stop()
        for rid in list(self.engine.requests):
            rec = self.engine.abort(rid)
            if rec is not None:
                self.host.on_request(rec)
        if self.samplers is not None:
            self.samplers.stop()
        self.engine.close()
        if self.recorder is not None:
            self.recorder.close()
