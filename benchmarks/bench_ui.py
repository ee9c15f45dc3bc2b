"""What the dashboard costs: the UI thread's CPU at 10 fps, and the engine's throughput with the
dashboard open against `gpuchef bench`'s headless path on the same requests.

The dashboard runs with Textual's real terminal driver on a pseudo-terminal (fds 0/1/2 pointed
at it, 170×50, truecolor), so escape-code generation and writes are counted; a thread drains the
terminal as an emulator would. One process builds the engine once and alternates the runs.

1. UI cost, steady load (`gpuchef top`'s default load for the device): CPU time of the UI (main)
   thread over wall time, as % of one core, for each waveform window (60 s: the picture moves a
   column every 0.56 s; 10 s: every 0.09 s, so every frame redraws every chart).
2. Throughput: the same seeded requests (random dataset, arrivals faster than the engine
   serves them, so the run is engine-bound) through (a) `session.run_load` with the NVML and host
   samplers, as `gpuchef bench` runs them, and (b) the dashboard's session (EngineHost + Timeline
   + samplers) with the app open. Throughput = (prompt + output tokens) / duration, duration =
   first arrival to last token (vllm bench serve's); runs alternate H D D H … to spread drift.

    python benchmarks/bench_ui.py                              # CPU, tiny
    python benchmarks/bench_ui.py --model llama-3-8b --num-prompts 400 --input-len 1024 \\
        --output-len 256 --request-rate 40                     # a GPU machine

3. ``--synthetic-steps-per-s N``: the UI cost (1.) at a GPU's step rate on any machine: the
   session's engine is not run; ``synthetic_feed.SyntheticFeed`` emits StepRecords at N steps/s
   and the finished requests through the same listeners (Timeline, trace), with 2 fake GPUs
   (``FakeNvml``) sampled at ``--sample-hz``. Throughput runs are skipped.

    python benchmarks/bench_ui.py --synthetic-steps-per-s 150  # H200-like load on a CPU
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console

from gpuchef.engine_host.vocab.config import EngineConfig, SchedulerConfig
from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate
from gpuchef.sessions.live import LiveSession
from gpuchef.probes.metrics import summarize
from gpuchef.probes.timeline import busy_fraction
from gpuchef.sessions.headless import Samplers, build_engine, run_load
from gpuchef.tui.app import GpuchefApp

SIZE = (170, 50)
PROFILE: str | None = None  # --profile: cProfile stats of the UI thread go here


class PseudoTerminal:
    """fds 0, 1 and 2 point at a pty of ``cols × rows`` while inside; a thread reads what is
    written (``bytes``) so the writer never blocks. ``log`` writes to the real stderr."""

    def __init__(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self.bytes = 0

    def __enter__(self) -> "PseudoTerminal":
        import fcntl
        import pty
        import termios

        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.rows, self.cols, 0, 0))
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = [os.dup(i) for i in (0, 1, 2)]
        for i in (0, 1, 2):
            os.dup2(self.slave, i)
        self._env = {k: os.environ.get(k) for k in ("TERM", "COLORTERM")}
        os.environ["TERM"] = "xterm-256color"
        os.environ["COLORTERM"] = "truecolor"
        self._reader = threading.Thread(target=self._drain, name="pty-drain", daemon=True)
        self._reader.start()
        return self

    def _drain(self) -> None:
        while True:
            try:
                b = os.read(self.master, 1 << 16)
            except OSError:
                return
            if not b:
                return
            self.bytes += len(b)

    def __exit__(self, *exc) -> None:
        for i in (0, 1, 2):
            os.dup2(self.saved[i], i)
            os.close(self.saved[i])
        for k, v in self._env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.close(self.slave)
        os.close(self.master)
        self._reader.join(2)


@dataclass
class UiCost:
    window_s: float
    seconds: float
    ui_cpu_pct: float          # UI (main) thread CPU / wall, % of one core
    tick_cpu_pct: float        # of which the dashboard's own tick (snapshots, binning, drawing)
    ticks: int
    steps_per_s: float
    busy_pct: float
    out_kib_per_s: float       # bytes the terminal received


@dataclass
class Throughput:
    kind: str                  # "headless" or "dashboard"
    rep: int
    duration_s: float
    total_tok_s: float
    output_tok_s: float
    steps_per_s: float
    completed: int
    ui_cpu_pct: float = float("nan")


@dataclass
class Report:
    machine: dict[str, Any]
    ui: list[UiCost] = field(default_factory=list)
    runs: list[Throughput] = field(default_factory=list)


def run_app_in_pty(app: GpuchefApp, *, until, warmup_s: float, max_s: float,
                   on_start=None, settle_s: float = 1.0) -> dict[str, float]:
    """Run ``app`` on a pseudo-terminal. ``settle_s`` after it has mounted (its start-up
    composes and paints the whole screen once), call ``on_start()`` (e.g. start the engine),
    then measure the UI thread from ``warmup_s`` later until ``until()`` is true (polled) or
    ``max_s``; then exit. Returns the measurements."""
    m: dict[str, float] = {}

    def mark0() -> None:
        m["c0"], m["w0"], m["k0"], m["n0"] = (time.thread_time(), time.monotonic(),
                                               app.tick_cpu_s, app.ticks)

    def poll() -> None:
        w = time.monotonic()
        if "c0" not in m and w - m["start"] >= warmup_s:
            mark0()
        if "c0" in m and (until() or w - m["start"] >= max_s):
            m["c1"], m["w1"], m["k1"], m["n1"] = (time.thread_time(), w, app.tick_cpu_s,
                                                   app.ticks)
            app.exit()

    def begin() -> None:
        if on_start is not None:
            on_start()
        m["start"] = time.monotonic()
        app.set_interval(0.05, poll)

    app.call_later(lambda: app.set_timer(settle_s, begin))
    prof = None
    if PROFILE:  # cProfile of the UI thread from the start of the measurement
        import cProfile
        prof = cProfile.Profile()
        orig = mark0

        def mark0() -> None:  # noqa: F811
            orig()
            prof.enable()
    with PseudoTerminal(*SIZE) as term:
        app.run()
    if prof is not None:
        prof.disable()
        prof.dump_stats(PROFILE)
    wall = m["w1"] - m["w0"]
    return {"wall": wall, "t0_ns": int(m["w0"] * 1e9), "t1_ns": int(m["w1"] * 1e9),
            "ui_cpu_pct": (m["c1"] - m["c0"]) / wall * 100,
            "tick_cpu_pct": (m["k1"] - m["k0"]) / wall * 100, "ticks": m["n1"] - m["n0"],
            "bytes_per_s": term.bytes / max(1e-9, time.monotonic() - m["start"])}


def ui_cost(engine, wcfg, window_s: float, seconds: float, warmup_s: float, fps: float,
            log) -> UiCost:
    s = LiveSession(engine, wcfg, host_probe=True)
    out = _measure_ui(s, window_s, seconds, warmup_s, fps, s.start)
    log(f"ui window {window_s:g} s: {out}")
    return out


def _measure_ui(s, window_s: float, seconds: float, warmup_s: float, fps: float, on_start,
                on_stop=None) -> UiCost:
    """Run the dashboard over session ``s`` in a pty (``on_start`` starts its load) and return
    the UI's cost over the measured interval; the session is closed afterwards."""
    app = GpuchefApp(s, window_s=window_s, fps=fps)
    try:
        r = run_app_in_pty(app, until=lambda: False, warmup_s=warmup_s, max_s=warmup_s + seconds,
                           on_start=on_start)
    finally:
        if on_stop is not None:
            on_stop()
        s.close()
    a, b = r["t0_ns"], r["t1_ns"]  # the measured interval: its steps/s and busy fraction
    snap = s.timeline.snapshot()
    steps_per_s = len(snap.steps_between(a, b)) / max(1e-9, (b - a) / 1e9)
    busy = busy_fraction(snap.steps_between(a, snap.t_ns + 1), a, b)  # by overlap
    return UiCost(window_s, r["wall"], r["ui_cpu_pct"], r["tick_cpu_pct"], int(r["ticks"]),
                  steps_per_s, busy * 100, r["bytes_per_s"] / 1024)


