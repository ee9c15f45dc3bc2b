"""Scraping a server's Prometheus ``/metrics``: vLLM's, SGLang's and gpuchef's own names read
into one typed sample, and the rates between two samples.

One table (``SERIES``) maps each quantity gpuchef draws to the names servers use for it, first
match wins: vLLM V1 (``vllm:``; V0's ``gpu_cache_usage_perc`` too), SGLang (``sglang:`` and,
from SGLang 0.5.4, ``sglang_``), and gpuchef's ``gpuchef:`` step series (gpuchef serve exports
vLLM's names as well, so it reads as vLLM plus its extras). Text is parsed with
``prometheus_client.parser``; samples of every label set are summed (a TP group or several
engines behind one endpoint report one series each).

What a scrape can know is a per-interval view: counters and histograms become rates and
interval means between two scrapes (``ScrapeDelta``), never per-step figures. Surfaces that draw
these say so ("from /metrics, 250 ms buckets").
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from typing import Any, Callable

@dataclass(frozen=True)
class MetricName:
    """One Prometheus family as a server exports it: ``name`` (the family name
    ``prometheus_client`` parses back: a counter's without ``_total``), ``kind`` (gauge, counter,
    hist) and vLLM's ``help`` text."""

    name: str
    kind: str
    help: str


#: vLLM V1's metric families (vllm/v1/metrics/loggers.py, 0.24), the one table of their names:
#: `gpuchef serve` exports them (gpuchef/serve/metrics.py) and the scraper reads them (SERIES).
VLLM_METRICS: dict[str, MetricName] = {
    "running": MetricName("vllm:num_requests_running", "gauge",
                          "Number of requests in model execution batches."),
    "waiting": MetricName("vllm:num_requests_waiting", "gauge",
                          "Number of requests waiting to be processed."),
    "kv_usage": MetricName("vllm:kv_cache_usage_perc", "gauge",
                           "KV-cache usage. 1 means 100 percent usage."),
    "preemptions": MetricName("vllm:num_preemptions", "counter",
                              "Cumulative number of preemption from the engine."),
    "prompt_tokens": MetricName("vllm:prompt_tokens", "counter",
                                "Number of prefill tokens processed."),
    "generation_tokens": MetricName("vllm:generation_tokens", "counter",
                                    "Number of generation tokens processed."),
    "requests_finished": MetricName("vllm:request_success", "counter",
                                    "Count of successfully processed requests."),
    "request_prompt_tokens": MetricName("vllm:request_prompt_tokens", "hist",
                                        "Number of prefill tokens processed."),
    "request_generation_tokens": MetricName("vllm:request_generation_tokens", "hist",
                                            "Number of generation tokens processed."),
    "request_max_num_generation_tokens": MetricName(
        "vllm:request_max_num_generation_tokens", "hist",
        "Histogram of maximum number of requested generation tokens."),
    "request_params_n": MetricName("vllm:request_params_n", "hist",
                                   "Histogram of the n request parameter."),
    "request_params_max_tokens": MetricName("vllm:request_params_max_tokens", "hist",
                                            "Histogram of the max_tokens request parameter."),
    "ttft": MetricName("vllm:time_to_first_token_seconds", "hist",
                       "Histogram of time to first token in seconds."),
    "itl": MetricName("vllm:inter_token_latency_seconds", "hist",
                      "Histogram of inter-token latency in seconds."),
    "e2e": MetricName("vllm:e2e_request_latency_seconds", "hist",
                      "Histogram of e2e request latency in seconds."),
    "queue_time": MetricName("vllm:request_queue_time_seconds", "hist",
                             "Histogram of time spent in WAITING phase for request."),
    "prefill_time": MetricName("vllm:request_prefill_time_seconds", "hist",
                               "Histogram of time spent in PREFILL phase for request."),
    "decode_time": MetricName("vllm:request_decode_time_seconds", "hist",
                              "Histogram of time spent in DECODE phase for request."),
    "inference_time": MetricName("vllm:request_inference_time_seconds", "hist",
                                 "Histogram of time spent in RUNNING phase for request."),
    "request_tpot": MetricName("vllm:request_time_per_output_token_seconds", "hist",
                               "Histogram of time_per_output_token_seconds per request."),
    "iteration_tokens": MetricName("vllm:iteration_tokens_total", "hist",
                                   "Histogram of number of tokens per engine_step."),
}

