"""The engine core in its own process (engine_host/core.py): the record stream it sends equals what
the same engine produces in this process (the in-thread EngineHost is the reference), in the
engine's order; commands keep EngineHost's meaning; bad input and a dead engine process are one
clear line each."""

from __future__ import annotations

import os
import signal
import time

import pytest

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.core import (EngineCoreClient, EngineProcessError, RemoteEngine,
                                      make_host)
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepOutput, StepRecord
from gpuchef.engine_host.request import SamplingParams
from gpuchef.engine_host.vocab.workload import WorkloadConfig, generate

VOCAB = 512  # below the tiny preset's vocabulary
CFG = EngineConfig(model="tiny", device="cpu", max_model_len=512,
                   cache=CacheConfig(num_gpu_blocks=512),
                   scheduler=SchedulerConfig(mode="chunked", max_num_batched_tokens=128))


@pytest.fixture(scope="module")
def remote():
    eng = RemoteEngine.spawn(CFG)
    yield eng
    eng.close()


class Stream:
    """A sink: every record a host delivered, in order."""

    def __init__(self):
        self.items = []

    def record(self, batch):
        self.items.extend(batch.records)

    def of(self, cls):
        return [x for x in self.items if isinstance(x, cls)]


def specs(n=12):
    return generate(WorkloadConfig(dataset="random", request_rate=float("inf"), num_prompts=n,
                                   input_len=100, output_len=12, range_ratio=0.5, seed=3,
                                   vocab_size=VOCAB, max_model_len=512))


def run(host, stream, sp, changes=None):
    host.set_workload(sp)
    if changes:
        host.set_config(**changes)
    host.start()
    assert host.wait_done(120), "the run did not finish"
    host.stop()
    return stream


def test_stream_equals_the_in_thread_engine(remote):
    sp = specs()
    ref = Stream()
    run(make_host(LLMEngine(CFG), [ref]), ref, sp, {"max_num_batched_tokens": 64})
    got = Stream()
    h = remote.new_host([got])
    assert isinstance(h, EngineCoreClient)
    run(h, got, sp, {"max_num_batched_tokens": 64})
    # the same tokens for every request, and the same step composition, step by step
    tok = lambda s: {r.request_id: r.output_token_ids for r in s.of(RequestRecord)}  # noqa: E731
    assert tok(got) == tok(ref) and len(tok(got)) == len(sp)
    comp = lambda s: [(r.num_prefill_tokens, r.num_decode_reqs, r.max_num_batched_tokens)  # noqa
                      for r in s.of(StepRecord)]
    assert comp(got) == comp(ref)
    # the knob change is one event, in force from the first step
    ev = [e for e in got.of(EngineEvent) if e.kind == "knob"]
    first = got.of(StepRecord)[0]
    assert [(e.name, e.old, e.new, e.step) for e in ev] == [
        ("max_num_batched_tokens", 128, 64, first.step)]
    assert remote.scheduler_config.max_num_batched_tokens == 64
    # order: a request's tokens stream before its record; its record after the step that ended it
    seen: dict[str, int] = {}
    for x in got.items:
        if isinstance(x, StepOutput):
            for rid, _ in x.tokens:
                seen[rid] = seen.get(rid, 0) + 1
        elif isinstance(x, RequestRecord):
            assert seen.get(x.request_id) == x.output_len
    assert remote.state is not None and remote.state[:3] == (0, 0, 0)
    remote.new_host().stop()  # leave the knob as it was for the other tests
    h = remote.new_host()
    h.set_config(max_num_batched_tokens=128)
    h.start()
    h.stop()


def test_commands_and_refusals(remote):
    s = Stream()
    h = remote.new_host([s])
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        h.set_config(max_num_batched_tokens=-3)
    with pytest.raises(ConfigError, match="mode"):
        h.set_mode("sideways")
    h.start()
    h.pause()
    h.submit("held", list(range(1, 30)), SamplingParams(max_tokens=4, ignore_eos=True))
    time.sleep(0.5)
    assert not s.of(RequestRecord) and h.paused
    h.mark("edge")
    h.resume()
    assert h.wait_done(60)
    rec = s.of(RequestRecord)
    assert [(r.request_id, r.output_len, r.finish_reason) for r in rec] == [("held", 4, "length")]
    kinds = [e.kind for e in s.of(EngineEvent)]
    assert kinds[:3] == ["pause", "mark", "resume"]
    # a request the engine refuses is a record with the reason, the engine goes on
    h.submit("too-long", list(range(1, 600)), SamplingParams(max_tokens=4))
    assert h.wait_done(60)
    bad = [r for r in s.of(RequestRecord) if r.request_id == "too-long"]
    assert bad and bad[0].finish_reason == "error" and "too-long" in bad[0].error
    h.stop()


def test_stop_withdraws_the_requests_in_flight(remote):
    s = Stream()
    h = remote.new_host([s])
    h.start()
    h.submit("long", list(range(1, 50)), SamplingParams(max_tokens=400, ignore_eos=True))
    t = time.monotonic()
    while not s.of(StepRecord) and time.monotonic() - t < 30:
        time.sleep(0.01)
    h.stop(abort_remaining=True, abort_reason="session end")
    # stop returns after the withdrawn record reached the sink
    rec = s.of(RequestRecord)
    assert [(r.request_id, r.finish_reason) for r in rec] == [("long", "session end")]
    assert not remote.has_unfinished()


def test_bad_model_is_one_line():
    cfg = EngineConfig(model="/nonexistent/model-folder", device="cpu")
    with pytest.raises(ConfigError) as e:
        RemoteEngine.spawn(cfg)
    assert "/nonexistent/model-folder" in str(e.value) and "\n" not in str(e.value)


def test_a_dead_engine_process_is_one_line_and_ends_the_wait():
    eng = RemoteEngine.spawn(CFG)
    try:
        s = Stream()
        h = eng.new_host([s])
        h.start()
        h.submit("r", list(range(1, 50)), SamplingParams(max_tokens=10_000 // 40, ignore_eos=True))
        os.kill(eng.pid, signal.SIGKILL)
        assert h.wait_done(30)
        assert isinstance(h.error, EngineProcessError)
        assert "killed by SIGKILL" in str(h.error)
        err = [e for e in s.of(EngineEvent) if e.kind == "error"]
        assert len(err) == 1 and "engine process is gone" in err[0].message
        with pytest.raises(EngineProcessError):
            eng.close()
            eng.new_host()
    finally:
        eng.close()


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
