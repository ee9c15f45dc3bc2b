"""Serving metrics with ``vllm bench serve``'s names and definitions, plus gpuchef's step figures.

Definitions (vllm/benchmarks/serve.py ``calculate_metrics``; DESIGN.md "Requests and latency"):

* a request is *completed* when it finished normally (``finish_reason`` "length" or "stop");
  anything else ("abort", "error") is *failed* and adds no tokens;
* TTFT = first token − arrival; E2EL = last token − arrival;
* TPOT = (E2EL − TTFT)/(output_len − 1), only for requests with ``output_len > 1``;
* ITL = every gap between consecutive tokens, pooled over all completed requests;
* throughputs divide by the benchmark duration: request = completed/s, output token =
  generated tokens/s, total token = (input + generated tokens)/s;
* goodput (``--goodput ttft:MS tpot:MS e2el:MS``) = completed requests/s whose every named
  metric is <= its SLO; a request with one output token counts as TPOT 0 there, as in vllm.

Probe requests (ids starting with ``engine_host.workload.PROBE_ID_PREFIX``) are left out of all
of the above and summarised on their own, as vllm's probe requests are.

From ``StepRecord``s: steps, steps/s, mean step time, mean prefill/decode/total tokens per step,
steps that mix prefill and decode, preemptions, and the busy fraction
``sum(gpu_ms) / (last step end − first step start)`` — the share of the wall time the model was
computing, which the gaps between continuous-batching steps pull down.
"""

from __future__ import annotations

import math
import re
from itertools import chain
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpuchef.engine_host.config import ConfigError
from gpuchef.engine_host.records import RequestRecord, StepRecord
from gpuchef.engine_host.workload import PROBE_ID_PREFIX

COMPLETED_REASONS = ("length", "stop")
GOODPUT_KEYS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (50.0, 99.0)
NAN = float("nan")