#: gpuchef serve's own step series that the scraper reads back (exported by
#: gpuchef/serve/metrics.py under these names, by step kind).
GPUCHEF_METRICS: dict[str, MetricName] = {
    "step_duration": MetricName("gpuchef:step_duration_seconds", "hist",
                                "Engine step wall time (schedule + forward + sample), by step "
                                "kind."),
    "step_prefill_tokens": MetricName("gpuchef:step_prefill_tokens", "hist",
                                      "Prefill tokens per engine step, by step kind."),
    "step_decode_rows": MetricName("gpuchef:step_decode_rows", "hist",
                                   "Decode rows (= decode tokens) per engine step, by step kind."),
}


def _v(key: str) -> str:
    return VLLM_METRICS[key].name


#: quantity → (kind, names in order of preference). Kinds: gauge, counter, hist.
SERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": ("gauge", (_v("running"), "sglang:num_running_reqs", "sglang_num_running_reqs")),
    "waiting": ("gauge", (_v("waiting"), "sglang:num_queue_reqs", "sglang_num_queue_reqs")),
    # vLLM: 0–1 (V0: gpu_cache_usage_perc); SGLang's token_usage: 0–1 as well
    "kv_usage": ("gauge", (_v("kv_usage"), "vllm:gpu_cache_usage_perc",
                           "sglang:token_usage", "sglang_token_usage")),
    "preemptions": ("counter", (_v("preemptions"), "sglang:num_retracted_reqs",
                                "sglang_num_retracted_reqs")),
    "prompt_tokens": ("counter", (_v("prompt_tokens"), "sglang:prompt_tokens",
                                  "sglang_prompt_tokens")),
    "generation_tokens": ("counter", (_v("generation_tokens"), "sglang:generation_tokens",
                                      "sglang_generation_tokens")),
    "requests_finished": ("counter", (_v("requests_finished"), "sglang:num_requests",
                                      "sglang_num_requests")),
    "ttft": ("hist", (_v("ttft"), "sglang:time_to_first_token_seconds",
                      "sglang_time_to_first_token_seconds")),
    "itl": ("hist", (_v("itl"), "sglang:inter_token_latency_seconds",
                     "sglang_inter_token_latency_seconds",
                     # older servers have only the per-request mean
                     "vllm:time_per_output_token_seconds", "sglang:time_per_output_token_seconds",
                     "sglang_time_per_output_token_seconds")),
    "e2e": ("hist", (_v("e2e"), "sglang:e2e_request_latency_seconds",
                     "sglang_e2e_request_latency_seconds")),
    "queue_time": ("hist", (_v("queue_time"),)),
    "iteration_tokens": ("hist", (_v("iteration_tokens"),)),
    # gpuchef serve only
    **{k: (m.kind, (m.name,)) for k, m in GPUCHEF_METRICS.items()},
    "max_num_batched_tokens": ("gauge", ("gpuchef:max_num_batched_tokens",)),
}


