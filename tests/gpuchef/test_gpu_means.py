"""`gpuchef bench`/`ab` GPU means: a NaN or missing reading does not turn a run's mean into n/a."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

from gpuchef.probes.nvml import GpuSample
from gpuchef.session import Samplers


def test_gpu_means_skip_none_and_nan_readings():
    s = Samplers.__new__(Samplers)  # no sampler threads: only the ring buffer is read
    samples = [GpuSample(t_ns=i, gpu=0, sm_active=50.0 + i, dram_bw_util=d, power_w=500.0)
               for i, d in enumerate([40.0, float("nan"), None, 20.0])]
    s.nvml = NS(samples=samples)
    m = s.gpu_means(0, 10)
    assert m["sm_active"] == 51.5
    assert m["dram_bw_util"] == 30.0
    assert m["power_w"] == 500.0
    assert math.isnan(m["tensor_active"])  # never read: NaN, printed as n/a
    assert s.gpu_means(100, 200)["sm_active"] != s.gpu_means(100, 200)["sm_active"]
