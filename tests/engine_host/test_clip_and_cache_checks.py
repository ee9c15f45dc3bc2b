"""``clip_stats`` counts what ``max_model_len`` cuts from a load (the engine side prints
nothing), and ``CacheConfig`` refuses KV sizes and memory fractions out of range."""

from __future__ import annotations

import math

import pytest

from gpuchef.engine_host.config import CacheConfig, ConfigError
from gpuchef.engine_host.workload import WorkloadConfig, clip_stats, generate


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
