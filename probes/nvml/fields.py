"""The GPU fields gpuchef samples: one table, every other list of them is derived from it.

Each :class:`GpuField` says what one :class:`~gpuchef.probes.nvml.GpuSample` attribute is (name,
type, unit, labels), how it is read (the NVML function, what is taken from its answer, the GPM
metric) and how often (:data:`TICK`, :data:`SLOW`, :data:`PCIE`, :data:`GPM`; the sampler's module
doc says why each cadence), and where it is shown (the summaries' means, the /metrics gauge).
nvitop's ``Device`` is the model: one place that names a device's readings and their units.

Derived here, so that no other place spells the list:

* :data:`SAMPLE_COLUMNS` — ``GpuSample``'s attributes in order (``t_ns``, ``gpu``, then the
  table): the report's CSV columns.
* :data:`GPM_METRICS` / :data:`GPM_FIELDS` — the GPM metrics the sampler asks for, in request
  order (the fake NVML's ``set_load`` keywords).
* :data:`MEAN_FIELDS` — the fields averaged over a span (% or W): GPM's saturation signals first,
  then NVML's per-tick ones; :data:`SUMMARY_FIELDS` — those the summaries show (bench's results
  block, ``ab``, the report, the dashboard's GPU panels).
* :data:`PROMETHEUS_GAUGES` — field → gauge name of ``/metrics`` (``serve``).

Imports nothing of gpuchef, so every room may import it (``tests/probes/test_gpu_fields.py``
checks the table against the sample type, the sampler over the fake NVML, the CSV header and
/metrics).
"""

from __future__ import annotations

from dataclasses import dataclass

#: cadences: every tick (``--sample-hz``); the slow fields (every ``slow_interval_s``); the PCIe
#: thread (every ``pcie_interval_s``); a GPM window (every ``gpm_interval_s``, ≥ 100 ms)
TICK, SLOW, PCIE, GPM = "tick", "slow", "pcie", "gpm"
CADENCES = (TICK, SLOW, PCIE, GPM)


@dataclass(frozen=True, slots=True)
class GpuField:
    """One GPU reading. ``name``: the GpuSample attribute; ``type``: int or float (None when
    not read); ``unit``: "%", "W", "B", "MHz", "°C" or "KB/s"; ``label``: what the report calls
    it ("SM active"); ``short``: the dashboard's gutter label (≤ 7 cells); ``what``: what it
    measures, in a few words. ``nvml``: the NVML function that answers it; ``read``: what is
    taken from its answer; ``gpm_metric``: (pynvml constant name, nvmlGpmMetricId_t value) for
    a GPM field (read by ``nvmlGpmMetricsGet`` against the previous ``nvmlGpmSampleGet``).
    ``cadence``: one of :data:`CADENCES`. ``summary``: shown in the summaries' means.
    ``prometheus``: the /metrics gauge (None: not exported). ``column``: the per-GPU table's
    header when not "label unit"."""

    name: str
    type: type
    unit: str
    label: str
    short: str
    what: str
    nvml: str
    read: str
    cadence: str
    gpm_metric: tuple[str, int] | None = None
    summary: bool = False
    prometheus: str | None = None
    column: str = ""

    @property
    def source(self) -> str:
        """"GPM" or "NVML": which of the two the reading comes from."""
        return "GPM" if self.cadence == GPM else "NVML"

    @property
    def header(self) -> str:
        """The per-GPU table's column header ("SM active %")."""
        return self.column or f"{self.label} {self.unit}"


_GPM_GET = "nvmlGpmMetricsGet"

