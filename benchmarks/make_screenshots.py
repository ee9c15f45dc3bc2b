"""Drive `gpuchef top` with Textual's Pilot over the real engine and save SVG screenshots.

Scenes: the main screen under continuous batching, the same after switching to chunked prefill
(the switch is marked on the waveforms), chunked with the autopilot on (``b``: its allowance on
the batch composition, its predicted vs actual step time and status), the live A/B screen, and
the help screen.

    python benchmarks/make_screenshots.py                      # CPU: tiny + the bundled trace
    python benchmarks/make_screenshots.py --model llama-3-8b --prefix h200-   # a GPU machine
    python benchmarks/make_screenshots.py --engine vllm --tensor-parallel-size 2 \
        --model llama-3-8b --dataset azure-conv --scenes main-chunked --size 190x50 \
        --prefix h200-vllm-tp2-                    # 2 GPUs: header "vLLM 0.24.0 TP 2  GPUs 0,1"

``--scenes`` picks shots (default: all, in the order below); the run goes through the same
sequence but only waits for and saves the scenes asked for: `main-continuous` (warm-up + one
phase in continuous), `main-chunked` (switch to chunked, one phase), `main-autopilot` (then `b`
with ``--auto-budget``'s targets, one phase; `b` again after the shot), `ab` (A = chunked, B =
continuous, ``--ab-s``), `help`. `--scenes main-chunked` alone takes warm-up + one phase.

Without --dataset the load is `gpuchef top`'s default for the device (on a CPU: the Azure trace at
0.5×, prompts ≤ 1024, outputs ≤ 128 tokens, budget 512; on a GPU: the trace at 1×).

``--check``: are the committed screenshots current? The scenes asked for are drawn into a
temporary folder (shorter phases by default: 5 s warm-up, 10 s a phase, 20 s of A/B) and each is
compared with ``--out``/PREFIX+scene.svg by its structure — the panels' titles and legends, the
side panels' titles and labels, the key bar, the words of the header, the A/B table's rows —
not by its live numbers or chart glyphs. Exit 1 listing the differences (redraw with the same
flags without ``--check``), 0 when all match:

    python benchmarks/make_screenshots.py --check                     # every CPU scene, ~2 min
    python benchmarks/make_screenshots.py --check --scenes main-chunked --size 80x24 \
        --prefix cpu-80x24-
"""

from __future__ import annotations

import argparse
import asyncio
import html
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from gpuchef.engine_host.vocab.config import (AUTO_BUDGET, ENGINES, CacheConfig, EngineConfig,
                                              SchedulerConfig, parse_value)
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.workload import WorkloadConfig
from gpuchef.sessions.live import LiveSession
from gpuchef.probes.sampler import check_sample_hz
from gpuchef.probes.nvml import SAMPLE_HZ_RANGE, parse_gpus
from gpuchef.sessions.headless import build_engine
from gpuchef.commands.top import (CPU_BUDGET, CPU_MAX_INPUT_LEN, CPU_MAX_OUTPUT_LEN, CPU_TRACE_SPEED,
                             DEFAULT_SLOS_CPU, DEFAULT_SLOS_GPU)
from gpuchef.tui.app import GpuchefApp

SIZE = (170, 50)
SCENES = ("main-continuous", "main-chunked", "main-autopilot", "ab", "help")
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]*")


def parse_scenes(spec: str | None) -> tuple[str, ...]:
    """``"main-chunked,help"`` → those scenes in run order; None/""/"all" → all. ConfigError for
    an unknown name."""
    if spec is None or spec.strip().lower() in ("", "all"):
        return SCENES
    names = [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in names if x not in SCENES]
    if bad:
        raise ConfigError(f"--scenes {spec!r}: unknown {', '.join(bad)}; choose from "
                          f"{', '.join(SCENES)} (comma-separated) or all")
    return tuple(x for x in SCENES if x in names)


