"""Workloads that shift: a list of phases read from a small YAML file, each with its own arrival
process, rate and length distribution, plus bursts and mixtures.

Pure data, as ``workload.py``: ``load_workload(name_or_path)`` parses and checks a file into a
``PhasedWorkload``; ``phase_items(wl, seed)`` turns it into ``(arrival_s, prompt_len,
output_len)`` triples at speed 1, which ``workload.generate`` time-scales, clips and gives token
ids. Same file + seed → same triples.

The file (docs/workloads.md has the full table)::

    name: conv_long_burst              # optional; default: the file's stem
    description: conversation, then a burst of long prompts, then conversation again
    phases:
      - name: conversation
        duration_s: 60
        arrival: trace                 # the trace's own arrival times (and lengths)
        dataset: azure-conv
      - name: long prompts
        duration_s: 20
        request_rate: 2                # req/s; request_rate_end: a linear ramp to it
        input_len: 5000                # lengths 2000..8000: range_ratio 0.6
        range_ratio: 0.6
        output_len: 64
        burst: {at_s: 5, count: 20}    # 20 more requests at once, 5 s into the phase
      - name: mixed
        duration_s: 60
        request_rate: 3
        mix:                           # each arrival's lengths from one component, by weight
          - {weight: 0.8, dataset: azure-conv}
          - {weight: 0.2, input_len: 5000, range_ratio: 0.6, output_len: 64}

Every phase key, its default and what it takes is in ``PHASE_KEYS``; a wrong key or value is
one ConfigError naming the file, the phase, the key and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError
from .traces import (BUNDLED_DATASETS, MAX_REQUESTS, WORKLOADS_DIR, _int, _num, dataset_path,
                     load_trace_csv)
WORKLOAD_SUFFIXES: tuple[str, ...] = (".yaml", ".yml")
#: Workloads bundled with gpuchef, usable by name (``--dataset conv_long_burst``).
BUNDLED_WORKLOADS: dict[str, Path] = {
    p.stem: p for p in sorted(WORKLOADS_DIR.glob("*.yaml"))}

#: A phase's engine mark (``EngineHost.mark``) is ``PHASE_MARK_PREFIX + name``: the live load
#: sends one as each phase starts, the dashboard draws it on the time axis.
PHASE_MARK_PREFIX = "phase:"

TOP_KEYS: dict[str, str] = {
    "name": "the workload's name (default: the file's stem)",
    "description": "one line saying what the workload is",
    "phases": "the list of phases, in order",
}
#: key -> what it takes (the error messages and docs/workloads.md list these)
PHASE_KEYS: dict[str, str] = {
    "name": "a label (default 'phase N')",
    "duration_s": "seconds > 0 (required)",
    "arrival": "poisson (gamma inter-arrival times; 'gamma' is the same), constant, or trace "
               "(the trace's own times; default poisson)",
    "request_rate": "req/s >= 0 (required unless arrival is trace)",
    "request_rate_end": "req/s >= 0: the rate ramps linearly from request_rate to it",
    "burstiness": "gamma shape > 0 (1 = Poisson, < 1 burstier; default 1)",
    "trace_speed": "arrival trace: time scale > 0 (2 = twice as fast; default 1)",
    "dataset": "random (default), azure-conv or a trace CSV path: where lengths come from",
    "input_len": "dataset random: prompt tokens >= 1 (default 1024)",
    "output_len": "dataset random: output tokens >= 1 (default 128)",
    "range_ratio": "dataset random: lengths uniform in [len*(1-r), len*(1+r)], r in [0, 1)",
    "mix": "a list of length sources, each with a weight > 0 (instead of dataset/input_len/...)",
    "burst": "{at_s, count} or a list of them: count extra requests at at_s into the phase",
}
LENGTH_KEYS: tuple[str, ...] = ("dataset", "input_len", "output_len", "range_ratio")
MIX_KEYS: tuple[str, ...] = ("weight", *LENGTH_KEYS)
BURST_KEYS: tuple[str, ...] = ("at_s", "count")
PHASE_ARRIVALS: tuple[str, ...] = ("poisson", "constant", "trace")

# The phases' own random streams (workload.py uses 0..3, the HTTP client's ramp-up 4).
_STREAM_PHASES = 5
_SUB_ARRIVALS, _SUB_LENGTHS, _SUB_MIX = 0, 1, 2


@dataclass(frozen=True)
class Lengths:
    """One length source. ``dataset``: "random" (``input_len``/``output_len`` uniform within
    ``range_ratio``, as ``WorkloadConfig``'s random dataset) or a trace (a bundled name or an
    absolute CSV path: each request takes a row's lengths, rows drawn uniformly with
    replacement). ``weight``: its share in a mixture (normalised over the mixture)."""

    dataset: str = "random"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    weight: float = 1.0


@dataclass(frozen=True)
class Burst:
    """``count`` requests that all arrive ``at_s`` seconds into their phase."""

    at_s: float
    count: int


@dataclass(frozen=True)
class Phase:
    """One phase: ``duration_s`` seconds starting at ``start_s`` (s from the load's start, at
    speed 1). ``arrival`` "poisson"/"constant" at ``request_rate`` req/s (ramping linearly to
    ``request_rate_end`` when set) with gamma shape ``burstiness``, or "trace": the rows of
    ``lengths[0].dataset`` replayed at ``trace_speed`` from where the previous phase on that
    trace stopped. ``lengths``: one source, or a mixture. ``bursts``: extra requests at once."""

    name: str
    start_s: float
    duration_s: float
    arrival: str = "poisson"
    request_rate: float = 0.0
    request_rate_end: float | None = None
    burstiness: float = 1.0
    trace_speed: float = 1.0
    lengths: tuple[Lengths, ...] = (Lengths(),)
    bursts: tuple[Burst, ...] = ()

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def expected_arrivals(self) -> float:
        """Mean arrivals of the process (bursts left out; 0 for a trace phase)."""
        if self.arrival == "trace":
            return 0.0
        r1 = self.request_rate if self.request_rate_end is None else self.request_rate_end
        return self.duration_s * (self.request_rate + r1) / 2


@dataclass(frozen=True)
class PhasedWorkload:
    """A parsed workload file: ``name``, ``path`` (absolute), ``description`` and its
    ``phases`` back to back from 0 s."""

    name: str
    path: str
    description: str
    phases: tuple[Phase, ...]

    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s


# ---------------------------------------------------------------------------------------------
# Names and files

def is_workload(name: str) -> bool:
    """Whether ``--dataset name`` means a phased workload: a bundled workload's name or a path
    ending in .yaml/.yml."""
    key = str(name).strip()
    return key in BUNDLED_WORKLOADS or Path(key).suffix.lower() in WORKLOAD_SUFFIXES


def workload_path(name: str) -> Path:
    """The YAML file of a workload: a bundled name or a path. Raises ConfigError for a missing
    file."""
    key = str(name).strip()
    if key in BUNDLED_WORKLOADS:
        return BUNDLED_WORKLOADS[key]
    p = Path(key).expanduser()
    if not p.is_file():
        raise ConfigError(f"--dataset {name!r}: no such workload file (bundled workloads: "
                          f"{', '.join(BUNDLED_WORKLOADS) or 'none'})")
    return p


def load_workload(name: str) -> PhasedWorkload:
    """Read and check a workload file (bundled name or path). Raises ConfigError naming the
    file, the phase and the key for a missing or unreadable file, bad YAML, an unknown key or a
    value out of range. Cached on (path, mtime, size)."""
    p = workload_path(name)
    try:
        st = p.stat()
    except OSError as e:
        raise ConfigError(f"workload file {str(p)!r}: cannot read it ({e.strerror or e})") from None
    return _load_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _load_cached(path: str, _mtime_ns: int, _size: int) -> PhasedWorkload:
    import yaml

    where = f"workload file {path!r}"
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise ConfigError(f"{where}: cannot read it ({why})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({what}{at})") from None
    return _parse_workload(doc, path, where)


# ---------------------------------------------------------------------------------------------
# Parsing

def _keys(d: Any, allowed, where: str, what: str) -> dict:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: {what} must be a mapping (key: value), got {d!r}")
    bad = [k for k in d if k not in allowed]
    if bad:
        raise ConfigError(f"{where}: unknown key {bad[0]!r} in {what}: allowed "
                          f"{', '.join(allowed)}")
    return d


def _parse_workload(doc: Any, path: str, where: str) -> PhasedWorkload:
    if doc is None:
        raise ConfigError(f"{where} is empty: expected 'phases:' with a list of phases")
    _keys(doc, TOP_KEYS, where, "the file")
    raw = doc.get("phases")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: 'phases' must be a non-empty list of phases, got {raw!r}")
    base = Path(path).parent
    phases, t = [], 0.0
    for i, d in enumerate(raw):
        ph = _parse_phase(d, i, t, f"{where}, phase {i + 1}", base)
        phases.append(ph)
        t = ph.end_s
    expected = sum(p.expected_arrivals + sum(b.count for b in p.bursts) for p in phases)
    if expected > MAX_REQUESTS:
        raise ConfigError(f"{where}: its phases make about {expected:.0f} requests: allowed "
                          f"<= {MAX_REQUESTS}")
    name = str(doc.get("name") or Path(path).stem)
    return PhasedWorkload(name, path, str(doc.get("description") or ""), tuple(phases))


def _parse_phase(d: Any, i: int, start: float, where: str, base: Path) -> Phase:
    if isinstance(d, dict):
        name = str(d.get("name") or f"phase {i + 1}")
        where = f"{where} ({name!r})"
    _keys(d, PHASE_KEYS, where, "a phase")
    if "duration_s" not in d:
        raise ConfigError(f"{where}: duration_s is missing: {PHASE_KEYS['duration_s']}")
    dur = _num(f"{where}: duration_s", d["duration_s"])
    if not dur > 0:
        raise ConfigError(f"{where}: duration_s {d['duration_s']!r} must be > 0 (s)")
    arr = str(d.get("arrival", "poisson")).strip().lower()
    arr = "poisson" if arr == "gamma" else arr
    if arr not in PHASE_ARRIVALS:
        raise ConfigError(f"{where}: arrival {d.get('arrival')!r} is not one of "
                          f"{', '.join(PHASE_ARRIVALS)} (gamma = poisson)")
    kw: dict[str, Any] = {"name": name, "start_s": start, "duration_s": dur, "arrival": arr,
                          "bursts": _parse_bursts(d.get("burst"), dur, where)}
    if arr == "trace":
        kw.update(_trace_phase(d, where, base))
    else:
        kw.update(_process_phase(d, where, base))
    return Phase(**kw)


def _trace_phase(d: dict, where: str, base: Path) -> dict:
    for k in ("request_rate", "request_rate_end", "burstiness", "mix", "input_len",
              "output_len", "range_ratio"):
        if k in d:
            raise ConfigError(f"{where}: {k} does not apply to arrival: trace (the trace brings "
                              "its own times and lengths; trace_speed scales the times)")
    ds = d.get("dataset")
    if ds is None or str(ds).strip() == "random":
        raise ConfigError(f"{where}: arrival: trace needs dataset: azure-conv or a trace CSV "
                          f"path, got {ds!r}")
    speed = _num(f"{where}: trace_speed", d.get("trace_speed", 1.0))
    if not speed > 0:
        raise ConfigError(f"{where}: trace_speed {d.get('trace_speed')!r} must be > 0 "
                          "(1 = real time, 2 = twice as fast)")
    return {"trace_speed": speed, "lengths": (Lengths(dataset=_trace_name(ds, where, base)),)}


def _rate(where: str, key: str, value: Any) -> float:
    r = _num(f"{where}: {key}", value)
    if r < 0:
        raise ConfigError(f"{where}: {key} {value!r} must be >= 0 (req/s; 0 = no arrivals)")
    return r


def _process_phase(d: dict, where: str, base: Path) -> dict:
    if "trace_speed" in d:
        raise ConfigError(f"{where}: trace_speed applies to arrival: trace only (give "
                          "request_rate for this phase's arrivals)")
    if "request_rate" not in d:
        raise ConfigError(f"{where}: request_rate is missing: {PHASE_KEYS['request_rate']}")
    kw: dict[str, Any] = {"request_rate": _rate(where, "request_rate", d["request_rate"])}
    if d.get("request_rate_end") is not None:
        kw["request_rate_end"] = _rate(where, "request_rate_end", d["request_rate_end"])
    b = _num(f"{where}: burstiness", d.get("burstiness", 1.0), allow_inf=True)
    if not b > 0:
        raise ConfigError(f"{where}: burstiness {d.get('burstiness')!r} must be > 0 "
                          "(1 = Poisson; < 1 burstier; > 1 smoother)")
    kw["burstiness"] = b
    if "mix" in d:
        both = [k for k in LENGTH_KEYS if k in d]
        if both:
            raise ConfigError(f"{where}: give either mix or {', '.join(both)}, not both (each "
                              "mix component has its own lengths)")
        kw["lengths"] = _parse_mix(d["mix"], where, base)
    else:
        kw["lengths"] = (_parse_lengths(d, where, base, weight=1.0),)
    return kw


def _trace_name(ds: Any, where: str, base: Path) -> str:
    """A bundled trace's name, or the CSV path (relative to the workload file's folder) made
    absolute. Raises ConfigError for a file that is not there."""
    key = str(ds).strip()
    if key in BUNDLED_DATASETS:
        return key
    p = Path(key).expanduser()
    if not p.is_absolute():
        p = base / p
    if p.suffix.lower() != ".csv" and not p.exists():
        raise ConfigError(f"{where}: dataset {ds!r} is not known: use random, "
                          f"{', '.join(BUNDLED_DATASETS)} or a path to a trace CSV file")
    if not p.is_file():
        raise ConfigError(f"{where}: dataset {ds!r}: no such file ({str(p)!r})")
    return str(p.resolve())


def _parse_lengths(d: dict, where: str, base: Path, *, weight: float) -> Lengths:
    ds = str(d.get("dataset", "random")).strip()
    if ds != "random":
        given = [k for k in ("input_len", "output_len", "range_ratio") if k in d]
        if given:
            raise ConfigError(f"{where}: {', '.join(given)} applies to dataset random only (a "
                              f"trace's rows bring their lengths), got dataset {ds!r}")
        return Lengths(dataset=_trace_name(ds, where, base), weight=weight)
    r = _num(f"{where}: range_ratio", d.get("range_ratio", 0.0))
    if not 0.0 <= r < 1.0:
        raise ConfigError(f"{where}: range_ratio {d.get('range_ratio')!r} is out of range: "
                          "allowed [0, 1)")
    return Lengths("random", _int(f"{where}: input_len", d.get("input_len", 1024), 1),
                   _int(f"{where}: output_len", d.get("output_len", 128), 1), r, weight)


def _parse_mix(raw: Any, where: str, base: Path) -> tuple[Lengths, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: mix must be a non-empty list of length sources, each with "
                          f"a weight, got {raw!r}")
    out = []
    for j, c in enumerate(raw):
        w = f"{where}, mix {j + 1}"
        _keys(c, MIX_KEYS, w, "a mix component")
        if "weight" not in c:
            raise ConfigError(f"{w}: weight is missing: a number > 0 (its share of the "
                              "phase's requests, normalised over the mix)")
        wt = _num(f"{w}: weight", c["weight"])
        if not wt > 0:
            raise ConfigError(f"{w}: weight {c['weight']!r} must be > 0")
        out.append(_parse_lengths(c, w, base, weight=wt))
    return tuple(out)


def _parse_bursts(raw: Any, dur: float, where: str) -> tuple[Burst, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for j, b in enumerate(items):
        w = f"{where}, burst {j + 1}" if isinstance(raw, list) else f"{where}, burst"
        _keys(b, BURST_KEYS, w, "a burst")
        missing = [k for k in BURST_KEYS if k not in b]
        if missing:
            raise ConfigError(f"{w}: {missing[0]} is missing: a burst is {{at_s: seconds into "
                              "the phase, count: requests}}")
        at = _num(f"{w}: at_s", b["at_s"])
        if not 0 <= at < dur:
            raise ConfigError(f"{w}: at_s {b['at_s']!r} is out of range: allowed [0, {dur:g}) "
                              "(s into the phase)")
        out.append(Burst(at, _int(f"{w}: count", b["count"], 1, MAX_REQUESTS)))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Generation

def _rng(seed: int, i: int, sub: int, *more: int) -> np.random.Generator:
    return np.random.default_rng([seed, _STREAM_PHASES, i, sub, *more])


def _process_times(ph: Phase, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s into the phase) of a poisson/constant phase.

    The rate may ramp linearly, r(t) = r0 + (r1 − r0)·t/D, so the process runs in operational
    time u = Λ(t) = ∫r: a unit-rate gamma process there (gaps of mean 1, shape ``burstiness``)
    or constant slots (u = k + ½, so a constant phase of r·D slots gets r·D requests, centred),
    mapped back by t = Λ⁻¹(u) = 2u / (r0 + √(r0² + 2(r1 − r0)u/D)) (the stable root)."""
    r0 = ph.request_rate
    r1 = r0 if ph.request_rate_end is None else ph.request_rate_end
    total = ph.expected_arrivals  # Λ(D)
    if total <= 0:
        return np.zeros(0)
    if ph.arrival == "constant" or math.isinf(ph.burstiness):
        u = np.arange(math.ceil(total), dtype=np.float64) + 0.5
    else:
        b = ph.burstiness
        chunk, parts, end = max(64, int(total * 1.1) + 1), [], 0.0
        while end < total:
            part = end + np.cumsum(rng.gamma(shape=b, scale=1.0 / b, size=chunk))
            parts.append(part)
            end = float(part[-1])
        u = np.concatenate(parts)
    u = u[u < total]
    disc = np.maximum(r0 * r0 + 2.0 * (r1 - r0) * u / ph.duration_s, 0.0)
    den = r0 + np.sqrt(disc)
    t = np.divide(2.0 * u, den, out=np.zeros_like(u), where=den > 0)
    return np.minimum(t, np.nextafter(ph.duration_s, 0.0))  # float noise stays in the phase


