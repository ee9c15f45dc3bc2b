"""Record a short CPU trace with `gpuchef bench` and save an SVG of `gpuchef replay` on it.

    python benchmarks/make_replay_screenshot.py                     # → screenshots/cpu-replay.svg
    python benchmarks/make_replay_screenshot.py --trace run.jsonl --at 42 --out x.svg

Without --trace it runs the tiny model on the CPU (random prompts, 4 req/s, ~15 s, continuous
batching with a 512-token budget) and writes the trace to a temporary folder. The app is driven
with Textual's Pilot: seek to ``--at`` seconds, paused, then the screenshot.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.commands.replay import build_app

SIZE = (170, 50)


def record(path: Path) -> None:
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--dataset",
                                 "random", "--num-prompts", "60", "--input-len", "256",
                                 "--output-len", "64", "--request-rate", "4", "--mode",
                                 "continuous", "--max-num-batched-tokens", "512",
                                 "--trace", str(path)], catch_exceptions=False)
    if r.exit_code != 0:
        raise SystemExit(r.output)


async def shoot(trace: str, at: float, out: Path, window: str) -> None:
    app = build_app(trace, paused=True, window=window)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        app.seek_to(str(at))
        await pilot.pause(0.5)
        app.save_screenshot(out.name, path=str(out.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="an existing trace (default: record one)")
    ap.add_argument("--at", type=float, default=12.0, help="position (s from the start)")
    ap.add_argument("--window", default="10s", help="waveform window")
    ap.add_argument("--out", default="screenshots/cpu-replay.svg")
    a = ap.parse_args()
    _register()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        trace = a.trace
        if trace is None:
            trace = str(Path(d) / "cpu.jsonl")
            record(Path(trace))
        asyncio.run(shoot(trace, a.at, out, a.window))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
