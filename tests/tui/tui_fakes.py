"""A static session for the dashboard: a synthetic but realistic timeline (a toy scheduler with
both modes), a fake clock, and recording stand-ins for the load and A/B controls. Snapshot tests
use it so that pixels do not depend on the machine's speed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import SchedulerConfig, parse_knob, parse_mode
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes.nvml import GpuSample
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.session import ABState, LoadState, SessionInfo, parse_rate

T0 = 1_000_000_000_000  # fake monotonic origin (ns)
MS = 1_000_000
GIB = 1 << 30


def simulate(timeline: Timeline, *, start_ns: int, seconds: float, mode_at: list[tuple[float, str]],
             budget_at: list[tuple[float, int]] = (), rate: float = 3.0, seed: int = 0,
             gpu: bool = True, marks: list[tuple[float, str]] = (), n_gpus: int = 1,
             gpu_sm: Any = None, arrivals_out: list[int] | None = None,
             id_prefix: str = "req-") -> int:
    """Fill ``timeline`` with ``seconds`` of a toy engine: Poisson arrivals at ``rate`` req/s,
    prompts 200–1000 tokens, outputs 20–120, step time 2 ms + 0.22 ms/prefill token + 0.35 ms/
    decode. ``mode_at``/``budget_at``: (s, value) changes (recorded as events at the step they
    apply). ``n_gpus`` > 1: one GpuSample per GPU per tick, SM active ``gpu_sm(k, sm)`` for GPU k
    (default: the same for all). ``arrivals_out``: gets the arrival time (ns) of every
    request that arrived before the end. ``id_prefix``: of the request ids (``http-`` for
    requests from `top --serve`'s front door). Returns the end time (ns)."""
    rng = np.random.default_rng(seed)
    cfg = SchedulerConfig(mode=mode_at[0][1], max_num_batched_tokens=512)
    changes = sorted([(t, "mode", v) for t, v in mode_at[1:]] +
                     [(t, "max_num_batched_tokens", v) for t, v in budget_at] +
                     [(t, "mark", v) for t, v in marks])
    arrivals = []
    t = 0.0
    while t < seconds:
        t += rng.exponential(1 / rate)
        arrivals.append((t, int(rng.integers(200, 1000)), int(rng.integers(20, 120))))
    now = start_ns
    end = start_ns + int(seconds * 1e9)
    if arrivals_out is not None:
        arrivals_out.extend(start_ns + int(a * 1e9) for a, _, _ in arrivals
                            if start_ns + int(a * 1e9) <= end)
    waiting: list[dict] = []
    running: list[dict] = []
    step = 0
    ai = 0
    ci = 0
    next_sample = start_ns
    busy_hist: list[tuple[int, int, float]] = []
    kv_total = 4096
    while now < end:
        while ci < len(changes) and start_ns + int(changes[ci][0] * 1e9) <= now:
            _, name, v = changes[ci]
            ci += 1
            if name == "mark":
                timeline.add_event(EngineEvent("mark", step, now, v))
                continue
            old = getattr(cfg, name)
            cfg = cfg.with_changes(**{name: v})
            timeline.add_event(EngineEvent("mode" if name == "mode" else "knob", step, now, name,
                                           old, v))
        while ai < len(arrivals) and start_ns + int(arrivals[ai][0] * 1e9) <= now:
            a, p, o = arrivals[ai]
            waiting.append({"id": f"{id_prefix}{ai}", "arr": start_ns + int(a * 1e9), "p": p,
                            "o": o, "done": 0, "toks": []})
            ai += 1
        if not waiting and not running:
            nxt = start_ns + int(arrivals[ai][0] * 1e9) if ai < len(arrivals) else end
            now = min(max(now + MS, nxt), end)
            continue
        budget = cfg.max_num_batched_tokens
        pre_tok = 0
        dec: list[dict] = []
        pre: list[tuple[dict, int]] = []
        if cfg.mode == "continuous":
            if waiting:
                while waiting and (not pre or pre_tok + waiting[0]["p"] - waiting[0]["done"] <= budget):
                    r = waiting.pop(0)
                    n = r["p"] - r["done"]
                    pre.append((r, n))
                    pre_tok += n
            else:
                dec = list(running)
        else:
            dec = list(running)
            left = budget - len(dec)
            while waiting and left > 0:
                r = waiting[0]
                n = min(left, r["p"] - r["done"])
                pre.append((r, n))
                pre_tok += n
                left -= n
                if r["done"] + n >= r["p"]:
                    waiting.pop(0)
                else:
                    break
        dur = int((2.0 + 0.22 * pre_tok + 0.35 * len(dec)) * MS)
        t_start, t_end = now, now + dur
        finished = 0
        for r in dec:
            r["toks"].append(t_end)
        for r, n in pre:
            r["done"] += n
            if r["done"] >= r["p"]:
                r["toks"].append(t_end)
                running.append(r)
        for r in list(running):
            if len(r["toks"]) >= r["o"]:
                running.remove(r)
                finished += 1
                timeline.add_request(RequestRecord(r["id"], r["arr"], r["p"], len(r["toks"]),
                                                   tuple(r["toks"]), "length", max_tokens=r["o"]))
        used = sum((x["p"] + len(x["toks"])) // 16 + 1 for x in running)
        timeline.add_step(StepRecord(
            step, t_start, t_end, dur / MS * 0.97, cfg.mode, cfg.max_num_batched_tokens,
            cfg.max_num_seqs, cfg.long_prefill_token_threshold, cfg.max_num_partial_prefills,
            len(pre), pre_tok, len(dec), sum(1 for r, _ in pre if r["done"] < r["p"]),
            len(running), len(waiting), 0, used, kv_total, finished))
        busy_hist.append((t_start, t_end, pre_tok))
        step += 1
        now = t_end + int(0.3 * MS)
        while gpu and next_sample <= now:
            recent = [b for b in busy_hist[-60:] if b[1] > next_sample - 100 * MS]
            busy = min(1.0, sum(max(0, min(b[1], next_sample) - max(b[0], next_sample - 100 * MS))
                                for b in recent) / (100 * MS))
            pf = sum(b[2] for b in recent) / max(1, len(recent))
            sm = max(0.0, busy * (35 + min(55, pf / 10)))
            if n_gpus == 1:
                timeline.add_gpu_sample(GpuSample(
                    next_sample, 0, gpu_util=100 if busy > 0 else 0, mem_util=int(30 * busy),
                    power_w=110 + 500 * sm / 100, sm_active=sm, sm_occupancy=sm / 3,
                    tensor_active=sm * 0.8, dram_bw_util=20 + 40 * busy))
            for k in range(n_gpus if n_gpus > 1 else 0):
                smk = float(gpu_sm(k, sm)) if gpu_sm else sm
                timeline.add_gpu_sample(GpuSample(
                    next_sample, k, gpu_util=100 if smk > 0 else 0, mem_util=int(30 * busy),
                    power_w=110 + 500 * smk / 100, sm_active=smk, sm_occupancy=smk / 3,
                    tensor_active=smk * 0.8, dram_bw_util=10 + 0.6 * smk,
                    mem_used_bytes=int(GIB * (60 + k)), mem_total_bytes=int(GIB * 141)))
            next_sample += 100 * MS
    return now


class FakeLoad:
    REASON = ""  # the rate and pause are live

    def __init__(self) -> None:
        self.rate = 0.5
        self.paused = False
        self.submitted = 1234  # requests sent so far (a test adds arrivals)
        self.calls: list[tuple[str, Any]] = []

    def state(self) -> LoadState:
        return LoadState("trace", "azure-conv", self.rate, 5.53, self.paused, self.submitted,
                         False, True)

    def set_rate(self, value: Any) -> float:
        v = parse_rate(value, "×")  # the live load's own parsing
        self.rate = v
        self.calls.append(("rate", v))
        return v

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False


class FakeAB:
    def __init__(self, state: ABState | None = None) -> None:
        self._state = state or ABState()
        self.started: list[tuple] = []

    def state(self) -> ABState:
        return self._state

    def start(self, a, b, window_s, rounds=None) -> ABState:
        self.started.append((a, b, window_s, rounds))
        self._state = ABState(True, {"A": a, "B": b}, window_s, rounds, "A", 1, 0, 1,
                              min(2.0, window_s / 4))
        return self._state

    def stop(self) -> None:
        self._state = replace(self._state, active=False)


class StaticSession:
    """The ``tui.session.Session`` interface over a fixed timeline and a fixed clock. ``http``:
    the requests came over HTTP (ids ``http-N``; `top --serve` with its internal load paused)."""

    def __init__(self, *, seconds: float = 70.0, gpu: bool = True, mode_switch_s: float = 35.0,
                 ab_window_s: float | None = None, n_gpus: int = 1, gpu_sm: Any = None,
                 gpu_label: str = "NVIDIA H200", http: bool = False) -> None:
        self.info = SessionInfo("llama-3-8b" if gpu else "tiny", True, "cuda:0" if gpu else "cpu",
                                "flashinfer" if gpu else "reference",
                                "bfloat16" if gpu else "float32", 30000, 16, 8192,
                                "" if gpu else "CPU defaults: trace ×0.5, prompts ≤1024")
        self.timeline = Timeline(origin_ns=T0, clock=lambda: self.now)
        self.start_ns = T0
        self.arrival_ns: list[int] = []  # the simulated arrivals
        ab = None
        if ab_window_s:
            # an A/B run: A = chunked, B = continuous, alternating from t = 0
            n = int(seconds // ab_window_s)
            modes = [(i * ab_window_s, "chunked" if i % 2 == 0 else "continuous")
                     for i in range(n + 1)]
            marks = [(i * ab_window_s, f"ab:1:{'AB'[i % 2]}:{i // 2 + 1}") for i in range(n + 1)]
            self.now = simulate(self.timeline, start_ns=T0, seconds=seconds, mode_at=modes,
                                marks=marks, gpu=gpu, arrivals_out=self.arrival_ns)
            cur = n % 2
            ab = ABState(True, {"A": {"mode": "chunked"}, "B": {"mode": "continuous"}},
                         ab_window_s, None, "AB"[cur], n // 2 + 1,
                         T0 + int(n * ab_window_s * 1e9), 1, min(2.0, ab_window_s / 4))
        else:
            self.now = simulate(self.timeline, start_ns=T0, seconds=seconds,
                                mode_at=[(0, "continuous"), (mode_switch_s, "chunked")],
                                budget_at=[(mode_switch_s + 15, 1024)], gpu=gpu,
                                n_gpus=n_gpus, gpu_sm=gpu_sm, arrivals_out=self.arrival_ns,
                                id_prefix="http-" if http else "req-")
        self.clock = lambda: self.now
        self.load = FakeLoad()
        self.http = http
        if http:  # `top --serve` driven from outside: the requests came over HTTP, the
            # internal load started paused and sent nothing
            self.info = replace(self.info, serving="http://127.0.0.1:8000")
            self.load.paused, self.load.submitted = True, 0
        self.ab = FakeAB(ab)
        self.slos = {"ttft": 500.0, "tpot": 50.0}
        self.percentiles = (50.0, 99.0)
        self.stats_window_s = 30.0
        self._cfg = SchedulerConfig(mode="chunked", max_num_batched_tokens=1024)
        self.knob_calls: list[tuple[str, Any]] = []
        self._gpu = gpu
        self._n_gpus, self._gpu_label = n_gpus, gpu_label
        self.closed = False

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self._cfg

    @property
    def gpu_status(self) -> str:
        if self._gpu and self._n_gpus > 1:
            return f"NVML: {self._n_gpus} GPUs ({self._gpu_label}), GPM on"
        return "NVML: 1 GPU (NVIDIA H200), GPM on" if self._gpu else \
            "NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)"

    @property
    def gpu_available(self) -> bool:
        return self._gpu

    trace_path = None
    engine_error = None
    engine_paused = False
    knobs_reason = ""

    def set_knob(self, name: str, value: Any) -> Any:
        v = parse_mode(value) if name == "mode" else parse_knob(name, value)
        self._cfg = self._cfg.with_changes(**{name: v})
        self.knob_calls.append((name, v))
        return v

    def set_config(self, **changes: Any) -> dict:
        return {k: self.set_knob(k, v) for k, v in changes.items()}

    def pause_engine(self, paused: bool) -> None:
        self.engine_paused = paused

    def export_trace(self) -> str:
        return "trace fake.jsonl written"

    def close(self) -> None:
        self.closed = True

    def prime_arrivals(self, meter) -> None:
        """Give the app's ArrivalMeter (tui/arrivals.py) the reading of one window ago, as a
        live session's meter would have had: the fake clock stands still, so without it the
        header's arrival rates stay unmeasured. The load had sent as many fewer requests as
        the simulation made arrive since."""
        if not self.arrival_ns:
            return
        from bisect import bisect_right

        t0 = self.now - int(meter.window_s * 1e9)
        since = 0 if self.http else len(self.arrival_ns) - bisect_right(self.arrival_ns, t0)
        meter.update(self.timeline.snapshot(t0),
                     replace(self.load.state(), submitted=self.load.submitted - since))


async def settle(pilot, min_ticks: int = 3, timeout_s: float = 20.0) -> None:
    """Wait until the app has mounted its screen and run ``min_ticks`` refresh ticks, then draw one
    forced frame. A fixed ``pause(0.3)`` was not enough on a loaded 2-core CI machine: the
    wall-clock throttles of the refresh (charts at most ``fps``, numbers once a second) then
    decided what the snapshot showed."""
    import time

    app = pilot.app
    start = app.ticks
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        scr = app.screen  # a screen without a refresh tick (help, palette) has nothing to wait for
        if app.ticks - start >= min_ticks and getattr(scr, "ready", not hasattr(scr, "tick")):
            break
        await pilot.pause(0.05)
    else:
        raise AssertionError(f"the app ran {app.ticks - start} ticks in {timeout_s} s")
    prime = getattr(app.session, "prime_arrivals", None)
    if prime is not None and getattr(app, "arrival_meter", None) is not None:
        prime(app.arrival_meter)  # the fake clock stands still: a window of arrivals, given
        app.measure_arrivals()
    scr = app.screen
    if hasattr(scr, "tick"):
        scr.tick(force=True)
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


async def palette(pilot, typed: str) -> None:
    """Open the command palette, type ``typed`` and run the first hit."""
    await pilot.press("ctrl+p")
    await pilot.pause(0.3)
    await pilot.press(*typed)
    await pilot.pause(0.5)
    await pilot.press("enter")
    await pilot.pause(0.3)


def capture_notes(app) -> list[str]:
    """Every message ``app.notify`` shows from now on, as text (the app still shows them)."""
    notes: list[str] = []
    orig = app.notify

    def notify(message, *a, **k):
        notes.append(str(message))
        return orig(message, *a, **k)

    app.notify = notify
    return notes
