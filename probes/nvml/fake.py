"""``FakeNvml``: a stand-in for the pynvml module, for tests, benchmarks and demos without a GPU.

It raises pynvml's real exception classes and has its constants, so :class:`NvmlSampler` runs
over it exactly as over pynvml: ``NvmlSampler(nvml=FakeNvml(2))``. A test double, not part of
the sampler: nothing in gpuchef's commands imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .fields import BY_NAME, GPM_FIELDS, GPM_METRICS

_LIBC: Any = None
_SM_ACTIVE = BY_NAME["sm_active"].gpm_metric[1]    # the GPM metric ids the other fields follow
_DRAM_BW = BY_NAME["dram_bw_util"].gpm_metric[1]
_GRAPHICS_UTIL = 1                                  # NVML_GPM_METRIC_GRAPHICS_UTIL (not sampled)


def _c_usleep(us: int) -> None:
    global _LIBC
    if _LIBC is None:
        import ctypes
        _LIBC = ctypes.CDLL(None)
    _LIBC.usleep(us)


class _Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class _FakeGpmMetricsGet:
    """Python twin of pynvml's ``c_nvmlGpmMetricsGet_t`` (same attribute names)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1 = None
        self.sample2 = None
        self.metrics = [_Obj(metricId=0, nvmlReturn=0, value=0.0) for _ in range(32)]


class _FakeGpmSample:
    __slots__ = ("gpu", "t_ns", "counters", "freed")

    def __init__(self) -> None:
        self.gpu = -1
        self.t_ns = 0
        self.counters: dict[int, float] = {}
        self.freed = False


