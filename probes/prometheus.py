"""A fleet through the Prometheus server that already scrapes it.

Operators who run vLLM, SGLang or gpuchef servers behind a Prometheus server need not point
gpuchef at each one: :class:`PrometheusFleet` asks the Prometheus HTTP API for the targets it
scrapes (``/api/v1/targets``) and for the newest value of every vLLM, SGLang and gpuchef
series (``/api/v1/query`` with an instant vector selector on the metric name), and hands back,
per target — per ``engine`` label too, so that a vLLM server's data-parallel ranks stay apart —
the same :class:`~gpuchef.probes.scrape.ScrapeSample` a direct scrape of its ``/metrics`` gives.
The series are written back as Prometheus text and read by ``scrape.parse_metrics``: one parser,
one table of names (``scrape.SERIES``), whichever way the numbers came.

Times: a sample's ``t_ns`` is the newest Prometheus timestamp among the target's series, moved
onto this process's monotonic clock, so that rates from two samples use the interval Prometheus
scraped over, not the interval gpuchef polled at; a target whose timestamp has not moved since
the last poll gives no new sample (Prometheus has not scraped it again).

Prometheus HTTP API: https://prometheus.io/docs/prometheus/latest/querying/api/ (``/api/v1/query``
instant vectors, ``/api/v1/targets`` active targets).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from gpuchef.probes.scrape import Periodic, SampleFeed, ScrapeSample, parse_metrics

#: the series asked for: every vLLM, SGLang (both spellings) and gpuchef metric
SERIES_SELECTOR = '{__name__=~"(vllm|sglang|gpuchef)[:_].+"}'
#: labels Prometheus adds or that name the target rather than the series
TARGET_LABELS = ("job", "instance")
#: the label that tells a vLLM server's engines (data-parallel ranks) apart
ENGINE_LABEL = "engine"


@dataclass(frozen=True)
class Target:
    """One active target of the Prometheus server: ``job``, ``instance`` (host:port),
    ``scrape_url``, ``health`` ("up", "down", "unknown") and ``last_error`` ("" when none)."""

    job: str
    instance: str
    scrape_url: str
    health: str
    last_error: str = ""


def column_key(instance: str, engine: str = "", scheme: str = "http") -> str:
    """The column a target's series go to, named as the server's base URL:
    ``"http://host:port"``, or ``"http://host:port#engine=1"`` when the instance's series name
    several engines (a fragment: requests to the URL, e.g. its knob endpoint, go to the
    server)."""
    base = f"{scheme}://{instance}"
    return f"{base}#engine={engine}" if engine else base


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def to_text(series: list[tuple[str, dict[str, str], float]]) -> str:
    """Prometheus text for ``series`` ((name, labels, value) of one target): a family with
    ``_bucket`` samples carrying ``le`` is declared a histogram (its ``_sum``/``_count`` with
    it); every other series goes untyped, which ``parse_metrics`` reads as a gauge, or as a
    counter under its ``_total`` name, as it reads an untyped exposition."""
    hist = {n[: -len("_bucket")] for n, lab, _ in series
            if n.endswith("_bucket") and "le" in lab}
    fams: dict[str, list[str]] = {}
    for n, lab, v in series:
        base = n
        for suf in ("_bucket", "_sum", "_count", "_created"):
            if n.endswith(suf) and n[: -len(suf)] in hist:
                base = n[: -len(suf)]
                break
        if base in hist and n.endswith("_created"):
            continue  # not part of the text format's histogram
        lab_s = ",".join(f'{k}="{_escape(x)}"' for k, x in sorted(lab.items()))
        fams.setdefault(base, []).append(f"{n}{{{lab_s}}} {v!r}" if lab_s else f"{n} {v!r}")
    out = []
    for base, lines in fams.items():
        if base in hist:
            out.append(f"# TYPE {base} histogram")
        out.extend(lines)
    return "\n".join(out) + "\n"


class PrometheusFleet:
    """The vLLM/SGLang/gpuchef targets a Prometheus server at ``url`` scrapes, sampled through
    its HTTP API. ``fetch(url, timeout) -> str`` may be replaced (tests). Errors: a failed
    request raises ``ConnectionError`` with one line naming the URL and why (refused, HTTP
    status, not the Prometheus API)."""

    def __init__(self, url: str, *, timeout_s: float = 5.0,
                 fetch: Callable[[str, float], str] | None = None) -> None:
        base = url.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"--prometheus {url!r} is not an http(s) URL "
                             "(e.g. http://127.0.0.1:9090)")
        self.url = base
        self.timeout_s = timeout_s
        self._fetch = fetch or _http_get
        self._last_ts: dict[str, float] = {}
        self._scheme: dict[str, str] = {}  # instance → its scrape URL's scheme (targets())

    def _api(self, path: str, **params: str) -> Any:
        q = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"{self.url}{path}{q}"
        try:
            body = json.loads(self._fetch(url, self.timeout_s))
        except urllib.error.HTTPError as e:
            raise ConnectionError(f"{url}: HTTP {e.code} {e.reason} (is it a Prometheus "
                                  "server?)") from None
        except (urllib.error.URLError, OSError) as e:
            raise ConnectionError(f"{url}: cannot reach it ({getattr(e, 'reason', e)})") from None
        except ValueError:
            raise ConnectionError(f"{url}: the reply is not JSON (is it a Prometheus "
                                  "server?)") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error", body) if isinstance(body, dict) else body
            raise ConnectionError(f"{url}: the Prometheus API says {why!r}")
        return body["data"]

    def targets(self) -> list[Target]:
        """The active targets (every job), in the order Prometheus lists them."""
        data = self._api("/api/v1/targets", state="active")
        out = []
        for t in data.get("activeTargets", []):
            lab = t.get("labels", {})
            out.append(Target(lab.get("job", ""), lab.get("instance", ""),
                              t.get("scrapeUrl", ""), t.get("health", "unknown"),
                              t.get("lastError", "")))
            if "://" in out[-1].scrape_url:
                self._scheme[out[-1].instance] = out[-1].scrape_url.split("://", 1)[0]
        return out

    def query(self) -> dict[str, tuple[float, list[tuple[str, dict[str, str], float]]]]:
        """The newest value of every selected series, by column (:func:`column_key`):
        (newest Prometheus timestamp in s, [(name, labels without job/instance, value)]).
        An instance whose series name one engine (or none) is one column; one whose series
        name several is a column per engine, each also holding the instance's series that
        name none (vLLM labels its engine series ``engine="0"``, not its process series)."""
        return _columns(self._api("/api/v1/query", query=SERIES_SELECTOR).get("result", []),
                        self._scheme)

    def history(self, start_s: float, end_s: float, step_s: float
                ) -> dict[str, list[ScrapeSample]]:
        """The selected series over ``[start_s, end_s]`` (Unix seconds) every ``step_s``
        (``/api/v1/query_range``), as a list of :class:`ScrapeSample` per column (one per
        step at which the column has series), in time order; ``t_ns`` is the step's Unix
        time in ns. Raises ValueError for an empty or reversed range or a step ≤ 0, and
        ConnectionError as :meth:`targets` does. Prometheus refuses a range of more than
        11,000 steps: the message says so."""
        if not (step_s > 0 and end_s > start_s):
            raise ValueError(f"range [{start_s}, {end_s}] every {step_s} s: allowed a start "
                             "before the end and a step > 0")
        data = self._api("/api/v1/query_range", query=SERIES_SELECTOR, start=repr(start_s),
                         end=repr(end_s), step=repr(step_s))
        at: dict[float, list[dict]] = {}
        for r in data.get("result", []):
            for ts, v in r.get("values", []):
                at.setdefault(float(ts), []).append({"metric": r.get("metric", {}),
                                                     "value": [ts, v]})
        out: dict[str, list[ScrapeSample]] = {}
        for ts in sorted(at):
            for key, (_, rows) in _columns(at[ts], self._scheme).items():
                out.setdefault(key, []).append(
                    parse_metrics(to_text(rows), url=key, t_ns=int(ts * 1e9)))
        return out

    def sample(self, *, only_new: bool = True) -> dict[str, ScrapeSample]:
        """One :class:`ScrapeSample` per column whose series Prometheus has scraped since the
        last call (every column with ``only_new`` False); ``url`` is the column's key."""
        now_wall, now_mono = time.time(), time.monotonic_ns()
        out = {}
        for key, (ts, rows) in self.query().items():
            if only_new and self._last_ts.get(key) == ts:
                continue
            self._last_ts[key] = ts
            t_ns = now_mono - int(max(0.0, now_wall - ts) * 1e9)
            out[key] = parse_metrics(to_text(rows), url=key, t_ns=t_ns)
        return out


