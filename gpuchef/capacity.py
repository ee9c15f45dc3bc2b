"""Capacity under latency SLOs: the highest request rate a setting sustains while every SLO holds.

Method: Sarathi-Serve's evaluation (Agrawal et al., OSDI 2024, §5) defines *capacity* as the
highest load (requests/s) at which the system still meets its latency targets (there: P99
time-between-tokens, with the median scheduling delay kept under 2 s), found by a binary search
over the request rate in which every probe is a full benchmark run. :func:`capacity_search` does
that bisection as a pure function over a ``measure(rate) -> metrics`` callable, so that it can be
tested against a synthetic latency model; ``gpuchef ab --capacity`` supplies a ``measure`` that
runs the engine.

The midpoint is geometric (``sqrt(lo·hi)``), so the bracket shrinks by the same *ratio* each
probe whatever the scale of the rates (0.5 req/s on a CPU, 50 on an H200). Bisection assumes that
meeting the SLOs is monotone in the rate; measurement noise near the capacity can break that, so
the result is "a rate that met the SLOs, with a failing rate within the tolerance above it".

SLO metrics use ``vllm bench serve``'s definitions (probes/metrics.py): TTFT, TPOT, ITL (every
gap between tokens), E2EL — each as mean, median or any percentile.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .engine_host.config import ConfigError

SLO_METRICS = ("ttft", "tpot", "itl", "e2el")
RATE_RANGE = (1e-3, 1e6)  # req/s
DEFAULT_MAX_PROBES = 16


@dataclass(frozen=True)
class SLO:
    """One latency target: ``metric`` (ttft/tpot/itl/e2el), ``stat`` ("mean", "median" or
    "p<q>" with q in [0, 100]) and ``limit_ms`` (ms). Met when the measured value is <= the
    limit; a value that could not be measured (NaN: no requests) does not meet it."""

    metric: str
    stat: str
    limit_ms: float

    @property
    def key(self) -> str:
        """``itl_p99``: also the key a Mapping ``measure`` result is read with."""
        return f"{self.metric}_{self.stat}"

    @property
    def percentile(self) -> float | None:
        if self.stat.startswith("p"):
            return float(self.stat[1:])
        return None

    def value(self, m: Any) -> float:
        """The measured value (ms) from a ``BenchMetrics`` or a Mapping {key: ms}."""
        if isinstance(m, Mapping):
            v = m.get(self.key, math.nan)
            return math.nan if v is None else float(v)
        if self.stat in ("mean", "median"):
            return float(getattr(m, f"{self.stat}_{self.metric}_ms"))
        q = self.percentile
        for p, v in getattr(m, f"percentiles_{self.metric}_ms"):
            if p == q:
                return float(v)
        raise ConfigError(f"percentile P{q:g} of {self.metric} was not computed for this run")

    def met(self, m: Any) -> bool:
        v = self.value(m)
        return math.isfinite(v) and v <= self.limit_ms

    def __str__(self) -> str:
        return f"{self.key} ≤ {self.limit_ms:g} ms"


_SLO_RE = re.compile(r"^(ttft|tpot|itl|e2el)_(mean|median|p\d+(?:\.\d+)?)$")
_VAL_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(ms|s)?$")


def parse_slos(spec: str | Sequence[str]) -> list[SLO]:
    """Parse ``"itl_p99:100ms,ttft_p99:2000ms"`` (pairs split by commas or spaces; values in
    ms by default, or with a ``ms``/``s`` unit) into SLOs.

    Keys are ``<metric>_<stat>``: metric ttft, tpot, itl or e2el; stat mean, median or p<q>
    (q in [0, 100], e.g. p50, p90, p99, p99.9). Raises ConfigError naming the bad pair and what
    is allowed; an empty spec or a key given twice is an error.
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    pairs = [p for s in parts for p in re.split(r"[,\s]+", str(s).strip()) if p]
    if not pairs:
        raise ConfigError("--slo is empty: give e.g. itl_p99:100ms,ttft_p99:2000ms")
    out: list[SLO] = []
    for pair in pairs:
        key, sep, val = pair.partition(":")
        key = key.strip().lower()
        m = _SLO_RE.match(key)
        if not sep or not m:
            raise ConfigError(
                f"--slo {pair!r} is not METRIC_STAT:VALUE: metric one of "
                f"{', '.join(SLO_METRICS)}; stat mean, median or p<0-100>; e.g. itl_p99:100ms")
        stat = m.group(2)
        if stat.startswith("p") and not 0.0 <= float(stat[1:]) <= 100.0:
            raise ConfigError(f"--slo {pair!r}: percentile {stat[1:]} is out of range: "
                              "allowed [0, 100]")
        v = _VAL_RE.match(val.strip().lower())
        if not v:
            raise ConfigError(f"--slo {pair!r}: {val!r} is not a duration (e.g. 100ms or 2s)")
        ms = float(v.group(1)) * (1000.0 if v.group(2) == "s" else 1.0)
        if not (math.isfinite(ms) and ms > 0):
            raise ConfigError(f"--slo {pair!r}: the limit must be > 0 ms")
        if any(s.key == key for s in out):
            raise ConfigError(f"--slo key {key!r} is given twice")
        out.append(SLO(m.group(1), stat, ms))
    return out


