"""A/B experiments: two scheduler settings against the same seeded load, on one engine.

``gpuchef ab`` (gpuchef/ab_cmd.py) is a thin shell over this module:

* :func:`parse_setting` turns ``--a``/``--b`` specs (``mode=chunked,max_num_batched_tokens=2048``)
  into full :class:`SchedulerConfig` s;
* :func:`run_sequential` runs the load once per setting per repetition, A then B, then B then A
  (alternating the order cancels slow drift: thermals, clocks, a noisy neighbour);
* :func:`run_interleaved` runs one load while the engine alternates settings in windows of
  ``window_s`` seconds on the same arrival stream;
* :func:`compare` pools each setting's runs and computes B − A with its spread over the
  repetitions (or windows) and a verdict.

Every run or window starts with an ``ab:<run>:<A|B>:<n>`` mark event and the experiment ends
with ``ab:<run>:end`` (``probes.ab.mark_name``: the dashboard's live A/B writes the same marks).
Settings are switched between steps through the host (``set_config`` →
``LLMEngine.set_scheduler_config``), so the trace also holds each knob change as an event.

Windows, their membership (a request by arrival, a step by start), the window throughput (work
done while the setting was in force), pooling and the verdict are ``probes.ab``'s — the one
definition the live A/B screen and ``gpuchef report`` use too — computed here from the same
records the trace receives. Requests that straddle an edge are counted in full for the window
they arrived in, so windows should be long against the requests' E2EL (the command warns when
many straddle).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

from .engine_host.config import AUTO_BUDGET, ConfigError, SchedulerConfig, parse_settings
from .engine_host.records import EngineEvent
from .probes.ab import (FAILED_ROW, LABELS, MIN_REPETITIONS, MIN_WINDOWS, NOT_ENOUGH, Comparison,
                        DeltaRow, MetricSpec, WindowResult, mark_name, metric_specs, pool,
                        rep_request_id, window_results)
from .probes.ab import compare as _compare
from .probes.ab import windows as ab_windows
from .probes.metrics import DEFAULT_PERCENTILES

__all__ = ["Comparison", "DeltaRow", "MetricSpec", "Run", "Setting", "compare", "format_deltas",
           "metric_specs", "parse_setting", "pool", "run_interleaved", "run_orders",
           "run_sequential", "side_by_side"]

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
    """Parse ``KNOB=VALUE[,KNOB=VALUE...]`` over ``base`` with ``engine_host.config``'s grammar
    (:func:`~gpuchef.engine_host.config.parse_settings`: vLLM's names and flags, the palette's
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


def _assert_idle(engine: Any) -> None:
    """Each run must start with no requests and an empty KV cache (else it inherits load)."""
    if engine.has_unfinished():
        raise RuntimeError("the engine still holds requests between A/B runs")
    used = engine.kv.usage().used
    if used:
        raise RuntimeError(f"the KV cache still holds {used} blocks between A/B runs")


def _mark(engine: Any, label: str, listeners: Sequence[Callable[[str, Any], None]]) -> EngineEvent:
    """A mark event emitted while no host runs (the same record ``host.mark`` makes). A run's
    opening mark is emitted this way, before the host starts, so that it precedes the load's
    clock origin and every arrival; ``step`` is the first step the run will execute."""
    ev = EngineEvent("mark", engine.step_id, time.monotonic_ns(), label)
    for f in listeners:
        f("event", ev)
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
                   repetitions: int = 1, *, listeners: Sequence[Callable[[str, Any], None]] = (),
                   console: Any = None, percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                   goodput: dict[str, float] | None = None, samplers: Any = None,
                   run_id: int = 1, on_run: Callable[[int, int, Run], None] | None = None
                   ) -> list[Run]:
    """Run ``specs`` once per setting per repetition on ``engine``, in :func:`run_orders`.

    Each run gets the same specs (identical arrival offsets, lengths and token ids; the ids
    suffixed by repetition, :func:`rep_specs`), starts on an idle engine with an empty KV
    cache, and has the setting in force from its first step.
    ``on_run(i, total, run)`` is called after each run. Returns every complete window (one per
    run, in execution order; figures by ``probes.ab``: a run's span ends at its last token).
    Raises RuntimeError if the engine is not idle between runs, and what ``run_load`` raises.
    """
    from .sessions.headless import run_load

    rec = _Records()
    orders = run_orders(repetitions)
    total = 2 * len(orders)
    i = 0
    for rep, order in enumerate(orders, start=1):
        for label in order:
            _assert_idle(engine)
            st = settings[label]

            def on_start(host: Any, st: Setting = st) -> None:
                host.set_config(**st.knobs())

            first = _mark(engine, mark_name(run_id, label, rep), listeners)
            res = run_load(engine, rep_specs(specs, rep, run_id, label), listeners=listeners,
                           console=console, on_start=on_start)
            rec.add(res, first)
            rec.load_t0.append((first.t_ns, res.t0_ns))
            i += 1
            if on_run is not None:
                on_run(i, total, Run(label, rep, first.t_ns, res.t0_ns + int(res.duration_s * 1e9),
                                     list(res.requests), list(res.steps), load_t0_ns=res.t0_ns))
    _assert_idle(engine)
    rec.events.append(_mark(engine, mark_name(run_id, "end"), listeners))
    return rec.runs(run_id, percentiles, goodput, samplers, sequential=True)


