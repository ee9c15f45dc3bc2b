"""The HTTP front door: an OpenAI-compatible API over an EngineHost, on its own asyncio thread.

Requests enter through ``EngineHost.submit`` — the host API the load generator uses — and their
tokens come back from the engine's per-step output (``on_output``): each step's tokens for all
streams go to the server's loop in one thread-safe call, and each stream writes them at once,
so a token's time in the trace is the time it was sent, give or take the loop's latency (which
``benchmarks/bench_serve.py`` measures). A client that goes away aborts its request before the
next step: its KV blocks are freed then and the trace records ``finish_reason`` "abort".
Nothing here runs on the engine thread but the two listeners, which only hand records over.

Endpoints (docs/serve.md): ``POST /v1/completions``, ``POST /v1/chat/completions``,
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``GET /version``, ``GET /metrics``,
``GET``/``PATCH /gpuchef/v1/scheduler``, and vLLM's ``POST /tokenize``, ``POST /detokenize``,
``GET``/``POST /ping``, ``GET /load``, ``POST /reset_prefix_cache``, ``POST /start_profile``,
``POST /stop_profile``. Every response echoes the request's ``X-Request-Id`` header.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import itertools
import json
import logging
import socket
import threading
import time
from typing import Any, Callable

from aiohttp import web

from ..engine_host.vocab.errors import ConfigError
from ..engine_host.vocab.records import RequestRecord, StepOutput
from . import protocol as P
from .admin import AdminRoutes
# HTTP_ID_PREFIX and stop_prefix_len are imported from here too (the dashboard, the tests)
from .generate import (HTTP_ID_PREFIX, OFF_LOOP_BYTES, TEXT_BOUND_SLACK,  # noqa: F401
                       GenerationRoutes, _Stream, max_token_chars, stop_prefix_len)
from .protocol import APIError

log = logging.getLogger("gpuchef.serve")

#: None: no limit on requests in flight; past the engine's max_num_seqs they wait in its queue,
#: as in vLLM. ``--max-concurrent-requests N`` opts in to a 503 beyond N.
DEFAULT_MAX_CONCURRENT = None
DEFAULT_MAX_BODY_MB = 32.0
#: on shutdown, how long (s) the requests in flight get to write their end ("abort" chunk and
#: [DONE], or the whole response) before their connections are closed: a client that does not
#: read cannot hold the exit longer
SHUTDOWN_GRACE_S = 3.0
#: the routes that need the API key (with --api-key) and are closed while shutting down:
#: vLLM's /v1 routes, gpuchef's knob endpoint, and the admin routes that change state or write
#: files; /tokenize, /detokenize, /ping, /load stay open as /health does (vLLM's key guards /v1)
GUARDED_PREFIXES = ("/v1/", "/gpuchef/", "/start_profile", "/stop_profile",
                    "/reset_prefix_cache")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0 = any free one), made before the model
    loads so that a port in use or a bad host is one clear line at once. Raises ConfigError."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port {port!r} is out of range: allowed [0, 65535] (0 = any free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host!r} is not an address to listen on ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"--port {port}: {host}:{port} is already in use (another server "
                              "there?); give another --port") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"--host {host!r} is not an address of this machine") from None
        if e.errno == errno.EACCES:
            raise ConfigError(f"--port {port}: permission denied (ports below 1024 need root); "
                              "give a port >= 1024") from None
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


class FrontDoor(AdminRoutes, GenerationRoutes):
    """The server. ``host``: the EngineHost to feed; ``tokenizer``: engine_host.vocab.tokenizer's
    Tokenizer or None (then only token-id prompts, and no text in responses);
    ``metrics``: a ServeMetrics or None; ``model_name``: what clients send as ``model``
    (``--served-model-name``); ``api_key``: Bearer key for the GUARDED_PREFIXES routes (None:
    open); ``max_concurrent``: requests in flight beyond which a 503 answers (None: no limit).
    ``host.profile(action)`` (process.RemoteHost) serves /start_profile and /stop_profile; a
    host without it answers them 501.

    ``listeners()`` returns ``(on_output, on_request)`` to hand to the host (the session fans
    the host's records out to these and to the trace). Start with ``start(sock)``.

    This class holds the door itself (listeners, lifecycle, the route table, errors, auth); the
    routes live with their concern: ``generate.GenerationRoutes`` (completions, chat) and
    ``admin.AdminRoutes`` (models, health, metrics, knobs, tokenize, profile).
    """

    def __init__(self, host: Any, *, tokenizer: Any, model_name: str, model_root: str,
                 max_model_len: int, vocab_size: int, metrics: Any = None,
                 api_key: str | None = None, max_concurrent: int | None = DEFAULT_MAX_CONCURRENT,
                 max_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20),
                 version: str = "0") -> None:
        if max_concurrent is not None and (not isinstance(max_concurrent, int)
                                           or isinstance(max_concurrent, bool)
                                           or max_concurrent < 1):
            raise ConfigError(f"--max-concurrent-requests {max_concurrent!r} must be an integer >= 1")
        self.host = host
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.model_name = model_name
        self.model_root = model_root
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.api_key = api_key or None
        self.max_concurrent = max_concurrent
        self.max_body_bytes = max_body_bytes
        self.version = version
        self.created = int(time.time())
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._closing = False  # shutting down: new requests get a 503
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.startup_error: BaseException | None = None
        self.requests_total = 0
        #: completions/chat HTTP requests being answered (GET /load's server_load)
        self.http_in_flight = 0
        #: the longest text that could fit max_model_len tokens (None: no bound known)
        longest = max_token_chars(tokenizer) if tokenizer is not None else None
        self.max_text_chars = (max_model_len * longest * TEXT_BOUND_SLACK
                               if longest is not None else None)
        self.send_lag_ns: list[int] = []  # engine token time → written, for bench_serve
        self.record_send_lag = False

    # -- the host's sink (the thread delivering the stream): hand over, nothing else ------------
    def record(self, batch: Any) -> None:
        """A loop turn's records (``engine_host.sinks.RecordBatch``), in order."""
        for x in batch.records:
            if isinstance(x, StepOutput):
                self.on_output(x)
            elif isinstance(x, RequestRecord):
                self.on_request(x)

    def on_output(self, out: StepOutput) -> None:
        streams = self._streams
        if not streams or self._loop is None:
            return
        batch = [(s, tok) for rid, tok in out.tokens if (s := streams.get(rid)) is not None]
        if batch:
            # a request's last token and its end in one hand-over: one SSE chunk, not two
            ends = [(s, r) for r in out.finished if (s := streams.get(r.request_id)) is not None]
            self._loop.call_soon_threadsafe(self._deliver, batch, out.t_ns, ends)

    def on_request(self, rec: RequestRecord) -> None:
        # ends that came with their last token were handed over already (a second "done" is
        # ignored); this carries aborts and errors
        s = self._streams.get(rec.request_id)
        if s is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._done, s, rec)

    @staticmethod
    def _deliver(batch: list, t_ns: int, ends: list) -> None:
        for s, tok in batch:
            s.items.append(("tok", tok, t_ns))
            s.event.set()
        for s, rec in ends:
            s.items.append(("done", rec))

    @staticmethod
    def _done(s: _Stream, rec: RequestRecord) -> None:
        s.items.append(("done", rec))
        s.event.set()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, sock: socket.socket) -> None:
        """Serve on ``sock`` (from ``bind_socket``) on a daemon thread; returns once listening.
        Raises what the start-up raised."""
        name = sock.getsockname()
        host = name[0] if ":" not in name[0] else f"[{name[0]}]"
        self.url = f"http://{host}:{name[1]}"
        self._thread = threading.Thread(target=self._run, args=(sock,), name="gpuchef-http",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self.startup_error is not None:
            raise self.startup_error

    def stop(self, timeout: float = SHUTDOWN_GRACE_S + 5.0) -> None:
        """End every request in flight with finish_reason "abort" (streams get their last chunk
        and ``data: [DONE]``; non-streaming requests their response with what was made), give
        their writes ``SHUTDOWN_GRACE_S``, then close; returns once the server thread ended (or
        after ``timeout`` s)."""
        loop = self._loop
        if loop is not None and self._stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, sock: socket.socket) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(sock))
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self.startup_error = e
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self, sock: socket.socket) -> None:
        self._stopping = asyncio.Event()
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._errors])
        app.on_response_prepare.append(self._on_prepare)
        r = app.router
        r.add_post("/v1/completions", self._completions)
        r.add_post("/v1/chat/completions", self._chat)
        r.add_get("/v1/models", self._models)
        r.add_get("/v1/models/{model:.+}", self._model)  # ids may hold '/' (org/name)
        r.add_get("/health", self._health)
        r.add_get("/version", self._version)
        r.add_get("/metrics", self._metrics)
        r.add_get("/gpuchef/v1/scheduler", self._get_scheduler)
        r.add_patch("/gpuchef/v1/scheduler", self._patch_scheduler)
        # vLLM's extra routes, with vLLM's methods (load tools such as AIPerf POST the last
        # three around their runs: a GET there would be a 405)
        r.add_post("/tokenize", self._tokenize)
        r.add_post("/detokenize", self._detokenize)
        r.add_get("/ping", self._health)
        r.add_post("/ping", self._health)
        r.add_get("/load", self._load)
        r.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        r.add_post("/start_profile", self._start_profile)
        r.add_post("/stop_profile", self._stop_profile)
        # shutdown_timeout: aiohttp waits this long for handlers in flight, then cancels them
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        self._runner = runner
        await web.SockSite(runner, sock).start()
        self._ready.set()
        drain = asyncio.ensure_future(self._drain_metrics())
        await self._stopping.wait()
        drain.cancel()
        self._closing = True
        # shutting down: each request ends here with "abort" and its client gets what was made;
        # not through the engine, whose records stop coming once its process stops the bridge
        for s in list(self._streams.values()):
            self.host.abort(s.rid)
            if s.record is None:
                self._done(s, RequestRecord(s.rid, 0, s.prompt_len, s.n_tokens, (), "abort"))
        await runner.cleanup()  # stops listening, waits SHUTDOWN_GRACE_S for those writes
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:  # nothing left pending when the loop closes
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    async def _drain_metrics(self) -> None:
        while self.metrics is not None:
            await asyncio.sleep(0.25)
            self.metrics.drain()

    # -- plumbing ------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            if self._closing and request.path.startswith(GUARDED_PREFIXES):
                raise APIError(503, "the server is shutting down: retry on another one")
            if self.api_key and request.path.startswith(GUARDED_PREFIXES):
                self._check_auth(request)
            return await handler(request)
        except APIError as e:
            return web.json_response(e.body(), status=e.status, headers=e.headers)
        except web.HTTPRequestEntityTooLarge:
            return web.json_response(APIError(
                413, f"the request body is over the limit of {self.max_body_bytes} bytes "
                     "(--max-request-body-mb)").body(), status=413)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            headers = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            msg = {404: f"no route {request.method} {request.path}: see /v1/models, "
                        "/v1/completions, /v1/chat/completions, /metrics, /gpuchef/v1/scheduler "
                        "(docs/serve.md)",
                   405: f"method {request.method} is not allowed on {request.path}"}.get(
                e.status, e.reason)
            return web.json_response(APIError(e.status, msg).body(), status=e.status,
                                     headers=headers)
        except ConnectionResetError:  # the client went away mid-stream: its request is aborted
            return web.Response(status=499)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: say it, keep serving
            log.exception("request failed")
            return web.json_response(APIError(500, f"internal error: {type(e).__name__}: {e}").body(),
                                     status=500)

    async def _on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Each response, just before its headers go out (errors and streams too): echo the
        request's X-Request-Id (vLLM's --enable-request-id-headers, always on here) and count it
        for http_requests_total."""
        rid = request.headers.get("X-Request-Id")
        if rid is not None:
            response.headers["X-Request-Id"] = rid
        if self.metrics is not None:
            resource = request.match_info.route.resource
            self.metrics.count_http(resource.canonical if resource is not None else "none",
                                    request.method, response.status)

    def _check_auth(self, request: web.Request) -> None:
        h = request.headers.get("Authorization", "")
        if not hmac.compare_digest(h.encode(), f"Bearer {self.api_key}".encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                                "(the server's --api-key)", code="invalid_api_key")

    async def _json(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw.strip():  # json's "Expecting value: line 1 column 1" does not say it
            raise P.bad("the request body is empty: send a JSON object "
                        "(Content-Type: application/json)")
        try:
            if len(raw) > OFF_LOOP_BYTES:
                return await asyncio.get_running_loop().run_in_executor(None, json.loads, raw)
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise P.bad(f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise P.bad("the request body is not valid JSON: nested too deeply") from None

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist: this server serves "
                                f"`{self.model_name}` (GET /v1/models)", "model",
                           "model_not_found")