def slo_percentiles(slos: Sequence[SLO]) -> tuple[float, ...]:
    """The percentiles the SLOs need computed (for ``summarize(percentiles=...)``)."""
    return tuple(sorted({s.percentile for s in slos if s.percentile is not None}))


@dataclass(frozen=True)
class Tolerance:
    """When the bisection stops: the bracket [met, failed] is narrower than ``abs_rps`` req/s
    (if set) or than ``rel`` of its lower end (if set)."""

    rel: float | None = 0.05
    abs_rps: float | None = None

    def done(self, lo: float, hi: float) -> bool:
        if self.abs_rps is not None and hi - lo <= self.abs_rps:
            return True
        return self.rel is not None and lo > 0 and hi / lo - 1.0 <= self.rel

    def __str__(self) -> str:
        return f"{self.rel * 100:g}%" if self.rel is not None else f"{self.abs_rps:g} req/s"


def parse_tolerance(text: Any) -> Tolerance:
    """``"5%"`` (relative: stop when hi/lo − 1 <= 5 %) or ``"0.5"`` (absolute, req/s: stop
    when hi − lo <= 0.5). Raises ConfigError for anything else or a value <= 0."""
    s = str(text).strip().lower()
    rel = s.endswith("%")
    num = s[:-1] if rel else s.removesuffix("req/s").strip()
    try:
        v = float(num)
    except ValueError:
        raise ConfigError(f"--tolerance {text!r} must be a percentage (5%) or req/s (0.5)") from None
    if not (math.isfinite(v) and v > 0) or (rel and v >= 100):
        raise ConfigError(f"--tolerance {text!r} is out of range: allowed (0%, 100%) or > 0 req/s")
    return Tolerance(rel=v / 100.0, abs_rps=None) if rel else Tolerance(rel=None, abs_rps=v)


def check_rates(lo: Any, hi: Any) -> tuple[float, float]:
    """``--rate-lo``/``--rate-hi`` (req/s) as floats with 0 < lo < hi. Raises ConfigError."""
    a, b = RATE_RANGE
    vals = []
    for name, v in (("--rate-lo", lo), ("--rate-hi", hi)):
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} {v!r} must be a number of req/s") from None
        if not (math.isfinite(x) and a <= x <= b):
            raise ConfigError(f"{name} {v!r} is out of range: allowed [{a:g}, {b:g}] req/s")
        vals.append(x)
    if not vals[0] < vals[1]:
        raise ConfigError(f"--rate-lo {vals[0]:g} must be below --rate-hi {vals[1]:g}")
    return vals[0], vals[1]


#: A probe whose arrivals span less than this (s) cannot show that its rate is sustained.
MIN_PROBE_SPAN_S = 10.0


@dataclass
class Probe:
    """One measured rate: ``rate`` (req/s asked for), ``met`` (every SLO held), ``values``
    (SLO key → measured ms), ``metrics`` (what ``measure`` returned)."""

    rate: float
    met: bool
    values: dict[str, float]
    metrics: Any = None


