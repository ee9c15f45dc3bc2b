"""The dashboard's session (composition root of `gpuchef top`): engine + EngineHost + live load +
NVML and host samplers + Timeline + the session trace, plus the live A/B
(``experiments.hosted.LiveAB``).

Threads: the engine loop (EngineHost), the load feeder (LiveLoad), the NVML sampler (+ its PCIe
thread), the host sampler, the trace writer, and an A/B thread while one runs. The UI thread only
reads timeline snapshots and attributes, and sends commands (queue puts): nothing here blocks it
except ``export_trace`` and ``close``, which the app runs in a worker thread.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from ..engine_host.vocab.config import SchedulerConfig
from ..engine_host.contract import Engine
from ..engine_host.engine import LLMEngine
from ..engine_host.core import make_host
from ..engine_host.vocab.workload import WorkloadConfig
from .live_load import LiveLoad
from ..probes.sampler import HostSampler
from ..probes.metrics import DEFAULT_PERCENTILES, SESSION_END_REASON
from ..probes.nvml import NvmlSampler
from ..probes.recorder import TraceRecorder
from ..probes.timeline import Timeline
from ..experiments.hosted import LiveAB
from .export import TraceOwner, TraceSink, backfill, record_to, rotate
from .headless import attention_label, trace_meta
from ..tui.session import SessionInfo

def engine_identity(engine: Engine) -> tuple[str, int, tuple[str, ...]]:
    """What the header names about ``engine``: its name ("" for gpuchef's native engine, e.g.
    "vLLM 0.24.0"), its tensor-parallel size, and the GPUs it runs on — CUDA ordinals
    ``device.index`` … ``+ tp - 1`` (vLLM's workers take the first ``tp`` visible devices),
    mapped through ``CUDA_VISIBLE_DEVICES`` to NVML indices when that lists plain indices; empty
    on a CPU."""
    name = engine.engine_name
    tp = int(engine.tensor_parallel_size)
    dev = engine.device
    if dev.type != "cuda":
        return name, tp, ()
    first = dev.index or 0
    ordinals = list(range(first, first + tp))
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if visible and all(v.isdigit() for v in visible) and ordinals[-1] < len(visible):
        return name, tp, tuple(visible[o] for o in ordinals)
    return name, tp, tuple(str(o) for o in ordinals)


class LiveSession(TraceOwner):
    """Everything `gpuchef top` runs, behind the interface ``tui.session.Session`` describes.

    ``engine``: a built LLMEngine. ``wcfg``: the load. ``sample_hz``/``gpus``: NVML sampler
    settings (``nvml``: a stand-in module for tests). ``trace_path``: write the session trace
    there from the start (None: ``export_trace`` writes one on demand). ``slos``: goodput SLOs
    (ms). ``stats_window_s``: the numbers' rolling window. ``note``: shown in the header.
    ``num_prompts``/``duration_s``: bound the load (default: endless, a trace loops).
    ``taps``: more sinks of the host's records (``engine_host.sinks.RecordSink``; e.g. `top
    --serve`'s front door and /metrics), given each batch first — before the timeline and the
    trace, so the front door streams what a step made as soon as it can; a tap with
    ``on_gpu_sample`` gets the GPU samples too.
    """

    def __init__(self, engine: LLMEngine, wcfg: WorkloadConfig, *, sample_hz: float = 10.0,
                 gpus: list[int] | None = None, nvml: Any = None,
                 trace_path: str | None = None, trace_prompts: bool = False,
                 slos: dict[str, float] | None = None,
                 percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                 stats_window_s: float = 30.0, note: str = "", host_probe: bool = True,
                 num_prompts: int | None = None, duration_s: float | None = None,
                 meta_extra: dict[str, Any] | None = None, taps: tuple[Any, ...] = ()) -> None:
        self.engine = engine
        self.wcfg = wcfg
        self.clock = time.monotonic_ns
        self.slos = dict(slos or {})
        self.percentiles = tuple(percentiles)
        self.stats_window_s = float(stats_window_s)
        self.trace_prompts = trace_prompts
        lm = engine.loaded
        engine_name, tp, engine_gpus = engine_identity(engine)
        self.info = SessionInfo(
            model=lm.name, random_weights=lm.random_weights, device=str(engine.device),
            attention=attention_label(engine), dtype=str(engine.dtype).replace("torch.", ""),
            kv_blocks=engine.num_blocks, block_size=engine.kv.block_size,
            max_model_len=engine.max_model_len, note=note, engine=engine_name,
            tensor_parallel_size=tp, gpus=engine_gpus,
            async_scheduling=bool(engine.async_scheduling))
        self.timeline = Timeline(percentiles=self.percentiles)
        self.start_ns = self.timeline.origin_ns
        self._recorder: TraceRecorder | None = None
        self._pending: list[Any] | None = None  # records seen while a trace is being opened
        self._meta_extra = dict(meta_extra or {})
        self._meta_extra.setdefault("sample_hz", sample_hz)
        self._meta_extra.setdefault("source", {"kind": "hosted"})  # `top --attach`: attached
        tl = self.timeline

        def listener(add: Callable[[Any], None], kind: str = "") -> Callable[[Any], None]:
            extra = tuple(f for t in taps if (f := getattr(t, kind, None)) is not None)

            def on(rec: Any) -> None:  # sampler threads: a deque append and a queue put
                for f in extra:
                    f(rec)
                add(rec)
                record_to(self, rec)
            return on

        self.host = make_host(engine, [*taps, tl, TraceSink(self)])
        self.load = LiveLoad(self.host, wcfg, num_prompts=num_prompts, duration_s=duration_s)
        self.ab = LiveAB(self.host)
        self.nvml = NvmlSampler(gpus, sample_hz, nvml=nvml,
                                on_sample=listener(tl.add_gpu_sample, "on_gpu_sample"),
                                on_event=listener(tl.add_event))
        self.host_probe = HostSampler(2.0, on_sample=listener(tl.add_host_sample)) \
            if host_probe else None
        if trace_path:
            self._recorder = TraceRecorder(trace_path, meta=self._meta(), trace_prompts=trace_prompts)
        self._closed = False
        self._close_lock = threading.Lock()
        #: called first by ``close`` (e.g. `top --serve` stops its front door)
        self.closers: list[Callable[[], None]] = []
        self._started = False

    def _meta(self) -> dict[str, Any]:
        meta = trace_meta(self.engine, self.engine.config, self.wcfg, "top")
        meta.update(self._meta_extra, slos_ms=self.slos, percentiles=list(self.percentiles))
        if self.nvml.gpu_names:
            meta["gpus"] = {str(k): v for k, v in self.nvml.gpu_names.items()}
        return meta

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, *, load: bool = True, load_paused: bool = False) -> "LiveSession":
        """Start samplers, engine and (unless ``load`` is False: a benchmark that gave the host a
        fixed workload with ``host.set_workload`` first) the live load, paused when
        ``load_paused`` (`top --serve`: HTTP drives the engine until the user starts the load).
        Idempotent."""
        if self._started:
            return self
        self._started = True
        self.nvml.start()
        if self.host_probe is not None:
            self.host_probe.start()
        self.host.start()
        if load:
            self.load.start(paused=load_paused)
        return self

    def close(self) -> None:
        """Stop the A/B run, the load, the engine and the samplers; requests still in flight are
        aborted, recorded as withdrawn (finish_reason ``probes.metrics.SESSION_END_REASON``: the
        session ended them, the server did not fail them); the trace gets its end record.
        Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for f in self.closers:
            f()
        self.ab.stop()
        self.load.stop()
        self.host.stop(abort_remaining=True, abort_reason=SESSION_END_REASON)
        self.nvml.stop()
        if self.host_probe is not None:
            self.host_probe.stop()
        self.engine.close()  # vLLM: its engine core and TP workers
        r = self._recorder
        if r is not None:
            r.close()

    # -- state read by the UI --------------------------------------------------------------------
    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self.host.scheduler_config

    @property
    def gpu_status(self) -> str:
        return self.nvml.status

    @property
    def gpu_available(self) -> bool:
        return self.nvml.available

    @property
    def engine_error(self) -> str | None:
        e = self.host.error
        return None if e is None else f"{type(e).__name__}: {e}"

    @property
    def engine_paused(self) -> bool:
        return self.host.paused

    #: the knobs always reach the hosted engine (``tui.session.Session.knobs_reason``)
    knobs_reason = ""

    # -- commands --------------------------------------------------------------------------------
    def set_knob(self, name: str, value: Any) -> Any:
        """Validate now, in force from the next step. ConfigError names the allowed range."""
        return self.host.set_knob(name, value)

    def set_config(self, **changes: Any) -> dict[str, Any]:
        return self.host.set_config(**changes)

    def pause_engine(self, paused: bool) -> None:
        (self.host.pause if paused else self.host.resume)()

    def export_trace(self, path: str | None = None) -> str:
        """Write or rotate the session trace (blocks on file I/O: call it off the UI thread).

        With a trace open: finish the current file (its end record) and go on in the next part.
        Without one: write what the timeline still holds (the last ~10 min of steps, all kept
        requests, samples and events) to ``path`` (default ``gpuchef-top-<time>.jsonl``) and keep
        recording there. Returns a one-line message. Raises ConfigError when the file cannot be
        opened.
        """
        r = self._recorder
        if r is not None:
            return rotate(r, path)
        got: dict[str, Any] = {}

        def held() -> list[Any]:
            snap = got["snap"] = self.timeline.snapshot()
            return [*snap.steps, *snap.events, *snap.gpu_samples, *snap.host_samples,
                    *snap.requests]

        p = backfill(self, path, self._meta(), held, trace_prompts=self.trace_prompts)
        snap = got["snap"]
        n = len(snap.steps)
        lost = snap.totals["step"] - n
        extra = f" ({lost} older steps had left memory)" if lost > 0 else ""
        return f"trace {p}: wrote {n} steps held in memory{extra}; recording goes on there"


__all__ = ["LiveSession", "engine_identity"]
