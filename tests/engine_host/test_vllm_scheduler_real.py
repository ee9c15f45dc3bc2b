"""gpuchef's scheduler subclass over vLLM's *real* Scheduler and AsyncScheduler, without a GPU.

vLLM's scheduler is plain Python: built as vLLM's own scheduler tests build it (a VllmConfig on
the ``tiny`` preset's config.json, a KVCacheConfig of one full-attention group, no model), it can
be stepped by hand. A stand-in model runner samples one token whenever a step reaches the end of
the tokens it knows (as vLLM's runner does: partial-prefill samples are discarded); the token is
a function of the request's tokens so far, so outputs can be compared across schedules. The
engine core's two step loops are mirrored: ``EngineCore.step`` (schedule, run, update) and
``step_with_batch_queue`` (schedule step N+1 before updating step N, with AsyncScheduler).

Skipped where vLLM is not importable (CI); on the GPU machine it runs with the installed vLLM,
before the tests that need the GPU (test_vllm_gpu.py).
"""

from __future__ import annotations

from collections import deque

import pytest

pytestmark = pytest.mark.vllm
sched_mod = pytest.importorskip("vllm.v1.core.sched.scheduler")

import torch  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig,  # noqa: E402
                         SchedulerConfig as VllmSchedulerConfig, VllmConfig)
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from gpuchef.engine_host.vocab.errors import ConfigError  # noqa: E402
from gpuchef.engine_host.vocab.config import EngineConfig, SchedulerConfig  # noqa: E402
from gpuchef.engine_host.request import SamplingParams  # noqa: E402

BS = 16


@pytest.fixture(autouse=True)
def _cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def build_scheduler(*, budget, seqs, num_blocks, async_scheduling, v2_runner):
    from gpuchef.engine_host import vllm_scheduler
    from gpuchef.engine_host.vllm_models import preset_model_folder

    mc = ModelConfig(model=str(preset_model_folder("tiny")), dtype="float32", seed=0,
                     skip_tokenizer_init=True, max_model_len=4096)
    sc = VllmSchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                             max_model_len=4096, enable_chunked_prefill=True,
                             is_encoder_decoder=False, async_scheduling=async_scheduling)
    cc = CacheConfig(block_size=BS, gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=False)
    dev = DeviceConfig(device="cuda" if torch.cuda.is_available() else "cpu")
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, device_config=dev)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    vc.cache_config.num_gpu_blocks = num_blocks
    cls = (vllm_scheduler.GpuchefAsyncScheduler if async_scheduling
           else vllm_scheduler.GpuchefScheduler)
    sched = cls(vllm_config=vc, kv_cache_config=kv, log_stats=False, block_size=BS,
                structured_output_manager=StructuredOutputManager(vc))
    # The V2 model runner (0.24's default for Llama on a GPU; it needs Triton) changes only how
    # the scheduler packs its output: resumed requests go out as new ones with all their tokens.
    sched.use_v2_model_runner = v2_runner
    return sched


class StandInCore:
    """EngineCore's surface that VllmEngine uses, over a real scheduler and a stand-in runner."""

    def __init__(self, scheduler, batch_queue: bool):
        self.scheduler = scheduler
        self.batch_queue = deque() if batch_queue else None
        self.known: dict[str, list[int]] = {}  # the runner's tokens per request
        self.log = []  # (SchedulerOutput, {req_id: pre-step computed}) per schedule

    # the runner: sample when a step reaches the end of what it knows
    def _run(self, so):
        pre = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        c = so.scheduled_cached_reqs
        pre.update(zip(c.req_ids, c.num_computed_tokens))
        self.log.append((so, pre))
        ids, toks = [], []
        for rid, n in so.num_scheduled_tokens.items():
            seq = self.known[rid]
            ids.append(rid)
            if pre[rid] + n >= len(seq):
                tok = (sum(seq) * 31 + len(seq)) % 4000 + 10
                seq.append(tok)
                toks.append([tok])
            else:
                toks.append([])
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=toks)

    def step_fn(self):
        s = self.scheduler
        if self.batch_queue is None:  # EngineCore.step
            if not s.has_requests():
                return {}, False
            so = s.schedule()
            return s.update_from_output(so, self._run(so)), so.total_num_scheduled_tokens > 0
        q = self.batch_queue  # EngineCore.step_with_batch_queue, queue of 2
        executed = False
        if s.has_requests():
            so = s.schedule()
            executed = so.total_num_scheduled_tokens > 0
            q.appendleft((so, self._run(so)))
            if len(q) < 2 and (executed or s.has_requests()):
                return None, executed
        elif not q:
            return None, False
        so, out = q.pop()
        return s.update_from_output(so, out), executed

    def post_step(self, executed):
        pass

    def preprocess_add_request(self, req):
        self.known[req.request_id] = list(req.prompt_token_ids)
        return Request.from_engine_core_request(req, None), 0

    def add_request(self, req, wave=0):
        self.scheduler.add_request(req)

    def abort_requests(self, ids):
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)


