"""Piecewise CUDA graphs (steps with prefill tokens, runner.CudaGraphPiecewise) on CUDA with
FlashInfer (run on the GPU machine with `pytest -m gpu`): a step replayed through the pieces
against the same step run eagerly (logits within bfloat16 tolerance), greedy tokens equal to the
eager engine's over mixed steps, chunking, preemption and async scheduling, steps above the
largest capture size falling back to eager, and the start-up report of the capture sizes."""

from __future__ import annotations

import pytest
import torch

from gpuchef.engine_host import ops
from gpuchef.engine_host.vocab.config import (PIECEWISE_CAPTURE_SIZES, CacheConfig, EngineConfig,
                                              SchedulerConfig)
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.request import SamplingParams

pytestmark = pytest.mark.gpu

#: small capture sizes, so that the test load has steps above the cap (130- and 300-token
#: prompts, a 512-token budget) as well as padded ones below it
SIZES = (16, 48, 128)


@pytest.fixture(autouse=True)
def _flashinfer():
    pytest.importorskip("flashinfer")
    prev = ops.rope_append_mode()
    yield
    ops.use_flashinfer_ops(False)
    ops.use_strided_qk(False)
    ops.set_rope_append(prev)


def engine(eager=False, mode="chunked", blocks=512, max_model_len=2048, async_scheduling=False,
           cudagraph_mode="FULL_AND_PIECEWISE", sizes=SIZES, progress=None,
           decode_attention="auto"):
    return LLMEngine(EngineConfig(
        model="tiny", device="cuda", dtype="bfloat16", attention_backend="flashinfer",
        enforce_eager=eager, max_model_len=max_model_len, async_scheduling=async_scheduling,
        cudagraph_mode=cudagraph_mode, cudagraph_capture_sizes=sizes,
        decode_attention=decode_attention, cache=CacheConfig(num_gpu_blocks=blocks),
        scheduler=SchedulerConfig(mode=mode, max_num_batched_tokens=512)), progress=progress)


PROMPTS = [[11 + (i * 37 + j * 11) % 4000 for j in range(n)] for i, n in
           enumerate([5, 130, 17, 64, 1, 300, 33, 16, 40, 7, 90, 23])]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def greedy_run(eng, prompts=PROMPTS, n_out=24, every=3):
    """One request arrives every ``every`` step() calls (so chunked steps mix a new prompt with
    the decodes of the earlier ones; on the CPU the same load gives 10 steps with prefill tokens
    within 128 tokens, 9 of them mixed, and 2 above, in sync and async alike); greedy to the
    forced length. Returns (tokens by request id, step records)."""
    todo = list(enumerate(prompts))
    outs, recs, k = {}, [], 0
    while todo or eng.has_unfinished():
        if todo and k % every == 0:
            i, p = todo.pop(0)
            eng.add_request(f"r{i}", p, SamplingParams(max_tokens=n_out + i % 5, ignore_eos=True))
        k += 1
        res = eng.step()
        if res.record:
            recs.append(res.record)
        for f in res.finished:
            outs[f.request_id] = f.output_token_ids
    return outs, recs


def check_labels(recs, cap=SIZES[-1]):
    """Every step of ≤ cap tokens with prefill tokens ran graphed (and is labelled so), every
    step above the cap ran eagerly; returns the number of graphed steps with prefill tokens."""
    with_prefill = [r for r in recs if r.num_prefill_tokens]
    assert any(r.num_tokens > cap for r in with_prefill), "the load should exceed the cap"
    for r in with_prefill:
        assert r.cuda_graph == (r.num_tokens <= cap), (r.num_tokens, r.cuda_graph)
    return sum(r.cuda_graph for r in with_prefill)


def prefill_steps(eng, pw, max_steps):
    """Schedule up to ``max_steps`` steps with prefill tokens by hand, yielding each step's
    (SchedulerOutput, prepared batch in the pieces' static buffers) and then booking it as the
    engine would (the scheduler's advance, a dummy token for each request that finished its
    prompt); stops at the first step without prefill tokens."""
    for _ in range(max_steps):
        out = eng.scheduler.schedule()
        if not out.prefills:
            return
        yield out, eng.runner.prepare(out, into=(pw.input_ids, pw.positions))
        eng.scheduler.advance(out, 0, 0)  # the scheduler's own booking of the step
        for r in out.decodes + [r for r, _ in out.prefills]:
            if r.num_computed_tokens == r.num_tokens:
                r.output_token_ids.append(20)