#: The table, in GpuSample's attribute order (after ``t_ns`` and ``gpu``).
FIELDS: tuple[GpuField, ...] = (
    GpuField("gpu_util", int, "%", "GPU-Util", "GPU-Utl", "any kernel running",
             "nvmlDeviceGetUtilizationRates", ".gpu: % of NVML's sample period (~200 ms)", TICK,
             summary=True, prometheus="gpuchef:gpu_util_percent"),
    GpuField("mem_util", int, "%", "memory-Util", "mem-Utl", "device memory read or written",
             "nvmlDeviceGetUtilizationRates", ".memory: % of NVML's sample period", TICK),
    GpuField("mem_used_bytes", int, "B", "memory used", "mem", "device memory used",
             "nvmlDeviceGetMemoryInfo", ".used", TICK),
    GpuField("mem_total_bytes", int, "B", "memory total", "mem tot", "device memory",
             "nvmlDeviceGetMemoryInfo", ".total", TICK),
    GpuField("power_w", float, "W", "power", "power", "board power",
             "nvmlDeviceGetPowerUsage", "mW / 1000 (a 1 s average on Ampere and newer)", TICK,
             summary=True, prometheus="gpuchef:gpu_power_watts"),
    GpuField("sm_clock_mhz", int, "MHz", "SM clock", "SM clk", "current SM clock",
             "nvmlDeviceGetClockInfo", "NVML_CLOCK_SM", SLOW),
    GpuField("mem_clock_mhz", int, "MHz", "memory clock", "mem clk", "current memory clock",
             "nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM", SLOW),
    GpuField("temp_c", int, "°C", "temperature", "temp", "GPU temperature",
             "nvmlDeviceGetTemperatureV", "NVML_TEMPERATURE_GPU (nvmlDeviceGetTemperature on "
             "drivers without the V call)", SLOW),
    GpuField("pcie_tx_kbps", int, "KB/s", "PCIe TX", "PCIe TX", "PCIe transmit throughput",
             "nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_TX_BYTES (a 20 ms window)", PCIE),
    GpuField("pcie_rx_kbps", int, "KB/s", "PCIe RX", "PCIe RX", "PCIe receive throughput",
             "nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_RX_BYTES (a 20 ms window)", PCIE),
    GpuField("sm_active", float, "%", "SM active", "SM act", "share of SMs busy",
             _GPM_GET, "SM_UTIL", GPM, ("NVML_GPM_METRIC_SM_UTIL", 2),
             summary=True, prometheus="gpuchef:gpu_sm_active_percent"),
    GpuField("sm_occupancy", float, "%", "SM occupancy", "SM occ", "active warps vs the maximum",
             _GPM_GET, "SM_OCCUPANCY", GPM, ("NVML_GPM_METRIC_SM_OCCUPANCY", 3),
             prometheus="gpuchef:gpu_sm_occupancy_percent"),
    GpuField("tensor_active", float, "%", "tensor active", "tensor", "SMs doing any tensor op",
             _GPM_GET, "ANY_TENSOR_UTIL", GPM, ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),
             summary=True, prometheus="gpuchef:gpu_tensor_active_percent"),
    GpuField("dram_bw_util", float, "%", "DRAM bandwidth", "DRAM BW",
             "DRAM bandwidth used vs the peak", _GPM_GET, "DRAM_BW_UTIL", GPM,
             ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10), summary=True,
             prometheus="gpuchef:gpu_dram_bw_util_percent", column="DRAM BW %"),
)

#: name → field
BY_NAME: dict[str, GpuField] = {f.name: f for f in FIELDS}

#: GpuSample's attributes in order: the keys, then the table
SAMPLE_KEYS = ("t_ns", "gpu")
SAMPLE_COLUMNS: tuple[str, ...] = (*SAMPLE_KEYS, *(f.name for f in FIELDS))

#: (GpuSample field, pynvml constant name, nvmlGpmMetricId_t) for each GPM field, in request
#: order; pynvml's constant is used when the module has it, the number otherwise
GPM_METRICS: tuple[tuple[str, str, int], ...] = tuple(
    (f.name, *f.gpm_metric) for f in FIELDS if f.gpm_metric is not None)
GPM_FIELDS: tuple[str, ...] = tuple(f for f, _, _ in GPM_METRICS)

# shown order: GPM's saturation signals first, then NVML's (each in table order)
_SHOWN = sorted(FIELDS, key=lambda f: f.cadence != GPM)

#: the fields averaged over a span (% or W)
MEAN_FIELDS: tuple[str, ...] = tuple(f.name for f in _SHOWN if f.unit in ("%", "W"))
#: the means the summaries show
SUMMARY_FIELDS: tuple[str, ...] = tuple(f.name for f in _SHOWN if f.summary)
#: GpuSample field → /metrics gauge name (percent unless the name says otherwise)
PROMETHEUS_GAUGES: dict[str, str] = {f.name: f.prometheus for f in _SHOWN if f.prometheus}