_METRICS = (  # (attribute stem, short name, section header) — vllm's wording
    ("ttft", "TTFT", "Time to First Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)


def _check_q(q: Any) -> float:
    try:
        v = float(q)
    except (TypeError, ValueError):
        raise ConfigError(f"percentile {q!r} must be a number in [0, 100]") from None
    if not 0.0 <= v <= 100.0:
        raise ConfigError(f"percentile {q!r} is out of range: allowed [0, 100]")
    return v


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (``q`` in [0, 100]) with linear interpolation, as
    ``numpy.percentile``'s default. NaN for no values. Raises ConfigError for ``q`` out of range."""
    qq = _check_q(q)
    a = np.asarray(values if isinstance(values, (np.ndarray, list, tuple)) else list(values),
                   dtype=np.float64)
    if a.size == 0:
        return NAN
    return float(np.percentile(a, qq))


def parse_percentiles(spec: str | Iterable[Any]) -> tuple[float, ...]:
    """``"50,90,99"`` (vllm's ``--metric-percentiles``) or numbers -> a tuple of floats in
    [0, 100], order and duplicates kept out. Raises ConfigError naming a bad value."""
    items = re.split(r"[,\s]+", spec.strip()) if isinstance(spec, str) else list(spec)
    out: list[float] = []
    for it in items:
        if isinstance(it, str) and not it.strip():
            continue
        v = _check_q(it)
        if v not in out:
            out.append(v)
    if not out:
        raise ConfigError(f"--metric-percentiles {spec!r} names no percentile: "
                          "give numbers in [0, 100], e.g. 50,99")
    return tuple(out)


def parse_goodput(spec: str | Iterable[str] | None) -> dict[str, float]:
    """Parse SLOs for goodput: ``"ttft:500 tpot:50 e2el:2000"`` or ``["ttft:500", ...]`` (ms).

    The format of vllm bench serve's ``--goodput KEY:VALUE ...``; pairs may be separated by
    spaces or commas. Keys: ttft, tpot, e2el. Values: ms, finite and >= 0. None or "" -> {}.
    Raises ConfigError for a pair without ``:``, an unknown key, a key given twice, or a bad number.
    """
    if spec is None:
        return {}
    parts = [spec] if isinstance(spec, str) else list(spec)
    pairs = [p for s in parts for p in re.split(r"[,\s]+", str(s).strip()) if p]
    out: dict[str, float] = {}
    for pair in pairs:
        key, sep, val = pair.partition(":")
        key = key.strip().lower()
        if not sep:
            raise ConfigError(f"--goodput {pair!r} is not KEY:VALUE (e.g. ttft:500); "
                              f"keys are {', '.join(GOODPUT_KEYS)}")
        if key not in GOODPUT_KEYS:
            raise ConfigError(f"--goodput key {key!r} in {pair!r} is not one of "
                              f"{', '.join(GOODPUT_KEYS)}")
        if key in out:
            raise ConfigError(f"--goodput key {key!r} is given twice")
        try:
            v = float(val)
        except ValueError:
            raise ConfigError(f"--goodput {pair!r}: {val!r} is not a number of ms") from None
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"--goodput {pair!r}: {val!r} is out of range: allowed a finite "
                              "number of ms >= 0")
        out[key] = v
    return out


def _mean(a: Sequence[float]) -> float:
    return float(np.mean(a)) if len(a) else NAN


def _median(a: Sequence[float]) -> float:
    return float(np.median(a)) if len(a) else NAN


def _std(a: Sequence[float]) -> float:
    return float(np.std(a)) if len(a) else NAN


def _pw(p: float) -> str:
    """vllm's percentile label: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


@dataclass
class BenchMetrics:
    """The results of one run. Field names follow vllm's ``BenchmarkMetrics``.

    Latencies in ms; throughputs per second of ``duration_s``. A statistic over no values is NaN
    (vllm prints 0 there; NaN keeps "no data" apart from "zero"). ``percentiles_<m>_ms`` is a
    list of ``(percentile, value)`` for each requested percentile. ``request_goodput`` is None
    when no SLOs were given. Step fields are NaN/0 when no steps were given (``num_steps`` 0).
    ``busy_fraction`` is in [0, 1].
    """

    duration_s: float
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    goodput_slos_ms: dict[str, float]
    percentiles: tuple[float, ...]
    mean_ttft_ms: float
    median_ttft_ms: float
    std_ttft_ms: float
    percentiles_ttft_ms: list[tuple[float, float]]
    mean_tpot_ms: float
    median_tpot_ms: float
    std_tpot_ms: float
    percentiles_tpot_ms: list[tuple[float, float]]
    mean_itl_ms: float
    median_itl_ms: float
    std_itl_ms: float
    percentiles_itl_ms: list[tuple[float, float]]
    mean_e2el_ms: float
    median_e2el_ms: float
    std_e2el_ms: float
    percentiles_e2el_ms: list[tuple[float, float]]
    # probe requests (one output token each; their E2EL is the stall a new request sees)
    probe_completed: int = 0
    probe_failed: int = 0
    median_probe_e2el_ms: float = NAN
    p99_probe_e2el_ms: float = NAN
    max_probe_e2el_ms: float = NAN
    # engine steps
    num_steps: int = 0
    steps_span_s: float = NAN
    steps_per_s: float = NAN
    mean_step_ms: float = NAN
    mean_gpu_ms: float = NAN
    mean_prefill_tokens_per_step: float = NAN
    mean_decode_tokens_per_step: float = NAN
    mean_tokens_per_step: float = NAN
    num_mixed_steps: int = 0
    num_preemptions: int = 0
    busy_fraction: float = NAN

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: vllm bench serve's result keys (``duration``, ``completed``,
        ``total_input_tokens``, ``mean_ttft_ms``, ``p99_ttft_ms``, ...) plus gpuchef's step and
        probe keys. NaN becomes None (strict JSON has no NaN)."""
        d = asdict(self)
        out: dict[str, Any] = {
            "duration": d.pop("duration_s"),
            "completed": d.pop("completed"),
            "failed": d.pop("failed"),
            "total_input_tokens": d.pop("total_input"),
            "total_output_tokens": d.pop("total_output"),
        }
        for stem, _, _ in _METRICS:
            for p, v in d.pop(f"percentiles_{stem}_ms"):
                d[f"p{_pw(p)}_{stem}_ms"] = v
        d["percentiles"] = list(d["percentiles"])
        out.update(d)
        return {k: _json_safe(v) for k, v in out.items()}


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def _is_probe(r: RequestRecord) -> bool:
    return r.request_id.startswith(PROBE_ID_PREFIX)


def summarize(records: Sequence[RequestRecord], duration_s: float, *,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES,
              goodput: dict[str, float] | None = None,
              steps: Sequence[StepRecord] | None = None) -> BenchMetrics:
    """Compute a run's metrics from its finished requests and (optionally) its engine steps.

    ``duration_s``: the benchmark duration (s, > 0) that throughputs divide by.
    ``percentiles``: which P-x to report (each in [0, 100]). ``goodput``: SLOs in ms from
    ``parse_goodput`` (None or {} = no goodput). Definitions: see the module docstring (vllm
    bench serve's ``calculate_metrics``). Raises ConfigError for ``duration_s`` <= 0, a
    percentile out of range, or an unknown goodput key.
    """
    dur = float(duration_s)
    if not (math.isfinite(dur) and dur > 0):
        raise ConfigError(f"benchmark duration {duration_s!r} s must be > 0")
    pcts = tuple(_check_q(p) for p in percentiles)
    slos = dict(goodput or {})
    for k, v in slos.items():
        if k not in GOODPUT_KEYS:
            raise ConfigError(f"goodput key {k!r} is not one of {', '.join(GOODPUT_KEYS)}")

    ttfts: list[float] = []
    tpots: list[float] = []
    token_times: list[tuple[int, ...]] = []  # of the timed requests with >= 2 tokens: the ITLs
    e2els: list[float] = []
    completed = failed = total_in = total_out = good = 0
    probe_e2el: list[float] = []
    probe_ok = probe_bad = 0
    for r in records:
        done = r.finish_reason in COMPLETED_REASONS
        if _is_probe(r):
            if done and r.e2el_ms is not None:
                probe_ok += 1
                probe_e2el.append(r.e2el_ms)
            else:
                probe_bad += 1
            continue
        if not done:
            failed += 1
            continue
        completed += 1
        total_in += r.prompt_len
        total_out += r.output_len
        ttft, e2el = r.ttft_ms, r.e2el_ms
        if ttft is None or e2el is None:
            continue  # no token times: counted, but nothing to time
        tpot = 0.0  # vllm: a one-token request has TPOT 0 for goodput
        if r.output_len > 1:
            tpot = (e2el - ttft) / (r.output_len - 1)
            tpots.append(tpot)
        ttfts.append(ttft)
        e2els.append(e2el)
        if len(r.token_times_ns) > 1:
            token_times.append(r.token_times_ns)
        req = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
        if slos and all(req[k] <= v for k, v in slos.items()):
            good += 1

    def stats(vals) -> tuple[float, float, float, list[tuple[float, float]]]:
        a = np.asarray(vals, dtype=np.float64)
        if a.size == 0:
            return NAN, NAN, NAN, [(p, NAN) for p in pcts]
        qs = np.percentile(a, pcts) if pcts else ()
        return (float(a.mean()), float(np.median(a)), float(a.std()),
                [(p, float(v)) for p, v in zip(pcts, qs)])

    itls = _itls_ms(token_times)

    m = BenchMetrics(
        duration_s=dur, completed=completed, failed=failed,
        total_input=total_in, total_output=total_out,
        request_throughput=completed / dur,
        output_throughput=total_out / dur,
        total_token_throughput=(total_in + total_out) / dur,
        request_goodput=(good / dur) if slos else None,
        goodput_slos_ms=slos, percentiles=pcts,
        **{f"{k}_{stem}_ms": v
           for stem, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els))
           for k, v in zip(("mean", "median", "std", "percentiles"), stats(vals))},
        probe_completed=probe_ok, probe_failed=probe_bad,
        median_probe_e2el_ms=_median(probe_e2el),
        p99_probe_e2el_ms=percentile(probe_e2el, 99),
        max_probe_e2el_ms=max(probe_e2el) if probe_e2el else NAN,
    )
    if steps:
        _add_steps(m, steps)
    return m