@dataclass(frozen=True)
class Hist:
    """A histogram summed over label sets: cumulative ``buckets`` ((le, count), +Inf last),
    ``count`` and ``sum``."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float


@dataclass(frozen=True)
class ScrapeSample:
    """One scrape of ``url`` at ``t_ns`` (monotonic). ``server``: "vllm", "sglang", "gpuchef" or
    "unknown" (from the names seen). ``values``: gauges and counters by quantity (absent when
    the server has no such series); ``hists`` likewise. ``error``: "" or why this scrape failed
    (then nothing else is set)."""

    t_ns: int
    url: str
    server: str = "unknown"
    values: dict[str, float] = field(default_factory=dict)
    hists: dict[str, Hist] = field(default_factory=dict)
    error: str = ""
    scrape_ms: float = 0.0
    #: quantities whose family the server's /metrics declares, with or without samples (a
    #: labelled histogram with no observation yet has no sample lines): "absent" vs "idle"
    exported: frozenset[str] = frozenset()
    #: quantity → one line naming the series whose value was refused (``check_value``); the
    #: quantity is then left out of ``values``
    bad: dict[str, str] = field(default_factory=dict)


#: how far above 1 a KV-cache usage may read before it is refused (float sums over engines)
KV_USAGE_TOLERANCE = 1e-3


def check_value(quantity: str, name: str, v: float) -> str:
    """"" when ``v`` is a possible value of gauge/counter ``quantity`` (finite, ≥ 0; a KV-cache
    usage within [0, 1] give or take ``KV_USAGE_TOLERANCE``), else one line naming the series
    ``name``, the value and what is allowed."""
    hi = 1.0 + KV_USAGE_TOLERANCE if quantity == "kv_usage" else math.inf
    if math.isfinite(v) and 0.0 <= v <= hi:
        return ""
    allowed = "[0, 1]" if quantity == "kv_usage" else "finite, ≥ 0"
    return f"{name} = {v!r} is not a {quantity} value (allowed {allowed}): not drawn"


def parse_metrics(text: str, *, url: str = "", t_ns: int | None = None) -> ScrapeSample:
    """Read Prometheus text into a ScrapeSample. Raises ValueError (with the parser's message)
    when ``text`` is not the Prometheus text format. A gauge or counter may come untyped (no
    ``# TYPE`` line: ``prometheus_client`` reads it as "unknown", a counter under its
    ``_total`` name). A value :func:`check_value` refuses is left out of ``values`` and named in
    ``bad``."""
    from prometheus_client.parser import text_string_to_metric_families

    fams: dict[str, Any] = {}
    try:
        for fam in text_string_to_metric_families(text):
            if fam.name in fams:  # untyped lines of one name may come as several families
                fams[fam.name].samples.extend(fam.samples)
            else:
                fams[fam.name] = fam
    except Exception as e:  # the parser raises ValueError, TypeError or its own
        raise ValueError(f"not Prometheus text format: {e}") from None
    t = time.monotonic_ns() if t_ns is None else t_ns
    values: dict[str, float] = {}
    hists: dict[str, Hist] = {}
    exported: set[str] = set()
    bad: dict[str, str] = {}
    for q, (kind, names) in SERIES.items():
        for n in names:
            cands = [fams.get(n)]
            if kind == "counter":  # untyped: the parser keeps the whole name
                u = fams.get(n + "_total")
                cands.append(u if u is not None and u.type == "unknown" else None)
            cands = [c for c in cands if c is not None]
            if not cands:
                continue
            exported.add(q)
            if kind == "hist":
                h = _hist(cands[0])
                if h is not None:
                    hists[q] = h
                    break
                continue
            got = next((g for g in (_sum(c, ("_total", "") if kind == "counter" else ("",))
                                    for c in cands) if g is not None), None)
            if got is None:
                continue
            why = next((w for w in (check_value(q, sn, v) for sn, v in got[1]) if w), "")
            if why:
                bad[q] = why
            else:
                values[q] = got[0]
            break
    names = " ".join(fams)
    server = ("gpuchef" if "gpuchef:" in names else "vllm" if "vllm:" in names
              else "sglang" if "sglang" in names else "unknown")
    return ScrapeSample(t, url, server, values, hists, exported=frozenset(exported),
                        bad=bad)


def _sum(fam: Any, suffixes: tuple[str, ...]) -> tuple[float, list[tuple[str, float]]] | None:
    """(sum, [(sample name, value), ...]) of ``fam``'s samples named ``fam.name + suffix``;
    None when it has none (a labelled family with no child yet)."""
    got = [(s.name, float(s.value)) for s in fam.samples
           if any(s.name == fam.name + suf for suf in suffixes)]
    if not got:
        return None
    return sum(v for _, v in got), got


def _hist(fam: Any) -> Hist | None:
    buckets: dict[float, float] = {}
    count = total = 0.0
    seen = False
    for s in fam.samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels.get("le", "inf"))
            buckets[le] = buckets.get(le, 0.0) + s.value
            seen = True
        elif s.name.endswith("_count"):
            count += s.value
        elif s.name.endswith("_sum"):
            total += s.value
    if not seen:
        return None
    return Hist(tuple(sorted(buckets.items())), count, total)


@dataclass(frozen=True)
class HistQuantile:
    """A quantile read from a histogram's bucket counts, in the histogram's unit (seconds for
    the latency histograms). ``value``: Prometheus' ``histogram_quantile`` estimate, a linear
    interpolation inside the bucket — a guess that assumes the bucket's observations are spread
    evenly over it (an E2E p99 whose observations sit near 2.85 s, inside vLLM's (2.5, 5] s
    bucket, interpolates to 4.5 s). ``lower``, ``upper``: that bucket's bounds, what the
    counts do know: the ⌈q·n⌉-th smallest of the n observations (q > 0) lies in (lower,
    upper]. ``upper`` is inf when the quantile falls in the +Inf bucket (only ``lower``, the highest
    finite bound, is known; ``value`` is then ``lower``, as Prometheus returns). All three are
    NaN when the histogram holds no observation. Shown only through :func:`hist_quantile_text`."""

    value: float
    lower: float
    upper: float

    @property
    def empty(self) -> bool:
        return math.isnan(self.value)

    @property
    def open_ended(self) -> bool:
        """The quantile fell in the +Inf bucket: only its lower bound is known."""
        return math.isinf(self.upper)


NO_QUANTILE = HistQuantile(math.nan, math.nan, math.nan)


def bucket_quantile(buckets: tuple[tuple[float, float], ...], q: float) -> HistQuantile:
    """The ``q``-quantile (0–1) of a histogram given as per-bucket counts ``(le, count)`` (not
    cumulative; +Inf last): the bucket holding the rank ``q·n`` observation, and the value
    interpolated linearly inside it as Prometheus' ``histogram_quantile`` does (the lower edge
    of the first bucket is 0; in the +Inf bucket the value is the highest finite edge). See
    :class:`HistQuantile`; :data:`NO_QUANTILE` when the buckets hold nothing. Units: ``le``'s."""
    total = sum(c for _, c in buckets)
    if total <= 0 or not buckets:
        return NO_QUANTILE
    rank = q * total
    lo, cum = 0.0, 0.0
    for i, (le, c) in enumerate(buckets):
        if i == 0 and le <= 0:  # Prometheus: a first bucket bounded at or below 0 gives its bound
            lo = -math.inf
        if c > 0 and cum + c >= rank:
            if math.isinf(le):
                return HistQuantile(lo, lo, math.inf)
            if math.isinf(lo):
                return HistQuantile(le, lo, le)
            return HistQuantile(lo + (le - lo) * max(0.0, rank - cum) / c, lo, le)
        cum += c
        if not math.isinf(le):
            lo = le
    # q > 1, or a negative interval count (a bucket counter went down): the rank is past the
    # last bucket, so only a lower bound is known
    return HistQuantile(lo, lo, math.inf)