def session_for(engine, *, dataset: str | None, speed: float | None, budget: int | None,
                trace: str | None = None, sample_hz: float = 10.0,
                gpus: list[int] | None = None) -> LiveSession:
    """A LiveSession with `gpuchef top`'s defaults for the engine's device."""
    cpu = engine.device.type == "cpu"
    wcfg = WorkloadConfig(
        dataset=dataset or "azure-conv",
        trace_speed=speed or (CPU_TRACE_SPEED if cpu else 1.0),
        max_input_len=CPU_MAX_INPUT_LEN if cpu and not dataset else None,
        max_output_len=CPU_MAX_OUTPUT_LEN if cpu and not dataset else None,
        request_rate=4.0, num_prompts=100,
        vocab_size=engine.model_config.vocab_size, max_model_len=engine.max_model_len)
    # as `gpuchef top` says it: the budget's number is the header's live one, not the note's
    note = (f"CPU defaults: prompt≤{CPU_MAX_INPUT_LEN} output≤{CPU_MAX_OUTPUT_LEN}; "
            "CPU default budget") if cpu and not dataset else ""
    s = LiveSession(engine, wcfg, sample_hz=sample_hz, gpus=gpus, trace_path=trace,
                    slos=DEFAULT_SLOS_CPU if cpu else DEFAULT_SLOS_GPU, note=note)
    # in force from the first step (the engine runs in its own process: a command, not a set)
    s.host.set_config(mode="continuous",
                      max_num_batched_tokens=budget or (CPU_BUDGET if cpu else 2048))
    return s


def parse_size(spec: str) -> tuple[int, int]:
    """``"170x50"`` → (170, 50): the terminal the app is drawn in. ConfigError otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", spec)
    if not m or not (80 <= int(m.group(1)) <= 400 and 24 <= int(m.group(2)) <= 200):
        raise ConfigError(f"--size {spec!r}: use COLSxROWS, e.g. 170x50 (80–400 × 24–200)")
    return int(m.group(1)), int(m.group(2))


async def scenes(app: GpuchefApp, out: Path, prefix: str, phase_s: float, ab_s: float,
                 log, warmup_s: float = 0.0, only: tuple[str, ...] = SCENES,
                 size: tuple[int, int] = SIZE) -> list[Path]:
    """Go through the scenes in order, waiting for and saving only those in ``only``."""
    saved = []

    def shot(name: str) -> None:
        p = out / f"{prefix}{name}.svg"
        p.write_text(app.export_screenshot(title=f"gpuchef top — {name}"))
        saved.append(p)
        log(f"saved {p}")

    async with app.run_test(size=size) as pilot:
        await pilot.pause(warmup_s)
        if "main-continuous" in only:
            await pilot.pause(phase_s)
            shot("main-continuous")
        if "main-chunked" in only or "main-autopilot" in only or "ab" in only:
            await pilot.press("m")  # → chunked, marked on the waveforms
        if "main-chunked" in only:
            await pilot.pause(phase_s)
            shot("main-chunked")
        if "main-autopilot" in only:
            await pilot.press("b")  # the autopilot on, with app.auto_budget_targets
            await pilot.pause(phase_s)
            shot("main-autopilot")
            await pilot.press("b")
        if "ab" in only:
            await pilot.press("a")  # A/B: A = chunked (now), B = continuous
            await pilot.pause(ab_s)
            shot("ab")
            await pilot.press("x")
            await pilot.pause(1.0)
            await pilot.press("escape")
        if "help" in only:
            await pilot.press("question_mark")
            await pilot.pause(0.5)
            shot("help")
            await pilot.press("escape")
    return saved


def take(engine, out: Path, *, prefix: str, dataset: str | None = None,
         speed: float | None = None, budget: int | None = None, window_s: float = 60.0,
         ab_window_s: float = 8.0, warmup_s: float = 30.0, phase_s: float = 45.0,
         ab_s: float = 45.0, log=print, sample_hz: float = 10.0,
         gpus: list[int] | None = None, only: tuple[str, ...] = SCENES,
         size: tuple[int, int] = SIZE, auto_budget: str | None = None) -> list[Path]:
    """The scenes in ``only`` (default all) over ``engine`` (already built); returns the SVG
    paths. ``auto_budget``: the autopilot's targets for `main-autopilot` (default: `b`'s)."""
    if not SAFE_NAME.fullmatch(prefix):
        raise ConfigError(f"--prefix {prefix!r}: file names take only letters, digits, . _ -")
    out.mkdir(parents=True, exist_ok=True)
    session = session_for(engine, dataset=dataset, speed=speed, budget=budget,
                          sample_hz=sample_hz, gpus=gpus)
    app = GpuchefApp(session, window_s=window_s, ab_window_s=ab_window_s, show_ui_cost=True)
    if auto_budget:
        app.auto_budget_targets = auto_budget
    session.start()
    try:
        return asyncio.run(scenes(app, out, prefix, phase_s, ab_s, log, warmup_s, only, size))
    finally:
        session.close()


_SVG_TEXT = re.compile(r'<text [^>]*?x="([\d.]+)"[^>]*?textLength="([\d.]+)"'
                       r'[^>]*?clip-path="url\(#[^)]*-line-(\d+)\)"[^>]*>(.*?)</text>', re.S)
_NUM = re.compile(r"\d+(?:[.,:]\d+)*")
_WORD = re.compile(r"[A-Za-z][A-Za-z_]*[A-Za-z]")
_TABLE_ROW = re.compile(r"([A-Z][A-Za-z0-9 ]*?(?: \([^)]*\))?) {2,}[-+\d–]")


def svg_rows(svg: str) -> list[str]:
    """The screen's text, one string a terminal row, from a Textual SVG export (each ``<text>``
    element names its row in its clip path, ``…-line-N``; a run of cells without text becomes
    one space)."""
    rows: dict[int, list] = defaultdict(list)
    for m in _SVG_TEXT.finditer(svg):
        text = html.unescape(m.group(4)).replace("\xa0", " ")
        x = float(m.group(1))
        rows[int(m.group(3))].append((x, x + float(m.group(2)), text))
    out = []
    for i in range(max(rows, default=-1) + 1):
        line, end = "", None
        for x, x_end, text in sorted(rows.get(i, [])):
            line += (" " if end is not None and x > end + 1 else "") + text
            end = x_end
        out.append(line)
    return out


def _mask(text: str) -> str:
    """Numbers → ``#``, runs of spaces → one: what stays is the label, not the live value."""
    return re.sub(r"\s+", " ", _NUM.sub("#", text)).strip()


