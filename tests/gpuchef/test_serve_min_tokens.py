"""`gpuchef serve` and vLLM's ``min_tokens`` extra, sent as users send it (the openai client's
``extra_body``): the EOS id and ``stop_token_ids`` are masked until the request has that many
output tokens, stop strings do not end it before them, and bad values are a 400 naming the
field and what is allowed.

References: Hugging Face transformers' ``generate(min_new_tokens=...)`` on a tiny Llama folder
whose ``eos_token_id`` is the greedy first token of the prompt (so without ``min_tokens`` the
answer is that one token), and, for stop strings, the rule of vLLM's detokenizer
(vllm/v1/engine/detokenizer.py: the stop check starts after the text of the first
``min_tokens`` tokens) applied to the unmasked greedy text.
"""

from __future__ import annotations

import pytest
import torch

from serve_proc import ServeProc
from test_serve import (MAX_MODEL_LEN, TOK, client, engine_greedy, http,  # noqa: F401
                        server)  # (server: fixture)
from gpuchef.engine_host.tokenizer import BUNDLED_PATH
from gpuchef.probes.recorder import read_trace

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

PROMPT = [5, 17, 29, 41, 53]
M = 10  # max_tokens


@pytest.fixture(scope="module")
def eos_folder(tmp_path_factory):
    """A tiny Llama folder (transformers) whose EOS is its greedy first token after PROMPT, and
    the float64 model for the reference."""
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


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
