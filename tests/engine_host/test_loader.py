"""Loader, presets and ModelConfig parsing: happy paths and every error path."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpuchef.engine_host.attention import AttentionMetadata, ReferenceAttention
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.loader import LoadedModel, load_model
from gpuchef.engine_host.model import LlamaForCausalLM, ModelConfig
from gpuchef.engine_host.vocab.presets import PRESETS, get_preset

SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
         "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}


def write_folder(path, cfg=SMALL, seed=0):
    """A valid Hugging Face-style folder written from our own model's checkpoint layout."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    model = LlamaForCausalLM(ModelConfig.from_hf_config(cfg))
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for hf_name, (pname, r0, r1, shape) in model.checkpoint_layout().items():
        tensors[hf_name] = torch.randn(shape, generator=g)
        assert params[pname][r0:r1].shape == shape
    save_file(tensors, str(path / "model.safetensors"))
    return path


# ----------------------------------------------------------------------------- presets


PUBLISHED_BILLIONS = {"llama-3-8b": 8.03, "llama-3.1-8b": 8.03, "qwen2.5-7b": 7.61,
                      "mistral-7b": 7.25}


@pytest.mark.parametrize("name", list(PUBLISHED_BILLIONS))
def test_preset_parameter_counts_match_published(name):
    cfg = ModelConfig.from_hf_config(get_preset(name))
    assert cfg.num_params() / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.005)


def test_preset_shapes():
    q = ModelConfig.from_hf_config(get_preset("qwen2.5-7b"))
    assert q.attention_bias and not q.o_proj_bias and q.head_dim == 128 and q.sliding_window is None
    l31 = ModelConfig.from_hf_config(get_preset("llama-3.1-8b"))
    assert l31.rope_scaling["rope_type"] == "llama3" and l31.max_position_embeddings == 131072
    assert l31.eos_token_ids == (128001,)
    tiny = ModelConfig.from_hf_config(get_preset("tiny"))
    assert tiny.num_key_value_heads < tiny.num_attention_heads and tiny.eos_token_ids == (2,)


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_builds_on_meta_with_config_count(name):
    # The meta device gives every shape without memory: an 8B model costs nothing here.
    lm = load_model(name, dtype=torch.bfloat16, device="meta")
    assert lm.random_weights and lm.source == "preset" and lm.name == name
    assert lm.num_params == lm.config.num_params()
    assert lm.weight_bytes == 2 * lm.num_params


def test_get_preset_returns_a_copy():
    get_preset("tiny")["vocab_size"] = 1
    assert PRESETS["tiny"]["vocab_size"] == 4096


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError) as e:
        get_preset("llama-9000")
    assert "'llama-9000'" in str(e.value) and "tiny" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_model("llama-9000", dtype=torch.float32, device="cpu")
    assert "'llama-9000'" in str(e.value) and "qwen2.5-7b" in str(e.value)