def _secs(x: float, unit: str) -> str:
    return f"{x * (1e3 if unit == 'ms' else 1.0):,g}"


def hist_quantile_text(h: HistQuantile) -> str:
    """How every surface shows a latency quantile (seconds) read from a /metrics histogram: the
    bucket it lies in, not the interpolated point (which can be anywhere in the bucket: "4.5 s"
    for a true 2.85 s in (2.5, 5] s). "2.5–5 s" (ms when the upper bound is under 1 s:
    "500–750 ms"), "> 80 s" in the +Inf bucket (only a lower bound), "–" when empty; at most 13
    characters for vLLM's latency buckets (the numbers panel's column is 16). The surface's
    heading or label says that these are /metrics histogram buckets."""
    if h.empty:
        return "–"
    if h.open_ended:
        unit = "s" if h.lower >= 1 else "ms"
        return f"> {_secs(h.lower, unit)} {unit}"
    unit = "s" if h.upper >= 1 else "ms"
    if math.isinf(h.lower):
        return f"≤ {_secs(h.upper, unit)} {unit}"
    return f"{_secs(h.lower, unit)}–{_secs(h.upper, unit)} {unit}"


def sample_to_json(s: ScrapeSample) -> dict[str, Any]:
    """A ScrapeSample as the trace's ``scrape`` record fields (docs/trace-format.md): histograms
    as ``{"buckets": [[le, count], ...], "count", "sum"}`` with cumulative counts as scraped
    (+Inf written as null)."""
    return {"t_ns": s.t_ns, "url": s.url, "server": s.server, "values": dict(s.values),
            "hists": {q: {"buckets": [[le if math.isfinite(le) else None, c] for le, c in h.buckets],
                          "count": h.count, "sum": h.sum} for q, h in s.hists.items()},
            "error": s.error, "scrape_ms": s.scrape_ms, "exported": sorted(s.exported),
            "bad": dict(s.bad)}


