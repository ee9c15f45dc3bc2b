"""NVML-side inputs that used to hang or fill the memory (fresh-eyes breakage pass)."""

from __future__ import annotations

import pynvml
import pytest

from gpuchef.engine_host.config import ConfigError
from gpuchef.probes.nvml import MAX_GPU_INDEX, NvmlSampler, describe_nvml_error, parse_gpus
from gpuchef.probes.nvml.fake import FakeNvml


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


class ManualClock:
    def __init__(self, t: int = 1_000_000_000) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


@pytest.mark.parametrize("err", ["NVMLError_Uninitialized", "NVMLError_DriverNotLoaded",
                                 "NVMLError_Timeout"])
def test_nvml_failing_mid_run_gets_a_status_line_and_clears_when_it_answers(err):
    # before: every field went None and the status kept saying all was well
    clock = ManualClock()
    fake = FakeNvml(2, pcie_window_s=0, clock=clock)
    statuses = []
    s = NvmlSampler(nvml=fake, sample_hz=10, clock=clock, pcie_interval_s=0,
                    on_status=statuses.append)
    healthy = "NVML: 2 GPUs (2× NVIDIA H200 (fake)), GPM on"
    s.sample_once()
    assert s.status == healthy
    fake.lose(1, getattr(pynvml, err))
    for _ in range(10):  # 0.9 s of failing ticks: not yet
        clock.t += 100_000_000
        out = s.sample_once()
    assert s.status == healthy
    assert [x.gpu_util for x in out] == [0, None]  # GPU 0 goes on
    clock.t += 100_000_000
    s.sample_once()
    why = describe_nvml_error(getattr(pynvml, err)())  # e.g. "the NVIDIA driver is not loaded"
    line = f"GPU 1: NVML not answering ({why}) — its fields are n/a until it does"
    assert line in s.status and statuses.count(s.status) == 1
    for _ in range(5):
        clock.t += 100_000_000
        s.sample_once()
    assert statuses.count(s.status) == 1  # said once, not on every tick
    fake.lost.clear()
    clock.t += 100_000_000
    out = s.sample_once()
    assert [x.gpu_util for x in out] == [0, 0]
    assert line not in s.status
    s.stop()


def test_a_gpu_lost_after_not_answering_keeps_only_the_lost_line():
    clock = ManualClock()
    fake = FakeNvml(2, pcie_window_s=0, clock=clock)
    s = NvmlSampler(nvml=fake, sample_hz=10, clock=clock, pcie_interval_s=0)
    s.sample_once()
    fake.lose(1, pynvml.NVMLError_Timeout)
    for _ in range(12):
        clock.t += 100_000_000
        s.sample_once()
    assert "GPU 1: NVML not answering (Timeout)" in s.status
    fake.lose(1)  # now NVML calls it lost
    clock.t += 100_000_000
    s.sample_once()
    assert s.status == "GPU 1 lost mid-run: GPU is lost — sampling stopped"
    s.stop()


def test_fields_not_supported_are_not_nvml_failing():
    clock = ManualClock()
    fake = FakeNvml(1, pcie_window_s=0, clock=clock)
    fake.not_supported |= {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
                           "nvmlDeviceGetPowerUsage"}
    s = NvmlSampler(nvml=fake, sample_hz=10, clock=clock, pcie_interval_s=0)
    for _ in range(30):
        clock.t += 100_000_000
        s.sample_once()
    assert "not answering" not in s.status
    s.stop()