def _columns(result: list[dict], schemes: dict[str, str]
             ) -> dict[str, tuple[float, list[tuple[str, dict[str, str], float]]]]:
    """An instant vector (the API's ``result``) by column: see :meth:`PrometheusFleet.query`."""
    by_inst: dict[str, list[tuple[str, dict[str, str], float, float]]] = {}
    for r in result:
        m = dict(r.get("metric", {}))
        name = m.pop("__name__", "")
        inst = m.pop("instance", "")
        m.pop("job", None)
        ts, v = r["value"]
        by_inst.setdefault(inst, []).append((name, m, float(v), float(ts)))
    cols: dict[str, tuple[float, list]] = {}
    for inst, rows in by_inst.items():
        engines = sorted({m[ENGINE_LABEL] for _, m, _, _ in rows if ENGINE_LABEL in m})
        for e in (engines if len(engines) > 1 else [""]):
            mine = [(n, m, v, t) for n, m, v, t in rows if not e or m.get(ENGINE_LABEL, e) == e]
            cols[column_key(inst, e, schemes.get(inst, "http"))] = (max(t for *_, t in mine),
                                         [(n, m, v) for n, m, v, _ in mine])
    return cols


def _http_get(url: str, timeout: float) -> str:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read(64 << 20).decode("utf-8", "replace")


