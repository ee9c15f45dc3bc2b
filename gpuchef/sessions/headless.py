"""Session wiring (the composition root): engine + load + host + sinks, for headless runs.

``build_engine`` loads the model with a progress bar; ``run_load`` drives a workload through an
EngineHost to the end and returns every record. The dashboard composes the same parts with a
Timeline instead of plain lists.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..engine_host.vocab.config import EngineConfig
from ..engine_host.engine import LLMEngine
from ..engine_host.factory import make_engine
from ..engine_host.core import RemoteEngine, device_name, make_host
from ..engine_host.host import EngineHost
from ..engine_host.sinks import RecordBatch, RecordSink
from ..engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from ..probes.metrics import SESSION_END_REASON, gpu_means, is_probe_id
from ..probes.summaries import gpu_result_rows


def build_engine(cfg: EngineConfig, console: Console | None = None, *,
                 in_process: bool = False) -> Any:
    """Start the engine: by default in a process of its own (``engine_host.core.RemoteEngine``:
    the engine core's busy loop alone with its I/O threads, as every command runs it), or, with
    ``in_process``, built in this process (an ``LLMEngine``/``VllmEngine`` for an in-thread
    ``EngineHost``: benchmarks that measure what the process boundary costs; the environment
    variable ``GPUCHEF_IN_PROCESS_ENGINE=1`` asks the same of a command). Loads the model
    and sizes the KV cache, showing weight loading as a progress bar on ``console`` (stderr by
    default). ``cfg.engine`` picks gpuchef's native engine or vLLM
    (``engine_host.factory.make_engine``). Raises ConfigError for bad settings or a bad model
    folder, and, for vLLM, when it is missing or cannot run here."""
    console = console or Console(stderr=True, soft_wrap=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        tasks: dict[str, Any] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            t = tasks.get(stage)
            if t is None:
                t = tasks[stage] = progress.add_task(stage, total=total or None)
            progress.update(t, completed=done, total=total or None)

        t0 = time.perf_counter()
        if in_process or os.environ.get("GPUCHEF_IN_PROCESS_ENGINE") == "1":
            engine = make_engine(cfg, progress=on_progress)
        else:
            engine = RemoteEngine.spawn(cfg, progress=on_progress)
    lm = engine.loaded
    kind = "random weights" if lm.random_weights else lm.source
    console.print(f"[dim]loaded {lm.name} ({kind}, {lm.num_params / 1e6:.1f} M params, "
                  f"{engine.dtype}) on {engine.device} in {time.perf_counter() - t0:.1f} s; "
                  f"KV cache {engine.num_blocks} blocks × {engine.kv.block_size} tokens; "
                  f"attention {attention_label(engine)}[/dim]")
    return engine


def attention_label(engine: Any) -> str:
    """The attention backend as the headers show it: its name, and the decode kernel where it
    is not the backend's own (``flashinfer (decode xqa)``); vLLM's engine: its backend name."""
    name = engine.attn.name
    dec = getattr(engine, "decode_attention", None)
    return name if not dec or dec == name else f"{name} (decode {dec})"


@dataclass
class LoadResult:
    """Everything one headless run produced. ``duration_s``: from the host's start to the last
    request's end (``vllm bench serve``'s benchmark duration)."""

    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    duration_s: float = 0.0
    t0_ns: int = 0
    #: stopped by Ctrl-C: the records of what finished, the rest withdrawn ("session end")
    interrupted: bool = False


class _Collect:
    """``run_load``'s own sink: the LoadResult's records, and the progress bar's count."""

    def __init__(self, res: LoadResult) -> None:
        self.res = res
        self.done = 0  # one writer (the delivering thread); the bar reads it

    def record(self, batch: RecordBatch) -> None:
        res = self.res
        res.steps.extend(batch.steps)
        res.requests.extend(batch.requests)
        res.events.extend(batch.events)
        # the bar counts the load, as the results do
        self.done += sum(1 for r in batch.requests if not is_probe_id(r.request_id))


