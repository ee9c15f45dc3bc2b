"""NvmlSampler against FakeNvml, a stand-in that raises pynvml's real exception classes."""

from __future__ import annotations

import sys
import threading
import time

import pynvml
import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.probes.nvml import (GPM_FIELDS, MAX_GPU_INDEX, NA, GpuSample, NvmlLibrary,
                                 NvmlSampler, describe_nvml_error, nvml_library, parse_gpus)
from gpuchef.probes.nvml.fake import FakeNvml


class ManualClock:
    def __init__(self, t: int = 1_000_000_000) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t

    def advance(self, s: float) -> None:
        self.t += int(s * 1e9)


def wait_for(cond, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


# ---- (a) NotSupported fields become None, the rest stay ------------------------------------

def test_not_supported_fields_are_none_and_not_asked_again():
    fake = FakeNvml(1, pcie_window_s=0)
    fake.not_supported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperatureV",
                          "nvmlDeviceGetTemperature"}
    s = NvmlSampler(nvml=fake, pcie_interval_s=0)
    for _ in range(3):
        out = s.sample_once()
    s.stop()
    (x,) = out
    assert x.power_w is None and x.temp_c is None
    assert x.gpu == 0 and x.gpu_util is not None and x.mem_util is not None
    assert x.mem_used_bytes > 0 and x.mem_total_bytes == fake.mem_total_bytes
    assert x.sm_clock_mhz == 1980 and x.mem_clock_mhz == 2619
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # NotSupported once, then not asked
    assert s.available and s.status.startswith("NVML: 1 GPU (")


def test_query_helper_turns_not_supported_into_na_only():
    fake = FakeNvml(1)
    lib = NvmlLibrary(fake)

    def boom(exc):
        raise exc()

    assert lib.query(boom, pynvml.NVMLError_NotSupported) is NA
    assert lib.query(boom, pynvml.NVMLError_FunctionNotFound) is NA
    assert lib.query("nvmlNoSuchFunction") is NA
    assert not NA and repr(NA) == "N/A"
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        lib.query(boom, pynvml.NVMLError_GpuIsLost)
    assert lib.query(lambda a: a + 1, 1) == 2


# ---- (b) NVML missing at init: a status line, no exception, no thread crash -----------------

@pytest.mark.parametrize("err", [pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded,
                                 pynvml.NVMLError_NotFound, pynvml.NVMLError_NoPermission])
def test_init_failure_gives_status_line(err):
    fake = FakeNvml(1)
    fake.init_error = err
    seen = []
    with NvmlSampler(nvml=fake, sample_hz=50, on_status=seen.append) as s:
        assert s.wait_ready(2.0)
        assert wait_for(lambda: not s.running)
    assert s.status.startswith("NVML not available: ") and "panels" not in s.status
    assert "\n" not in s.status
    assert not s.available and len(s.samples) == 0 and s.latest == {}
    assert seen and seen[-1] == s.status
    if err is pynvml.NVMLError_LibraryNotFound:
        assert "libnvidia-ml.so.1 not found" in s.status
    if err is pynvml.NVMLError_DriverNotLoaded:
        assert "driver is not loaded" in s.status
    assert "--gpus" not in s.status
    fake2 = FakeNvml(1)
    fake2.init_error = err
    with NvmlSampler(nvml=fake2, gpus=[7], sample_hz=50) as s:  # cannot be checked: say so
        assert s.wait_ready(2.0)
    assert s.status.startswith("NVML not available: ")
    assert s.status.endswith("; --gpus 7 not sampled")


def test_this_machine_without_driver_or_pynvml(monkeypatch):
    # The real pynvml on a machine without a driver (this CPU box) or a missing pynvml.
    s = NvmlSampler()
    s.start()
    assert s.wait_ready(5.0)
    s.stop()
    if not s.available:
        assert s.status.startswith("NVML not available: ")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    s2 = NvmlSampler()
    s2.start()
    assert s2.wait_ready(2.0)
    s2.stop()
    assert "pynvml" in s2.status and "not installed" in s2.status


def test_no_gpus():
    s = NvmlSampler(nvml=FakeNvml(0))
    assert s.sample_once() == []
    s.stop()
    assert "no GPU found" in s.status


# ---- (c) GPU lost mid-run --------------------------------------------------------------------

