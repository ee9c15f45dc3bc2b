"""The table of GPU fields (probes/nvml/fields.py) against everything it drives: the sample type,
the sampler over the fake NVML, the fake's knobs, the report's CSV header and /metrics."""

from __future__ import annotations

import time
from dataclasses import fields

import pynvml
import pytest

from gpuchef.probes.metrics import GPU_FIELDS, GPU_SUMMARY_FIELDS
from gpuchef.probes.nvml import GPM_FIELDS, GPM_METRICS, GpuSample, NvmlSampler
from gpuchef.probes.nvml.fake import FakeNvml
from gpuchef.probes.nvml.fields import (BY_NAME, CADENCES, FIELDS, GPM, MEAN_FIELDS, PCIE,
                                        PROMETHEUS_GAUGES, SAMPLE_COLUMNS, SAMPLE_KEYS, SLOW,
                                        SUMMARY_FIELDS, TICK)
from gpuchef.report.csvs import GPU_SAMPLE_HEADER
from gpuchef.serve.metrics import GPU_GAUGES, ServeMetrics


class ManualClock:
    def __init__(self) -> None:
        self.t = 1_000_000_000

    def __call__(self) -> int:
        return self.t

    def advance(self, s: float) -> None:
        self.t += int(s * 1e9)


def test_the_sample_type_has_the_tables_fields_in_order_and_types():
    fs = fields(GpuSample)
    assert tuple(f.name for f in fs) == SAMPLE_COLUMNS == (*SAMPLE_KEYS, *(f.name for f in FIELDS))
    types = {f.name: f.type for f in fs}
    for f in FIELDS:
        assert types[f.name] == f"{f.type.__name__} | None", f.name
    assert len(BY_NAME) == len(FIELDS)


def test_every_field_says_how_and_how_often_it_is_read():
    units = {"%", "W", "B", "MHz", "°C", "KB/s"}
    for f in FIELDS:
        assert f.unit in units and f.cadence in CADENCES and f.label and f.what and f.read
        assert len(f.short) <= 7, f.short  # the dashboard's gutter
        assert f.nvml.startswith("nvml") and hasattr(pynvml, f.nvml), f.nvml
        assert (f.gpm_metric is not None) == (f.cadence == GPM) == (f.source == "GPM")
        if f.gpm_metric is not None:  # the fallback id is pynvml's constant
            const, mid = f.gpm_metric
            assert getattr(pynvml, const) == mid
    assert {f.cadence for f in FIELDS} == {TICK, SLOW, PCIE, GPM}


def test_derived_lists_are_the_ones_the_summaries_metrics_and_report_always_used():
    # pinned: CSV columns, /metrics names and the summaries' order must not move
    assert GPU_FIELDS == MEAN_FIELDS == ("sm_active", "sm_occupancy", "tensor_active",
                                         "dram_bw_util", "gpu_util", "mem_util", "power_w")
    assert GPU_SUMMARY_FIELDS == SUMMARY_FIELDS == ("sm_active", "tensor_active",
                                                    "dram_bw_util", "gpu_util", "power_w")
    assert GPM_FIELDS == ("sm_active", "sm_occupancy", "tensor_active", "dram_bw_util")
    assert [m[1:] for m in GPM_METRICS] == [
        ("NVML_GPM_METRIC_SM_UTIL", 2), ("NVML_GPM_METRIC_SM_OCCUPANCY", 3),
        ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5), ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10)]
    assert GPU_GAUGES == PROMETHEUS_GAUGES
    assert list(GPU_GAUGES.items()) == [
        ("sm_active", "gpuchef:gpu_sm_active_percent"),
        ("sm_occupancy", "gpuchef:gpu_sm_occupancy_percent"),
        ("tensor_active", "gpuchef:gpu_tensor_active_percent"),
        ("dram_bw_util", "gpuchef:gpu_dram_bw_util_percent"),
        ("gpu_util", "gpuchef:gpu_util_percent"),
        ("power_w", "gpuchef:gpu_power_watts")]
    assert GPU_SAMPLE_HEADER == [
        "trace", "group", "window", "t_s", "t_ns", "gpu", "gpu_util", "mem_util",
        "mem_used_bytes", "mem_total_bytes", "power_w", "sm_clock_mhz", "mem_clock_mhz",
        "temp_c", "pcie_tx_kbps", "pcie_rx_kbps", "sm_active", "sm_occupancy", "tensor_active",
        "dram_bw_util"]


def test_the_sampler_over_the_fake_fills_exactly_the_tables_fields_with_their_types():
    clk = ManualClock()
    fake = FakeNvml(1, clock=clk, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, clock=clk, pcie_interval_s=0.1)
    try:
        first = s.sample_once()[0]
        deadline = time.monotonic() + 5.0  # the PCIe thread's first reading
        while s._gpus[0].pcie == (None, None) and time.monotonic() < deadline:
            time.sleep(0.01)
        fake.set_load(0, **{f: 10.0 * (i + 1) for i, f in enumerate(GPM_FIELDS)})
        clk.advance(0.1)
        x = s.sample_once()[0]
    finally:
        s.stop()
    assert tuple(x.as_dict()) == SAMPLE_COLUMNS
    for f in FIELDS:
        v = getattr(x, f.name)
        assert isinstance(v, f.type), (f.name, v)  # every field answered, as the table's type
        if f.cadence != GPM and f.cadence != PCIE:
            assert getattr(first, f.name) is not None, f.name  # read on the first tick
    assert [getattr(x, f) for f in GPM_FIELDS] == pytest.approx([10.0, 20.0, 30.0, 40.0])
    called = {k for k, n in fake.calls.items() if n}
    missing = {f.nvml for f in FIELDS} - called
    assert not missing, f"the table names NVML calls the sampler never made: {missing}"


def test_the_fakes_load_knobs_are_the_gpm_fields():
    fake = FakeNvml(1, pcie_window_s=0)
    fake.set_load(0, sm_active=50)  # any subset, by name
    with pytest.raises(TypeError, match="not a GPM field: gpu_util"):
        fake.set_load(0, gpu_util=50)


def test_metrics_exports_a_gauge_per_table_field_that_has_one():
    m = ServeMetrics("tiny", kv_blocks_total=100)
    m.on_gpu_sample(GpuSample(1, 0, **{f.name: 1 for f in FIELDS}))
    text = m.render().decode()
    for f in FIELDS:
        if f.prometheus is None:
            continue
        line = next(ln for ln in text.splitlines() if ln.startswith(f.prometheus + "{"))
        assert 'gpu="0"' in line and line.endswith(" 1.0"), line
    assert f"# HELP {BY_NAME['power_w'].prometheus} GPU power_w (NVML/GPM, latest sample)." \
        in text