def run_load(engine: LLMEngine, specs: Sequence[Any], *, sinks: Sequence[RecordSink] = (),
             console: Console | None = None, timeout_s: float | None = None,
             on_start: Callable[[EngineHost], None] | None = None,
             marks: Sequence[tuple[float, str]] = ()) -> LoadResult:
    """Replay ``specs`` (workload RequestSpecs) through an EngineHost until all have finished.

    ``sinks`` (``engine_host.sinks.RecordSink``, e.g. a trace recorder) get every loop turn's
    records after the result's own collector, in their order. ``on_start(host)`` is called just
    before the host starts: commands it queues (``set_config``, ``mark``) are in force from the
    first step (``gpuchef ab`` switches settings and marks runs this way). ``marks``: ``(s from
    the load's start, label)`` pairs sent as ``host.mark(label)`` when due (a phased workload's
    phase starts, ``phase_marks``); those not yet due when the load ends are not sent. Shows a
    progress bar
    on a terminal. Ctrl-C (KeyboardInterrupt) ends the run early: the requests still in the engine
    are withdrawn (``finish_reason`` ``probes.metrics.SESSION_END_REASON``, one RequestRecord
    each, to the sinks too) and the result says ``interrupted``. Raises the engine thread's
    exception if it died; TimeoutError past ``timeout_s``.
    """
    res = LoadResult()
    collect = _Collect(res)
    host = make_host(engine, [collect, *sinks])
    host.set_workload(specs)
    console = console or Console(stderr=True, soft_wrap=True)
    total = sum(1 for s in specs if not is_probe_id(s.request_id))
    with Progress(TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("requests", total=total)
        if on_start is not None:
            on_start(host)
        due = sorted(marks)
        while due and due[0][0] <= 0:  # in force from the first step, as on_start's commands
            host.mark(due.pop(0)[1])
        host.start()
        res.t0_ns = host.t0_ns
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        wait = 0.1
        try:
            while not host.wait_done(wait):
                now_s = (time.monotonic_ns() - host.t0_ns) / 1e9
                while due and due[0][0] <= now_s:
                    host.mark(due.pop(0)[1])
                wait = min(0.1, max(0.001, due[0][0] - now_s)) if due else 0.1
                progress.update(task, completed=collect.done)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run did not finish within {timeout_s} s "
                                       f"({collect.done}/{total} requests done)")
        except KeyboardInterrupt:  # Ctrl-C: what finished stands, the rest is withdrawn
            res.interrupted = True
        finally:
            # the requests still in the engine end as withdrawn, each with its record
            host.stop(abort_remaining=res.interrupted, abort_reason=SESSION_END_REASON)
    if host.error is not None:
        raise host.error
    from ..probes.metrics import benchmark_duration_s

    res.duration_s = benchmark_duration_s(res.t0_ns, res.requests)  # the one definition
    return res


# ---- probes and trace, shared by the headless commands (bench, ab) ---------------------------

def load_desc(w: Any) -> str:
    """One line naming a WorkloadConfig's load, for results blocks."""
    if w.dataset == "random":
        return f"random, {w.request_rate} req/s, burstiness {w.burstiness}"
    if w.is_phased:
        from ..engine_host.vocab.phases import load_workload

        names = " → ".join(p.name for p in load_workload(w.dataset).phases)
        return f"{w.dataset} at {w.trace_speed}x ({names})"
    return f"{w.dataset} at {w.trace_speed}x"


def phase_marks(w: Any) -> list[tuple[float, str]]:
    """``run_load``'s ``marks`` for a phased WorkloadConfig: each phase's start as run (s from
    the load's start) and its mark (``phases.phase_mark``); [] for any other load."""
    if w is None or not w.is_phased:
        return []
    from ..engine_host.vocab.phases import load_workload, phase_mark, schedule

    return [(p["start_s"], phase_mark(p["name"]))
            for p in schedule(load_workload(w.dataset), w.trace_speed, w.duration_s)]


def phases_meta(w: Any) -> dict[str, Any] | None:
    """The trace meta's ``phases`` record of a phased WorkloadConfig (each phase's start and
    end as run, s from the load's start, and its definition: ``phases.phases_meta``), else
    None."""
    if w is None or not w.is_phased:
        return None
    from ..engine_host.vocab.phases import load_workload, phases_meta as meta

    return meta(load_workload(w.dataset), w.trace_speed, w.duration_s)


def trace_meta(engine: LLMEngine, ecfg: EngineConfig, wcfg: Any, command: str) -> dict[str, Any]:
    """The facts a headless command puts into its trace's meta record (docs/trace-format.md)."""
    from dataclasses import asdict

    lm = engine.loaded
    meta: dict[str, Any] = {
        "command": command,
        "model": {"name": lm.name, "random_weights": lm.random_weights, "source": lm.source,
                  "num_params": lm.num_params, "dtype": str(engine.dtype).replace("torch.", "")},
        "device": str(engine.device), "attention_backend": engine.attn.name,
        "decode_attention": getattr(engine, "decode_attention", None),
        "kernels": getattr(engine, "kernels", None),  # BLAS library, RoPE + K/V append
        # async scheduling as run: the flag's default (None) resolved by the engine
        "engine_config": {**asdict(ecfg), "async_scheduling": bool(engine.async_scheduling)},
        **({"workload": asdict(wcfg)} if wcfg is not None else {}),
        **({"phases": ph} if (ph := phases_meta(wcfg)) is not None else {}),
        "source": {"kind": "hosted"},  # `top --attach` and `ab` over HTTP: "attached"
        "max_model_len": engine.max_model_len, "kv_blocks": engine.num_blocks,
        "block_size": engine.kv.block_size,
    }
    if engine.device.type == "cuda":
        meta["gpus"] = {str(engine.device.index or 0): device_name(engine)}
    return meta