def sample_from_json(d: dict[str, Any]) -> ScrapeSample:
    """The inverse of :func:`sample_to_json`. Raises ValueError naming a field of the wrong
    type."""
    try:
        t = d["t_ns"]
        if not isinstance(t, int) or isinstance(t, bool):
            raise ValueError(f"scrape field t_ns={t!r} is not int")
        values = {str(k): float(v) for k, v in (d.get("values") or {}).items()
                  if v is not None}
        hists = {}
        for q, h in (d.get("hists") or {}).items():
            b = tuple((math.inf if le is None else float(le), float(c)) for le, c in h["buckets"])
            hists[str(q)] = Hist(b, float(h["count"]), float(h["sum"]))
        return ScrapeSample(t, str(d.get("url", "")), str(d.get("server", "unknown")), values,
                            hists, str(d.get("error") or ""), float(d.get("scrape_ms") or 0.0),
                            frozenset(str(x) for x in (d.get("exported") or ())),
                            {str(k): str(v) for k, v in (d.get("bad") or {}).items()})
    except KeyError as e:
        raise ValueError(f"scrape record lacks field {e}") from None
    except (TypeError, AttributeError):
        raise ValueError("scrape record: values/hists are not of the documented shape") from None


@dataclass(frozen=True)
class ScrapeDelta:
    """What happened between two scrapes of one server (``dt_s`` seconds): counter rates
    (per s), histogram interval counts and means, the latest gauges. A counter that went down
    (the server restarted) gives None, not a negative rate."""

    t_ns: int
    dt_s: float
    gauges: dict[str, float]
    rates: dict[str, float | None]
    hist_count: dict[str, float]
    hist_mean: dict[str, float | None]
    hist_buckets: dict[str, tuple[tuple[float, float], ...]]  # interval counts per bucket (not cumulative)


