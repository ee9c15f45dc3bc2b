"""Our model's logits against Hugging Face transformers' on the same random weights.

Each case builds a small transformers model, randomises every tensor (biases and norm weights
too, so that loading them is tested), saves it with ``save_pretrained`` (safetensors), loads it
with our loader, and runs several prompts of different lengths as ONE flat batch over a paged
KV cache with scattered pages: a prefill in two chunks (the second chunk sees earlier KV), then
one decode token per prompt. Every row's logits must match transformers' within 1e-4 (float32).
"""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")

from gpuchef.engine_host.attention import AttentionMetadata, ReferenceAttention  # noqa: E402
from gpuchef.engine_host.loader import load_model  # noqa: E402
from paged_meta_ref import build_meta as _build_meta  # noqa: E402

BLOCK_SIZE = 4
NUM_BLOCKS = 64
TOL = 1e-4

_BASE = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, rope_theta=10000.0, eos_token_id=2)

CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama-mha-bias": ("LlamaConfig", "LlamaForCausalLM",
                       dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True)),
    "llama-head-dim": ("LlamaConfig", "LlamaForCausalLM", dict(head_dim=32)),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
    "llama-3.1-rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=64))),
    "llama-linear-rope": ("LlamaConfig", "LlamaForCausalLM",
                          dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1000000.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
}


def _hf_model(case: str, seed: int = 0):
    cfg_cls, model_cls, over = CASES[case]
    cfg = getattr(transformers, cfg_cls)(**{**_BASE, **over})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    # Randomise everything, biases and norm weights included, at a scale that makes the
    # activations O(1) so that a wrong op shows up well above the tolerance.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    return model


def _save(model, path, **kw):
    model.save_pretrained(path, safe_serialization=True, **kw)
    return path


def build_meta(reqs, device="cpu") -> AttentionMetadata:
    return _build_meta(reqs, BLOCK_SIZE, device)


def run_step(model, attn, kv_caches, reqs, tokens):
    """tokens: per request, the new token ids. Returns logits [T, V]."""
    meta = build_meta(reqs)
    attn.begin_step(meta)
    ids = torch.tensor([t for ts in tokens for t in ts], dtype=torch.int64)
    hidden = model(ids, meta.positions, kv_caches, attn)
    return model.compute_logits(hidden)


def scattered_pages(num_reqs: int, per_req: int, seed: int = 0) -> list[list[int]]:
    ids = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(ids)  # distinct, non-contiguous, out of order
    return [ids[i * per_req:(i + 1) * per_req] for i in range(num_reqs)]