class FakeNvml:
    """A stand-in for the ``pynvml`` module that raises pynvml's real exception classes.

    Use: ``NvmlSampler(nvml=FakeNvml(2))``. It has the constants and ``NVMLError*`` classes of the
    installed pynvml and fakes the functions the sampler calls. Knobs for tests:
    ``init_error`` (an exception class raised by ``nvmlInit``), ``not_supported`` (names of
    functions that raise NVMLError_NotSupported), ``gpm_supported``, ``gpm_unsupported_metrics``
    (metric ids answered with NOT_SUPPORTED), ``gpm_busy`` (``nvmlGpmSampleGet`` raises
    NVMLError_InUse), :meth:`lose` (a GPU raises NVMLError_GpuIsLost, or another class, from then on),
    :meth:`set_load` (the GPM activity the next windows average), ``pcie_window_s`` (how long a
    PCIe query blocks, 0.02 s like the real one). ``calls`` counts calls by name;
    ``gpm_intervals_ns`` records the spacing of GPM samples per GPU.
    ``release_gil``: every call goes through one C function via ctypes (libc ``usleep``), which
    releases and re-acquires the GIL the way each pynvml call does — so a GIL-bound thread beside
    the sampler slows it on a CPU machine as it does on a GPU one; ``call_us`` is the time
    spent inside that C call (the driver's share; default 0).
    """

    def __init__(self, n_gpus: int = 1, name: str = "NVIDIA H200 (fake)", *, gpm: bool = True,
                 clock: Callable[[], int] = time.monotonic_ns, pcie_window_s: float = 0.02,
                 mem_total_bytes: int = 143_771_566_080, release_gil: bool = False,
                 call_us: int = 0) -> None:
        import pynvml as real  # for the real error classes and constants
        for k in dir(real):
            if k.startswith(("NVML_", "NVMLError")):
                setattr(self, k, getattr(real, k))
        self.c_nvmlGpmMetricsGet_t = _FakeGpmMetricsGet
        self.n_gpus = n_gpus
        self.name = name
        self.clock = clock
        self.init_error: type[BaseException] | None = None
        self.not_supported: set[str] = set()
        self.gpm_supported = gpm
        self.gpm_unsupported_metrics: set[int] = set()
        self.gpm_busy = False
        self.lost: dict[int, type[BaseException]] = {}
        self.pcie_window_s = pcie_window_s
        self.mem_total_bytes = mem_total_bytes
        self.release_gil = release_gil
        self.call_us = int(call_us)
        self.initialised = 0
        self.calls: dict[str, int] = {}
        self.gpm_intervals_ns: dict[int, list[int]] = {}
        self.live_gpm_samples = 0
        self._load: dict[int, dict[int, float]] = {i: {} for i in range(n_gpus)}
        self._acc: dict[int, dict[int, float]] = {i: {} for i in range(n_gpus)}
        self._acc_t: dict[int, int] = {i: clock() for i in range(n_gpus)}
        self._last_gpm: dict[int, int] = {}

    # -- knobs
    def lose(self, gpu: int, error: type[BaseException] | None = None) -> None:
        """From now on every call on ``gpu`` raises ``error`` (default NVMLError_GpuIsLost)."""
        self.lost[gpu] = error or self.NVMLError_GpuIsLost

    def set_load(self, gpu: int = 0, **load: float) -> None:
        """Set the GPM activity (%, 0–100) from now on, by GPM field (``sm_active=70``,
        ``sm_occupancy``, ``tensor_active``, ``dram_bw_util``: ``fields.GPM_FIELDS``; 0 for a
        field not named); GPM windows report its time average. GPU-Util, memory-Util, power,
        the SM clock and the temperature follow SM active and DRAM bandwidth."""
        unknown = sorted(set(load) - set(GPM_FIELDS))
        if unknown:
            raise TypeError(f"set_load: not a GPM field: {', '.join(unknown)} "
                            f"(GPM fields: {', '.join(GPM_FIELDS)})")
        self._accumulate(gpu)
        self._load[gpu] = {mid: float(load.get(f, 0.0)) for f, _, mid in GPM_METRICS}
        self._load[gpu][_GRAPHICS_UTIL] = min(100.0, load.get("sm_active", 0.0) * 1.05)

    def _accumulate(self, gpu: int) -> None:
        now = self.clock()
        dt = now - self._acc_t[gpu]
        acc = self._acc[gpu]
        for mid, pct in self._load[gpu].items():
            acc[mid] = acc.get(mid, 0.0) + pct * dt
        self._acc_t[gpu] = now

    def _call(self, fn: str, h: Any = None) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if self.release_gil:
            _c_usleep(self.call_us)  # ctypes drops the GIL for the C call, as pynvml's calls do
        if fn in self.not_supported:
            raise self.NVMLError_NotSupported()
        if h is not None and h.index in self.lost:
            raise self.lost[h.index]()

    # -- library
    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialised = max(0, self.initialised - 1)

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return self.n_gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < self.n_gpus:
            raise self.NVMLError_InvalidArgument()
        return _Obj(index=i)

    def nvmlDeviceGetName(self, h: Any) -> str:
        self._call("nvmlDeviceGetName", h)
        return self.name

    # -- per-tick fields
    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        self._call("nvmlDeviceGetUtilizationRates", h)
        busy = self._load[h.index].get(_SM_ACTIVE, 0.0)
        return _Obj(gpu=100 if busy > 0 else 0,
                    memory=int(self._load[h.index].get(_DRAM_BW, 0.0)))

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        self._call("nvmlDeviceGetMemoryInfo", h)
        used = self.mem_total_bytes // 3
        return _Obj(total=self.mem_total_bytes, used=used, free=self.mem_total_bytes - used)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        self._call("nvmlDeviceGetPowerUsage", h)
        return int(90_000 + 6_000 * self._load[h.index].get(_SM_ACTIVE, 0.0))  # mW

    def nvmlDeviceGetClockInfo(self, h: Any, which: int) -> int:
        self._call("nvmlDeviceGetClockInfo", h)
        if which == self.NVML_CLOCK_SM:  # a power cap pulls the SM clock down under load
            return 1980 - int(4 * self._load[h.index].get(_SM_ACTIVE, 0.0))
        return 2619

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperature", h)
        return 35 + int(self._load[h.index].get(_SM_ACTIVE, 0.0) / 4)

    def nvmlDeviceGetTemperatureV(self, h: Any, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperatureV", h)
        return 35 + int(self._load[h.index].get(_SM_ACTIVE, 0.0) / 4)

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        self._call("nvmlDeviceGetPcieThroughput", h)
        if self.pcie_window_s:
            time.sleep(self.pcie_window_s)  # the real call measures a 20 ms window
        return 1024 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 2048  # KB/s

    # -- GPM
    def nvmlGpmQueryDeviceSupport(self, h: Any) -> Any:
        self._call("nvmlGpmQueryDeviceSupport", h)
        return _Obj(version=1, isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> _FakeGpmSample:
        self._call("nvmlGpmSampleAlloc")
        self.live_gpm_samples += 1
        return _FakeGpmSample()

    def nvmlGpmSampleFree(self, s: _FakeGpmSample) -> None:
        self._call("nvmlGpmSampleFree")
        if not s.freed:
            s.freed = True
            self.live_gpm_samples -= 1

    def nvmlGpmSampleGet(self, h: Any, s: _FakeGpmSample) -> _FakeGpmSample:
        self._call("nvmlGpmSampleGet", h)
        if self.gpm_busy:
            raise self.NVMLError_InUse()
        self._accumulate(h.index)
        now = self._acc_t[h.index]
        last = self._last_gpm.get(h.index)
        if last is not None:
            self.gpm_intervals_ns.setdefault(h.index, []).append(now - last)
        self._last_gpm[h.index] = now
        s.gpu, s.t_ns, s.counters = h.index, now, dict(self._acc[h.index])
        return s

    def nvmlGpmMetricsGet(self, req: _FakeGpmMetricsGet) -> _FakeGpmMetricsGet:
        self._call("nvmlGpmMetricsGet")
        a, b = req.sample1, req.sample2
        dt = b.t_ns - a.t_ns
        for j in range(req.numMetrics):
            m = req.metrics[j]
            if m.metricId in self.gpm_unsupported_metrics:
                m.nvmlReturn, m.value = self.NVML_ERROR_NOT_SUPPORTED, 0.0
            elif dt <= 0:
                m.nvmlReturn, m.value = self.NVML_ERROR_INVALID_ARGUMENT, 0.0
            else:
                d = b.counters.get(m.metricId, 0.0) - a.counters.get(m.metricId, 0.0)
                m.nvmlReturn, m.value = self.NVML_SUCCESS, d / dt
        return req
