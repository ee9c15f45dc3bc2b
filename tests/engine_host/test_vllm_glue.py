"""The vLLM glue on CPU, over a stand-in for vLLM 0.24's V1 scheduler.

``vllm_scheduler.py`` subclasses vLLM's Scheduler and ``VllmEngine`` drives an EngineCore; neither
is installed here, so stand-in modules provide a miniature V1 scheduler with vLLM's rules as
REFERENCE.md §2 and vllm/v1/core/sched/scheduler.py state them: running requests first in list
order (each catching up ``num_computed_tokens`` within the budget, ``long_prefill_token_threshold``
capping one request's chunk), preemption of the running tail by recompute when blocks run out,
then waiting requests FCFS while ``len(running) != max_num_running_reqs`` and nothing was
preempted, a prompt that does not fit stopping admission when chunking is off, the whole prompt
having to fit the free blocks (``scheduler_reserve_full_isl``). Its model is a deterministic
function of each request's tokens, so greedy outputs can be compared across schedules.

The real thing is checked on the H200 by test_vllm_gpu.py; these tests check the glue's own
logic: hiding requests, putting the running list back together, knobs, records, the host.
"""

from __future__ import annotations

import enum
import sys
import types
from collections import deque
from types import SimpleNamespace as NS

import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import EngineConfig, SchedulerConfig
from gpuchef.engine_host.request import SamplingParams

BS = 16


