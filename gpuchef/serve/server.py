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
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

from ..engine_host.config import (AUTO_BUDGET, KNOBS, MODES, SETTINGS, ConfigError, not_a_knob,
                                  parse_value)
from ..engine_host.records import RequestRecord, StepOutput
from ..engine_host.request import SamplingParams
from . import protocol as P
from .profile import ProfileError
from .protocol import APIError

log = logging.getLogger("gpuchef.serve")

#: Request ids of HTTP requests start with this (the load generator's are ``req-``/``probe-``),
#: so the dashboard and the trace can tell where a request came from.
HTTP_ID_PREFIX = "http-"
#: None: no limit on requests in flight; past the engine's max_num_seqs they wait in its queue,
#: as in vLLM. ``--max-concurrent-requests N`` opts in to a 503 beyond N.
DEFAULT_MAX_CONCURRENT = None
#: the 503's Retry-After (s): a slot frees when one request in flight ends
RETRY_AFTER_S = 1
DEFAULT_MAX_BODY_MB = 32.0
#: bodies and prompt texts above this are parsed / tokenised off the server's loop (a 10 MB
#: text held it 11 s): the loop keeps streaming to everyone else meanwhile
OFF_LOOP_BYTES = 64 << 10
#: on shutdown, how long (s) the requests in flight get to write their end ("abort" chunk and
#: [DONE], or the whole response) before their connections are closed: a client that does not
#: read cannot hold the exit longer
SHUTDOWN_GRACE_S = 3.0
#: a text longer than max_model_len × (the tokenizer's longest token in characters) × this
#: cannot fit, whatever its tokens: it is refused before it is tokenised (a 30 MB prompt took
#: the tokenizer seconds). The factor leaves room for normalizers that merge characters.
TEXT_BOUND_SLACK = 2
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


def stop_prefix_len(text: str, stops: list[str]) -> int:
    """The length of the longest end of ``text`` that is the start of one of ``stops`` (a stop
    string that may still be forming there): what a stream holds back, 0 when none."""
    best = 0
    for x in stops:
        tail = text[len(text) - min(len(x) - 1, len(text)):]
        i = tail.find(x[0])  # only where its first character is can it start
        while 0 <= i < len(tail) - best:
            if x.startswith(tail[i:]):
                best = len(tail) - i
                break
            i = tail.find(x[0], i + 1)
    return best


@dataclass(eq=False)
class _Stream:
    """One engine request's output, filled by the loop from the engine's listeners."""

    rid: str
    index: int
    prompt_len: int
    decoder: Any
    items: list = field(default_factory=list)  # ("tok", id, t_ns) | ("done", RequestRecord)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    text: str = ""
    sent: int = 0  # characters of ``text`` sent
    n_tokens: int = 0
    ids: list = field(default_factory=list)
    record: RequestRecord | None = None
    finish: str | None = None
    stop_reason: Any = None
    stopped: bool = False  # a stop string was found: the rest is cut
    #: characters of ``text`` made by the first ``min_tokens`` tokens: a stop string must end
    #: after them (vLLM's detokenizer moves its stop-check offset past those tokens' text)
    stop_floor: int = 0