def test_piecewise_step_logits_match_eager():
    """Each of the first steps (prefill chunks, then decode rows + chunks), run eagerly and then
    through the replayed pieces on the same KV state: logits within bfloat16 tolerance, the same
    greedy token on nearly every row."""
    eng = engine(sizes=(16, 48, 512))
    pw = eng.runner.piecewise
    assert pw is not None and pw.graphed and set(pw.graphs) == {16, 48, 512}
    for i, p in enumerate(PROMPTS[:6]):  # 517 tokens: a step of 512, then 5 decodes + 5
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=8, ignore_eos=True))
    model, attn, kv = eng.runner.model, eng.attn, eng.kv.kv_caches
    checked = 0
    with torch.inference_mode():
        for out, batch in prefill_steps(eng, pw, 4):
            T = batch.meta.num_tokens
            attn.begin_step(batch.meta)
            want = model.compute_logits(model(batch.input_ids, batch.meta.positions, kv, attn))
            attn.begin_step(batch.meta)  # the same K/V again into the same slots, then attend
            got = model.compute_logits(pw.forward(model, attn, kv, T))
            assert got.shape == want.shape == (T, model.config.vocab_size)
            assert torch.isfinite(got).all()
            assert rel_err(got, want) <= 2e-2
            assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
            checked += 1
    assert checked >= 2


def logits_agree_per_step(attr: str, ref: str, other: str) -> int:
    """Six steps with prefill tokens of a fresh engine, each run through the piecewise graphs
    twice on the same KV state with the attention backend's ``attr`` set to ``ref`` then
    ``other``: logits within bfloat16 tolerance, the same greedy token on nearly every row.
    Returns how many of the steps were mixed (decode rows + chunks)."""
    eng = engine(sizes=(16, 48, 512))
    pw, model, attn, kv = eng.runner.piecewise, eng.runner.model, eng.attn, eng.kv.kv_caches
    for i, p in enumerate(PROMPTS[:6]):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=8, ignore_eos=True))
    mixed, before = 0, getattr(attn, attr)
    with torch.inference_mode():
        for out, batch in prefill_steps(eng, pw, 6):
            T = batch.meta.num_tokens
            logits = {}
            for value in (ref, other):
                setattr(attn, attr, value)
                attn.begin_step(batch.meta)
                logits[value] = model.compute_logits(pw.forward(model, attn, kv, T)).clone()
            setattr(attn, attr, before)
            want, got = logits[ref], logits[other]
            assert torch.isfinite(got).all()
            assert rel_err(got, want) <= 2e-2
            assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
            mixed += bool(out.decodes)
    return mixed


def test_single_mixed_attention_logits_match_split():
    """Mixed steps (decode rows + chunks) attended by one prefill plan over all rows
    (``mixed_attention="single"``) against the two-wrapper split, each through the piecewise
    graphs on the same KV state: logits within bfloat16 tolerance, the same greedy token on
    nearly every row; then a whole greedy run with "single" finishes every request."""
    assert logits_agree_per_step("mixed_attention", "split", "single") >= 1
    eng2 = engine()
    eng2.attn.mixed_attention = "single"
    got, recs = greedy_run(eng2)
    assert sorted(got) == sorted(f"r{i}" for i in range(len(PROMPTS)))
    assert all(len(t) == 24 + int(r[1:]) % 5 for r, t in got.items())
    assert sum(r.kind == "mixed" for r in recs) >= 6


def test_xqa_decode_logits_match_flashinfer_and_its_graphs_run():
    """Decode rows attended by XQA (``decode_attention="xqa"``) against FlashInfer's decode
    wrapper on the same KV state, through the piecewise graphs: logits within bfloat16
    tolerance, the same greedy token on nearly every row; then an engine built with XQA (its
    decode graphs read XQA's fixed page tables) finishes a greedy run, async equal to sync."""
    assert logits_agree_per_step("decode_attention", "flashinfer", "xqa") >= 1
    x_sync = engine(decode_attention="xqa")
    assert x_sync.decode_attention == "xqa"
    got, recs = greedy_run(x_sync)
    assert sorted(got) == sorted(f"r{i}" for i in range(len(PROMPTS)))
    assert all(len(t) == 24 + int(r[1:]) % 5 for r, t in got.items())
    assert any(r.kind == "decode_only" and r.cuda_graph for r in recs)
    got_async, _ = greedy_run(engine(decode_attention="xqa", async_scheduling=True))
    assert got_async == got


@pytest.mark.parametrize("layout", ["copied-qk", "strided-qk", "fused-rope-append",
                                    "fused-except-piecewise"])
