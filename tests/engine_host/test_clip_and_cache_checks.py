"""``clip_stats`` counts what ``max_model_len`` cuts from a load (the engine side prints
nothing), ``CacheConfig`` refuses KV sizes and memory fractions out of range, and the engine
refuses at start-up a KV cache whose usable blocks cannot hold one max_model_len request."""

from __future__ import annotations

import math

import pytest
import torch

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.kv_cache import KVCacheManager
from gpuchef.engine_host.request import SamplingParams
from gpuchef.engine_host.vocab.workload import WorkloadConfig, clip_stats, generate


def test_clip_stats_matches_generate(capsys):
    cfg = WorkloadConfig(dataset="azure-conv", num_prompts=5, max_model_len=10)
    st = clip_stats(cfg)
    assert (st.requests, st.prompts, st.outputs) == (5, 5, 5)
    specs = generate(cfg)
    assert st.prompt_max == max(s.prompt_len for s in specs) == 1
    assert st.output_max == max(s.output_len for s in specs) == 9
    assert capsys.readouterr() == ("", "")  # the engine side does not print


def test_clip_stats_leaves_requested_caps_out():
    # --max-input-len/--max-output-len are asked for: only max_model_len's cuts count
    cfg = WorkloadConfig(num_prompts=4, input_len=8, output_len=4, max_input_len=5,
                         max_model_len=8)
    st = clip_stats(cfg)
    assert (st.prompts, st.outputs, st.prompt_max) == (4, 0, 4) and st.any
    assert not clip_stats(WorkloadConfig(num_prompts=4, input_len=8, output_len=4,
                                         max_model_len=12)).any
    assert not clip_stats(WorkloadConfig(num_prompts=4, input_len=8, output_len=4)).any


def test_clip_stats_reads_the_trace(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,ten,5\n")
    with pytest.raises(ConfigError, match="line 3"):
        clip_stats(WorkloadConfig(dataset=str(bad)))


@pytest.mark.parametrize("kw,msg", [
    (dict(kv_cache_memory_gb=-1.0), "--kv-cache-memory -1 must be > 0 GiB"),
    (dict(kv_cache_memory_gb=0.0), "--kv-cache-memory 0 must be > 0 GiB"),
    (dict(kv_cache_memory_gb=math.nan), "--kv-cache-memory nan must be > 0 GiB"),
    (dict(kv_cache_memory_gb=math.inf), "--kv-cache-memory inf must be > 0 GiB"),
    (dict(num_gpu_blocks=0), "--num-gpu-blocks 0 must be > 0"),
    (dict(num_gpu_blocks=-1), "--num-gpu-blocks -1 must be > 0"),
    (dict(gpu_memory_utilization=0.0), "--gpu-memory-utilization 0 is out of range: allowed (0, 1]"),
    (dict(gpu_memory_utilization=-0.5), "allowed (0, 1]"),
    (dict(gpu_memory_utilization=1.01), "--gpu-memory-utilization 1.01 is out of range"),
])
def test_cache_config_refuses(kw, msg):
    with pytest.raises(ConfigError) as e:
        CacheConfig(**kw)
    assert msg in str(e.value)


def test_cache_config_accepts_edges():
    CacheConfig(gpu_memory_utilization=1.0, kv_cache_memory_gb=0.5, num_gpu_blocks=1)
    CacheConfig(gpu_memory_utilization=0.01)


# one KV block of the tiny preset on CPU (float32): 4 layers, 16 tokens, 2 KV heads of 64
TINY_BLOCK_BYTES = KVCacheManager.bytes_per_block(4, 16, 2, 64, torch.float32)


def _admits_max_model_len(eng) -> None:
    """A request of exactly max_model_len tokens (prompt + max_tokens) passes add_request."""
    n = eng.max_model_len
    eng.add_request("full", [3] * (n - 1), SamplingParams(max_tokens=1))
    eng.add_request("full-2", [3] * (n // 2), SamplingParams(max_tokens=n - n // 2))


@pytest.mark.parametrize("cache", [
    CacheConfig(num_gpu_blocks=512),  # 512 × 16 = 8192 tokens, 5 of them kept by the watermark
    CacheConfig(kv_cache_memory_gb=512 * TINY_BLOCK_BYTES / 2**30),  # the same 512 blocks
], ids=["num-gpu-blocks", "kv-cache-memory"])
def test_engine_max_model_len_is_admissible(cache):
    """The serve report: --num-gpu-blocks 512 started with max_model_len 8192, then refused an
    8150-token request ("cache has 507 usable"). Whatever max_model_len an engine starts with must
    pass add_request; a cache too small for it is refused at start-up, naming the usable blocks
    and both ways out, and each way out starts an engine that admits its max_model_len."""
    from gpuchef.engine_host.engine import LLMEngine

    cfg = EngineConfig(model="tiny", device="cpu", cache=cache)
    try:
        eng = LLMEngine(cfg)
    except ConfigError as e:
        assert str(e) == ("KV cache of 512 blocks (8192 tokens) has 507 usable (5 kept free by "
                          "the 1 % admission watermark) and cannot hold one request of "
                          "max_model_len 8192: allowed ≥ 517 blocks (raise the KV memory) or "
                          "--max-model-len ≤ 8112")
    else:
        _admits_max_model_len(eng)  # failed before the fix: "the cache has 507 usable"
    more = LLMEngine(EngineConfig(model="tiny", device="cpu",
                                  cache=CacheConfig(num_gpu_blocks=517)))
    assert more.max_model_len == 8192
    _admits_max_model_len(more)
    shorter = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=8112,
                                     cache=CacheConfig(num_gpu_blocks=512)))
    _admits_max_model_len(shorter)
    with pytest.raises(ConfigError, match="allowed ≥ 517 blocks"):
        LLMEngine(EngineConfig(model="tiny", device="cpu",
                               cache=CacheConfig(num_gpu_blocks=516)))
