"""`gpuchef serve`'s request bodies (gpuchef.serve.protocol), seen through the official openai
client against test_serve's module fixture (a `gpuchef serve` subprocess, tiny, CPU):

* the fields vLLM implements and gpuchef does not: each refused with a 400 naming the field, its
  value and what is allowed; the "off" values clients send by default — also as clients that
  write out every field send them (`n` 1.0, `response_format` `{"type": "text"}` with its other
  keys null) — stay accepted and change nothing; the wording of the `messages` and
  context-length errors;
* inputs once accepted silently or refused with a message that did not say enough: chat's
  ``tool_choice`` asking for tools, a nested ``stream_options`` field of the wrong type (named by
  its path), a ``prompt`` list of the wrong kind (named by its value); after each refusal the
  server goes on serving;
* vLLM's ``min_tokens`` extra (``extra_body``): the EOS id and ``stop_token_ids`` are masked until
  the request has that many output tokens, stop strings do not end it before them, and bad values
  are a 400 naming the field and what is allowed. References: Hugging Face transformers'
  ``generate(min_new_tokens=...)`` on a tiny Llama folder whose ``eos_token_id`` is the greedy
  first token of the prompt (so without ``min_tokens`` the answer is that one token), and, for
  stop strings, the rule of vLLM's detokenizer (vllm/v1/engine/detokenizer.py: the stop check
  starts after the text of the first ``min_tokens`` tokens) applied to the unmasked greedy text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from serve_proc import ServeProc
from test_serve import (MAX_MODEL_LEN, TOK, client, engine_greedy, http,  # noqa: F401
                        server)  # (server: the fixture)
from gpuchef.engine_host.vocab.tokenizer import BUNDLED_PATH
from gpuchef.probes.recorder import read_trace
from gpuchef.serve.protocol import UNSUPPORTED

openai = pytest.importorskip("openai")

MODEL = "tiny-served"
CHAT = [{"role": "user", "content": "hi"}]


# ---- fields gpuchef does not implement; the off values -------------------------------------------

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


# ---- off values as clients that write out every field send them ----------------------------------

def test_n_as_an_integral_float_is_one_choice_and_two_is_still_refused(server):
    st, body = http("POST", server.url + "/v1/completions",
                    {"prompt": "x", "max_tokens": 2, "n": 1.0, "ignore_eos": True})
    assert st == 200, body
    assert len(body["choices"]) == 1 and body["usage"]["completion_tokens"] == 2
    for n in (2.0, 1.5, True):
        st, body = http("POST", server.url + "/v1/completions",
                        {"prompt": "x", "max_tokens": 2, "n": n})
        assert st == 400 and body["error"]["param"] == "n", (n, body)
        assert "allowed n=1" in body["error"]["message"]


def test_response_format_text_with_null_keys_is_off(server):
    c = client(server)
    r = c.chat.completions.create(model="tiny-served", messages=CHAT, max_tokens=3,
                                  response_format={"type": "text", "json_schema": None},
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    for rf in ({"type": "json_object", "json_schema": None},
               {"type": "text", "json_schema": {"name": "x", "schema": {}}}):
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny-served", messages=CHAT, max_tokens=3,
                                      response_format=rf)
        assert e.value.body["param"] == "response_format", e.value.body
        assert "is not supported by gpuchef serve" in e.value.body["message"]


# ---- inputs refused with a message that names what was wrong -------------------------------------

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


# ---- min_tokens ----------------------------------------------------------------------------------

PROMPT = [5, 17, 29, 41, 53]
M = 10  # max_tokens


@pytest.fixture(scope="module")
def eos_folder(tmp_path_factory):
    """A tiny Llama folder (transformers) whose EOS is its greedy first token after PROMPT, and
    the float64 model for the reference."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(  # the bundled tokenizer's vocabulary, for --tokenizer
        vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    cfg.initializer_range = 0.2  # weights far from uniform logits: no near-ties in greedy
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(cfg).eval().to(torch.float64)
    with torch.no_grad():
        eos = int(model(torch.tensor([PROMPT])).logits[0, -1].argmax())
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    path = tmp_path_factory.mktemp("eos-llama")
    model.save_pretrained(path, safe_serialization=True)
    return path, model, eos


def hf_generate(model, eos, min_new):
    x = torch.tensor([PROMPT])
    with torch.no_grad():
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=M,
                           min_new_tokens=min_new, do_sample=False, eos_token_id=eos,
                           pad_token_id=0)
    return y[0, len(PROMPT):].tolist()


def test_min_tokens_through_the_openai_client_equals_transformers(eos_folder, tmp_path):
    folder, model, eos = eos_folder
    refs = {m: hf_generate(model, eos, m) for m in (0, 1, 3, M)}
    assert refs[0] == [eos] and len(refs[3]) > 3  # the mask must matter
    trace = tmp_path / "t.jsonl"
    with ServeProc("--dtype", "float64", "--trace", str(trace), "--trace-prompts",
                   "--tokenizer", str(BUNDLED_PATH), model=str(folder)) as s:
        c = client(s)
        got = {}
        for m in refs:
            extra = {"min_tokens": m} if m else {}
            r = c.completions.create(model=str(folder), prompt=PROMPT, max_tokens=M,
                                     temperature=0, extra_body=extra)
            ch = r.choices[0]
            got[m] = (r.usage.completion_tokens, ch.finish_reason)
        # an integral float, as for max_tokens (pydantic's lax int in vLLM takes it)
        r = c.completions.create(model=str(folder), prompt=PROMPT, max_tokens=M, temperature=0,
                                 extra_body={"min_tokens": 3.0})
        assert r.usage.completion_tokens == len(refs[3])
    reqs = read_trace(trace).requests
    ids = [list(q.output_token_ids) for q in reqs]
    assert ids == [refs[m] for m in refs] + [refs[3]]
    for m, ref in refs.items():
        assert got[m] == (len(ref), "stop" if len(ref) < M else "length"), m