@pytest.mark.parametrize("err", [pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Unknown])
def test_gpu_lost_mid_run_stops_that_gpu_only(err):
    fake = FakeNvml(2, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, sample_hz=50, pcie_interval_s=0.1)
    with s:
        assert s.wait_ready(2.0)
        assert wait_for(lambda: len(s.samples) >= 6)
        fake.lose(1, err)
        assert wait_for(lambda: "GPU 1 lost mid-run" in s.status)
        n0 = sum(1 for x in s.samples if x.gpu == 0)
        assert wait_for(lambda: sum(1 for x in s.samples if x.gpu == 0) >= n0 + 5)
        assert s.running
        before = sum(1 for x in s.samples if x.gpu == 1)
        time.sleep(0.1)
        assert sum(1 for x in s.samples if x.gpu == 1) == before  # no more GPU 1 samples
        assert s.status.endswith("sampling stopped")
        fake.lose(0)
        assert wait_for(lambda: not s.running)  # nothing left to sample: the thread ends
    assert "GPU 0 lost mid-run: GPU is lost — sampling stopped" in s.status
    assert fake.live_gpm_samples == 0


def test_failing_on_sample_consumer_does_not_kill_sampler():
    fake = FakeNvml(1, pcie_window_s=0)

    def bad(_):
        raise ValueError("consumer bug")

    with NvmlSampler(nvml=fake, sample_hz=50, on_sample=bad, pcie_interval_s=0) as s:
        assert wait_for(lambda: len(s.samples) >= 3)
        assert s.running
    assert "consumer bug" in s.status


# ---- GPM ---------------------------------------------------------------------------------------

def test_gpm_each_window_is_computed_against_the_previous_sample():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, sample_hz=50, clock=clk, pcie_interval_s=0)
    first = s.sample_once()[0]
    assert all(getattr(first, f) is None for f in GPM_FIELDS)  # no previous sample yet
    fake.set_load(0, sm_active=50, tensor_active=40, dram_bw_util=10, sm_occupancy=20)
    clk.advance(0.1)
    x = s.sample_once()[0]
    assert x.sm_active == pytest.approx(50) and x.tensor_active == pytest.approx(40)
    assert x.dram_bw_util == pytest.approx(10) and x.sm_occupancy == pytest.approx(20)
    fake.set_load(0, sm_active=90, tensor_active=80)
    clk.advance(0.1)
    y = s.sample_once()[0]
    # against the previous sample: 90, not the 70 a fixed first sample would give
    assert y.sm_active == pytest.approx(90) and y.tensor_active == pytest.approx(80)
    # 50 Hz: the next ticks fall inside the 100 ms GPM window -> no new GPM sample, values held
    gets = fake.calls["nvmlGpmSampleGet"]
    for _ in range(4):
        clk.advance(0.02)
        z = s.sample_once()[0]
        if fake.calls["nvmlGpmSampleGet"] == gets:
            assert z.sm_active == y.sm_active
    assert fake.calls["nvmlGpmSampleGet"] == gets  # 80 ms < 100 ms - 2 ms
    clk.advance(0.02)
    s.sample_once()
    assert fake.calls["nvmlGpmSampleGet"] == gets + 1
    s.stop()
    assert fake.live_gpm_samples == 0  # both buffers freed at stop


def test_gpm_values_go_stale_when_gpm_stops_answering():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, sample_hz=10, clock=clk, pcie_interval_s=0)
    fake.set_load(0, sm_active=30)
    s.sample_once()
    clk.advance(0.1)
    assert s.sample_once()[0].sm_active == pytest.approx(30)
    orig = fake.nvmlGpmSampleGet

    def flaky(h, smp):
        raise pynvml.NVMLError_Timeout()

    fake.nvmlGpmSampleGet = flaky
    clk.advance(0.1)
    assert s.sample_once()[0].sm_active == pytest.approx(30)  # one failed window: held
    for _ in range(6):
        clk.advance(0.1)
        last = s.sample_once()[0]
    assert last.sm_active is None and last.gpu_util is not None
    fake.nvmlGpmSampleGet = orig
    s.stop()


