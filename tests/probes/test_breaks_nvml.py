"""NVML-side inputs that used to hang or fill the memory (fresh-eyes breakage pass)."""

from __future__ import annotations

import pynvml
import pytest

from gpuchef.engine_host.config import ConfigError
from gpuchef.probes.nvml import MAX_GPU_INDEX, FakeNvml, parse_gpus


def test_a_huge_gpu_range_is_refused_before_it_is_expanded():
    # `--gpus 0-99999999999` (a typo) built a set of 1e11 ints: tens of GB, then the OOM killer
    with pytest.raises(ConfigError, match=r"--gpus '0-99999999999': GPU 2 does not exist; "
                                          r"2 GPU\(s\) found, allowed indices \[0, 1\]"):
        parse_gpus("0-99999999999", device_count=2)
    with pytest.raises(ConfigError, match=r"GPU 5 does not exist"):
        parse_gpus("0,5-99999999999", nvml=FakeNvml(2))
    nodrv = FakeNvml(1)
    nodrv.init_error = pynvml.NVMLError_DriverNotLoaded
    with pytest.raises(ConfigError, match=rf"--gpus '3-99999999999': GPU {MAX_GPU_INDEX + 1} is "
                                          rf"out of range: allowed indices \[0, {MAX_GPU_INDEX}\]"):
        parse_gpus("3-99999999999", nvml=nodrv)
    assert parse_gpus("3,1-2", nvml=nodrv) == [1, 2, 3]  # unverifiable but plausible: kept
    assert parse_gpus("0-3,2", device_count=8) == [0, 1, 2, 3]
