"""The live load: arrivals at a rate that changes while it runs, pause/resume, trace looping."""

import threading
import time

import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.workload import WorkloadConfig
from gpuchef.sessions.live_load import LiveLoad


class FakeHost:
    def __init__(self):
        self.submitted = []
        self.marks = []
        self.calls = []
        self.lock = threading.Lock()

    def submit(self, rid, prompt, sampling, arrival_ns=None):
        with self.lock:
            self.submitted.append((rid, len(tuple(prompt)), sampling.max_tokens, arrival_ns))

    def mark(self, label):
        self.marks.append(label)

    def pause_load(self):
        self.calls.append("pause_load")

    def resume_load(self):
        self.calls.append("resume_load")


def wait_until(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def random_cfg(rate=200.0, **kw):
    return WorkloadConfig(dataset="random", request_rate=rate, arrival="constant", input_len=8,
                          output_len=2, num_prompts=10, vocab_size=100, **kw)


def test_rate_change_bends_the_stream_without_a_jump():
    host = FakeHost()
    load = LiveLoad(host, random_cfg(rate=100.0))
    load.start()
    try:
        assert wait_until(lambda: len(host.submitted) >= 20)
        load.set_rate(25.0)
        n0 = len(host.submitted)
        t0 = time.monotonic()
        time.sleep(0.6)
        got = len(host.submitted) - n0
        rate = got / (time.monotonic() - t0)
        assert 10 <= rate <= 40, rate  # ~25 req/s now, not 100
    finally:
        load.stop()
    assert host.marks == ["rate→25 req/s"]
    ids = [s[0] for s in host.submitted]
    assert len(set(ids)) == len(ids) and ids[0] == "req-0"
    arrivals = [s[3] for s in host.submitted]
    assert arrivals == sorted(arrivals)


def test_pause_stops_arrivals_and_resume_goes_on_where_it_stopped():
    host = FakeHost()
    load = LiveLoad(host, random_cfg(rate=200.0))
    load.start()
    try:
        assert wait_until(lambda: len(host.submitted) >= 5)
        load.pause()
        time.sleep(0.05)
        n = len(host.submitted)
        time.sleep(0.3)
        assert len(host.submitted) == n
        assert load.state().paused and "PAUSED" in load.state().describe()
        load.resume()
        assert wait_until(lambda: len(host.submitted) > n + 5)
    finally:
        load.stop()
    assert host.calls == ["pause_load", "resume_load"]


def test_bounded_load_ends_and_a_trace_loops_with_unique_ids():
    host = FakeHost()
    load = LiveLoad(host, random_cfg(rate=500.0), num_prompts=7)
    load.start()
    assert wait_until(lambda: load.done)
    load.stop()
    assert len(host.submitted) == 7 and load.state().done

    host = FakeHost()
    cfg = WorkloadConfig(dataset="azure-conv", trace_speed=1000.0, max_input_len=16,
                         max_output_len=2, vocab_size=100)
    load = LiveLoad(host, cfg)
    assert load.state().kind == "trace" and load.mean_rate == pytest.approx(5.53, abs=0.1)
    load.start()
    try:
        assert wait_until(lambda: len(host.submitted) > 100)
    finally:
        load.stop()
    ids = [s[0] for s in host.submitted]
    assert len(set(ids)) == len(ids)
    assert max(s[1] for s in host.submitted) <= 16


def test_bad_rates_are_refused_with_the_range():
    host = FakeHost()
    with pytest.raises(ConfigError, match="finite"):
        LiveLoad(host, random_cfg(rate=float("inf")))
    load = LiveLoad(host, random_cfg())
    for bad in (0, -1, "abc", float("nan"), 1e9):
        with pytest.raises(ConfigError, match=r"request rate \(req/s\)"):
            load.set_rate(bad)
    assert load.rate == 200.0 and host.marks == []
    trace = LiveLoad(host, WorkloadConfig(dataset="azure-conv", vocab_size=100))
    assert trace.set_rate("x2") == 2.0
    with pytest.raises(ConfigError, match=r"trace speed \(×\)"):
        trace.set_rate("0")


# ---- a phased workload (engine_host/vocab/phases.py): its phase marks, in order, when due ---------

class OrderHost(FakeHost):
    """Submissions and marks in one list, in the order the feeder sent them."""

    def __init__(self):
        super().__init__()
        self.seq = []

    def submit(self, rid, prompt, sampling, arrival_ns=None):
        super().submit(rid, prompt, sampling, arrival_ns)
        self.seq.append(("req", time.monotonic_ns()))

    def mark(self, label):
        super().mark(label)
        self.seq.append((label, time.monotonic_ns()))


def phased_cfg(tmp_path, **kw):
    p = tmp_path / "w.yaml"
    p.write_text("phases:\n"
                 "  - {name: a, duration_s: 0.4, request_rate: 20, arrival: constant,\n"
                 "     input_len: 4, output_len: 1}\n"
                 "  - {name: b, duration_s: 0.4, request_rate: 0, burst: {at_s: 0, count: 3},\n"
                 "     input_len: 4}\n"
                 "  - {name: c, duration_s: 0.4, request_rate: 10, arrival: constant,\n"
                 "     input_len: 4}\n")
    return WorkloadConfig(dataset=str(p), vocab_size=100, **kw)


def test_a_phased_load_marks_each_phase_as_it_starts(tmp_path):
    host = OrderHost()
    load = LiveLoad(host, phased_cfg(tmp_path), loop=False)
    assert load.kind == "trace" and load.mean_rate == pytest.approx((8 + 3 + 4) / 1.2)
    load.start()
    try:
        assert wait_until(lambda: load.done, timeout=10)
    finally:
        load.stop()
    assert host.marks == ["phase:a", "phase:b", "phase:c"]
    assert load.state().phase == "c" and "phase c" in load.state().describe()
    labels = [x[0] for x in host.seq]
    # each mark before its phase's requests: 8 in a (constant 20 req/s × 0.4 s), the burst of
    # 3 at b's start, 4 in c
    assert labels == ["phase:a", *["req"] * 8, "phase:b", *["req"] * 3, "phase:c", *["req"] * 4]
    t = {x[0]: x[1] for x in host.seq if x[0] != "req"}
    # due 0.4 s apart (at speed 1); no tight bound on a loaded machine, only the order of size
    assert 0.3e9 <= t["phase:b"] - t["phase:a"] <= 2e9
    assert 0.3e9 <= t["phase:c"] - t["phase:b"] <= 2e9


def test_a_looping_phased_load_starts_its_phases_again(tmp_path):
    host = OrderHost()
    load = LiveLoad(host, phased_cfg(tmp_path, trace_speed=4.0))  # unbounded: loops; 0.3 s a turn
    load.start()
    try:
        assert wait_until(lambda: len(host.marks) >= 5, timeout=10)
    finally:
        load.stop()
    assert host.marks[:5] == ["phase:a", "phase:b", "phase:c", "phase:a", "phase:b"]
