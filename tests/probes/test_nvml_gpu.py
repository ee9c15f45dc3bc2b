"""The real NVML/GPM sampler on a GPU (issue 4): GPM readings follow the load we put on it.

Run on the GPU machine: ``python -m pytest -m gpu tests/probes/test_nvml_gpu.py``. The GPU under
test is CUDA device 0, found in NVML by its UUID (NVML ignores ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import time

import pytest
import torch

from gpuchef.probes.nvml import NvmlSampler, nvml_library

pytestmark = pytest.mark.gpu


def _nvml_index_of_cuda0() -> int:
    lib = nvml_library()
    lib.init()
    want = str(torch.cuda.get_device_properties(0).uuid)
    for i in range(lib.device_count()):
        h = lib.query("nvmlDeviceGetHandleByIndex", i)
        uuid = lib.query("nvmlDeviceGetUUID", h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if want in uuid:
            return i
    pytest.skip(f"CUDA device 0 ({want}) not found in NVML")


@pytest.fixture(scope="module")
def sampler():
    idx = _nvml_index_of_cuda0()
    s = NvmlSampler(gpus=[idx], sample_hz=20, pcie_interval_s=0)
    first = s.sample_once()
    if not first or first[0].sm_active is None and not s.gpm_enabled.get(idx, False):
        s.stop()
        pytest.skip(f"GPM not available on GPU {idx}: {s.status}")
    yield s
    s.stop()


def _window(s: NvmlSampler, work, seconds: float = 1.2):
    """Prime a GPM window, run ``work`` (queued GPU work) for ``seconds``, read the window."""
    torch.cuda.synchronize()
    time.sleep(0.15)
    s.sample_once()  # the window starts here
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        work()
        torch.cuda.synchronize()
    return s.sample_once()[0]


def test_gpm_rises_under_bf16_matmul_and_falls_at_idle(sampler):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def matmuls():
        for _ in range(8):
            a @ b

    busy = _window(sampler, matmuls)
    assert busy.sm_active is not None and busy.sm_active > 50, busy
    assert busy.tensor_active is not None and busy.tensor_active > 50, busy
    idle = _window(sampler, lambda: time.sleep(0.05))
    assert idle.sm_active < 5 and idle.tensor_active < 5, idle


def test_dram_bandwidth_rises_under_a_large_copy(sampler):
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    idle = _window(sampler, lambda: time.sleep(0.05))

    def copies():
        for _ in range(4):
            dst.copy_(src)

    busy = _window(sampler, copies)
    assert busy.dram_bw_util is not None and busy.dram_bw_util > 50, busy
    assert busy.dram_bw_util > idle.dram_bw_util + 40, (idle, busy)
