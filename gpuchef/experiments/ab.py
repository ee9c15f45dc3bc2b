"""A/B experiments: two settings against the same load — the one core every A/B runs on.

Two targets run it: the hosted engine (``experiments.hosted``: ``gpuchef ab``'s sequential and
interleaved runs, the dashboard's live A/B) and HTTP servers (``experiments.http``: ``gpuchef ab
--base-url`` / ``--a url=U1 --b url=U2`` and `top --attach`'s A/B). What they share is here:

* :func:`parse_setting` turns ``--a``/``--b`` specs (``mode=chunked,max_num_batched_tokens=2048``)
  into full :class:`Setting` s over a base SchedulerConfig (the engine's, or a server's knob
  state);
* :func:`run_orders` / :func:`sequence`: the order of the runs, A then B, then B then A
  (alternating the order cancels slow drift: thermals, clocks, a noisy neighbour);
* :class:`Alternator`: the window edges of an interleaved run (the engine alternates settings
  every ``window_s`` seconds on one arrival stream);
* :func:`mark_event`: each run or window starts with an ``ab:<run>:<A|B>:<n>`` mark event and
  the experiment ends with ``ab:<run>:end`` (``probes.ab.mark_name``);
* :func:`compare`: each setting pooled, B − A with its spread and a verdict.

Windows, their membership (a request by arrival, a step by start), the window throughput (work
done while the setting was in force), pooling and the verdict are ``probes.ab``'s — the one
definition the live A/B screen and ``gpuchef report`` use too — computed from the same records
the trace receives. Requests that straddle an edge are counted in full for the window they
arrived in, so windows should be long against the requests' E2EL (the command warns when many
straddle). The text of the results (side by side, the B − A table) is ``experiments.ab_text``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

from ..engine_host.vocab.config import AUTO_BUDGET, SchedulerConfig, parse_settings
from ..engine_host.vocab.errors import ConfigError
from ..engine_host.vocab.records import EngineEvent
from ..probes.ab import (LABELS, MIN_REPETITIONS, MIN_WINDOWS, Comparison, DeltaRow, MetricSpec,
                         WindowResult, metric_specs, pool, rep_request_id)
from ..probes.ab import compare as _compare
from ..probes.ab import windows as ab_windows
from ..probes.metrics import DEFAULT_PERCENTILES

__all__ = ["Alternator", "Comparison", "DeltaRow", "MetricSpec", "Run", "Setting", "compare",
           "mark_event", "metric_specs", "parse_setting", "pool", "run_orders", "sequence"]

REPETITIONS_RANGE = (1, 100)
WINDOW_RANGE_S = (0.5, 3600.0)
#: In an interleaved run, warn when more than this share of requests finished after the end of
#: the window they arrived in (their latency mixes both settings).
STRADDLE_WARN_SHARE = 0.25


# ---- settings ----------------------------------------------------------------------------------

def knob_text(knob: str, value: Any) -> str:
    """A knob's value as the A/B output shows it: as typed, except ``auto_budget`` off, which
    SchedulerConfig stores as "" and is shown as ``off``."""
    return "off" if knob == AUTO_BUDGET and value == "" else str(value)


@dataclass(frozen=True)
class Setting:
    """One arm of the experiment. ``changes``: the knobs the spec names (parsed);
    ``config``: the base SchedulerConfig with them applied (what the engine runs)."""

    label: str
    spec: str
    changes: dict[str, Any]
    config: SchedulerConfig

    def describe(self) -> str:
        """The spec as given, normalised: ``mode=chunked, max_num_batched_tokens=2048``."""
        if not self.changes:
            return "the base settings"
        return ", ".join(f"{k}={knob_text(k, v)}" for k, v in self.changes.items())

    @property
    def notes(self) -> list[str]:
        """What the setting does not do that its spec might suggest: the autopilot on with
        continuous batching (it chooses chunked steps' prefill allowance only, so it is idle)."""
        if self.config.auto_budget and self.config.mode == "continuous":
            return [f"{self.label}: the autopilot steers chunked steps only — idle in continuous "
                    "mode (docs/autopilot.md)"]
        return []

    def knobs(self) -> dict[str, Any]:
        """Every field of ``config`` (mode and knobs): what ``host.set_config`` gets."""
        return {f.name: getattr(self.config, f.name) for f in fields(self.config)}


def parse_setting(spec: str, base: SchedulerConfig, label: str = "A",
                  flag: str | None = None) -> Setting:
    """Parse ``KNOB=VALUE[,KNOB=VALUE...]`` over ``base`` with ``engine_host.vocab.config``'s grammar
    (:func:`~gpuchef.engine_host.vocab.config.parse_settings`: vLLM's names and flags, the palette's
    short names, a bare ``continuous``/``chunked``, ``auto_budget=itl_p99:50ms,ttft_p99:2s``);
    "" means the base settings.

    Raises ConfigError naming the flag, the value and the allowed range or names.
    """
    flag = flag or f"--{label.lower()}"
    try:
        changes = parse_settings(spec)
        cfg = base.with_changes(**changes)
    except ConfigError as e:
        raise ConfigError(f"{flag} {spec!r}: {e}") from None
    return Setting(label, str(spec), changes, cfg)


def check_repetitions(n: Any) -> int:
    """``--repetitions`` as an int in [1, 100]. Raises ConfigError."""
    lo, hi = REPETITIONS_RANGE
    if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= hi:
        raise ConfigError(f"--repetitions {n!r} is out of range: allowed [{lo}, {hi}]")
    return n


def check_window(w: Any) -> float:
    """``--window`` (s) as a float in [0.5, 3600]. Raises ConfigError."""
    lo, hi = WINDOW_RANGE_S
    try:
        v = float(w)
    except (TypeError, ValueError):
        raise ConfigError(f"--window {w!r} must be a number of seconds in [{lo:g}, {hi:g}]") from None
    if not lo <= v <= hi:
        raise ConfigError(f"--window {v:g} s is out of range: allowed [{lo:g}, {hi:g}] s")
    return v


def run_orders(repetitions: int) -> list[tuple[str, str]]:
    """The order of the two settings in each repetition: AB, BA, AB, … (drift cancels)."""
    return [("A", "B") if i % 2 == 0 else ("B", "A") for i in range(repetitions)]


def sequence(repetitions: int) -> list[tuple[int, str]]:
    """``(repetition, label)`` of each run of a sequential A/B, in :func:`run_orders`."""
    return [(rep, label) for rep, order in enumerate(run_orders(repetitions), start=1)
            for label in order]


# ---- runs ---------------------------------------------------------------------------------------

@dataclass
class Run(WindowResult):
    """One counted window (probes.ab.WindowResult: a whole load in a sequential run, one window
    of an interleaved one) plus ``load_t0_ns``: when its load's clock started (arrival offsets
    count from it)."""

    load_t0_ns: int = 0


def rep_specs(specs: Sequence[Any], rep: int, run_id: int = 1,
              side: str | None = None) -> list[Any]:
    """``specs`` as repetition ``rep`` of run ``run_id`` sends them (to ``side`` "A"/"B" in a
    sequential run): the same requests, each id as ``probes.ab.rep_request_id`` spells it
    (``A/req-0#1``) so that the trace's records of two repetitions, or of A's and B's runs of
    one repetition, do not share ids."""
    from dataclasses import replace

    return [replace(s, request_id=rep_request_id(s.request_id, rep, run_id, side))
            for s in specs]


def mark_event(name: str, t_ns: int, step: int = 0) -> EngineEvent:
    """An A/B mark as the engine records one (``host.mark``): a target that makes its own
    marks (a run's opening mark before the host starts, an HTTP run's at arrival 0's clock)
    makes them with this."""
    return EngineEvent("mark", step, t_ns, name)


class Alternator:
    """The window edges of an interleaved A/B, on a thread of its own: at edge ``k`` (from 0)
    ``switch(label, n, k)`` with ``label`` ``order[k % 2]`` and ``n`` its window number for that
    setting (going on from ``counts``). Edges fall on absolute deadlines from :meth:`start`, so
    windows do not drift with the cost of a switch. ``rounds``: windows per setting (None: until
    :meth:`stop`). ``on_end()`` is called on the thread as it ends (rounds done, or stopped).
    ``start(inline_first=True)`` makes edge 0 in the caller's thread (before a host starts: the
    setting in force from its first step)."""

    def __init__(self, order: tuple[str, str], window_s: float,
                 switch: Callable[[str, int, int], None], *, rounds: int | None = None,
                 counts: dict[str, int] | None = None, on_end: Callable[[], None] | None = None,
                 name: str = "gpuchef-ab") -> None:
        self.order, self.window_s, self.switch, self.rounds = order, window_s, switch, rounds
        self.counts = dict(counts) if counts else {k: 0 for k in LABELS}
        self.on_end, self.name = on_end, name
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self._t0 = 0.0

    def _edge(self, k: int) -> bool:
        label = self.order[k % 2]
        n = self.counts[label] + 1
        if self.rounds is not None and n > self.rounds:
            return False
        self.counts[label] = n
        self.switch(label, n, k)
        return True

    def start(self, inline_first: bool = False) -> None:
        self._t0 = time.monotonic()
        k = 0
        if inline_first:
            self._edge(0)
            k = 1
        self.thread = threading.Thread(target=self._loop, args=(k,), name=self.name, daemon=True)
        self.thread.start()

    def _loop(self, k: int) -> None:
        try:
            if k == 0:
                if not self._edge(0):
                    return
                k = 1
            while not self.stop_event.wait(max(0.0, self._t0 + k * self.window_s
                                               - time.monotonic())):
                if not self._edge(k):
                    break
                k += 1
        finally:
            if self.on_end is not None:
                self.on_end()

    def stop(self, timeout: float | None = 5.0) -> None:
        """End at once (the current window is cut short); waits for the thread unless called
        from it."""
        self.stop_event.set()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)