def _itls_ms(token_times: list[tuple[int, ...]]) -> np.ndarray:
    """Every request's inter-token latencies (ms), concatenated in request order: float64 (n,).
    Equal to ``[x for t in token_times for x in RequestRecord.itls_ms]``, in one numpy pass
    (a 60-s window at an H200's load holds ~190 k of them)."""
    if not token_times:
        return np.zeros(0)
    lens = np.fromiter(map(len, token_times), np.int64, len(token_times))
    try:
        flat = np.fromiter(chain.from_iterable(token_times), np.int64, int(lens.sum()))
    except (OverflowError, TypeError):  # times past int64 (a bogus trace): Python's ints
        return np.asarray([(t[i] - t[i - 1]) / 1e6 for t in token_times
                           for i in range(1, len(t))], dtype=np.float64)
    d = np.diff(flat) / 1e6
    keep = np.ones(d.size, dtype=bool)
    # not the gap from one request's last token to the next one's first
    keep[np.cumsum(lens)[:-1] - 1] = False
    return d[keep]


def _add_steps(m: BenchMetrics, steps: Sequence[StepRecord]) -> None:
    n = len(steps)
    span_ns = max(s.t_end_ns for s in steps) - min(s.t_start_ns for s in steps)
    span_s = span_ns / 1e9
    m.num_steps = n
    m.steps_span_s = span_s
    m.steps_per_s = n / span_s if span_s > 0 else NAN
    m.mean_step_ms = _mean([s.wall_ms for s in steps])
    m.mean_gpu_ms = _mean([s.gpu_ms for s in steps])
    m.mean_prefill_tokens_per_step = _mean([s.num_prefill_tokens for s in steps])
    m.mean_decode_tokens_per_step = _mean([s.num_decode_reqs for s in steps])
    m.mean_tokens_per_step = _mean([s.num_prefill_tokens + s.num_decode_reqs for s in steps])
    m.num_mixed_steps = sum(1 for s in steps if s.num_prefill_tokens > 0 and s.num_decode_reqs > 0)
    m.num_preemptions = sum(s.num_preempted for s in steps)
    m.busy_fraction = (sum(s.gpu_ms for s in steps) / (span_ns / 1e6)) if span_ns > 0 else NAN


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or isinstance(v, str):
        return "{:<10}".format(str(v))
    if isinstance(v, (int, np.integer)):
        return "{:<10}".format(int(v))
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "{:<10}".format("n/a")
    return "{:<10.2f}".format(float(v))