def test_gpm_unsupported_metric_turns_off_only_that_field():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    fake.gpm_unsupported_metrics = {pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL}
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0)
    fake.set_load(0, sm_active=60, dram_bw_util=50)
    s.sample_once()
    clk.advance(0.1)
    x = s.sample_once()[0]
    assert x.dram_bw_util is None and x.sm_active == pytest.approx(60)
    assert "dram_bw_util not supported" in s.status
    clk.advance(0.1)
    y = s.sample_once()[0]
    assert y.sm_active == pytest.approx(60) and y.dram_bw_util is None
    s.stop()


def test_gpm_metric_that_answered_before_survives_one_not_supported_window():
    """Seen on the H200: DRAM BW answered, then NOT_SUPPORTED for a window. That window reads
    None; the metric is asked again and comes back (it is not turned off for the run)."""
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0)
    fake.set_load(0, sm_active=60, dram_bw_util=50)
    s.sample_once()
    clk.advance(0.1)
    assert s.sample_once()[0].dram_bw_util == pytest.approx(50)
    fake.gpm_unsupported_metrics = {pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL}
    clk.advance(0.1)
    bad = s.sample_once()[0]
    assert bad.dram_bw_util is None and bad.sm_active == pytest.approx(60)
    fake.gpm_unsupported_metrics = set()
    clk.advance(0.1)
    assert s.sample_once()[0].dram_bw_util == pytest.approx(50)
    assert "not supported" not in s.status
    s.stop()


def test_gpm_nan_value_reads_as_none():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0)
    fake.set_load(0, sm_active=60, dram_bw_util=50)
    orig = fake.nvmlGpmMetricsGet

    def nan_dram(req):
        out = orig(req)
        for m in out.metrics[:out.numMetrics]:
            if m.metricId == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL:
                m.value = float("nan")
        return out

    fake.nvmlGpmMetricsGet = nan_dram
    s.sample_once()
    clk.advance(0.1)
    x = s.sample_once()[0]
    assert x.dram_bw_util is None and x.sm_active == pytest.approx(60)
    fake.nvmlGpmMetricsGet = orig
    clk.advance(0.1)
    assert s.sample_once()[0].dram_bw_util == pytest.approx(50)
    s.stop()


def test_gpm_counters_in_use_turns_off_gpm_fields_only():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    fake.gpm_busy = True
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0)
    x = s.sample_once()[0]
    clk.advance(0.1)
    y = s.sample_once()[0]
    for smp in (x, y):
        assert all(getattr(smp, f) is None for f in GPM_FIELDS)
        assert smp.gpu_util is not None and smp.power_w is not None
    assert s.status == ("GPM counters in use by another profiler — GPM fields off "
                        "(retrying every 10 s)")
    assert fake.live_gpm_samples == 0 and s.gpm_enabled == {0: False}
    s.stop()


def test_gpm_comes_back_when_the_other_profiler_lets_go():
    """Counters held by another profiler (an Nsight run) are asked for again every 10 s; when
    they are free the GPM fields come back, and the status line turns healthy once a whole GPM
    window has been read."""
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    fake.set_load(0, sm_active=60.0, tensor_active=30.0, dram_bw_util=40.0)
    fake.gpm_busy = True
    seen: list[str] = []
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0, on_status=seen.append)
    s.sample_once()
    assert "in use by another profiler" in s.status
    calls = fake.calls.get("nvmlGpmSampleGet", 0)
    for _ in range(40):  # 4 s of 10 Hz ticks: no retry before 10 s
        clk.advance(0.1)
        assert s.sample_once()[0].sm_active is None
    assert fake.calls.get("nvmlGpmSampleGet", 0) == calls
    clk.advance(6.0)
    s.sample_once()  # retried at 10 s: still busy, the next retry scheduled
    assert fake.calls["nvmlGpmSampleGet"] == calls + 1 and fake.live_gpm_samples == 0
    assert "in use by another profiler" in s.status
    fake.gpm_busy = False  # the profiler ended
    clk.advance(5.0)
    assert s.sample_once()[0].sm_active is None  # not yet 10 s since the last retry
    clk.advance(5.0)
    s.sample_once()  # retry: the first GPM sample of a new window
    assert "in use by another profiler" in s.status  # not yet a whole window
    clk.advance(0.1)
    x = s.sample_once()[0]
    assert x.sm_active == pytest.approx(60) and x.tensor_active == pytest.approx(30)
    assert s.status == "NVML: 1 GPU (NVIDIA H200 (fake)), GPM on" and s.gpm_enabled == {0: True}
    assert seen[-1] == s.status  # the change reached on_status (a trace event)
    s.stop()
    assert fake.live_gpm_samples == 0


