"""Save an SVG of `gpuchef top --attach` on `gpuchef serve --model tiny` (CPU) under gpuchef's
own load: the attached dashboard as a user sees it.

    python benchmarks/make_attach_screenshot.py            # → screenshots/cpu-attach.svg

The server runs as a subprocess on a free loopback port (tests/gpuchef/serve_proc.py) and is
stopped at the end; the dashboard is driven with Textual's Pilot for ~20 s of load.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "gpuchef"))
from serve_proc import ServeProc  # noqa: E402

from gpuchef.top_cmd import _build, top  # noqa: E402

SIZE = (170, 50)


def build(url: str):
    args = ["--attach", url, "--dataset", "random", "--input-len", "200", "--output-len", "48",
            "--request-rate", "3", "--num-prompts", "200", "--window", "60s",
            "--goodput", "ttft:3000", "--goodput", "tpot:250"]
    ctx = top.make_context("top", args)
    app = _build(ctx, dict(ctx.params), Console(file=io.StringIO()))
    app.show_ui_cost = False
    return app


async def shoot(app, out: Path, seconds: float) -> None:
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(seconds)
            out.write_text(app.export_screenshot(title="gpuchef top --attach"))
            await pilot.press("q")
    finally:
        app.session.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="screenshots/cpu-attach.svg")
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    with ServeProc("--max-model-len", "512", "--max-num-batched-tokens", "256") as srv:
        asyncio.run(shoot(build(srv.url), Path(a.out), a.seconds))
    print(a.out)


if __name__ == "__main__":
    main()