def ui_cost_synthetic(engine, wcfg, window_s: float, seconds: float, warmup_s: float,
                      fps: float, steps_per_s: float, hz: float, req_rate: float,
                      log) -> UiCost:
    """:func:`ui_cost` with the engine replaced by a synthetic feed (see the module docstring)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from synthetic_feed import SyntheticFeed

    from gpuchef.probes.nvml.fake import FakeNvml

    fake = FakeNvml(2, pcie_window_s=0)
    s = LiveSession(engine, wcfg, host_probe=True, nvml=fake, sample_hz=hz)
    feed = SyntheticFeed(s, steps_per_s, req_rate=req_rate, nvml=fake)
    out = _measure_ui(s, window_s, seconds, warmup_s, fps, feed.start, feed.stop)
    log(f"ui window {window_s:g} s (synthetic {steps_per_s:g} steps/s): {out}")
    return out


def headless(engine, specs, gpus, hz, rep: int, log) -> Throughput:
    samplers = Samplers(gpus, hz)
    samplers.start()
    try:
        res = run_load(engine, specs, console=Console(file=io.StringIO()))
    finally:
        samplers.stop()
    m = summarize(res.requests, res.duration_s, steps=res.steps)
    t = Throughput("headless", rep, res.duration_s, m.total_token_throughput,
                   m.output_throughput, len(res.steps) / res.duration_s, m.completed)
    log(f"headless #{rep}: {t}")
    return t


def gil_probe(engine, specs, duty_ms: float, period_ms: float, switch_s: float | None,
              log) -> Throughput:
    """Headless run beside a stand-in for the UI: a thread spinning pure Python (holding the
    GIL) ``duty_ms`` every ``period_ms``; ``switch_s`` overrides the host's switch interval."""
    import sys as _sys

    from gpuchef.engine_host import host as host_mod

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            while time.perf_counter() - t < duty_ms / 1e3:
                sum(range(200))
            time.sleep(max(0.0, (period_ms - duty_ms) / 1e3))

    orig = host_mod.EngineHost.start

    def start(self):
        orig(self)
        if switch_s:
            _sys.setswitchinterval(switch_s)

    host_mod.EngineHost.start = start
    th = threading.Thread(target=spin, daemon=True)
    th.start()
    try:
        res = run_load(engine, specs, console=Console(file=io.StringIO()))
    finally:
        stop.set()
        host_mod.EngineHost.start = orig
    m = summarize(res.requests, res.duration_s, steps=res.steps)
    t = Throughput(f"gil-probe {duty_ms:g}/{period_ms:g} ms si={switch_s or 'host'}", 0,
                   res.duration_s, m.total_token_throughput, m.output_throughput,
                   len(res.steps) / res.duration_s, m.completed)
    log(str(t))
    return t