def test_tiny_is_deterministic_and_runs():
    calls = []
    a = load_model("tiny", dtype=torch.float32, device="cpu", seed=1,
                   progress=lambda s, d, t: calls.append((s, d, t)))
    b = load_model("tiny", dtype=torch.float32, device="cpu", seed=1)
    c = load_model("tiny", dtype=torch.float32, device="cpu", seed=2)
    assert isinstance(a, LoadedModel) and a.random_weights
    assert calls[-1][0] == "init weights" and calls[-1][1] == calls[-1][2]
    sa, sb, sc = (dict(x.model.named_parameters()) for x in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])
    assert torch.all(sa["model.norm.weight"] == 1)
    std = sa["model.layers.0.mlp.down_proj.weight"].std().item()
    assert std == pytest.approx(0.02, rel=0.05)
    assert not any(p.requires_grad for p in a.model.parameters())

    # one prefill step of two prompts through the paged reference attention
    cfg, bs = a.config, 16
    kv = [torch.zeros(8, 2, bs, cfg.num_key_value_heads, cfg.head_dim)
          for _ in range(cfg.num_hidden_layers)]
    meta = AttentionMetadata(
        block_size=bs, qo_indptr=torch.tensor([0, 20, 25], dtype=torch.int32),
        kv_indptr=torch.tensor([0, 2, 3], dtype=torch.int32),
        kv_indices=torch.tensor([5, 1, 3], dtype=torch.int32),
        kv_last_page_len=torch.tensor([4, 5], dtype=torch.int32), kv_lens=[20, 5],
        qo_lens=[20, 5],
        slot_mapping=torch.tensor([5 * bs + i for i in range(16)] + [bs + i for i in range(4)]
                                  + [3 * bs + i for i in range(5)]),
        positions=torch.tensor(list(range(20)) + list(range(5))), num_decodes=0)
    attn = ReferenceAttention()
    attn.begin_step(meta)
    ids = torch.randint(0, cfg.vocab_size, (25,))
    with torch.inference_mode():
        logits = a.model.compute_logits(a.model(ids, meta.positions, kv, attn))
    assert logits.shape == (25, cfg.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_tiny_bfloat16():
    lm = load_model("tiny", dtype=torch.bfloat16, device="cpu")
    assert all(p.dtype == torch.bfloat16 for p in lm.model.parameters())
    assert lm.weight_bytes == 2 * lm.num_params


# ----------------------------------------------------------------------------- folders


def test_folder_loads_by_name(tmp_path):
    folder = write_folder(tmp_path / "m")
    lm = load_model(str(folder), dtype=torch.float32, device="cpu")
    assert not lm.random_weights and lm.name == "m" and lm.source == str(folder.resolve())
    saved = load_file(str(folder / "model.safetensors"))
    attn = lm.model.model.layers[1].self_attn
    q = attn.qkv_proj.weight[: lm.config.q_size]
    assert torch.equal(q, saved["model.layers.1.self_attn.q_proj.weight"])
    v = attn.qkv_proj.weight[lm.config.q_size + lm.config.kv_size:]
    assert torch.equal(v, saved["model.layers.1.self_attn.v_proj.weight"])
    up = lm.model.model.layers[0].mlp.gate_up_proj.weight[lm.config.intermediate_size:]
    assert torch.equal(up, saved["model.layers.0.mlp.up_proj.weight"])


def test_folder_ignores_rotary_inv_freq_and_extra_lm_head_when_tied(tmp_path):
    cfg = {**SMALL, "tie_word_embeddings": True}
    folder = write_folder(tmp_path / "m", cfg)
    t = load_file(str(folder / "model.safetensors"))
    t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    save_file(t, str(folder / "model.safetensors"))
    lm = load_model(str(folder), dtype=torch.float32, device="cpu")
    assert lm.model.lm_head is None
    assert torch.equal(lm.model.model.embed_tokens.weight, t["model.embed_tokens.weight"])


@pytest.mark.parametrize("gen_eos,want", [([2, 60], (2, 60)), (61, (2, 61)), (2, (2,)),
                                            (None, (2,))])
def test_generation_config_eos_joins_config_eos(tmp_path, gen_eos, want):
    # vLLM stops on the model's eos and on every generation_config.json eos id (PR #4182)
    folder = write_folder(tmp_path / "m", {**SMALL, "eos_token_id": 2})
    gen = {"bos_token_id": 1} if gen_eos is None else {"eos_token_id": gen_eos}
    (folder / "generation_config.json").write_text(json.dumps(gen))
    assert load_model(str(folder), dtype=torch.float32, device="cpu").config.eos_token_ids == want


def test_generation_config_eos_stops_generation(tmp_path):
    from gpuchef.engine_host.vocab.config import EngineConfig
    from gpuchef.engine_host.engine import LLMEngine
    from gpuchef.engine_host.request import SamplingParams

    folder = write_folder(tmp_path / "m", {**SMALL, "eos_token_id": 0})

    def generate():
        eng = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32"))
        eng.add_request("r", [5, 6, 7, 8], SamplingParams(max_tokens=12))  # greedy
        done = []
        while eng.has_unfinished():
            done += eng.step().finished
        return done[0]

    free = generate()  # no generation_config.json: runs to max_tokens
    assert free.finish_reason == "length" and free.output_len == 12
    ids = list(free.output_token_ids)
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # first new id after the 1st
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, ids[k]]}))
    stopped = generate()
    assert stopped.finish_reason == "stop"
    assert list(stopped.output_token_ids) == ids[:k + 1]


@pytest.mark.parametrize("text,needle", [
    ('{"eos_token_id": "x"}', "eos_token_id must be an int, a list of ints or null"),
    ('{"eos_token_id": [2, ', "is not valid JSON"),
    ("[2]", "must hold a JSON object"),
])
def test_generation_config_it_cannot_read_is_one_line(tmp_path, text, needle):
    folder = write_folder(tmp_path / "m")
    (folder / "generation_config.json").write_text(text)
    msg = _err(folder)
    assert needle in msg and "generation_config.json" in msg and "\n" not in msg


def _err(path) -> str:
    with pytest.raises(ConfigError) as e:
        load_model(str(path), dtype=torch.float32, device="cpu")
    return str(e.value)


def test_error_path_does_not_exist(tmp_path):
    msg = _err(tmp_path / "nope")
    assert "nope" in msg and "does not exist" in msg and "tiny" in msg


def test_error_path_is_a_file(tmp_path):
    f = tmp_path / "weights.safetensors"
    f.write_bytes(b"x")
    msg = _err(f)
    assert "weights.safetensors" in msg and "not a folder" in msg


