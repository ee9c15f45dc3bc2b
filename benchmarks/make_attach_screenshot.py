"""Save an SVG of `gpuchef top --attach` on `gpuchef serve --model tiny` (CPU) under gpuchef's
own load: the attached dashboard as a user sees it.

    python benchmarks/make_attach_screenshot.py            # → screenshots/cpu-attach.svg
    python benchmarks/make_attach_screenshot.py --ab       # → screenshots/cpu-attach-ab.svg
    python benchmarks/make_attach_screenshot.py --plugin-demo  # → cpu-attach-plugin.svg
    # servers already running (e.g. two `vllm serve` on the H200), gpuchef's load as given:
    python benchmarks/make_attach_screenshot.py --url U1 [--url U2 --ab] --out X.svg \
        --trace T.jsonl --load "--dataset azure-conv --num-prompts 200 --trace-speed 3"
    # a vLLM started with GPUCHEF_PUBLISH=127.0.0.1:5557 (gpuchef's plugin installed):
    python benchmarks/make_attach_screenshot.py --url http://127.0.0.1:8000 \
        --plugin 127.0.0.1:5557 --out screenshots/attach-plugin.svg

The server runs as a subprocess on a free loopback port (tests/gpuchef/serve_proc.py) and is
stopped at the end; the dashboard is driven with Textual's Pilot for ~20 s of load. ``--ab``: two
servers (budgets 16 and 2048, 256-token prompts), ``a`` runs the mirrored A/B of the same load
on both (`top --attach U1 --attach U2 --ab-load mirrored`), the shot once it has finished.

``--plugin-demo`` (a CPU has no vLLM): ``plugin_demo.DemoVllm``, a stand-in vLLM front end with
two data-parallel engines that calls gpuchef's real plugin (``GPUCHEF_PUBLISH`` on a free
loopback port) with vLLM 0.24-shaped stats of a simulated chunked-prefill scheduler, and serves
the same simulation's counters and gauges on /metrics; `top --attach URL --plugin HOST:PORT`
reads both. The stand-in's numbers are made up; the plugin, the reader and the dashboard are
the real ones.
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

from gpuchef.commands.top import _build, top  # noqa: E402

SIZE = (170, 50)
PLUGIN_SIZE = (170, 64)  # two engines: a band each in three more panels


CPU_LOAD = ["--dataset", "random", "--input-len", "200", "--output-len", "48", "--request-rate",
            "3", "--num-prompts", "200"]
CPU_AB_LOAD = ["--dataset", "random", "--input-len", "256", "--output-len", "16",
               "--request-rate", "3", "--num-prompts", "12"]


def build(url: str, load=CPU_LOAD, extra=(), window: str = "60s"):
    args = ["--attach", url, *load, "--window", window,
            "--goodput", "ttft:3000", "--goodput", "tpot:250", *extra]
    ctx = top.make_context("top", args)
    app = _build(ctx, dict(ctx.params), Console(file=io.StringIO()))
    app.show_ui_cost = False
    return app


async def shoot(app, out: Path, seconds: float, size=SIZE) -> None:
    try:
        async with app.run_test(size=size) as pilot:
            await pilot.pause(seconds)
            out.write_text(app.export_screenshot(title="gpuchef top --attach"))
            await pilot.press("q")
    finally:
        app.session.close()


def build_ab(u1: str, u2: str, load=CPU_AB_LOAD, extra=()):
    args = ["--attach", u1, "--attach", u2, "--ab-load", "mirrored", "--ab-repetitions", "2",
            *load, "--goodput", "ttft:3000", "--goodput", "tpot:250", *extra]
    ctx = top.make_context("top", args)
    app = _build(ctx, dict(ctx.params), Console(file=io.StringIO()))
    app.show_ui_cost = False
    return app


async def shoot_ab(app, out: Path, timeout: float) -> None:
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(1.0)
            await pilot.press("a")
            t = 0.0
            while (app.session.ab.state().active or not app.session.ab.state().run) \
                    and t < timeout:
                await pilot.pause(0.5)
                t += 0.5
            await pilot.pause(1.5)  # a scrape or two after the end
            out.write_text(app.export_screenshot(title="gpuchef top --attach: A/B"))
            await pilot.press("q")
    finally:
        app.session.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ab", action="store_true", help="the A/B screen of two attached servers")
    ap.add_argument("--url", action="append", default=[],
                    help="attach to this running server instead of starting gpuchef serve "
                         "(twice with --ab)")
    ap.add_argument("--load", default=None, help="gpuchef's load flags, one string (with --url)")
    ap.add_argument("--trace", default=None, help="write the session trace here")
    ap.add_argument("--timeout", type=float, default=240.0, help="--ab: seconds to wait")
    ap.add_argument("--plugin", action="append", default=[],
                    help="with --url: the endpoint of gpuchef's vLLM plugin in that server "
                         "(top's --plugin)")
    ap.add_argument("--plugin-demo", action="store_true",
                    help="a stand-in vLLM front end with two engines and gpuchef's real plugin")
    a = ap.parse_args()
    extra = ["--trace", a.trace] if a.trace else []
    extra += [x for p in a.plugin for x in ("--plugin", p)]
    if a.plugin_demo:
        from plugin_demo import DemoVllm

        out = Path(a.out or "screenshots/cpu-attach-plugin.svg")
        with DemoVllm(engines=2) as demo:
            app = build(demo.url, (), [*extra, "--plugin", demo.plugin], window="10s")
            demo.start()
            asyncio.run(shoot(app, out, a.seconds, size=PLUGIN_SIZE))
        print(out)
        return
    if a.url:
        import shlex

        load = shlex.split(a.load) if a.load else (CPU_AB_LOAD if a.ab else CPU_LOAD)
        if a.ab:
            if len(a.url) != 2:
                ap.error("--ab with --url takes two: --url U1 --url U2")
            out = Path(a.out or "screenshots/attach-ab.svg")
            asyncio.run(shoot_ab(build_ab(*a.url, load, extra), out, a.timeout))
        else:
            out = Path(a.out or "screenshots/attach.svg")
            asyncio.run(shoot(build(a.url[0], load, extra), out, a.seconds))
        print(out)
        return
    if a.ab:
        out = Path(a.out or "screenshots/cpu-attach-ab.svg")
        with ServeProc("--max-model-len", "512", "--mode", "chunked",
                       "--max-num-batched-tokens", "16") as s1, \
                ServeProc("--max-model-len", "512", "--mode", "chunked",
                          "--max-num-batched-tokens", "2048") as s2:
            asyncio.run(shoot_ab(build_ab(s1.url, s2.url), out, 240.0))
        print(out)
        return
    out = Path(a.out or "screenshots/cpu-attach.svg")
    with ServeProc("--max-model-len", "512", "--max-num-batched-tokens", "256") as srv:
        asyncio.run(shoot(build(srv.url), out, a.seconds))
    print(out)


if __name__ == "__main__":
    main()
