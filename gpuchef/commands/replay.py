"""`gpuchef replay TRACE`: the dashboard on a saved trace — play, pause, seek, speed; read-only."""

from __future__ import annotations

import math
import sys

import click
from rich.console import Console
from rich.markup import escape

from ..engine_host.vocab.errors import ConfigError


@click.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--speed", default=1.0, show_default=True, type=float,
              help="Playback speed (×, 0.25–16; , and . halve and double it).")
@click.option("--start", "start_s", default=0.0, show_default=True, type=float,
              help="Start at this many seconds from the trace's first record.")
@click.option("--window", default="60s", show_default=True,
              help="Waveform time window: 10s, 60s, 10m or seconds (keys 1/2/3 switch it).")
@click.option("--paused", is_flag=True, help="Open paused (space plays).")
@click.option("--fps", default=10.0, show_default=True, type=float,
              help="Dashboard refresh rate (Hz, 1–30).")
@click.option("--screenshot-dir", default=".", show_default=True,
              help="Where `s` saves SVG screenshots (created if missing).")
def replay(trace: str, speed: float, start_s: float, window: str, paused: bool, fps: float,
           screenshot_dir: str) -> None:
    """Open the dashboard on a saved trace (`gpuchef bench/top --trace`): the same panels, read
    only, with a playback clock.

    Keys: space play/pause, ←/→ seek 5 s (shift: 30 s), , / . speed ÷2 / ×2, Home/End,
    g go to a time, 1/2/3 window, ? help, q quit.

    Examples:

      gpuchef replay run.jsonl

      gpuchef replay run.jsonl --start 90 --speed 4 --window 10s
    """
    err = Console(stderr=True, soft_wrap=True)
    try:
        app = build_app(trace, speed=speed, start_s=start_s, window=window, paused=paused,
                        fps=fps, screenshot_dir=screenshot_dir, err=err)
    except ConfigError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(2)
    app.run()


def build_app(trace: str, *, speed: float = 1.0, start_s: float = 0.0, window: str = "60s",
              paused: bool = False, fps: float = 10.0, screenshot_dir: str = ".",
              err: Console | None = None):
    """The ReplayApp for ``trace``; warnings (skipped lines, a missing end record) go to ``err``.
    Raises ConfigError for a file that is not a readable gpuchef trace or a bad option."""
    from ..probes.recorder import TraceReadError, read_trace
    from ..report.data import cut_short_line
    from ..sessions.replay import SPEED_MAX, SPEED_MIN, ReplaySession
    from ..tui.replay import ReplayApp
    from .options import check_screenshot_dir, parse_window

    window_s = parse_window(window)
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ConfigError(f"--start {start_s:g} is out of range: a finite number of seconds >= 0")
    if not (math.isfinite(speed) and SPEED_MIN <= speed <= SPEED_MAX):
        raise ConfigError(f"--speed {speed:g} is out of range: allowed [{SPEED_MIN:g}, "
                          f"{SPEED_MAX:g}]×")
    if not 1 <= fps <= 30:
        raise ConfigError(f"--fps {fps:g} is out of range: allowed [1, 30]")
    try:
        tr = read_trace(trace)
    except TraceReadError as e:
        raise ConfigError(str(e)) from None
    warnings = list(tr.problems)
    if not tr.complete:
        warnings.append(cut_short_line(trace, "replaying what was written"))
    if err is not None:
        for p in warnings:
            err.print(f"[yellow]warning:[/] {escape(p)}")
    session = ReplaySession(tr, start_s=start_s, speed=speed)
    if start_s > session.duration_s:
        raise ConfigError(f"--start {start_s:g} is beyond the end of {trace}: allowed "
                          f"[0, {session.duration_s:.1f}] s")
    if not (tr.steps or tr.gpu_samples or tr.requests or tr.scrapes or tr.plugin):
        raise ConfigError(f"{trace}: the trace holds no steps, samples, requests, scrapes or "
                          "plugin records to replay")
    screenshot_dir = check_screenshot_dir(screenshot_dir)  # last: a refused run makes no folder
    if not paused:
        session.play()
    return ReplayApp(session, window_s=window_s, fps=fps, screenshot_dir=screenshot_dir,
                     show_ui_cost=False, warnings=warnings)
