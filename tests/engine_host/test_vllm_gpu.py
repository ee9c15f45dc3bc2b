"""The vLLM host on the GPU machine, against vLLM 0.24.0 itself (see docs/vllm.md to install it).

Run there with: python -m pytest -q -m gpu tests/engine_host/test_vllm_gpu.py

One engine for the module: the ``tiny`` preset in float32 (vLLM's dummy weights are uniform in
±1e-3, so bf16 logits tie and greedy choices would depend on batch shapes), eager, and a KV cache
small enough (256 blocks of 16 tokens) that a burst of requests preempts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]
vllm = pytest.importorskip("vllm")

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.request import SamplingParams  # noqa: E402

BUDGET, SEQS = 512, 32


@pytest.fixture(scope="module")
def eng():
    from gpuchef.engine_host.vllm_engine import VllmEngine

    e = VllmEngine(EngineConfig(
        engine="vllm", model="tiny", dtype="float32", enforce_eager=True, max_model_len=2048,
        cache=CacheConfig(num_gpu_blocks=256, gpu_memory_utilization=0.3),
        scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=SEQS)))
    yield e
    e.close()


@pytest.fixture
def spy(eng):
    """Every non-empty SchedulerOutput, as vLLM counts it (vllm/v1/utils.py
    compute_iteration_details: context = new or no output yet)."""
    from vllm.v1.utils import compute_iteration_details

    seen, ever_preempted = [], set()
    real = eng.on_scheduled

    def on_scheduled(sched, so, t0, knobs):
        ever_preempted.update(so.preempted_req_ids or ())
        if so.total_num_scheduled_tokens:
            # vLLM counts a recompute after a preemption as generation once the request has
            # outputs; gpuchef counts it as prefill: compare only steps without such requests
            recompute = bool(so.preempted_req_ids) or any(
                rid in ever_preempted for rid in so.num_scheduled_tokens)
            seen.append((so.total_num_scheduled_tokens, compute_iteration_details(so), recompute))
        real(sched, so, t0, knobs)
    eng.on_scheduled = on_scheduled
    yield seen
    del eng.on_scheduled


def prompts(n, lo, hi, seed):
    import random
    rnd = random.Random(seed)
    return [[rnd.randrange(10, 4000) for _ in range(rnd.randrange(lo, hi))] for _ in range(n)]


def drive(eng, reqs, *, max_tokens=16, mode="chunked", prefix="r", on_step=None, **knobs):
    eng.set_scheduler_config(SchedulerConfig(mode=mode, max_num_batched_tokens=BUDGET,
                                             max_num_seqs=SEQS).with_changes(**knobs))
    for i, p in enumerate(reqs):
        eng.add_request(f"{prefix}{i}", p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    recs, done = [], {}
    deadline = time.monotonic() + 300
    while eng.has_unfinished():
        assert time.monotonic() < deadline, "the vLLM engine did not finish"
        res = eng.step()
        if res.record is not None:
            recs.append(res.record)
            if on_step is not None:
                on_step(res.record)
        for f in res.finished:
            done[f.request_id] = f
    return recs, done


def test_records_match_vllms_own_token_counts(eng, spy):
    recs, done = drive(eng, prompts(24, 20, 300, 1), prefix="m")
    assert len(done) == 24 and all(f.output_len == 16 for f in done.values())
    assert len(recs) == len(spy)
    compared = 0
    for rec, (total, it, recompute) in zip(recs, spy):
        assert rec.num_tokens == total
        if not recompute:
            assert (rec.num_prefill_tokens, rec.num_decode_reqs) == (it.num_ctx_tokens,
                                                                     it.num_generation_tokens)
            assert rec.num_prefill_reqs == it.num_ctx_requests
            compared += 1
    assert compared >= len(recs) // 2
    assert any(r.num_prefill_tokens and r.num_decode_reqs for r in recs)  # chunked mixes
    # gpu_ms is the step's span on the GPU stream; with async scheduling it starts when the
    # previous step's GPU work ends, before the host has processed that step's output (where the
    # record's wall span starts), so one step's gpu_ms may exceed its own wall_ms. The spans are
    # back to back on one stream, so together they fit in the wall time of the whole run.
    assert all(r.gpu_ms > 0 for r in recs)
    span_ms = (recs[-1].t_end_ns - recs[0].t_start_ns) / 1e6
    assert sum(r.gpu_ms for r in recs) <= span_ms + 2.0
    assert all(r.gpu_ms <= r.wall_ms + p.wall_ms + 2.0 for p, r in zip(recs, recs[1:]))
    assert all(0 <= r.kv_blocks_used <= r.kv_blocks_total == eng.num_blocks for r in recs)


def test_knob_change_shows_in_the_next_record(eng):
    first, changed_at = eng.step_id, []

    def on_step(rec):
        if rec.step >= 3 + first and not changed_at:
            changed_at.append(eng.step_id)  # the first step scheduled under the change
            eng.set_scheduler_config(eng.scheduler_config.with_changes(
                max_num_batched_tokens=128, long_prefill_token_threshold=64))
    recs, _ = drive(eng, prompts(16, 200, 800, 2), prefix="k", on_step=on_step)
    after = [r for r in recs if r.step >= changed_at[0]]
    before = [r for r in recs if r.step < changed_at[0]]
    assert after and all(r.max_num_batched_tokens == 128 for r in after)
    assert all(r.max_num_batched_tokens == BUDGET for r in before)
    assert all(r.num_tokens <= 128 for r in after)
    assert max(r.num_prefill_tokens for r in after) <= 128
    with pytest.raises(ConfigError, match="cannot be set live on vLLM"):
        eng.set_scheduler_config(eng.scheduler_config.with_changes(max_num_batched_tokens=4096))


def test_continuous_never_mixes_prefill_and_decode(eng):
    recs, done = drive(eng, prompts(24, 20, 500, 3), mode="continuous", prefix="c")
    assert len(done) == 24
    assert recs and all(r.mode == "continuous" for r in recs)
    assert all(not (r.num_prefill_tokens and r.num_decode_reqs) for r in recs)
    assert any(r.num_prefill_reqs > 1 for r in recs)  # whole prompts batched together


def test_greedy_outputs_identical_under_both_modes(eng):
    reqs = prompts(6, 30, 400, 4)
    outs = {}
    for mode in ("chunked", "continuous"):
        _, done = drive(eng, reqs, mode=mode, prefix=f"g{mode}-", max_tokens=24)
        outs[mode] = [done[f"g{mode}-{i}"].output_token_ids for i in range(len(reqs))]
    assert outs["chunked"] == outs["continuous"]


def test_preemption_by_recompute_is_recorded(eng):
    # 256 blocks of 16 tokens; 32 requests of ~600 tokens + 200 outputs cannot all fit
    recs, done = drive(eng, prompts(32, 500, 700, 5), prefix="p", max_tokens=200)
    assert len(done) == 32
    n = sum(r.num_preempted for r in recs)
    assert n > 0 and n == sum(f.num_preemptions for f in done.values())


def test_max_num_partial_prefills_caps_prompts_left_mid_prefill(eng):
    recs, done = drive(eng, prompts(16, 300, 900, 6), prefix="pp",
                       long_prefill_token_threshold=64, max_num_partial_prefills=2)
    assert len(done) == 16
    assert max(r.num_partial_prefills for r in recs) <= 2


def test_engine_host_thread_drives_vllm(eng):
    from types import SimpleNamespace as NS

    from gpuchef.engine_host.host import EngineHost
    from gpuchef.engine_host.sinks import ListenerSink

    eng.set_scheduler_config(SchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=SEQS))
    steps, reqs, events = [], [], []
    host = EngineHost(eng, sinks=[ListenerSink(on_step=steps.append, on_request=reqs.append,
                                             on_event=events.append)])
    specs = [NS(request_id=f"h{i}", arrival_s=0.05 * i, prompt_token_ids=p, output_len=32)
             for i, p in enumerate(prompts(20, 50, 600, 7))]
    host.set_workload(specs)
    host.start()  # steps on its own thread: vLLM's stream must follow (VllmEngine._bind_thread)
    with pytest.raises(ConfigError, match="cannot be set live on vLLM"):
        host.set_knob("max_num_seqs", 4 * SEQS)
    time.sleep(0.3)
    host.set_mode("continuous")
    assert host.wait_done(120)
    host.stop()
    assert host.error is None
    assert len(reqs) == 20 and all(r.output_len == 32 for r in reqs)
    assert [s.step for s in steps] == sorted(s.step for s in steps)
    assert any(e.kind == "mode" for e in events)
    switch = next(e.step for e in events if e.kind == "mode")
    assert all(not (s.num_prefill_tokens and s.num_decode_reqs) for s in steps if s.step >= switch)


def test_bench_cli_runs_on_vllm(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "gpuchef", "bench", "--engine", "vllm", "--model", "tiny",
         "--enforce-eager", "--gpu-memory-utilization", "0.3", "--dataset", "azure-conv",
         "--num-prompts", "40", "--max-input-len", "1024", "--max-output-len", "32",
         "--trace-speed", "inf", "--max-num-batched-tokens", "1024", "--max-num-seqs", "64",
         "--result-json", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Successful requests:" in r.stdout and "vllm 0.24" in r.stdout
    import json
    d = json.loads(out.read_text())
    assert d["completed"] == 40 and d["engine"] == "vllm"