def cdiv(a, b):
    return -(-a // b)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Pause(enum.IntEnum):
    UNPAUSED = 0
    PAUSED_NEW = 1
    PAUSED_ALL = 2


class Req:
    def __init__(self, rid, prompt, max_tokens):
        self.request_id = rid
        self.prompt_token_ids = list(prompt)
        self.all_token_ids = list(prompt)
        self.output = []
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.status = Status.WAITING
        self.is_prefill_chunk = False
        self.blocks = 0

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def model_token(req):
    """The stand-in model: the next token depends only on the request's tokens so far."""
    return (sum(req.all_token_ids) * 31 + len(req.all_token_ids)) % 1000


class MiniV1Scheduler:
    """vLLM 0.24's V1 scheduling rules in miniature (see the module doc)."""

    def __init__(self, budget=512, max_seqs=8, num_blocks=400, v2_runner=False):
        self.max_num_scheduled_tokens = budget
        self.max_num_running_reqs = max_seqs
        self.scheduler_config = NS(enable_chunked_prefill=True, long_prefill_token_threshold=0)
        self.block_size = BS
        self.pool = NS(num_gpu_blocks=num_blocks, free=num_blocks - 1)
        self.pool.get_num_free_blocks = lambda: self.pool.free
        self.kv_cache_manager = NS(block_pool=self.pool, watermark_blocks=0)
        self.running, self.waiting, self.skipped_waiting = [], deque(), deque()
        self.requests = {}
        self._pause_state = Pause.UNPAUSED
        self.v2_runner = v2_runner
        self.log = []  # (num_scheduled_tokens, pre-step computed) of every step, for the tests

    def add_request(self, r):
        self.requests[r.request_id] = r
        self.waiting.append(r)

    def has_requests(self):
        return bool(self.running or self.waiting)

    def _alloc(self, r, n):
        need = cdiv(r.num_computed_tokens + n, BS) - r.blocks
        if need > self.pool.free:
            return False
        self.pool.free -= max(0, need)
        r.blocks += max(0, need)
        return True

    def _free(self, r):
        self.pool.free += r.blocks
        r.blocks = 0

    def schedule(self, throttle_prefills=False):
        cfg = self.scheduler_config
        budget = self.max_num_scheduled_tokens
        thr = cfg.long_prefill_token_threshold
        nst, pre, new, resumed, run_sched, preempted = {}, {}, [], [], [], []
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            n = r.num_tokens - r.num_computed_tokens
            if 0 < thr < n:
                n = thr
            n = min(n, budget)
            if n == 0:
                i += 1
                continue
            ok = True
            while not self._alloc(r, n):
                victim = self.running.pop()
                self._free(victim)
                victim.status, victim.num_computed_tokens = Status.PREEMPTED, 0
                self.waiting.appendleft(victim)
                preempted.append(victim)
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            pre[r.request_id], nst[r.request_id] = r.num_computed_tokens, n
            budget -= n
            run_sched.append(r)
            i += 1
        if not preempted and self._pause_state == Pause.UNPAUSED:
            while (self.skipped_waiting or self.waiting) and budget > 0:
                if len(self.running) == self.max_num_running_reqs:
                    break
                queue = self.skipped_waiting or self.waiting
                r = queue[0]
                n = r.num_tokens - r.num_computed_tokens
                if 0 < thr < n:
                    n = thr
                if not cfg.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                if cdiv(r.num_tokens, BS) > self.pool.free:
                    break
                assert self._alloc(r, n)
                queue.popleft()
                self.running.append(r)
                (resumed if r.status == Status.PREEMPTED else new).append(r)
                r.status = Status.RUNNING
                pre[r.request_id], nst[r.request_id] = r.num_computed_tokens, n
                budget -= n
        total = sum(nst.values())
        assert total <= self.max_num_scheduled_tokens
        assert len(self.running) <= self.max_num_running_reqs
        if self.v2_runner:
            new, resumed = new + resumed, []
        new_data = [NS(req_id=r.request_id, num_computed_tokens=pre[r.request_id],
                       prompt_token_ids=r.prompt_token_ids,
                       prefill_token_ids=list(r.all_token_ids) if self.v2_runner else None)
                    for r in new]
        cached = run_sched + resumed
        so = NS(scheduled_new_reqs=new_data,
                scheduled_cached_reqs=NS(
                    req_ids=[r.request_id for r in cached],
                    resumed_req_ids={r.request_id for r in resumed},
                    num_computed_tokens=[pre[r.request_id] for r in cached],
                    num_output_tokens=[len(r.output) for r in cached]),
                num_scheduled_tokens=nst, total_num_scheduled_tokens=total,
                preempted_req_ids={r.request_id for r in preempted})
        self.log.append((dict(nst), dict(pre), {r.request_id: r.num_tokens for r in
                                                run_sched + new + resumed}))
        for rid, n in nst.items():
            r = self.requests[rid]
            r.num_computed_tokens += n
            r.is_prefill_chunk = r.num_computed_tokens < r.num_tokens
        return so

    def update_from_output(self, so, model_output):
        outs = []
        for rid in so.num_scheduled_tokens:
            r = self.requests.get(rid)
            if r is None or r.status != Status.RUNNING or r.num_computed_tokens < r.num_tokens:
                continue  # finished, or a chunk that did not reach the end: nothing sampled
            tok = model_token(r)
            r.output.append(tok)
            r.all_token_ids.append(tok)
            done = len(r.output) >= r.max_tokens
            outs.append(NS(request_id=rid, new_token_ids=[tok],
                           finish_reason="length" if done else None))
            if done:
                self.running.remove(r)
                self._free(r)
                r.status = Status.FINISHED
                del self.requests[rid]
        return {0: NS(outputs=outs)}


class MiniCore:
    """EngineCore's surface that VllmEngine uses (``EngineCore.step`` without a batch queue)."""

    def __init__(self, sched):
        self.scheduler = sched
        self.batch_queue = None

    def step_fn(self):
        if not self.scheduler.has_requests():
            return {}, False
        so = self.scheduler.schedule()
        return self.scheduler.update_from_output(so, None), so.total_num_scheduled_tokens > 0

    def post_step(self, executed):
        pass

    def preprocess_add_request(self, req):
        return Req(req.request_id, req.prompt_token_ids, req.sampling_params.max_tokens), 0

    def add_request(self, req, wave=0):
        self.scheduler.add_request(req)

    def abort_requests(self, ids):
        s = self.scheduler
        for rid in ids:
            r = s.requests.pop(rid, None)
            if r is None:
                continue
            if r in s.running:
                s.running.remove(r)
            elif r in s.waiting:
                s.waiting.remove(r)
            s._free(r)
            r.status = Status.FINISHED


@pytest.fixture
def glue(monkeypatch):
    """vllm_scheduler imported over stand-in vLLM modules; removed again afterwards."""
    stubs = {
        "vllm": {}, "vllm.v1": {}, "vllm.v1.core": {}, "vllm.v1.core.sched": {},
        "vllm.v1.core.sched.scheduler": {"Scheduler": MiniV1Scheduler},
        "vllm.v1.core.sched.async_scheduler": {"AsyncScheduler": MiniV1Scheduler},
        "vllm.v1.core.sched.interface": {"PauseState": Pause},
        "vllm.v1.request": {"RequestStatus": Status},
        "vllm.v1.engine": {"EngineCoreRequest": lambda **kw: NS(**kw)},
        "vllm.sampling_params": {"SamplingParams": StubSamplingParams},
    }
    for name, attrs in stubs.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "gpuchef.engine_host.vllm_scheduler", raising=False)
    import gpuchef.engine_host.vllm_scheduler as vs
    yield vs
    sys.modules.pop("gpuchef.engine_host.vllm_scheduler", None)