@dataclass
class CapacityResult:
    """The outcome of :func:`capacity_search`.

    ``capacity``: the highest rate (req/s) that met every SLO, None when even ``rate_lo``
    failed. ``at_upper_bound``: ``rate_hi`` itself met them (capacity ≥ it: raise --rate-hi).
    ``bracket``: (highest met, lowest failed) — the true capacity lies between. ``probes``: in
    the order measured. ``converged``: stopped by the tolerance, not by ``max_probes``.
    """

    capacity: float | None
    at_upper_bound: bool
    bracket: tuple[float | None, float | None]
    probes: list[Probe] = field(default_factory=list)
    converged: bool = True

    def short_probes(self, min_span_s: float = MIN_PROBE_SPAN_S) -> list[Probe]:
        """Probes that met the SLOs with arrivals spanning less than ``min_span_s`` (requests
        completed / rate): too short for a queue to build, so "met" says little about whether
        the rate is sustained (20 requests at 32 req/s arrive in 0.6 s)."""
        out = []
        for p in self.probes:
            n = getattr(p.metrics, "completed", None)
            if p.met and n is not None and p.rate > 0 and n / p.rate < min_span_s:
                out.append(p)
        return out

    def describe(self) -> str:
        s = self._describe()
        short = self.short_probes()
        if short:
            s += (f" — warning: {len(short)} probe(s) that met the SLOs had arrivals spanning "
                  f"< {MIN_PROBE_SPAN_S:g} s (e.g. {short[-1].rate:.3g} req/s); too short to "
                  "show a sustained rate: give --duration 30 or more")
        return s

    def _describe(self) -> str:
        if self.capacity is None:
            lo = self.probes[0].rate if self.probes else math.nan
            return f"none: the SLOs fail already at {lo:g} req/s (the lowest rate tried)"
        if self.at_upper_bound:
            return f"≥ {self.capacity:.3g} req/s (met at --rate-hi; raise it)"
        lo, hi = self.bracket
        s = f"{self.capacity:.3g} req/s (fails at {hi:.3g})"
        return s if self.converged else s + " — not converged: probe limit reached"

    def as_dict(self) -> dict[str, Any]:
        def f(v: Any) -> Any:
            return None if isinstance(v, float) and not math.isfinite(v) else v
        return {"capacity_rps": self.capacity, "at_upper_bound": self.at_upper_bound,
                "bracket_rps": list(self.bracket), "converged": self.converged,
                "probes": [{"rate_rps": p.rate, "met": p.met,
                            "values_ms": {k: f(v) for k, v in p.values.items()}}
                           for p in self.probes]}


def capacity_search(measure: Callable[[float], Any], slos: Sequence[SLO], rate_lo: float,
                    rate_hi: float, tolerance: Tolerance = Tolerance(),
                    max_probes: int = DEFAULT_MAX_PROBES,
                    on_probe: Callable[[Probe], None] | None = None) -> CapacityResult:
    """Bisect over the request rate for the highest rate at which ``measure(rate)`` meets every
    SLO (Sarathi-Serve's capacity search; see the module docstring).

    ``measure(rate)`` (req/s) returns a ``BenchMetrics`` or a Mapping {SLO key: ms}. Probes
    ``rate_lo`` first (if it fails: capacity None), then ``rate_hi`` (if it holds: capacity
    ``rate_hi``, ``at_upper_bound``), then geometric midpoints until ``tolerance`` says the
    bracket is narrow enough or ``max_probes`` runs were made. ``on_probe`` sees each probe.
    Raises ConfigError for rates out of order, no SLOs or ``max_probes`` < 2.
    """
    if not slos:
        raise ConfigError("capacity search needs at least one SLO (--slo)")
    if max_probes < 2:
        raise ConfigError(f"max_probes {max_probes} must be >= 2")
    lo, hi = check_rates(rate_lo, rate_hi)
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        m = measure(rate)
        values = {s.key: s.value(m) for s in slos}
        p = Probe(rate, all(s.met(m) for s in slos), values, m)
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p.met

    if not probe(lo):
        return CapacityResult(None, False, (None, lo), probes)
    if probe(hi):
        return CapacityResult(hi, True, (hi, None), probes)
    ok, bad = lo, hi
    while not tolerance.done(ok, bad):
        if len(probes) >= max_probes:
            return CapacityResult(ok, False, (ok, bad), probes, converged=False)
        mid = math.sqrt(ok * bad)
        if probe(mid):
            ok = mid
        else:
            bad = mid
    return CapacityResult(ok, False, (ok, bad), probes)


def capacity_ratio(a: CapacityResult, b: CapacityResult) -> tuple[float | None, str]:
    """(B/A, text). None with a reason when a ratio cannot be given; ``≥``/``≤`` when a
    capacity is only bounded (met at --rate-hi)."""
    ca, cb = a.capacity, b.capacity
    if ca is None and cb is None:
        return None, "n/a: neither setting meets the SLOs in the rate range"
    if ca is None:
        return math.inf, "∞: B meets the SLOs at rates where A never does"
    if cb is None:
        return 0.0, "0: A meets the SLOs, B never does in the rate range"
    r = cb / ca
    prefix = ""
    if a.at_upper_bound and not b.at_upper_bound:
        prefix = "≤ "
    elif b.at_upper_bound and not a.at_upper_bound:
        prefix = "≥ "
    elif a.at_upper_bound and b.at_upper_bound:
        return None, "n/a: both meet the SLOs at --rate-hi (raise it)"
    return r, f"{prefix}{r:.2f}×"