#: how often the poller asks for the targets' health (s): a target Prometheus finds down has no
#: fresh series, and its column's status says why
TARGETS_EVERY_S = 5.0


class FleetPoller(Periodic):
    """Polls a :class:`PrometheusFleet` at ``hz`` on one daemon thread and hands each column's
    new samples to its :class:`ColumnScraper` (``column(key)``): the ``Scraper`` interface the
    attach session's servers use, one Prometheus query for all of them. A failed query is a
    sample with ``error`` set for every column, and each column's ``status`` says the poller
    keeps trying; a target Prometheus reports down puts its ``lastError`` in its column's
    ``status``. Raises ValueError for ``hz`` outside [0.1, 50]."""

    def __init__(self, fleet: PrometheusFleet, hz: float = 1.0) -> None:
        if not (isinstance(hz, (int, float)) and 0.1 <= hz <= 50):
            raise ValueError(f"--scrape-hz {hz!r} is out of range: allowed [0.1, 50]")
        self.fleet = fleet
        self.hz = float(hz)
        self.columns: dict[str, ColumnScraper] = {}
        #: the columns the caller watches (set by it; ``column`` makes any)
        self.keys: set[str] = set()
        self._targets_at = 0.0
        self._periodic_init()

    def column(self, key: str) -> "ColumnScraper":
        if key not in self.columns:
            self.columns[key] = ColumnScraper(self, key)
        return self.columns[key]

    def poll_once(self) -> None:
        t0 = time.monotonic_ns()
        try:
            got = self.fleet.sample()
            why = ""
        except ConnectionError as e:
            got, why = {}, str(e)
        for key, col in self.columns.items():
            if why:
                col.deliver(ScrapeSample(t0, key, error=why))
            elif key in got:
                col.deliver(got[key])
        if not why and time.monotonic() - self._targets_at >= TARGETS_EVERY_S:
            self._targets_at = time.monotonic()
            self._health()

    def _health(self) -> None:
        try:
            targets = self.fleet.targets()
        except ConnectionError:
            return
        down = {t.instance: t for t in targets if t.health == "down"}
        for key, col in self.columns.items():
            t = down.get(key.split("://", 1)[-1].split("#", 1)[0])
            col.down = (f"{key}: Prometheus finds it down ({t.last_error or 'no reason given'})"
                        if t is not None else "")

    THREAD_NAME = "gpuchef-prometheus"

    def tick(self) -> None:
        self.poll_once()


class ColumnScraper(SampleFeed):
    """One column of a :class:`FleetPoller`, with ``scrape.Scraper``'s interface
    (``scrape.SampleFeed``; ``url`` is the column's key): the first ``start`` starts the
    poller, the last ``stop`` stops it; ``status`` adds why Prometheus finds the target down."""

    def __init__(self, poller: FleetPoller, key: str) -> None:
        super().__init__(key, poller.hz)
        self.poller = poller
        self.down = ""
        self._running = False

    @property
    def status(self) -> str:
        return self._status or self.down

    @status.setter
    def status(self, v: str) -> None:
        self._status = v

    def start(self) -> "ColumnScraper":
        self._running = True
        self.poller.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._running = False
        if not any(c._running for c in self.poller.columns.values()):
            self.poller.stop(timeout)
