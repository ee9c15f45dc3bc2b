"""`gpuchef serve` driven as a load-tool user drives it, the inputs that were accepted silently
or refused with a message that did not say enough: chat's ``tool_choice`` asking for tools
(vLLM refuses it without ``tools``; gpuchef has none), a nested ``stream_options`` field of the
wrong type (named by its path), and a ``prompt`` list of the wrong kind (named by its value).
Seen through the official openai client; after each refusal the server goes on serving.

The server is test_serve's module fixture (a `gpuchef serve` subprocess, tiny, CPU).
"""

from __future__ import annotations

import json

import pytest

from test_serve import client, http, server  # noqa: F401  (server: the fixture)
from test_serve_fields import CHAT, MODEL, refused

openai = pytest.importorskip("openai")


def still_serves(s) -> None:
    r = client(s).completions.create(model=MODEL, prompt=[1, 2], max_tokens=2,
                                     extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize("tool_choice,shown", [
    ("auto", '"auto"'), ("required", '"required"'),
    ({"type": "function", "function": {"name": "get_weather"}},
     '{"type": "function", "function": {"name": "get_weather"}}'),
])
def test_chat_tool_choice_asking_for_tools_is_refused(server, tool_choice, shown):
    c = client(server)
    body = refused(c.chat.completions.create, model=MODEL, messages=CHAT, max_tokens=2,
                   tool_choice=tool_choice)
    assert body["param"] == "tool_choice", body
    assert body["message"] == (f"tool_choice={shown} is not supported by gpuchef serve "
                               '(allowed: "none" or absent: gpuchef serve has no tool calling)')
    # with tools=[] too (the off value of tools)
    body = refused(c.chat.completions.create, model=MODEL, messages=CHAT, max_tokens=2,
                   tools=[], tool_choice=tool_choice)
    assert body["param"] == "tool_choice", body
    still_serves(server)


def test_chat_tool_choice_none_is_accepted_and_completions_ignore_it(server):
    c = client(server)
    r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, tool_choice="none",
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2
    # not a completions field (vLLM's CompletionRequest has none): ignored there, as others
    r = c.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2,
                             extra_body={"tool_choice": "auto", "ignore_eos": True})
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize("key", ["include_usage", "continuous_usage_stats"])
def test_stream_options_fields_are_named_by_their_path(server, key):
    so = {"include_usage": True, key: "yes"}
    body = refused(client(server).completions.create, model=MODEL, prompt="x", max_tokens=2,
                   stream=True, stream_options=so)
    assert body["param"] == f"stream_options.{key}", body
    assert body["message"] == f"'stream_options.{key}' must be true or false, got \"yes\""
    still_serves(server)


@pytest.mark.parametrize("prompt,shown", [
    ([1.5, 2.0], "an array [1.5, 2.0]"),
    (["a", [1, 2]], 'an array ["a", [1, 2]]'),
    ([{"text": "a"}], 'an array [{"text": "a"}]'),
    (5, "a number 5"),
])
def test_a_prompt_of_the_wrong_kind_is_named_by_its_value(server, prompt, shown):
    st, resp = http("POST", server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert st == 400 and resp["error"]["param"] == "prompt", resp
    assert resp["error"]["message"] == (
        "'prompt' must be a string, a list of token ids (integers), or a list of strings or "
        f"of token-id lists, got {shown}")
    still_serves(server)


def test_a_batch_error_names_the_prompt_at_fault(server):
    """In a batch of prompts, the refused one is named by its index (its choice's index)."""
    c = client(server)
    body = refused(c.completions.create, model=MODEL, prompt=[[1, 2], [3, 99999]],
                   max_tokens=2)
    assert body["param"] == "prompt"
    assert body["message"] == "'prompt[1]' token id 99999 is outside the vocabulary [0, 4096)"
    body = refused(c.completions.create, model=MODEL, prompt=[[1, 2], [3] * 500, [4]],
                   max_tokens=20)
    assert body["param"] == "max_tokens" and body["code"] == "context_length_exceeded"
    assert "However, you requested 520 tokens (500 in prompt[1] of the batch, 20 in the " \
           "completion)" in body["message"], body
    # one prompt alone: as before, and as vLLM words it
    body = refused(c.completions.create, model=MODEL, prompt=[3, 99999], max_tokens=2)
    assert body["message"] == "'prompt' token id 99999 is outside the vocabulary [0, 4096)"
    still_serves(server)


@pytest.mark.parametrize("value", [0, False, "", {}])
def test_stop_token_ids_of_the_wrong_type_are_refused_not_taken_as_none(server, value):
    """A falsy non-list (0, false, "", {}) was taken as "no stop tokens"."""
    st, resp = http("POST", server.url + "/v1/completions",
                    {"model": MODEL, "prompt": [1, 2], "max_tokens": 2, "stop_token_ids": value})
    assert st == 400 and resp["error"]["param"] == "stop_token_ids", resp
    assert resp["error"]["message"] == ("'stop_token_ids' must be a list of token ids (integers "
                                        f">= 0), got {json.dumps(value)}")


def test_integral_floats_are_integers_for_seed_and_top_k_as_for_max_tokens(server):
    """pydantic's lax int in vLLM takes 7.0 for an integer field; gpuchef took it for
    max_tokens, min_tokens and n but refused it for seed and top_k."""
    c = client(server)
    kw = dict(model=MODEL, prompt=[9, 8, 7], max_tokens=8, temperature=1.0)
    want = c.completions.create(seed=7, extra_body={"top_k": 5, "ignore_eos": True}, **kw)
    got = c.completions.create(seed=7.0, extra_body={"top_k": 5.0, "ignore_eos": True}, **kw)
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.completion_tokens == 8
    body = refused(c.completions.create, seed=7.5, **kw)
    assert body["param"] == "seed" and body["message"] == "'seed' must be an integer, got 7.5"
    body = refused(c.completions.create, extra_body={"top_k": 2.5}, **kw)
    assert body["param"] == "top_k" and body["message"] == "'top_k' must be an integer, got 2.5"


@pytest.mark.parametrize("path,method", [("/v1/completions", "POST"),
                                         ("/v1/chat/completions", "POST"),
                                         ("/gpuchef/v1/scheduler", "PATCH")])
@pytest.mark.parametrize("raw", [b"", b"  \n"])
def test_an_empty_body_says_it_is_empty(server, path, method, raw):
    st, resp = http(method, server.url + path, raw=raw)
    assert st == 400, resp
    assert resp["error"]["message"] == ("the request body is empty: send a JSON object "
                                        "(Content-Type: application/json)")
    still_serves(server)


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