class _Switcher:
    """Alternates the host between two settings every ``window_s`` seconds (a thread)."""

    def __init__(self, engine: Any, settings: dict[str, Setting], order: tuple[str, str],
                 window_s: float, run_id: int, listeners: Sequence[Callable[[str, Any], None]]
                 ) -> None:
        self.engine, self.listeners = engine, listeners
        self.settings, self.order, self.window_s, self.run_id = settings, order, window_s, run_id
        self.first: EngineEvent | None = None
        self.stop = threading.Event()
        self.counts = {k: 0 for k in LABELS}
        self.host: Any = None
        self.thread: threading.Thread | None = None

    def _switch(self, k: int) -> None:
        label = self.order[k % 2]
        self.counts[label] += 1
        name = mark_name(self.run_id, label, self.counts[label])
        self.host.set_config(**self.settings[label].knobs())
        if k == 0:  # before the host starts: the mark must precede the load's first arrival
            self.first = _mark(self.engine, name, self.listeners)
        else:
            self.host.mark(name)

    def on_start(self, host: Any) -> None:
        self.host = host
        self._switch(0)  # queued before the host starts: in force from the first step
        self.thread = threading.Thread(target=self._loop, name="gpuchef-ab-switch", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        t0 = time.monotonic()
        k = 1
        # Edges on absolute deadlines so that windows do not drift with the switch cost.
        while not self.stop.wait(max(0.0, t0 + k * self.window_s - time.monotonic())):
            self._switch(k)
            k += 1

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5.0)


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