def structure(svg: str) -> dict[str, list[str]]:
    """What a screenshot shows apart from its live values: each panel's title and legend (``▍``),
    the side panels' titles (``─Title─``) and label words (right of the last ``▏``), the key bar
    (the last row), the header's words (the rows above the first panel; a whole screen without
    panels, such as help) and the A/B table's row names. Numbers are masked; chart glyphs and
    status text inside a title after its name (an autopilot's "fitted, err 8 %") are left out."""
    rows = svg_rows(svg)
    first = next((i for i, r in enumerate(rows) if "▍" in r), len(rows))
    panels, boxes = [], []
    for r in rows:
        for m in re.finditer(r"▍([^▍▏]*)", r):
            title = m.group(1)
            name = re.split(r" {2,}|:", title.strip(), maxsplit=1)[0]
            legend = [_mask(x) for x in re.findall(r"■ ([^■]*?)(?= {2,}|■|$)", title)]
            panels.append(_mask(name) + (f" [{', '.join(legend)}]" if legend else ""))
        boxes += [_mask(m.group(1)) for m in re.finditer(r"─([A-Za-z][^─]*?)─", r)]
    return {
        "panels": panels,
        "side-panel titles": boxes,
        "side-panel labels": sorted({w for r in rows if "▏" in r
                                     for w in _WORD.findall(r.rsplit("▏", 1)[1])}),
        "header": sorted(set(_WORD.findall("\n".join(rows[:first])))),
        "table rows": [_mask(m.group(1)) for r in rows for m in [_TABLE_ROW.match(r)] if m],
        "key bar": [_mask(rows[-1])] if rows else [],
    }


def compare(committed: str, drawn: str) -> list[str]:
    """The structural differences of two screenshots (SVG text), one line each; [] when they
    match."""
    a, b = structure(committed), structure(drawn)
    out = []
    for key in a:
        if a[key] != b[key]:
            gone = [x for x in a[key] if x not in b[key]]
            new = [x for x in b[key] if x not in a[key]]
            if not gone and not new:
                out.append(f"{key}: the same items in another order: {b[key]}")
            else:
                out.append(f"{key}: only the committed one has {gone}; only the code's has {new}")
    return out