class StubSamplingParams:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def update_from_generation_config(self, gen, eos):
        self.eos = eos


def make_engine(glue, *, mode="chunked", budget=512, max_seqs=8, threshold=0, partial=1,
                num_blocks=400, v2_runner=False):
    from gpuchef.engine_host.vllm_engine import VllmEngine, _VllmKV

    sched = glue.GpuchefScheduler(budget=budget, max_seqs=max_seqs, num_blocks=num_blocks,
                                  v2_runner=v2_runner)
    eng = VllmEngine.__new__(VllmEngine)
    eng.config = EngineConfig(engine="vllm", scheduler=SchedulerConfig(
        mode=mode, max_num_batched_tokens=budget, max_num_seqs=max_seqs,
        long_prefill_token_threshold=threshold, max_num_partial_prefills=partial))
    eng.model_config = NS(vocab_size=1000, eos_token_ids=(2,))
    eng.max_model_len = 4096
    eng.num_blocks = num_blocks - 1
    eng.kv = _VllmKV(sched.pool, BS)
    eng._attach(MiniCore(sched))
    return eng, sched


def prompts(n, lo=40, hi=700, seed=0):
    import random
    rnd = random.Random(seed)
    return [[rnd.randrange(3, 1000) for _ in range(rnd.randrange(lo, hi))] for _ in range(n)]


def run(eng, reqs, max_tokens=12, limit=10_000, on_step=None):
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
    assert not eng.has_unfinished()
    return recs, done


def test_chunked_default_is_vllms_own_schedule_and_records_match_it(glue):
    eng, sched = make_engine(glue, num_blocks=2000)  # no preemption: positions tell the phase
    reqs = prompts(12)
    recs, done = run(eng, reqs)
    assert len(done) == 12 and all(f.output_len == 12 for f in done.values())
    assert len(recs) == len(sched.log) and [r.step for r in recs] == list(range(len(recs)))
    plen = {f"r{i}": len(p) for i, p in enumerate(reqs)}
    for rec, (nst, pre, _) in zip(recs, sched.log):
        assert rec.num_tokens == sum(nst.values())  # vLLM's own per-step token count
        assert rec.num_decode_reqs == sum(1 for rid in nst if pre[rid] >= plen[rid])
        assert rec.num_prefill_tokens == sum(min(n, max(0, plen[rid] - pre[rid]))
                                             for rid, n in nst.items())
    # chunked prefill mixes decodes and chunks in one step (the waveform's point)
    assert any(r.num_prefill_tokens and r.num_decode_reqs for r in recs)
    # token times are the end of the step that produced each token
    ends = {r.t_end_ns for r in recs}
    assert all(set(f.token_times_ns) <= ends for f in done.values())