def run_interleaved(engine: Any, specs: Sequence[Any], settings: dict[str, Setting],
                    window_s: float, repetitions: int = 1, *,
                    listeners: Sequence[Callable[[str, Any], None]] = (), console: Any = None,
                    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                    goodput: dict[str, float] | None = None, samplers: Any = None,
                    run_id: int = 1, on_run: Callable[[int, int, Run], None] | None = None
                    ) -> tuple[list[Run], float]:
    """One load per repetition while the engine alternates A and B every ``window_s`` s
    (repetition 2 starts with B, and so on). Returns (every complete window, in time order —
    ``Run.counted`` says which enter the comparison, by ``probes.ab``'s rules; the share of
    the counted windows' requests that finished after their window ended).

    Windows, membership (requests by arrival, steps by start) and throughput (work done in the
    window) are ``probes.ab``'s. Raises ConfigError when the load is too short for one counted
    window per setting; RuntimeError if the engine is not idle at the start; what ``run_load``
    raises."""
    from .sessions.headless import run_load

    rec = _Records()
    counts = {k: 0 for k in LABELS}
    for rep, order in enumerate(run_orders(repetitions), start=1):
        _assert_idle(engine)
        sw = _Switcher(engine, settings, order, window_s, run_id, listeners)
        sw.counts = dict(counts)  # window numbers go on across repetitions
        try:
            res = run_load(engine, rep_specs(specs, rep, run_id), listeners=listeners,
                           console=console, on_start=sw.on_start)
        finally:
            sw.close()
        counts = dict(sw.counts)
        rec.add(res, sw.first)
        if sw.first is not None:
            rec.load_t0.append((sw.first.t_ns, res.t0_ns))
    _assert_idle(engine)
    rec.events.append(_mark(engine, mark_name(run_id, "end"), listeners))
    runs = rec.runs(run_id, percentiles, goodput, samplers)
    counted = [r for r in runs if r.counted]
    for i, r in enumerate(counted, start=1):
        if on_run is not None:
            on_run(i, 0, r)
    for k in LABELS:
        if not any(r.label == k for r in counted):
            raise ConfigError(
                f"the load was too short for a full --window of setting {k} ({window_s:g} s): "
                "lower --window, or lengthen the load (--num-prompts, --duration, a finite "
                "--request-rate)")
    n = sum(len(r.requests) for r in counted)
    late = sum(1 for r in counted for q in r.requests
               if q.token_times_ns and q.token_times_ns[-1] > r.t1_ns)
    return runs, (late / n if n else 0.0)


# ---- comparison ---------------------------------------------------------------------------------

def compare(runs: Sequence[WindowResult], percentiles: Sequence[float] = DEFAULT_PERCENTILES,
            goodput: dict[str, float] | None = None, *, interleaved: bool = False) -> Comparison:
    """``probes.ab.compare`` of the counted windows: each setting pooled, B − A per metric with
    the verdict needing ``MIN_WINDOWS`` pairs of interleaved windows or ``MIN_REPETITIONS``
    pairs of sequential runs. Raises ValueError when a setting has no counted window."""
    return _compare(runs, percentiles, goodput,
                    MIN_WINDOWS if interleaved else MIN_REPETITIONS)


# ---- text output --------------------------------------------------------------------------------

LABEL_W = 40
COL_W = 16


def _split_row(line: str) -> tuple[str, str] | None:
    """A results-block row ``"{:<40} {value}"`` as (label, value); None for a header line
    (``===…`` / ``---title---``). A row with an empty value (its trailing spaces stripped) is
    a row with value "", not a header."""
    if len(line) > LABEL_W and line[LABEL_W] == " " and line[:LABEL_W].rstrip().endswith(":"):
        return line[:LABEL_W].rstrip(), line[LABEL_W + 1:].strip()
    if len(line) <= LABEL_W and line.endswith(":") and not line.startswith(("=", "-")):
        return line, ""
    return None


def side_by_side(block_a: str, block_b: str, title: str, heads: tuple[str, str] = ("A", "B")) -> str:
    """Merge two ``format_results_block`` texts into one with two value columns. Rows are
    matched by label (a row only one block has shows "" in the other column); section headers
    are re-centred to the wider block. The value columns are COL_W wide, or wider when a value
    needs it (two spaces at least between columns)."""
    vals = [r[1] for blk in (block_a, block_b) for r in map(_split_row, blk.splitlines()) if r]
    col = max([COL_W, *(len(v) + 2 for v in vals)])
    width = LABEL_W + 1 + 2 * col
    rows_b: dict[tuple[str, str], str] = {}
    section = ""
    for line in block_b.splitlines():
        r = _split_row(line)
        if r is None:
            section = line.strip("=- ")
        else:
            rows_b[(section, r[0])] = r[1]
    out = ["{s:=^{n}}".format(s=f" {title} ", n=width),
           "{:<{w}} {:>{c}}{:>{c}}".format("", heads[0], heads[1], w=LABEL_W, c=col)]
    section = ""
    lines = block_a.splitlines()
    for i, line in enumerate(lines):
        r = _split_row(line)
        if r is None:
            section = line.strip("=- ")
            if i == 0:
                continue  # title: replaced above
            if not section:
                out.append(line[0] * width if line else line)
            else:
                out.append("{s:{c}^{n}}".format(s=section, c=line[0], n=width))
            continue
        vb = rows_b.pop((section, r[0]), "")
        out.append("{:<{w}} {:>{c}}{:>{c}}".format(r[0], r[1], vb, w=LABEL_W, c=col).rstrip())
    return "\n".join(out)