def make_engine(*, mode="chunked", budget=512, seqs=8, threshold=0, partial=1, num_blocks=400,
                async_scheduling=False, v2_runner=False):
    from gpuchef.engine_host.vllm_engine import VllmEngine, _VllmKV
    from gpuchef.engine_host.vllm_mapping import check_startup_knobs

    sched = build_scheduler(budget=budget, seqs=seqs, num_blocks=num_blocks,
                            async_scheduling=async_scheduling, v2_runner=v2_runner)
    eng = VllmEngine.__new__(VllmEngine)
    eng.config = EngineConfig(engine="vllm", scheduler=SchedulerConfig(
        mode=mode, max_num_batched_tokens=budget, max_num_seqs=seqs,
        long_prefill_token_threshold=threshold, max_num_partial_prefills=partial))
    check_startup_knobs(eng.config.scheduler)
    eng.model_config = type("MC", (), {"vocab_size": 4096, "eos_token_ids": (2,)})()
    eng.max_model_len = 4096
    eng.num_blocks = num_blocks - 1
    eng.kv = _VllmKV(sched.kv_cache_manager.block_pool, sched.block_size)
    core = StandInCore(sched, batch_queue=async_scheduling)
    eng._attach(core)
    return eng, core


def prompts(n, lo=40, hi=700, seed=0):
    import random
    rnd = random.Random(seed)
    return [[rnd.randrange(10, 4000) for _ in range(rnd.randrange(lo, hi))] for _ in range(n)]


def run(eng, reqs, max_tokens=12, on_step=None, limit=20_000):
    for i, p in enumerate(reqs):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    recs, done = [], {}
    for _ in range(limit):
        if not eng.has_unfinished():
            break
        res = eng.step()
        if res.record is not None:
            recs.append(res.record)
            if on_step:
                on_step(eng, res.record)
        for f in res.finished:
            done[f.request_id] = f
    assert not eng.has_unfinished(), "the engine did not finish"
    return recs, done


