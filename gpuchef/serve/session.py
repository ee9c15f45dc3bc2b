"""The headless server's composition: engine + EngineHost + the front door's process (HTTP and
/metrics, process.py) + samplers + trace (`gpuchef serve`). `gpuchef top --serve` composes the
same ServeProcess into the dashboard's LiveSession instead (gpuchef/commands/top.py).
``make_front_door`` builds the server in this process (benchmarks compare the two)."""

from __future__ import annotations

from typing import Any, Callable

from ..engine_host.core import make_host
from .metrics import ServeMetrics
from .server import FrontDoor


def fan(*fns: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """One sampler listener calling each of ``fns`` (None skipped) in order."""
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
                    model: str, api_key: str | None, max_concurrent: int | None,
                    max_body_bytes: int) -> tuple[FrontDoor, ServeMetrics]:
    """The FrontDoor and ServeMetrics for ``host``/``engine`` (not yet started or wired)."""
    name = served_model_name or model
    metrics = ServeMetrics(name, kv_blocks_total=engine.num_blocks, state=lambda: host.state,
                           max_model_len=engine.max_model_len)
    metrics.set_scheduler(engine.scheduler_config)
    front = FrontDoor(host, tokenizer=tokenizer, model_name=name, model_root=model,
                      max_model_len=engine.max_model_len,
                      vocab_size=engine.model_config.vocab_size, metrics=metrics,
                      api_key=api_key, max_concurrent=max_concurrent,
                      max_body_bytes=max_body_bytes, version=gpuchef_version())
    return front, metrics


class ServeSession:
    """`gpuchef serve`: the engine behind the front door until ``close``.

    ``server``: a started ``process.ServeProcess`` (it listens already: it bound its port before
    the model loaded); ``recorder``: a TraceRecorder or None; ``profile``: a
    ``profile.ProfileSwitch`` (POST /start_profile, /stop_profile) or None; ``samplers``:
    gpuchef.sessions.headless.Samplers or None (build it with ``sink=session.sample_sink``).
    """

    def __init__(self, engine: Any, server: Any, *, recorder: Any = None,
                 profile: Any = None) -> None:
        self.engine = engine
        self.server = server
        self.recorder = recorder
        self.profile = profile
        server.profiler = profile
        traces = [r for r in (recorder, profile) if r is not None]
        # the front door first: it streams what a step made as soon as it can
        self.host = make_host(engine, [server, *traces])
        self.sample_sink = fan(server.on_gpu_sample, *(r.record for r in traces))
        self.samplers: Any = None

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> None:
        self.host.start()
        if self.samplers is not None:
            self.samplers.start()
        self.server.attach(self.host, self.engine)

    def close(self) -> None:
        """Stop serving (requests in flight are aborted, their clients get what was made), stop
        the engine and samplers, finish the trace."""
        self.server.stop()
        self.host.stop(abort_remaining=True)
        if self.samplers is not None:
            self.samplers.stop()
        self.engine.close()
        if self.profile is not None:  # a profile never stopped ends with the session
            self.profile.close()
        if self.recorder is not None:
            self.recorder.close()
