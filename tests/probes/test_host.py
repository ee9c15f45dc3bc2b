"""HostSampler (psutil) and the PeriodicSampler thread it shares with the NVML sampler."""

from __future__ import annotations

import time

import psutil
import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.probes.sampler import HostSample, HostSampler


def test_sample_once_reads_process_and_system():
    h = HostSampler()
    first = h.sample_once()
    assert first.process_cpu_pct is None and first.system_cpu_pct is None  # no interval yet
    end = time.process_time() + 0.15
    x = 0
    while time.process_time() < end:  # burn ~150 ms of CPU
        x += 1
    second = h.sample_once()
    h.stop()
    assert second.rss_bytes > 10 * 2**20
    assert second.rss_bytes == pytest.approx(psutil.Process().memory_info().rss, rel=0.2)
    assert second.process_cpu_pct > 20  # % of ONE core
    assert 0 <= second.system_cpu_pct <= 100
    assert second.num_threads >= 1 and second.cpu_count == psutil.cpu_count()
    assert second.t_ns > first.t_ns
    assert HostSample(**second.as_dict()) == second


def test_thread_samples_and_stops():
    got = []
    with HostSampler(sample_hz=20, on_sample=got.append) as h:
        assert h.wait_ready(2.0)
        time.sleep(0.5)
    assert not h.running
    assert 5 <= len(got) <= 15
    assert h.status.startswith("host: pid ")
    assert list(h.samples) == got and h.latest is got[-1]
    assert h.mean_tick_us > 0


class _GoneProcess:
    pid = 424242

    def oneshot(self):
        raise psutil.NoSuchProcess(self.pid)


class _FakePsutil:
    NoSuchProcess = psutil.NoSuchProcess

    @staticmethod
    def Process(pid=None):
        return _GoneProcess()

    @staticmethod
    def cpu_count():
        return 4

    cpu_times = staticmethod(psutil.cpu_times)


def test_vanished_process_stops_with_status_not_exception():
    with HostSampler(sample_hz=20, psutil_module=_FakePsutil) as h:
        assert h.wait_ready(2.0)
        end = time.monotonic() + 2
        while h.running and time.monotonic() < end:
            time.sleep(0.01)
    assert not h.running
    assert h.status.startswith("host probe stopped: NoSuchProcess")


@pytest.mark.parametrize("hz", [0, 0.05, 51, "x"])
def test_host_hz_range(hz):
    with pytest.raises(ConfigError, match="--host-sample-hz"):
        HostSampler(sample_hz=hz)
