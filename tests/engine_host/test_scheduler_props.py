"""Scheduler properties, checked with hypothesis over random workloads, knob changes and pool
sizes. The harness plays the runner's part (advance computed tokens, append a sampled token,
finish at the forced length) without a model, so thousands of steps run in seconds."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from gpuchef.engine_host.vocab.config import SchedulerConfig
from gpuchef.engine_host.kv_cache import KVCacheManager, cdiv
from gpuchef.engine_host.request import Request, SamplingParams
from gpuchef.engine_host.scheduler import Scheduler

BS = 4


def make_req(i: int, prompt_len: int, out_len: int) -> Request:
    return Request(f"r{i}", list(range(10, 10 + prompt_len)),
                   SamplingParams(max_tokens=out_len, ignore_eos=True), arrival_ns=i)


def run(reqs, configs, num_blocks, arrivals=None, max_steps=20000):
    """Drive the scheduler to completion; ``configs[k]`` is put in force before step k (the last
    one stays). Returns per-step observations."""
    kv = KVCacheManager(1, num_blocks, BS, 1, 1, torch.float32, torch.device("cpu"))
    sched = Scheduler(configs[0], kv)
    arrivals = arrivals or [0] * len(reqs)
    pending = sorted(zip(arrivals, range(len(reqs))))
    done: list[Request] = []
    obs = []
    step = 0
    while (pending or sched.num_unfinished) and step < max_steps:
        while pending and pending[0][0] <= step:
            sched.add(reqs[pending.pop(0)[1]])
        cfg = configs[min(step, len(configs) - 1)]
        sched.config = cfg
        before_running = list(sched.running)
        before_decoding = [r for r in before_running if not r.is_prefill]
        before_partial = sum(1 for r in before_running if r.is_prefill)
        out = sched.schedule()
        obs.append(dict(cfg=cfg, out=out, before_running=before_running,
                        before_decoding=before_decoding, before_partial=before_partial,
                        running=len(sched.running),
                        prefills=[(r, n, r.remaining_prefill) for r, n in out.prefills],
                        admitted=[r for r, _ in out.prefills if r not in before_running]))
        # the runner's part
        for r in out.decodes:
            r.num_computed_tokens += 1
        for r, n in out.prefills:
            r.num_computed_tokens += n
        for r in out.decodes + [r for r, _ in out.prefills]:
            assert len(r.block_ids) * BS >= r.num_computed_tokens
            if r.num_computed_tokens == r.num_tokens:
                r.output_token_ids.append(7)
                if len(r.output_token_ids) == r.sampling.max_tokens:
                    sched.remove(r)
                    done.append(r)
        obs[-1]["admitted_partial"] = [r for r in obs[-1]["admitted"] if r.is_prefill]
        step += 1
    return kv, sched, done, obs


lengths = st.tuples(st.integers(1, 40), st.integers(1, 12))
knobs = st.builds(
    SchedulerConfig,
    mode=st.sampled_from(["continuous", "chunked"]),
    max_num_batched_tokens=st.integers(1, 64),
    max_num_seqs=st.integers(1, 8),
    long_prefill_token_threshold=st.integers(0, 24),
    max_num_partial_prefills=st.integers(1, 3),
    max_long_partial_prefills=st.integers(1, 3),
)


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(lengths, min_size=1, max_size=14),
       configs=st.lists(knobs, min_size=1, max_size=6),
       spare_blocks=st.integers(0, 40),
       arrivals=st.lists(st.integers(0, 30), min_size=14, max_size=14))
def test_scheduler_invariants(specs, configs, spare_blocks, arrivals):
    reqs = [make_req(i, p, o) for i, (p, o) in enumerate(specs)]
    # the pool always holds the largest request; spare_blocks=0 forces preemption
    num_blocks = max(cdiv(p + o, BS) for p, o in specs) + spare_blocks
    # spread the config changes out over the run
    sched_cfgs = [c for c in configs for _ in range(7)]
    kv, sched, done, obs = run(reqs, sched_cfgs, num_blocks, arrivals[:len(reqs)])

    # every request ends, with exactly its forced length; all pages come back
    assert sorted(r.request_id for r in done) == sorted(r.request_id for r in reqs)
    for r in done:
        assert len(r.output_token_ids) == r.sampling.max_tokens
        assert r.block_ids == []
    assert kv.pool.num_free == num_blocks
    assert not sched.running and not sched.waiting

    for o in obs:
        cfg, out = o["cfg"], o["out"]
        assert out.config is cfg  # the knobs set before a step are the ones it ran with
        tokens = out.num_tokens
        # the budget is never exceeded; continuous runs one over-budget prompt alone
        if tokens > cfg.max_num_batched_tokens:
            assert cfg.mode == "continuous" and len(out.prefills) == 1 and not out.decodes
        # max_num_seqs: a step that admits never takes the running set over the cap
        if o["admitted"]:
            assert o["running"] <= cfg.max_num_seqs
        names = [r.request_id for r in out.decodes] + [r.request_id for r, _ in out.prefills]
        assert len(names) == len(set(names))
        if cfg.mode == "continuous":
            assert not (out.decodes and out.prefills), "continuous mixed prefill and decode"
            # prompts are never split
            for r, n, remaining in o["prefills"]:
                assert n == remaining
        else:
            for r, n in out.prefills:
                assert n <= cfg.chunk_limit
            # stall-free: every decode that survived preemption runs, while the budget allows
            alive = [r for r in o["before_decoding"] if r not in out.preempted]
            if len(out.decodes) < len(alive):
                assert len(out.decodes) == cfg.max_num_batched_tokens
            # new partial prefills only while under the cap
            if o["admitted_partial"]:
                assert out.num_partial_prefills <= cfg.max_num_partial_prefills


def test_chunked_splits_long_prompt_and_mixes_decodes():
    cfg = SchedulerConfig(mode="chunked", max_num_batched_tokens=16, long_prefill_token_threshold=8)
    a, b = make_req(0, 4, 5), make_req(1, 30, 2)
    kv, sched, done, obs = run([a, b], [cfg], 64, arrivals=[0, 2])
    # b's 30-token prompt goes in chunks of ≤ 8 beside a's decodes
    b_chunks = [n for o in obs for r, n in o["out"].prefills if r is b]
    assert b_chunks[:3] == [8, 8, 8] and sum(b_chunks) == 30
    mixed = [o for o in obs if o["out"].decodes and o["out"].prefills]
    assert mixed, "chunked mode never mixed a decode with a prefill chunk"


def test_continuous_holds_decodes_while_prefilling():
    cfg = SchedulerConfig(mode="continuous", max_num_batched_tokens=64)
    a, b = make_req(0, 4, 6), make_req(1, 30, 2)
    kv, sched, done, obs = run([a, b], [cfg], 64, arrivals=[0, 2])
    # the step that admits b's whole prompt carries no decode of a
    step_b = next(o for o in obs if any(r is b for r, _ in o["out"].prefills))
    assert [n for r, n in step_b["out"].prefills if r is b] == [30]
    assert not step_b["out"].decodes


def test_preemption_by_recompute_requeues_at_front():
    cfg = SchedulerConfig(mode="chunked", max_num_batched_tokens=64)
    # two requests that together outgrow 6 blocks of 4 tokens
    a, b = make_req(0, 8, 12), make_req(1, 8, 12)
    kv, sched, done, obs = run([a, b], [cfg], 6)
    assert sum(len(o["out"].preempted) for o in obs) >= 1
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    # after a preemption the victim recomputes prompt + outputs so far in one prefill
    o = next(o for o in obs if o["out"].preempted)
    i = obs.index(o)
    later = [n for oo in obs[i + 1:] for r, n in oo["out"].prefills if r is b]
    assert later and later[0] > 8
    assert len(b.output_token_ids) == 12 and kv.pool.num_free == 6
