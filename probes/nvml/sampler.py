"""NVML + GPM sampler: one daemon thread samples every GPU (or ``--gpus``) at ``--sample-hz``.

* :class:`GpuSample` — one reading of one GPU (frozen, slots; what the timeline and the trace
  keep).
* :class:`NvmlSampler` — the thread, over the binding in ``library.py``. It never raises into
  the session: NVML missing, a GPU lost mid-run, NVML not answering for a second (the line goes
  when it answers again) or GPM counters held by another profiler end up as one line in
  :attr:`NvmlSampler.status` (held counters are asked for again every ``GPM_RETRY_S``, 10 s, and
  GPM comes back when they are free).

Usage::

    gpus = parse_gpus("0,1")                      # ConfigError names a bad index and the count
    with NvmlSampler(gpus, sample_hz=20, on_sample=timeline.add_gpu_sample) as s:
        s.wait_ready(2.0); print(s.status)        # "NVML: 2 GPUs (2× NVIDIA H200), GPM on"
        ...

Per tick and GPU the sampler makes 3 NVML calls (utilization, memory, power) plus, when a GPM
window closes, ``nvmlGpmSampleGet`` and ``nvmlGpmMetricsGet`` (one call for all metrics), plus,
once every ``slow_interval_s``, 3 more for the slow fields (temperature, SM clock, memory clock);
a field that answered NotSupported once is not asked again. The count matters more than the time
each call takes (~10 µs): every pynvml call is a ctypes call, which releases the GIL and has to
win it back afterwards — behind a GIL-bound thread (the engine, the dashboard) that waits up to
``sys.getswitchinterval()`` (Python's 5 ms; gpuchef's sessions set 0.5 ms, engine_host/host.py),
so 6–8 calls per GPU cost tens of ms per tick at 5 ms (docs/benchmarks.md, "NVML/GPM sampler
cost"). ``nvmlDeviceGetFieldValues`` cannot merge these: of the sampled fields only power has a
field id (``NVML_FI_DEV_POWER_AVERAGE`` / ``_INSTANT``), none exists for utilization, memory,
clocks or the GPU temperature, so it would replace one call by one.

Cadences that differ from ``--sample-hz`` (both facts from the NVML API reference):

* **GPM**: NVML documents that two ``nvmlGpmSampleGet`` calls should be more than 100 ms apart
  ("internal sample refresh rate"). The sampler keeps the previous GPM sample per GPU, and on the
  first tick at least ``gpm_interval_s`` (default 0.1 s, less 2 ms of scheduling jitter) after it,
  takes a new one and computes ``nvmlGpmMetricsGet`` against it, then swaps the two buffers.
  Nothing sleeps inside a call. At 10 Hz that is every tick; at 50 Hz every 5th tick, and the ticks
  in between repeat the last GPM values (each the mean over the last GPM window). Values older than
  ``5 × gpm_interval_s`` are dropped to None.
* **PCIe**: ``nvmlDeviceGetPcieThroughput`` measures a byte counter over a 20 ms window inside the
  call, so one GPU's TX + RX costs ~40 ms — more than a whole 50 Hz tick. It therefore runs on a
  second daemon thread every ``pcie_interval_s`` (default 1 s; 0 turns PCIe off) and the samples
  carry its latest reading. ``NvmlSampler.pcie_query_ms`` holds the measured cost of the last pair.
* **Slow fields** (temperature, SM clock, memory clock): read on the first tick and then on the
  first tick at least ``slow_interval_s`` (default 1 s; 0 = every tick) after the last reading;
  the ticks in between repeat it. Temperature moves over seconds, the HBM clock only with the
  P-state; the SM clock can move faster under a power cap, so it is the coarsest of the three —
  pass ``slow_interval_s=0`` to read all of them every tick. With several GPUs the refreshes are
  staggered over the interval so that no single tick pays for all of them.

Power is ``nvmlDeviceGetPowerUsage``, which NVML documents as a 1 s average on Ampere (except
GA100) and newer, the instantaneous draw on older GPUs. GPU-Util / memory-Util are NVML's
"percent of the sample period in which a kernel ran / memory was read or written" (REFERENCE §5):
liveness, not saturation — SM active and tensor active (GPM) are the saturation signals.

GPU indices are NVML's (as ``nvidia-smi`` numbers them), not CUDA's after CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.records import EngineEvent

from ..sampler import PeriodicSampler, check_sample_hz
from .fields import GPM_FIELDS, GPM_METRICS
from .library import NA, NvmlUnavailable, describe_nvml_error, nvml_library


SAMPLE_HZ_RANGE = (1.0, 100.0)
DEFAULT_SAMPLE_HZ = 10.0
DEFAULT_GPM_INTERVAL_S = 0.1   # NVML: GPM samples "should be more than 100 ms" apart
GPM_JITTER_NS = 2_000_000      # a tick woken 2 ms late must not push the next GPM window a tick out
DEFAULT_PCIE_INTERVAL_S = 1.0
DEFAULT_SLOW_INTERVAL_S = 1.0  # temperature, SM clock, memory clock
GPM_MAX_FAILS = 50             # consecutive GPM errors before GPM is turned off for that GPU
GPM_RETRY_S = 10.0             # counters held by another profiler: ask again this often
FAILING_AFTER_NS = 1_000_000_000  # every per-tick field of a GPU erroring this long: a status line


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. Any field but ``t_ns``/``gpu`` is None when not available.

    Its fields after ``t_ns``/``gpu`` are ``fields.FIELDS`` in order (units, NVML calls,
    cadences; ``tests/probes/test_gpu_fields.py`` checks that they agree).

    ``t_ns``: ``time.monotonic_ns()`` (or the sampler's injected clock) when the tick began.
    ``gpu``: NVML index. ``gpu_util`` / ``mem_util``: % of NVML's sample period (~200 ms on H200)
    in which a kernel ran / device memory was read or written (``nvmlDeviceGetUtilizationRates``).
    ``mem_used_bytes`` / ``mem_total_bytes``: device memory (bytes). ``power_w``: board power (W;
    a 1 s average on Ampere+). ``sm_clock_mhz`` / ``mem_clock_mhz``: current clocks (MHz).
    ``temp_c``: GPU temperature (°C). Clocks and temperature are refreshed every
    ``slow_interval_s`` (1 s by default) and repeated in between. ``pcie_tx_kbps`` / ``pcie_rx_kbps``: PCIe throughput in
    KB/s as NVML reports it (a 20 ms window, refreshed every ``pcie_interval_s``).
    GPM (Hopper+), each % in [0, 100] over the last GPM window (≥ ~100 ms):
    ``sm_active`` (SM_UTIL: share of SMs busy), ``sm_occupancy`` (active warps vs the maximum),
    ``tensor_active`` (ANY_TENSOR_UTIL: SMs doing any tensor op), ``dram_bw_util`` (DRAM
    bandwidth used vs the peak).
    """

    t_ns: int
    gpu: int
    gpu_util: int | None = None
    mem_util: int | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temp_c: int | None = None
    pcie_tx_kbps: int | None = None
    pcie_rx_kbps: int | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bw_util: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _GpuLost(Exception):
    pass