def test_gpm_retry_survives_a_failed_set_up_and_a_lost_gpu_drops_its_retry_line():
    clk = ManualClock()
    fake = FakeNvml(2, clock=clk, pcie_window_s=0)
    fake.gpm_busy = True
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0)
    s.sample_once()
    assert s.status.count("retrying every 10 s") == 2
    # at the retry the set-up itself fails once (a timeout): asked again 10 s later
    orig = fake.nvmlGpmQueryDeviceSupport

    def timeout_once(h):
        fake.nvmlGpmQueryDeviceSupport = orig
        raise fake.NVMLError_Timeout()

    fake.nvmlGpmQueryDeviceSupport = timeout_once
    fake.gpm_busy = False
    clk.advance(10.0)
    s.sample_once()
    clk.advance(0.1)
    s.sample_once()
    assert s.gpm_enabled[1] is True and s.gpm_enabled[0] is False  # GPU 0's set-up failed
    clk.advance(10.0)
    s.sample_once()
    clk.advance(0.1)
    s.sample_once()
    assert s.gpm_enabled == {0: True, 1: True} and s.status.endswith("GPM on")
    # a GPU lost while its counters are held: its line says lost, not "retrying"
    fake.gpm_busy = True
    clk.advance(0.2)
    s.sample_once()
    fake.lose(0)
    clk.advance(0.1)
    s.sample_once()
    assert "GPU 0 lost mid-run" in s.status
    assert s.status.count("retrying") == 1 and "on GPU 1 (retrying" in s.status
    s.stop()
    assert fake.live_gpm_samples == 0


def test_gpm_not_supported_device():
    s = NvmlSampler(nvml=FakeNvml(1, gpm=False), pcie_interval_s=0)
    x = s.sample_once()[0]
    s.stop()
    assert x.sm_active is None and x.gpu_util is not None
    assert "GPM off" in s.status


# ---- rate, cost, lifecycle --------------------------------------------------------------------

def test_sample_rate_is_honoured_at_50hz():
    fake = FakeNvml(1, pcie_window_s=0.02)
    got = []
    s = NvmlSampler(nvml=fake, sample_hz=50, on_sample=got.append)
    with s:
        assert s.wait_ready(2.0)
        t0 = time.monotonic()
        n0 = len(got)
        time.sleep(0.5)
        n = len(got) - n0
        dt = time.monotonic() - t0
    assert 0.6 * 50 * dt <= n <= 1.3 * 50 * dt + 2, n
    assert s.status.startswith("NVML: 1 GPU (NVIDIA H200 (fake)), GPM on")
    # GPM windows respect NVML's ~100 ms floor even at 50 Hz
    assert min(fake.gpm_intervals_ns[0]) >= 98_000_000
    # the 20 ms PCIe query ran on its own thread and reached the samples
    assert any(x.pcie_tx_kbps == 1024 and x.pcie_rx_kbps == 2048 for x in got)
    assert s.pcie_query_ms is not None and s.pcie_query_ms >= 35
    assert s.mean_tick_us < 5_000  # the 40 ms PCIe call stays out of the tick
    assert s.cpu_percent == s.cpu_percent  # measured (not NaN)
    assert not s.running and fake.live_gpm_samples == 0


def test_samples_are_bounded_and_latest_kept():
    fake = FakeNvml(2, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, maxlen=10, pcie_interval_s=0)
    for _ in range(20):
        s.sample_once()
    s.stop()
    assert len(s.samples) == 10
    assert set(s.latest) == {0, 1} and isinstance(s.latest[1], GpuSample)
    assert s.gpu_names == {0: "NVIDIA H200 (fake)", 1: "NVIDIA H200 (fake)"}
    assert s.status == "NVML: 2 GPUs (2× NVIDIA H200 (fake)), GPM on"


def test_gpus_subset():
    fake = FakeNvml(4, pcie_window_s=0)
    s = NvmlSampler([1, 3], nvml=fake, pcie_interval_s=0)
    out = s.sample_once()
    s.stop()
    assert [x.gpu for x in out] == [1, 3]