def delta(a: ScrapeSample, b: ScrapeSample) -> ScrapeDelta | None:
    """The interval from ``a`` to ``b`` (same server), None when either failed or no time passed."""
    if a.error or b.error or b.t_ns <= a.t_ns:
        return None
    dt = (b.t_ns - a.t_ns) / 1e9
    gauges = {q: v for q, v in b.values.items() if SERIES[q][0] == "gauge"}
    rates: dict[str, float | None] = {}
    for q, v in b.values.items():
        if SERIES[q][0] == "counter" and q in a.values:
            d = v - a.values[q]
            rates[q] = d / dt if d >= 0 else None
    hc: dict[str, float] = {}
    hm: dict[str, float | None] = {}
    hb: dict[str, tuple[tuple[float, float], ...]] = {}
    for q, h in b.hists.items():
        p = a.hists.get(q)
        if p is None:
            continue
        n = h.count - p.count
        if n < 0:
            continue
        hc[q] = n
        hm[q] = (h.sum - p.sum) / n if n > 0 else None
        prev = dict(p.buckets)
        cum = [(le, c - prev.get(le, 0.0)) for le, c in h.buckets]
        hb[q] = tuple((le, c - (cum[i - 1][1] if i else 0.0)) for i, (le, c) in enumerate(cum))
    return ScrapeDelta(b.t_ns, dt, gauges, rates, hc, hm, hb)


#: An interval in which requests ran but no token was counted saw no engine step end: a step
#: longer than the scrape interval (an overloaded server; the tiny CPU engine at 100 req/s ran
#: 0.38 s steps under 250 ms scrapes, and half its busy intervals read 0 tok/s, the others
#: twice the rate). :class:`DeltaStream` merges such an interval into the next, for at most this
#: long (s): a server that runs requests and counts nothing for longer reads 0, as it is.
NO_STEP_MERGE_MAX_S = 2.0


def no_step_ended(d: ScrapeDelta) -> bool:
    """Requests were running (the interval's newest ``running`` gauge > 0) and neither token
    counter moved (``prompt_tokens``, ``generation_tokens``): no engine step ended in the
    interval, whose rates are not the server's (a step adds tokens to one of them). False when
    the server exports neither counter or one went down (a restart)."""
    if not d.gauges.get("running"):
        return False
    moved = [d.rates[q] for q in ("prompt_tokens", "generation_tokens") if q in d.rates]
    return bool(moved) and all(r == 0 for r in moved)


class DeltaStream:
    """The intervals of one server's scrapes, fed in time order (:meth:`add`): between
    consecutive good scrapes (a failed one is skipped: the interval spans it), except that an
    interval in which no step ended while requests ran (:func:`no_step_ended`) is merged into
    the next, up to ``NO_STEP_MERGE_MAX_S`` — so each interval's rates are over whole steps."""

    def __init__(self) -> None:
        self._prev: ScrapeSample | None = None

    def add(self, s: ScrapeSample) -> ScrapeDelta | None:
        """The interval ``s`` closes, or None (a failed scrape, the first one, or one merged
        into the next)."""
        if s.error:
            return None
        prev = self._prev
        if prev is None:
            self._prev = s
            return None
        d = delta(prev, s)
        if d is None:
            return None
        if no_step_ended(d) and d.dt_s < NO_STEP_MERGE_MAX_S:
            return None  # the next interval starts where this one did
        self._prev = s
        return d


def deltas_of(samples: Any) -> list[ScrapeDelta]:
    """:class:`DeltaStream`'s intervals of ``samples`` (one server's, time order)."""
    st = DeltaStream()
    return [d for s in samples if (d := st.add(s)) is not None]


class SampleFeed:
    """What a server's samples come through, as the attach session reads it: ``url``, ``hz``,
    ``on_sample`` (called with each sample), ``latest``, ``status`` ("" or one line: the failure
    and that it keeps trying, or the refused values), ``n_ok``/``n_failed``. :meth:`deliver`
    does that bookkeeping for one sample; :class:`Scraper` and ``prometheus.ColumnScraper``
    feed it."""

    def __init__(self, url: str, hz: float,
                 on_sample: Callable[[ScrapeSample], None] | None = None) -> None:
        self.url = url
        self.hz = float(hz)
        self.on_sample = on_sample
        self.latest: ScrapeSample | None = None
        self.status = ""
        self.n_ok = 0
        self.n_failed = 0

    @property
    def retry_note(self) -> str:
        """What the status line of a failed scrape adds: the feed keeps trying."""
        return f"retrying every {1000.0 / self.hz:.4g} ms"

    def deliver(self, s: ScrapeSample) -> ScrapeSample:
        if s.error:
            self.n_failed += 1
            # the line says that the scraper goes on: a server that is not up yet is picked up
            self.status = f"{self.url}: {s.error}; {self.retry_note}"
        else:
            self.n_ok += 1
            self.status = f"{self.url}: {'; '.join(s.bad.values())}" if s.bad else ""
        self.latest = s
        if self.on_sample is not None:
            self.on_sample(s)
        return s