def test_min_tokens_bad_values_are_400s_naming_the_field(server):  # noqa: F811
    c = client(server)

    def refused(**extra):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="tiny-served", prompt=[10, 11], max_tokens=3,
                                 extra_body=extra)
        body = e.value.body
        assert e.value.status_code == 400 and body["param"] == "min_tokens", body
        return body["message"]

    assert refused(min_tokens=4) == ("min_tokens=4 must be less than or equal to "
                                     "max_tokens=3: allowed 0 to 3")
    assert refused(min_tokens=-1) == "'min_tokens' = -1 must be >= 0"
    assert refused(min_tokens="2") == "'min_tokens' must be an integer, got '2'"
    assert refused(min_tokens=1.5) == "'min_tokens' must be an integer, got 1.5"
    assert refused(min_tokens=True) == "'min_tokens' must be an integer, got True"
    # the message names where the limit came from: the field given, completions' default
    # (16, OpenAI's), or what the context leaves a chat request that gave no token count
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny-served", prompt=[10, 11], extra_body={"min_tokens": 17})
    assert e.value.body["param"] == "min_tokens"
    assert e.value.body["message"] == (
        "min_tokens=17 must be less than or equal to max_tokens=16 (the default when "
        "max_tokens is not given): allowed 0 to 16")
    msgs = [{"role": "user", "content": "hi"}]
    n_prompt = c.chat.completions.create(model="tiny-served", messages=msgs,
                                         max_tokens=1).usage.prompt_tokens
    left = MAX_MODEL_LEN - n_prompt
    for kw, limit in (({"max_completion_tokens": 3}, "max_completion_tokens=3"),
                      ({"max_completion_tokens": 3, "max_tokens": 10}, "max_completion_tokens=3"),
                      ({"max_tokens": 3}, "max_tokens=3"),
                      ({}, f"the {left} tokens the context leaves for the completion "
                           f"(max_model_len {MAX_MODEL_LEN} - {n_prompt} tokens in the messages; "
                           "no max_tokens or max_completion_tokens was given)")):
        m = 5 if kw else 10 ** 6
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny-served", messages=msgs, **kw,
                                      extra_body={"min_tokens": m})
        bound = kw.get("max_completion_tokens", kw.get("max_tokens", left))
        assert e.value.status_code == 400 and e.value.body["param"] == "min_tokens", kw
        assert e.value.body["message"] == (f"min_tokens={m} must be less than or equal to "
                                           f"{limit}: allowed 0 to {bound}"), kw
    # null and 0 are "off"
    for v in (None, 0):
        r = c.completions.create(model="tiny-served", prompt=[10, 11], max_tokens=2,
                                 extra_body={"min_tokens": v, "ignore_eos": True})
        assert r.usage.completion_tokens == 2


def _stop_cases(full: str, pre: list[str], n: int):
    """Stop strings (1-2 characters) found in the text of the first ``n`` tokens, the nearest
    its end first: one that occurs again ending after it, one that does not."""
    p = pre[n]
    again = never = None
    for a in reversed(range(len(p))):
        for x in (p[a:a + 2], p[a]):
            if not x.strip() or "\ufffd" in x:
                continue
            j = full.find(x, len(p) - len(x) + 1)
            if j >= 0 and again is None and full.find(x) < len(p) - len(x) + 1:
                again = (x, j)
            if j < 0 and never is None:
                never = x
    return again, never


def test_stop_strings_do_not_end_a_request_before_min_tokens(server):  # noqa: F811
    ids = [60, 61, 62, 63]
    ref = engine_greedy(ids, 40)
    pre = [TOK.decode(ref[:i]) for i in range(41)]
    full = pre[40]
    n = next(i for i in range(4, 12) if full.startswith(pre[i]) and "\ufffd" not in pre[i]
             and _stop_cases(full, pre, i)[0] is not None)
    (x, j), never = _stop_cases(full, pre, n)
    # a longer stop string that never occurs: the search for the others reaches back its
    # length, and must still not reach into the first n tokens' text
    decoy = "~" * 12
    assert decoy not in full
    c = client(server)
    kw = dict(model="tiny-served", prompt=ids, max_tokens=40, temperature=0, stop=[x, decoy])
    r = c.completions.create(**kw, extra_body={"ignore_eos": True})
    assert r.choices[0].text == full[:full.index(x)]  # without min_tokens: found in them
    r = c.completions.create(**kw, extra_body={"ignore_eos": True, "min_tokens": n})
    assert (r.choices[0].text, r.choices[0].finish_reason) == (full[:j], "stop"), (x, n)
    streamed = c.completions.create(**kw, stream=True,
                                    extra_body={"ignore_eos": True, "min_tokens": n})
    assert "".join(ch.choices[0].text for ch in streamed) == full[:j]
    if never is not None:  # only in the first n tokens' text: it never ends the request
        r = c.completions.create(**{**kw, "stop": [never, decoy]},
                                 extra_body={"ignore_eos": True, "min_tokens": n})
        assert (r.choices[0].text, r.choices[0].finish_reason) == (full, "length")


#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
