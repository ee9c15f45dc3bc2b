"""The OpenAI request bodies gpuchef's front door takes, checked field by field, and the
responses and errors it writes (OpenAI's shapes, as vLLM implements them).

``parse_completion`` / ``parse_chat`` turn a JSON body into a ``GenRequest`` or raise
``APIError`` naming the field (``param``) and what is allowed. Fields OpenAI or vLLM define
that gpuchef does not implement (``UNSUPPORTED``) are refused when set to anything but their
"off" value (docs/serve.md lists them); fields nobody defines are ignored, as vLLM does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

#: OpenAI's defaults (https://platform.openai.com/docs/api-reference/completions/create):
#: completions stop after 16 tokens; chat after what the context leaves (vLLM's default).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class APIError(Exception):
    """An HTTP error with OpenAI's body ``{"error": {"message", "type", "param", "code"}}``;
    ``headers``: extra response headers (e.g. ``Retry-After`` on a 503)."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error",
             404: "invalid_request_error", 405: "invalid_request_error",
             409: "invalid_request_error", 413: "invalid_request_error",
             422: "invalid_request_error", 503: "server_error", 500: "server_error",
             501: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


@dataclass
class GenRequest:
    """One completions/chat request, checked. ``prompts``: each a str or a list of token ids
    (a batch is several; chat has one). ``max_tokens`` None = what the context leaves."""

    kind: str  # "completions" | "chat"
    model: str | None
    prompts: list[Any]
    max_tokens: int | None
    max_tokens_given: bool = False
    #: the field that gave ``max_tokens`` ("max_tokens" / "max_completion_tokens"), None = default
    max_tokens_param: str | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    messages: list[dict[str, Any]] | None = None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: floats are exact integers up to 2^53: an "integral float" beyond that is not taken as a count
EXACT_FLOAT_INT = 2 ** 53


def shown(v: Any, limit: int = 40) -> str:
    """``repr(v)`` for an error message, cut in the middle when longer than ``limit``
    characters (a 309-digit number is named by its ends and its length)."""
    return _cut(repr(v), limit)


def shown_json(v: Any, limit: int = 60) -> str:
    """``v`` as the client wrote it (JSON: ``true``, ``{"type": "json_object"}``), cut as
    ``shown`` cuts."""
    try:
        r = json.dumps(v, ensure_ascii=False)
    except (TypeError, ValueError):
        r = repr(v)
    return _cut(r, limit)


def _json_type(v: Any) -> str:
    """The JSON type of a parsed value, for a message: "an object", "a string", ..."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return {dict: "an object", list: "an array", str: "a string"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


def _cut(r: str, limit: int) -> str:
    if len(r) <= limit:
        return r
    return f"{r[:limit // 2]}…{r[-8:]} ({len(r)} characters)"


def _num(body: dict, key: str, default: float, lo: float, hi: float, *,
         lo_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"'{key}' must be a number, got {shown(v)}", key)
    if not math.isfinite(v):  # NaN / Infinity: JSON parsers take them
        raise bad(f"'{key}' must be a finite number, got {v!r}", key)
    if (v <= lo if lo_open else v < lo) or v > hi:
        if math.isinf(hi):
            raise bad(f"'{key}' = {v!r} is out of range: allowed {'>' if lo_open else '>='} "
                      f"{lo:g}", key)
        raise bad(f"'{key}' = {v!r} is out of range: allowed {'(' if lo_open else '['}{lo:g}, "
                  f"{hi:g}]", key)
    return float(v)


def _int(body: dict, key: str, lo: int | None = None, *, default: Any = None) -> Any:
    """An integer field (``default`` when absent or null), as ``_count`` takes it: an integral
    float (``5.0``) is that integer, as pydantic's lax int in vLLM takes it."""
    v = _count(body, key, lo)
    return default if v is None else v


def _bool(body: dict, key: str, default: bool = False, *, param: str | None = None) -> bool:
    """``body[key]``, a JSON boolean; ``param``: the field's name in the request when ``body``
    is a nested object (``stream_options.include_usage``)."""
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        name = param or key
        raise bad(f"'{name}' must be true or false, got {shown_json(v)}", name)
    return v