class Periodic:
    """Calls ``tick()`` every ``1 / hz`` s on a daemon thread named ``THREAD_NAME`` from
    ``start()`` (idempotent) until ``stop()``; a slow tick skips the slots it missed and keeps
    the grid. Subclasses set ``hz`` and call ``_periodic_init()``."""

    THREAD_NAME = "gpuchef-periodic"
    hz: float

    def _periodic_init(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        raise NotImplementedError

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        period = 1.0 / self.hz
        nxt = time.monotonic()
        while not self._stop.is_set():
            self.tick()
            nxt += period
            now = time.monotonic()
            if nxt < now:  # a slow tick: skip the missed slots, keep the grid
                nxt += math.ceil((now - nxt) / period) * period
            self._stop.wait(max(0.0, nxt - now))


class Scraper(SampleFeed, Periodic):
    """Scrapes ``url`` (its ``/metrics``) at ``hz`` on a daemon thread; each ScrapeSample goes
    to ``on_sample`` and the newest is ``latest``. A failed scrape (refused, timed out, HTTP
    error, not Prometheus text) is a sample with ``error`` set and one ``status`` line, which
    says the scraper keeps trying (:attr:`retry_note`); the first scrape that succeeds clears
    it. ``fetch(url, timeout)`` may be replaced (tests)."""

    THREAD_NAME = "gpuchef-scrape"

    def __init__(self, url: str, hz: float = 4.0, *,
                 on_sample: Callable[[ScrapeSample], None] | None = None,
                 timeout_s: float = 2.0, api_key: str | None = None,
                 fetch: Callable[[str, float], str] | None = None) -> None:
        if not (isinstance(hz, (int, float)) and 0.1 <= hz <= 50):
            raise ValueError(f"--scrape-hz {hz!r} is out of range: allowed [0.1, 50]")
        base = url.rstrip("/")
        super().__init__(base if base.endswith("/metrics") else base + "/metrics", hz,
                         on_sample)
        self.timeout_s = timeout_s
        self.api_key = api_key
        self._fetch = fetch or self._http_get
        self._periodic_init()

    def _http_get(self, url: str, timeout: float) -> str:
        req = urllib.request.Request(url, headers={"Accept": "text/plain"})
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read(32 << 20).decode("utf-8", "replace")

    def scrape_once(self) -> ScrapeSample:
        t0 = time.monotonic_ns()
        try:
            text = self._fetch(self.url, self.timeout_s)
            s = parse_metrics(text, url=self.url, t_ns=t0)
            if not s.values and not s.hists and not s.exported:
                s = ScrapeSample(t0, self.url, s.server, error="no vLLM, SGLang or gpuchef "
                                 "series in its /metrics (an unknown server?)")
        except urllib.error.HTTPError as e:
            s = ScrapeSample(t0, self.url, error=f"HTTP {e.code} {e.reason}" +
                             (" (no /metrics: start vLLM with its metrics on, SGLang with "
                              "--enable-metrics)" if e.code == 404 else ""))
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", e)
            s = ScrapeSample(t0, self.url, error=f"cannot reach it ({why})")
        except ValueError as e:
            s = ScrapeSample(t0, self.url, error=str(e))
        return self.deliver(replace(s, scrape_ms=(time.monotonic_ns() - t0) / 1e6))

    def tick(self) -> None:
        self.scrape_once()
