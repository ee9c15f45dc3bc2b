"""Serving metrics with ``vllm bench serve``'s names and definitions, plus gpuchef's step figures.

Definitions (vllm/benchmarks/serve.py ``calculate_metrics``):

* a request is *completed* when it finished normally (``finish_reason`` "length" or "stop");
  one *withdrawn* by the tool itself (``WITHDRAWN_REASONS``: a capacity probe stopped early
  aborts the requests still open or to come; a session that ends — `top` quit, a bench
  interrupted — aborts those still in the engine; :func:`is_withdrawn`) is neither completed
  nor failed, only counted as withdrawn; anything else ("abort", "error") is *failed* and adds no
  tokens;
* TTFT = first token − arrival; E2EL = last token − arrival;
* TPOT = (E2EL − TTFT)/(output_len − 1), only for requests with ``output_len > 1``;
* ITL = the gap before each output chunk after the first, pooled over all completed requests:
  tokens that arrive at one time stamp (a multi-token step of a hosted vLLM, an SSE chunk of k
  tokens) are one chunk, as vllm/benchmarks/lib/endpoint_request_func.py records one ITL per
  streamed chunk; so a request's ITLs add up to E2EL − TTFT, and none is a 0 never measured
  (``RequestRecord.itls_ms``, ``RequestTable``);
* throughputs divide by the benchmark duration: request = completed/s, output token =
  generated tokens/s, total token = (input + generated tokens)/s;
* goodput (``--goodput ttft:MS tpot:MS e2el:MS``) = completed requests/s whose every named
  metric is <= its SLO; a request with one output token counts as TPOT 0 there, as in vllm.

Probe requests (ids starting with ``engine_host.vocab.workload.PROBE_ID_PREFIX``) are left out of all
of the above and summarised on their own, as vllm's probe requests are.

From ``StepRecord``s: steps, steps/s, mean step time, mean prefill/decode/total tokens per step,
steps that mix prefill and decode, preemptions, and the busy fraction
``sum(gpu_ms) / (last step end − first step start)`` — the share of the wall time the model was
computing, which the gaps between continuous-batching steps pull down.

The GPU fields' means and the autopilot's totals are ``probes.summaries``'; TTFT by prompt
lane is ``probes.lanes``'.
"""

from __future__ import annotations

import math
import re
from itertools import chain
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.engine_host.vocab.workload import PROBE_ID_PREFIX

# the GPU means and the autopilot's totals live in probes.summaries; their names are imported
# from here too (the dashboard, the report, the commands)
from .summaries import (GPU_FIELDS, GPU_SUMMARY_FIELDS, AutopilotTotals,  # noqa: F401
                        autopilot_totals, gpu_means, gpu_value, steered_itl_ms)

COMPLETED_REASONS = ("length", "stop")
#: ``finish_reason`` of the requests a capacity probe's early stop withdraws (the probe is
#: decided: ``gpuchef ab --capacity`` aborts the rest with it; the trace keeps it).
WITHDRAWN_REASON = "early stop"
#: ``finish_reason`` of the requests still in the engine when a session closes (`gpuchef top`
#: quit, `bench` interrupted, `serve` stopped): gpuchef withdrew them, the server did not fail.
SESSION_END_REASON = "session end"
WITHDRAWN_REASONS = (WITHDRAWN_REASON, SESSION_END_REASON)
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


def _median(a: Sequence[float]) -> float:
    return float(np.median(a)) if len(a) else NAN


