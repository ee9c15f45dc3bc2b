"""`gpuchef serve` and the request fields vLLM implements and gpuchef does not: each is refused
with a 400 naming the field, its value and what is allowed, seen through the official openai
client; the "off" values clients send by default stay accepted and change nothing. Also the
wording of the `messages` and context-length errors.

The server is test_serve's module fixture (a `gpuchef serve` subprocess, tiny, CPU).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuchef.serve.protocol import UNSUPPORTED
from test_serve import MAX_MODEL_LEN, client, http, server  # noqa: F401  (server: the fixture)

openai = pytest.importorskip("openai")

MODEL = "tiny-served"
CHAT = [{"role": "user", "content": "hi"}]


def refused(call, **kw) -> dict:
    """The error body of a call the server must refuse with a 400 (via the openai client)."""
    with pytest.raises(openai.BadRequestError) as e:
        call(**kw)
    assert e.value.status_code == 400
    body = e.value.body
    assert set(body) == {"message", "type", "param", "code"}, body
    assert body["type"] == "invalid_request_error"
    return body


def completion_refused(s, **kw) -> dict:
    return refused(client(s).completions.create, model=MODEL, prompt="x", max_tokens=2, **kw)


def chat_refused(s, **kw) -> dict:
    return refused(client(s).chat.completions.create, model=MODEL, messages=CHAT,
                   max_tokens=2, **kw)


def test_logprobs_family_is_refused_and_completions_logprobs_0_is_not_off(server):
    # vLLM: completions' logprobs=0 returns the sampled token's logprob, so 0 is not "off"
    e = completion_refused(server, logprobs=0)
    assert e["param"] == "logprobs"
    assert e["message"] == ("logprobs=0 is not supported by gpuchef serve "
                            "(allowed: absent or null)")
    assert completion_refused(server, logprobs=2)["param"] == "logprobs"
    e = completion_refused(server, extra_body={"prompt_logprobs": 0})
    assert e["param"] == "prompt_logprobs" and "prompt_logprobs=0 " in e["message"]
    # chat: logprobs is a boolean; true with top_logprobs 0 still asks for the sampled one's
    e = chat_refused(server, logprobs=True, top_logprobs=0)
    assert e["param"] == "logprobs"
    assert e["message"] == ("logprobs=true is not supported by gpuchef serve "
                            "(allowed: false or absent)")
    e = chat_refused(server, top_logprobs=3)
    assert e["message"] == ("top_logprobs=3 is not supported by gpuchef serve "
                            "(allowed: 0 or absent)")


@pytest.mark.parametrize("field,value,shown,allowed", [
    ("min_p", 0.1, "0.1", "0 or absent"),
    ("presence_penalty", True, "true", "0 or absent"),  # JSON true is not 0 or 1
    ("logit_bias", {"5": 10}, '{"5": 10}', "{} or absent"),
    ("bad_words", ["noise"], '["noise"]', "[] or absent"),
    ("allowed_token_ids", [1, 2], "[1, 2]", "absent or null"),
    ("allowed_token_ids", [], "[]", "absent or null"),  # vLLM refuses it too
    ("repetition_penalty", 1.2, "1.2", "1 or absent"),
])
def test_sampling_fields_not_implemented_are_refused(server, field, value, shown, allowed):
    for refuse in (completion_refused, chat_refused):
        e = refuse(server, extra_body={field: value})
        assert e["param"] == field
        assert e["message"] == (f"{field}={shown} is not supported by gpuchef serve "
                                f"(allowed: {allowed})")


@pytest.mark.parametrize("field,value", [
    ("guided_json", {"type": "object"}), ("guided_regex", "[a-z]+"),
    ("guided_choice", ["yes", "no"]), ("guided_grammar", 'root ::= "a"'),
    ("guided_decoding_backend", "xgrammar"), ("structured_outputs", {"regex": "[a-z]+"}),
    ("response_format", {"type": "json_object"}),
])
def test_structured_output_fields_are_refused(server, field, value):
    for refuse in (completion_refused, chat_refused):
        e = refuse(server, extra_body={field: value})
        assert e["param"] == field, e
        assert e["message"].startswith(f"{field}=") and "not supported by gpuchef serve" in \
            e["message"], e
    e = chat_refused(server, response_format={"type": "json_object"})
    assert e["message"] == ('response_format={"type": "json_object"} is not supported by '
                            'gpuchef serve (allowed: {"type": "text"} or absent)')


def test_vllm_logits_processor_fields_are_refused(server):
    # vLLM's per-request logits processors (qualified names / constructor specs) and the
    # arguments of custom processors: code gpuchef would have to load, so refused
    for refuse in (completion_refused, chat_refused):
        e = refuse(server, extra_body={"logits_processors": ["my_pkg.Proc"]})
        assert e["param"] == "logits_processors"
        assert e["message"] == ('logits_processors=["my_pkg.Proc"] is not supported by gpuchef '
                                'serve (allowed: [] or absent)')
        e = refuse(server, extra_body={"logits_processors": [{"qualname": "my_pkg.Proc",
                                                              "args": [1]}]})
        assert e["param"] == "logits_processors", e
        e = refuse(server, extra_body={"vllm_xargs": {"target_token": 5}})
        assert e["param"] == "vllm_xargs"
        assert e["message"] == ('vllm_xargs={"target_token": 5} is not supported by gpuchef '
                                'serve (allowed: {} or absent)')


def test_prompt_and_detokenisation_fields_are_refused(server):
    e = completion_refused(server, extra_body={"truncate_prompt_tokens": 4})
    assert e["param"] == "truncate_prompt_tokens"
    assert e["message"] == ("truncate_prompt_tokens=4 is not supported by gpuchef serve "
                            "(allowed: absent or null)")
    e = chat_refused(server, extra_body={"skip_special_tokens": False})
    assert e["message"] == ("skip_special_tokens=false is not supported by gpuchef serve "
                            "(allowed: true or absent)")


def test_prompt_building_fields_are_refused(server):
    # the chat prompt is the model folder's template with the generation prompt, no BOS added
    for field, value, shown in [("add_generation_prompt", False, "false"),
                                ("continue_final_message", True, "true"),
                                ("chat_template", "{{ messages }}", '"{{ messages }}"'),
                                ("chat_template_kwargs", {"enable_thinking": False},
                                 '{"enable_thinking": false}'),
                                ("add_special_tokens", True, "true")]:
        e = chat_refused(server, extra_body={field: value})
        assert e["param"] == field and e["message"].startswith(
            f"{field}={shown} is not supported by gpuchef serve (allowed: "), e
    e = completion_refused(server, extra_body={"add_special_tokens": False})
    assert e["message"] == ("add_special_tokens=false is not supported by gpuchef serve "
                            "(allowed: true or absent)")
    for field, value in [("priority", 1), ("length_penalty", 0.5),
                         ("guided_whitespace_pattern", " ")]:
        assert completion_refused(server, extra_body={field: value})["param"] == field


#: the "off" value of every refused field, as clients send them by default
OFF_COMMON = {"min_p": 0, "skip_special_tokens": True, "bad_words": [],
              "logit_bias": {}, "top_logprobs": 0, "prompt_logprobs": None,
              "allowed_token_ids": None, "truncate_prompt_tokens": None, "guided_json": None,
              "guided_regex": None, "guided_choice": None, "guided_grammar": None,
              "guided_decoding_backend": None, "structured_outputs": None,
              "response_format": {"type": "text"}, "presence_penalty": 0.0,
              "frequency_penalty": 0, "repetition_penalty": 1.0, "best_of": 1, "echo": False,
              "use_beam_search": False, "tools": [], "stop_token_ids": [], "priority": 0,
              "length_penalty": 1.0, "guided_whitespace_pattern": None,
              "logits_processors": [], "vllm_xargs": {}}
OFF_CHAT = {"add_special_tokens": False, "add_generation_prompt": True,
            "continue_final_message": False, "chat_template": None, "chat_template_kwargs": {}}


def test_defaults_are_accepted_and_change_nothing(server):
    c = client(server)
    base = dict(model=MODEL, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    ref = c.completions.create(prompt="the knob", **base)
    r = c.completions.create(prompt="the knob", logprobs=None, **{
        **base, "extra_body": {**OFF_COMMON, "add_special_tokens": True, "ignore_eos": True}})
    assert r.choices[0].text == ref.choices[0].text and r.usage.completion_tokens == 6
    ref = c.chat.completions.create(messages=CHAT, **base)
    r = c.chat.completions.create(messages=CHAT, logprobs=False, top_logprobs=0,
                                  response_format={"type": "text"}, logit_bias={},
                                  **{**base, "extra_body": {**OFF_COMMON, **OFF_CHAT,
                                                            "ignore_eos": True}})
    assert r.choices[0].message.content == ref.choices[0].message.content
    assert r.usage.completion_tokens == 6
    # null for every field, as some clients write "not set"
    st, body = http("POST", server.url + "/v1/completions",
                    {"prompt": "x", "max_tokens": 1, **dict.fromkeys(OFF_COMMON),
                     "logprobs": None})
    assert st == 200, body


@pytest.mark.parametrize("messages,words", [
    ("hi", "'messages' must be a list of {\"role\", \"content\"} objects, got a string \"hi\""),
    ({"role": "user", "content": "hi"}, "got an object {\"role\": \"user\""),
    (3, "got a number 3"),
    ([], "'messages' is empty"),
    (None, "'messages' is required"),
])
def test_messages_of_the_wrong_type_say_what_was_given(server, messages, words):
    body = {"max_tokens": 2} if messages is None else {"messages": messages, "max_tokens": 2}
    st, resp = http("POST", server.url + "/v1/chat/completions", body)
    assert st == 400 and resp["error"]["param"] == "messages", resp
    assert words in resp["error"]["message"], resp


def test_context_length_errors_name_the_tokens_that_were_asked(server):
    # chat with no token count: it gets what the context leaves, and a full context leaves none
    st, resp = http("POST", server.url + "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "word " * 600}]})
    err = resp["error"]
    assert st == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert "in the completion" not in err["message"], err
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err["message"]
    assert "which leaves no room for a completion (it needs at least 1 token)" in err["message"]
    # completions' default max_tokens (16) is named as the default
    st, resp = http("POST", server.url + "/v1/completions", {"prompt": [1] * 500})
    err = resp["error"]
    assert st == 400 and err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    assert "requested 516 tokens (500 in the prompt, 16 in the completion: the default " \
           "max_tokens)" in err["message"], err
    # a count the client gave is named as given
    st, resp = http("POST", server.url + "/v1/completions", {"prompt": [1] * 500,
                                                              "max_tokens": 20})
    assert "(500 in the prompt, 20 in the completion)" in resp["error"]["message"], resp


def test_docs_table_lists_the_fields_refused():
    """docs/serve.md's table of refused fields names exactly protocol.UNSUPPORTED's."""
    doc = (Path(__file__).resolve().parents[2] / "docs/serve.md").read_text()
    table = doc[doc.index("  | field | accepted |"):doc.index("  A JSON `true` is not `1`")]
    listed = set()
    for row in table.splitlines()[2:]:
        if not row.strip():
            continue
        first = row.split("|")[1]
        listed |= set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", first)))
    assert listed == {f for f, *_ in UNSUPPORTED}


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