def dashboard(engine, specs, wcfg, rep: int, window_s: float, fps: float, hz: float,
              log) -> Throughput:
    s = LiveSession(engine, wcfg, sample_hz=hz)
    s.host.set_workload(specs)
    app = GpuchefApp(s, window_s=window_s, fps=fps)
    try:
        # the requests arrive once the dashboard is up, as they would for a user who opened it
        r = run_app_in_pty(app, until=lambda: s.host.wait_done(0), warmup_s=0.0, max_s=3600,
                           on_start=lambda: s.start(load=False))
    finally:
        s.close()
    snap = s.timeline.snapshot()
    reqs = [q for q in snap.requests if q.token_times_ns]
    end = max(q.token_times_ns[-1] for q in reqs)
    dur = (end - s.host.t0_ns) / 1e9
    steps = [st for st in snap.steps if st.t_end_ns <= end]
    m = summarize(snap.requests, dur, steps=steps)
    t = Throughput("dashboard", rep, dur, m.total_token_throughput, m.output_throughput,
                   len(steps) / dur, m.completed, r["ui_cpu_pct"])
    log(f"dashboard #{rep}: {t}")
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--fps", type=float, default=10.0)
    ap.add_argument("--sample-hz", type=float, default=10.0)
    ap.add_argument("--ui-seconds", type=float, default=30.0)
    ap.add_argument("--ui-warmup", type=float, default=15.0)
    ap.add_argument("--windows", default="60,10", help="waveform windows (s) for the UI cost")
    ap.add_argument("--reps", type=int, default=3, help="throughput runs of each kind")
    ap.add_argument("--num-prompts", type=int, default=150)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--request-rate", type=float, default=30.0)
    ap.add_argument("--mode", default="chunked")
    ap.add_argument("--budget", type=int, default=None)
    ap.add_argument("--skip-ui", action="store_true")
    ap.add_argument("--synthetic-steps-per-s", type=float, default=None,
                    help="UI cost only, fed by a synthetic engine at this many steps/s, 2 fake GPUs")
    ap.add_argument("--synthetic-req-rate", type=float, default=6.0,
                    help="synthetic arrivals, req/s (prompts ~1000, outputs ~250 tokens)")
    ap.add_argument("--ui-runs", type=int, default=1, help="UI cost runs per window")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--gil-probe", action="store_true",
                    help="also: headless runs beside a pure-Python thread busy 4 ms every 100 ms")
    ap.add_argument("--json", default=None, help="write results here (after every run)")
    ap.add_argument("--screenshots", default=None,
                    help="afterwards, save the dashboard's scenes (make_screenshots.py) here")
    ap.add_argument("--prefix", default="", help="screenshot file prefix")
    ap.add_argument("--shot-s", type=float, default=30.0, help="seconds per screenshot scene")
    ap.add_argument("--profile", default=None,
                    help="cProfile the UI thread over the measured interval; stats to this file")
    a = ap.parse_args(argv)
    global PROFILE
    PROFILE = a.profile
    err = Console(stderr=True)
    log = err.print
    from gpuchef.engine_host.engine import resolve_device

    cpu = resolve_device(a.device).type == "cpu"
    budget = a.budget or (512 if cpu else 2048)
    engine = build_engine(EngineConfig(model=a.model, device=a.device,
                                       enforce_eager=a.enforce_eager,
                                       scheduler=SchedulerConfig(
                                           mode=a.mode, max_num_batched_tokens=budget)), err)
    import platform

    import torch
    machine = {"date": time.strftime("%Y-%m-%d"), "device": str(engine.device),
               "cpus": os.cpu_count(), "python": platform.python_version(),
               "torch": torch.__version__, "model": engine.loaded.name,
               "attention": engine.attn.name, "mode": a.mode, "budget": budget,
               "fps": a.fps, "loadavg_start": os.getloadavg()}
    if not cpu:
        machine["gpu"] = torch.cuda.get_device_name(engine.device)
    rep = Report(machine)
    vocab, mml = engine.model_config.vocab_size, engine.max_model_len
    if not a.skip_ui:
        from gpuchef.commands.top import CPU_MAX_INPUT_LEN, CPU_MAX_OUTPUT_LEN, CPU_TRACE_SPEED
        steady = WorkloadConfig(dataset="azure-conv",
                                trace_speed=CPU_TRACE_SPEED if cpu else 1.0,
                                max_input_len=CPU_MAX_INPUT_LEN if cpu else None,
                                max_output_len=CPU_MAX_OUTPUT_LEN if cpu else None,
                                vocab_size=vocab, max_model_len=mml)
        for _ in range(a.ui_runs):
            for w in (float(x) for x in a.windows.split(",")):
                if a.synthetic_steps_per_s:
                    rep.ui.append(ui_cost_synthetic(engine, steady, w, a.ui_seconds, a.ui_warmup,
                                                    a.fps, a.synthetic_steps_per_s, a.sample_hz,
                                                    a.synthetic_req_rate, log))
                else:
                    rep.ui.append(ui_cost(engine, steady, w, a.ui_seconds, a.ui_warmup, a.fps,
                                          log))
                save(rep, a.json)
    if a.synthetic_steps_per_s:
        machine["synthetic_steps_per_s"] = a.synthetic_steps_per_s
    if not a.skip_throughput and not a.synthetic_steps_per_s:
        wcfg = WorkloadConfig(dataset="random", request_rate=a.request_rate,
                              num_prompts=a.num_prompts, input_len=a.input_len,
                              output_len=a.output_len, range_ratio=0.5, seed=1,
                              vocab_size=vocab, max_model_len=mml)
        specs = generate(wcfg)
        log("warm-up run (not counted)")
        headless(engine, specs, None, a.sample_hz, -1, log)  # first-run allocations, caches
        order = []
        for r in range(a.reps):
            order += [("headless", r), ("dashboard", r)] if r % 2 == 0 else \
                [("dashboard", r), ("headless", r)]
        for kind, r in order:
            if kind == "headless":
                rep.runs.append(headless(engine, specs, None, a.sample_hz, r, log))
            else:
                rep.runs.append(dashboard(engine, specs, wcfg, r, 60.0, a.fps, a.sample_hz, log))
            save(rep, a.json)
        if a.gil_probe:
            for r in range(2):
                rep.runs.append(headless(engine, specs, None, a.sample_hz, 100 + r, log))
                rep.runs.append(gil_probe(engine, specs, 4, 100, None, log))
                rep.runs.append(gil_probe(engine, specs, 4, 100, 1e-4, log))
            save(rep, a.json)
    machine["loadavg_end"] = os.getloadavg()
    save(rep, a.json)
    print(render(rep), flush=True)
    if a.screenshots:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from pathlib import Path

        import make_screenshots
        make_screenshots.take(engine, Path(a.screenshots), prefix=a.prefix,
                              warmup_s=a.shot_s / 2, phase_s=a.shot_s, ab_s=a.shot_s * 1.5,
                              log=log)
    return 0