#: The request fields OpenAI or vLLM define and gpuchef serve does not implement, one table:
#: ``(field, endpoint, values that mean "off", the allowed values as the error says them)``;
#: endpoint "" = both. A value that means "off" (the default a client such as the openai SDK,
#: guidellm or ``vllm bench serve`` may send) is accepted; null is accepted for every field;
#: anything else is a 400 naming the field, its value and what is allowed (docs/serve.md).
#: ``stop_token_ids``, ``ignore_eos``, ``include_stop_str_in_output``, ``top_k``, ``seed``,
#: ``min_tokens`` are implemented, so not here.
UNSUPPORTED: tuple[tuple[str, str, tuple[Any, ...], str], ...] = (
    # vLLM: completions' logprobs=0 returns the sampled token's logprob; chat's is a bool
    ("logprobs", "completions", (), "absent or null"),
    ("logprobs", "chat", (False,), "false or absent"),
    ("top_logprobs", "", (0,), "0 or absent"),
    ("prompt_logprobs", "", (), "absent or null"),
    ("echo", "", (False,), "false or absent"),
    ("best_of", "", (1,), "1 or absent"),
    ("suffix", "", ("",), '"" or absent'),
    ("use_beam_search", "", (False,), "false or absent"),
    ("presence_penalty", "", (0,), "0 or absent"),
    ("frequency_penalty", "", (0,), "0 or absent"),
    ("repetition_penalty", "", (1,), "1 or absent"),
    ("min_p", "", (0,), "0 or absent"),
    ("logit_bias", "", ({},), "{} or absent"),
    ("bad_words", "", ([],), "[] or absent"),
    # vLLM refuses an empty list too: it would allow no token
    ("allowed_token_ids", "", (), "absent or null"),
    ("skip_special_tokens", "", (True,), "true or absent"),
    ("truncate_prompt_tokens", "", (), "absent or null"),
    ("response_format", "", ({"type": "text"},), '{"type": "text"} or absent'),
    ("structured_outputs", "", (), "absent or null"),
    ("guided_json", "", (), "absent or null"),
    ("guided_regex", "", (), "absent or null"),
    ("guided_choice", "", (), "absent or null"),
    ("guided_grammar", "", (), "absent or null"),
    ("guided_decoding_backend", "", (), "absent or null"),
    ("guided_whitespace_pattern", "", (), "absent or null"),
    ("tools", "", ([],), "[] or absent"),
    ("priority", "", (0,), "0 or absent"),
    ("length_penalty", "", (1,), "1 or absent"),
    # vLLM's per-request logits processors (qualified names or constructor specs) and its
    # custom-processor arguments: code gpuchef does not load
    ("logits_processors", "", ([],), "[] or absent"),
    ("vllm_xargs", "", ({},), "{} or absent"),
    # the prompt as gpuchef builds it: completions' text with the BOS, chat's through the
    # model folder's template with the generation prompt and no more special tokens (vLLM's
    # defaults)
    ("add_special_tokens", "completions", (True,), "true or absent"),
    ("add_special_tokens", "chat", (False,), "false or absent"),
    ("add_generation_prompt", "chat", (True,), "true or absent"),
    ("continue_final_message", "chat", (False,), "false or absent"),
    ("chat_template", "chat", (), "absent or null: the model folder's template is used"),
    ("chat_template_kwargs", "chat", ({},), "{} or absent"),
    # no tool calling (tools is refused but for []): a tool_choice asking for tools ("auto",
    # "required", a named function) is refused, as vLLM refuses it without tools ("When using
    # `tool_choice`, `tools` must be set."); completions ignore the field, as vLLM's do
    ("tool_choice", "chat", ("none",), '"none" or absent: gpuchef serve has no tool calling'),
)


def _is_off(v: Any, off: Any) -> bool:
    """``v`` equals the "off" value ``off`` as JSON compares them: ``true`` is not 1, 0.0 is 0;
    an object off value (``{"type": "text"}``) also matches with other keys null, as clients
    that write every field of their model send it (vLLM's model has those keys, null)."""
    if isinstance(off, bool) or isinstance(v, bool):
        return v is off
    if isinstance(off, dict) and off and isinstance(v, dict):
        v = {k: x for k, x in v.items() if x is not None}
    return v == off


def _unsupported(body: dict, kind: str) -> None:
    for key, where, off, allowed in UNSUPPORTED:
        if where and where != kind:
            continue
        v = body.get(key)
        if v is not None and not any(_is_off(v, o) for o in off):
            raise bad(f"{key}={shown_json(v)} is not supported by gpuchef serve "
                      f"(allowed: {allowed})", key)