def percentile_label(p: float) -> str:
    """vllm's percentile label: 99 -> "99", 99.9 -> "99.9" (``p99_ttft_ms``, "P99.9 TTFT")."""
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
    # requests withdrawn by the tool (a capacity probe's early stop): neither completed nor failed
    withdrawn: int = 0
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

    @property
    def steps_measured(self) -> bool:
        """Whether engine steps went into these figures (``summarize(steps=...)`` with some).
        Without them — a server seen only from its client (``bench --base-url``, ``ab`` over
        HTTP, ``top --attach``) — every step field is unknown, not 0, and the results block
        leaves its "Engine Steps" section out."""
        return self.num_steps > 0

    def to_dict(self, *, empty_as_zero: bool = False) -> dict[str, Any]:
        """A JSON-ready dict: vllm bench serve's result keys (``duration``, ``completed``,
        ``total_input_tokens``, ``mean_ttft_ms``, ``p99_ttft_ms``, ...) plus gpuchef's step and
        probe keys. NaN becomes None (strict JSON has no NaN). ``empty_as_zero``: a TTFT, TPOT,
        ITL or E2EL statistic (mean, median, std, P-x) over no request — none completed, or
        none with two output tokens for TPOT — is 0.0 instead, as in ``vllm bench serve``'s
        result JSON (``np.mean(ttfts or 0)``): what ``--result-json`` writes."""
        d = asdict(self)
        out: dict[str, Any] = {
            "duration": d.pop("duration_s"),
            "completed": d.pop("completed"),
            "failed": d.pop("failed"),
            "withdrawn": d.pop("withdrawn"),
            "total_input_tokens": d.pop("total_input"),
            "total_output_tokens": d.pop("total_output"),
        }
        for stem, _, _ in _METRICS:
            for p, v in d.pop(f"percentiles_{stem}_ms"):
                d[f"p{percentile_label(p)}_{stem}_ms"] = v
        d["percentiles"] = list(d["percentiles"])
        if empty_as_zero:
            stats = [*("mean", "median", "std"),
                     *(f"p{percentile_label(p)}" for p in self.percentiles)]
            for stem, _, _ in _METRICS:
                for k in (f"{x}_{stem}_ms" for x in stats):
                    if isinstance(d.get(k), float) and math.isnan(d[k]):
                        d[k] = 0.0
        out.update(d)
        return {k: json_safe(v) for k, v in out.items()}


def json_safe(v: Any) -> Any:
    """``v`` with every non-finite float (NaN, ±inf: not JSON) as None, dicts, lists and tuples
    walked (tuples become lists)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def is_completed(finish_reason: str) -> bool:
    """Whether a request ended in the engine ("length" or "stop": ``COMPLETED_REASONS``), the
    one rule for "a finished request": ``vllm bench serve``'s *completed* here, and the requests
    vLLM's per-request /metrics series observe (``vllm:request_success_total`` and every
    per-request histogram, gpuchef/serve/metrics.py). An aborted request is in neither, however
    far it got: vLLM 0.24 records ``FinishedRequestStats`` only for requests that finish in its
    output processor, and its abort path (``AsyncLLM.abort`` → ``OutputProcessor.
    abort_requests``) drops the request with none, queued or running (vLLM issues #31503,
    #55634). Its tokens still count where vLLM counts them per step (prompt and generation
    token counters, TTFT, ITL)."""
    return finish_reason in COMPLETED_REASONS


def is_withdrawn(finish_reason: str) -> bool:
    """Whether a request was withdrawn by the tool itself (``WITHDRAWN_REASONS``: the early stop
    of a capacity probe aborts the requests still running or still to arrive once the probe is
    decided; a closing session aborts those still in the engine). The one rule for it: such a
    request did not fail — nothing went wrong with it or with the server — so it is in neither
    *completed* nor *failed* (``BenchMetrics.withdrawn`` counts it); a client's or server's
    abort ("abort") and an error are failed."""
    return finish_reason in WITHDRAWN_REASONS


def is_probe_id(request_id: str) -> bool:
    """Whether ``request_id`` is a probe request's: it starts with ``PROBE_ID_PREFIX``, after a
    mirrored A/B's side prefix (``A/``, ``B/``: ``probes.ab.side_of``) where it has one."""
    rid = str(request_id)
    return rid.startswith(PROBE_ID_PREFIX) or (rid[:2] in ("A/", "B/")
                                               and rid[2:].startswith(PROBE_ID_PREFIX))


def _is_probe(r: RequestRecord) -> bool:
    return is_probe_id(r.request_id)