def test_continuous_never_mixes_and_never_splits_prompts(glue):
    eng, sched = make_engine(glue, mode="continuous")
    reqs = prompts(16, hi=500)  # all within the 512-token budget
    recs, done = run(eng, reqs)
    assert len(done) == 16
    for r in recs:
        assert not (r.num_prefill_tokens and r.num_decode_reqs), r
        assert r.mode == "continuous"
    # every prompt (all ≤ the budget) ran whole in one step
    starts = [nst for nst, pre, _ in sched.log]
    for i, p in enumerate(reqs):
        firsts = [s[f"r{i}"] for s, (_, pre, _) in zip(starts, sched.log)
                  if f"r{i}" in s and pre[f"r{i}"] == 0]
        assert firsts and firsts[0] == len(p)
    # the running list survived the hiding: every request finished with all its tokens
    assert sorted(done) == sorted(f"r{i}" for i in range(16))


def test_greedy_outputs_equal_under_both_modes_and_a_small_cache(glue):
    reqs = prompts(10, seed=3)
    outs = {}
    for mode in ("chunked", "continuous"):
        eng, _ = make_engine(glue, mode=mode)
        _, done = run(eng, reqs)
        outs[mode] = {k: v.output_token_ids for k, v in done.items()}
    # and with a KV cache small enough to preempt
    eng, _ = make_engine(glue, mode="chunked", num_blocks=90)
    recs, done = run(eng, reqs, limit=20_000)
    assert sum(r.num_preempted for r in recs) > 0
    assert sum(f.num_preemptions for f in done.values()) == sum(r.num_preempted for r in recs)
    outs["preempting"] = {k: v.output_token_ids for k, v in done.items()}
    assert outs["chunked"] == outs["continuous"] == outs["preempting"]


def test_continuous_with_preemption_keeps_prefill_and_decode_apart(glue):
    eng, _ = make_engine(glue, mode="continuous", num_blocks=90)
    recs, done = run(eng, prompts(10, seed=3), limit=20_000)
    assert len(done) == 10
    assert all(not (r.num_prefill_tokens and r.num_decode_reqs) for r in recs)


def test_v2_model_runner_outputs_map_the_same(glue):
    reqs = prompts(8, seed=5)
    eng1, _ = make_engine(glue, num_blocks=90)
    recs1, _ = run(eng1, reqs, limit=20_000)
    eng2, _ = make_engine(glue, num_blocks=90, v2_runner=True)
    recs2, _ = run(eng2, reqs, limit=20_000)
    key = [(r.num_prefill_tokens, r.num_decode_reqs, r.num_preempted) for r in recs1]
    assert key == [(r.num_prefill_tokens, r.num_decode_reqs, r.num_preempted) for r in recs2]


def test_knob_change_shows_in_the_next_record(glue):
    eng, sched = make_engine(glue, budget=512)
    seen = []

    def on_step(e, rec):
        seen.append(rec)
        if rec.step == 2:
            e.set_scheduler_config(e.scheduler_config.with_changes(
                max_num_batched_tokens=128, long_prefill_token_threshold=64, max_num_seqs=4))
    recs, _ = run(eng, prompts(12), on_step=on_step)
    assert recs[2].max_num_batched_tokens == 512
    after = recs[3:]
    assert all(r.max_num_batched_tokens == 128 and r.long_prefill_token_threshold == 64
               for r in after)
    assert all(r.num_tokens <= 128 for r in after)
    assert sched.scheduler_config.long_prefill_token_threshold == 64
    assert sched.max_num_scheduled_tokens == 128
    # above the start-up values: refused, nothing changes
    with pytest.raises(ConfigError, match="cannot be set live on vLLM"):
        eng.set_scheduler_config(eng.scheduler_config.with_changes(max_num_batched_tokens=1024))
    assert eng.scheduler_config.max_num_batched_tokens == 128