def save(rep: Report, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(asdict(rep), f, indent=2)


def render(rep: Report) -> str:
    lines = [f"machine: {json.dumps(rep.machine)}", ""]
    if rep.ui:
        lines += ["| window | UI thread CPU (% of one core) | of which tick | ticks/s | "
                  "engine steps/s | engine busy | terminal KiB/s |", "|---|---:|---:|---:|---:|---:|---:|"]
        for u in rep.ui:
            lines.append(f"| {u.window_s:g} s | {u.ui_cpu_pct:.1f} | {u.tick_cpu_pct:.1f} | "
                         f"{u.ticks / u.seconds:.1f} | {u.steps_per_s:.1f} | {u.busy_pct:.0f} % | "
                         f"{u.out_kib_per_s:.0f} |")
        lines.append("")
    if rep.runs:
        lines += ["| run | kind | duration s | total tok/s | output tok/s | steps/s | UI CPU % |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for t in rep.runs:
            ui = "" if t.ui_cpu_pct != t.ui_cpu_pct else f"{t.ui_cpu_pct:.1f}"
            lines.append(f"| {t.rep} | {t.kind} | {t.duration_s:.1f} | {t.total_tok_s:.0f} | "
                         f"{t.output_tok_s:.0f} | {t.steps_per_s:.1f} | {ui} |")
        h = [t.total_tok_s for t in rep.runs if t.kind == "headless" and t.rep < 100]
        d = [t.total_tok_s for t in rep.runs if t.kind == "dashboard"]
        if h and d:
            ratio = statistics.median(d) / statistics.median(h)
            lines += ["", f"dashboard / headless total tok/s (medians): {ratio * 100:.1f} %; "
                      f"headless spread {min(h):.0f}–{max(h):.0f}, dashboard {min(d):.0f}–{max(d):.0f}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
