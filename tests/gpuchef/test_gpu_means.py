"""`gpuchef bench`/`ab` GPU means: a NaN or missing reading does not turn a run's mean into n/a."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest

from gpuchef.probes.nvml import GpuSample
from gpuchef.sessions.headless import Samplers


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


def test_sampler_cost_reports_the_rate_it_kept_and_its_cpu():
    """The bench's "NVML sampler" rows come from the running sampler (a stand-in NVML here):
    the asked rate, the kept rate — tick periods between the first and the last tick, so a slow
    NVML start-up (0.4 s here) does not count — and a CPU share of one core; off
    (--sample-hz 0) reports none."""
    import time

    from gpuchef.probes.nvml.fake import FakeNvml

    assert Samplers(None, 0).sampler_cost() is None
    fake = FakeNvml(2, pcie_window_s=0)
    init = fake.nvmlInit
    fake.nvmlInit = lambda: (time.sleep(0.4), init())[1]  # a multi-GPU host's slow nvmlInit
    s = Samplers(None, 20, nvml=fake)
    s.start()
    time.sleep(1.0)
    t1 = time.monotonic_ns()
    s.stop()
    c = s.sampler_cost()
    assert c is not None and c["sample_hz"] == 20 and c["gpus"] == 2
    ts = sorted({x.t_ns for x in s.nvml.samples})  # one time per tick, shared by both GPUs
    from_samples = (len(ts) - 1) / ((ts[-1] - ts[0]) / 1e9)
    assert c["achieved_hz"] == pytest.approx(from_samples, rel=0.02)
    # the loop never bursts: tick periods over the run cannot exceed the asked rate
    assert 0 < c["achieved_hz"] <= 20 * 1.05
    assert c["tick_us_mean"] > 0 and 0 <= c["cpu_pct"] <= 100
    lines = s.gpu_lines(t1 - 2_000_000_000, t1)
    assert lines["NVML sampler Hz (asked / got):"] == f"20 / {c['achieved_hz']:.1f}"
    assert "/" in lines["NVML sampler µs/tick / CPU % of a core:"]
    assert all(len(k) <= 40 for k in lines)  # the results block's label column
