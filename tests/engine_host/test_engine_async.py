"""Async scheduling (``EngineConfig.async_scheduling``) gives the same tokens as the synchronous
engine, and its records and KV pages stay right.

Two layers: (1) the real engine loop with a fake runner whose "model" is a hash of each
request's whole token history (a wrong input token — e.g. a placeholder read instead of the
previous step's token — changes every later token), checked with hypothesis over workloads,
knob/mode changes, tiny pools (preemption), EOS stops, aborts and arrivals; the fake also fails
if a block is freed while a launched step still writes it. (2) The tiny Llama in float64 on CPU:
greedy outputs equal the synchronous engine's and transformers' for the scheduler scenarios."""

from __future__ import annotations

import dataclasses
import pytest
import torch
from hypothesis import given, settings, strategies as st

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.kv_cache import KVCacheManager, cdiv
from gpuchef.engine_host.request import PLACEHOLDER_TOKEN, SamplingParams
from gpuchef.engine_host.runner import StepHandle
from gpuchef.engine_host.scheduler import Scheduler

BS = 4
V = 50
EOS = 7


class FakeRunner:
    """launch/wait over the engine's real bookkeeping; the token a row samples is a hash of the
    request's full history (its pending input token read from ``prev``, as the GPU does)."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.last_step_used_graph = False
        self.in_flight: dict[int, set[int]] = {}  # id(handle) → blocks it writes
        self.launched = self.waited = 0
        pool_free = kv.pool.free

        def checked_free(blocks):
            for written in self.in_flight.values():
                assert not written & set(blocks), "freed a block a launched step still writes"
            pool_free(blocks)
        kv.pool.free = checked_free

    def launch(self, out, prev=None):
        assert len(self.in_flight) <= 1, "more than one step in flight before this launch"
        rows = [(r, r.num_computed_tokens, 1) for r in out.decodes]
        rows += [(r, r.num_computed_tokens, n) for r, n in out.prefills]
        sample_reqs, toks, written = [], [], set()
        for r, start, n in rows:
            assert len(r.block_ids) * BS >= start + n, "KV pages do not cover the chunk"
            written.update(r.block_ids[start // BS:(start + n - 1) // BS + 1])
            hist = r.token_slice(0, start + n)
            if hist[-1] == PLACEHOLDER_TOKEN:
                assert n == 1 and r in out.decodes and prev is not None
                hist[-1] = int(prev.tokens[prev.row_of(r)])
            assert PLACEHOLDER_TOKEN not in hist
            if start + n == r.num_tokens:
                h = hash((r.request_id, tuple(hist)))
                tok = EOS if h % 11 == 0 else 10 + h % (V - 10)
                sample_reqs.append(r)
                toks.append(tok)
        h = StepHandle(sample_reqs, used_graph=False)
        h.tokens = torch.tensor(toks, dtype=torch.int64) if toks else None
        self.in_flight[id(h)] = written
        self.launched += 1
        return h

    def wait(self, h):
        del self.in_flight[id(h)]
        self.waited += 1
        toks = h.tokens.tolist() if h.tokens is not None else []
        return list(zip(h.sample_reqs, toks)), 0.5

    def execute(self, out):
        return self.wait(self.launch(out))


@pytest.fixture(scope="module")
def base_engine():
    return LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=64,
                                  cache=CacheConfig(block_size=BS, num_gpu_blocks=64)))


def fake_engine(base, num_blocks, cfg, async_on, max_model_len):
    """``base`` re-wired to a fresh pool, scheduler and fake runner (no model runs)."""
    eng = base
    eng.config = dataclasses.replace(base.config, async_scheduling=async_on)
    eng.kv = KVCacheManager(1, num_blocks, BS, 1, 1, torch.float32, torch.device("cpu"))
    eng.num_blocks = num_blocks
    eng.scheduler = Scheduler(cfg, eng.kv)
    eng.runner = FakeRunner(eng.kv)
    eng.model_config = dataclasses.replace(eng.model_config, eos_token_ids=(EOS,))
    eng.max_model_len = max_model_len
    eng.requests = {}
    eng.step_id = 0
    eng._inflight = None
    eng._last_t_end = 0
    return eng


def drive(eng, specs, configs, arrivals, aborts=()):
    """Step to completion; ``configs[k]`` before call k, request i added before call
    ``arrivals[i]``, ``aborts`` = (call, index) pairs. Returns outputs and records."""
    outs, records, k = {}, [], 0
    pending = sorted(range(len(specs)), key=lambda i: arrivals[i])
    aborts = sorted(aborts)
    while pending or eng.has_unfinished():
        while pending and arrivals[pending[0]] <= k:
            i = pending.pop(0)
            p, o, ign = specs[i]
            eng.add_request(f"r{i}", [10 + (i * 7 + j) % 40 for j in range(p)],
                            SamplingParams(max_tokens=o, ignore_eos=ign))
        while aborts and aborts[0][0] <= k:
            rec = eng.abort(f"r{aborts.pop(0)[1]}")
            if rec is not None:
                assert PLACEHOLDER_TOKEN not in rec.output_token_ids
                outs[rec.request_id] = (rec.output_token_ids, "abort")
        eng.set_scheduler_config(configs[min(k, len(configs) - 1)])
        res = eng.step()
        if res.record is not None:
            records.append(res.record)
        for f in res.finished:
            assert PLACEHOLDER_TOKEN not in f.output_token_ids
            assert len(f.token_times_ns) == f.output_len
            outs[f.request_id] = (f.output_token_ids, f.finish_reason)
        k += 1
        assert k < 5000
    assert eng.runner.launched == eng.runner.waited
    assert eng.kv.pool.num_free == eng.num_blocks, "KV blocks leaked"
    assert not eng.scheduler.running and not eng.scheduler.waiting
    return outs, records


def check_records(records):
    assert [r.step for r in records] == list(range(len(records)))
    for a, b in zip(records, records[1:]):
        assert a.t_end_ns <= b.t_start_ns <= b.t_end_ns
    for r in records:
        if r.num_tokens > r.max_num_batched_tokens:
            assert r.mode == "continuous" and r.num_prefill_reqs == 1 and not r.num_decode_reqs
        if r.mode == "continuous":
            assert not (r.num_decode_reqs and r.num_prefill_reqs)


lengths = st.tuples(st.integers(1, 40), st.integers(1, 14), st.booleans())
knobs = st.builds(
    SchedulerConfig, mode=st.sampled_from(["continuous", "chunked"]),
    max_num_batched_tokens=st.integers(1, 64), max_num_seqs=st.integers(1, 8),
    long_prefill_token_threshold=st.integers(0, 24), max_num_partial_prefills=st.integers(1, 3))


@settings(max_examples=250, deadline=None)
@given(specs=st.lists(lengths, min_size=1, max_size=12),
       configs=st.lists(knobs, min_size=1, max_size=5),
       spare_blocks=st.integers(0, 30),
       arrivals=st.lists(st.integers(0, 25), min_size=12, max_size=12),
       aborts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 11)), max_size=3))
def test_async_equals_sync_with_fake_model(base_engine, specs, configs, spare_blocks, arrivals,
                                           aborts):
    max_len = 48
    num_blocks = max(cdiv(min(p + o, max_len), BS) for p, o, _ in specs) + spare_blocks
    cfgs = [c for c in configs for _ in range(5)]
    arrivals = arrivals[:len(specs)]
    aborts = [(k, i) for k, i in aborts if i < len(specs)]
    ref, ref_rec = drive(fake_engine(base_engine, num_blocks, cfgs[0], False, max_len),
                         specs, cfgs, arrivals)
    got, rec = drive(fake_engine(base_engine, num_blocks, cfgs[0], True, max_len),
                     specs, cfgs, arrivals, aborts)
    check_records(rec)
    assert set(got) == set(ref)
    aborted = {f"r{i}" for _, i in aborts}
    for rid, (toks, reason) in got.items():
        if reason == "abort":
            assert rid in aborted and ref[rid][0][:len(toks)] == toks
        else:
            assert (toks, reason) == ref[rid], rid
    if not aborts:  # (token totals may differ: preemptions recompute different amounts)
        assert sum(r.num_finished for r in rec) == sum(r.num_finished for r in ref_rec)


def test_async_overlaps_decode_steps_and_stops_on_eos(base_engine):
    """Steady decode: every call after the first launches the next step before completing the
    current one; an EOS stop discards the request's row in the step already in flight."""
    cfg = SchedulerConfig(mode="chunked", max_num_batched_tokens=64)
    specs = [(5, 14, False)] * 6 + [(9, 14, True)] * 2
    eng = fake_engine(base_engine, 64, cfg, True, 48)
    inflight_after = []
    orig = eng.step

    def step():
        res = orig()
        inflight_after.append(eng.has_step_in_flight)
        return res
    eng.step = step
    got, rec = drive(eng, specs, [cfg], [0] * len(specs))
    ref, _ = drive(fake_engine(base_engine, 64, cfg, False, 48), specs, [cfg], [0] * len(specs))
    assert got == ref
    assert any(reason == "stop" for _, reason in got.values()), "no EOS fired"
    assert sum(inflight_after) >= len(rec) - 3  # overlapped all along but at the end
    check_records(rec)


