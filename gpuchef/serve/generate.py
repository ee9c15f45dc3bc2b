"""The generation routes of the front door: ``POST /v1/completions`` and
``POST /v1/chat/completions``, streamed (SSE) or whole. A request's prompts become engine
requests through ``host.submit``; their tokens arrive on the server's loop from the engine's
listeners (``_Stream``), are detokenised incrementally, cut at stop strings, and written.
``GenerationRoutes`` is a part of ``server.FrontDoor`` (a mixin: it uses the door's host,
tokenizer, limits and stream table)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..engine_host.vocab.errors import ConfigError
from ..engine_host.vocab.records import RequestRecord
from ..engine_host.request import SamplingParams
from . import protocol as P
from .protocol import APIError

log = logging.getLogger("gpuchef.serve")

#: Request ids of HTTP requests start with this (the load generator's are ``req-``/``probe-``),
#: so the dashboard and the trace can tell where a request came from.
HTTP_ID_PREFIX = "http-"
#: the 503's Retry-After (s): a slot frees when one request in flight ends
RETRY_AFTER_S = 1
#: bodies and prompt texts above this are parsed / tokenised off the server's loop (a 10 MB
#: text held it 11 s): the loop keeps streaming to everyone else meanwhile
OFF_LOOP_BYTES = 64 << 10
#: a text longer than max_model_len × (the tokenizer's longest token in characters) × this
#: cannot fit, whatever its tokens: it is refused before it is tokenised (a 30 MB prompt took
#: the tokenizer seconds). The factor leaves room for normalizers that merge characters.
TEXT_BOUND_SLACK = 2


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


class GenerationRoutes:
    """Completions and chat: parse, tokenise (off the loop for long texts), check against the
    model's limits, submit, then answer whole (``_whole``) or as SSE (``_stream``)."""

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
    """The most characters one token of ``tokenizer`` (engine_host.vocab.tokenizer's Tokenizer) can
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