class FrontDoor:
    """The server. ``host``: the EngineHost to feed; ``tokenizer``: engine_host.tokenizer's
    Tokenizer or None (then only token-id prompts, and no text in responses);
    ``metrics``: a ServeMetrics or None; ``model_name``: what clients send as ``model``
    (``--served-model-name``); ``api_key``: Bearer key for the GUARDED_PREFIXES routes (None:
    open); ``max_concurrent``: requests in flight beyond which a 503 answers (None: no limit).
    ``host.profile(action)`` (process.RemoteHost) serves /start_profile and /stop_profile; a
    host without it answers them 501.

    ``listeners()`` returns ``(on_output, on_request)`` to hand to the host (the session fans
    the host's records out to these and to the trace). Start with ``start(sock)``.
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

    # -- engine-thread listeners: hand over, nothing else --------------------------------------
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

    # -- simple endpoints ----------------------------------------------------------------------
    def _model_card(self) -> dict[str, Any]:
        """The one model's card, as GET /v1/models lists it and GET /v1/models/{id} returns it
        (OpenAI's Model object plus vLLM's root, parent, max_model_len)."""
        return {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "gpuchef", "root": self.model_root, "parent": None,
                "max_model_len": self.max_model_len, "vocab_size": self.vocab_size,
                "permission": []}

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: web.Request) -> web.Response:
        self._check_model(request.match_info["model"])  # another id: 404 model_not_found
        return web.json_response(self._model_card())

    async def _health(self, request: web.Request) -> web.Response:
        err = getattr(self.host, "error", None)
        if err is not None:
            raise APIError(503, f"the engine stopped: {type(err).__name__}: {err}")
        return web.Response(status=200)

    async def _load(self, request: web.Request) -> web.Response:
        # vLLM's /load: the generation requests being answered (it counts HTTP requests, so a
        # batch of prompts is one)
        return web.json_response({"server_load": self.http_in_flight})

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        # gpuchef's engine keeps no prefix cache (and --engine vllm runs with vLLM's off): there
        # is nothing to clear, so the 200 vLLM answers after clearing is true at once
        return web.Response(status=200)

    async def _profile(self, action: str) -> web.Response:
        call = getattr(self.host, "profile", None)
        if call is None:
            raise APIError(501, "this server writes no profiles (the front door runs in the "
                                "engine's process here)")
        try:  # a round trip to the engine's process, which opens or closes a file: off the loop
            path = await asyncio.get_running_loop().run_in_executor(None, call, action)
        except ProfileError as e:
            raise APIError(e.status, str(e)) from None
        return web.json_response({"profile": "started" if action == "start" else "stopped",
                                  "path": path})

    async def _start_profile(self, request: web.Request) -> web.Response:
        return await self._profile("start")

    async def _stop_profile(self, request: web.Request) -> web.Response:
        return await self._profile("stop")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            raise APIError(404, "metrics are off on this server")
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": self.metrics.CONTENT_TYPE})

    def _scheduler_state(self) -> dict[str, Any]:
        cfg = self.host.scheduler_config
        return {"mode": cfg.mode, **{k: getattr(cfg, k) for k in KNOBS if hasattr(cfg, k)},
                AUTO_BUDGET: getattr(cfg, AUTO_BUDGET, ""),
                "step": self.host.step_id,
                "allowed": {"mode": list(MODES),
                            AUTO_BUDGET: "TARGET:DURATION[,TARGET:DURATION], e.g. "
                                         "itl_p99:50ms,ttft_p99:2s, or \"\" (off): docs/autopilot.md",
                            **{k: {"min": s.lo, "max": s.hi, "flag": s.flag, "help": s.help}
                               for k, s in KNOBS.items()}}}

    async def _get_scheduler(self, request: web.Request) -> web.Response:
        return web.json_response(self._scheduler_state())

    async def _patch_scheduler(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        if not isinstance(body, dict) or not body:
            raise P.bad("the body must be a JSON object of knobs to change, e.g. "
                        "{\"max_num_batched_tokens\": 512, \"mode\": \"chunked\"}")
        for k, v in body.items():
            if k not in SETTINGS and k not in KNOBS:
                raise P.bad(str(not_a_knob(k)), k)  # block_size: fixed at start-up, says so
            if k in KNOBS and not P._is_int(v):  # JSON has integers: "512" is a typing slip
                raise P.bad(f"'{k}' must be a JSON integer, got {v!r}", k)
            if k == "mode" and not isinstance(v, str):
                raise P.bad(f"'mode' must be a string, got {v!r}", k)
            if k == AUTO_BUDGET and not (v is None or isinstance(v, str)):
                raise P.bad(f"'{AUTO_BUDGET}' must be a string (\"\" or null = off), got {v!r}", k)
            try:  # each alone first, so that the error names the one at fault
                parse_value(k, "" if v is None else v)
            except ConfigError as e:
                raise P.bad(str(e), k) from None
        try:
            parsed = self.host.set_config(source="http", **{k: ("" if v is None else v)
                                                             for k, v in body.items()})
        except ConfigError as e:  # knobs that bound each other, or a limit of the engine
            raise P.bad(str(e)) from None
        state = self._scheduler_state()
        state.update(parsed)  # in force from the next step
        return web.json_response({"accepted": parsed, "scheduler": state})

    # -- tokenizer endpoints ---------------------------------------------------------------------
    def _need_tokenizer(self, param: str) -> Any:
        if self.tokenizer is None:
            raise P.bad("this server has no tokenizer (see --tokenizer)", param)
        return self.tokenizer

    async def _tokenize(self, request: web.Request) -> web.Response:
        t = P.parse_tokenize(await self._json(request))
        self._check_model(t.model)
        if t.messages is not None:
            tk = self._need_tokenizer("messages")
            try:
                text = tk.apply_chat_template(t.messages,
                                              add_generation_prompt=t.add_generation_prompt)
            except ConfigError as e:
                raise P.bad(str(e), "messages") from None
            ids = await self._encode(text, t.add_special_tokens, "messages")
        else:
            tk = self._need_tokenizer("prompt")
            ids = await self._encode(t.prompt, t.add_special_tokens, "prompt")
        loop = asyncio.get_running_loop()
        strs = None
        if t.return_token_strs:  # a Python loop: in a thread, which yields the GIL as it goes
            strs = await loop.run_in_executor(None, lambda: [tk.tok.id_to_token(i) for i in ids])
        # vLLM's TokenizeResponse (token_strs null unless asked for)
        head = f'{{"count":{len(ids)},"max_model_len":{self.max_model_len},"tokens":['
        tail = f'],"token_strs":{json.dumps(strs)}}}'
        return web.Response(body=head.encode() + await _join_ints(ids) + tail.encode(),
                            content_type="application/json")

    async def _detokenize(self, request: web.Request) -> web.Response:
        model, ids = P.parse_detokenize(await self._json(request))
        self._check_model(model)
        tk = self._need_tokenizer("tokens")
        bad_ids = [i for i in ids if i >= self.vocab_size]
        if bad_ids:
            raise P.bad(f"'tokens' token id {bad_ids[0]} is outside the vocabulary "
                        f"[0, {self.vocab_size})", "tokens")
        # vLLM decodes with the special tokens in the text (the tokenizer's decode default)
        try:
            if len(ids) > OFF_LOOP_BYTES // 8:
                text = await asyncio.get_running_loop().run_in_executor(
                    None, _decode_gil_free, tk, ids)
            else:
                text = tk.decode(ids, skip_special_tokens=False)
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception subclasses
            raise P.bad(f"'tokens' cannot be decoded by this tokenizer: {e}", "tokens") from None
        return web.json_response({"prompt": text})

    # -- generation ----------------------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        self.http_in_flight += 1
        try:
            gen = P.parse_completion(await self._json(request))
            return await self._generate(request, gen)
        finally:
            self.http_in_flight -= 1

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.http_in_flight += 1
        try:
            gen = P.parse_chat(await self._json(request))
            return await self._generate(request, gen)
        finally:
            self.http_in_flight -= 1

    async def _encode(self, text: str, special: bool, param: str) -> list[int]:
        tk = self.tokenizer
        try:
            if len(text) > OFF_LOOP_BYTES:
                return await asyncio.get_running_loop().run_in_executor(
                    None, _encode_gil_free, tk, text, special)
            return tk.encode(text, add_special_tokens=special)
        except (TypeError, UnicodeError) as e:  # a lone surrogate ("\ud800") is not text
            raise P.bad(f"'{param}' is not valid Unicode text ({e})", param) from None

    def _check_text_fits(self, text: str, where: str, param: str) -> None:
        """Refuse (context_length_exceeded) a text too long to fit ``max_model_len`` tokens
        whatever they are, before tokenising it."""
        bound = self.max_text_chars
        if bound is not None and len(text) > bound:
            L = self.max_model_len
            verb = "hold" if where == "messages" else "holds"
            raise P.bad(f"This model's maximum context length is {L} tokens. However, the "
                        f"{where} {verb} {len(text)} characters, more than {L} tokens of this "
                        f"tokenizer can hold (at most {bound}). Please reduce the length of "
                        f"the {where}.", param, "context_length_exceeded")

    async def _prompt_ids(self, gen: P.GenRequest) -> list[list[int]]:
        tk = self.tokenizer
        if gen.kind == "chat":
            if tk is None:
                raise P.bad("this server has no tokenizer (see --tokenizer): chat needs one; "
                            "use /v1/completions with token ids", "messages")
            try:
                text = tk.apply_chat_template(gen.messages)
            except ConfigError as e:
                raise P.bad(str(e), "messages") from None
            self._check_text_fits(text, "messages", "messages")
            return [await self._encode(text, False, "messages")]
        out = []
        batch = len(gen.prompts) > 1
        for i, p in enumerate(gen.prompts):
            if isinstance(p, str):
                if tk is None:
                    raise P.bad("this server has no tokenizer (see --tokenizer): give the prompt "
                                "as token ids", "prompt")
                self._check_text_fits(p, f"prompt[{i}] of the batch" if batch else "prompt",
                                      "prompt")
                ids = await self._encode(p, True, "prompt")
            else:
                ids = p
                lo, hi = min(ids), max(ids)
                if lo < 0 or hi >= self.vocab_size:
                    name = f"prompt[{i}]" if batch else "prompt"  # a batch: which prompt
                    raise P.bad(f"'{name}' token id {lo if lo < 0 else hi} is outside the "
                                f"vocabulary [0, {self.vocab_size})", "prompt")
            out.append(ids)
        return out

    def _check_stop_token_ids(self, ids: list[int]) -> None:
        bad_ids = [i for i in ids if i >= self.vocab_size]  # < 0 is refused by the parser
        if bad_ids:
            raise P.bad(f"'stop_token_ids' token id {bad_ids[0]} is outside the vocabulary "
                        f"[0, {self.vocab_size})", "stop_token_ids")

    async def _generate(self, request: web.Request, gen: P.GenRequest) -> web.StreamResponse:
        self._check_model(gen.model)
        if getattr(self.host, "error", None) is not None:
            raise APIError(503, "the engine stopped; see GET /health")
        self._check_stop_token_ids(gen.stop_token_ids)
        prompts = await self._prompt_ids(gen)
        L = self.max_model_len
        params = []
        for i, ids in enumerate(prompts):
            if not ids:
                raise P.bad("the prompt has no tokens", "prompt" if gen.kind != "chat" else "messages")
            mt = gen.max_tokens if gen.max_tokens is not None else L - len(ids)
            if len(ids) + mt > L or mt < 1:
                where = "messages" if gen.kind == "chat" else "prompt"
                # a batch: which of its prompts
                held = (f"prompt[{i}] of the batch" if len(prompts) > 1 else f"the {where}")
                # the prompt alone fills the context: it is at fault, else the token count asked
                param = where if len(ids) >= L else (gen.max_tokens_param or where)
                if gen.max_tokens is None:  # chat, no token count: it gets what the context leaves
                    msg = (f"This model's maximum context length is {L} tokens. However, the "
                           f"{where} hold {len(ids)} tokens, which leaves no room for a "
                           f"completion (it needs at least 1 token). Please reduce the length "
                           f"of the {where}.")
                else:
                    default = "" if gen.max_tokens_given else ": the default max_tokens"
                    msg = (f"This model's maximum context length is {L} tokens. However, you "
                           f"requested {P.shown(len(ids) + mt)} tokens ({len(ids)} in {held}, "
                           f"{P.shown(mt)} in the completion{default}). Please reduce "
                           f"the length of the {where} or completion.")
                raise P.bad(msg, param, "context_length_exceeded")
            if gen.min_tokens > mt:
                raise P.bad(self._min_tokens_message(gen, mt, len(ids)), "min_tokens")
            try:
                params.append(SamplingParams(
                    max_tokens=mt, temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k,
                    seed=gen.seed, ignore_eos=gen.ignore_eos,
                    stop_token_ids=tuple(gen.stop_token_ids), min_tokens=gen.min_tokens))
            except ConfigError as e:  # "seed=... must be ...": name the field
                field_name = str(e).split("=", 1)[0]
                raise P.bad(str(e), field_name if field_name.isidentifier() else None) from None
        cap = self.max_concurrent
        if cap is not None and len(prompts) > cap:
            raise P.bad(f"'prompt' holds {len(prompts)} prompts, more than the server's limit of "
                        f"{cap} requests in flight (--max-concurrent-requests)", "prompt")
        if cap is not None and len(self._streams) + len(prompts) > cap:
            raise APIError(503, f"the server has {len(self._streams)} requests in flight, its "
                                f"limit is {cap} (--max-concurrent-requests): retry later",
                           code="overloaded", headers={"Retry-After": str(RETRY_AFTER_S)})
        n = next(self._ids)
        self.requests_total += 1
        streams = []
        tk = self.tokenizer
        for i, ids in enumerate(prompts):
            rid = f"{HTTP_ID_PREFIX}{n}" if len(prompts) == 1 else f"{HTTP_ID_PREFIX}{n}-{i}"
            s = _Stream(rid, i, len(ids), tk.decoder() if tk is not None else None)
            self._streams[rid] = s
            streams.append(s)
        try:
            for s, ids, sp in zip(streams, prompts, params):
                self.host.submit(s.rid, ids, sp, load=False)
            if gen.stream:
                return await self._stream(request, gen, streams)
            return await self._whole(gen, streams)
        finally:
            for s in streams:
                if s.record is None:  # client gone (cancelled) or a failed write: free its KV now
                    self.host.abort(s.rid)
                self._streams.pop(s.rid, None)

    def _min_tokens_message(self, gen: P.GenRequest, mt: int, n_prompt: int) -> str:
        """``min_tokens`` above the request's token limit ``mt``: the message names where that
        limit came from (the field the client gave, completions' default, or what the context
        leaves a chat request that gave none)."""
        m = gen.min_tokens
        if gen.max_tokens_param is not None:
            limit = f"{gen.max_tokens_param}={mt}"
        elif gen.max_tokens is not None:  # completions' default
            limit = f"max_tokens={mt} (the default when max_tokens is not given)"
        else:
            where = "messages" if gen.kind == "chat" else "prompt"
            limit = (f"the {mt} tokens the context leaves for the completion (max_model_len "
                     f"{self.max_model_len} - {n_prompt} tokens in the {where}; no max_tokens "
                     f"or max_completion_tokens was given)")
        return f"min_tokens={m} must be less than or equal to {limit}: allowed 0 to {mt}"

    def _take(self, s: _Stream, gen: P.GenRequest) -> str:
        """Consume ``s.items``: each token's text in turn (a stop string is looked for after
        every token, so the tokens after it are neither counted nor shown), then the end;
        returns the text to send now."""
        items, s.items = s.items, []
        maxlen = max(map(len, gen.stop)) if gen.stop else 0
        for it in items:
            if it[0] == "tok":
                if s.stopped:
                    continue
                s.n_tokens += 1
                if self.record_send_lag:  # engine's token time → handed to the writer
                    self.send_lag_ns.append(time.monotonic_ns() - it[2])
                if s.decoder is None:
                    continue
                s.ids.append(it[1])
                before = len(s.text)
                s.text += s.decoder.step(it[1])
                if s.n_tokens <= gen.min_tokens:  # vLLM: no stop string before min_tokens
                    s.stop_floor = len(s.text)
                elif maxlen and len(s.text) > before:
                    self._find_stop(s, gen, max(0, before - maxlen + 1))
            elif s.record is None:
                r = s.record = it[1]
                if s.finish is None:
                    s.finish = P.finish_reason(r.finish_reason)
                if s.decoder is not None and not s.stopped:
                    ids = s.ids
                    if (r.finish_reason == "stop" and ids and ids[-1] in gen.stop_token_ids
                            and not gen.include_stop_str_in_output):
                        # vLLM: the stop token's text is not part of the output
                        s.stop_reason = ids[-1]
                        ids = ids[:-1]
                    # bytes held back for a character never completed: the end shows them as
                    # decode() does (U+FFFD), so the streamed text equals the whole text
                    full = self.tokenizer.decode(ids)
                    if full.startswith(s.text[:s.sent]):
                        s.text = full
                    if maxlen and s.n_tokens > gen.min_tokens:
                        self._find_stop(s, gen, max(0, s.sent - maxlen))
        if maxlen and not s.stopped and s.record is None:
            # hold back only what could be the start of a stop string
            upto = max(s.sent, len(s.text) - stop_prefix_len(s.text, gen.stop))
        else:
            upto = len(s.text)
        delta = s.text[s.sent:upto]
        s.sent = upto
        return delta

    def _find_stop(self, s: _Stream, gen: P.GenRequest, start: int) -> None:
        """Cut ``s.text`` at the first stop string found from ``start`` on that ends after
        ``s.stop_floor`` (the text of the first ``min_tokens`` tokens)."""
        hits = [(i, x) for x in gen.stop
                if (i := s.text.find(x, max(start, s.stop_floor - len(x) + 1))) >= 0]
        if not hits:
            return
        i, x = min(hits)
        s.text = s.text[:i + len(x)] if gen.include_stop_str_in_output else s.text[:i]
        s.stopped, s.finish, s.stop_reason = True, "stop", x
        if s.record is None:
            self.host.abort(s.rid, "stop")

    @staticmethod
    def _finished(s: _Stream) -> bool:
        return s.record is not None

    def _error_of(self, s: _Stream) -> APIError | None:
        r = s.record
        if r is not None and r.finish_reason == "error":
            return P.bad(r.error or "the engine refused the request", "prompt")
        return None

    async def _whole(self, gen: P.GenRequest, streams: list[_Stream]) -> web.Response:
        pending = list(streams)
        while pending:  # every choice at once: a stop string in one ends it then, not later
            waits = [asyncio.ensure_future(x.event.wait()) for x in pending]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:  # the others (all, when the client went away) would be left pending
                for w in waits:
                    w.cancel()
            for x in list(pending):
                if x.event.is_set():
                    x.event.clear()
                    self._take(x, gen)
                    if self._finished(x) or x.stopped:
                        pending.remove(x)
        for x in streams:
            err = self._error_of(x)
            if err is not None:
                raise err
        created = int(time.time())
        prompt_tokens = sum(s.prompt_len for s in streams)
        completion_tokens = sum(s.n_tokens for s in streams)
        if gen.kind == "chat":
            s = streams[0]
            return web.json_response({
                "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": created, "model": self.model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": s.text},
                             "logprobs": None, "finish_reason": s.finish,
                             "stop_reason": s.stop_reason}],
                "usage": P.usage(prompt_tokens, completion_tokens)})
        return web.json_response({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": created,
            "model": self.model_name,
            "choices": [{"index": s.index, "text": s.text, "logprobs": None,
                         "finish_reason": s.finish, "stop_reason": s.stop_reason}
                        for s in streams],
            "usage": P.usage(prompt_tokens, completion_tokens)})

    async def _stream(self, request: web.Request, gen: P.GenRequest,
                      streams: list[_Stream]) -> web.StreamResponse:
        chat = gen.kind == "chat"
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = f'{{"id":"{cid}","object":"{obj}","created":{created},"model":{json.dumps(self.model_name)},'
        role_sent = [False] * len(streams)
        pending = list(streams)
        wake = asyncio.Event()

        # one waiter for all choices: each stream's event also sets ``wake``
        async def relay(s: _Stream) -> None:
            while True:
                await s.event.wait()
                s.event.clear()
                wake.set()

        relays = [asyncio.ensure_future(relay(s)) for s in streams] if len(streams) > 1 else []
        box: list = [None]
        try:
            return await self._stream_loop(request, gen, streams, pending, wake, head, chat,
                                           role_sent, box)
        except ConnectionResetError:  # the client went away: _generate aborts its requests
            return box[0] if box[0] is not None else web.Response(status=499)
        finally:
            for t in relays:
                t.cancel()

    async def _stream_loop(self, request: web.Request, gen: P.GenRequest,
                           streams: list[_Stream], pending: list[_Stream], wake: asyncio.Event,
                           head: str, chat: bool, role_sent: list[bool],
                           box: list) -> web.StreamResponse:
        """Write the SSE stream until every choice ended; ``box[0]`` holds the response once
        prepared (for the caller, when the client goes away mid-write).

        The status and headers go out now, when the request is in the engine's hands, not with
        its first token: a client sees its request accepted while it waits in the queue (and
        its TTFT is the engine's, not a header's). An engine that refuses the request after
        that (not expected: the server checked what the engine checks) ends the stream with an
        error event, as vLLM streams an error met after its response began."""
        resp = box[0] = await self._prepare_sse(request)
        # OpenAI: with include_usage every chunk carries "usage", null until the last
        null_usage = ',"usage":null' if gen.include_usage and not gen.continuous_usage else ""
        while pending:
            if len(streams) == 1:
                s0 = streams[0]
                await s0.event.wait()
                s0.event.clear()
            else:
                await wake.wait()
                wake.clear()
            chunks = []
            for s in list(pending):
                if not s.items:
                    continue
                had_tokens = any(it[0] == "tok" for it in s.items)
                delta = self._take(s, gen)
                done = s.finish is not None and (s.record is not None or s.stopped)
                err = self._error_of(s)
                if err is not None:
                    chunks.append(json.dumps(err.body()))
                    pending.remove(s)
                    continue
                if not had_tokens and not done and not delta:
                    continue
                if chat:
                    d: dict[str, Any] = {"content": delta}
                    if not role_sent[s.index]:
                        d = {"role": "assistant", "content": delta}
                        role_sent[s.index] = True
                    # vLLM's ChatCompletionResponseStreamChoice carries stop_reason too
                    choice = {"index": s.index, "delta": d, "logprobs": None,
                              "finish_reason": s.finish if done else None,
                              "stop_reason": s.stop_reason if done else None}
                else:
                    choice = {"index": s.index, "text": delta, "logprobs": None,
                              "finish_reason": s.finish if done else None,
                              "stop_reason": s.stop_reason if done else None}
                body = head + '"choices":[' + json.dumps(choice) + "]"
                if gen.continuous_usage:
                    body += ',"usage":' + json.dumps(P.usage(s.prompt_len, s.n_tokens))
                chunks.append(body + null_usage + "}")
                if done:
                    pending.remove(s)
            if not chunks:
                continue
            await resp.write("".join(f"data: {c}\n\n" for c in chunks).encode())
        tail = ""
        if gen.include_usage:
            u = P.usage(sum(s.prompt_len for s in streams), sum(s.n_tokens for s in streams))
            tail = "data: " + head + '"choices":[],"usage":' + json.dumps(u) + "}\n\n"
        await resp.write((tail + "data: [DONE]\n\n").encode())
        await resp.write_eof()
        return resp

    @staticmethod
    async def _prepare_sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        return resp


def max_token_chars(tokenizer: Any) -> int | None:
    """The most characters one token of ``tokenizer`` (engine_host.tokenizer's Tokenizer) can
    stand for: its longest vocabulary string (a byte-level BPE writes one character per byte,
    and a text's characters are no more than its bytes). None when the vocabulary cannot be
    read (then no text is refused for its length alone)."""
    try:
        return max(1, max(map(len, tokenizer.tok.get_vocab(with_added_tokens=True))))
    except (AttributeError, TypeError, ValueError):
        return None


def _encode_gil_free(tk: Any, text: str, special: bool) -> list[int]:
    """``tk.encode(text)`` through ``tokenizers``' ``encode_batch``, which releases the GIL
    while it works (``encode`` holds it: 3.4 MB of text held every other thread 2.3 s), so
    the server's loop goes on streaming meanwhile. The same ids as ``encode``."""
    tok = getattr(tk, "tok", None)
    if tok is None or not hasattr(tok, "encode_batch"):
        return tk.encode(text, add_special_tokens=special)
    return tok.encode_batch([text], add_special_tokens=special)[0].ids


def _decode_gil_free(tk: Any, ids: list[int]) -> str:
    """``tk.decode(ids, skip_special_tokens=False)`` through ``tokenizers``' ``decode_batch``,
    which releases the GIL (``decode`` held it 1.2 s for 4 M ids). ``tk._map`` is the decode's
    own first step (the bundled tokenizer's stand-in ids): the same text as ``decode``."""
    tok = getattr(tk, "tok", None)
    if tok is None or not hasattr(tok, "decode_batch") or not hasattr(tk, "_map"):
        return tk.decode(ids, skip_special_tokens=False)
    return tok.decode_batch([tk._map(ids)], skip_special_tokens=False)[0]


async def _join_ints(ids: list[int], piece: int = 1 << 16) -> bytes:
    """``ids`` as JSON array items (``1,2,3``), written a piece at a time with the loop let go
    between pieces: millions of ids are seconds of formatting that would hold every stream."""
    if len(ids) <= piece:
        return ",".join(map(str, ids)).encode()
    out = []
    for i in range(0, len(ids), piece):
        out.append(",".join(map(str, ids[i:i + piece])))
        await asyncio.sleep(0)
    return ",".join(out).encode()