class _Gpu:
    """Per-GPU state owned by the sampling thread."""

    __slots__ = ("index", "handle", "name", "off", "lost", "gpm_on", "gpm_prev", "gpm_cur",
                 "gpm_req", "gpm_slots", "gpm_have_prev", "gpm_last_ns", "gpm_good_ns",
                 "gpm_values", "gpm_fails", "pcie", "errors", "last_error", "temp_fn",
                 "slow", "slow_next_ns", "gpm_seen_ok", "fail_since_ns", "fail_reason",
                 "gpm_retry_ns", "gpm_recovering")

    def __init__(self, index: int, handle: Any, name: str) -> None:
        self.index = index
        self.handle = handle
        self.name = name
        self.off: set[str] = set()          # fields that answered "not available"
        self.lost: str | None = None
        self.gpm_on = False
        self.gpm_prev = self.gpm_cur = self.gpm_req = None
        self.gpm_slots: list[int] = []     # GPM_METRICS indices requested, in request order
        self.gpm_have_prev = False
        self.gpm_last_ns = 0
        self.gpm_good_ns = 0
        self.gpm_values: list[float | None] = [None] * len(GPM_METRICS)
        self.gpm_fails = 0                  # consecutive failed GPM windows
        self.gpm_seen_ok: set[int] = set()  # GPM_METRICS indices that have answered at least once
        self.pcie: tuple[int | None, int | None] = (None, None)
        self.errors = 0
        self.last_error = ""
        self.temp_fn: Callable[..., Any] | None = None
        self.slow: tuple[Any, Any, Any] = (NA, NA, NA)  # last SM clock, memory clock, temperature
        self.slow_next_ns: int | None = None            # None: read the slow fields this tick
        self.gpm_retry_ns: int | None = None  # GPM counters were busy: try them again then
        self.gpm_recovering = False           # retried: healthy once a full window is read
        self.fail_since_ns: int | None = None  # first tick of a run in which every asked field erred
        self.fail_reason = ""


