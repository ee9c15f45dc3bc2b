"""The A/B over the hosted engine: ``gpuchef ab``'s runs and the dashboard's live A/B.

* :func:`run_sequential` runs the load once per setting per repetition (``ab.sequence``), each
  run on an idle engine with an empty KV cache and the setting in force from its first step;
* :func:`run_interleaved` runs one load per repetition while the engine alternates the settings
  every ``window_s`` seconds (``ab.Alternator``) on the same arrival stream;
* :class:`LiveAB` alternates a running host's settings in windows, for the dashboard (its ``a``).

Settings are switched between steps through the host (``set_config`` →
``LLMEngine.set_scheduler_config``), so the trace also holds each knob change as an event; the
marks (``ab:<run>:<A|B>:<n>``, ``ab:<run>:end``) are ``probes.ab``'s, and so are the windows
computed from them (``ab.compare``).
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any, Callable, Sequence

from ..engine_host.vocab.errors import ConfigError
from ..engine_host.vocab.config import SchedulerConfig
from ..engine_host.sinks import RecordBatch, RecordSink
from ..engine_host.vocab.records import EngineEvent
from ..probes.ab import LABELS, WindowResult, mark_name, window_results
from ..probes.ab import windows as ab_windows
from ..probes.metrics import DEFAULT_PERCENTILES
from ..tui.session import ABState
from .ab import (WINDOW_RANGE_S, Alternator, Run, Setting, mark_event, rep_specs, run_orders,
                 sequence)

def assert_idle(engine: Any) -> None:
    """Each run must start with no requests and an empty KV cache (else it inherits load)."""
    if engine.has_unfinished():
        raise RuntimeError("the engine still holds requests between A/B runs")
    used = engine.kv.usage().used
    if used:
        raise RuntimeError(f"the KV cache still holds {used} blocks between A/B runs")


def emit_mark(engine: Any, label: str, sinks: Sequence[RecordSink]) -> EngineEvent:
    """A mark event emitted while no host runs (the same record ``host.mark`` makes), to
    ``sinks`` as a batch of its own. A run's opening mark is emitted this way, before the host
    starts, so that it precedes the load's clock origin and every arrival; ``step`` is the
    first step the run will execute."""
    ev = mark_event(label, time.monotonic_ns(), engine.step_id)
    batch = RecordBatch([ev])
    for s in sinks:
        s.record(batch)
    return ev


class _Records:
    """Every event, request and step of an experiment, as the trace holds them: what
    ``probes.ab`` computes the windows from (so ``gpuchef ab`` and ``gpuchef report`` of its
    trace agree)."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.requests: list[Any] = []
        self.steps: list[Any] = []
        self.load_t0: list[tuple[int, int]] = []  # (first mark ns of a load, its clock origin)

    def add(self, res: Any, first: EngineEvent | None = None) -> None:
        if first is not None:
            self.events.append(first)
            self.load_t0.append((first.t_ns, res.t0_ns))
        self.events.extend(res.events)
        self.requests.extend(res.requests)
        self.steps.extend(res.steps)

    def runs(self, run_id: int, percentiles: Sequence[float], goodput: dict | None,
             samplers: Any, sequential: bool = False) -> list[Run]:
        _, wins, _ = ab_windows(self.events, run_id)
        res = window_results(wins, self.requests, self.steps, percentiles=percentiles,
                             goodput=goodput or None,
                             gpu_means=samplers.gpu_means if samplers is not None else None,
                             whole_loads=sequential)
        out = []
        for r in res:
            t0 = max((o for m, o in self.load_t0 if m <= r.t0_ns), default=0)
            out.append(Run(**{f.name: getattr(r, f.name) for f in fields(WindowResult)},
                           load_t0_ns=t0))
        return out