def compare_with_hf(hf, ours, lens=(5, 12, 1, 8, 17), seed=0):
    cfg = ours.config
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in lens]
    nxt = torch.randint(0, cfg.vocab_size, (len(lens),), generator=g).tolist()
    kv_caches = [torch.zeros(NUM_BLOCKS, 2, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
                 for _ in range(cfg.num_hidden_layers)]
    pages = scattered_pages(len(lens), 8, seed)
    attn = ReferenceAttention()

    with torch.no_grad():
        ref = [hf(torch.tensor([p + [t]])).logits[0] for p, t in zip(prompts, nxt)]

        # Prefill in two chunks: the first half of each prompt, then the rest (which must see
        # the first chunk's KV through the pages).
        cut = [n // 2 for n in lens]
        first = [(pg, 0, c) for pg, c in zip(pages, cut) if c > 0]
        got1 = run_step(ours, attn, kv_caches, first, [p[:c] for p, c in zip(prompts, cut) if c])
        second = [(pg, c, n - c) for pg, c, n in zip(pages, cut, lens)]
        got2 = run_step(ours, attn, kv_caches, second, [p[c:] for p, c in zip(prompts, cut)])
        # Decode: one token per prompt, all requests are decodes.
        dec = [(pg, n, 1) for pg, n in zip(pages, lens)]
        got3 = run_step(ours, attn, kv_caches, dec, [[t] for t in nxt])

    assert got1.dtype == torch.float32 and got3.shape == (len(lens), cfg.vocab_size)
    want1 = torch.cat([r[:c] for r, c in zip(ref, cut) if c])
    want2 = torch.cat([r[c:n] for r, c, n in zip(ref, cut, lens)])
    want3 = torch.stack([r[n] for r, n in zip(ref, lens)])
    for got, want in ((got1, want1), (got2, want2), (got3, want3)):
        assert got.shape == want.shape
        err = (got - want).abs().max().item()
        assert err <= TOL, f"max abs diff {err:.3g} > {TOL}"
    # The comparison means something: logits are O(1) and differ between rows.
    assert want3.abs().max() > 0.5


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case, tmp_path):
    hf = _hf_model(case)
    loaded = load_model(str(_save(hf, tmp_path)), dtype=torch.float32, device="cpu")
    assert not loaded.random_weights and loaded.source == str(tmp_path.resolve())
    assert loaded.num_params == sum(p.numel() for p in hf.parameters())
    assert loaded.num_params == loaded.config.num_params()
    compare_with_hf(hf, loaded.model)


def test_tied_checkpoint_has_no_lm_head(tmp_path):
    from safetensors import safe_open

    hf = _hf_model("llama-tied")
    _save(hf, tmp_path)
    (f,) = tmp_path.glob("*.safetensors")
    with safe_open(str(f), "pt") as h:
        assert "lm_head.weight" not in set(h.keys())
    loaded = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    assert loaded.model.lm_head is None and loaded.config.tie_word_embeddings


def test_sharded_llama31_checkpoint(tmp_path):
    hf = _hf_model("llama-3.1-rope", seed=3)
    _save(hf, tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and len(list(tmp_path.glob("*.safetensors"))) == len(shards)
    calls = []
    loaded = load_model(str(tmp_path), dtype=torch.float32, device="cpu",
                        progress=lambda s, d, t: calls.append((s, d, t)))
    assert calls and calls[-1][1] == calls[-1][2] == len(index["weight_map"])
    assert loaded.config.rope_scaling["rope_type"] == "llama3"
    compare_with_hf(hf, loaded.model, lens=(3, 20, 9), seed=1)


def test_mixed_decode_and_prefill_step(tmp_path):
    """Decodes first, then prefill chunks, in one step — the layout the chunked scheduler uses."""
    hf = _hf_model("qwen2", seed=5)
    model = load_model(str(_save(hf, tmp_path)), dtype=torch.float32, device="cpu").model
    cfg = model.config
    g = torch.Generator().manual_seed(7)
    a = torch.randint(0, cfg.vocab_size, (10,), generator=g).tolist()  # decoding request
    b = torch.randint(0, cfg.vocab_size, (14,), generator=g).tolist()  # chunked prompt
    kv = [torch.zeros(NUM_BLOCKS, 2, BLOCK_SIZE, cfg.num_key_value_heads, cfg.head_dim)
          for _ in range(cfg.num_hidden_layers)]
    pa, pb = scattered_pages(2, 8, seed=2)
    attn = ReferenceAttention()
    with torch.no_grad():
        run_step(model, attn, kv, [(pa, 0, 9), (pb, 0, 6)], [a[:9], b[:6]])
        got = run_step(model, attn, kv, [(pa, 9, 1), (pb, 6, 8)], [a[9:], b[6:]])
        ra = hf(torch.tensor([a])).logits[0]
        rb = hf(torch.tensor([b])).logits[0]
    want = torch.cat([ra[9:10], rb[6:14]])
    assert (got - want).abs().max().item() <= TOL


# ----------------------------------------------------------------------------- RoPE spellings
# Every way transformers 4.45–5.x lets a config.json give RoPE (rope_scaling or rope_parameters,
# rope_theta inside or at the top level, ``type`` or ``rope_type``, flat or per layer type) must
# give the inverse frequencies transformers' own rope init computes from the same dict.

_LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=64)
_NO_THETA = {k: v for k, v in _BASE.items() if k != "rope_theta"}


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


ROPE_SPELLINGS = {
    # the report: rope_theta at the top level, the llama3 dict in rope_parameters without it
    "parameters-theta-top": dict(rope_theta=500000.0, rope_parameters=_LLAMA3),
    "parameters-theta-inside": dict(rope_parameters={**_LLAMA3, "rope_theta": 500000.0}),
    "parameters-type-key": dict(rope_theta=500000.0,
                                rope_parameters={**_without(_LLAMA3, "rope_type"),
                                                 "type": "llama3"}),
    "scaling": dict(rope_theta=500000.0, rope_scaling=_LLAMA3),
    "scaling-type-key": dict(rope_theta=500000.0,
                             rope_scaling={**_without(_LLAMA3, "rope_type"), "type": "llama3"}),
    "scaling-theta-inside": dict(rope_scaling={**_LLAMA3, "rope_theta": 500000.0}),
    # transformers 5: llama3 without original_max_position_embeddings uses the top-level one,
    # else max_position_embeddings
    "original-max-top": dict(rope_theta=500000.0, original_max_position_embeddings=32,
                             rope_parameters=_without(_LLAMA3, "original_max_position_embeddings")),
    "original-max-default": dict(
        rope_theta=500000.0, max_position_embeddings=1024,
        rope_parameters=_without(_LLAMA3, "original_max_position_embeddings")),
    "linear-parameters-theta-top": dict(rope_theta=500000.0,
                                        rope_parameters=dict(rope_type="linear", factor=4.0)),
    "default-parameters": dict(rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
    "theta-only": dict(rope_theta=500000.0),
    "nothing": {},
    # both set: transformers 4.x reads only rope_scaling, 5.x prefers it
    "scaling-over-parameters": dict(rope_theta=500000.0,
                                    rope_scaling=dict(rope_type="linear", factor=2.0),
                                    rope_parameters=_LLAMA3),
}


def _gpuchef_inv_freq(spelling: dict, arch: str = "LlamaForCausalLM") -> torch.Tensor:
    from gpuchef.engine_host import ops
    from gpuchef.engine_host.model import ModelConfig

    cfg = ModelConfig.from_hf_config({**_NO_THETA, "architectures": [arch],
                                      **copy.deepcopy(spelling)})
    return ops.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)


@pytest.mark.parametrize("name", list(ROPE_SPELLINGS))
def test_rope_spellings_match_transformers(name):
    from transformers.models.llama import modeling_llama as hf_llama

    spelling = ROPE_SPELLINGS[name]
    # transformers fills its defaults into the dicts it is given: hand it a copy
    hf_cfg = transformers.LlamaConfig(**{**_NO_THETA, **copy.deepcopy(spelling)})
    want = hf_llama.LlamaRotaryEmbedding(hf_cfg).inv_freq
    got = _gpuchef_inv_freq(spelling)
    assert got.shape == want.shape == (8,)
    assert torch.allclose(got, want, rtol=1e-6, atol=0), (got, want)
    scaled = hf_cfg.rope_parameters.get("rope_type", "default") != "default"
    plain = 1.0 / hf_cfg.rope_parameters.get("rope_theta", 10000.0) ** (
        torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    # the spelling's scaling is in play: dropping it would fail the comparison above
    assert scaled == (not torch.allclose(want, plain, rtol=1e-6, atol=0))


_LAYER_TYPES = ["full_attention", "sliding_attention"]

PER_LAYER_TYPE = {
    "same": dict(rope_theta=500000.0,
                 rope_parameters={"full_attention": _LLAMA3, "sliding_attention": _LLAMA3}),
    "same-theta-inside": dict(rope_parameters={
        "full_attention": {**_LLAMA3, "rope_theta": 500000.0},
        "sliding_attention": {**_without(_LLAMA3, "rope_type"), "type": "llama3",
                              "rope_theta": 500000.0}}),
    # an entry for a layer type the model does not use is not read (nor by transformers)
    "unused-type-differs": dict(rope_theta=500000.0, layer_types=["full_attention"] * 2,
                                rope_parameters={"full_attention": _LLAMA3,
                                                 "sliding_attention": {"rope_type": "default"}}),
}


@pytest.mark.parametrize("name", list(PER_LAYER_TYPE))
def test_rope_per_layer_type_matches_transformers(name):
    """transformers 5 nests rope_parameters per attention layer type for models with
    ``layer_types`` (Qwen2 here); when every used type has the same RoPE, gpuchef applies it."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    spelling = {"layer_types": _LAYER_TYPES, **PER_LAYER_TYPE[name]}
    hf_cfg = transformers.Qwen2Config(**{**_NO_THETA, **copy.deepcopy(spelling)})
    got = _gpuchef_inv_freq(spelling, "Qwen2ForCausalLM")
    for lt in set(spelling["layer_types"]):
        want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, layer_type=lt)
        assert torch.allclose(got, want, rtol=1e-6, atol=0), (lt, got, want)
    assert not torch.allclose(got, _gpuchef_inv_freq(dict(rope_theta=500000.0)))


@pytest.mark.parametrize("spelling,needle", [
    (dict(rope_theta=500000.0, layer_types=_LAYER_TYPES,
          rope_parameters={"full_attention": _LLAMA3,
                           "sliding_attention": {"rope_type": "default"}}),
     "rope_parameters gives layer types different RoPE (full_attention: rope_theta 500000, "
     "scaling {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, "
     "'high_freq_factor': 4.0, 'original_max_position_embeddings': 64}; sliding_attention: "
     "rope_theta 500000, scaling None): allowed only the same rope_theta and scaling for every "
     "layer type"),
    (dict(layer_types=_LAYER_TYPES, rope_parameters={
        "full_attention": {**_LLAMA3, "rope_theta": 500000.0},
        "sliding_attention": {**_LLAMA3, "rope_theta": 10000.0}}),
     "sliding_attention: rope_theta 10000"),
    (dict(rope_theta=500000.0, layer_types=_LAYER_TYPES,
          rope_parameters={"full_attention": _LLAMA3, "sliding_attention": None}),
     "rope_parameters gives layer type 'sliding_attention' null (no RoPE): allowed a RoPE object "
     "for every layer type used (full_attention, sliding_attention)"),
    (dict(rope_theta=500000.0, layer_types=_LAYER_TYPES,
          rope_parameters={"full_attention": _LLAMA3}),
     "layer type 'sliding_attention' no entry"),
    (dict(rope_theta=500000.0, rope_parameters={"full_attention": _LLAMA3, "factor": 2.0}),
     "rope_parameters mixes per-layer-type entries (full_attention) with flat RoPE keys "
     "(factor): allowed one or the other"),
    (dict(rope_theta=500000.0, layer_types=_LAYER_TYPES, rope_parameters={
        "full_attention": {"rope_type": "dynamic", "factor": 2.0},
        "sliding_attention": {"rope_type": "dynamic", "factor": 2.0}}),
     "rope_parameters['full_attention'] rope_type 'dynamic' is not supported; allowed: default, "
     "linear, llama3"),
    (dict(rope_theta=500000.0, rope_parameters={"rope_type": "yarn", "factor": 4.0}),
     "rope_parameters rope_type 'yarn' is not supported; allowed: default, linear, llama3"),
    (dict(rope_parameters={**_LLAMA3, "rope_theta": 500000.0, "partial_rotary_factor": 0.5}),
     "rope_parameters partial_rotary_factor 0.5 is not supported: allowed 1"),
    (dict(rope_theta=10000.0, rope_parameters={**_LLAMA3, "rope_theta": 500000.0}),
     "rope_theta is 10000.0 at the top level but 500000.0 in rope_parameters: allowed one"),
    (dict(rope_theta=500000.0, original_max_position_embeddings=32, rope_scaling=_LLAMA3),
     "original_max_position_embeddings is 32 at the top level but 64 in rope_scaling"),
    (dict(rope_theta=500000.0, rope_scaling={**_LLAMA3, "high_freq_factor": None}),
     "rope_scaling of type 'llama3' needs a positive number 'high_freq_factor', got None"),
])
def test_rope_spellings_gpuchef_cannot_do_are_refused(spelling, needle):
    """One ConfigError line naming the value and what is allowed, never a silent fallback."""
    from gpuchef.engine_host.vocab.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _gpuchef_inv_freq(spelling, "Qwen2ForCausalLM")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_llama31_folder_with_theta_outside_rope_parameters(tmp_path):
    """The report end to end: a model folder whose config.json has rope_theta at the top level
    and the llama3 dict in rope_parameters without it gets transformers' logits."""
    hf = _hf_model("llama-3.1-rope", seed=4)
    _save(hf, tmp_path)
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters", None) or cfg.pop("rope_scaling")
    cfg["rope_theta"] = rope.pop("rope_theta", None) or cfg["rope_theta"]
    cfg["rope_parameters"] = rope
    path.write_text(json.dumps(cfg))
    assert "rope_theta" not in cfg["rope_parameters"] and cfg["rope_theta"] == 500000.0
    loaded = load_model(str(tmp_path), dtype=torch.float32, device="cpu")
    assert loaded.config.rope_scaling["rope_type"] == "llama3"
    compare_with_hf(hf, loaded.model, lens=(3, 20, 9), seed=2)
