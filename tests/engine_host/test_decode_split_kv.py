"""GPUCHEF_DECODE_SPLIT_KV (issue 16's experiment): the keywords FlashInfer's decode plan gets
for each value; a bad value of it or of GPUCHEF_ROPE_APPEND is one line when an engine starts,
not a traceback."""

import os
import subprocess
import sys

import pytest

from gpuchef.engine_host.attention import decode_split_kv_args
from gpuchef.engine_host.vocab.errors import ConfigError


@pytest.mark.parametrize("value,kw", [
    (None, {}), ("", {}), ("auto", {}), (" AUTO ", {}),
    ("off", {"disable_split_kv": True}), (" OFF", {"disable_split_kv": True}),
])
def test_values_map_to_flashinfer_plan_keywords(value, kw):
    assert decode_split_kv_args(value) == kw


@pytest.mark.parametrize("value", ["0", "-4", "yes", "8.5", "on", "8", "64"])
def test_other_values_are_refused_naming_the_value(value):
    with pytest.raises(ConfigError) as e:
        decode_split_kv_args(value)
    assert f"GPUCHEF_DECODE_SPLIT_KV={value!r}" in str(e.value)
    assert str(e.value).endswith("use auto or off")


@pytest.mark.parametrize("value", ["8", "64"])
def test_a_fixed_split_is_refused_saying_why(value):
    """A fixed split replayed wrong outputs from a decode graph on the H200 (the engine graphs
    every decode step), so it is not a value the engine takes."""
    with pytest.raises(ConfigError, match="not CUDA-graph safe"):
        decode_split_kv_args(value)


@pytest.mark.slow  # starts the engine's process per case
@pytest.mark.parametrize("var,value,line", [
    ("GPUCHEF_DECODE_SPLIT_KV", "sometimes", "GPUCHEF_DECODE_SPLIT_KV='sometimes' is not allowed"),
    ("GPUCHEF_ROPE_APPEND", "yes",
     "GPUCHEF_ROPE_APPEND='yes': allowed fused, fused-except-piecewise, separate"),
])
def test_bad_kernel_switch_is_one_message_when_an_engine_starts(tmp_path, var, value, line):
    """A command that builds an engine ends with one line naming the value and what is
    allowed, not a traceback."""
    env = {**os.environ, var: value}
    r = subprocess.run([sys.executable, "-m", "gpuchef", "bench", "--device", "cpu", "--model",
                        "tiny", "--num-prompts", "2", "--input-len", "8", "--output-len", "2",
                        "--sample-hz", "0"], env=env, capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" not in out, out
    assert line in out, out
