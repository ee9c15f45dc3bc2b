"""Random-weight presets of real architectures, as Hugging Face ``config.json`` dicts.

A profiler's timings depend on shapes, not on weight values, so a preset is honest load; the
dashboard says "random weights" wherever it names one. The shapes are copied from each model's
published ``config.json`` on the Hugging Face hub (the repository is named above each entry);
parameter counts (``ModelConfig.num_params``) agree with the published sizes: Llama-3-8B and
Llama-3.1-8B 8.03 B, Qwen2.5-7B 7.62 B (7.61 B in its model card), Mistral-7B-v0.3 7.25 B.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ConfigError

_LLAMA3_8B: dict[str, Any] = {
    # meta-llama/Meta-Llama-3-8B config.json
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}

PRESETS: dict[str, dict[str, Any]] = {
    # A Llama-3-shaped model small enough for a CPU (about 5 M parameters): GQA 8:2,
    # head_dim 32, rope_theta 500000. Not a published model.
    "tiny": {
        **_LLAMA3_8B,
        "vocab_size": 4096,
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        # head_dim 64: the smallest head size FlashInfer's kernels are built for
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    },
    "llama-3-8b": _LLAMA3_8B,
    # meta-llama/Llama-3.1-8B config.json: the 3-8B shapes, 128K context via llama3 RoPE scaling.
    "llama-3.1-8b": {
        **_LLAMA3_8B,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    # Qwen/Qwen2.5-7B config.json (qkv bias is implied by the architecture).
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    },
    # mistralai/Mistral-7B-v0.3 config.json. v0.3 rather than v0.1: same layer shapes, but no
    # sliding window (v0.1's 4096-token window is not implemented by our attention).
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "vocab_size": 32768,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    },
}


def get_preset(name: str) -> dict[str, Any]:
    """A copy of preset ``name``'s config dict. Raises ConfigError listing the presets."""
    cfg = PRESETS.get(name)
    if cfg is None:
        raise ConfigError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return copy.deepcopy(cfg)
