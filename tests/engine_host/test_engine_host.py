"""EngineHost: commands take effect between steps at the step they name; bad input is refused
with a message and the engine keeps serving everyone else."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.host import EngineHost
from gpuchef.engine_host.request import SamplingParams
from gpuchef.engine_host.sinks import ListenerSink


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def engine_cfg(request):
    return EngineConfig(model="tiny", device="cpu", max_model_len=512,
                        cache=CacheConfig(num_gpu_blocks=512), async_scheduling=request.param,
                        scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=256))


class Collector:
    def __init__(self):
        self.steps, self.requests, self.events = [], [], []
        self.lock = threading.Lock()

    def on_step(self, r):
        self.steps.append(r)

    def on_request(self, r):
        self.requests.append(r)

    def on_event(self, e):
        self.events.append(e)

    def wait_steps(self, n, timeout=30.0):
        t = time.monotonic() + timeout
        while len(self.steps) < n:
            assert time.monotonic() < t, f"only {len(self.steps)} steps"
            time.sleep(0.005)


def start_host(cfg, n=6, prompt=40, out=60):
    c = Collector()
    host = EngineHost(LLMEngine(cfg), sinks=[ListenerSink(
        on_step=c.on_step, on_request=c.on_request, on_event=c.on_event)])
    host.start()
    for i in range(n):
        host.submit(f"r{i}", list(range(10, 10 + prompt)),
                    SamplingParams(max_tokens=out, ignore_eos=True))
    return host, c


def test_knob_change_takes_effect_at_the_named_step(engine_cfg):
    host, c = start_host(engine_cfg)
    try:
        c.wait_steps(5)
        host.set_knob("max_num_batched_tokens", 64)
        host.set_config(mode="continuous", max_num_seqs=3)
        assert host.wait_done(60)
    finally:
        host.stop()
    ev = {e.name: e for e in c.events if e.kind in ("knob", "mode")}
    assert ev["max_num_batched_tokens"].old == 256 and ev["max_num_batched_tokens"].new == 64
    s = ev["max_num_batched_tokens"].step
    for r in c.steps:
        assert r.max_num_batched_tokens == (64 if r.step >= s else 256)
    s2 = ev["mode"].step
    assert ev["max_num_seqs"].step == s2 >= s
    for r in c.steps:
        assert r.mode == ("continuous" if r.step >= s2 else "chunked")
        assert r.max_num_seqs == (3 if r.step >= s2 else 256)
    # the mode switch under load kept every request alive
    assert sorted(r.request_id for r in c.requests) == [f"r{i}" for i in range(6)]
    assert all(r.finish_reason == "length" and r.output_len == 60 for r in c.requests)


@pytest.mark.parametrize("name,value,allowed", [
    ("max_num_batched_tokens", 0, "[1, 1048576]"),
    ("max_num_seqs", "12x", "[1, 4096]"),
    ("long_prefill_token_threshold", -1, "[0, 1048576]"),
    ("max_num_partial_prefills", 1.5, "[1, 4096]"),
    ("mode", "prefill-first", "continuous, chunked"),
])
def test_bad_knob_is_refused_and_nothing_changes(engine_cfg, name, value, allowed):
    host, c = start_host(engine_cfg, n=2, out=20)
    try:
        with pytest.raises(ConfigError) as ei:
            host.set_knob(name, value)
        msg = str(ei.value)
        assert str(value) in msg and allowed in msg
        with pytest.raises(ConfigError, match="unknown knob 'chunk_size'"):
            host.set_knob("chunk_size", 512)
        assert host.wait_done(60)
    finally:
        host.stop()
    assert not [e for e in c.events if e.kind in ("knob", "mode")]
    assert {r.max_num_batched_tokens for r in c.steps} == {256}
    assert len(c.requests) == 2


def test_bad_request_is_refused_and_others_are_served(engine_cfg):
    host, c = start_host(engine_cfg, n=3, out=10)
    try:
        host.submit("too-long", list(range(10, 10 + 600)), SamplingParams(max_tokens=4))
        host.submit("bad-token", [5, 10 ** 9], SamplingParams(max_tokens=4))
        assert host.wait_done(60)
    finally:
        host.stop()
    by_id = {r.request_id: r for r in c.requests}
    assert by_id["too-long"].finish_reason == "error"
    assert "600" in by_id["too-long"].error and "max_model_len 512" in by_id["too-long"].error
    assert by_id["bad-token"].finish_reason == "error" and "1000000000" in by_id["bad-token"].error
    assert all(by_id[f"r{i}"].finish_reason == "length" for i in range(3))
    assert sum(1 for e in c.events if e.kind == "error") == 2


def test_pause_resume_and_mark(engine_cfg):
    host, c = start_host(engine_cfg, n=2, out=200)
    try:
        c.wait_steps(3)
        host.pause()
        time.sleep(0.1)
        n = len(c.steps)
        time.sleep(0.3)
        assert len(c.steps) == n, "the engine stepped while paused"
        host.mark("A/B window 1: A")
        host.resume()
        assert host.wait_done(60)
    finally:
        host.stop()
    kinds = [e.kind for e in c.events]
    assert kinds.index("pause") < kinds.index("mark") < kinds.index("resume")
    mark = next(e for e in c.events if e.kind == "mark")
    assert mark.name == "A/B window 1: A"
    # the gap in the step stream is the pause
    gaps = [(b.t_start_ns - a.t_end_ns) / 1e9 for a, b in zip(c.steps, c.steps[1:])]
    assert max(gaps) >= 0.3


def test_workload_arrivals_are_scheduled_not_dumped(engine_cfg):
    from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate
    specs = generate(WorkloadConfig(dataset="random", request_rate=20.0, num_prompts=8,
                                    input_len=16, output_len=4, vocab_size=4096, seed=3))
    c = Collector()
    host = EngineHost(LLMEngine(engine_cfg),
                      sinks=[ListenerSink(on_step=c.on_step, on_request=c.on_request)])
    host.set_workload(specs)
    host.start()
    try:
        assert host.wait_done(60)
    finally:
        host.stop()
    assert len(c.requests) == 8
    by_id = {r.request_id: r for r in c.requests}
    for s in specs:
        r = by_id[s.request_id]
        # arrival is the scheduled time, relative to the host's start
        assert abs((r.arrival_ns - host.t0_ns) / 1e9 - s.arrival_s) < 1e-6
        assert r.token_times_ns[0] >= r.arrival_ns and r.output_len == 4


def test_engine_errors_name_the_value():
    with pytest.raises(ConfigError, match="llama-9b"):
        LLMEngine(EngineConfig(model="llama-9b", device="cpu"))
    with pytest.raises(ConfigError, match="/no/such/folder"):
        LLMEngine(EngineConfig(model="/no/such/folder", device="cpu"))
    with pytest.raises(ConfigError, match="float8"):
        LLMEngine(EngineConfig(model="tiny", device="cpu", dtype="float8"))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--device cuda"):
            LLMEngine(EngineConfig(model="tiny", device="cuda"))
    with pytest.raises(ConfigError, match="block-size 12"):
        CacheConfig(block_size=12)
    with pytest.raises(ConfigError, match="max-model-len 100000"):
        LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=100000))
    with pytest.raises(ConfigError, match=r"KV cache of 1 block \(16 tokens\) has 1 usable .*"
                                          r"cannot hold one request of max_model_len 8192: "
                                          r"allowed ≥ 517 blocks"):
        LLMEngine(EngineConfig(model="tiny", device="cpu", cache=CacheConfig(num_gpu_blocks=1)))
    with pytest.raises(ConfigError, match=r"max-model-len 0 .*allowed \[2, "):
        LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=0))  # not "the default"
    eng = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=64,
                                 cache=CacheConfig(num_gpu_blocks=16)))
    eng.add_request("a", [11, 12, 13], SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="already"):
        eng.add_request("a", [11], SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match="64 tokens .*max_model_len 64"):
        eng.add_request("b", list(range(10, 74)))
    with pytest.raises(ConfigError, match="empty"):
        eng.add_request("c", [])
    with pytest.raises(ConfigError, match="max_tokens=0"):
        SamplingParams(max_tokens=0)
    # the refused requests left no trace: the good one still runs to the end
    while eng.has_unfinished():
        eng.step()
    assert eng.kv.pool.num_free == 16


@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
def test_abort_frees_pages_and_reports_the_request(async_on):
    eng = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=256,
                                 async_scheduling=async_on,
                                 cache=CacheConfig(num_gpu_blocks=64, block_size=16)))
    eng.add_request("keep", list(range(10, 50)), SamplingParams(max_tokens=8, ignore_eos=True))
    eng.add_request("drop", list(range(10, 90)), SamplingParams(max_tokens=50, ignore_eos=True))
    eng.add_request("queued", list(range(10, 20)), SamplingParams(max_tokens=5, ignore_eos=True))
    for _ in range(3):
        eng.step()
    used_before = eng.kv.usage().used
    rec = eng.abort("drop")
    assert rec.finish_reason == "abort" and 0 < rec.output_len < 50
    if async_on:  # the step in flight still writes its pages: they come back when it completes
        assert eng.has_step_in_flight and eng.kv.usage().used == used_before
        eng.step()
    assert eng.kv.usage().used < used_before
    assert eng.abort("no-such-id") is None
    done = {}
    while eng.has_unfinished():
        for f in eng.step().finished:
            done[f.request_id] = f
    assert set(done) == {"keep", "queued"}
    assert eng.kv.pool.num_free == 64


def test_pausing_the_load_keeps_requests_that_already_arrived(engine_cfg):
    c = Collector()
    host = EngineHost(LLMEngine(engine_cfg),
                      sinks=[ListenerSink(on_step=c.on_step, on_request=c.on_request)])
    host.start()
    try:
        t = time.monotonic_ns()
        host.submit("arrived", list(range(10, 30)), SamplingParams(max_tokens=3, ignore_eos=True),
                    arrival_ns=t)
        host.submit("later", list(range(10, 30)), SamplingParams(max_tokens=3, ignore_eos=True),
                    arrival_ns=t + 3_000_000_000)
        host.pause_load()  # may be applied before the engine thread has admitted "arrived"
        deadline = time.monotonic() + 20
        while not c.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
    finally:
        host.stop()
    assert [r.request_id for r in c.requests] == ["arrived"]


def test_step_output_streams_every_token_before_the_finished_record(engine_cfg):
    """The per-step outputs hold each token the RequestRecords end with, in order, with the
    record's own token times; first_tokens carry arrival and prompt length; a finished request's
    record is in its last output."""
    outs, order = [], []
    c = Collector()

    def on_output(o):
        outs.append(o)
        order.append(("out", o.step))

    def on_request(r):
        c.on_request(r)
        order.append(("req", r.request_id))

    host = EngineHost(LLMEngine(engine_cfg), sinks=[ListenerSink(
        on_step=c.on_step, on_request=on_request, on_output=on_output)])
    host.start()
    try:
        for i in range(4):
            host.submit(f"s{i}", list(range(20, 40 + 7 * i)),
                        SamplingParams(max_tokens=5 + i, ignore_eos=True))
        assert host.wait_done(60)
    finally:
        host.stop()
    for r in c.requests:
        toks = [(o.t_ns, t) for o in outs for rid, t in o.tokens if rid == r.request_id]
        assert [t for _, t in toks] == list(r.output_token_ids)
        assert [ts for ts, _ in toks] == list(r.token_times_ns)
        (first,) = [f for o in outs for f in o.first_tokens if f[0] == r.request_id]
        assert first == (r.request_id, r.arrival_ns, r.prompt_len)
        (last,) = [o for o in outs if any(f.request_id == r.request_id for f in o.finished)]
        assert last.tokens[-1][0] == r.request_id or r.request_id in dict(last.tokens)
        assert order.index(("out", last.step)) < order.index(("req", r.request_id))
        assert 0 < r.first_scheduled_ns - r.arrival_ns < 60e9


def test_paused_load_holds_the_load_but_not_requests_from_outside(engine_cfg):
    host, c = start_host(engine_cfg, n=0)
    try:
        host.pause_load()
        time.sleep(0.05)
        host.submit("load-1", [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
        host.submit("http-1", [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True),
                    load=False)
        t = time.monotonic() + 30
        while not any(r.request_id == "http-1" for r in c.requests):
            assert time.monotonic() < t
            time.sleep(0.01)
        assert not any(r.request_id == "load-1" for r in c.requests)
        host.abort("load-1")  # dropped before admission: recorded, nothing left behind
        t = time.monotonic() + 30
        while not any(r.request_id == "load-1" for r in c.requests):
            assert time.monotonic() < t
            time.sleep(0.01)
        (rec,) = [r for r in c.requests if r.request_id == "load-1"]
        assert rec.finish_reason == "abort" and rec.output_len == 0
        # it had arrived (held by the pause): not withdrawn, it entered at its arrival
        assert not rec.withdrawn and rec.entered_ns == rec.arrival_ns
        assert rec.ended_ns >= rec.arrival_ns and rec.closed_ns == rec.ended_ns
        assert host.wait_done(10)
    finally:
        host.stop()


def test_a_request_aborted_before_its_arrival_is_recorded_as_withdrawn(engine_cfg):
    """An early-stopped capacity probe aborts the arrivals still to come: each record says when
    it was withdrawn (before its planned arrival), so windows place it there, and it closes
    then — not at an arrival that never happened."""
    host, c = start_host(engine_cfg, n=0)
    try:
        due = time.monotonic_ns() + 60 * 10**9
        host.submit("later", [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True),
                    arrival_ns=due)
        time.sleep(0.05)
        t_abort = time.monotonic_ns()
        host.abort("later", "early stop")
        t = time.monotonic() + 30
        while not c.requests:
            assert time.monotonic() < t
            time.sleep(0.01)
        (rec,) = c.requests
        assert rec.finish_reason == "early stop" and rec.token_times_ns == ()
        assert rec.arrival_ns == due and t_abort <= rec.ended_ns < due and rec.withdrawn
        assert rec.entered_ns == rec.closed_ns == rec.ended_ns
        assert host.wait_done(10)
    finally:
        host.stop()


def test_both_engines_implement_the_contract(engine_cfg):
    """contract.Engine is what EngineHost and the sessions use: the native engine has every
    member (runtime_checkable checks their presence), with the values the surfaces read."""
    from gpuchef.engine_host.contract import Engine

    eng = LLMEngine(engine_cfg)
    assert isinstance(eng, Engine)
    assert eng.engine_name == "" and eng.tensor_parallel_size == 1
    assert eng.async_scheduling == engine_cfg.async_scheduling
    assert eng.drain().record is None and not eng.has_step_in_flight
    eng.validate_scheduler_config(eng.scheduler_config)
    eng.close()


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