def test_max_num_seqs_lowered_below_the_running_count_drains(glue):
    eng, sched = make_engine(glue, max_seqs=8)

    def on_step(e, rec):
        if rec.step == 3:
            e.set_scheduler_config(e.scheduler_config.with_changes(max_num_seqs=2))
    recs, done = run(eng, prompts(12, lo=20, hi=60), on_step=on_step)
    assert len(done) == 12
    assert recs[3].num_running > 2
    # no admission while above the new cap (vLLM would assert): the running set drains to 2
    for prev, cur in zip(recs[3:], recs[4:]):
        assert cur.num_running <= max(2, prev.num_running)
    assert max(r.num_running for r in recs[4:] if r.step > recs[3].step + 12) <= 2


def test_partial_prefill_cap_under_a_threshold(glue):
    for cap in (1, 3):
        eng, _ = make_engine(glue, budget=512, threshold=64, partial=cap)
        recs, done = run(eng, prompts(10, lo=300, hi=600))
        assert len(done) == 10
        assert max(r.num_partial_prefills for r in recs) <= cap
        if cap > 1:
            assert max(r.num_partial_prefills for r in recs) > 1


def test_mode_switch_mid_prompt_finishes_it_whole(glue):
    eng, sched = make_engine(glue, budget=1024)  # vLLM's buffers: 1024 tokens a step
    eng.set_scheduler_config(eng.scheduler_config.with_changes(max_num_batched_tokens=256))

    def on_step(e, rec):
        if rec.step == 0:  # a 700-token prompt is now mid-prefill (256 done)
            e.set_scheduler_config(e.scheduler_config.with_changes(mode="continuous"))
    eng.add_request("long", list(range(3, 703)), SamplingParams(max_tokens=4, ignore_eos=True))
    recs, done = run(eng, prompts(3, lo=30, hi=60), on_step=on_step)
    assert recs[0].mode == "chunked" and recs[0].num_partial_prefills == 1
    # continuous: the remainder (444 > the 256 budget) runs whole, alone, in the next step
    assert recs[1].mode == "continuous" and recs[1].num_prefill_tokens == 444
    assert recs[1].num_prefill_reqs == 1 and recs[1].num_decode_reqs == 0
    assert all(not (r.num_prefill_tokens and r.num_decode_reqs) for r in recs[1:])
    assert "long" in done
    assert all(r.max_num_batched_tokens == 256 for r in recs)


def test_continuous_prompt_longer_than_vllms_buffers_is_chunked_alone(glue):
    eng, sched = make_engine(glue, mode="continuous", budget=256)
    eng.add_request("long", list(range(3, 703)), SamplingParams(max_tokens=2, ignore_eos=True))
    recs, done = run(eng, prompts(3, lo=30, hi=60))
    # two 256-token chunks alone, then the 188-token rest with whole prompts that fit beside it
    assert [r.num_prefill_tokens for r in recs[:2]] == [256, 256]
    assert all(r.num_prefill_reqs == 1 and r.num_decode_reqs == 0 for r in recs[:2])
    nst, pre, _ = sched.log[2]
    assert nst["long"] == 188 and all(pre[k] == 0 for k in nst if k != "long")
    assert recs[2].num_decode_reqs == 0
    assert len(done) == 4