def _common(body: Any, kind: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"'model' must be a string, got {model!r}", "model")
    n = body.get("n", 1)
    if isinstance(n, float) and n == 1:  # 1.0, as some clients send it (max_tokens: the same)
        n = 1
    if n is not None and (not _is_int(n) or n != 1):
        raise bad(f"'n' = {n!r}: gpuchef's server returns one choice per prompt; allowed n=1",
                  "n")
    _unsupported(body, kind)
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad("'stream_options' must be an object like {\"include_usage\": true}",
                  "stream_options")
    so = so or {}
    stream = _bool(body, "stream")
    if so and not stream:
        raise bad("'stream_options' is only allowed with \"stream\": true", "stream_options")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad(f"'stop' must be a string or a list of strings, got {shown_json(stop)}",
                  "stop")
    if any(not s for s in stop):
        raise bad("'stop' strings must not be empty", "stop")
    sti = body.get("stop_token_ids")
    if sti is None:
        sti = []
    if not (isinstance(sti, list) and all(_is_int(i) and i >= 0 for i in sti)):
        raise bad(f"'stop_token_ids' must be a list of token ids (integers >= 0), got {shown_json(sti)}",
                  "stop_token_ids")
    seed = _int(body, "seed")
    min_tokens = _count(body, "min_tokens", 0)
    include_usage = _bool(so, "include_usage", param="stream_options.include_usage")
    return dict(
        model=model, stream=stream,
        include_usage=include_usage,
        # vLLM: per-chunk usage only together with include_usage
        continuous_usage=include_usage and _bool(
            so, "continuous_usage_stats", param="stream_options.continuous_usage_stats"),
        # vLLM's SamplingParams asks only >= 0 (OpenAI caps it at 2; vLLM does not)
        temperature=_num(body, "temperature", 1.0, 0.0, math.inf),
        top_p=_num(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=_top_k(body),
        seed=seed, ignore_eos=_bool(body, "ignore_eos"), stop=stop, stop_token_ids=sti,
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output"),
        min_tokens=0 if min_tokens is None else min_tokens)


def _top_k(body: dict) -> int:
    v = _int(body, "top_k", default=0)
    if v == -1:  # vLLM's "off"
        return 0
    if v < 0:
        raise bad(f"'top_k' = {v} must be -1 or 0 (off) or a positive integer", "top_k")
    return v


def _count(body: dict, key: str, lo: int | None) -> int | None:
    """A token count ``body[key]`` (None when absent or null): an integer >= ``lo`` (None: any),
    or an integral float (``4.0``, as some clients send it; pydantic's lax int in vLLM takes
    it)."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer() and abs(v) <= EXACT_FLOAT_INT:
        v = int(v)
    if not _is_int(v):
        raise bad(f"'{key}' must be an integer, got {shown(v)}", key)
    if lo is not None and v < lo:
        raise bad(f"'{key}' = {shown(v)} must be >= {lo}", key)
    return v


def _max_tokens(body: dict, *keys: str) -> tuple[int | None, str | None]:
    """(the first of ``keys`` set, its name), or (None, None)."""
    for key in keys:
        v = _count(body, key, 1)
        if v is not None:
            return v, key
    return None, None


def parse_completion(body: Any) -> GenRequest:
    """``POST /v1/completions``: ``prompt`` is a string, a list of token ids, or a list of
    either (a batch: one choice per prompt, ``index`` in order). Raises APIError (400)."""
    c = _common(body, "completions")
    if "prompt" not in body:
        raise bad("'prompt' is required: a string, a list of token ids, or a list of those",
                  "prompt")
    p = body["prompt"]
    if isinstance(p, str):
        prompts: list[Any] = [p]
    elif isinstance(p, list) and p and all(_is_int(i) for i in p):
        prompts = [p]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = list(p)
    elif isinstance(p, list) and p and all(isinstance(x, list) for x in p):
        for x in p:
            if not all(_is_int(i) for i in x):
                raise bad("'prompt': a batch of token-id lists must hold only integers", "prompt")
        prompts = [list(x) for x in p]
    elif isinstance(p, list) and not p:
        raise bad("'prompt' is empty: give at least one token or character", "prompt")
    else:
        raise bad("'prompt' must be a string, a list of token ids (integers), or a list of "
                  f"strings or of token-id lists, got {_json_type(p)} {shown_json(p)}", "prompt")
    for x in prompts:
        if len(x) == 0:
            raise bad("'prompt' is empty: give at least one token or character", "prompt")
    mt, key = _max_tokens(body, "max_tokens")
    return GenRequest("completions", prompts=prompts,
                      max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS if mt is None else mt,
                      max_tokens_given=mt is not None, max_tokens_param=key, **c)


CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")


def parse_chat(body: Any) -> GenRequest:
    """``POST /v1/chat/completions``: ``messages`` ``[{"role", "content"}]`` with content a
    string or a list of ``{"type": "text", "text"}`` parts. Raises APIError (400)."""
    c = _common(body, "chat")
    out = parse_messages(body.get("messages"))
    mt, key = _max_tokens(body, "max_completion_tokens", "max_tokens")
    return GenRequest("chat", prompts=[], max_tokens=mt, max_tokens_given=mt is not None,
                      max_tokens_param=key, messages=out, **c)


def parse_messages(msgs: Any) -> list[dict[str, str]]:
    """A request's ``messages`` as ``[{"role", "content": str}]`` (text parts joined with a
    newline, as vLLM joins them). Raises APIError (400) naming the message at fault."""
    if msgs is None:
        raise bad("'messages' is required: a non-empty list of {\"role\", \"content\"}",
                  "messages")
    if not isinstance(msgs, list):
        raise bad(f"'messages' must be a list of {{\"role\", \"content\"}} objects, got "
                  f"{_json_type(msgs)} {shown_json(msgs)}", "messages")
    if not msgs:
        raise bad("'messages' is empty: give at least one {\"role\", \"content\"}",
                  "messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"'{where}' must be an object with 'role' and 'content'", where)
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise bad(f"'{where}.role' = {role!r} is not one of {', '.join(CHAT_ROLES)}",
                      f"{where}.role")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise bad(f"'{where}.content[{j}]': only text parts "
                              "({\"type\": \"text\", \"text\": ...}) are supported",
                              f"{where}.content")
                parts.append(part["text"])
            content = "\n".join(parts)  # vLLM joins text parts with a newline
        elif content is None and role == "assistant":
            content = ""
        elif not isinstance(content, str):
            raise bad(f"'{where}.content' must be a string or a list of text parts",
                      f"{where}.content")
        out.append({"role": role, "content": content})
    return out


@dataclass
class TokenizeRequest:
    """``POST /tokenize``, vLLM's TokenizeCompletionRequest (``prompt``) or TokenizeChatRequest
    (``messages``)."""

    model: str | None
    prompt: str | None
    messages: list[dict[str, str]] | None
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


#: chat fields of vLLM's TokenizeChatRequest that gpuchef does not implement, as ``UNSUPPORTED``
#: lists them for chat (the "off" values taken): the prompt is the one /v1/chat/completions
#: builds
TOKENIZE_UNSUPPORTED = tuple(u for u in UNSUPPORTED if u[1] == "chat" and u[0] in (
    "continue_final_message", "chat_template", "chat_template_kwargs")) + tuple(
    u for u in UNSUPPORTED if u[0] == "tools")


def parse_tokenize(body: Any) -> TokenizeRequest:
    """``POST /tokenize``: ``{"prompt": str}`` (``add_special_tokens`` default true: the BOS, as
    completions add it) or ``{"messages": [...]}`` through the chat template
    (``add_generation_prompt`` default true, ``add_special_tokens`` default false, as vLLM);
    ``return_token_strs`` adds the tokens' vocabulary strings. Raises APIError (400)."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"'model' must be a string, got {model!r}", "model")
    has_prompt, has_msgs = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt and has_msgs:
        raise bad("give 'prompt' (a string) or 'messages' (a chat), not both", "messages")
    if not has_prompt and not has_msgs:
        raise bad("'prompt' (a string) or 'messages' (a chat) is required", "prompt")
    strs = _bool(body, "return_token_strs")
    if has_prompt:
        p = body["prompt"]
        if not isinstance(p, str):
            raise bad(f"'prompt' must be a string, got {_json_type(p)} {shown_json(p)}",
                      "prompt")
        return TokenizeRequest(model, p, None, _bool(body, "add_special_tokens", True),
                               False, strs)
    for key, _, off, allowed in TOKENIZE_UNSUPPORTED:
        v = body.get(key)
        if v is not None and not any(_is_off(v, o) for o in off):
            raise bad(f"{key}={shown_json(v)} is not supported by gpuchef serve "
                      f"(allowed: {allowed})", key)
    return TokenizeRequest(model, None, parse_messages(body["messages"]),
                           _bool(body, "add_special_tokens", False),
                           _bool(body, "add_generation_prompt", True), strs)


def parse_detokenize(body: Any) -> tuple[str | None, list[int]]:
    """``POST /detokenize``: ``(model, tokens)``; ``tokens`` a list of token ids (integers
    >= 0, as vLLM's DetokenizeRequest). Raises APIError (400)."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"'model' must be a string, got {model!r}", "model")
    toks = body.get("tokens")
    if toks is None:
        raise bad("'tokens' is required: a list of token ids", "tokens")
    if not (isinstance(toks, list) and all(_is_int(i) and i >= 0 for i in toks)):
        raise bad(f"'tokens' must be a list of token ids (integers >= 0), got "
                  f"{shown_json(toks)}", "tokens")
    return model, toks


# -- responses ------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(engine_reason: str) -> str | None:
    """An engine finish reason as OpenAI names it ("abort" has no OpenAI name: vLLM says
    "abort" too)."""
    return {"length": "length", "stop": "stop", "abort": "abort"}.get(engine_reason,
                                                                      engine_reason or None)