def _trace_period(times: np.ndarray) -> float:
    """A trace looped: it restarts one mean gap after its last row (1 s for a single row)."""
    span = float(times[-1] - times[0])
    return span + span / (len(times) - 1) if span > 0 else 1.0


def _trace_window(rows: list, start: float, length: float) -> list[tuple[float, int, int]]:
    """The rows of the trace looped endlessly whose trace time lies in [start, start+length),
    as (time − start, context, generated)."""
    times = np.array([r[0] for r in rows])
    period = _trace_period(times)
    out = []
    for k in range(int(start // period), int((start + length) // period) + 1):
        t = times + k * period
        lo = int(np.searchsorted(t, start, "left"))
        hi = int(np.searchsorted(t, start + length, "left"))
        out.extend((float(t[j] - start), rows[j][1], rows[j][2]) for j in range(lo, hi))
    return out


def _draw_lengths(src: Lengths, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    if src.dataset != "random":
        rows = load_trace_csv(dataset_path(src.dataset))
        pick = rng.integers(0, len(rows), size=n)
        return (np.array([rows[j][1] for j in pick], dtype=np.int64),
                np.array([rows[j][2] for j in pick], dtype=np.int64))
    r = src.range_ratio  # workload._random_lengths' definition (vllm RandomDataset)
    in_lo = max(1, math.floor(src.input_len * (1 - r)))
    in_hi = max(in_lo, math.ceil(src.input_len * (1 + r)))
    out_lo = max(1, math.floor(src.output_len * (1 - r)))
    out_hi = max(out_lo, math.ceil(src.output_len * (1 + r)))
    return rng.integers(in_lo, in_hi + 1, size=n), rng.integers(out_lo, out_hi + 1, size=n)


def _lengths(ph: Phase, seed: int, i: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (prompt, output) lengths of phase ``i``: from its one source, or per request from
    a mixture component drawn by weight (each component its own stream, so changing one
    component's lengths leaves the others' draws alone)."""
    if len(ph.lengths) == 1:
        return _draw_lengths(ph.lengths[0], _rng(seed, i, _SUB_LENGTHS), n)
    w = np.array([c.weight for c in ph.lengths])
    comp = _rng(seed, i, _SUB_MIX).choice(len(w), size=n, p=w / w.sum())
    ins, outs = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for j, c in enumerate(ph.lengths):
        sel = comp == j
        ins[sel], outs[sel] = _draw_lengths(c, _rng(seed, i, _SUB_LENGTHS, j), int(sel.sum()))
    return ins, outs


def phase_items(wl: PhasedWorkload, seed: int) -> list[list[tuple[float, int, int]]]:
    """Per phase, its ``(arrival_s, prompt_len, output_len)`` at speed 1, ``arrival_s`` counted
    from the load's start and sorted; a burst's requests come after the process's arrivals at
    the same time. A trace phase continues its trace where the previous phase on the same
    trace stopped (looping at its end). Deterministic in (file, seed).
    Raises ConfigError for an unreadable trace."""
    cursor: dict[str, float] = {}
    out = []
    for i, ph in enumerate(wl.phases):
        if ph.arrival == "trace":
            ds = ph.lengths[0].dataset
            rows = load_trace_csv(dataset_path(ds))
            length = ph.duration_s * ph.trace_speed
            win = _trace_window(rows, cursor.get(ds, rows[0][0]), length)
            cursor[ds] = cursor.get(ds, rows[0][0]) + length
            t = np.array([w[0] / ph.trace_speed for w in win])
            ins = np.array([w[1] for w in win], dtype=np.int64)
            outs = np.array([w[2] for w in win], dtype=np.int64)
            if ph.bursts:  # a burst's lengths drawn from the same trace
                nb = sum(b.count for b in ph.bursts)
                bi, bo = _draw_lengths(ph.lengths[0], _rng(seed, i, _SUB_LENGTHS), nb)
                ins, outs = np.concatenate([ins, bi]), np.concatenate([outs, bo])
        else:
            t = _process_times(ph, _rng(seed, i, _SUB_ARRIVALS))
        burst_t = [b.at_s for b in ph.bursts for _ in range(b.count)]
        t = np.concatenate([t, np.array(burst_t, dtype=np.float64)])
        if ph.arrival != "trace":
            ins, outs = _lengths(ph, seed, i, len(t))
        order = np.argsort(t, kind="stable")
        out.append([(ph.start_s + float(t[j]), int(ins[j]), int(outs[j])) for j in order])
    return out


# ---------------------------------------------------------------------------------------------
# The schedule as run: trace meta, marks

def schedule(wl: PhasedWorkload, speed: float = 1.0,
             duration_s: float | None = None) -> list[dict[str, Any]]:
    """The phases as a run at time scale ``speed`` sends them: ``[{"name", "start_s", "end_s"},
    ...]`` (s from the load's start; speed inf puts every phase at 0), cut at ``duration_s``
    (phases starting at or after it left out)."""
    out = []
    for ph in wl.phases:
        a, b = ph.start_s / speed, ph.end_s / speed
        if duration_s is not None:
            if a >= duration_s and out:
                break
            b = min(b, duration_s)
        out.append({"name": ph.name, "start_s": round(a, 9), "end_s": round(b, 9)})
    return out


def phases_meta(wl: PhasedWorkload, speed: float = 1.0,
                duration_s: float | None = None) -> dict[str, Any]:
    """The trace meta's ``phases`` record (docs/trace-format.md): the workload's name, file and
    description, and per phase its start/end as run (``schedule``) with its definition."""
    from dataclasses import asdict

    def lengths(x: Lengths) -> dict[str, Any]:  # a trace's rows bring their own lengths
        d = asdict(x)
        return d if x.dataset == "random" else {"dataset": x.dataset, "weight": x.weight}

    # only the keys that apply to the phase's arrival (a trace phase has no rate)
    unused = ("request_rate", "request_rate_end", "burstiness")
    phases = []
    for ph, s in zip(wl.phases, schedule(wl, speed, duration_s)):
        d = {k: v for k, v in asdict(ph).items() if k != "start_s" and not (
            k in unused if ph.arrival == "trace" else k == "trace_speed")}
        phases.append({**s, **d, "lengths": [lengths(x) for x in ph.lengths],
                       "bursts": [asdict(x) for x in ph.bursts]})
    return {"name": wl.name, "file": wl.path, "description": wl.description,
            "speed": speed, "phases": phases}


def phase_mark(name: str) -> str:
    """The engine mark sent as phase ``name`` starts."""
    return f"{PHASE_MARK_PREFIX}{name}"


def parse_phase_mark(mark: str) -> str | None:
    """The phase name of a phase mark, else None."""
    s = str(mark)
    return s[len(PHASE_MARK_PREFIX):] if s.startswith(PHASE_MARK_PREFIX) else None
