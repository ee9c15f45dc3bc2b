"""The Llama family (Llama 2/3/3.1, Mistral, Qwen2) in plain PyTorch, over the paged KV pool.

The forward takes a token-major flat batch (no batch dim): the runner concatenates every
request's new tokens, and the attention backend (``attention.py``) knows from its per-step
metadata where each request's rows and pages are.

Parameter names follow Hugging Face's, except that q/k/v are one ``qkv_proj`` and gate/up one
``gate_up_proj`` (fewer, larger GEMMs: eager decode is bound by kernel launches).
``checkpoint_layout()`` maps every Hugging Face checkpoint name onto the rows of our parameter
that it fills; the loader loads by that map.

Architecture facts (transformers' ``modeling_llama`` / ``modeling_qwen2`` / ``modeling_mistral``):
pre-norm decoder; Qwen2 has bias on q/k/v and none on o_proj; Llama's ``attention_bias`` puts a
bias on all four; ``mlp_bias`` (Llama only) on gate/up/down; Mistral has no biases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import ops, rope_append
from .attention import AttentionBackend
from .vocab.errors import ConfigError

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                "qwen2": "Qwen2ForCausalLM"}
_ARCH_TYPES = {v: k for k, v in _MODEL_TYPES.items()}
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "max_position_embeddings")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family model's shape, read from a Hugging Face ``config.json`` dict.

    Sizes in elements; ``rope_theta`` is the RoPE base; ``rope_scaling`` is None or a dict with
    ``rope_type`` "linear" or "llama3" and that type's numbers, nothing else
    (``ops.normalize_rope_scaling``, used by ``ops.rope_inv_freq``). ``sliding_window`` (tokens)
    is kept for Mistral v0.1-style configs: attention here has no window, so the engine must not
    run sequences longer than ``max_context``.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (and on o_proj unless Qwen2)
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    architectures: tuple[str, ...] = ("LlamaForCausalLM",)
    model_type: str = "llama"
    initializer_range: float = 0.02
    sliding_window: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ derived sizes

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weight elements of every decoder layer's matmuls (qkv, o, gate/up, down), summed
        over the layers: a token's forward through them is 2× this in FLOPs (the embedding is
        a gather, the lm_head runs only for sampled rows)."""
        h = self.hidden_size
        per_layer = (h * (self.q_size + 2 * self.kv_size) + self.q_size * h
                     + 3 * h * self.intermediate_size)
        return self.num_hidden_layers * per_layer

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias and self.model_type != "qwen2"

    @property
    def max_context(self) -> int:
        """Longest sequence this implementation computes exactly (tokens)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    def num_params(self) -> int:
        """Parameter count from the shapes alone (tied embeddings counted once)."""
        h, i, qs, kv = self.hidden_size, self.intermediate_size, self.q_size, self.kv_size
        attn = h * (qs + 2 * kv) + qs * h
        if self.attention_bias:
            attn += qs + 2 * kv + (h if self.o_proj_bias else 0)
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        layer = attn + mlp + 2 * h
        emb = self.vocab_size * h
        return emb * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + h

    # ------------------------------------------------------------------ parsing

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """Read a Hugging Face ``config.json`` dict (transformers 4.x or 5.x spelling).

        Required: an architecture in ARCHITECTURES (``architectures[0]``, or ``model_type``
        llama/mistral/qwen2 when ``architectures`` is absent) and vocab_size, hidden_size,
        intermediate_size, num_hidden_layers, num_attention_heads, max_position_embeddings.
        Defaults are transformers' LlamaConfig defaults. RoPE comes from ``rope_theta`` +
        ``rope_scaling`` (4.x) or ``rope_parameters`` (5.x): see ``_rope_from``. ``eos_token_id``
        may be an int, a list or null. Raises ConfigError naming the missing or bad field and
        what is allowed.
        """
        if not isinstance(cfg, dict):
            raise ConfigError(f"a model config must be a JSON object, got {type(cfg).__name__}")
        arch = _architecture_from(cfg)
        model_type = _ARCH_TYPES[arch]

        for key in _REQUIRED:
            if key not in cfg or cfg[key] is None:
                raise ConfigError(f"config is missing the required field {key!r} "
                                  f"(needed: {', '.join(_REQUIRED)})")
        ints = {key: _pos_int(cfg, key) for key in _REQUIRED}
        kv_heads, head_dim = _heads_from(cfg, ints)

        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"hidden_act {act!r} is not supported; allowed: silu")

        rope_theta, rope_scaling = _rope_from(cfg)

        eos_ids = eos_token_ids(cfg.get("eos_token_id"))
        attention_bias, mlp_bias = _biases_from(cfg, model_type)
        window = _sliding_window_from(cfg, model_type)

        eps = cfg.get("rms_norm_eps", 1e-6)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
            raise ConfigError(f"rms_norm_eps must be a positive number, got {eps!r}")

        known = set(_REQUIRED) | {"num_key_value_heads", "head_dim", "rms_norm_eps"}
        return cls(
            **ints,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(eps),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            mlp_bias=mlp_bias,
            eos_token_ids=eos_ids,
            architectures=(arch,),
            model_type=model_type,
            initializer_range=float(cfg.get("initializer_range") or 0.02),
            sliding_window=window,
            extra={k: v for k, v in cfg.items() if k not in known},
        )


def _architecture_from(cfg: dict[str, Any]) -> str:
    """The config's architecture, one of ARCHITECTURES: ``architectures[0]``, else the one of its
    ``model_type``. Raises ConfigError naming the bad field and what is allowed."""
    archs = cfg.get("architectures")
    if archs:
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ConfigError(f"config field architectures must be a list of names, "
                              f"got {archs!r}")
        arch = archs[0]
        if arch not in ARCHITECTURES:
            raise ConfigError(f"architecture {arch!r} is not supported; "
                              f"allowed: {', '.join(ARCHITECTURES)}")
        return arch
    mt = cfg.get("model_type")
    if mt not in _MODEL_TYPES:
        raise ConfigError(f"config has no 'architectures' and model_type {mt!r} is not "
                          f"one of {', '.join(_MODEL_TYPES)}")
    return _MODEL_TYPES[mt]


def _heads_from(cfg: dict[str, Any], ints: dict[str, int]) -> tuple[int, int]:
    """(num_key_value_heads, head_dim): KV heads default to the attention heads (no GQA),
    head_dim to hidden_size / heads. Raises ConfigError when the heads don't divide or
    head_dim is odd (rotary embeddings rotate pairs)."""
    heads = ints["num_attention_heads"]
    kv_heads = _pos_int(cfg, "num_key_value_heads") if cfg.get(
        "num_key_value_heads") is not None else heads
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads {heads} must be a multiple of "
                          f"num_key_value_heads {kv_heads}")
    if cfg.get("head_dim") is not None:
        head_dim = _pos_int(cfg, "head_dim")
    else:
        if ints["hidden_size"] % heads:
            raise ConfigError(f"hidden_size {ints['hidden_size']} is not divisible by "
                              f"num_attention_heads {heads} and head_dim is not given")
        head_dim = ints["hidden_size"] // heads
    if head_dim % 2:
        raise ConfigError(f"head_dim {head_dim} must be even (rotary embeddings)")
    return kv_heads, head_dim


def _biases_from(cfg: dict[str, Any], model_type: str) -> tuple[bool, bool]:
    """(attention_bias, mlp_bias). Qwen2 and Mistral ignore the config's fields: their biases
    are fixed by the architecture."""
    if model_type == "qwen2":
        return True, False
    if model_type == "mistral":
        return False, False
    return bool(cfg.get("attention_bias", False)), bool(cfg.get("mlp_bias", False))


def _sliding_window_from(cfg: dict[str, Any], model_type: str) -> int | None:
    """The attention window (tokens) or None. Raises ConfigError unless a positive int."""
    window = cfg.get("sliding_window")
    if model_type == "qwen2" and not cfg.get("use_sliding_window", False):
        window = None  # Qwen2 windows only when use_sliding_window is set
    if model_type == "llama":
        window = None
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ConfigError(f"sliding_window must be a positive int or null, got {window!r}")
    return window


def eos_token_ids(value: Any) -> tuple[int, ...]:
    """A Hugging Face ``eos_token_id`` field (config.json or generation_config.json: an int, a
    list of ints, or null/absent) as a tuple of token ids. Raises ConfigError for any other
    value."""
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(e, int) and not isinstance(e, bool)
                                       for e in value):
        return tuple(value)
    raise ConfigError(f"eos_token_id must be an int, a list of ints or null, got {value!r}")


def _pos_int(cfg: dict[str, Any], key: str) -> int:
    v = cfg[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"config field {key!r} must be a positive integer, got {v!r}")
    return v


def _rope_from(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from a ``config.json`` dict, read as transformers 4.45–5.x do.

    The RoPE dict is ``rope_scaling`` when it is set (the 4.x name; 5.x still takes it over
    ``rope_parameters``), else ``rope_parameters`` (5.x). It is either flat or nested per
    attention layer type (``{"full_attention": {...}, "sliding_attention": {...}}``); a nested
    one must give every layer type that ``layer_types`` lists (all its entries when the config
    has no ``layer_types``) the same RoPE, since one RoPE serves every layer here. In a flat
    dict (or each nested one), ``rope_theta`` and ``partial_rotary_factor`` may sit inside or at
    the top level (inside wins in 5.x; given in both, they must agree), as may llama3's
    ``original_max_position_embeddings`` (5.x takes the top-level one, 4.x the inner one: given
    in both, they must agree), which defaults to ``max_position_embeddings`` as in 5.x.
    Raises ConfigError naming the value and what is allowed.
    """
    source = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
    rp = cfg.get(source)
    if rp is None:
        rp = {}
    if not isinstance(rp, dict):
        raise ConfigError(f"{source} must be a JSON object or null, got {rp!r}")
    per_type = [k for k, v in rp.items() if isinstance(v, dict)]
    if not per_type:
        return _rope_one(rp, cfg, source)
    flat = [k for k, v in rp.items() if k not in per_type and v is not None]
    if flat:
        raise ConfigError(f"{source} mixes per-layer-type entries ({', '.join(per_type)}) with "
                          f"flat RoPE keys ({', '.join(flat)}): allowed one or the other")
    layer_types = cfg.get("layer_types")
    used = list(dict.fromkeys(layer_types)) if isinstance(layer_types, list) and layer_types \
        else list(rp)
    ropes = {}
    for lt in used:
        if rp.get(lt) is None:  # null is transformers' "no RoPE on these layers"
            raise ConfigError(f"{source} gives layer type {lt!r} "
                              f"{'null (no RoPE)' if lt in rp else 'no entry'}: allowed a RoPE "
                              f"object for every layer type used ({', '.join(used)})")
        ropes[lt] = _rope_one(rp[lt], cfg, f"{source}[{lt!r}]")
    first = next(iter(ropes.values()))
    if any(r != first for r in ropes.values()):
        got = "; ".join(f"{lt}: rope_theta {t:g}, scaling {sc}" for lt, (t, sc) in ropes.items())
        raise ConfigError(f"{source} gives layer types different RoPE ({got}): allowed only the "
                          "same rope_theta and scaling for every layer type (one RoPE serves "
                          "every layer)")
    return first