@pytest.mark.parametrize("hz", [0, 0.5, 101, float("nan"), "fast", True, None])
def test_sample_hz_out_of_range(hz):
    with pytest.raises(ConfigError) as e:
        NvmlSampler(nvml=FakeNvml(1), sample_hz=hz)
    assert "--sample-hz" in str(e.value) and "[1, 100]" in str(e.value)


@pytest.mark.parametrize("hz", [1, 10, 50, 100, "20"])
def test_sample_hz_in_range(hz):
    NvmlSampler(nvml=FakeNvml(1), sample_hz=hz)


def test_parse_gpus():
    assert parse_gpus("0,1", device_count=2) == [0, 1]
    assert parse_gpus("1, 0", device_count=2) == [0, 1]
    assert parse_gpus("0-3", device_count=8) == [0, 1, 2, 3]
    assert parse_gpus("all", device_count=2) is None
    assert parse_gpus(None) is None and parse_gpus("") is None
    assert parse_gpus("1", nvml=FakeNvml(2)) == [1]
    with pytest.raises(ConfigError, match=r"GPU 2 does not exist; 2 GPU\(s\) found, allowed "
                                          r"indices \[0, 1\]"):
        parse_gpus("0,2", device_count=2)
    with pytest.raises(ConfigError, match="GPU 5 does not exist"):
        parse_gpus("5", nvml=FakeNvml(2))
    for bad in ("x", "0,,a", "-1", "3-1", "1.5"):
        with pytest.raises(ConfigError, match="--gpus"):
            parse_gpus(bad, device_count=4)
    nodrv = FakeNvml(1)
    nodrv.init_error = pynvml.NVMLError_DriverNotLoaded
    assert parse_gpus("3", nvml=nodrv) == [3]  # unverifiable: the sampler reports NVML missing