def test_abort_and_bad_requests(glue):
    eng, sched = make_engine(glue)
    eng.add_request("a", [5] * 30, SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    rec = eng.abort("a")
    assert rec.finish_reason == "abort" and rec.output_len == 1
    assert eng.abort("a") is None and not eng.has_unfinished()
    assert sched.pool.free == sched.pool.num_gpu_blocks - 1
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        eng.add_request("b", [5, 1000], None)
    with pytest.raises(ConfigError, match="prompt is empty"):
        eng.add_request("b", [], None)
    eng.add_request("b", [5], None)
    with pytest.raises(ConfigError, match="already in the engine"):
        eng.add_request("b", [5], None)


def test_engine_host_drives_the_vllm_engine(glue):
    from gpuchef.engine_host.host import EngineHost
    from gpuchef.engine_host.sinks import ListenerSink

    eng, _ = make_engine(glue, mode="continuous")
    steps, reqs, events = [], [], []
    host = EngineHost(eng, sinks=[ListenerSink(on_step=steps.append, on_request=reqs.append,
                                             on_event=events.append)])
    specs = [NS(request_id=f"w{i}", arrival_s=0.0, prompt_token_ids=p, output_len=5)
             for i, p in enumerate(prompts(6, lo=20, hi=80))]
    host.set_workload(specs)
    # a knob above vLLM's start-up budget is refused in the caller's thread
    with pytest.raises(ConfigError, match="cannot be set live on vLLM"):
        host.set_knob("max_num_batched_tokens", 4096)
    host.set_knob("mode", "chunked")  # applied before the first step
    host.start()
    assert host.wait_done(30)
    host.stop()
    assert host.error is None
    assert len(reqs) == 6 and all(r.output_len == 5 for r in reqs)
    assert any(e.kind == "mode" for e in events)
    assert [s.step for s in steps] == list(range(len(steps)))
    assert all(s.t_start_ns <= s.t_end_ns for s in steps)
    assert all(a.t_end_ns <= b.t_start_ns for a, b in zip(steps, steps[1:]))
    assert all(s.gpu_ms >= 0 for s in steps) and steps[0].mode == "chunked"


def test_tensor_parallel_workers_are_spawned_unless_the_user_chose():
    from gpuchef.engine_host.vllm_env import use_spawn_for_workers

    env: dict[str, str] = {}
    assert use_spawn_for_workers(env) is True and env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    env = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    assert use_spawn_for_workers(env) is False and env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_vllm_engine_streams_its_tokens_as_step_outputs(glue):
    """The hosted-vLLM engine hands each step's tokens over as the native one does (the front
    door streams from them): every token of each record, at the record's times, first tokens
    with arrival and prompt length, each finished record in the output of its last token."""
    eng, _ = make_engine(glue, mode="chunked", num_blocks=90)  # small: preemption too
    reqs = prompts(8, seed=5)
    for i, p in enumerate(reqs):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=9, ignore_eos=True))
    outs, done = [], {}
    while eng.has_unfinished():
        res = eng.step()
        if res.output is not None:
            outs.append(res.output)
        for f in res.finished:
            done[f.request_id] = f
    assert len(done) == 8
    for rid, r in done.items():
        toks = [(o.t_ns, t) for o in outs for q, t in o.tokens if q == rid]
        assert [t for _, t in toks] == list(r.output_token_ids)
        assert [ts for ts, _ in toks] == list(r.token_times_ns)
        assert [f for o in outs for f in o.first_tokens if f[0] == rid] == \
            [(rid, r.arrival_ns, r.prompt_len)]
        assert [o for o in outs if r in o.finished]


def test_vllm_engine_implements_the_contract(glue):
    from gpuchef.engine_host.contract import Engine

    import torch

    from gpuchef.engine_host.vllm_engine import _BackendName

    eng, _ = make_engine(glue)
    # what __init__ sets from the vLLM config (make_engine builds the engine without vLLM)
    eng.vllm_version, eng.tensor_parallel_size, eng.async_scheduling = "0.24.0", 1, False
    eng.device, eng.dtype, eng.loaded = torch.device("cpu"), torch.bfloat16, NS(name="x")
    eng.attn = _BackendName("vllm (flash_attn)")
    assert isinstance(eng, Engine)
    assert eng.engine_name == "vLLM 0.24.0" and eng.attn.name.startswith("vllm")
    assert not eng.has_step_in_flight and eng.drain().record is None