def test_piecewise_greedy_equals_eager(layout):
    """Chunked steps (decode rows + prefill chunks) through piecewise graphs: the eager engine's
    greedy tokens; steps above the largest size ran eagerly. With RoPE fused into the append,
    also the separate kernels' tokens (the same float32 RoPE arithmetic)."""
    ops.use_strided_qk(layout == "strided-qk")
    ops.set_rope_append({"fused-rope-append": "fused", "fused-except-piecewise":
                         "fused-except-piecewise"}.get(layout, "separate"))
    eager, recs0 = greedy_run(engine(eager=True))
    got, recs = greedy_run(engine())
    assert not any(r.cuda_graph for r in recs0)
    assert check_labels(recs) >= 8
    assert sum(r.kind == "mixed" and r.cuda_graph for r in recs) >= 6
    assert got == eager
    if layout.startswith("fused"):  # the same tokens as the separate kernels
        ops.set_rope_append("separate")
        separate, _ = greedy_run(engine())
        assert got == separate


@pytest.mark.parametrize("mode", ["chunked", "continuous"])
def test_piecewise_async_equals_sync(mode):
    """Async scheduling over piecewise graphs (decode inputs gathered on the device into the
    pieces' static input buffer): the sync tokens, and the eager engine's."""
    sync, recs_s = greedy_run(engine(mode=mode))
    eng = engine(mode=mode, async_scheduling=True)
    got, recs_a = greedy_run(eng)
    eager, _ = greedy_run(engine(eager=True, mode=mode))
    assert got == sync == eager
    assert check_labels(recs_a) == check_labels(recs_s) >= 8
    assert eng.kv.pool.num_free == 512


@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
def test_piecewise_with_preemption_and_mode_switch(async_on):
    """A pool too small for the load (preemption, recompute through the pieces) and a switch from
    continuous to chunked: the eager engine's tokens, every page back."""
    def run(eng):
        for i, p in enumerate(PROMPTS * 2):
            eng.add_request(f"r{i}", p, SamplingParams(max_tokens=30 + i, ignore_eos=True))
        done, recs, k = {}, [], 0
        while eng.has_unfinished():
            if k == 30:
                eng.set_scheduler_config(eng.scheduler_config.with_changes(mode="chunked"))
            res = eng.step()
            if res.record:
                recs.append(res.record)
            for f in res.finished:
                done[f.request_id] = f.output_token_ids
            k += 1
        assert eng.kv.pool.num_free == 40
        return done, recs

    want, _ = run(engine(eager=True, blocks=40, mode="continuous", max_model_len=400))
    got, recs = run(engine(blocks=40, mode="continuous", max_model_len=400,
                           async_scheduling=async_on))
    assert sum(r.num_preempted for r in recs) > 0
    assert any(r.cuda_graph and r.num_prefill_tokens for r in recs)
    assert {k: len(v) for k, v in got.items()} == {f"r{i}": 30 + i
                                                  for i in range(2 * len(PROMPTS))}
    if not async_on:  # async falls back to sync around preemption, but batches may differ
        assert got == want


def test_full_decode_only_keeps_prefill_steps_eager():
    eng = engine(cudagraph_mode="FULL_DECODE_ONLY")
    assert eng.runner.piecewise is None and eng.runner.graphs is not None
    got, recs = greedy_run(eng)
    assert not any(r.cuda_graph for r in recs if r.num_prefill_tokens)
    assert any(r.cuda_graph for r in recs if not r.num_prefill_tokens)
    eager, _ = greedy_run(engine(eager=True))
    assert got == eager


def test_capture_sizes_reported_at_start_up():
    """The default sizes are captured, and the start-up progress names them."""
    stages = []
    eng = engine(sizes=None, progress=lambda stage, done, total: stages.append((stage, done,
                                                                               total)))
    assert eng.runner.piecewise.sizes == PIECEWISE_CAPTURE_SIZES
    pw_stages = [s for s in stages if s[0].startswith("capture piecewise CUDA graphs")]
    assert pw_stages and pw_stages[-1][1] == pw_stages[-1][2] == len(PIECEWISE_CAPTURE_SIZES)
    assert ",".join(map(str, PIECEWISE_CAPTURE_SIZES)) in pw_stages[-1][0]
    pw = eng.runner.piecewise
    assert pw.capture_s > 0 and pw.capture_bytes >= 0
    assert all(len(pw.graphs[n]) == eng.model_config.num_hidden_layers + 1 for n in pw.sizes)


def test_enforce_eager_captures_nothing():
    eng = engine(eager=True)
    assert eng.runner.piecewise is None and eng.runner.graphs is None
