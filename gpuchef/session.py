"""Session wiring (the composition root): engine + load + host + listeners, for headless runs.

``build_engine`` loads the model with a progress bar; ``run_load`` drives a workload through an
EngineHost to the end and returns every record. The dashboard composes the same parts with a
Timeline instead of plain lists.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .engine_host.config import EngineConfig
from .engine_host.engine import LLMEngine
from .engine_host.host import EngineHost
from .engine_host.records import EngineEvent, RequestRecord, StepRecord


def build_engine(cfg: EngineConfig, console: Console | None = None) -> LLMEngine:
    """Load the model and size the KV cache, showing weight loading as a progress bar on
    ``console`` (stderr by default). Raises ConfigError for bad settings or a bad model folder."""
    console = console or Console(stderr=True)
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
        engine = LLMEngine(cfg, progress=on_progress)
    lm = engine.loaded
    kind = "random weights" if lm.random_weights else lm.source
    console.print(f"[dim]loaded {lm.name} ({kind}, {lm.num_params / 1e6:.1f} M params, "
                  f"{engine.dtype}) on {engine.device} in {time.perf_counter() - t0:.1f} s; "
                  f"KV cache {engine.num_blocks} blocks × {engine.kv.block_size} tokens; "
                  f"attention {engine.attn.name}[/dim]")
    return engine


@dataclass
class LoadResult:
    """Everything one headless run produced. ``duration_s``: from the host's start to the last
    request's end (``vllm bench serve``'s benchmark duration)."""

    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    duration_s: float = 0.0
    t0_ns: int = 0


def run_load(engine: LLMEngine, specs: Sequence[Any], *,
             listeners: Sequence[Callable[[str, Any], None]] = (),
             console: Console | None = None, timeout_s: float | None = None) -> LoadResult:
    """Replay ``specs`` (workload RequestSpecs) through an EngineHost until all have finished.

    ``listeners`` are called on the engine thread as ``listener(kind, record)`` with kind
    "step", "request" or "event" (e.g. a trace recorder). Shows a progress bar on a terminal.
    Raises the engine thread's exception if it died; TimeoutError past ``timeout_s``.
    """
    res = LoadResult()
    lock = threading.Lock()
    done_count = [0]

    def on_step(r: StepRecord) -> None:
        res.steps.append(r)
        for f in listeners:
            f("step", r)

    def on_request(r: RequestRecord) -> None:
        res.requests.append(r)
        with lock:
            done_count[0] += 1
        for f in listeners:
            f("request", r)

    def on_event(e: EngineEvent) -> None:
        res.events.append(e)
        for f in listeners:
            f("event", e)

    host = EngineHost(engine, on_step=on_step, on_request=on_request, on_event=on_event)
    host.set_workload(specs)
    console = console or Console(stderr=True)
    total = len(specs)
    with Progress(TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("requests", total=total)
        host.start()
        res.t0_ns = host.t0_ns
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not host.wait_done(0.1):
                progress.update(task, completed=done_count[0])
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run did not finish within {timeout_s} s "
                                       f"({done_count[0]}/{total} requests done)")
        finally:
            host.stop()
    if host.error is not None:
        raise host.error
    ends = [r.token_times_ns[-1] for r in res.requests if r.token_times_ns]
    end_ns = max(ends) if ends else time.monotonic_ns()
    res.duration_s = max(1e-9, (end_ns - res.t0_ns) / 1e9)
    return res