def check(drawn: list[Path], committed_dir: Path, log) -> int:
    """Compare each drawn SVG with the committed one of the same name; 0 when all match."""
    bad = 0
    for p in drawn:
        ref = committed_dir / p.name
        if not ref.exists():
            log(f"[red]missing[/] {escape(str(ref))}")
            bad += 1
            continue
        diffs = compare(ref.read_text(encoding="utf-8"), p.read_text(encoding="utf-8"))
        if diffs:
            bad += 1
            log(f"[red]stale[/] {escape(str(ref))}:")
            for d in diffs:
                log(f"  {escape(d)}")
        else:
            log(f"current {escape(str(ref))}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="native", choices=ENGINES,
                    help="native: gpuchef's engine; vllm: vLLM hosted in-process (GPU only)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="GPUs for --engine vllm (the native engine uses one)")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--trace-speed", type=float, default=None)
    ap.add_argument("--budget", type=int, default=None, help="max_num_batched_tokens")
    ap.add_argument("--sample-hz", type=float, default=10.0,
                    help="NVML/GPM sampling rate (Hz, 1–100), as `gpuchef top --sample-hz`")
    ap.add_argument("--gpus", default=None,
                    help="GPUs to sample (NVML indices): 0,1 or 0-3 or all (default: all), "
                         "as `gpuchef top --gpus`")
    ap.add_argument("--scenes", default="all",
                    help=f"comma list of {','.join(SCENES)} (default: all)")
    ap.add_argument("--warmup-s", type=float, default=None,
                    help="seconds of load before the first phase (the trace starts slowly; "
                         "default 30, 5 with --check)")
    ap.add_argument("--phase-s", type=float, default=None,
                    help="seconds per mode before a shot (default 45, 10 with --check)")
    ap.add_argument("--ab-window", type=float, default=8.0)
    ap.add_argument("--ab-s", type=float, default=None,
                    help="seconds of A/B before the shot (default 45, 20 with --check)")
    ap.add_argument("--auto-budget", default=None,
                    help="the autopilot's targets for main-autopilot (default: b's, "
                         "itl_p99:50ms,ttft_p99:2s)")
    ap.add_argument("--window", type=float, default=60.0, help="waveform window (s)")
    ap.add_argument("--size", default=f"{SIZE[0]}x{SIZE[1]}",
                    help="terminal size COLSxROWS (default %(default)s)")
    ap.add_argument("--out", default="screenshots")
    ap.add_argument("--prefix", default="cpu-")
    ap.add_argument("--check", action="store_true",
                    help="draw the scenes in a temporary folder and compare their structure "
                         "with the committed ones in --out (exit 1 when one is stale)")
    a = ap.parse_args(argv)
    quick = a.check
    warmup_s = a.warmup_s if a.warmup_s is not None else (5.0 if quick else 30.0)
    phase_s = a.phase_s if a.phase_s is not None else (10.0 if quick else 45.0)
    ab_s = a.ab_s if a.ab_s is not None else (20.0 if quick else 45.0)
    err = Console(stderr=True)
    engine = None
    t0 = time.monotonic()
    tmp = tempfile.TemporaryDirectory(prefix="gpuchef-shots-") if a.check else None
    try:
        only = parse_scenes(a.scenes)
        size = parse_size(a.size)
        if not SAFE_NAME.fullmatch(a.prefix):
            raise ConfigError(f"--prefix {a.prefix!r}: file names take only letters, digits, "
                              ". _ -")
        if a.auto_budget:  # refused here, with its message, before the engine is built
            a.auto_budget = parse_value(AUTO_BUDGET, a.auto_budget)
        sample_hz = check_sample_hz(a.sample_hz, *SAMPLE_HZ_RANGE, flag="--sample-hz")
        gpus = parse_gpus(a.gpus)
        # the start-up budget is the most vLLM takes live: start with the one the shots use
        sched = SchedulerConfig() if a.budget is None else \
            SchedulerConfig(max_num_batched_tokens=a.budget)
        engine = build_engine(EngineConfig(model=a.model, device=a.device, cache=CacheConfig(),
                                           scheduler=sched, engine=a.engine,
                                           tensor_parallel_size=a.tensor_parallel_size), err)
        t0 = time.monotonic()
        saved = take(engine, Path(tmp.name) if tmp else Path(a.out), prefix=a.prefix,
                     dataset=a.dataset, speed=a.trace_speed, budget=a.budget,
                     window_s=a.window, ab_window_s=a.ab_window, warmup_s=warmup_s,
                     phase_s=phase_s, ab_s=ab_s, log=err.print, sample_hz=sample_hz,
                     gpus=gpus, only=only, size=size, auto_budget=a.auto_budget)
        rc = check(saved, Path(a.out), err.print) if tmp else 0
    except ConfigError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        return 2
    finally:
        close = getattr(engine, "close", None)  # vLLM: stop its TP worker processes
        if close is not None:
            close()
        if tmp is not None:
            tmp.cleanup()
    err.print(f"done in {time.monotonic() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
