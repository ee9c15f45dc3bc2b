"""A session that closes with requests still in the engine (`gpuchef top` quit under load, a
bench interrupted) withdraws them: their records say "session end", and the numbers count them
as withdrawn, neither completed nor failed — a report of the trace used to show every one as a
failed request (302 in a tester's `top` trace), as if the server had lost them."""

import time

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.vocab.workload import WorkloadConfig
from gpuchef.sessions.live import LiveSession
from gpuchef.probes.metrics import SESSION_END_REASON, is_withdrawn, results_block_rows, summarize
from gpuchef.probes.nvml.fake import FakeNvml
from gpuchef.probes.recorder import read_trace


def test_requests_in_the_engine_at_close_are_withdrawn_not_failed(tmp_path):
    eng = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=512,
                                 cache=CacheConfig(num_gpu_blocks=1024),
                                 scheduler=SchedulerConfig(mode="chunked",
                                                           max_num_batched_tokens=256)))
    # far above what the tiny CPU engine serves: a queue builds, requests are in flight at close
    wcfg = WorkloadConfig(dataset="random", request_rate=200.0, input_len=64, output_len=64,
                          num_prompts=400, vocab_size=eng.model_config.vocab_size,
                          max_model_len=eng.max_model_len)
    trace = tmp_path / "t.jsonl"
    s = LiveSession(eng, wcfg, trace_path=str(trace), nvml=FakeNvml(), host_probe=False)
    s.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (eng.requests and s.timeline.snapshot(
            s.clock()).requests):
        time.sleep(0.05)
    in_engine = len(eng.requests)
    s.close()
    assert in_engine > 0
    t = read_trace(trace)
    ended = [r for r in t.requests if r.finish_reason == SESSION_END_REASON]
    assert ended and all(is_withdrawn(r.finish_reason) for r in ended)
    # every request that did not complete was in the engine at close: none reads "abort"
    assert {r.finish_reason for r in t.requests} <= {"length", "stop", SESSION_END_REASON}
    m = summarize(t.requests, 1.0)
    assert m.withdrawn == len(ended) and m.failed == 0
    assert m.completed == sum(r.finish_reason in ("length", "stop") for r in t.requests) > 0
    rows = {label: v for _, label, v in results_block_rows(m)}
    assert str(rows.get("Withdrawn requests (not failed):")) == str(len(ended)), rows


import pytest  # noqa: E402

#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
