"""The scheduler's request lifecycle (``advance`` / ``postprocess`` / ``finish`` / ``preempt`` /
``may_preempt``): hand-worked steps on a pool of a few blocks give the tokens, finish reasons,
queues and free blocks worked out below; ``may_preempt`` never says "no" before a step that
preempts (hypothesis); and through the engine, a pool small enough to force preemption gives
every request the tokens of a run in a pool that never preempts, sync and async."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.kv_cache import KVCacheManager, cdiv
from gpuchef.engine_host.request import (PLACEHOLDER_TOKEN, Request, RequestStatus,
                                         SamplingParams)
from gpuchef.engine_host.scheduler import Scheduler, reaches_length, stop_reason

BS = 4
EOS = (7,)
BIG = 1 << 20  # a max_model_len no request reaches


def req(rid: str, prompt_len: int, max_tokens: int, **kw) -> Request:
    return Request(rid, list(range(10, 10 + prompt_len)), SamplingParams(max_tokens=max_tokens, **kw),
                   arrival_ns=0)


def sched_of(num_blocks: int, **cfg) -> Scheduler:
    kv = KVCacheManager(1, num_blocks, BS, 1, 1, torch.float32, torch.device("cpu"))
    return Scheduler(SchedulerConfig(mode="chunked", **cfg), kv)


def step(s: Scheduler, step_id: int, tokens: dict[str, int], max_model_len: int = BIG):
    """Schedule, book as computed, and sample ``tokens[request id]`` for each request whose
    prompt + outputs are all computed (what the runner samples)."""
    out = s.schedule()
    s.advance(out, step_id, 1000 + step_id)
    rows = list(out.decodes) + [r for r, _ in out.prefills]
    sampled = [(r, tokens[r.request_id]) for r in rows if r.num_computed_tokens == r.num_tokens]
    return out, s.postprocess(sampled, 2000 + step_id, EOS, max_model_len)


def test_stop_reason_rules():
    r = req("r", 5, 3)
    assert stop_reason(r, 1, 11, EOS, BIG) == ""
    assert stop_reason(r, 1, 7, EOS, BIG) == "stop"
    assert stop_reason(r, 3, 7, EOS, BIG) == "length"  # length is checked first (vLLM)
    assert stop_reason(r, 2, 11, EOS, 7) == "length"   # 5 + 2 fills max_model_len 7
    assert stop_reason(r, 1, 11, EOS, 7) == ""
    ign = req("i", 5, 9, ignore_eos=True, stop_token_ids=(12,))
    assert stop_reason(ign, 1, 7, EOS, BIG) == ""
    assert stop_reason(ign, 1, 12, EOS, BIG) == "stop"  # stop ids apply despite ignore_eos
    assert reaches_length(ign, 9, BIG) and not reaches_length(ign, 8, BIG)


def test_postprocess_appends_finishes_and_frees_by_hand():
    s = sched_of(4, max_num_batched_tokens=16)
    a, b = req("a", 6, 3), req("b", 3, 5)
    s.add(a)
    s.add(b)
    # step 0: both prompts whole (6 + 3 ≤ 16): a takes 2 blocks, b 1; both sample
    out, post = step(s, 0, {"a": 11, "b": 12})
    assert [(r.request_id, n) for r, n in out.prefills] == [("a", 6), ("b", 3)]
    assert post.tokens == [("a", 11), ("b", 12)]
    assert post.first == [("a", 0, 6), ("b", 0, 3)]
    assert post.finished == [] and s.kv.pool.num_free == 1
    assert a.first_scheduled_ns == b.first_scheduled_ns == 1000 and a.last_step == 0
    # step 1: two decodes, each with room in its last block; b samples EOS: "stop", freed
    out, post = step(s, 1, {"a": 13, "b": 7})
    assert out.decodes == [a, b] and not out.prefills
    assert post.first == [] and post.finished == [b]
    assert (b.status, b.finish_reason, b.output_token_ids) == (RequestStatus.FINISHED, "stop", [12, 7])
    assert s.running == [a] and s.kv.pool.num_free == 2 and b.block_ids == []
    assert b.token_times_ns == [2000, 2001]
    # step 2: a's third token is its max_tokens: "length", every block back
    out, post = step(s, 2, {"a": 7})
    assert post.finished == [a] and a.finish_reason == "length"
    assert a.output_token_ids == [11, 13, 7]
    assert s.num_unfinished == 0 and s.kv.pool.num_free == 4


def test_preempt_by_recompute_by_hand():
    s = sched_of(3, max_num_batched_tokens=16)
    a, b = req("a", 4, 4, ignore_eos=True), req("b", 4, 4, ignore_eos=True)
    s.add(a)
    s.add(b)
    assert not s.may_preempt()
    step(s, 0, {"a": 11, "b": 12})  # one block each, both full; 1 free
    # step 1: a's decode takes the last block, b's finds none: b (the tail) is preempted
    assert s.may_preempt()
    out, post = step(s, 1, {"a": 13})
    assert out.decodes == [a] and out.preempted == [b] and not out.prefills
    assert (b.status, b.num_computed_tokens, b.block_ids, b.num_preemptions) == (
        RequestStatus.WAITING, 0, [], 1)
    assert list(s.waiting) == [b] and s.running == [a] and s.kv.pool.num_free == 1
    assert b.output_token_ids == [12]  # kept: recomputed on re-admission
    # steps 2, 3: b needs 2 blocks for prompt + 1 output, only 1 is free: a decodes alone
    for k, tok in ((2, 14), (3, 15)):
        out, post = step(s, k, {"a": tok})
        assert out.decodes == [a] and not out.prefills and not out.preempted
    assert post.finished == [a] and a.output_token_ids == [11, 13, 14, 15]
    # step 4: b re-admitted with its prompt + output recomputed (5 tokens) and samples again
    out, post = step(s, 4, {"b": 16})
    assert [(r.request_id, n) for r, n in out.prefills] == [("b", 5)]
    assert post.first == [] and post.tokens == [("b", 16)]  # not its first token
    assert b.output_token_ids == [12, 16]


def test_finish_holds_blocks_of_the_step_in_flight():
    s = sched_of(8, max_num_batched_tokens=16)
    a = req("a", 5, 4)
    s.add(a)
    out = s.schedule()
    s.advance(out, 3, 0)
    assert s.reserve_outputs([a], BIG) == [0] and a.output_token_ids == [PLACEHOLDER_TOKEN]
    hold: list[Request] = []
    s.finish(a, "abort", in_flight_step=3, hold=hold)  # step 3 still writes a's KV
    assert hold == [a] and len(a.block_ids) == 2 and s.kv.pool.num_free == 6
    assert a.output_token_ids == [] and a.status is RequestStatus.FINISHED and not s.running
    b = req("b", 5, 4)
    s.add(b)
    out = s.schedule()
    s.advance(out, 4, 0)
    s.finish(b, "abort", in_flight_step=3, hold=hold)  # not in step 3: freed at once
    assert hold == [a] and b.block_ids == [] and s.kv.pool.num_free == 6


def test_reserve_outputs_unschedules_a_sure_length_finish():
    s = sched_of(8, max_num_batched_tokens=16)
    a, b = req("a", 5, 1), req("b", 5, 2)
    s.add(a)
    s.add(b)
    out = s.schedule()
    s.advance(out, 0, 0)
    assert s.reserve_outputs([a, b], BIG) == [0, 0]
    assert s.running == [b]  # a's one token is its max_tokens; its blocks stay
    post = s.postprocess([(a, 11), (b, 12)], 0, EOS, BIG, slots=[0, 0])
    assert post.finished == [a] and a.finish_reason == "length" and a.block_ids == []


# -- may_preempt: never a false "no" ------------------------------------------------------------

knobs = st.builds(SchedulerConfig, mode=st.sampled_from(["continuous", "chunked"]),
                  max_num_batched_tokens=st.integers(1, 48), max_num_seqs=st.integers(1, 6),
                  long_prefill_token_threshold=st.integers(0, 16),
                  max_num_partial_prefills=st.integers(1, 3))


@settings(max_examples=200, deadline=None)
@given(specs=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 10)), min_size=1, max_size=10),
       configs=st.lists(knobs, min_size=1, max_size=4), spare=st.integers(0, 12))
def test_may_preempt_never_misses_a_preemption(specs, configs, spare):
    num_blocks = max(cdiv(p + o, BS) for p, o in specs) + spare
    s = sched_of(num_blocks)
    for i, (p, o) in enumerate(specs):
        s.add(req(f"r{i}", p, o, ignore_eos=True))
    preempted = k = 0
    while s.num_unfinished:
        s.config = configs[(k // 4) % len(configs)]
        predicted = s.may_preempt()
        out = s.schedule()
        assert predicted or not out.preempted, "may_preempt said no before a preemption"
        preempted += len(out.preempted)
        s.advance(out, k, 0)
        rows = list(out.decodes) + [r for r, _ in out.prefills]
        s.postprocess([(r, 11) for r in rows if r.num_computed_tokens == r.num_tokens], 0, EOS, BIG)
        k += 1
        assert k < 5000
    assert s.kv.pool.num_free == num_blocks


# -- through the engine: preemption changes no token ---------------------------------------------

from test_engine_async import drive, fake_engine  # noqa: E402


@pytest.fixture(scope="module")
def base_engine():
    return LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=64,
                                  cache=CacheConfig(block_size=BS, num_gpu_blocks=64)))


@pytest.mark.parametrize("async_on", [False, True])
def test_tiny_pool_preempts_and_keeps_every_token(base_engine, async_on):
    specs = [(9, 12, True), (14, 10, True), (5, 14, False), (11, 9, True), (7, 13, True)]
    cfg = [SchedulerConfig(mode="chunked", max_num_batched_tokens=24)]
    arrivals = [0] * len(specs)
    ref, ref_rec = drive(fake_engine(base_engine, 64, cfg[0], async_on, 48), specs, cfg, arrivals)
    assert sum(r.num_preempted for r in ref_rec) == 0
    tiny = max(cdiv(p + o, BS) for p, o, _ in specs) + 1  # one request and a block
    eng = fake_engine(base_engine, tiny, cfg[0], async_on, 48)
    got, rec = drive(eng, specs, cfg, arrivals)
    assert sum(r.num_preempted for r in rec) > 0, "the pool was meant to force preemption"
    assert got == ref
    assert sum(r.num_finished for r in rec) == len(specs)
    assert all(r.kv_blocks_used <= tiny for r in rec)
