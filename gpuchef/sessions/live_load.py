"""A live load source: the workload's arrival stream fed to an EngineHost at a rate that can change
while it runs (the dashboard's rate control and pause), one stream for the whole session (so both
settings of a live A/B see the same arrival process).

Arrivals are kept in *load time* τ: trace seconds at speed 1 for a trace, and "request units" of a
unit-rate process for random arrivals (gamma gaps of mean 1, shape ``burstiness``). Wall time is
``anchor_wall + (τ − anchor_τ) / speed`` with ``speed`` the trace speed (×) or the request rate
(req/s); a rate change or a pause re-anchors at the current τ, so the stream bends without a jump.
Each request is submitted when due, with its scheduled arrival time (``EngineHost.submit``'s
``arrival_ns``), so TTFT counts from when the request should have arrived.

A phased workload (``--dataset FILE.yaml``) runs as a trace does (× speed, looping at the end of
its last phase), and as each phase starts the feeder sends ``host.mark("phase:<name>")``, so the
phase change is an engine event: on the dashboard's time axis and in the trace, where it took
effect whatever the speed or pauses did to the schedule.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from ..engine_host.vocab.errors import ConfigError
from ..engine_host.request import SamplingParams
from ..engine_host.vocab.phases import load_workload, phase_mark
from ..engine_host.vocab.workload import (PROBE_ID_PREFIX, REQUEST_ID_PREFIX, RequestSpec,
                                          WorkloadConfig, generate)
from ..tui.session import LoadState, parse_rate

#: Load time generated per chunk of an endless random stream (request units).
RANDOM_CHUNK = 2000


@dataclass(frozen=True)
class PhaseStart:
    """A stream item that is no request: phase ``name`` of a phased workload starts at
    ``arrival_s`` (load time at speed 1); its mark is sent when due, as a request is submitted."""

    name: str
    arrival_s: float


class LiveLoad:
    """Feeds ``host.submit`` from ``cfg``'s arrival stream on a daemon thread.

    ``cfg``: a WorkloadConfig giving the stream's shape (dataset, rate or trace speed, lengths,
    clipping, seed); its own ``num_prompts``/``duration_s`` are ignored. Random arrivals need a
    finite ``request_rate`` (ConfigError otherwise). ``num_prompts`` / ``duration_s`` (seconds of
    arrivals at the starting rate) bound the stream; without them a trace loops (``loop``) and
    random arrivals go on. ``clock``: monotonic ns. Raises ConfigError for a bad config.
    """

    #: its rate and pause are live (``tui.session.LoadControl.REASON``)
    REASON = ""

    def __init__(self, host: Any, cfg: WorkloadConfig, *, num_prompts: int | None = None,
                 duration_s: float | None = None, loop: bool = True,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        cfg.validate()
        self.host = host
        self.cfg = cfg
        self.clock = clock
        self.kind = "random" if cfg.is_random else "trace"
        if self.kind == "random":
            if math.isinf(cfg.request_rate):
                raise ConfigError("gpuchef top sends load live: --request-rate must be a finite "
                                  "number of req/s (inf = all at once only suits `bench`)")
            self._speed = float(cfg.request_rate)
            self.mean_rate = 0.0
        else:
            self._speed = float(cfg.trace_speed)
            self.mean_rate = 0.0
        if num_prompts is not None and (isinstance(num_prompts, bool) or int(num_prompts) < 1):
            raise ConfigError(f"--num-prompts {num_prompts!r} must be an integer >= 1")
        if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
            raise ConfigError(f"--duration {duration_s!r} must be > 0 (s)")
        self.num_prompts = None if num_prompts is None else int(num_prompts)
        self.duration_s = duration_s
        self.bounded = num_prompts is not None or duration_s is not None
        self.loop = loop and not self.bounded
        self._lock = threading.Lock()
        self._anchor_wall = 0
        self._anchor_tau = 0.0
        self._paused_tau: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.submitted = 0
        self.phase = ""  # a phased workload: the phase whose mark was sent last
        self.done = False
        self._n_load = 0
        self._n_probe = 0
        self._stream = self._items()
        # the first item now: a trace is read (and its mean rate known) before the header shows
        self._next: tuple[float, Any] | None = next(self._stream, None)
        self.done = self._next is None

    # -- the stream ------------------------------------------------------------------------------
    def _items(self) -> Iterator[tuple[float, Any]]:
        """(τ, RequestSpec) in τ order, endless unless bounded."""
        cfg = self.cfg
        n = 0
        if self.kind == "trace":
            specs, period = self._trace_stream()
            if not specs:
                return
            limit = None if self.duration_s is None else self.duration_s * cfg.trace_speed
            offset = 0.0
            while True:
                for s in specs:
                    tau = offset + s.arrival_s
                    if (limit is not None and tau >= limit) or \
                            (self.num_prompts is not None and n >= self.num_prompts):
                        return
                    yield tau, s
                    n += 1 if isinstance(s, RequestSpec) and not s.is_probe else 0
                if not self.loop:
                    return
                offset += period
        else:
            # unit-rate process: τ counts expected requests; speed = req/s
            limit = None if self.duration_s is None else self.duration_s * cfg.request_rate
            probe = None if cfg.probe_interval_s is None else \
                cfg.probe_interval_s * cfg.request_rate  # seconds at the starting rate
            chunk = 0
            while True:
                c = replace(cfg, request_rate=1.0, num_prompts=None, duration_s=float(RANDOM_CHUNK),
                            seed=(cfg.seed + 1_000_003 * chunk) % (2**63 - 1),
                            probe_interval_s=probe)
                for s in generate(c):
                    tau = chunk * RANDOM_CHUNK + s.arrival_s
                    if (limit is not None and tau >= limit) or \
                            (self.num_prompts is not None and n >= self.num_prompts):
                        return
                    yield tau, s
                    n += 0 if s.is_probe else 1
                chunk += 1

    def _trace_stream(self) -> tuple[list[Any], float]:
        """A trace's (or a phased workload's) requests at speed 1, with ``PhaseStart`` items at
        each phase's start, and the period it loops with: one mean gap after its last request
        (a phased workload: its last phase's end). Sets ``mean_rate``."""
        specs: list[Any] = generate(replace(self.cfg, trace_speed=1.0, duration_s=None,
                                            num_prompts=None))
        n = sum(1 for s in specs if not s.is_probe)
        if self.cfg.is_phased:
            wl = load_workload(self.cfg.dataset)
            self.mean_rate = n / wl.duration_s
            marks = [PhaseStart(p.name, p.start_s) for p in wl.phases]
            # a phase's mark before the requests arriving at its first instant
            merged = sorted([*marks, *specs],
                            key=lambda x: (x.arrival_s, isinstance(x, RequestSpec)))
            return merged, wl.duration_s
        if not specs:
            return [], 0.0
        span = specs[-1].arrival_s
        self.mean_rate = (len(specs) - 1) / span if span > 0 else 0.0
        return specs, span + span / max(1, len(specs) - 1)

    # -- controls (any thread) -------------------------------------------------------------------
    @property
    def rate(self) -> float:
        return self._speed

    @property
    def paused(self) -> bool:
        return self._paused_tau is not None

    def _tau_now(self, now: int) -> float:
        if self._paused_tau is not None:
            return self._paused_tau
        return self._anchor_tau + (now - self._anchor_wall) / 1e9 * self._speed

    def set_rate(self, value: Any) -> float:
        """New rate from now on: req/s (random) or × (trace). Returns it; ConfigError names the
        allowed range; nothing changes then. The change is marked on the waveforms."""
        v = parse_rate(value, "req/s" if self.kind == "random" else "×")
        with self._lock:
            now = self.clock()
            self._anchor_tau = self._tau_now(now)
            self._anchor_wall = now
            self._speed = v
        self._wake.set()
        unit = " req/s" if self.kind == "random" else "×"
        self.host.mark(f"rate→{v:g}{unit}")
        return v

    def pause(self) -> None:
        """Stop new arrivals (the stream resumes where it stopped)."""
        with self._lock:
            if self._paused_tau is not None:
                return
            self._paused_tau = self._tau_now(self.clock())
        self.host.pause_load()
        self._wake.set()

    def resume(self) -> None:
        with self._lock:
            if self._paused_tau is None:
                return
            self._anchor_tau = self._paused_tau
            self._anchor_wall = self.clock()
            self._paused_tau = None
        self.host.resume_load()
        self._wake.set()

    def state(self) -> LoadState:
        return LoadState(self.kind, self.cfg.dataset, self._speed, self.mean_rate, self.paused,
                         self.submitted, self.done, self.loop, phase=self.phase)

    # -- thread ------------------------------------------------------------------------------------
    def start(self, paused: bool = False) -> "LiveLoad":
        """Start feeding; ``paused``: start paused (nothing is sent until ``resume``)."""
        if self._thread is not None:
            return self
        with self._lock:
            self._anchor_wall = self.clock()
            self._anchor_tau = 0.0
            if paused:
                self._paused_tau = 0.0
        self._thread = threading.Thread(target=self._run, name="gpuchef-load", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _due_ns(self, tau: float) -> int | None:
        with self._lock:
            if self._paused_tau is not None:
                return None
            return self._anchor_wall + int((tau - self._anchor_tau) / self._speed * 1e9)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._next is None:
                self._next = next(self._stream, None)
                if self._next is None:
                    self.done = True
                    return
            tau, spec = self._next
            due = self._due_ns(tau)
            now = self.clock()
            if due is None or due > now:
                wait = 0.1 if due is None else min(0.1, (due - now) / 1e9)
                self._wake.wait(max(0.0, wait))
                self._wake.clear()
                continue
            if isinstance(spec, PhaseStart):
                self.host.mark(phase_mark(spec.name))
                self.phase = str(spec.name)
                self._next = None
                continue
            if spec.is_probe:
                rid = f"{PROBE_ID_PREFIX}{self._n_probe}"
                self._n_probe += 1
            else:
                rid = f"{REQUEST_ID_PREFIX}{self._n_load}"
                self._n_load += 1
            self.host.submit(rid, spec.prompt_token_ids,
                             SamplingParams(max_tokens=max(1, int(spec.output_len)), ignore_eos=True),
                             arrival_ns=due)
            self.submitted += 1
            self._next = None
