"""The front door's other routes: the model cards (``/v1/models``), ``/health``, ``/ping``,
``/load``, ``/version``, ``/metrics``, the knob endpoint (``GET``/``PATCH
/gpuchef/v1/scheduler``), vLLM's ``/tokenize`` and ``/detokenize``, ``/reset_prefix_cache``
and the profiler's ``/start_profile``/``/stop_profile``. ``AdminRoutes`` is a part of
``server.FrontDoor`` (a mixin: it uses the door's host, tokenizer, metrics and JSON reader)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from ..engine_host.vocab.config import AUTO_BUDGET, KNOBS, MODES, SETTINGS, not_a_knob, parse_value
from ..engine_host.vocab.errors import ConfigError
from . import protocol as P
from .generate import OFF_LOOP_BYTES
from .profile import ProfileError
from .protocol import APIError


class AdminRoutes:
    """Everything but generation: cheap reads of the server's state, the live knob change, and
    tokenisation without generating."""

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
