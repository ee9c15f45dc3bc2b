"""The record stream's one sink interface (engine_host/sinks.py): every host hands each engine
loop turn's records to its sinks as one RecordBatch, in the order of the sink list — the same
batches whether the engine runs in this process (EngineHost) or in its own (RemoteEngine); a
sink that raises ends the stream as the module's docstring says."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gpuchef.engine_host.core import RemoteEngine, make_host
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.host import EngineHost
from gpuchef.engine_host.request import SamplingParams
from gpuchef.engine_host.sinks import ListenerSink, RecordBatch
from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepOutput, StepRecord
from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate

CFG = EngineConfig(model="tiny", device="cpu", max_model_len=512,
                   cache=CacheConfig(num_gpu_blocks=512),
                   scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=128))


def norm(x):
    """A record without its timing (fields in ns or ms), for comparing two runs."""
    if isinstance(x, tuple):
        return tuple(norm(v) for v in x)
    if not dataclasses.is_dataclass(x):
        return x
    d = {f.name: norm(getattr(x, f.name)) for f in dataclasses.fields(x)
         if not f.name.endswith(("_ns", "_ms"))}
    if isinstance(x, StepOutput):  # (request id, arrival ns, prompt length)
        d["first_tokens"] = tuple((rid, n) for rid, _, n in x.first_tokens)
    return type(x).__name__, d


class Log:
    """Sinks that write (their name, the batch) into one shared list."""

    def __init__(self):
        self.calls = []

    def sink(self, name):
        log = self

        class S:
            def record(self, batch):
                log.calls.append((name, batch))
        return S()

    def batches(self, name):
        return [b for n, b in self.calls if n == name]


def drive(host):
    sp = generate(WorkloadConfig(dataset="random", request_rate=float("inf"), num_prompts=8,
                                 input_len=60, output_len=6, range_ratio=0.5, seed=5,
                                 vocab_size=512, max_model_len=512))
    host.set_workload(sp)
    host.set_config(max_num_batched_tokens=64)
    host.start()
    assert host.wait_done(120), "the run did not finish"
    host.stop()
    host.set_config(max_num_batched_tokens=128)  # as it was, for the engine's next host


def assert_sink_order(log):
    """Each batch went to "a" and then to "b", before the next batch went anywhere."""
    names = [n for n, _ in log.calls]
    assert names == ["a", "b"] * (len(names) // 2) and names
    for (_, x), (_, y) in zip(log.calls[::2], log.calls[1::2]):
        assert x is y


@pytest.mark.slow
def test_in_thread_and_engine_process_deliver_the_same_batches():
    ref = Log()
    drive(make_host(LLMEngine(CFG), [ref.sink("a"), ref.sink("b")]))
    remote = RemoteEngine.spawn(CFG)
    try:
        got = Log()
        drive(remote.new_host([got.sink("a"), got.sink("b")]))
    finally:
        remote.close()
    for log in (ref, got):
        assert_sink_order(log)
    shape = lambda log: [[norm(r) for r in b.records] for b in log.batches("a")]  # noqa: E731
    assert shape(got) == shape(ref)
    batches = ref.batches("a")
    # the knob change is in the first batch, before the first step
    assert [type(r) for r in batches[0].records][:2] == [EngineEvent, StepRecord]
    # a turn: its step, its outputs, then the requests it finished; the lists by type agree
    for b in batches + got.batches("a"):
        kinds = [type(r) for r in b.records]
        assert kinds.count(StepRecord) <= 1
        assert list(b.steps) == [r for r in b.records if isinstance(r, StepRecord)]
        assert list(b.outputs) == [r for r in b.records if isinstance(r, StepOutput)]
        assert list(b.requests) == [r for r in b.records if isinstance(r, RequestRecord)]
        assert list(b.events) == [r for r in b.records if isinstance(r, EngineEvent)]
        if RequestRecord in kinds:
            assert kinds.index(StepOutput) < kinds.index(RequestRecord)
    assert sum(len(b.requests) for b in batches) == 8


def test_listener_sink_calls_back_record_by_record_in_order():
    step = StepRecord(0, 1, 2, 0.1, "chunked", 64, 8, 0, 1, 1, 10, 0, 0, 1, 0, 0, 3, 512)
    out = StepOutput(0, 2, (("r", 7),))
    req = RequestRecord("r", 0, 10, 1, (2,), "length")
    ev = EngineEvent("mark", 0, 1, "edge")
    seen = []
    sink = ListenerSink(on_step=seen.append, on_output=seen.append, on_request=seen.append,
                        on_event=seen.append)
    sink.record(RecordBatch([ev, step, out, req]))
    assert seen == [ev, step, out, req]
    ListenerSink(on_request=seen.append).record(RecordBatch([ev, step, out, req]))
    assert seen[4:] == [req]


class Boom(Exception):
    pass


def raising_setup():
    log = Log()
    fired = []

    class Raiser:
        def record(self, batch):
            if batch.steps and not fired:
                fired.append(batch)
                raise Boom("a sink raised")
    return log, fired, [log.sink("a"), Raiser(), log.sink("b")]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_sink_that_raises_ends_the_in_thread_engine_loop():
    log, fired, sinks = raising_setup()
    host = EngineHost(LLMEngine(CFG), sinks=sinks)
    host.start()
    host.submit("r", list(range(1, 40)), SamplingParams(max_tokens=20, ignore_eos=True))
    assert host.wait_done(30)
    host.stop()
    assert isinstance(host.error, Boom)
    (bad,) = fired
    assert bad in log.batches("a") and bad not in log.batches("b")  # the sinks after it miss it
    # then one "error" event, a batch of its own, to every sink
    for name in ("a", "b"):
        last = log.batches(name)[-1]
        assert [(e.kind, e.name) for e in last.records] == [("error", "engine")]
        assert "engine thread died: Boom: a sink raised" in last.records[0].message


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_sink_that_raises_ends_the_host_of_an_engine_process_as_in_thread():
    log, fired, sinks = raising_setup()
    remote = RemoteEngine.spawn(CFG)
    try:
        h = remote.new_host(sinks)
        h.start()
        h.submit("r", list(range(1, 40)), SamplingParams(max_tokens=20, ignore_eos=True))
        assert h.wait_done(30)  # not a hang: the host is done
        (bad,) = fired
        assert isinstance(h.error, Boom)
        assert bad in log.batches("a") and bad not in log.batches("b")
        for name in ("a", "b"):
            last = log.batches(name)[-1]
            assert [(e.kind, e.name) for e in last.records] == [("error", "engine")]
            assert "engine thread died: Boom: a sink raised" in last.records[0].message
        n = len(log.batches("a"))
        time.sleep(0.5)  # the engine process was told to stop this host: nothing more comes
        assert len(log.batches("a")) == n
    finally:
        remote.close()