def _rope_one(rope: dict[str, Any], cfg: dict[str, Any],
              where: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from one flat RoPE dict ``rope`` found at ``where`` in
    ``cfg``, with the top-level fields it may lack (see ``_rope_from``)."""
    rope = {k: v for k, v in rope.items() if v is not None}  # a null field is an absent one
    merged = dict(rope)
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in rope and cfg.get(key) is not None and rope[key] != cfg[key]:
            raise ConfigError(f"{key} is {cfg[key]!r} at the top level but {rope[key]!r} in "
                              f"{where}: allowed one of them, or the same value in both")
        if key not in rope and cfg.get(key) is not None:
            merged[key] = cfg[key]
    theta = merged.get("rope_theta", 10000.0)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 0:
        raise ConfigError(f"rope_theta must be a positive number, got {theta!r}")
    orig = "original_max_position_embeddings"
    if orig not in rope:
        merged[orig] = cfg.get(orig) if cfg.get(orig) is not None \
            else cfg["max_position_embeddings"]
    scaling = ops.normalize_rope_scaling(merged, where)
    if (scaling is not None and scaling["rope_type"] == "llama3" and orig in rope
            and cfg.get(orig) is not None and rope[orig] != cfg[orig]):
        raise ConfigError(f"{orig} is {cfg[orig]!r} at the top level but {rope[orig]!r} in "
                          f"{where} (transformers 5 reads the first, 4.x the second): allowed "
                          "one of them, or the same value in both")
    return float(theta), scaling


# ----------------------------------------------------------------------------- modules


class RMSNorm(nn.Module):
    """Holds the weight [H]; the arithmetic is ``ops.rms_norm`` / ``ops.fused_add_rms_norm``."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: ops.RotaryEmbedding) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size,
                                  bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_proj_bias)
        self.rotary = rotary

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        rope = self.rotary.rope_args(positions)
        q, k, v = self.qkv(positions, x, rotate=rope is None)
        o = attn.forward(self.layer_idx, q, k, v, kv_cache, rope=rope)  # [T, Hq, D]
        return self.o_proj(o.reshape(x.shape[0], self.q_size))

    def qkv(self, positions: torch.Tensor, x: torch.Tensor, rotate: bool = True
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The projection and RoPE before attention: x [T, H] → q [T, Hq, D], k and v
        [T, Hkv, D] (views of the fused projection's output where not rotated). ``rotate``
        False: q and k are returned unrotated, for an attention backend that rotates them
        (``forward(rope=self.rotary.rope_args(positions))``, ``ops.fused_rope_append``)."""
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if rotate:
            q, k = self.rotary(q, k, positions)
        return q, k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size,
                                      bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, rotary: ops.RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx, rotary)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, x, residual, kv_cache, attn):
        # The residual stream is carried separately so that each norm fuses with its add.
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, attn)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        rotary = ops.RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                     cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama / Mistral / Qwen2 decoder for the engine's flat, paged batches.

    ``config``: the ModelConfig. With ``tie_word_embeddings`` there is no ``lm_head``: logits use
    ``model.embed_tokens.weight``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], attn: AttentionBackend) -> torch.Tensor:
        """Run one step's tokens through every layer.

        input_ids, positions: int64 [T] (a flat batch laid out as ``attn``'s metadata says; the
        backend's ``begin_step`` has been called); kv_caches: one
        [num_blocks, 2, block_size, Hkv, D] tensor per layer, written in place. Returns the
        final-normed hidden states [T, hidden_size] in the model's dtype.
        """
        x = self.model.embed_tokens(input_ids)
        residual = None
        for i, layer in enumerate(self.model.layers):
            x, residual = layer(positions, x, residual, kv_caches[i], attn)
        x, _ = self.model.norm(x, residual)
        return x

    # -- the forward split at attention (piecewise CUDA graphs, runner.CudaGraphPiecewise) ------
    @property
    def num_pieces(self) -> int:
        """Pieces of the split forward: one before the first attention, one after each."""
        return len(self.model.layers) + 1

    def piece(self, j: int, input_ids: torch.Tensor, positions: torch.Tensor,
              attn_out: torch.Tensor, residual: torch.Tensor,
              kv_append: tuple | None = None) -> tuple[torch.Tensor, ...]:
        """Piece ``j`` (0 … ``num_pieces − 1``) of ``forward`` split at attention, as vLLM V1
        splits it for piecewise CUDA graphs: everything between two attention calls.

        Piece 0: embedding, layer 0's input norm, QKV projection and RoPE. Piece j (1 … L−1):
        layer j−1's o_proj, residual add + post-attention norm, MLP, then layer j's residual add
        + input norm, QKV projection and RoPE. Piece L: layer L−1's o_proj, norm, MLP and the
        final norm. Between piece j and j+1 the caller runs layer j's attention (K/V append and
        attend) on the q, k, v piece j returned; composed so, the pieces are ``forward``'s ops
        in ``forward``'s order.

        input_ids, positions: int64 [T] (piece 0 reads input_ids; pieces 0 … L−1 positions);
        attn_out: [T, Hq·D] (or [T, Hq, D]), layer j−1's attention output (pieces ≥ 1);
        residual: [T, H], the residual stream piece j−1 returned (pieces ≥ 1; with FlashInfer's
        fused norm it is updated in place). Every op works row by row, so rows never mix.
        Returns ``(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], residual [T, H])`` for j < L,
        ``(hidden [T, H],)`` for j = L (final-normed, as ``forward`` returns).

        ``kv_append``: ``(kv_caches, slot_mapping int64 [T], num_tokens int64 [1], q_out
        [T, Hq, D])`` to rotate q, k and write layer j's K/V inside the piece (one kernel,
        ``rope_append.rope_and_append``; rows at or past ``num_tokens`` write nothing): then
        j < L returns ``(q_out, residual)`` and the caller only attends (``attn.attend``).
        """
        layers = self.model.layers
        L = len(layers)
        if not 0 <= j <= L:
            raise IndexError(f"piece {j} is out of range: allowed 0 … {L}")
        if j == 0:
            x = self.model.embed_tokens(input_ids)
            residual, x = x, layers[0].input_layernorm(x)
        else:
            layer = layers[j - 1]
            x = layer.self_attn.o_proj(attn_out.reshape(attn_out.shape[0], -1))
            x, residual = layer.post_attention_layernorm(x, residual)
            x = layer.mlp(x)
            if j == L:
                x, _ = self.model.norm(x, residual)
                return (x,)
            x, residual = layers[j].input_layernorm(x, residual)
        att = layers[j].self_attn
        if kv_append is not None:
            kv_caches, slots, num_tokens, q_out = kv_append
            q, k, v = att.qkv(positions, x, rotate=False)
            q = rope_append.rope_and_append(q, k, v, positions,
                                            att.rotary.cache_on(positions.device), kv_caches[j],
                                            slots, num_tokens, q_out)
            return q, residual
        q, k, v = att.qkv(positions, x)
        return q, k, v, residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden_size] → logits [S, vocab_size], float32 (float64 for a float64 model).

        The projection runs in the model's dtype, then is upcast (as vLLM does).
        """
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = hidden.to(w.dtype) @ w.t()
        return logits if logits.dtype == torch.float64 else logits.float()

    def checkpoint_layout(self) -> dict[str, tuple[str, int, int, tuple[int, ...]]]:
        """Hugging Face checkpoint name → (our parameter name, row start, row end, HF shape).

        Every name listed must be present in a checkpoint; rows ``[start, end)`` of our
        parameter (dim 0) take that tensor. Tied models list no ``lm_head.weight``.
        """
        cfg = self.config
        packed = {
            "qkv_proj": (("q_proj", cfg.q_size), ("k_proj", cfg.kv_size), ("v_proj", cfg.kv_size)),
            "gate_up_proj": (("gate_proj", cfg.intermediate_size),
                             ("up_proj", cfg.intermediate_size)),
        }
        out: dict[str, tuple[str, int, int, tuple[int, ...]]] = {}
        for name, p in self.named_parameters():
            parts = name.split(".")
            parts_hf = packed.get(parts[-2]) if len(parts) >= 2 else None
            if parts_hf is None:
                out[name] = (name, 0, p.shape[0], tuple(p.shape))
                continue
            start = 0
            for hf_mod, rows in parts_hf:
                hf_name = ".".join(parts[:-2] + [hf_mod, parts[-1]])
                out[hf_name] = (name, start, start + rows, (rows,) + tuple(p.shape[1:]))
                start += rows
        return out