def format_results_block(m: BenchMetrics, title: str = "Serving Benchmark Result",
                         extra: dict[str, str] | None = None) -> str:
    """The results as text in ``vllm bench serve``'s layout (vllm/benchmarks/serve.py):
    the title centred in a line of 50 ``=``, rows ``"{:<40} {:<10}"``, one section of 50 ``-``
    per latency metric (Mean, Median, then P-x for each percentile), then gpuchef's
    "Engine Steps" section, closed by 50 ``=``. ``extra`` rows (label -> value, e.g.
    {"Scheduler mode:": "chunked"}) go after "Failed requests:", where vllm prints the run's
    configured rate and concurrency. A value with no data prints as "n/a". No trailing newline.
    """
    lines: list[str] = []

    def row(label: str, value: Any) -> None:
        lines.append("{:<40} {}".format(label, _fmt(value)).rstrip())

    def header(text: str, c: str) -> None:
        lines.append("{s:{c}^{n}}".format(s=text, c=c, n=50))

    header(f" {title} ", "=")
    row("Successful requests:", m.completed)
    row("Failed requests:", m.failed)
    for k, v in (extra or {}).items():
        row(k if k.endswith(":") else k + ":", v)
    row("Benchmark duration (s):", float(m.duration_s))
    row("Total input tokens:", m.total_input)
    row("Total generated tokens:", m.total_output)
    row("Request throughput (req/s):", float(m.request_throughput))
    if m.request_goodput is not None:
        row("Request goodput (req/s):", float(m.request_goodput))
    row("Output token throughput (tok/s):", float(m.output_throughput))
    row("Total token throughput (tok/s):", float(m.total_token_throughput))
    for stem, name, head in _METRICS:
        header(head, "-")
        row(f"Mean {name} (ms):", getattr(m, f"mean_{stem}_ms"))
        row(f"Median {name} (ms):", getattr(m, f"median_{stem}_ms"))
        for p, v in getattr(m, f"percentiles_{stem}_ms"):
            row(f"P{_pw(p)} {name} (ms):", v)
    if m.probe_completed or m.probe_failed:
        header("Probe Requests", "-")
        row("Probe requests completed:", m.probe_completed)
        row("Probe requests failed:", m.probe_failed)
        row("Median probe E2EL (ms):", m.median_probe_e2el_ms)
        row("P99 probe E2EL (ms):", m.p99_probe_e2el_ms)
        row("Max probe E2EL (ms):", m.max_probe_e2el_ms)
    header("Engine Steps (gpuchef)", "-")
    row("Engine steps:", m.num_steps)
    row("Steps per second:", m.steps_per_s)
    row("Mean step time (ms):", m.mean_step_ms)
    row("Mean prefill tokens per step:", m.mean_prefill_tokens_per_step)
    row("Mean decode tokens per step:", m.mean_decode_tokens_per_step)
    row("Mean tokens per step:", m.mean_tokens_per_step)
    row("Mixed prefill+decode steps:", m.num_mixed_steps)
    row("Preemptions:", m.num_preemptions)
    row("Compute busy fraction (%):", m.busy_fraction * 100.0)
    lines.append("=" * 50)
    return "\n".join(lines)