def _name(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlSampler(PeriodicSampler):
    """Samples GPUs through NVML (+ GPM on Hopper and newer) on a daemon thread.

    ``gpus``: NVML indices (None = all; see :func:`parse_gpus`). ``sample_hz``: ticks per second,
    in [1, 100] (ConfigError otherwise; default 10, as ``--sample-hz``).
    ``nvml``: a stand-in for the pynvml module (tests); default ``import pynvml`` in the thread.
    ``clock``: gives ``GpuSample.t_ns`` and times GPM windows (default ``time.monotonic_ns``).
    ``on_sample(GpuSample)``: called on the sampler thread for every sample (keep it cheap).
    ``on_status(str)``: called with the new status line whenever it changes (e.g. to record a
    warning event in the trace). ``on_event(EngineEvent)``: the same changes as trace events —
    kind "warning" (a problem, NVML missing) or "notice" (healthy again), ``name`` "nvml",
    ``old``/``new`` the previous and new line, ``step`` -1 (not tied to an engine step); a
    healthy start-up gives none. ``maxlen``: samples kept in ``samples`` (a bounded deque).
    ``gpm_interval_s``: shortest GPM window (≥ 0.1 s, NVML's floor). ``pcie_interval_s``: PCIe
    refresh period (0 = off). ``slow_interval_s``: refresh period of temperature and clocks
    (0 = every tick; see the module doc). ``parallel``: read the GPUs of a tick on one worker
    thread each (opt-in: beside a GIL-bound thread it keeps the rate with many GPUs, but that
    thread loses more of its throughput; the figures are in docs/benchmarks.md).

    NVML is initialised in the thread, so ``start()`` never blocks the caller; ``wait_ready()``
    waits for set-up. Read ``status``, ``latest`` (dict gpu → newest sample), ``gpu_names``,
    ``gpm_enabled`` and ``available`` from any thread.
    """

    thread_name = "gpuchef-nvml"

    def __init__(self, gpus: list[int] | None = None, sample_hz: float = DEFAULT_SAMPLE_HZ,
                 nvml: Any = None, clock: Callable[[], int] = time.monotonic_ns,
                 on_sample: Callable[[GpuSample], None] | None = None, *,
                 on_status: Callable[[str], None] | None = None,
                 on_event: Callable[[EngineEvent], None] | None = None, maxlen: int = 8192,
                 gpm_interval_s: float = DEFAULT_GPM_INTERVAL_S,
                 pcie_interval_s: float = DEFAULT_PCIE_INTERVAL_S,
                 slow_interval_s: float = DEFAULT_SLOW_INTERVAL_S,
                 parallel: bool = False) -> None:
        hz = check_sample_hz(sample_hz, *SAMPLE_HZ_RANGE, flag="--sample-hz")
        super().__init__(hz, maxlen=maxlen, on_sample=on_sample, clock=clock)
        if gpm_interval_s < DEFAULT_GPM_INTERVAL_S:
            raise ConfigError(f"gpm_interval_s {gpm_interval_s!r} is too short: NVML needs "
                              f">= {DEFAULT_GPM_INTERVAL_S} s between GPM samples")
        if pcie_interval_s != 0 and not 0.1 <= pcie_interval_s <= 3600:
            raise ConfigError(f"pcie_interval_s {pcie_interval_s!r} is out of range: "
                              "allowed 0 (off) or [0.1, 3600] s")
        if not 0 <= slow_interval_s <= 3600:
            raise ConfigError(f"slow_interval_s {slow_interval_s!r} is out of range: "
                              "allowed [0, 3600] s (0 = every tick)")
        self.gpus_requested = None if gpus is None else [int(i) for i in gpus]
        self._nvml_arg = nvml
        self._lib: NvmlLibrary | None = None
        self._nv: Any = None
        self._gpus: list[_Gpu] = []
        self._live: list[_Gpu] = []
        self.on_status = on_status
        self.on_event = on_event
        self._summary = "NVML: starting"
        self._problems: dict[tuple[str, int], str] = {}
        self.status = self._summary
        self.available = False
        self.latest: dict[int, GpuSample] = {}
        self.gpu_names: dict[int, str] = {}
        self.gpm_enabled: dict[int, bool] = {}
        self._gpm_interval_ns = int(gpm_interval_s * 1e9)
        self._pcie_interval_s = float(pcie_interval_s)
        self._slow_interval_ns = int(slow_interval_s * 1e9)
        self._parallel = bool(parallel)
        self._pool: Any = None
        self._pcie_thread: threading.Thread | None = None
        self.pcie_query_ms: float | None = None
        self._set_up = False

    # ---- status ----------------------------------------------------------------------------
    @property
    def problems(self) -> list[str]:
        """Every current problem line, oldest first (``status`` joins them with "; ")."""
        return list(self._problems.values())

    @property
    def summary(self) -> str:
        """The healthy-state line ("NVML: 1 GPU (NVIDIA H200), GPM on"), even when ``status``
        shows problems instead."""
        return self._summary

    def _update_status(self) -> None:
        new = "; ".join(self._problems.values()) if self._problems else self._summary
        if new != self.status:
            old, self.status = self.status, new
            cb = self.on_status
            if cb is not None:
                try:
                    cb(new)
                except Exception:
                    self.on_status = None
            healthy = self.available and not self._problems
            ev = self.on_event
            if ev is not None and not (healthy and old == "NVML: starting"):
                try:  # for the trace: every change but a healthy start
                    ev(EngineEvent("warning" if not healthy else "notice", -1, self.clock(),
                                   name="nvml", old=old, new=new, message=new))
                except Exception:
                    self.on_event = None

    def _problem(self, key: tuple[str, int], line: str) -> None:
        self._problems[key] = line
        self._update_status()

    def _make_summary(self) -> str:
        n = len(self._gpus)
        names = [g.name for g in self._gpus]
        if len(set(names)) == 1:
            desc = names[0] if n == 1 else f"{n}× {names[0]}"
        else:
            desc = ", ".join(names)
        on = [g.index for g in self._gpus if g.gpm_on]
        if not on:
            gpm = "GPM off (not supported on this GPU)" if n == 1 else "GPM off (not supported)"
        elif len(on) == n:
            gpm = "GPM on"
        else:
            gpm = "GPM on GPU " + ",".join(map(str, on))
        return f"NVML: {n} GPU{'s' if n != 1 else ''} ({desc}), {gpm}"

    # ---- set-up / teardown (sampler thread) --------------------------------------------------
    def _setup(self) -> bool:
        if self._set_up:
            return bool(self._live)
        self._set_up = True
        try:
            lib = self._lib = nvml_library(self._nvml_arg)
            self._nv = lib.module
            count = lib.device_count()
        except NvmlUnavailable as e:
            self._summary = f"NVML not available: {e}"
            if self.gpus_requested is not None:  # --gpus cannot be checked without NVML
                ids = ",".join(map(str, self.gpus_requested))
                self._summary += f"; --gpus {ids} not sampled"
            self._update_status()
            return False
        nv = self._nv
        wanted = list(range(count)) if self.gpus_requested is None else self.gpus_requested
        if not wanted:
            self._summary = "NVML: no GPU found" if count == 0 else \
                "NVML: no GPU selected"
            self._update_status()
            return False
        for i in wanted:
            if not 0 <= i < count:
                self._problem(("missing", i), f"GPU {i} not found ({count} GPU(s)) — skipped")
                continue
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = lib.query(nv.nvmlDeviceGetName, h)
                g = _Gpu(i, h, "GPU" if name is NA else _name(name))
            except lib.base_error as e:
                self._problem(("lost", i), f"GPU {i} unusable: {describe_nvml_error(e)} — skipped")
                continue
            self._gpus.append(g)
            g.temp_fn = self._pick_temperature_fn(h)
            self._setup_gpm(g)
            self.gpu_names[i] = g.name
            self.gpm_enabled[i] = g.gpm_on
        self._live = list(self._gpus)
        if not self._live:
            self._summary = "NVML: no usable GPU"
            self._update_status()
            return False
        self.available = True
        self._summary = self._make_summary()
        self._update_status()
        if self._pcie_interval_s > 0 and hasattr(nv, "nvmlDeviceGetPcieThroughput"):
            self._pcie_thread = threading.Thread(target=self._pcie_loop, name="gpuchef-nvml-pcie",
                                                 daemon=True)
            self._pcie_thread.start()
        return True

    def _pick_temperature_fn(self, h: Any) -> Callable[..., Any] | None:
        # nvmlDeviceGetTemperature is deprecated ("removed in CUDA 14"); its successor
        # nvmlDeviceGetTemperatureV is missing from older drivers (FunctionNotFound → NA).
        nv = self._nv
        for name in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"):
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                if self._lib.query(fn, h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)) is not NA:
                    return fn
            except self._lib.base_error:
                return fn  # a transient error: the per-tick helper will judge
        return None

    def _setup_gpm(self, g: _Gpu) -> None:
        nv, lib = self._nv, self._lib
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return
        try:
            sup = lib.query(nv.nvmlGpmQueryDeviceSupport, g.handle)
            if sup is NA or not getattr(sup, "isSupportedDevice", 0):
                return
            g.gpm_prev = nv.nvmlGpmSampleAlloc()
            g.gpm_cur = nv.nvmlGpmSampleAlloc()
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
            g.gpm_req = req
        except lib.base_error as e:
            self._free_gpm(g)
            self._problem(("gpm", g.index), f"GPU {g.index}: GPM unavailable "
                                            f"({describe_nvml_error(e)}) — GPM fields off")
            return
        g.gpm_slots = list(range(len(GPM_METRICS)))
        self._fill_gpm_request(g)
        g.gpm_on = True

    def _fill_gpm_request(self, g: _Gpu) -> None:
        req = g.gpm_req
        for j, k in enumerate(g.gpm_slots):
            field, const, default_id = GPM_METRICS[k]
            req.metrics[j].metricId = getattr(self._nv, const, default_id)
        req.numMetrics = len(g.gpm_slots)

    def _free_gpm(self, g: _Gpu) -> None:
        for attr in ("gpm_prev", "gpm_cur"):
            s = getattr(g, attr)
            if s is not None:
                try:
                    self._nv.nvmlGpmSampleFree(s)
                except Exception:
                    pass
                setattr(g, attr, None)
        g.gpm_on = False
        g.gpm_have_prev = False
        g.gpm_values = [None] * len(GPM_METRICS)
        self.gpm_enabled[g.index] = False

    def _teardown(self) -> None:
        self._stop.set()  # the PCIe thread shares the stop event
        t = self._pcie_thread
        if t is not None:
            t.join(1.0)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for g in self._gpus:
            self._free_gpm(g)

    # ---- the tick ----------------------------------------------------------------------------
    def sample_once(self) -> list[GpuSample]:
        """One synchronous tick over all live GPUs (sets up on first use); returns its samples.

        For tests and benchmarks: do not call it while the thread runs. Emits to ``samples``
        and ``on_sample`` like the thread does.
        """
        if not self._set_up:
            self._setup()
        try:
            out = self._tick()
        except StopIteration:
            return []
        for s in out:
            self._emit(s)
        return out

    def _tick(self) -> list[GpuSample]:
        if not self._live:
            raise StopIteration
        t = self.clock()
        out = []
        if self._parallel and len(self._live) > 1:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor
                self._pool = ThreadPoolExecutor(len(self._gpus), thread_name_prefix="gpuchef-nvml")
            reads = [(g, self._pool.submit(self._read, g, t)) for g in self._live]
        else:
            reads = [(g, None) for g in self._live]
        for g, fut in reads:
            try:
                s = self._read(g, t) if fut is None else fut.result()
            except _GpuLost as e:
                self._lose(g, str(e))
                continue
            self.latest[g.index] = s
            out.append(s)
            self._check_failing(g, t)
        return out  # when the last GPU was lost, the next tick ends the thread

    def _check_failing(self, g: _Gpu, t: int) -> None:
        # NVML erring on every call without calling the GPU lost (the driver unloaded, NVML shut
        # down by another library, timeouts): a status line after FAILING_AFTER_NS, gone when
        # NVML answers again; the samples meanwhile hold None
        key = ("failing", g.index)
        if g.fail_since_ns is not None and t - g.fail_since_ns >= FAILING_AFTER_NS:
            self._problem(key, f"GPU {g.index}: NVML not answering ({g.fail_reason}) — its "
                               "fields are n/a until it does")
        elif g.fail_since_ns is None and key in self._problems:
            del self._problems[key]
            self._update_status()

    def _lose(self, g: _Gpu, reason: str) -> None:
        g.lost = reason
        self._live = [x for x in self._live if x is not g]
        self._free_gpm(g)
        g.gpm_retry_ns = None
        self._problems.pop(("gpm", g.index), None)  # a lost GPU is not read, nor retried
        self._problems.pop(("failing", g.index), None)  # "lost" says more than "not answering"
        self._problem(("lost", g.index), f"GPU {g.index} lost mid-run: {reason} — sampling stopped")

    def _field(self, g: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        if key in g.off:
            return NA
        try:
            v = self._lib.query(fn, *args)
        except self._lib.lost_errors as e:
            raise _GpuLost(describe_nvml_error(e)) from e
        except self._lib.base_error as e:  # transient (timeout, …): None this tick only
            g.errors += 1
            g.last_error = f"{key}: {describe_nvml_error(e)}"
            return NA
        if v is NA:
            g.off.add(key)
        return v

    def _read(self, g: _Gpu, t: int) -> GpuSample:
        nv, h = self._nv, g.handle
        f = self._field
        errors = g.errors
        u = f(g, "util", nv.nvmlDeviceGetUtilizationRates, h)
        m = f(g, "mem", nv.nvmlDeviceGetMemoryInfo, h)
        p = f(g, "power", nv.nvmlDeviceGetPowerUsage, h)
        if u is NA and m is NA and p is NA and g.errors > errors:  # erred, not "not supported"
            if g.fail_since_ns is None:
                g.fail_since_ns, g.fail_reason = t, g.last_error.partition(": ")[2]
        else:
            g.fail_since_ns = None
        if g.slow_next_ns is None or t >= g.slow_next_ns:
            errors = g.errors
            g.slow = (f(g, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                      f(g, "mem_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                      f(g, "temp", g.temp_fn, h, nv.NVML_TEMPERATURE_GPU) if g.temp_fn else NA)
            if g.errors == errors:  # a transient error: ask again on the next tick
                iv = self._slow_interval_ns
                if g.slow_next_ns is None and len(self._gpus) > 1:
                    # the first refresh after start-up is staggered by GPU position
                    k = next((j for j, x in enumerate(self._gpus) if x is g), 0)
                    g.slow_next_ns = t + iv + iv * k // len(self._gpus) - GPM_JITTER_NS
                else:
                    g.slow_next_ns = t + iv - GPM_JITTER_NS
        smc, mmc, tc = g.slow
        if g.gpm_on:
            self._gpm(g, t)
        elif g.gpm_retry_ns is not None and self.clock() >= g.gpm_retry_ns:
            self._retry_gpm(g, t)
        gv = g.gpm_values
        if g.gpm_good_ns and t - g.gpm_good_ns > 5 * self._gpm_interval_ns:
            gv = g.gpm_values = [None] * len(GPM_METRICS)  # stale: GPM stopped answering
            g.gpm_good_ns = 0
        tx, rx = g.pcie
        return GpuSample(
            t, g.index,
            None if u is NA else int(u.gpu), None if u is NA else int(u.memory),
            None if m is NA else int(m.used), None if m is NA else int(m.total),
            None if p is NA else p / 1000.0,  # NVML reports mW
            None if smc is NA else int(smc), None if mmc is NA else int(mmc),
            None if tc is NA else int(tc),
            tx, rx, **dict(zip(GPM_FIELDS, gv)),  # GPM_METRICS order
        )

    def _gpm(self, g: _Gpu, t: int) -> None:
        # the window is timed at the call, not at the tick's start: the calls before it in the
        # tick can take ms each (GIL), which would otherwise let two samples come < 100 ms apart
        now = self.clock()
        if g.gpm_have_prev and now - g.gpm_last_ns < self._gpm_interval_ns - GPM_JITTER_NS:
            return  # window not closed yet: keep the last values
        nv, lib = self._nv, self._lib
        try:
            nv.nvmlGpmSampleGet(g.handle, g.gpm_cur)
            if g.gpm_have_prev:
                req = g.gpm_req
                req.sample1 = g.gpm_prev
                req.sample2 = g.gpm_cur
                nv.nvmlGpmMetricsGet(req)
        except lib.gpm_lost_errors as e:
            raise _GpuLost(describe_nvml_error(e)) from e
        except lib.busy_errors as e:
            self._free_gpm(g)
            # DCGM / Nsight hold the same profiling counters (REFERENCE §5); a profiler run
            # often ends while the session goes on, so ask again now and then (a few calls)
            g.gpm_retry_ns = now + int(GPM_RETRY_S * 1e9)
            g.gpm_recovering = False
            g.last_error = f"gpm: {describe_nvml_error(e)}"
            self._problem(("gpm", g.index), "GPM counters in use by another profiler — GPM "
                          "fields off" + (f" on GPU {g.index}" if len(self._gpus) > 1 else "")
                          + f" (retrying every {GPM_RETRY_S:g} s)")
            return
        except lib.na_errors as e:
            self._free_gpm(g)
            self._problem(("gpm", g.index), f"GPU {g.index}: GPM {describe_nvml_error(e)} "
                                            "— GPM fields off")
            return
        except lib.base_error as e:  # e.g. asked too soon: retry on the next tick
            g.errors += 1
            g.gpm_fails += 1
            g.last_error = f"gpm: {describe_nvml_error(e)}"
            if g.gpm_fails >= GPM_MAX_FAILS:
                self._free_gpm(g)
                g.gpm_fails = 0
                g.gpm_retry_ns = now + int(GPM_RETRY_S * 1e9)  # NVML may recover: ask again
                g.gpm_recovering = False
                self._problem(("gpm", g.index), f"GPU {g.index}: GPM failing "
                                                f"({describe_nvml_error(e)}) — GPM fields off "
                                                f"(retrying every {GPM_RETRY_S:g} s)")
            return
        g.gpm_fails = 0
        if g.gpm_have_prev:
            self._read_gpm(g, t)
            if g.gpm_recovering and g.gpm_on:  # a whole window read after a retry: back on
                g.gpm_recovering = False
                self.gpm_enabled[g.index] = True
                self._problems.pop(("gpm", g.index), None)
                self._update_status()
        g.gpm_prev, g.gpm_cur = g.gpm_cur, g.gpm_prev
        g.gpm_have_prev = True
        g.gpm_last_ns = now

    def _retry_gpm(self, g: _Gpu, t: int) -> None:
        """GPM was off because another profiler held the counters, or after ``GPM_MAX_FAILS``
        failed windows: set it up again and take a first sample (six NVML calls at most, every
        ``GPM_RETRY_S``). Busy again → off until the next retry; any other failure of the set-up
        → also asked again later (its line shown); free → the problem line goes once the first
        full window has been read."""
        g.gpm_retry_ns = None
        self._setup_gpm(g)
        if not g.gpm_on:  # set-up refused this time (a transient error, "not supported")
            g.gpm_retry_ns = self.clock() + int(GPM_RETRY_S * 1e9)
            return
        g.gpm_recovering = True
        self._gpm(g, t)  # on busy this frees GPM and schedules the next retry

    def _read_gpm(self, g: _Gpu, t: int) -> None:
        nv = self._nv
        ok = getattr(nv, "NVML_SUCCESS", 0)
        unsupported = getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3)
        vals = g.gpm_values
        dropped = []
        any_ok = False
        for j, k in enumerate(g.gpm_slots):
            mtr = g.gpm_req.metrics[j]
            rc = mtr.nvmlReturn
            v = float(mtr.value) if rc == ok else math.nan
            if v == v:  # a window NVML could not compute comes back as NaN: None, not a value
                vals[k] = v
                any_ok = True
                g.gpm_seen_ok.add(k)
            else:
                vals[k] = None
                # NOT_SUPPORTED from a metric that has answered before is one bad window (seen
                # for DRAM BW on the H200), not a metric this GPU lacks: keep asking
                if rc == unsupported and k not in g.gpm_seen_ok:
                    dropped.append(k)
        if any_ok:
            g.gpm_good_ns = t
        if dropped:  # stop asking for the metrics this GPU does not have
            g.gpm_slots = [k for k in g.gpm_slots if k not in dropped]
            names = ", ".join(GPM_METRICS[k][0] for k in dropped)
            if not g.gpm_slots:
                self._free_gpm(g)
                self._problem(("gpm", g.index), f"GPU {g.index}: no GPM metric supported — "
                                                "GPM fields off")
            else:
                self._fill_gpm_request(g)
                self._problem(("gpm-metric", g.index),
                              f"GPU {g.index}: GPM {names} not supported — those fields off")

    # ---- PCIe thread ---------------------------------------------------------------------------
    def _pcie_loop(self) -> None:
        nv, lib = self._nv, self._lib
        tx_c = getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0)
        rx_c = getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1)
        while not self._stop.is_set():
            any_on = False
            for g in list(self._live):
                if "pcie" in g.off:
                    continue
                any_on = True
                t0 = time.perf_counter()
                try:
                    tx = lib.query(nv.nvmlDeviceGetPcieThroughput, g.handle, tx_c)
                    rx = lib.query(nv.nvmlDeviceGetPcieThroughput, g.handle, rx_c)
                except Exception:  # loss is detected and reported by the main loop
                    g.pcie = (None, None)
                    continue
                self.pcie_query_ms = (time.perf_counter() - t0) * 1e3
                if tx is NA or rx is NA:
                    g.off.add("pcie")
                    g.pcie = (None, None)
                else:
                    g.pcie = (int(tx), int(rx))  # one tuple store: atomic for the reader
            if not any_on or self._stop.wait(self._pcie_interval_s):
                return