def test_error_no_config(tmp_path):
    assert "no config.json" in _err(tmp_path) and str(tmp_path) in _err(tmp_path)


def test_error_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text('{"vocab_size": 64,\n  "hidden_size": }')
    msg = _err(tmp_path)
    assert "config.json" in msg and "not valid JSON" in msg and "line 2 column" in msg


def test_error_config_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    assert "JSON object" in _err(tmp_path)


def test_error_unsupported_architecture(tmp_path):
    write_folder(tmp_path)
    bad = {**SMALL, "architectures": ["GPT2LMHeadModel"]}
    (tmp_path / "config.json").write_text(json.dumps(bad))
    msg = _err(tmp_path)
    assert "'GPT2LMHeadModel'" in msg and "LlamaForCausalLM" in msg and "Qwen2ForCausalLM" in msg


def test_error_missing_required_field(tmp_path):
    cfg = {k: v for k, v in SMALL.items() if k != "num_hidden_layers"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert "'num_hidden_layers'" in _err(tmp_path)


def test_error_no_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    msg = _err(tmp_path)
    assert "no *.safetensors" in msg and "pytorch_model.bin" in msg


def test_error_missing_weight(tmp_path):
    folder = write_folder(tmp_path)
    t = load_file(str(folder / "model.safetensors"))
    del t["model.layers.1.mlp.up_proj.weight"]
    save_file(t, str(folder / "model.safetensors"))
    msg = _err(folder)
    assert "'model.layers.1.mlp.up_proj.weight'" in msg and "missing" in msg


def test_error_shape_mismatch(tmp_path):
    folder = write_folder(tmp_path)
    t = load_file(str(folder / "model.safetensors"))
    t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 32)
    save_file(t, str(folder / "model.safetensors"))
    msg = _err(folder)
    assert "'model.layers.0.self_attn.k_proj.weight'" in msg
    assert "[32, 32]" in msg and "[16, 32]" in msg


def test_error_corrupt_safetensors(tmp_path):
    folder = write_folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x00garbage")
    assert "cannot read safetensors" in _err(folder)


def test_error_index_names_missing_shard(tmp_path):
    folder = write_folder(tmp_path)
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "'model-00002-of-00002.safetensors'" in _err(folder)


# ----------------------------------------------------------------------------- ModelConfig


def test_config_defaults_and_eos_forms():
    base = {k: v for k, v in SMALL.items() if k not in ("num_key_value_heads", "rope_theta")}
    c = ModelConfig.from_hf_config(base)
    assert c.num_key_value_heads == 4 and c.head_dim == 8 and c.rope_theta == 10000.0
    assert c.eos_token_ids == ()
    assert ModelConfig.from_hf_config({**SMALL, "eos_token_id": 7}).eos_token_ids == (7,)
    assert ModelConfig.from_hf_config({**SMALL, "eos_token_id": [1, 9]}).eos_token_ids == (1, 9)
    with pytest.raises(ConfigError, match="eos_token_id"):
        ModelConfig.from_hf_config({**SMALL, "eos_token_id": "x"})


def test_config_model_type_without_architectures():
    cfg = {k: v for k, v in SMALL.items() if k != "architectures"}
    assert ModelConfig.from_hf_config({**cfg, "model_type": "qwen2"}).attention_bias
    with pytest.raises(ConfigError, match="'gpt2'"):
        ModelConfig.from_hf_config({**cfg, "model_type": "gpt2"})


def test_config_rope_spellings():
    v4 = ModelConfig.from_hf_config({**SMALL, "rope_theta": 5e5,
                                     "rope_scaling": {"type": "linear", "factor": 2.0}})
    v5 = ModelConfig.from_hf_config({k: v for k, v in SMALL.items() if k != "rope_theta"} | {
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}})
    assert v4.rope_theta == v5.rope_theta == 5e5
    assert v4.rope_scaling == v5.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ConfigError, match="'yarn'"):
        ModelConfig.from_hf_config({**SMALL, "rope_scaling": {"rope_type": "yarn", "factor": 4}})


@pytest.mark.parametrize("field,value,needle", [
    ("num_attention_heads", 0, "'num_attention_heads'"),
    ("hidden_size", "big", "'hidden_size'"),
    ("num_key_value_heads", 3, "num_key_value_heads 3"),
    ("hidden_act", "gelu", "'gelu'"),
    ("rms_norm_eps", -1, "rms_norm_eps"),
])
def test_config_bad_values(field, value, needle):
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_hf_config({**SMALL, field: value})
    assert needle in str(e.value)


def test_mistral_sliding_window_caps_context():
    cfg = {**SMALL, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
           "sliding_window": 64}
    c = ModelConfig.from_hf_config(cfg)
    assert c.sliding_window == 64 and c.max_context == 64
    assert ModelConfig.from_hf_config(get_preset("mistral-7b")).max_context == 32768
