"""`gpuchef top --attach URL`: the dashboard's session on servers gpuchef does not host.

Composition root of an attached session, behind ``tui.session.AttachedSession``: one
:class:`AttachedServer` per URL (a ``probes.scrape.Scraper`` of its ``/metrics`` and the
intervals between scrapes), the NVML sampler when ``--gpus`` is given (the server on this host),
the HTTP load of `bench --base-url` when asked (:class:`HttpLoadControl`: its requests go to the
timeline as the client saw them), the server's knobs through gpuchef's knob endpoint
(``GET``/``PATCH /gpuchef/v1/scheduler``) when it has one, and the session trace (scrapes as
``scrape`` records, ``source`` in the meta).

Threads: one scraper per server, the load's event loop, the NVML sampler, the trace writer. The
UI thread reads snapshots (``samples()``/``deltas()``, the timeline) and calls ``set_knob``,
which is one PATCH with a short timeout.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, Callable, Sequence

from ..engine_host.vocab.config import AUTO_BUDGET, KNOBS, SchedulerConfig, not_a_knob, parse_value
from ..engine_host.vocab.errors import ConfigError
from .attach_plugin import LivePlugin
from .export import TraceOwner, backfill, record_to, rotate
from ..client.knobs import KNOB_TIMEOUT_S, KnobEndpoint
from ..experiments.http import AttachAB
from ..probes.metrics import DEFAULT_PERCENTILES
from ..probes.nvml import NvmlSampler
from ..probes.recorder import TraceRecorder
from ..probes.scrape import DeltaStream, ScrapeDelta, ScrapeSample, Scraper
from ..probes.timeline import Timeline
from ..tui.session import ABState, LoadState, SessionInfo

#: scrapes kept per server (10 min at 4 Hz, twice over): what the charts and a late `e` can see
KEEP_SCRAPES = 4800
#: how often the knob state is read again from a server that has the endpoint (s)
KNOB_REFRESH_S = 2.0


def base_of(url: str) -> str:
    """``http://h:p/metrics`` or ``http://h:p/`` → ``http://h:p`` (the URL as the user gave it,
    without a trailing /metrics). Raises ConfigError for a URL that is not http(s)://host, or
    one with a ``user:password@`` part (refused, not sent: it would show in the header and the
    trace; the message shows it as ``***@``)."""
    from urllib.parse import urlsplit

    from ..client.http_load import normalize_base_url

    u = url.strip().rstrip("/")
    try:
        net = urlsplit(u).netloc
    except ValueError:
        net = ""
    if "@" in net:
        shown = u.replace(net, "***@" + net.rsplit("@", 1)[1], 1)
        raise ConfigError(f"--attach {shown!r}: a user:password in the URL is not supported "
                          "(it would show in the header and the trace): give the server's "
                          "token with --api-key (sent as a Bearer token)")
    if u.endswith("/metrics"):
        u = u[: -len("/metrics")]
    try:
        return normalize_base_url(u)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--base-url", "--attach")) from None


def _ask_models(url: str, api_key: str | None) -> Any:
    """``client.http_load.fetch_server_info`` of ``url`` within KNOB_TIMEOUT_S, never raising
    (an unreachable server is its ServerInfo's note; the scrapes say so too)."""
    from ..client.http_load import HttpLoadConfig, fetch_server_info

    return fetch_server_info(HttpLoadConfig(base_url=url, api_key=api_key),
                             timeout_s=KNOB_TIMEOUT_S, strict=False)


class AttachedServer:
    """One attached server: its scraper and what it saw (``tui.session.ScrapedServer``).

    ``url``: the base URL; ``hz``: scrapes/s; ``api_key``: Bearer token for /metrics and the
    knob endpoint. ``on_sample(sample)`` is called with each scrape after it is kept (the
    session's trace). ``fetch``: replaces the HTTP GET (tests). ``scraper``: where the samples
    come from instead of a ``Scraper`` of ``url`` (a column of a Prometheus server's fleet,
    ``probes.prometheus.ColumnScraper``: ``url`` is then its key).
    """

    def __init__(self, url: str, hz: float, *, api_key: str | None = None,
                 on_sample: Callable[[ScrapeSample], None] | None = None,
                 fetch: Callable[[str, float], str] | None = None,
                 scraper: Any = None) -> None:
        self.url = base_of(url) if scraper is None else scraper.url
        self.api_key = api_key
        self._samples: deque[ScrapeSample] = deque(maxlen=KEEP_SCRAPES)
        self._deltas: deque[ScrapeDelta] = deque(maxlen=KEEP_SCRAPES)
        self._stream = DeltaStream()
        self._kind = "unknown"
        self._forward = on_sample
        if scraper is None:
            scraper = Scraper(self.url, hz, on_sample=self._on_sample, api_key=api_key,
                              fetch=fetch)
        else:
            scraper.on_sample = self._on_sample
        self.scraper = scraper
        self.hz = self.scraper.hz
        #: gpuchef's knob endpoint of the server (its state is ``knobs``/``knobs_reason``)
        self.endpoint = KnobEndpoint(self.url, api_key)
        #: called (scrape thread) with this server at its first scrape that succeeds — at start,
        #: or when a server that did not answer comes up: the session asks what it missed
        self.on_up: Callable[["AttachedServer"], None] | None = None
        self._up = False

    # -- ScrapedServer ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self._kind

    @property
    def status(self) -> str:
        return self.scraper.status

    def samples(self) -> Sequence[ScrapeSample]:
        return tuple(self._samples)

    def deltas(self) -> Sequence[ScrapeDelta]:
        return tuple(self._deltas)

    # -- the scrape thread -----------------------------------------------------------------------
    def _on_sample(self, s: ScrapeSample) -> None:
        self._samples.append(s)
        if not s.error:
            self._kind = s.server
            d = self._stream.add(s)  # an interval in which no step ended joins the next
            if d is not None:
                self._deltas.append(d)
        if self.knobs is not None and time.monotonic() - self.endpoint.read_at >= KNOB_REFRESH_S:
            self.read_knobs()  # another client may have PATCHed them
        elif self.endpoint.unreached and not s.error:
            self.read_knobs()  # it did not answer at start and answers now
        if not s.error and not self._up:
            self._up = True
            if self.on_up is not None:
                self.on_up(self)
        if self._forward is not None:
            self._forward(s)

    # -- knobs (client.knobs.KnobEndpoint) -------------------------------------------------------
    @property
    def knobs(self) -> SchedulerConfig | None:
        """The knob state, refreshed from the scrape thread (None: no knob endpoint)."""
        return self.endpoint.knobs

    @property
    def knobs_reason(self) -> str:
        return self.endpoint.reason

    def read_knobs(self) -> SchedulerConfig | None:
        """GET the knob endpoint: sets ``knobs`` (None when the server has none) and
        ``knobs_reason`` ("" when live, else why not). Never raises."""
        return self.endpoint.read()

    def patch_knobs(self, changes: dict[str, Any]) -> dict[str, Any]:
        """PATCH the knob endpoint with ``changes``; returns what the server accepted. Raises
        ConfigError with the server's message (a refused value) or naming what failed."""
        return self.endpoint.patch(changes)

    def start(self) -> None:
        self.read_knobs()
        self.scraper.start()

    def stop(self) -> None:
        self.scraper.stop()


#: The refusal of ``P`` on attached servers: their engines are not gpuchef's.
NO_ENGINE_PAUSE = ("the attached server's engine is not gpuchef's: it cannot be paused from "
                   "here")


class FixedLoad:
    """A load whose rate and pause gpuchef cannot change here: each refuses with ``REASON``."""

    REASON = ""

    def set_rate(self, value: Any) -> float:
        raise ConfigError(self.REASON)

    def pause(self) -> None:
        raise ConfigError(self.REASON)

    def resume(self) -> None:
        raise ConfigError(self.REASON)


class NoLoad(FixedLoad):
    """``LoadControl`` when gpuchef sends no load at start: the server's own clients drive it
    (``name``: what the header says instead, e.g. that the load is kept for the A/B)."""

    REASON = ("the load is not gpuchef's: give --dataset or --request-rate to send one "
              "(restart top)")

    def __init__(self, name: str = "none from gpuchef (the server's own clients)") -> None:
        self.name = name

    def state(self) -> LoadState:
        return LoadState("none", self.name, 0.0)


class HttpLoadControl(FixedLoad):
    """The load of `bench --base-url` (a ``client.bench_http.PreparedLoad``) sent on its own
    event loop thread; ``on_record(RequestRecord)`` for each request as the client saw it
    (``client.http_load.to_request_records``). The arrivals are fixed when it starts (absolute
    times), so the rate and pause are refused with the reason."""

    REASON = ("the attached load's arrivals are fixed when it starts (absolute times): "
              "restart top with another --request-rate / --trace-speed")

    def __init__(self, prepared: Any, on_record: Callable[[Any], None]) -> None:
        self.p = prepared
        self.on_record = on_record
        self.submitted = 0
        self.finished = 0
        self.done = False
        self.error = ""
        self.failed: list[Any] = []  # ClientResults that failed (the status line names them)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        w = prepared.wcfg
        self._kind = "random" if w.is_random else "trace"
        self._rate = float(w.request_rate) if w.is_random else float(w.trace_speed)

    def state(self) -> LoadState:
        return LoadState(self._kind, self.p.wcfg.dataset, self._rate, submitted=self.finished,
                         done=self.done)

    def _on_result(self, r: Any) -> None:
        from ..client.http_load import to_request_records

        self.finished += 1
        if not r.success:
            self.failed.append(r)
        self.on_record(to_request_records([r])[0])

    @property
    def failure_line(self) -> str:
        """"" or one line: how many requests failed, by kind, the first message of each
        (``client.http_load.error_lines``)."""
        if not self.failed:
            return ""
        from ..client.http_load import error_lines

        return "load: " + "; ".join(error_lines(list(self.failed)))

    def start(self) -> None:
        from ..client.http_load import run_http_load_async

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._task = loop.create_task(run_http_load_async(
                    self.p.specs, self.p.cfg, self.p.body, ramp=self.p.ramp,
                    on_result=self._on_result))
                loop.run_until_complete(self._task)
            except asyncio.CancelledError:
                pass
            except Exception as e:  # never a traceback in the dashboard: one line
                self.error = f"the load stopped: {type(e).__name__}: {e}"
            finally:
                self.done = True
                rest = asyncio.all_tasks(loop)  # requests in flight at close: cancelled
                for t in rest:
                    t.cancel()
                if rest:
                    async def drain() -> None:
                        await asyncio.gather(*rest, return_exceptions=True)
                    loop.run_until_complete(drain())
                loop.close()

        self._thread = threading.Thread(target=run, name="gpuchef-attach-load", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not self.done:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if self._thread is not None:
            self._thread.join(timeout)


class NoAB:
    """``ABControl`` of an attached session that cannot A/B: ``reason`` says why (one server,
    or no load of gpuchef's to send)."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason or ("an A/B of attached servers needs two --attach URLs and "
                                 "gpuchef's load (--dataset or --request-rate)")

    def state(self) -> ABState:
        return ABState()

    def start(self, a: dict[str, Any], b: dict[str, Any], window_s: float,
              rounds: int | None = None) -> ABState:
        raise ConfigError(self.reason)

    def stop(self) -> None:
        pass


class AttachSession(TraceOwner):
    """`top --attach`'s session (``tui.session.AttachedSession``).

    ``urls``: the servers (base URLs or their /metrics). ``scrape_hz``: scrapes/s each.
    ``gpus``/``sample_hz``: local GPUs to sample (None: none; ``nvml``: a stand-in module for
    tests). ``load``: a ``client.bench_http.PreparedLoad`` to send to the first server, or None.
    ``trace_path``: write the trace from the start. ``fetch``: replaces the scrapers' HTTP GET
    (tests). ``ab_loads``: each side's PreparedLoad for an A/B of the first two servers
    (``experiments.http.prepare_loads``; None: no A/B, ``a`` says why), ``ab_load`` "mirrored" or
    "sequential", ``ab_repetitions`` its repetitions; ``load_for_ab``: ``load`` is not sent at
    start, only by the A/B; ``ab_why``: why there is no A/B (the second server did not answer
    when the load was prepared). Attribute ``server_info``: each server's ``GET /v1/models``
    (``client.http_load.ServerInfo`` by URL: the load's answer, else asked at start), in the
    trace meta as ``server_models``. ``prometheus``: a ``probes.prometheus.FleetPoller`` whose
    columns ``urls`` name (the servers are read through the Prometheus server that scrapes
    them, not scraped here). ``plugins``: per URL of ``urls`` (in order; fewer: none for the
    rest), the endpoint of gpuchef's vLLM plugin in that server (``tcp://HOST:PORT``,
    ``attach_plugin.parse_plugin``) or "": read into ``plugin`` (``attach_plugin.LivePlugin``),
    its records written to the trace. Raises ConfigError for a bad URL or rate.
    """

    def __init__(self, urls: Sequence[str], *, scrape_hz: float = 4.0,
                 gpus: list[int] | None = None, sample_hz: float = 10.0, nvml: Any = None,
                 load: Any = None, api_key: str | None = None, trace_path: str | None = None,
                 slos: dict[str, float] | None = None,
                 percentiles: tuple[float, ...] = DEFAULT_PERCENTILES,
                 stats_window_s: float = 30.0, note: str = "",
                 fetch: Callable[[str, float], str] | None = None,
                 ab_loads: dict[str, Any] | None = None, ab_load: str = "mirrored",
                 ab_repetitions: int = 2, load_for_ab: bool = False,
                 ab_why: str = "", prometheus: Any = None, plugins: Sequence[str] = ()) -> None:
        if not urls:
            raise ConfigError("--attach needs a URL (the server's base URL, e.g. "
                              "http://127.0.0.1:8000)")
        self.clock = time.monotonic_ns
        self._prometheus = prometheus.fleet.url if prometheus is not None else ""
        self.slos = dict(slos or {})
        self.percentiles = tuple(percentiles)
        self.stats_window_s = float(stats_window_s)
        self.timeline = Timeline(percentiles=self.percentiles)
        self.start_ns = self.timeline.origin_ns
        self._recorder: TraceRecorder | None = None
        self._pending: list[Any] | None = None  # records seen while export_trace opens one
        self._lock = threading.Lock()
        try:
            self.servers: tuple[AttachedServer, ...] = tuple(
                AttachedServer(u, scrape_hz, api_key=api_key, on_sample=self._record, fetch=fetch,
                               scraper=(prometheus.column(u) if prometheus is not None
                                        and u in prometheus.keys else None))
                for u in urls)
        except ValueError as e:  # the Scraper's range check
            raise ConfigError(str(e)) from None
        seen = [s.url for s in self.servers]
        dup = sorted({u for u in seen if seen.count(u) > 1})
        if dup:
            raise ConfigError(f"--attach {dup[0]} is given twice: each server once")
        self.scrape_hz = self.servers[0].hz
        self.plugin = LivePlugin({s.url: ep for s, ep in zip(self.servers, plugins) if ep},
                                 on_record=self._record)
        if load is not None and load_for_ab and ab_loads is not None:
            self.load: Any = NoLoad(f"{load.desc}: kept for the A/B ({ab_load}; a starts it)")
        elif load is not None:
            self.load = HttpLoadControl(load, self._add_request)
        else:
            self.load = NoLoad()
        self.ab: Any = self._make_ab(ab_loads, ab_load, ab_repetitions, ab_why)
        # each server's GET /v1/models, once: the load's answer where it asked, else asked now
        # (a short limit; never raises: what went wrong is the answer's note)
        told = {pl.cfg.base_url: pl.info for pl in (load, *(ab_loads or {}).values())
                if pl is not None and getattr(pl, "info", None) is not None}
        self.server_info = {s.url: told.get(s.url) or _ask_models(s.url, api_key)
                            for s in self.servers}
        first = self.server_info[self.servers[0].url]
        self._api_key = api_key
        self._model_given = load is not None
        for srv in self.servers:
            srv.on_up = self._server_up
        model = load.cfg.model if load is not None else (first.models[:1] or [""])[0]
        self.info = SessionInfo(
            model=model or "(server's model)", random_weights=False,
            device="remote", attention="(server's)", note=note,
            gpus=tuple(str(g) for g in gpus) if gpus else (),
            source=",".join(seen), per_step_records=False)
        self.nvml = NvmlSampler(gpus, sample_hz, nvml=nvml, on_sample=self._gpu_sample,
                                on_event=self._event) if gpus else None
        self._meta_extra = self._meta_of(load, sample_hz if gpus else 0, ab_load, ab_repetitions)
        if trace_path:
            self._recorder = TraceRecorder(trace_path, meta=self._meta())
        self._closed = False
        self._started = False
        self.closers: list[Callable[[], None]] = []

    def _make_ab(self, ab_loads: dict[str, Any] | None, ab_load: str, repetitions: int,
                 why: str) -> Any:
        """The A/B of the first two servers (``experiments.http.AttachAB``), or why there is
        none (``NoAB``)."""
        if ab_loads is not None and len(self.servers) >= 2:
            return AttachAB([s.url for s in self.servers[:2]], ab_loads, ab_load, repetitions,
                            self._event, self._add_request, busy=self._ab_busy)
        if why:
            return NoAB(why)
        if len(self.servers) < 2:
            return NoAB("an A/B of attached servers compares two: give --attach twice "
                        "(the first two are A and B)")
        return NoAB("an A/B of the attached servers sends them gpuchef's load: give "
                    "--dataset or --request-rate (restart top)")

    def _meta_of(self, load: Any, sample_hz: float, ab_load: str,
                 ab_repetitions: int) -> dict[str, Any]:
        """What the trace meta holds beyond :meth:`_meta`'s: rates, the servers' models, the
        load and its phases, the A/B as `gpuchef ab --a url=U1 --b url=U2` writes it."""
        from ..client.http_load import server_models_meta
        from .headless import phases_meta

        extra: dict[str, Any] = {"sample_hz": sample_hz, "scrape_hz": self.scrape_hz,
                                 "server_models": server_models_meta(self.server_info)}
        if load is not None:
            extra["load"] = {"desc": load.desc, "endpoint": load.cfg.endpoint,
                             "model": load.cfg.model, "num_requests": len(load.specs)}
            if (ph := phases_meta(load.wcfg)) is not None:
                extra["phases"] = ph
        if isinstance(self.ab, AttachAB):  # as `gpuchef ab --a url=U1 --b url=U2` writes it
            extra["ab"] = {
                "interleave": False, "load": ab_load, "repetitions": ab_repetitions,
                "settings": {k: {"spec": "", "url": a.url,
                                 "describe": f"{a.url}: the server's own settings"}
                             for k, a in self.ab.arms.items()}}
        return extra

    def _ab_busy(self) -> str:
        ld = self.load
        if isinstance(ld, HttpLoadControl) and not ld.done:
            return (f"gpuchef's load is still being sent to {self.servers[0].url} "
                    f"({ld.finished} of {len(ld.p.specs)} finished): the A/B sends the same "
                    "load to both servers once it ends (restart top with --ab-load "
                    "mirrored|sequential to keep the load for the A/B)")
        return ""

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "command": "top",
            "model": {"name": self.info.model, "random_weights": None,
                      "source": self.servers[0].url},
            "device": "remote",
            # each scrape record names its server's kind (vllm / sglang / gpuchef)
            "source": {"kind": "attached", "urls": [s.url for s in self.servers],
                       **({"prometheus": self._prometheus} if self._prometheus else {}),
                       **({"plugin": self.plugin.endpoints} if self.plugin.endpoints else {})},
            "slos_ms": self.slos, "percentiles": list(self.percentiles),
            **self._meta_extra}
        if self.nvml is not None and self.nvml.gpu_names:
            meta["gpus"] = {str(k): v for k, v in self.nvml.gpu_names.items()}
        return meta

    # -- record sinks (any thread) ---------------------------------------------------------------
    def _record(self, rec: Any) -> None:
        record_to(self, rec)  # a trace being opened (export_trace) keeps it for later

    def _add_request(self, rec: Any) -> None:
        self.timeline.add_request(rec)
        self._record(rec)

    def _server_up(self, srv: AttachedServer) -> None:
        """A server's first scrape that succeeded (scrape thread): one that did not answer
        ``GET /v1/models`` at start (nothing listened) is asked again, and the header's model is
        its first when gpuchef sends no load (whose --model names it)."""
        from dataclasses import replace

        from ..client.http_load import server_models_meta

        old = self.server_info.get(srv.url)
        if old is not None and not old.fatal:
            return
        info = _ask_models(srv.url, self._api_key)
        if info.fatal:
            return
        self.server_info = {**self.server_info, srv.url: info}
        self._meta_extra["server_models"] = server_models_meta(self.server_info)
        if srv is self.servers[0] and not self._model_given and info.models:
            self.info = replace(self.info, model=info.models[0])

    def _gpu_sample(self, s: Any) -> None:
        self.timeline.add_gpu_sample(s)
        self._record(s)

    def _event(self, e: Any) -> None:
        self.timeline.add_event(e)
        self._record(e)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "AttachSession":
        """Start the scrapers (each reads the knob endpoint first), the NVML sampler and the
        load. Idempotent."""
        if self._started:
            return self
        self._started = True
        if self.nvml is not None:
            self.nvml.start()
        for s in self.servers:
            s.start()
        self.plugin.start()
        if isinstance(self.load, HttpLoadControl):
            self.load.start()
        return self

    def close(self) -> None:
        """Stop the load (requests in flight are cancelled), the scrapers and the sampler; the
        trace gets its end record. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for f in self.closers:
            f()
        if isinstance(self.ab, AttachAB):
            self.ab.stop()
        if isinstance(self.load, HttpLoadControl):
            self.load.stop()
        for s in self.servers:
            s.stop()
        self.plugin.close()
        if self.nvml is not None:
            self.nvml.stop()
        r = self._recorder
        if r is not None:
            r.close()

    # -- state read by the UI --------------------------------------------------------------------
    @property
    def knobs_reason(self) -> str:
        """"" when the knobs are live (the first server answers gpuchef's knob endpoint)."""
        s = self.servers[0]
        if s.knobs is not None:
            return ""
        return f"read-only: {s.knobs_reason}"

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self.servers[0].knobs or SchedulerConfig()

    @property
    def gpu_status(self) -> str:
        if self.nvml is None:
            return ("no --gpus: the server's GPUs are not sampled (give --gpus when it runs on "
                    "this host)")
        return self.nvml.status

    @property
    def gpu_available(self) -> bool:
        return self.nvml is not None and self.nvml.available

    @property
    def engine_error(self) -> str | None:
        return None  # the server's own failures show as scrape status lines

    #: the servers' engines are not gpuchef's: nothing here pauses them
    engine_paused = False

    @property
    def status_lines(self) -> list[str]:
        """One line per thing that is wrong now (a scrape failing, the load stopped)."""
        out = [s.status for s in self.servers if s.status] + self.plugin.status_lines
        if isinstance(self.load, HttpLoadControl):
            if self.load.failure_line:
                out.append(self.load.failure_line)
            if self.load.error:
                out.append(self.load.error)
        ab = self.ab.state()
        if ab.status:
            out.append(f"A/B #{ab.run}: {ab.status}")
        return out

    # -- commands --------------------------------------------------------------------------------
    def set_knob(self, name: str, value: Any) -> Any:
        """PATCH one knob (or the mode) on the first server; ConfigError when read-only or
        refused (the server's message)."""
        return self.set_config(**{name: value})[name]

    def set_config(self, **changes: Any) -> dict[str, Any]:
        reason = self.knobs_reason
        if reason:
            raise ConfigError(f"knobs are {reason}")
        for k, v in changes.items():  # refused here with the same words as a hosted engine
            if k != "mode" and k != AUTO_BUDGET and k not in KNOBS:
                raise not_a_knob(k)
            changes[k] = parse_value(k, v)
        return self.servers[0].patch_knobs(changes)

    def pause_engine(self, paused: bool) -> None:
        raise ConfigError(NO_ENGINE_PAUSE)

    def export_trace(self, path: str | None = None) -> str:
        """Rotate the open trace, or write what the session holds (every kept scrape, the
        client's requests, GPU samples, events) to ``path`` (default
        ``gpuchef-top-<time>.jsonl``) and go on recording there. Blocks on file I/O. Raises
        ConfigError when the file cannot be opened."""
        r = self._recorder
        if r is not None:
            return rotate(r, path)
        got: dict[str, Any] = {}

        def held() -> list[Any]:
            snap = self.timeline.snapshot()
            scrapes = [s for srv in self.servers for s in srv.samples()]
            plugin = self.plugin.held()
            got.update(scrapes=len(scrapes), requests=len(snap.requests), plugin=len(plugin))
            return [*scrapes, *plugin, *snap.gpu_samples, *snap.events, *snap.requests]

        p = backfill(self, path, self._meta(), held)
        recs = f", {got['plugin']} plugin records" if self.plugin.endpoints else ""
        return (f"trace {p}: wrote {got['scrapes']} scrapes{recs} and {got['requests']} requests "
                "held in memory; recording goes on there")


__all__ = ["AttachAB", "AttachSession", "AttachedServer", "HttpLoadControl", "NoAB", "NoLoad",
           "base_of"]
