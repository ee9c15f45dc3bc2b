"""The HTTP load client: gpuchef's request stream sent to an OpenAI-compatible server, streamed.

``run_http_load(specs, cfg, prompt)`` sends each ``RequestSpec`` of ``engine_host.vocab.workload``
(trace replay, Poisson/gamma, probes) as one streaming POST at its arrival time and returns one
``ClientResult`` per request; ``to_request_records`` turns those into ``RequestRecord``s so that
``probes.metrics.summarize`` computes the results block, the one metrics implementation.

Timing follows ``vllm bench serve`` (vllm/benchmarks/lib/endpoint_request_func.py):

* ``start`` is taken when the POST is issued (after the ``--max-concurrency`` semaphore; the wait
  for it is ``queue_time``, vLLM's ``client_queue_time``);
* TTFT = first chunk that carries a token − start; one ITL per chunk after it; E2EL (vLLM's
  ``latency``) = last token chunk − start; output tokens from the usage chunk when the server
  sends one (``stream_options.include_usage``), TPOT = (E2EL − TTFT)/(output tokens − 1).

gpuchef also asks for ``stream_options.continuous_usage_stats`` (vLLM and SGLang honour it): each
chunk then carries the cumulative ``completion_tokens``, so a chunk's token count is known (a
chunk of k tokens is one ITL, recorded with its k; a chunk with no new token, such as a chat
role-only chunk, starts no clock — vLLM's client would start TTFT there). Without it a chunk
counts as one token.

Arrivals are scheduled against absolute time: request *i* is due at ``t0 + arrival_s`` (t0 read
once), so lateness does not accumulate; each request's lateness (its task started − due) is kept.
Every failure (HTTP status, timeout, refused or lost connection, a stream cut before ``[DONE]``, an
error object in the stream) is caught into the result's ``error_kind`` / ``error``; the run goes
on, and ``error_lines`` gives one line per kind.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from ..engine_host.vocab.errors import ConfigError
from ..engine_host.vocab.workload import RequestSpec

# the settings, the results and the server look-up live in their own modules; their names are
# imported from here too (the commands, the sessions, the A/B runner, the tests)
from .http_config import (DEFAULT_REQUEST_TIMEOUT_S, ENDPOINTS, HttpLoadConfig,  # noqa: F401
                          normalize_base_url)
from .http_results import (ERROR_KINDS, ClientResult, _error_message, error_counts,  # noqa: F401
                           error_lines, lateness_stats, peak_stats, result_arrays,
                           to_request_records)
from .server_info import (INFO_TIMEOUT_S, ServerInfo, fetch_server_info,  # noqa: F401
                          server_models_meta)

RAMP_UP_STRATEGIES: tuple[str, ...] = ("linear", "exponential")
#: A random stream of its own for ramp-up arrivals (workload.py uses 0..3).
_STREAM_RAMP_UP = 4
#: Bytes of an error response body kept for the message.
_ERROR_BODY_BYTES = 2048
#: Request bodies built before t0 until their prompts hold this many tokens (~6 bytes a token
#: as JSON ids: ~100 MB); later ones are built in the slack before their due time.
PREBUILT_PROMPT_TOKENS = 16_000_000


# ---------------------------------------------------------------------------------------------
# Ramp-up arrivals (vllm/benchmarks/serve.py ``_get_current_request_rate`` and ``get_request``)

def check_ramp_up(strategy: str | None, start_rps: Any, end_rps: Any, *,
                  request_rate: float, dataset: str, probe_interval_s: float | None) -> None:
    """vLLM's rules for ``--ramp-up-strategy``/``--ramp-up-start-rps``/``--ramp-up-end-rps``,
    plus gpuchef's: the random dataset only (a trace brings its own times) and no probes.
    Raises ConfigError naming the flag."""
    if strategy is None:
        for flag, v in (("--ramp-up-start-rps", start_rps), ("--ramp-up-end-rps", end_rps)):
            if v is not None:
                raise ConfigError(f"{flag} {v} needs --ramp-up-strategy "
                                  f"({' or '.join(RAMP_UP_STRATEGIES)})")
        return
    if strategy not in RAMP_UP_STRATEGIES:
        raise ConfigError(f"--ramp-up-strategy {strategy!r} is not one of "
                          f"{', '.join(RAMP_UP_STRATEGIES)}")
    if not math.isinf(request_rate):
        raise ConfigError("--ramp-up-strategy sets the request rate: leave --request-rate out "
                          f"(got {request_rate:g})")
    if start_rps is None or end_rps is None:
        raise ConfigError("--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps")
    for flag, v in (("--ramp-up-start-rps", start_rps), ("--ramp-up-end-rps", end_rps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{flag} {v!r} must be an integer >= 1 (req/s)")
    if start_rps > end_rps:
        raise ConfigError(f"--ramp-up-start-rps {start_rps} is above --ramp-up-end-rps {end_rps}: "
                          "the ramp goes up")
    if dataset != "random":
        raise ConfigError(f"--ramp-up-strategy applies to random arrivals; --dataset {dataset!r} "
                          "brings its own times (use --trace-speed)")
    if probe_interval_s is not None:
        raise ConfigError("--probe-interval cannot be combined with --ramp-up-strategy")


def ramp_up_rate(strategy: str, start_rps: float, end_rps: float, i: int, n: int) -> float:
    """The rate (req/s) request ``i`` of ``n`` is drawn at: progress ``p = i/max(n−1, 1)``;
    linear ``start + (end − start)·p``, exponential ``start·(end/start)**p``
    (vllm ``_get_current_request_rate``)."""
    p = i / max(n - 1, 1)
    if strategy == "linear":
        return start_rps + (end_rps - start_rps) * p
    return start_rps * (end_rps / start_rps) ** p


def apply_ramp_up(specs: Sequence[RequestSpec], strategy: str, start_rps: int, end_rps: int, *,
                  burstiness: float, arrival: str, seed: int) -> list[RequestSpec]:
    """``specs`` re-timed by the ramp: gap *i* is gamma(shape ``burstiness``, scale
    1/(rate_i·burstiness)) — or 1/rate_i for ``arrival="constant"`` or infinite burstiness —
    and arrival *i* the sum of gaps 0..i, not rescaled (as vllm's ``get_request`` with a ramp).
    Seeded by ``seed`` (a stream of its own). Returns new specs, order kept."""
    n = len(specs)
    rng = np.random.default_rng([int(seed), _STREAM_RAMP_UP])
    rates = np.array([ramp_up_rate(strategy, start_rps, end_rps, i, n) for i in range(n)])
    if arrival == "constant" or math.isinf(burstiness):
        gaps = 1.0 / rates
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
    t = np.cumsum(gaps)
    return [replace(s, arrival_s=float(a)) for s, a in zip(specs, t.tolist())]


# ---------------------------------------------------------------------------------------------
# Prompts

def load_tokenizer(path: str):
    """A ``tokenizers.Tokenizer`` from a local ``tokenizer.json`` file, or a folder holding one
    (``engine_host.vocab.tokenizer.read_tokenizer_json``, the one reader). Raises ConfigError naming
    ``--tokenizer`` and the path."""
    from ..engine_host.vocab.tokenizer import read_tokenizer_json

    try:
        return read_tokenizer_json(path)[0]
    except ConfigError as e:
        raise ConfigError(f"--tokenizer: {e}") from None


def tokenizer_vocab_size(tok) -> int:
    """The base vocabulary (added/special tokens left out): random prompt ids are drawn below it."""
    return int(tok.get_vocab_size(with_added_tokens=False))


def text_prompt(tok, ids: Sequence[int], target_len: int) -> str:
    """Text whose encoding by ``tok`` is ``target_len`` tokens or a little fewer: the ids decoded
    (extended with themselves when the text encodes shorter), then cut to the longest prefix of
    its own encoding that re-encodes within ``target_len`` (a binary search; decoded byte-level
    pieces can re-encode longer). As vLLM's random dataset, the prompt is text of about the
    asked length; the server's ``prompt_tokens`` is what the results count."""
    ids = [int(i) for i in ids]

    def n_tokens(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    text = tok.decode(ids, skip_special_tokens=True)
    enc = tok.encode(text, add_special_tokens=False).ids
    if len(enc) == target_len or not ids:
        return text
    if len(enc) < target_len:
        more = (ids * (1 + target_len // max(len(ids), 1)))[:2 * (target_len - len(enc)) + 8]
        text = tok.decode(enc + more, skip_special_tokens=True)
        enc = tok.encode(text, add_special_tokens=False).ids
        if len(enc) <= target_len:
            return text
    lo, hi = 0, min(len(enc), target_len)  # the longest prefix enc[:k] within the target
    while lo < hi:
        k = (lo + hi + 1) // 2
        if n_tokens(tok.decode(enc[:k], skip_special_tokens=True)) <= target_len:
            lo = k
        else:
            hi = k - 1
    return tok.decode(enc[:lo], skip_special_tokens=True)


def request_body(spec: RequestSpec, cfg: HttpLoadConfig, tok=None) -> bytes:
    """The JSON body of ``spec``'s request: completions get ``prompt`` as token ids (or text with
    a tokenizer), ``max_tokens``; chat gets one user message of text and
    ``max_completion_tokens`` (vLLM's client's field); both ``stream``, ``stream_options``
    (``include_usage``, ``continuous_usage_stats``), ``ignore_eos`` and the sampling fields
    (``temperature`` always, as ``vllm bench serve`` sends it; ``top_p``/``top_k`` when set)."""
    body: dict[str, Any] = {"model": cfg.model}
    if tok is not None:
        prompt: Any = text_prompt(tok, spec.prompt_token_ids, spec.prompt_len)
    else:
        ids = spec.prompt_token_ids
        prompt = ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]
    if cfg.is_chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        body["max_completion_tokens"] = spec.output_len
    else:
        body["prompt"] = prompt
        body["max_tokens"] = spec.output_len
    body["stream"] = True
    so = {"include_usage": True}
    if cfg.continuous_usage:
        so["continuous_usage_stats"] = True
    body["stream_options"] = so
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    body["temperature"] = cfg.temperature
    if cfg.top_p is not None:
        body["top_p"] = cfg.top_p
    if cfg.top_k is not None:
        body["top_k"] = cfg.top_k
    return json.dumps(body, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------------
# One request


class _Stream:
    """Parses one response's SSE events as they arrive (``data: {json}`` blocks ending in a blank
    line, ``data: [DONE]`` last, ``:`` comment lines skipped)."""

    __slots__ = ("res", "buf", "done", "last_ct", "texts", "is_chat")

    def __init__(self, res: ClientResult, is_chat: bool) -> None:
        self.res = res
        self.buf = b""
        self.done = False
        self.last_ct = 0
        self.texts: list[str] = []
        self.is_chat = is_chat

    def feed(self, data: bytes) -> bool:
        """Consume bytes; False once the stream is over (done, or an error was recorded)."""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        buf = self.buf + data
        while True:
            i = buf.find(b"\n\n")
            if i < 0:
                break
            event, buf = buf[:i], buf[i + 2:]
            if not self.event(event):
                self.buf = b""
                return False
        self.buf = buf
        return True

    def flush(self) -> None:
        """The stream ended: an unterminated last event is read too (vLLM's client does)."""
        if self.buf.strip() and not self.done and not self.res.error_kind:
            self.event(self.buf)
        self.buf = b""

    def event(self, event: bytes) -> bool:
        payload = None
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
        if payload is None:  # comments (pings), event:/id: lines, blank keep-alives
            return True
        if payload == b"[DONE]":
            self.done = True
            return False
        now = time.monotonic_ns()
        res = self.res
        try:
            obj = json.loads(payload)
        except ValueError:
            res.fail("bad_stream", f"not JSON: {payload[:80]!r}")
            return False
        if not isinstance(obj, dict):
            res.fail("bad_stream", f"not a JSON object: {payload[:80]!r}")
            return False
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            res.fail("stream_error", str(msg))
            return False
        usage = obj.get("usage")
        ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
        choices = obj.get("choices")
        if choices:
            c0 = choices[0] if isinstance(choices[0], dict) else {}
            if self.is_chat:
                delta = c0.get("delta") or {}
                text = delta.get("content") if isinstance(delta, dict) else None
            else:
                text = c0.get("text")
            if text:
                self.texts.append(text)
            if c0.get("finish_reason"):
                res.finish_reason = str(c0["finish_reason"])
            if isinstance(ct, int) and not isinstance(ct, bool):
                n = ct - self.last_ct
                self.last_ct = ct
                if n <= 0:
                    return True  # a chunk with no new token (e.g. chat's role-only chunk)
            else:
                n = 1
            times = res.chunk_times_ns
            if times and now <= times[-1]:
                now = times[-1] + 1  # keep chunks distinct: equal time stamps merge into one
            times.append(now)
            res.chunk_tokens.append(n)
        elif isinstance(ct, int) and not isinstance(ct, bool):
            # the usage chunk (empty choices)
            res.usage_output_tokens = ct
            pt = usage.get("prompt_tokens")
            if isinstance(pt, int) and not isinstance(pt, bool):
                res.prompt_len = pt
        return True


async def send_one(session, spec: RequestSpec, body: bytes, cfg: HttpLoadConfig, due_ns: int,
                   sem: asyncio.Semaphore | None) -> ClientResult:
    """Send one streaming request and read it to the end. Never raises (a cancellation aside):
    every failure is recorded in the returned ClientResult."""
    import aiohttp

    res = ClientResult(spec.request_id, spec.is_probe, spec.prompt_len, spec.output_len,
                       due_ns=due_ns)
    res.dispatch_ns = time.monotonic_ns()
    if sem is not None and not spec.is_probe:
        await sem.acquire()
    status_seen = False
    try:
        res.start_ns = time.monotonic_ns()
        async with session.post(cfg.api_url, data=body,
                                headers={"x-request-id": spec.request_id}) as resp:
            res.status = resp.status
            status_seen = True
            if resp.status != 200:
                raw = await resp.content.read(_ERROR_BODY_BYTES)
                res.fail("http", _error_message(resp.status, resp.reason or "", raw))
                return res
            if resp.content_type == "application/json":  # the server ignored stream: true
                raw = await resp.content.read(_ERROR_BODY_BYTES)
                res.fail("bad_stream", "the answer is one JSON body, not an SSE stream (does the "
                                       f"server stream?): {raw[:80]!r}")
                return res
            st = _Stream(res, cfg.is_chat)
            async for data in resp.content.iter_any():
                if not st.feed(data):
                    break
            st.flush()
            res.generated_text = "".join(st.texts)
            if res.error_kind:
                return res
            if not st.done:
                res.fail("stream_cut", f"the server closed the stream after "
                                       f"{len(res.chunk_times_ns)} chunk(s), before [DONE]")
            elif not res.chunk_times_ns:
                res.fail("no_token", "the stream ended without a chunk carrying a token")
            elif res.finish_reason == "abort":
                res.fail("stream_error", "the server aborted the request (finish_reason abort)")
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        res.fail("timeout", f"no complete response within {cfg.request_timeout_s:g} s "
                            "(--request-timeout)")
    except aiohttp.ClientConnectorError as e:
        refused = isinstance(e.os_error, ConnectionRefusedError)
        res.fail("refused" if refused else "connection", f"{cfg.base_url}: {e.os_error or e}")
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
        if status_seen:
            res.fail("stream_cut", f"the stream broke after {len(res.chunk_times_ns)} chunk(s): "
                                   f"{type(e).__name__}: {e}")
        else:
            res.fail("connection", f"{type(e).__name__}: {e}")
    except aiohttp.ClientError as e:
        res.fail("stream_cut" if status_seen else "connection", f"{type(e).__name__}: {e}")
    except Exception as e:  # never a traceback: a bug here is one counted failure, named
        res.fail("client", f"{type(e).__name__}: {e}")
    finally:
        res.end_ns = time.monotonic_ns()
        if sem is not None and not spec.is_probe:
            sem.release()
    return res


# ---------------------------------------------------------------------------------------------
# The run

@dataclass
class HttpLoadRun:
    """A finished run: ``results`` in ``specs`` order, ``t0_ns`` (monotonic ns of arrival 0),
    ``duration_s`` (t0 → the last response, vLLM's benchmark duration), and ``rps_change_events``
    (vLLM's ramp-up log: each integer rate reached, with the wall-clock time, ISO format)."""

    results: list[ClientResult]
    t0_ns: int
    duration_s: float
    rps_change_events: list[dict[str, Any]] = field(default_factory=list)


def _session(cfg: HttpLoadConfig):
    import aiohttp

    n = cfg.max_concurrency or 0
    # probes bypass --max-concurrency: give them room in the pool
    pool = (n + 16) if n else 0
    connector = aiohttp.TCPConnector(limit=pool, limit_per_host=pool, ttl_dns_cache=300,
                                     keepalive_timeout=60, force_close=False)
    # trust_env off: with it aiohttp looks up proxy variables and ~/.netrc on a thread for every
    # request (two thread hops each, ~15 % of a core at 1000 req/s); the load goes straight on
    return aiohttp.ClientSession(connector=connector, headers=cfg.headers(), trust_env=False,
                                 timeout=aiohttp.ClientTimeout(total=cfg.request_timeout_s))


async def _warm_up(session, cfg: HttpLoadConfig) -> None:
    """One GET of /v1/models before t0, answer ignored: the first connection, the resolver's
    thread and aiohttp's lazy set-up are paid before the clock starts, not by the first
    arrivals (each of which would otherwise open a connection of its own)."""
    import aiohttp

    try:
        async with session.get(cfg.base_url + "/v1/models",
                               timeout=aiohttp.ClientTimeout(total=INFO_TIMEOUT_S)) as r:
            await r.read()
    except Exception:  # the run itself counts whatever is wrong
        pass


async def run_http_load_async(specs: Sequence[RequestSpec], cfg: HttpLoadConfig,
                              body: Callable[[RequestSpec], bytes], *,
                              ramp: tuple[str, int, int] | None = None,
                              start_delay_s: float = 0.0,
                              t0_ns: int | None = None,
                              on_done: Callable[[], None] | None = None,
                              on_result: Callable[[ClientResult], None] | None = None
                              ) -> HttpLoadRun:
    """Send ``specs`` (sorted by ``arrival_s``) at ``t0 + arrival_s`` each, ``body(spec)`` as the
    request body (built just before the request's due time, in the slack before it), all over
    one pooled ``aiohttp`` session; wait for every response. ``ramp``: (strategy, start, end) to
    log ``rps_change_events`` as vLLM does. ``t0_ns``: arrival 0's monotonic time, given (two
    loads sent on one clock: `ab`'s mirrored servers), else read after the warm-up plus
    ``start_delay_s``. ``on_done()`` is called as each request finishes
    (a progress bar); ``on_result(result)`` with each ClientResult as it finishes (`top
    --attach` shows them live). Returns an HttpLoadRun; raises nothing per request.
    Proxy variables (HTTP_PROXY, ...) are not read: the load goes straight to ``base_url``."""
    from datetime import datetime

    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    tasks: list[asyncio.Task] = []
    events: list[dict[str, Any]] = []
    last_int = -1
    if ramp is not None:
        last_int = int(ramp[1])
        events.append({"rps": last_int, "timestamp": datetime.now().isoformat()})
    n = len(specs)
    # bodies built before the clock starts (vLLM's client also prepares every request first),
    # up to PREBUILT_PROMPT_TOKENS of prompts; the rest in the slack before each due time
    ready: list[bytes] = []
    tokens = 0
    for spec in specs:
        if tokens > PREBUILT_PROMPT_TOKENS:
            break
        ready.append(body(spec))
        tokens += spec.prompt_len
    async with _session(cfg) as session:
        await _warm_up(session, cfg)
        t0 = t0_ns if t0_ns is not None else time.monotonic_ns() + int(start_delay_s * 1e9)
        for i, spec in enumerate(specs):
            data = ready[i] if i < len(ready) else body(spec)
            due = t0 + int(round(spec.arrival_s * 1e9))
            delay = (due - time.monotonic_ns()) / 1e9
            # absolute time: each wait is to the request's own due time, never a relative gap
            await asyncio.sleep(delay if delay > 0 else 0)
            if ramp is not None:
                rate = int(ramp_up_rate(ramp[0], ramp[1], ramp[2], i, n))
                if rate > last_int:
                    ts = datetime.now().isoformat()
                    events.extend({"rps": v, "timestamp": ts}
                                  for v in range(last_int + 1, rate + 1))
                    last_int = rate
            task = asyncio.create_task(send_one(session, spec, data, cfg, due, sem))
            if on_done is not None:
                task.add_done_callback(lambda _t: on_done())
            if on_result is not None:
                task.add_done_callback(lambda t: t.cancelled() or on_result(t.result()))
            tasks.append(task)
        results = list(await asyncio.gather(*tasks))
        end = max([r.end_ns for r in results], default=time.monotonic_ns())
    return HttpLoadRun(results, t0, max(end - t0, 1) / 1e9, events)


def run_http_load(specs: Sequence[RequestSpec], cfg: HttpLoadConfig,
                  body: Callable[[RequestSpec], bytes] | None = None, **kw: Any) -> HttpLoadRun:
    """:func:`run_http_load_async` on a fresh event loop (``asyncio.run``), with the objects
    made so far frozen out of the garbage collector's way (vLLM's ``freeze_gc_heap``) for the run.
    ``body`` defaults to ``request_body(spec, cfg)`` (token-id prompts)."""
    if body is None:
        def body(spec: RequestSpec) -> bytes:
            return request_body(spec, cfg)
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(run_http_load_async(specs, cfg, body, **kw))
    finally:
        gc.unfreeze()