class RequestTable:
    """Finished requests as named numpy columns, one row per request, appended incrementally
    (each record is converted once): the one implementation of the per-request definitions
    above, read by :func:`summarize` (a run, a report, ``ab``) and by the dashboard (a rolling
    window over rows appended as requests finish, see :func:`window_metrics`).

    Columns (``cols[name]``, all of length ``len(self)``): ``key`` (int64: the caller's ordering
    key, e.g. the timeline's finish ns; rows must be appended in non-decreasing key order for
    :meth:`rows_between`), ``probe`` (probe request), ``counted`` (completed, not a probe),
    ``failed`` (not completed, not withdrawn, not a probe), ``withdrawn`` (:func:`is_withdrawn`,
    probe or not), ``timed`` (counted and has token times),
    ``probe_ok`` (a completed probe with token times), ``prompt_len`` / ``output_len``
    (tokens; int64), ``ttft_ms`` / ``e2el_ms`` / ``tpot_ms`` (float64 ms; NaN where the request
    has no token times, TPOT NaN for one output token), ``itl_end`` (int64: cumulative end offset
    of the row's ITLs in ``itl_ms``). ``itl_ms``: float64, every timed request's ITLs (one per
    output chunk after the first, ``RequestRecord.itls_ms``), in row order.

    NaN policy (here and for the GPU fields, :func:`gpu_means`): a value that was not measured
    is NaN and is left out of a statistic; a statistic over no values is NaN, never 0.
    """

    COLUMNS = ("key", "probe", "counted", "failed", "withdrawn", "timed", "probe_ok",
               "prompt_len", "output_len", "ttft_ms", "tpot_ms", "e2el_ms", "itl_end")
    _FLOAT = ("ttft_ms", "tpot_ms", "e2el_ms")
    _BOOL = ("probe", "counted", "failed", "withdrawn", "timed", "probe_ok")

    def __init__(self) -> None:
        self.cols: dict[str, np.ndarray] = {
            k: np.zeros(0, dtype=np.float64 if k in self._FLOAT else
                        bool if k in self._BOOL else np.int64) for k in self.COLUMNS}
        self.itl_ms = np.zeros(0)

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord]) -> "RequestTable":
        t = cls()
        t.append(records)
        return t

    def __len__(self) -> int:
        return len(self.cols["key"])

    def append(self, records: Iterable[RequestRecord],
               keys: Iterable[int] | None = None) -> None:
        """Add ``records`` (keys default to 0: then only whole-table statistics make sense)."""
        recs = list(records)
        if not recs:
            return
        n = len(recs)
        ks = [0] * n if keys is None else [int(k) for k in keys]
        nan = NAN
        rows: dict[str, list] = {k: [] for k in self.COLUMNS if k != "itl_end"}
        timed_times: list[tuple[int, ...]] = []
        timed_rows: list[int] = []
        for i, r in enumerate(recs):
            probe = _is_probe(r)
            done = is_completed(r.finish_reason)
            gone = is_withdrawn(r.finish_reason)
            t = r.token_times_ns
            counted = done and not probe
            ttft = e2el = tpot = nan
            if t:
                ttft, e2el = (t[0] - r.arrival_ns) / 1e6, (t[-1] - r.arrival_ns) / 1e6
                if r.output_len > 1:
                    tpot = (e2el - ttft) / (r.output_len - 1)
            timed = counted and bool(t)
            if timed and len(t) > 1:
                timed_times.append(t)
                timed_rows.append(i)
            for k, v in (("key", ks[i]), ("probe", probe), ("counted", counted),
                         ("failed", not (done or gone or probe)), ("withdrawn", gone),
                         ("timed", timed),
                         ("probe_ok", probe and done and bool(t)), ("prompt_len", r.prompt_len),
                         ("output_len", r.output_len), ("ttft_ms", ttft), ("tpot_ms", tpot),
                         ("e2el_ms", e2el)):
                rows[k].append(v)
        itls, counts = _itls_and_counts(timed_times)
        per_row = np.zeros(n, dtype=np.int64)
        per_row[timed_rows] = counts
        base = int(self.cols["itl_end"][-1]) if len(self) else 0
        for k, v in rows.items():
            self.cols[k] = np.concatenate([self.cols[k], np.asarray(v, dtype=self.cols[k].dtype)])
        self.cols["itl_end"] = np.concatenate([self.cols["itl_end"], base + np.cumsum(per_row)])
        self.itl_ms = np.concatenate([self.itl_ms, itls]) if len(itls) else self.itl_ms

    def drop_first(self, n: int) -> None:
        """Forget the first ``n`` rows and their ITLs (a rolling window moved past them)."""
        if n <= 0:
            return
        off = int(self.cols["itl_end"][n - 1])
        for k in self.COLUMNS:
            self.cols[k] = self.cols[k][n:]
        self.cols["itl_end"] = self.cols["itl_end"] - off
        self.itl_ms = self.itl_ms[off:]

    def rows_between(self, k0: int, k1: int, lo: int = 0) -> tuple[int, int]:
        """Rows ``[i, j)`` whose key is in ``[k0, k1)``, not before row ``lo``."""
        k = self.cols["key"]
        i = max(lo, int(np.searchsorted(k, k0, side="left")))
        return i, max(i, int(np.searchsorted(k, k1, side="left")))

    def itls(self, i: int, j: int) -> np.ndarray:
        """The ITLs (ms) of rows ``[i, j)``."""
        if j <= i:
            return self.itl_ms[:0]
        e = self.cols["itl_end"]
        return self.itl_ms[(int(e[i - 1]) if i > 0 else 0):int(e[j - 1])]