VARIANTS = [pytest.param(dict(async_scheduling=a, v2_runner=v), id=f"{'async' if a else 'sync'}-"
                         f"{'v2' if v else 'v1'}") for a in (False, True) for v in (False, True)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_chunked_records_match_vllms_schedule(variant):
    eng, core = make_engine(num_blocks=2000, **variant)
    reqs = prompts(12)
    recs, done = run(eng, reqs)
    assert len(done) == 12 and all(f.output_len == 12 for f in done.values())
    plen = {f"r{i}": len(p) for i, p in enumerate(reqs)}
    steps = [(so, pre) for so, pre in core.log if so.total_num_scheduled_tokens]
    assert len(recs) == len(steps)
    for rec, (so, pre) in zip(recs, steps):
        nst = so.num_scheduled_tokens
        assert rec.num_tokens == so.total_num_scheduled_tokens
        assert rec.num_decode_reqs == sum(1 for r in nst if pre[r] >= plen[r])
        assert rec.num_prefill_tokens == sum(min(n, max(0, plen[r] - pre[r]))
                                             for r, n in nst.items())
    assert any(r.num_prefill_tokens and r.num_decode_reqs for r in recs)
    # the tokens each request got are the runner's, in order
    for rid, f in done.items():
        assert list(f.output_token_ids) == core.known[rid][plen[rid]:]


@pytest.mark.parametrize("variant", VARIANTS)
def test_continuous_never_mixes_never_splits_and_matches_chunked_outputs(variant):
    reqs = prompts(16, hi=500)
    eng, core = make_engine(mode="continuous", **variant)
    recs, done = run(eng, reqs)
    assert len(done) == 16
    assert all(not (r.num_prefill_tokens and r.num_decode_reqs) for r in recs)
    assert any(r.num_prefill_reqs > 1 for r in recs)
    for so, pre in core.log:  # every prompt ran whole, in one step
        for nr in so.scheduled_new_reqs:
            assert so.num_scheduled_tokens[nr.req_id] == len(nr.prompt_token_ids)
    eng2, _ = make_engine(mode="chunked", **variant)
    _, done2 = run(eng2, reqs)
    assert {k: v.output_token_ids for k, v in done.items()} == \
        {k: v.output_token_ids for k, v in done2.items()}


@pytest.mark.parametrize("mode", ["chunked", "continuous"])
def test_preemption_by_recompute_under_both_modes(mode):
    reqs = prompts(10, seed=3)
    eng, _ = make_engine(mode=mode, num_blocks=90)
    recs, done = run(eng, reqs)
    assert len(done) == 10
    n = sum(r.num_preempted for r in recs)
    assert n > 0 and n == sum(f.num_preemptions for f in done.values())
    if mode == "continuous":
        assert all(not (r.num_prefill_tokens and r.num_decode_reqs) for r in recs)
    ref, _ = make_engine(num_blocks=2000)
    _, done_ref = run(ref, reqs)
    assert {k: v.output_token_ids for k, v in done.items()} == \
        {k: v.output_token_ids for k, v in done_ref.items()}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_knob_change_reaches_vllms_scheduler(async_scheduling):
    eng, core = make_engine(budget=512, async_scheduling=async_scheduling)
    s = core.scheduler
    changed = []

    def on_step(e, rec):
        if rec.step == 2 and not changed:
            changed.append(e.step_id)
            e.set_scheduler_config(e.scheduler_config.with_changes(
                max_num_batched_tokens=128, long_prefill_token_threshold=64, max_num_seqs=4))
    recs, _ = run(eng, prompts(12), on_step=on_step)
    after = [r for r in recs if r.step >= changed[0]]
    assert all(r.max_num_batched_tokens == 128 and r.num_tokens <= 128 for r in after)
    assert all(r.max_num_batched_tokens == 512 for r in recs if r.step < changed[0])
    assert s.max_num_scheduled_tokens == 128
    assert s.scheduler_config.long_prefill_token_threshold == 64
    assert s.max_num_running_reqs == 4  # everything finished: the cap is the knob again
    with pytest.raises(ConfigError, match="cannot be set live on vLLM"):
        eng.set_scheduler_config(eng.scheduler_config.with_changes(max_num_seqs=9))


def test_max_num_seqs_below_the_running_count_drains_without_tripping_vllm():
    eng, core = make_engine(seqs=8)

    def on_step(e, rec):
        if rec.step == 3:
            e.set_scheduler_config(e.scheduler_config.with_changes(max_num_seqs=2))
    recs, done = run(eng, prompts(12, lo=20, hi=60), on_step=on_step)
    assert len(done) == 12 and recs[3].num_running > 2
    for prev, cur in zip(recs[3:], recs[4:]):
        assert cur.num_running <= max(2, prev.num_running)


@pytest.mark.parametrize("cap", [1, 3])
def test_partial_prefill_cap(cap):
    eng, _ = make_engine(budget=512, threshold=64, partial=cap)
    recs, done = run(eng, prompts(10, lo=300, hi=600))
    assert len(done) == 10
    assert max(r.num_partial_prefills for r in recs) == cap


def test_mode_switch_mid_prompt_finishes_it_whole():
    eng, core = make_engine(budget=1024)
    eng.set_scheduler_config(eng.scheduler_config.with_changes(max_num_batched_tokens=256))

    def on_step(e, rec):
        if rec.step == 0:
            e.set_scheduler_config(e.scheduler_config.with_changes(mode="continuous"))
    eng.add_request("long", list(range(10, 710)), SamplingParams(max_tokens=4, ignore_eos=True))
    recs, done = run(eng, prompts(3, lo=30, hi=60), on_step=on_step)
    assert recs[0].num_partial_prefills == 1 and recs[0].num_prefill_tokens == 256
    assert recs[1].mode == "continuous" and recs[1].num_prefill_tokens == 444
    assert recs[1].num_prefill_reqs == 1
    assert all(not (r.num_prefill_tokens and r.num_decode_reqs) for r in recs[1:])
    assert "long" in done


def test_abort_frees_vllms_blocks():
    eng, core = make_engine()
    eng.add_request("a", list(range(10, 50)), SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    rec = eng.abort("a")
    assert rec.finish_reason == "abort" and rec.output_len == 1
    assert not eng.has_unfinished() and eng.kv.usage().used == 0
