"""``SamplingParams.min_tokens`` as vLLM implements it: until a request has ``min_tokens``
output tokens its EOS ids and ``stop_token_ids`` are masked out of the logits (vLLM's
``MinTokensLogitsProcessor``), then it stops as usual.

The reference is Hugging Face transformers' ``generate(min_new_tokens=...)`` on the same weights
(its ``MinNewTokensLengthLogitsProcessor`` is the same rule: mask the EOS ids while fewer than
``min_new_tokens`` tokens are new), float64 on CPU. The stop ids are picked from the greedy
outputs so that the mask matters: a request whose first greedy token is EOS, and requests whose
stop id is their greedy token at exactly ``min_tokens`` (allowed there) or ``min_tokens - 1``
(masked there). With async scheduling the token is sampled while the previous step's is still in
flight, so an off-by-one count there changes these outputs."""

from __future__ import annotations

import pytest
import torch

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import SchedulerConfig
from gpuchef.engine_host.request import PLACEHOLDER_TOKEN, Request, SamplingParams
from gpuchef.engine_host.sampling import sample_tensor

# the tiny Llama (transformers, float64) and its prompts: test_engine_greedy's fixtures
from test_engine_greedy import hf_folder, prompts  # noqa: F401
from test_engine_async import run_real

M = 12  # max_tokens of every request here
MODEL_EOS = 2  # the tiny Llama's config.json / generation_config.json eos_token_id


def hf_generate(model, ids, min_new, eos_ids):
    """transformers' greedy output (at most M tokens) stopping at ``eos_ids`` (None: never)."""
    x = torch.tensor([ids])
    with torch.no_grad():
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=M,
                           min_new_tokens=min_new, do_sample=False,
                           eos_token_id=None if eos_ids is None else list(eos_ids),
                           pad_token_id=0)
    return y[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def free(hf_folder, prompts):  # noqa: F811
    """Each prompt's greedy continuation with no stop at all (M tokens)."""
    return [hf_generate(hf_folder[1], ids, M, None) for ids in prompts]


@pytest.fixture(scope="module")
def cases(hf_folder, prompts, free):  # noqa: F811
    """(prompt index, stop_token_ids, min_tokens, transformers' output) for the engine runs; the
    model's EOS is 2 here (the stop ids hit before it)."""
    out = []
    for i, seq in enumerate(free):
        # the first token that is new in the sequence from index 2 on: its stop id
        k = next(k for k in range(2, M - 2) if seq[k] not in seq[:k] and seq[k] != MODEL_EOS)
        stop = seq[k]
        for m in (k, k + 1, 0):  # allowed right at k; masked at k; no min_tokens
            ref = hf_generate(hf_folder[1], prompts[i], m, (MODEL_EOS, stop))
            out.append((i, (stop,), m, ref))
        assert out[-3][3] == seq[:k + 1] and out[-1][3] == seq[:k + 1]  # stops at k
        assert out[-2][3] != seq[:k + 1] and stop not in out[-2][3][:k + 1]
    return out


def outputs(folder, prompts, cases, async_on, eos=None):  # noqa: F811
    sp = [SamplingParams(max_tokens=M, stop_token_ids=stop, min_tokens=m)
          for _, stop, m, _ in cases]
    got, _ = run_real(folder, [prompts[i] for i, *_ in cases],
                      [SchedulerConfig(mode="chunked", max_num_batched_tokens=16)], async_on,
                      arrival_steps=[j // 3 for j in range(len(cases))], eos=eos,
                      sampling=lambda j: sp[j])
    return [got[f"r{j}"] for j in range(len(cases))]


@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
def test_min_tokens_masks_stop_ids_until_reached_as_transformers(hf_folder, prompts, cases,  # noqa: F811
                                                                 async_on):
    got = outputs(hf_folder[0], prompts, cases, async_on)
    for (i, stop, m, ref), (toks, reason) in zip(cases, got):
        assert toks == ref, (i, stop, m)
        assert reason == ("stop" if len(toks) < M else "length"), (i, m, reason)
        assert not set(toks[:m]) & {MODEL_EOS, *stop}


@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
def test_min_tokens_masks_the_model_eos_that_is_the_first_greedy_token(hf_folder, prompts, free,  # noqa: F811
                                                                        async_on):
    eos = free[0][0]  # prompt 0's greedy output would be [eos] alone
    cases = [(0, (), m, hf_generate(hf_folder[1], prompts[0], m, (eos,))) for m in (0, 1, 4)]
    assert cases[0][3] == [eos] and len(cases[1][3]) > 1
    got = outputs(hf_folder[0], prompts, cases, async_on, eos=eos)
    assert [toks for toks, _ in got] == [ref for *_, ref in cases]
    assert got[0][1] == "stop"


def _req(rid, outputs, min_tokens, stop_ids, ignore_eos=False):
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=8, min_tokens=min_tokens,
                                               ignore_eos=ignore_eos), 0)
    r.output_token_ids = list(outputs)
    r.min_tokens_stop_ids = stop_ids
    return r


def test_mask_counts_in_flight_placeholders_and_ignores_eos_flag():
    # logits favour token 5 (a stop id) in every row
    logits = torch.zeros(4, 10, dtype=torch.float64)
    logits[:, 5] = 3.0
    logits[:, 7] = 2.0
    reqs = [_req("a", [4], 3, (5,)),  # 1 output < 3: masked
            _req("b", [4, PLACEHOLDER_TOKEN, PLACEHOLDER_TOKEN], 3, (5,)),  # 3 with in-flight ones
            _req("c", [], 1, (5, 7), ignore_eos=True),  # vLLM masks all_stop_token_ids anyway
            _req("d", [4], 0, ())]
    assert sample_tensor(logits.clone(), reqs).tolist() == [7, 5, 0, 5]


def test_min_tokens_must_be_between_0_and_max_tokens():
    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4
    with pytest.raises(ConfigError, match=r"^min_tokens=5 must be less than or equal to "
                                          r"max_tokens=4: allowed 0 to 4$"):
        SamplingParams(max_tokens=4, min_tokens=5)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match=r"^min_tokens=.* must be an integer >= 0"):
            SamplingParams(max_tokens=4, min_tokens=bad)


def test_every_sampling_field_goes_to_vllm_under_its_name():
    """With --engine vllm the request's SamplingParams become vLLM's: each field of gpuchef's
    (min_tokens among them) is passed under the name vLLM's SamplingParams takes."""
    import dataclasses

    from gpuchef.engine_host.vllm_mapping import vllm_sampling_kwargs

    sp = SamplingParams(max_tokens=9, temperature=0.5, top_p=0.9, top_k=7, seed=11,
                        ignore_eos=True, stop_token_ids=(3, 4), min_tokens=5)
    kw = vllm_sampling_kwargs(sp)
    for f in dataclasses.fields(SamplingParams):
        v = getattr(sp, f.name)
        assert kw[f.name] == (list(v) if isinstance(v, tuple) else v), f.name
    assert kw["n"] == 1 and kw["detokenize"] is False
    assert vllm_sampling_kwargs(SamplingParams())["stop_token_ids"] is None