def _itls_and_counts(token_times: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_itls_ms` and how many ITLs each request has (int64 (n,))."""
    n = len(token_times)
    if not n:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    lens = np.fromiter(map(len, token_times), np.int64, n)
    try:
        flat = np.fromiter(chain.from_iterable(token_times), np.int64, int(lens.sum()))
    except (OverflowError, TypeError):  # times past int64 (a bogus trace): Python's ints
        per = [[(t[i] - t[i - 1]) / 1e6 for i in range(1, len(t)) if t[i] != t[i - 1]]
               for t in token_times]
        return (np.asarray([x for p in per for x in p], dtype=np.float64),
                np.asarray([len(p) for p in per], dtype=np.int64))
    dt = np.diff(flat)
    owner = np.repeat(np.arange(n), lens)[1:]  # the request of each gap's later token
    keep = dt != 0  # tokens of one chunk share a time stamp: one ITL per chunk
    keep[np.cumsum(lens)[:-1] - 1] = False  # not from one request's last token to the next's first
    return dt[keep] / 1e6, np.bincount(owner[keep], minlength=n).astype(np.int64)


def _stats(a: np.ndarray, pcts: tuple[float, ...]) -> tuple:
    """(mean, median, std, [(p, P-p)]) of ``a``; NaN for no values."""
    if not len(a):
        return NAN, NAN, NAN, [(p, NAN) for p in pcts]
    qs = np.percentile(a, pcts) if pcts else ()
    return (float(a.mean()), float(np.median(a)), float(a.std()),
            [(p, float(v)) for p, v in zip(pcts, qs)])


def _check_args(duration_s: float, percentiles: Sequence[float],
                goodput: dict[str, float] | None) -> tuple[float, tuple[float, ...], dict]:
    dur = float(duration_s)
    if not (math.isfinite(dur) and dur > 0):
        raise ConfigError(f"benchmark duration {duration_s!r} s must be > 0")
    pcts = tuple(_check_q(p) for p in percentiles)
    slos = dict(goodput or {})
    for k in slos:
        if k not in GOODPUT_KEYS:
            raise ConfigError(f"goodput key {k!r} is not one of {', '.join(GOODPUT_KEYS)}")
    return dur, pcts, slos


def window_metrics(table: RequestTable, i: int, j: int, duration_s: float, *,
                   percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                   goodput: dict[str, float] | None = None,
                   steps: "StepArrays | None" = None) -> BenchMetrics:
    """:func:`summarize` of rows ``[i, j)`` of ``table`` (and optionally of ``steps``): numpy
    slicing, no pass over records — what the dashboard calls about once a second over a rolling
    window. Arguments and errors as :func:`summarize`'s."""
    dur, pcts, slos = _check_args(duration_s, percentiles, goodput)
    c = {k: v[i:j] for k, v in table.cols.items()}
    counted, timed = c["counted"], c["timed"]
    ttft, e2el, tp = c["ttft_ms"][timed], c["e2el_ms"][timed], c["tpot_ms"][timed]
    good = None
    if slos:
        # vllm: a one-token request has TPOT 0 for goodput
        req = {"ttft": ttft, "tpot": np.nan_to_num(tp, nan=0.0), "e2el": e2el}
        ok = np.ones(len(ttft), bool)
        for k, v in slos.items():
            ok &= req[k] <= v
        good = int(ok.sum()) / dur
    total_in, total_out = int(c["prompt_len"][counted].sum()), int(c["output_len"][counted].sum())
    completed = int(counted.sum())
    probe_e2el = c["e2el_ms"][c["probe_ok"]]
    m = BenchMetrics(
        duration_s=dur, completed=completed, failed=int(c["failed"].sum()),
        withdrawn=int((c["withdrawn"] & ~c["probe"]).sum()),
        total_input=total_in, total_output=total_out,
        request_throughput=completed / dur, output_throughput=total_out / dur,
        total_token_throughput=(total_in + total_out) / dur,
        request_goodput=good, goodput_slos_ms=slos, percentiles=pcts,
        **{f"{k}_{stem}_ms": v
           for stem, vals in (("ttft", ttft), ("tpot", tp[np.isfinite(tp)]),
                              ("itl", table.itls(i, j)), ("e2el", e2el))
           for k, v in zip(("mean", "median", "std", "percentiles"), _stats(vals, pcts))},
        probe_completed=len(probe_e2el),
        probe_failed=int((c["probe"] & ~c["withdrawn"]).sum()) - len(probe_e2el),
        median_probe_e2el_ms=_median(probe_e2el),
        p99_probe_e2el_ms=percentile(probe_e2el, 99),
        max_probe_e2el_ms=float(probe_e2el.max()) if len(probe_e2el) else NAN,
    )
    if steps is not None and len(steps.t_end_ns):
        _add_steps(m, steps)
    return m


#: the trace event that marks the load's start (``kind``, ``name``): its ``t_ns`` is arrival 0's
#: time (``EngineHost.t0_ns``), which ``gpuchef bench`` writes and ``gpuchef report`` counts
#: the benchmark duration from (docs/trace-format.md)
LOAD_START = ("load", "start")


def load_start_event(t0_ns: int) -> EngineEvent:
    """The trace event recording the load's start at ``t0_ns`` (monotonic ns), step -1."""
    return EngineEvent(LOAD_START[0], -1, int(t0_ns), LOAD_START[1],
                       message="the load's start: the benchmark duration counts from here")


def load_start_ns(events: Iterable[Any]) -> int | None:
    """The load's start (monotonic ns) from a trace's events (the first :data:`LOAD_START`
    event), or None when the trace has none (not a ``gpuchef bench`` trace, one written by a
    gpuchef that did not record the load's start yet, or one cut short before the bench
    ended)."""
    for e in events:
        if (getattr(e, "kind", None), getattr(e, "name", None)) == LOAD_START:
            return int(e.t_ns)
    return None


def benchmark_duration_s(t0_ns: int, requests: Iterable[RequestRecord],
                         end_ns: int | None = None) -> float:
    """``vllm bench serve``'s benchmark duration (s, > 0): from the load's start ``t0_ns``
    (arrival 0's due time; vLLM reads ``benchmark_start_time`` before its first request's
    delay, so the first inter-arrival gap counts) to the last token of ``requests``;
    ``end_ns`` (default: now) when none has a token. The one definition: ``gpuchef bench``'s
    results and ``gpuchef report``'s mode stretches."""
    import time

    ends = [r.token_times_ns[-1] for r in requests if r.token_times_ns]
    end = max(ends) if ends else (time.monotonic_ns() if end_ns is None else end_ns)
    return max(end - int(t0_ns), 1) / 1e9


def summarize(records: Sequence[RequestRecord], duration_s: float, *,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES,
              goodput: dict[str, float] | None = None,
              steps: Sequence[StepRecord] | None = None) -> BenchMetrics:
    """Compute a run's metrics from its finished requests and (optionally) its engine steps.

    ``duration_s``: the benchmark duration (s, > 0) that throughputs divide by.
    ``percentiles``: which P-x to report (each in [0, 100]). ``goodput``: SLOs in ms from
    ``parse_goodput`` (None or {} = no goodput). Definitions: see the module docstring (vllm
    bench serve's ``calculate_metrics``); computed by :class:`RequestTable` and
    :func:`window_metrics`, the dashboard's path. Raises ConfigError for ``duration_s`` <= 0, a
    percentile out of range, or an unknown goodput key.
    """
    _check_args(duration_s, percentiles, goodput)
    table = RequestTable.from_records(records)
    return window_metrics(table, 0, len(table), duration_s, percentiles=percentiles,
                          goodput=goodput,
                          steps=StepArrays.from_steps(steps) if steps else None)


def _itls_ms(token_times: list[tuple[int, ...]]) -> np.ndarray:
    """Every request's inter-token latencies (ms), concatenated in request order: float64 (n,).
    Equal to ``[x for t in token_times for x in RequestRecord.itls_ms]`` (one ITL per output
    chunk), in one numpy pass (a 60-s window at an H200's load holds ~190 k of them)."""
    return _itls_and_counts(token_times)[0]


@dataclass(frozen=True)
class StepArrays:
    """Engine steps as named numpy columns (each (n,), time order): ``t_start_ns``,
    ``t_end_ns`` (int64 monotonic ns), ``gpu_ms`` (float64 ms), ``prefill_tokens``,
    ``decode_tokens``, ``preempted`` (int64) — what the step figures of :class:`BenchMetrics`
    are computed from (:func:`window_metrics`). The dashboard passes slices of its own columns."""

    t_start_ns: np.ndarray
    t_end_ns: np.ndarray
    gpu_ms: np.ndarray
    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    preempted: np.ndarray

    @classmethod
    def from_steps(cls, steps: Sequence[StepRecord]) -> "StepArrays":
        n = len(steps)

        def col(f, dt=np.int64):
            return np.fromiter((f(s) for s in steps), dt, n)

        return cls(col(lambda s: s.t_start_ns), col(lambda s: s.t_end_ns),
                   col(lambda s: s.gpu_ms, np.float64), col(lambda s: s.num_prefill_tokens),
                   col(lambda s: s.num_decode_reqs), col(lambda s: s.num_preempted))


def _add_steps(m: BenchMetrics, s: StepArrays) -> None:
    n = len(s.t_end_ns)
    span_ns = int(s.t_end_ns.max() - s.t_start_ns.min())
    pre, dec = s.prefill_tokens, s.decode_tokens
    m.num_steps = n
    m.steps_span_s = span_ns / 1e9
    m.steps_per_s = n / m.steps_span_s if span_ns > 0 else NAN
    m.mean_step_ms = float(np.mean((s.t_end_ns - s.t_start_ns) / 1e6))
    m.mean_gpu_ms = float(np.mean(s.gpu_ms))
    m.mean_prefill_tokens_per_step = float(np.mean(pre))
    m.mean_decode_tokens_per_step = float(np.mean(dec))
    m.mean_tokens_per_step = float(np.mean(pre + dec))
    m.num_mixed_steps = int(((pre > 0) & (dec > 0)).sum())
    m.num_preemptions = int(s.preempted.sum())
    m.busy_fraction = float(s.gpu_ms.sum()) / (span_ns / 1e6) if span_ns > 0 else NAN


def format_value(v: Any) -> str:
    """One value of the results block as it prints it: an int or str as is, a float with 2
    decimals, None or NaN as "n/a"; left-aligned in 10 columns (vllm's ``{:<10}``)."""
    if isinstance(v, bool) or isinstance(v, str):
        return "{:<10}".format(str(v))
    if isinstance(v, (int, np.integer)):
        return "{:<10}".format(int(v))
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "{:<10}".format("n/a")
    return "{:<10.2f}".format(float(v))


#: the results block's section of gpuchef's engine-step rows
STEPS_SECTION = "Engine Steps (gpuchef)"


def results_block_rows(m: BenchMetrics, extra: dict[str, str] | None = None
                       ) -> list[tuple[str, str, Any]]:
    """The rows of :func:`format_results_block`, unformatted: ``(section, label, value)`` in
    its order, ``section`` "" for the rows under the title, else its header's text
    ("Time to First Token", "Engine Steps (gpuchef)", ...); ``value`` as measured (int, float,
    str, None). The report's table and its B − A read these, so its differences come from the
    figures, not from their 2-decimal cells. No "Engine Steps (gpuchef)" section when no steps
    were measured (``BenchMetrics.steps_measured``): its counts would read 0 for unknown."""
    rows: list[tuple[str, str, Any]] = []
    sec = ""

    def row(label: str, value: Any) -> None:
        rows.append((sec, label, value))

    row("Successful requests:", m.completed)
    row("Failed requests:", m.failed)
    if m.withdrawn:
        row("Withdrawn requests (not failed):", m.withdrawn)
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
        sec = head
        row(f"Mean {name} (ms):", getattr(m, f"mean_{stem}_ms"))
        row(f"Median {name} (ms):", getattr(m, f"median_{stem}_ms"))
        for p, v in getattr(m, f"percentiles_{stem}_ms"):
            row(f"P{percentile_label(p)} {name} (ms):", v)
    if m.probe_completed or m.probe_failed:
        sec = "Probe Requests"
        row("Probe requests completed:", m.probe_completed)
        row("Probe requests failed:", m.probe_failed)
        row("Median probe E2EL (ms):", m.median_probe_e2el_ms)
        row("P99 probe E2EL (ms):", m.p99_probe_e2el_ms)
        row("Max probe E2EL (ms):", m.max_probe_e2el_ms)
    if not m.steps_measured:
        return rows
    sec = STEPS_SECTION
    row("Engine steps:", m.num_steps)
    row("Steps per second:", m.steps_per_s)
    row("Mean step time (ms):", m.mean_step_ms)
    row("Mean prefill tokens per step:", m.mean_prefill_tokens_per_step)
    row("Mean decode tokens per step:", m.mean_decode_tokens_per_step)
    row("Mean tokens per step:", m.mean_tokens_per_step)
    row("Mixed prefill+decode steps:", m.num_mixed_steps)
    row("Preemptions:", m.num_preemptions)
    row("Compute busy fraction (%):", m.busy_fraction * 100.0)
    return rows


def format_results_block(m: BenchMetrics, title: str = "Serving Benchmark Result",
                         extra: dict[str, str] | None = None) -> str:
    """The results as text in ``vllm bench serve``'s layout (vllm/benchmarks/serve.py):
    the title centred in a line of 50 ``=``, rows ``"{:<40} {:<10}"``, one section of 50 ``-``
    per latency metric (Mean, Median, then P-x for each percentile), then gpuchef's
    "Engine Steps" section (when steps were measured), closed by 50 ``=``. ``extra`` rows (label -> value, e.g.
    {"Scheduler mode:": "chunked"}) go after "Failed requests:", where vllm prints the run's
    configured rate and concurrency. A value with no data prints as "n/a". No trailing newline.
    The rows are :func:`results_block_rows`'.
    """
    lines = ["{s:{c}^{n}}".format(s=f" {title} ", c="=", n=50)]
    sec = ""
    for section, label, value in results_block_rows(m, extra):
        if section != sec:
            sec = section
            lines.append("{s:{c}^{n}}".format(s=section, c="-", n=50))
        lines.append("{:<40} {}".format(label, format_value(value)).rstrip())
    lines.append("=" * 50)
    return "\n".join(lines)