def _num(v: float, digits: int = 2) -> str:
    if v is None or not math.isfinite(v):
        return "n/a"
    return f"{v:.{digits}f}"


def format_deltas(cmp: Comparison, unit_name: str = "repetition") -> str:
    """The B − A table. Pooled columns (A, B, B − A, %): each setting's counted windows as one
    set of requests and steps. Per-window columns: the median and the min..max of the paired
    deltas B_n − A_n, computed from the same windows. Then the verdict (``probes.ab.verdict``).
    The first row counts failed requests; when A's and B's shares of failed requests differ the
    judged rows read "not comparable" and a line under the table says why
    (``Comparison.not_comparable``)."""
    na, nb = cmp.count("A"), cmp.count("B")
    plural = lambda n: f"{n} {unit_name}{'s' if n != 1 else ''}"  # noqa: E731
    head = (f" B − A: pooled over {plural(na)} of A and {plural(nb)} of B; "
            f"per {unit_name}: {min(na, nb)} pairs ")
    fmt = "{:<32}{:>11}{:>11}{:>11}{:>9} │{:>11}{:>21}  {:<13}"
    width = 32 + 11 * 3 + 9 + 2 + 11 + 21 + 2 + 13
    lines = ["{s:-^{n}}".format(s=head, n=width),
             fmt.format("", "pooled", "", "", "", f"per {unit_name}", "", ""),
             fmt.format("metric", "A", "B", "B − A", "%", "median Δ", "Δ min..max", "verdict")]
    short = False
    for r in cmp.rows:
        nd = 0 if r.key == FAILED_ROW else 2  # a count
        lo, hi = r.spread
        spread = f"{_num(lo, nd)}..{_num(hi, nd)}" if math.isfinite(lo) else "—"
        med = r.median_delta
        pct = f"{r.delta_pct:+.1f}%" if math.isfinite(r.delta_pct) else "n/a"
        delta = f"{r.delta:+.{nd}f}" if math.isfinite(r.delta) else "n/a"
        v = r.verdict
        if v.startswith(NOT_ENOUGH):  # the run is over: no "yet" about it
            v, short = "no verdict" + v[len(NOT_ENOUGH):], True
        lines.append(fmt.format(r.label[:31], _num(r.a, nd), _num(r.b, nd), delta, pct,
                                f"{med:+.{nd}f}" if math.isfinite(med) else "—", spread,
                                v).rstrip())
    lines.append("-" * width)
    if cmp.not_comparable:
        lines.append(f"Not comparable: {cmp.not_comparable}.")
    lines.append(f"Pooled: all counted {unit_name}s of a setting as one set (a P99 of the pooled "
                 f"requests need not lie among the\n"
                 f"per-{unit_name} P99s). Per {unit_name}: "
                 f"B_n − A_n of each pair. Verdict: B better/worse when the means of the\n"
                 f"{unit_name}s differ by more than either setting's range and every pair agrees; "
                 f"it needs {cmp.min_pairs} pairs.")
    if short:
        lines.append(f"No verdict: {min(na, nb)} pair(s) of {unit_name}s, a verdict needs "
                     f"{cmp.min_pairs}" + (f" (--repetitions {cmp.min_pairs} or more)"
                                           if unit_name == "repetition" else
                                           " (a longer run, or shorter --window)") + ".")
    if cmp.skipped:
        lines.append("Not counted: " + "; ".join(f"{r.name} ({r.why})" for r in cmp.skipped[:6])
                     + (" …" if len(cmp.skipped) > 6 else ""))
    return "\n".join(lines)