def open_trace(path: str, meta: dict[str, Any], *, trace_prompts: bool = False):
    """A TraceRecorder writing to ``path`` with ``meta`` (a sink for ``run_load``'s host and
    the samplers). Raises ConfigError when ``path`` cannot be opened."""
    from ..probes.recorder import TraceRecorder

    return TraceRecorder(path, meta=meta, trace_prompts=trace_prompts)


class Samplers:
    """The NVML/GPM and host samplers of a headless run. Samples go to ``sink`` (e.g. a trace
    recorder's ``record``) as well as to each sampler's ring buffer. ``sample_hz`` 0 turns the
    NVML sampler off (to measure what sampling costs the engine). Raises ConfigError for a bad
    ``sample_hz``."""

    def __init__(self, gpus: list[int] | None, sample_hz: float,
                 sink: Callable[[Any], None] | None = None, *, nvml: Any = None) -> None:
        from ..probes.sampler import HostSampler
        from ..probes.nvml import NvmlSampler

        # nvml: a stand-in for the pynvml module (tests); None = pynvml
        # status changes (GPU lost, GPM held by a profiler, …) go to the trace as events
        self.nvml = (NvmlSampler(gpus, sample_hz, nvml=nvml, on_sample=sink, on_event=sink)
                     if sample_hz != 0 else None)
        self.host = HostSampler(on_sample=sink)

    def start(self) -> None:
        if self.nvml is not None:
            self.nvml.start()
        self.host.start()

    def stop(self) -> None:
        if self.nvml is not None:
            self.nvml.stop()
        self.host.stop()

    def gpu_samples(self, t0_ns: int, t1_ns: int) -> list[Any]:
        if self.nvml is None:
            return []
        return [x for x in list(self.nvml.samples) if t0_ns <= x.t_ns <= t1_ns]

    def gpu_means(self, t0_ns: int, t1_ns: int) -> dict[str, float]:
        """Mean of each GPU saturation field over ``[t0_ns, t1_ns]`` (%, W); NaN where no GPU
        sample has it."""
        return gpu_means(self.gpu_samples(t0_ns, t1_ns))  # probes/metrics.py: one NaN policy

    def sampler_cost(self) -> dict[str, float] | None:
        """What the NVML sampler cost over its whole run (None when it is off or never ticked):
        ``sample_hz`` asked, ``achieved_hz`` (tick periods per second from the first tick to the
        last, set-up and teardown excluded: a tick that overran its period skips the missed
        slots, so this falls below the asked rate when ticks are slow),
        ``tick_us_mean`` (wall µs of one tick, all GPUs, GIL waits included) and ``cpu_pct``
        (CPU time of the sampler thread, % of one core). The PCIe thread is not included."""
        s = self.nvml
        hz = math.nan if s is None else s.achieved_hz
        if hz != hz or not s.run_ns:
            return None
        return {"sample_hz": s.sample_hz, "achieved_hz": hz,
                "tick_us_mean": s.mean_tick_us, "cpu_pct": s.cpu_percent,
                "gpus": len(s.gpu_names)}

    def gpu_lines(self, t0_ns: int, t1_ns: int) -> dict[str, str]:
        """Results-block rows: mean GPU saturation over the run, or why there is none."""
        if self.nvml is None:
            return {"GPU:": "NVML sampler off (--sample-hz 0)"}
        if not self.gpu_samples(t0_ns, t1_ns):
            return {"GPU:": self.nvml.status or "no samples"}
        c = self.sampler_cost()
        cost = {} if c is None else {
            "NVML sampler Hz (asked / got):": f"{c['sample_hz']:g} / {c['achieved_hz']:.1f}",
            "NVML sampler µs/tick / CPU % of a core:":
                f"{c['tick_us_mean']:,.0f} / {c['cpu_pct']:.2f}"}
        return {"GPU:": self.nvml.status, **cost,
                **gpu_result_rows(self.gpu_means(t0_ns, t1_ns))}
