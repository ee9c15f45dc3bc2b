"""Drive `gpuchef top` with Textual's Pilot over the real engine and save SVG screenshots.

Scenes: the main screen under continuous batching, the same after switching to chunked prefill
(the switch is marked on the waveforms), the live A/B screen, and the help screen.

    python benchmarks/make_screenshots.py                      # CPU: tiny + the bundled trace
    python benchmarks/make_screenshots.py --model llama-3-8b --prefix h200-   # a GPU machine

Without --dataset the load is `gpuchef top`'s default for the device (on a CPU: the Azure trace at
0.5×, prompts ≤ 1024, outputs ≤ 128 tokens, budget 512; on a GPU: the trace at 1×).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from rich.console import Console

from gpuchef.engine_host.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.workload import WorkloadConfig
from gpuchef.live import LiveSession
from gpuchef.session import build_engine
from gpuchef.top_cmd import (CPU_BUDGET, CPU_MAX_INPUT_LEN, CPU_MAX_OUTPUT_LEN, CPU_TRACE_SPEED,
                             DEFAULT_SLOS_CPU, DEFAULT_SLOS_GPU)
from gpuchef.tui.app import GpuchefApp

SIZE = (170, 50)


def session_for(engine, *, dataset: str | None, speed: float | None, budget: int | None,
                trace: str | None = None, sample_hz: float = 10.0) -> LiveSession:
    """A LiveSession with `gpuchef top`'s defaults for the engine's device."""
    cpu = engine.device.type == "cpu"
    sc = engine.scheduler_config
    engine.set_scheduler_config(sc.with_changes(
        mode="continuous", max_num_batched_tokens=budget or (CPU_BUDGET if cpu else 2048)))
    wcfg = WorkloadConfig(
        dataset=dataset or "azure-conv",
        trace_speed=speed or (CPU_TRACE_SPEED if cpu else 1.0),
        max_input_len=CPU_MAX_INPUT_LEN if cpu and not dataset else None,
        max_output_len=CPU_MAX_OUTPUT_LEN if cpu and not dataset else None,
        request_rate=4.0, num_prompts=100,
        vocab_size=engine.model_config.vocab_size, max_model_len=engine.max_model_len)
    note = (f"CPU defaults: prompt≤{CPU_MAX_INPUT_LEN} output≤{CPU_MAX_OUTPUT_LEN}; budget "
            f"{CPU_BUDGET}") if cpu and not dataset else ""
    return LiveSession(engine, wcfg, sample_hz=sample_hz, trace_path=trace,
                       slos=DEFAULT_SLOS_CPU if cpu else DEFAULT_SLOS_GPU, note=note)


async def scenes(app: GpuchefApp, out: Path, prefix: str, phase_s: float, ab_s: float,
                 log, warmup_s: float = 0.0) -> list[Path]:
    saved = []

    def shot(name: str) -> None:
        p = out / f"{prefix}{name}.svg"
        p.write_text(app.export_screenshot(title=f"gpuchef top — {name}"))
        saved.append(p)
        log(f"saved {p}")

    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(warmup_s + phase_s)
        shot("main-continuous")
        await pilot.press("m")  # → chunked, marked on the waveforms
        await pilot.pause(phase_s)
        shot("main-chunked")
        await pilot.press("a")  # A/B: A = chunked (now), B = continuous
        await pilot.pause(ab_s)
        shot("ab")
        await pilot.press("x")
        await pilot.pause(1.0)
        await pilot.press("escape")
        await pilot.press("question_mark")
        await pilot.pause(0.5)
        shot("help")
        await pilot.press("escape")
    return saved


def take(engine, out: Path, *, prefix: str, dataset: str | None = None,
         speed: float | None = None, budget: int | None = None, window_s: float = 60.0,
         ab_window_s: float = 8.0, warmup_s: float = 30.0, phase_s: float = 45.0,
         ab_s: float = 45.0, log=print) -> list[Path]:
    """All scenes over ``engine`` (already built); returns the SVG paths."""
    out.mkdir(parents=True, exist_ok=True)
    session = session_for(engine, dataset=dataset, speed=speed, budget=budget)
    app = GpuchefApp(session, window_s=window_s, ab_window_s=ab_window_s, show_ui_cost=True)
    session.start()
    try:
        return asyncio.run(scenes(app, out, prefix, phase_s, ab_s, log, warmup_s))
    finally:
        session.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--trace-speed", type=float, default=None)
    ap.add_argument("--budget", type=int, default=None, help="max_num_batched_tokens")
    ap.add_argument("--warmup-s", type=float, default=30.0,
                    help="seconds of load before the first phase (the trace starts slowly)")
    ap.add_argument("--phase-s", type=float, default=45.0, help="seconds per mode before a shot")
    ap.add_argument("--ab-window", type=float, default=8.0)
    ap.add_argument("--ab-s", type=float, default=45.0, help="seconds of A/B before the shot")
    ap.add_argument("--window", type=float, default=60.0, help="waveform window (s)")
    ap.add_argument("--out", default="screenshots")
    ap.add_argument("--prefix", default="cpu-")
    a = ap.parse_args(argv)
    err = Console(stderr=True)
    engine = build_engine(EngineConfig(model=a.model, device=a.device,
                                       cache=CacheConfig(), scheduler=SchedulerConfig()), err)
    t0 = time.monotonic()
    take(engine, Path(a.out), prefix=a.prefix, dataset=a.dataset, speed=a.trace_speed,
         budget=a.budget, window_s=a.window, ab_window_s=a.ab_window, warmup_s=a.warmup_s,
         phase_s=a.phase_s, ab_s=a.ab_s, log=err.print)
    err.print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