def windows_from_marks(events: Sequence[Any], run_id: int, end_ns: int) -> list[tuple[str, int, int, int]]:
    """``(label, n, t0_ns, t1_ns)`` of each window of run ``run_id`` (``probes.ab.windows``); the
    window still open ends at ``end_ns``; windows starting at or after ``end_ns`` are dropped."""
    _, wins, _ = ab_windows(events, run_id)
    out = []
    for w in wins:
        t1 = min(w.t1_ns if w.t1_ns is not None else end_ns, end_ns)
        if t1 > w.t0_ns:
            out.append((w.label, w.n, w.t0_ns, t1))
    return out


# ---- comparison ---------------------------------------------------------------------------------

def compare(runs: Sequence[WindowResult], percentiles: Sequence[float] = DEFAULT_PERCENTILES,
            goodput: dict[str, float] | None = None, *, interleaved: bool = False) -> Comparison:
    """``probes.ab.compare`` of the counted windows: each setting pooled, B − A per metric with
    the verdict needing ``MIN_WINDOWS`` pairs of interleaved windows or ``MIN_REPETITIONS``
    pairs of sequential runs. Raises ValueError when a setting has no counted window."""
    return _compare(runs, percentiles, goodput,
                    MIN_WINDOWS if interleaved else MIN_REPETITIONS)