def run_sequential(engine: Any, specs: Sequence[Any], settings: dict[str, Setting],
                   repetitions: int = 1, *, sinks: Sequence[RecordSink] = (),
                   console: Any = None, percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                   goodput: dict[str, float] | None = None, samplers: Any = None,
                   run_id: int = 1, on_run: Callable[[int, int, Run], None] | None = None,
                   marks: Sequence[tuple[float, str]] = ()) -> list[Run]:
    """Run ``specs`` once per setting per repetition on ``engine``, in ``ab.sequence``'s order.

    Each run gets the same specs (identical arrival offsets, lengths and token ids; the ids
    suffixed by repetition, ``ab.rep_specs``), starts on an idle engine with an empty KV
    cache, and has the setting in force from its first step.
    ``marks``: ``run_load``'s (a phased load's phase marks, ``headless.phase_marks``), sent in
    every run. ``on_run(i, total, run)`` is called after each run. Returns every complete window
    (one per run, in execution order; figures by ``probes.ab``: a run's span ends at its last
    token).
    Raises RuntimeError if the engine is not idle between runs, and what ``run_load`` raises.
    """
    from ..sessions.headless import run_load

    rec = _Records()
    plan = sequence(repetitions)
    for i, (rep, label) in enumerate(plan, start=1):
        assert_idle(engine)
        st = settings[label]

        def on_start(host: Any, st: Setting = st) -> None:
            host.set_config(**st.knobs())

        first = emit_mark(engine, mark_name(run_id, label, rep), sinks)
        res = run_load(engine, rep_specs(specs, rep, run_id, label), sinks=sinks,
                       console=console, on_start=on_start, marks=marks)
        rec.add(res, first)
        if on_run is not None:
            on_run(i, len(plan), Run(label, rep, first.t_ns,
                                     res.t0_ns + int(res.duration_s * 1e9),
                                     list(res.requests), list(res.steps), load_t0_ns=res.t0_ns))
    assert_idle(engine)
    rec.events.append(emit_mark(engine, mark_name(run_id, "end"), sinks))
    return rec.runs(run_id, percentiles, goodput, samplers, sequential=True)


class _Switcher:
    """A headless interleaved load's window edges (``ab.Alternator``): the first queued before
    the host starts (its mark emitted at once, ahead of the load's first arrival), the rest
    ``host.set_config`` + ``host.mark`` on the alternator's thread."""

    def __init__(self, engine: Any, settings: dict[str, Setting], order: tuple[str, str],
                 window_s: float, run_id: int, sinks: Sequence[RecordSink],
                 counts: dict[str, int]) -> None:
        self.engine, self.sinks = engine, sinks
        self.settings, self.run_id = settings, run_id
        self.first: EngineEvent | None = None
        self.host: Any = None
        self.alt = Alternator(order, window_s, self._switch, counts=counts,
                              name="gpuchef-ab-switch")

    def _switch(self, label: str, n: int, k: int) -> None:
        name = mark_name(self.run_id, label, n)
        self.host.set_config(**self.settings[label].knobs())
        if k == 0:  # before the host starts: the mark must precede the load's first arrival
            self.first = emit_mark(self.engine, name, self.sinks)
        else:
            self.host.mark(name)

    def on_start(self, host: Any) -> None:
        self.host = host
        self.alt.start(inline_first=True)  # edge 0 queued before the host starts

    def close(self) -> None:
        self.alt.stop(5.0)


def run_interleaved(engine: Any, specs: Sequence[Any], settings: dict[str, Setting],
                    window_s: float, repetitions: int = 1, *,
                    sinks: Sequence[RecordSink] = (), console: Any = None,
                    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                    goodput: dict[str, float] | None = None, samplers: Any = None,
                    run_id: int = 1, on_run: Callable[[int, int, Run], None] | None = None,
                    marks: Sequence[tuple[float, str]] = ()) -> tuple[list[Run], float]:
    """One load per repetition while the engine alternates A and B every ``window_s`` s
    (repetition 2 starts with B, and so on). Returns (every complete window, in time order —
    ``Run.counted`` says which enter the comparison, by ``probes.ab``'s rules; the share of
    the counted windows' requests that finished after their window ended). ``marks``: as
    :func:`run_sequential`'s, in every repetition.

    Windows, membership (requests by arrival, steps by start) and throughput (work done in the
    window) are ``probes.ab``'s. Raises ConfigError when the load is too short for one counted
    window per setting; RuntimeError if the engine is not idle at the start; what ``run_load``
    raises."""
    from ..sessions.headless import run_load

    rec = _Records()
    counts = {k: 0 for k in LABELS}
    for rep, order in enumerate(run_orders(repetitions), start=1):
        assert_idle(engine)
        sw = _Switcher(engine, settings, order, window_s, run_id, sinks, counts)
        try:
            res = run_load(engine, rep_specs(specs, rep, run_id), sinks=sinks,
                           console=console, on_start=sw.on_start, marks=marks)
        finally:
            sw.close()
        counts = dict(sw.alt.counts)  # window numbers go on across repetitions
        rec.add(res, sw.first)
    assert_idle(engine)
    rec.events.append(emit_mark(engine, mark_name(run_id, "end"), sinks))
    runs = rec.runs(run_id, percentiles, goodput, samplers)
    counted = [r for r in runs if r.counted]
    for i, r in enumerate(counted, start=1):
        if on_run is not None:
            on_run(i, 0, r)
    _check_windows(counted, window_s)
    n = sum(len(r.requests) for r in counted)
    late = sum(1 for r in counted for q in r.requests
               if q.token_times_ns and q.token_times_ns[-1] > r.t1_ns)
    return runs, (late / n if n else 0.0)