# -- the real model ---------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")

# the tiny Llama, its prompts and transformers' greedy outputs: test_engine_greedy's fixtures
from test_engine_greedy import SCENARIOS, SHAPES, hf_folder, prompts, reference  # noqa: E402,F401


def run_real(folder, prompts, sched_cfgs, async_on, num_blocks=64, max_model_len=None,
             arrival_steps=(0, 0, 2, 3, 5, 9), eos=None, aborts=(), sampling=None):
    eng = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float64",
                                 max_model_len=max_model_len, async_scheduling=async_on,
                                 cache=CacheConfig(block_size=4, num_gpu_blocks=num_blocks),
                                 scheduler=sched_cfgs[0]))
    if eos is not None:
        eng.model_config = dataclasses.replace(eng.model_config, eos_token_ids=(eos,))
    outs, records, k = {}, [], 0
    pending = sorted(range(len(prompts)), key=lambda i: arrival_steps[i])
    while pending or eng.has_unfinished():
        while pending and arrival_steps[pending[0]] <= k:
            i = pending.pop(0)
            sp = sampling(i) if sampling else SamplingParams(max_tokens=SHAPES[i][1],
                                                             ignore_eos=eos is None)
            eng.add_request(f"r{i}", prompts[i], sp)
        for kk, i in aborts:
            if kk == k and (rec := eng.abort(f"r{i}")) is not None:
                outs[rec.request_id] = (list(rec.output_token_ids), "abort")
        eng.set_scheduler_config(sched_cfgs[min(k, len(sched_cfgs) - 1)])
        res = eng.step()
        if res.record is not None:
            records.append(res.record)
        for f in res.finished:
            outs[f.request_id] = (list(f.output_token_ids), f.finish_reason)
        k += 1
        assert k < 5000
    assert eng.kv.pool.num_free == num_blocks
    return outs, records