def test_lazy_init_once_under_lock_and_shutdown():
    fake = FakeNvml(1)
    lib = nvml_library(fake)
    assert nvml_library(fake) is lib and fake.calls.get("nvmlInit", 0) == 0  # lazy
    barrier = threading.Barrier(8)

    def go():
        barrier.wait()
        lib.init()

    ts = [threading.Thread(target=go) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert fake.calls["nvmlInit"] == 1 and lib.initialised
    a = NvmlSampler(nvml=fake, pcie_interval_s=0)
    b = NvmlSampler(nvml=fake, pcie_interval_s=0)
    a.sample_once(), b.sample_once()
    a.stop(), b.stop()
    assert fake.calls["nvmlInit"] == 1
    lib.shutdown()
    lib.shutdown()
    assert fake.calls["nvmlShutdown"] == 1 and fake.initialised == 0


def test_sample_as_dict_round_trips():
    fake = FakeNvml(1, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, pcie_interval_s=0)
    x = s.sample_once()[0]
    s.stop()
    assert GpuSample(**x.as_dict()) == x


# ---- NVML calls per tick (each one a GIL round trip) -------------------------------------------

PER_TICK = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage")
SLOW = ("nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperatureV")
GPM = ("nvmlGpmSampleGet", "nvmlGpmMetricsGet")


def _tick_calls(fake: FakeNvml, before: dict[str, int]) -> int:
    return sum(v - before.get(k, 0) for k, v in fake.calls.items())


def test_calls_per_tick_are_bounded():
    clk = ManualClock()
    fake = FakeNvml(2, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, sample_hz=50, clock=clk, pcie_interval_s=0)
    s.sample_once()  # set-up and the first tick (every field once)
    per_tick = []
    for _ in range(100):  # 2 s at 50 Hz
        clk.advance(0.02)
        before = dict(fake.calls)
        s.sample_once()
        per_tick.append(_tick_calls(fake, before))
    s.stop()
    n_gpus = 2
    # most ticks: utilization, memory, power per GPU and nothing else
    assert sorted(per_tick)[len(per_tick) // 2] == 3 * n_gpus
    # a tick never asks for more than 3 + GPM 2 + slow 3 per GPU
    assert max(per_tick) <= 8 * n_gpus
    # on average: 3 + 2 per 100 ms GPM window (every 5th tick) + 3 per second (every 50th tick)
    assert sum(per_tick) / len(per_tick) <= n_gpus * (3 + 2 / 5 + 3 / 50) + 0.1
    # before the change every tick made 6 calls per GPU plus GPM
    assert sum(per_tick) / len(per_tick) < n_gpus * 6
    assert fake.calls["nvmlGpmMetricsGet"] <= fake.calls["nvmlGpmSampleGet"]  # one per window


def test_slow_fields_refresh_once_per_interval_and_are_staggered():
    clk = ManualClock()
    fake = FakeNvml(4, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, sample_hz=10, clock=clk, pcie_interval_s=0)
    first = s.sample_once()
    assert [x.temp_c for x in first] == [35] * 4 and [x.sm_clock_mhz for x in first] == [1980] * 4
    for g in range(4):
        fake.set_load(g, sm_active=80)   # temperature 55, SM clock 1660 from now on
    refreshed_at: dict[int, int] = {}
    for k in range(1, 25):               # 2.4 s at 10 Hz
        clk.advance(0.1)
        for x in s.sample_once():
            if x.temp_c == 55 and x.gpu not in refreshed_at:
                refreshed_at[x.gpu] = k
                assert x.sm_clock_mhz == 1660 and x.mem_clock_mhz == 2619
            if x.gpu not in refreshed_at:  # repeated until the refresh
                assert x.temp_c == 35 and x.sm_clock_mhz == 1980
            assert x.power_w == pytest.approx(90 + 6 * 80)  # read every tick
    s.stop()
    # every GPU refreshed within 2 intervals, GPU 0 after one, and not all in the same tick
    assert refreshed_at[0] == 10 and max(refreshed_at.values()) <= 20
    assert len(set(refreshed_at.values())) == 4


def test_fields_equal_every_tick_reading():
    """Defaults against ``slow_interval_s=0`` (every field every tick, the old behaviour)."""
    def run(**kw):
        clk = ManualClock()
        fake = FakeNvml(2, clock=clk, pcie_window_s=0)
        s = NvmlSampler(nvml=fake, sample_hz=20, clock=clk, pcie_interval_s=0, **kw)
        out = []
        for k in range(40):
            if k == 3:
                fake.set_load(1, sm_active=60, tensor_active=30, dram_bw_util=20)
            out += s.sample_once()
            clk.advance(0.05)
        s.stop()
        return out, fake.calls

    new, new_calls = run()
    old, old_calls = run(slow_interval_s=0)
    assert len(new) == len(old) == 80
    slow = {"temp_c", "sm_clock_mhz", "mem_clock_mhz"}
    for a, b in zip(new, old):
        da, db = a.as_dict(), b.as_dict()
        assert {k: v for k, v in da.items() if k not in slow} == \
               {k: v for k, v in db.items() if k not in slow}
        for k in slow:
            assert da[k] is not None
    # the slow fields agree wherever the load had not changed since the last refresh
    assert [x.temp_c for x in new if x.gpu == 0] == [x.temp_c for x in old if x.gpu == 0]
    assert new[-1] == old[-1]  # after 1.5 s every GPU has refreshed (2 s here)
    assert sum(new_calls.values()) < sum(old_calls.values()) * 0.7
    assert old_calls["nvmlDeviceGetClockInfo"] == 2 * 2 * 40


def test_slow_field_not_supported_and_transient_errors():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, sample_hz=10, clock=clk, pcie_interval_s=0)
    s.sample_once()
    fake.not_supported = {"nvmlDeviceGetClockInfo"}
    clk.advance(1.0)
    x = s.sample_once()[0]
    assert x.sm_clock_mhz is None and x.mem_clock_mhz is None and x.temp_c == 35
    n = fake.calls["nvmlDeviceGetClockInfo"]
    fake.not_supported = set()
    for _ in range(15):
        clk.advance(0.1)
        x = s.sample_once()[0]
        assert x.sm_clock_mhz is None  # NotSupported once: never asked again
    assert fake.calls["nvmlDeviceGetClockInfo"] == n
    # a transient error (not NotSupported): None this tick, asked again on the next one
    fake.lose(0, pynvml.NVMLError_Timeout)
    clk.advance(1.0)
    x = s.sample_once()[0]
    assert x.temp_c is None and x.power_w is None and s.available
    del fake.lost[0]
    n = fake.calls["nvmlDeviceGetTemperatureV"]
    clk.advance(0.1)
    assert s.sample_once()[0].temp_c == 35
    assert fake.calls["nvmlDeviceGetTemperatureV"] == n + 1
    clk.advance(0.1)
    s.sample_once()
    assert fake.calls["nvmlDeviceGetTemperatureV"] == n + 1  # then once per interval again
    s.stop()


def test_slow_interval_out_of_range():
    with pytest.raises(ConfigError, match="slow_interval_s"):
        NvmlSampler(nvml=FakeNvml(1), slow_interval_s=-1)


def test_gil_releasing_fake_still_samples():
    fake = FakeNvml(2, pcie_window_s=0, release_gil=True, call_us=5)
    s = NvmlSampler(nvml=fake, sample_hz=50, pcie_interval_s=0)
    with s:
        assert s.wait_ready(2.0)
        assert wait_for(lambda: len(s.samples) >= 10)
    assert all(x.temp_c == 35 and x.power_w == pytest.approx(90) for x in s.samples)


def test_parallel_reads_give_the_same_samples_and_handle_loss():
    def run(parallel):
        clk = ManualClock()
        fake = FakeNvml(3, clock=clk, pcie_window_s=0)
        s = NvmlSampler(nvml=fake, sample_hz=20, clock=clk, pcie_interval_s=0, parallel=parallel)
        out = []
        for k in range(10):
            if k == 5:
                fake.lose(1)
            out += s.sample_once()
            clk.advance(0.05)
        s.stop()
        return out, s, fake

    a, _, _ = run(False)
    b, s, fake = run(True)
    assert a == b and len(b) == 5 * 3 + 5 * 2
    assert "GPU 1 lost mid-run" in s.status and fake.live_gpm_samples == 0


def test_status_changes_become_trace_events():
    """on_event gets each status change as an EngineEvent for the trace: none for a healthy
    start, a warning when GPM counters are taken, a notice when they are back; NVML missing at
    start is a warning too."""
    from gpuchef.engine_host.vocab.records import EngineEvent

    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    events: list[EngineEvent] = []
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0, on_event=events.append)
    s.sample_once()
    assert events == []  # healthy start
    fake.gpm_busy = True
    clk.advance(0.1)
    s.sample_once()
    (w,) = events
    assert (w.kind, w.name, w.step) == ("warning", "nvml", -1)
    assert w.old.endswith("GPM on") and w.new == s.status and "in use" in w.message
    assert w.t_ns == clk()
    fake.gpm_busy = False
    for _ in range(2):  # the retry, then a whole window
        clk.advance(10.0)
        s.sample_once()
    n = events[-1]
    assert (n.kind, n.old, n.new) == ("notice", w.new, s.status) and s.status.endswith("GPM on")
    s.stop()

    missing = FakeNvml(1)
    missing.init_error = missing.NVMLError_LibraryNotFound
    got: list[EngineEvent] = []
    m = NvmlSampler(nvml=missing, pcie_interval_s=0, on_event=got.append)
    m.sample_once()
    assert [e.kind for e in got] == ["warning"] and "not available" in got[0].message
    m.stop()


def test_gpm_turned_off_after_failing_windows_comes_back_when_nvml_recovers():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    fake.set_load(0, sm_active=70.0)
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0)
    s.sample_once()
    orig = fake.nvmlGpmSampleGet

    def failing(h, smp):
        raise fake.NVMLError_Unknown()

    fake.nvmlGpmSampleGet = failing
    for _ in range(60):  # 50 failed windows turn GPM off (the GPU itself still answers)
        clk.advance(0.1)
        x = s.sample_once()[0]
    assert x.gpu_util is not None and x.sm_active is None
    assert "GPM failing" in s.status and "retrying every 10 s" in s.status
    assert s.gpm_enabled == {0: False} and fake.live_gpm_samples == 0
    fake.nvmlGpmSampleGet = orig  # NVML recovered
    for _ in range(2):  # the retry, then a whole window
        clk.advance(10.0)
        x = s.sample_once()[0]
    assert x.sm_active == pytest.approx(70) and s.status.endswith("GPM on")
    s.stop()
    assert fake.live_gpm_samples == 0

# ---- inputs that hung or filled the memory: a huge --gpus range; NVML failing mid-run -------

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