def _check_windows(counted: Sequence[Run], window_s: float) -> None:
    for k in LABELS:
        if not any(r.label == k for r in counted):
            raise ConfigError(
                f"the load was too short for a full --window of setting {k} ({window_s:g} s): "
                "lower --window, or lengthen the load (--num-prompts, --duration, a finite "
                "--request-rate)")


class LiveAB:
    """The dashboard's live A/B (``tui.session.ABControl``): alternates a running host between
    settings A and B in windows of ``window_s`` seconds (``ab.Alternator``).

    At each window edge it sends ``host.set_config(**setting)`` and ``host.mark("ab:<run>:<A|B>:<n>")``
    — both applied before the same engine step, so the mark's EngineEvent (step id and time) is
    the window edge. When the run ends (``rounds`` windows per setting, or ``stop()``) it marks
    ``ab:<run>:end`` and restores the settings in force before the run.
    """

    def __init__(self, host: Any, clock: Callable[[], int] = time.monotonic_ns) -> None:
        import threading

        self.host = host
        self.clock = clock
        self._lock = threading.Lock()
        self._state = ABState()
        self._alt: Alternator | None = None
        self._run_id = 0

    def state(self) -> ABState:
        return self._state

    @staticmethod
    def _check(cfg: SchedulerConfig, changes: dict[str, Any], name: str) -> dict[str, Any]:
        try:
            cfg.with_changes(**changes)
        except ConfigError as e:
            raise ConfigError(f"A/B setting {name}: {e}") from None
        except TypeError:
            raise ConfigError(f"A/B setting {name}: unknown knob in {sorted(changes)}") from None
        return {k: getattr(cfg.with_changes(**changes), k) for k in changes}

    @staticmethod
    def _window(window_s: Any, rounds: Any) -> float:
        lo, hi = WINDOW_RANGE_S
        try:
            window_s = float(window_s)
        except (TypeError, ValueError):
            raise ConfigError(f"A/B window {window_s!r} must be a number of seconds") from None
        if not lo <= window_s <= hi:
            raise ConfigError(f"A/B window {window_s:g} s is out of range: allowed [{lo:g}, {hi:g}] s")
        if rounds is not None and not (isinstance(rounds, int) and rounds >= 1):
            raise ConfigError(f"A/B rounds {rounds!r} must be an integer >= 1")
        return window_s

    def start(self, a: dict[str, Any], b: dict[str, Any], window_s: float,
              rounds: int | None = None) -> ABState:
        """Start alternating (A first). ``a``/``b``: mode and knob changes (ConfigError for a bad
        one, naming the setting). ``window_s`` in [0.5, 3600] s; ``rounds`` windows per setting
        (None = until ``stop``). Raises ConfigError when a run is already going."""
        window_s = self._window(window_s, rounds)
        cfg = self.host.scheduler_config
        sa, sb = self._check(cfg, dict(a), "A"), self._check(cfg, dict(b), "B")
        if sa == sb:
            raise ConfigError("A/B settings A and B are the same: nothing to compare")
        with self._lock:
            if self._state.active:
                raise ConfigError("an A/B run is already going: stop it first (x on the A/B screen)")
            self._run_id += 1
            # no settle time: probes/ab.py counts a request in the window it arrived in
            st = self._state = ABState(True, {"A": sa, "B": sb}, window_s, rounds, "", 0, 0,
                                       self._run_id, 0.0)
            restore = {f.name: getattr(cfg, f.name) for f in fields(cfg)}

            def switch(label: str, n: int, k: int) -> None:
                self.host.set_config(**st.settings[label])
                self.host.mark(mark_name(st.run, label, n))
                self._state = ABState(True, st.settings, st.window_s, st.rounds, label, n,
                                      self.clock(), st.run, st.settle_s)

            def end() -> None:
                self.host.set_config(**restore)
                self.host.mark(mark_name(st.run, "end"))
                self._state = ABState(False, st.settings, st.window_s, st.rounds, "", 0, 0,
                                      st.run, st.settle_s)

            self._alt = Alternator(("A", "B"), window_s, switch, rounds=rounds, on_end=end)
            self._alt.start()
        return self._state

    def stop(self, timeout: float | None = 5.0) -> None:
        """End the run now (the current window is cut short) and restore the settings."""
        if self._alt is not None:
            self._alt.stop(timeout)


__all__ = ["LiveAB", "assert_idle", "emit_mark", "run_interleaved", "run_sequential"]