C = SchedulerConfig


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_async_greedy_equals_sync_and_transformers(name, hf_folder, prompts, reference):
    sync, sync_rec = run_real(hf_folder[0], prompts, SCENARIOS[name], False)
    got, rec = run_real(hf_folder[0], prompts, SCENARIOS[name], True)
    assert got == sync
    assert [got[f"r{i}"][0] for i in range(len(prompts))] == reference
    check_records(rec)
    assert sum(r.num_finished for r in rec) == len(prompts)
    assert sum(r.num_prefill_tokens for r in rec) == sum(r.num_prefill_tokens for r in sync_rec)
    assert sum(r.num_decode_reqs for r in rec) == sum(r.num_decode_reqs for r in sync_rec)


def test_async_preemption_keeps_outputs(hf_folder, prompts, reference):
    for cfg in (C(mode="chunked", max_num_batched_tokens=32),
                C(mode="continuous", max_num_batched_tokens=96)):
        got, rec = run_real(hf_folder[0], prompts, [cfg], True, num_blocks=22, max_model_len=80,
                            arrival_steps=[0] * 6)
        assert sum(r.num_preempted for r in rec) > 0, "the pool was meant to force preemption"
        assert [got[f"r{i}"][0] for i in range(len(prompts))] == reference
        check_records(rec)


def test_async_eos_stops_and_aborts_equal_sync(hf_folder, prompts, reference):
    # the most frequent greedy token stands in for EOS, so that some requests stop early
    flat = [t for out in reference for t in out]
    eos = max(set(flat), key=flat.count)
    cfg = [C(mode="chunked", max_num_batched_tokens=16)]
    sync, _ = run_real(hf_folder[0], prompts, cfg, False, eos=eos)
    got, rec = run_real(hf_folder[0], prompts, cfg, True, eos=eos)
    assert got == sync
    assert any(reason == "stop" for _, reason in got.values())
    check_records(rec)
    got, _ = run_real(hf_folder[0], prompts, cfg, True, aborts=[(4, 4), (6, 1), (7, 5)])
    for i, ref in enumerate(reference):
        toks, reason = got[f"r{i}"]
        if reason == "abort":
            assert ref[:len(toks)] == toks
        else:
            assert toks == ref


def test_async_seeded_sampling_equals_sync(hf_folder, prompts):
    def sp(i):
        return SamplingParams(max_tokens=SHAPES[i][1] + 3, temperature=0.9, top_p=0.9, top_k=20,
                              seed=100 + i, ignore_eos=True)
    cfg = [C(mode="chunked", max_num_batched_tokens=16)]
    sync, _ = run_real(hf_folder[0], prompts, cfg, False, sampling=sp)
    got, _ = run_real(hf_folder[0], prompts, cfg, True, sampling=sp)
    assert got == sync
