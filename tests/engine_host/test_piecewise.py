"""The forward split at attention (piecewise CUDA graphs, runner.CudaGraphPiecewise) on the CPU.

The pieces run eagerly on the static buffers a capture records, padded to a captured size, with
garbage (NaN, out-of-place token ids and positions) in the padding rows. Checked against: the
monolithic forward (bit-identical logits and KV cache in float32), Hugging Face transformers'
logits (independent), and, through the engine, the monolithic engine's greedy tokens with
chunking, decode rows, preemption and async scheduling. The CUDA capture itself is tested on the
GPU (test_piecewise_gpu.py).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from gpuchef.engine_host.attention import AttentionMetadata, ReferenceAttention
from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig, SchedulerConfig
from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.loader import load_model
from gpuchef.engine_host.request import SamplingParams
from gpuchef.engine_host.runner import CudaGraphPiecewise
from paged_meta_ref import build_meta as _build_meta

BS = 4
NB = 96


def meta_for(reqs, device="cpu") -> AttentionMetadata:
    return _build_meta(reqs, BS, device)


def pages_for(num_reqs: int, per_req: int, seed: int = 0) -> list[list[int]]:
    ids = list(range(NB))
    random.Random(seed).shuffle(ids)  # scattered, out of order
    return [ids[i * per_req:(i + 1) * per_req] for i in range(num_reqs)]


def empty_kv(cfg) -> list[torch.Tensor]:
    return [torch.zeros(NB, 2, BS, cfg.num_key_value_heads, cfg.head_dim)
            for _ in range(cfg.num_hidden_layers)]


def monolithic(model, kv, reqs, tokens):
    meta = meta_for(reqs)
    attn = ReferenceAttention()
    attn.begin_step(meta)
    ids = torch.tensor([t for ts in tokens for t in ts], dtype=torch.int64)
    return model.compute_logits(model(ids, meta.positions, kv, attn))


def piecewise(pw, model, kv, reqs, tokens, garbage_seed=0):
    """The step through ``pw``'s pieces, its inputs copied into the static buffers as
    ``CudaGraphPiecewise.launch`` does; every buffer row past the step's holds garbage first."""
    meta = meta_for(reqs)
    ids = [t for ts in tokens for t in ts]
    T = len(ids)
    g = torch.Generator().manual_seed(garbage_seed)
    N = pw.max_num_tokens
    vocab, maxpos = model.config.vocab_size, model.config.max_position_embeddings
    pw.input_ids.copy_(torch.randint(0, vocab, (N,), generator=g))
    pw.positions.copy_(torch.randint(0, maxpos, (N,), generator=g))
    for buf in (pw.q, pw.k, pw.v, pw.residual, pw.attn_out, pw.hidden):
        buf.fill_(float("nan"))
    pw.input_ids[:T] = torch.tensor(ids)
    pw.positions[:T] = meta.positions
    attn = ReferenceAttention()
    attn.begin_step(meta)
    hidden = pw.forward(model, attn, kv, T)
    assert hidden.shape == (T, model.config.hidden_size)
    return model.compute_logits(hidden)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype=torch.float32, device="cpu", seed=3).model


def two_steps(model, run, kv):
    """A prefill step (three prompts, one chunked), then a mixed step: two decode rows and two
    prefill chunks, one of them continuing a prompt over earlier KV. Returns both logits."""
    g = torch.Generator().manual_seed(11)
    V = model.config.vocab_size
    a, b, c, d = (torch.randint(0, V, (n,), generator=g).tolist() for n in (9, 14, 21, 13))
    pa, pb, pc, pd = pages_for(4, 10, seed=5)
    first = run(model, kv, [(pa, 0, 9), (pb, 0, 14), (pc, 0, 8)], [a, b, c[:8]])
    second = run(model, kv, [(pa, 9, 1), (pb, 14, 1), (pc, 8, 13), (pd, 0, 13)],
                 [[5], [77], c[8:], d])
    return first, second


@pytest.mark.parametrize("sizes", [(31, 64), (32, 48), (512,)], ids=str)
def test_pieces_equal_monolithic_forward_bit_for_bit(tiny, sizes):
    """Steps of 31 and 28 tokens padded to 31/32/48/64/512 rows with NaN and random ids in the
    padding: logits of every real row and the whole KV cache are bit-identical to the
    monolithic forward's (float32, CPU; every op is row-wise and attention sees only the real
    rows)."""
    ref_kv, got_kv = empty_kv(tiny.config), empty_kv(tiny.config)
    pw = CudaGraphPiecewise(SimpleNamespace(model=tiny, device=torch.device("cpu")), sizes,
                            capture=False)
    with torch.inference_mode():
        want = two_steps(tiny, monolithic, ref_kv)
        got = two_steps(tiny, lambda m, kv, r, t: piecewise(pw, m, kv, r, t), got_kv)
    for w, x in zip(want, got):
        assert w.shape == x.shape and not torch.isnan(x).any()
        assert torch.equal(w, x)
    for w, x in zip(ref_kv, got_kv):  # padding rows wrote nothing, real rows the same values
        assert torch.equal(w, x)
    assert want[1].abs().max() > 0.1  # the logits are not all zero


def test_padding_garbage_does_not_change_a_bit(tiny):
    """Different garbage in the padding rows of the same padded step: identical outputs."""
    pw = CudaGraphPiecewise(SimpleNamespace(model=tiny, device=torch.device("cpu")), (64,),
                            capture=False)
    outs = []
    for seed in (1, 2):
        kv = empty_kv(tiny.config)
        with torch.inference_mode():
            outs.append(two_steps(tiny, lambda m, kv, r, t, s=seed: piecewise(pw, m, kv, r, t, s),
                                  kv) + (kv,))
    for x, y in zip(outs[0][:2], outs[1][:2]):
        assert torch.equal(x, y)
    assert all(torch.equal(x, y) for x, y in zip(outs[0][2], outs[1][2]))


def test_small_step_padded_matches_monolithic(tiny):
    """A step of 3 decode rows padded to 16: CPU BLAS takes another kernel for fewer than 8
    rows, so the rows may round differently from the unpadded GEMM; equal to float32 rounding."""
    pw = CudaGraphPiecewise(SimpleNamespace(model=tiny, device=torch.device("cpu")), (16,),
                            capture=False)
    kv_ref, kv_got = empty_kv(tiny.config), empty_kv(tiny.config)
    pages = pages_for(3, 6, seed=9)
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13, 14, 15, 16]]
    with torch.inference_mode():
        for kv in (kv_ref, kv_got):
            monolithic(tiny, kv, [(p, 0, len(t)) for p, t in zip(pages, prompts)], prompts)
        step = [(p, len(t), 1) for p, t in zip(pages, prompts)]
        want = monolithic(tiny, kv_ref, step, [[20], [21], [22]])
        got = piecewise(pw, tiny, kv_got, step, [[20], [21], [22]])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for w, x in zip(kv_ref, kv_got):
        torch.testing.assert_close(x, w, rtol=1e-5, atol=1e-6)
        assert torch.equal(x == 0, w == 0)  # the same slots written, no others


def test_pieces_match_transformers(tmp_path):
    """Independent reference: the padded pieces' logits over a chunked prefill and a mixed step
    against transformers' full-sequence logits (1e-4, float32), as test_model_hf does for the
    monolithic forward."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=160, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256,
                                   rms_norm_eps=1e-5, eos_token_id=2)
    torch.manual_seed(4)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p)) if "norm" in name else p.normal_(0.0, 0.15)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ours = load_model(str(tmp_path), dtype=torch.float32, device="cpu").model
    pw = CudaGraphPiecewise(SimpleNamespace(model=ours, device=torch.device("cpu")), (16, 48),
                            capture=False)
    kv = empty_kv(ours.config)
    with torch.inference_mode():
        got1, got2 = two_steps(ours, lambda m, kv, r, t: piecewise(pw, m, kv, r, t), kv)
    g = torch.Generator().manual_seed(11)
    a, b, c, d = (torch.randint(0, 160, (n,), generator=g).tolist() for n in (9, 14, 21, 13))
    with torch.no_grad():
        ra, rb = hf(torch.tensor([a + [5]])).logits[0], hf(torch.tensor([b + [77]])).logits[0]
        rc, rd = hf(torch.tensor([c])).logits[0], hf(torch.tensor([d])).logits[0]
    want1 = torch.cat([ra[:9], rb[:14], rc[:8]])
    want2 = torch.cat([ra[9:10], rb[14:15], rc[8:], rd])
    for got, want in ((got1, want1), (got2, want2)):
        assert got.shape == want.shape
        assert (got - want).abs().max().item() <= 1e-4
    assert want2.abs().max() > 0.5


# ---- through the engine ------------------------------------------------------------------------

PROMPTS = [[11 + (i * 37 + j * 11) % 4000 for j in range(n)] for i, n in
           enumerate([5, 130, 17, 64, 1, 300, 33, 16, 90])]


def cpu_engine(mode="chunked", blocks=4096, async_scheduling=False, max_model_len=2048):
    return LLMEngine(EngineConfig(
        model="tiny", device="cpu", dtype="float64", max_model_len=max_model_len,
        async_scheduling=async_scheduling, cache=CacheConfig(num_gpu_blocks=blocks),
        scheduler=SchedulerConfig(mode=mode, max_num_batched_tokens=128)))


class Spy:
    """Wraps ``CudaGraphPiecewise.forward`` to record each step's token count."""

    def __init__(self, pw: CudaGraphPiecewise) -> None:
        self.pw, self.tokens = pw, []
        inner = pw.forward

        def forward(model, attn, kv_caches, num_tokens):
            self.tokens.append(num_tokens)
            return inner(model, attn, kv_caches, num_tokens)
        pw.forward = forward


def greedy(eng, prompts=PROMPTS, n_out=12, sampling=None):
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, sampling(i) if sampling else
                        SamplingParams(max_tokens=n_out + i, ignore_eos=True))
    outs, recs = {}, []
    while eng.has_unfinished():
        res = eng.step()
        if res.record:
            recs.append(res.record)
        for f in res.finished:
            outs[f.request_id] = f.output_token_ids
    return outs, recs


@pytest.mark.parametrize("async_on", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", ["chunked", "continuous"])
def test_engine_with_pieces_gives_the_monolithic_tokens(mode, async_on):
    """Steps of ≤ 64 tokens through the padded pieces (sizes 16, 32, 64), larger ones through
    the monolithic forward: the same greedy tokens as the monolithic engine (float64), and each
    step of ≤ 64 tokens, and only those, went through the pieces."""
    want, recs0 = greedy(cpu_engine(mode))
    eng = cpu_engine(mode, async_scheduling=async_on)
    spy = Spy(pw := CudaGraphPiecewise(eng.runner, (16, 32, 64), capture=False))
    eng.runner.piecewise = pw
    got, recs = greedy(eng)
    assert got == want
    small = [r.num_tokens for r in recs if r.num_tokens <= 64]
    assert sorted(spy.tokens) == sorted(small) and small
    assert any(r.num_tokens > 64 for r in recs)  # and some steps stayed monolithic
    if mode == "chunked":
        assert any(r.kind == "mixed" and r.num_tokens <= 64 for r in recs)
    assert not any(r.cuda_graph for r in recs)  # no graphs were captured: none ran
    assert eng.kv.pool.num_free == 4096


def test_engine_with_pieces_under_preemption():
    """A pool too small for the load (preemption, recompute through the pieces) and seeded
    sampling: the monolithic engine's tokens, every page back."""
    def sp(i):
        return SamplingParams(max_tokens=30 + i, temperature=0.8, top_k=20, seed=i,
                              ignore_eos=True)
    prompts = PROMPTS * 2
    want, recs0 = greedy(cpu_engine("continuous", blocks=48, max_model_len=400), prompts,
                         sampling=sp)
    eng = cpu_engine("continuous", blocks=48, max_model_len=400)
    eng.runner.piecewise = CudaGraphPiecewise(eng.runner, (16, 64, 128), capture=False)
    got, recs = greedy(eng, prompts, sampling=sp)
    assert sum(r.num_preempted for r in recs) > 0
    assert got == want
    assert eng.kv.pool.num_free == 48


# ---- the padded sizes and the settings -----------------------------------------------------------


def test_padded_size_is_the_smallest_captured_size_at_or_above(tiny):
    sizes = (48, 16, 512, 32, 16)
    pw = CudaGraphPiecewise(SimpleNamespace(model=tiny, device=torch.device("cpu")), sizes,
                            capture=False)
    assert pw.sizes == (16, 32, 48, 512) and pw.max_num_tokens == 512
    for t in range(1, 513):
        assert pw.padded_size(t) == next(n for n in (16, 32, 48, 512) if n >= t)
    with pytest.raises(ValueError, match="513 tokens exceeds the largest piecewise size 512"):
        pw.padded_size(513)
    assert pw.q.shape == (512, 4, 64) and pw.residual.shape == (512, 256)


@pytest.mark.parametrize("sizes", [(), (0, 16), (-4,)])
def test_piecewise_refuses_bad_sizes(tiny, sizes):
    with pytest.raises(ValueError, match="token counts ≥ 1"):
        CudaGraphPiecewise(SimpleNamespace(model=tiny, device=torch.device("cpu")), sizes,
                           capture=False)


def test_piece_index_out_of_range(tiny):
    with pytest.raises(IndexError, match="piece 5 is out of range: allowed 0 … 4"):
        tiny.piece(5, None, None, None, None)


def test_cudagraph_mode_and_sizes_settings():
    assert EngineConfig().cudagraph_mode == "FULL_AND_PIECEWISE"
    assert EngineConfig(cudagraph_capture_sizes=[64, 16, 16]).cudagraph_capture_sizes == (16, 64)
    assert EngineConfig(cudagraph_mode="FULL_DECODE_ONLY").cudagraph_mode == "FULL_DECODE_ONLY"
    with pytest.raises(ConfigError, match="'PIECEWISE' is not one of FULL_AND_PIECEWISE, "
                                          "FULL_DECODE_ONLY"):
        EngineConfig(cudagraph_mode="PIECEWISE")
    with pytest.raises(ConfigError, match=r"\(no graphs at all: --enforce-eager\)"):
        EngineConfig(cudagraph_mode="NONE")
    with pytest.raises(ConfigError, match="--engine vllm captures its own"):
        EngineConfig(engine="vllm", cudagraph_mode="FULL_DECODE_ONLY")
    with pytest.raises(ConfigError, match="--engine vllm captures its own"):
        EngineConfig(engine="vllm", cudagraph_capture_sizes=(16,))
    assert EngineConfig(engine="vllm").cudagraph_mode == "FULL_AND_PIECEWISE"
    for bad in ((), (0,), (16, 20000), "16,32", (True,), (16.0,)):
        with pytest.raises(ConfigError, match=r"--cudagraph-capture-sizes .* must be a non-empty "
                                              r"list of token counts in \[1, 16384\]"):
            EngineConfig(cudagraph_capture_sizes=bad)


def test_cpu_engine_captures_no_graphs():
    """On the CPU no graph of either kind is captured, whatever cudagraph_mode says."""
    eng = cpu_engine()
    assert eng.runner.piecewise is None and eng.runner.graphs is None


def test_cli_flags_reach_the_engine_config():
    """`--cudagraph-mode` / `--cudagraph-capture-sizes` through the shared click options."""
    import click
    from click.testing import CliRunner

    from gpuchef.commands.options import engine_config, engine_options, scheduler_options

    got = {}

    @click.command()
    @engine_options
    @scheduler_options
    def cmd(**o):
        try:
            got["cfg"] = engine_config(o)
        except ConfigError as e:
            got["err"] = str(e)

    r = CliRunner().invoke(cmd, ["--cudagraph-mode", "FULL_DECODE_ONLY",
                                 "--cudagraph-capture-sizes", "64, 16,32"])
    assert r.exit_code == 0, r.output
    assert got["cfg"].cudagraph_mode == "FULL_DECODE_ONLY"
    assert got["cfg"].cudagraph_capture_sizes == (16, 32, 64)
    got.clear()
    CliRunner().invoke(cmd, [])
    assert got["cfg"].cudagraph_mode == "FULL_AND_PIECEWISE"
    assert got["cfg"].cudagraph_capture_sizes is None
    got.clear()
    CliRunner().invoke(cmd, ["--cudagraph-capture-sizes", "16,x"])
    assert got["err"] == ("--cudagraph-capture-sizes '16,x' must be comma-separated token "
                          "counts, e.g. 16,32,64,128,256,512")
    got.clear()
    CliRunner().invoke(cmd, ["--cudagraph-capture-sizes", "0,16"])
    assert "in [1, 16384]" in got["err"]
    r = CliRunner().invoke(cmd, ["--cudagraph-mode", "PIECEWISE"])
    assert r.exit_code == 2 and "FULL_AND_PIECEWISE" in r.output


# ---- the capture and replay bookkeeping, with a stand-in for torch.cuda's graphs ------------------


class FakeGraph:
    """Stands in for ``torch.cuda.CUDAGraph`` on the CPU: what ``run_piece`` is asked to do
    inside ``fake_graph(g)`` is recorded, not run, and ``replay`` runs it (the pieces read
    and write the static buffers, as a captured graph's kernels do)."""

    recording = None
    log: list = []  # (piece, size) of each replay

    def __init__(self) -> None:
        self.calls = []

    def replay(self) -> None:
        for j, n, f in self.calls:
            FakeGraph.log.append((j, n))
            f()


@pytest.fixture
def fake_cuda_graphs(monkeypatch):
    from contextlib import contextmanager, nullcontext

    @contextmanager
    def graph(g, pool=None):
        assert pool is not None  # one shared pool
        FakeGraph.recording = g
        try:
            yield
        finally:
            FakeGraph.recording = None

    class Stream:
        def wait_stream(self, other):
            pass

    orig = CudaGraphPiecewise.run_piece

    def run_piece(self, model, j, n, kv_caches=None):
        g = FakeGraph.recording
        if g is None:
            return orig(self, model, j, n, kv_caches)
        g.calls.append((j, n, lambda: orig(self, model, j, n, kv_caches)))

    for name, v in dict(CUDAGraph=FakeGraph, graph=graph, graph_pool_handle=object,
                        Stream=Stream, stream=lambda s: nullcontext(), current_stream=Stream,
                        synchronize=lambda *a: None, memory_reserved=lambda *a: 0).items():
        monkeypatch.setattr(torch.cuda, name, v)
    monkeypatch.setattr(CudaGraphPiecewise, "run_piece", run_piece)
    FakeGraph.log = []
    yield FakeGraph


@pytest.mark.parametrize("rope_append", ["fused-except-piecewise", "fused"])
def test_capture_and_replay_bookkeeping(fake_cuda_graphs, rope_append):
    """With graphs "captured" (the stand-in): every size has one graph per piece, steps of
    ≤ 64 tokens replay the pieces of their padded size and are labelled cuda_graph, larger
    ones run eagerly, and the tokens are the monolithic engine's. With RoPE and the K/V append
    inside the pieces ("fused"), the replays read the step's slots and token count from the
    static buffers (the capture's warm-up wrote no page)."""
    from gpuchef.engine_host import ops
    want, _ = greedy(cpu_engine())
    eng = cpu_engine()
    prev = ops.rope_append_mode()
    ops.set_rope_append(rope_append)
    try:
        pw = CudaGraphPiecewise(eng.runner, (16, 32, 64), capture=True, progress=None)
    finally:
        ops.set_rope_append(prev)
    assert pw.fuse_append == (rope_append == "fused")
    assert pw.graphed and sorted(pw.graphs) == [16, 32, 64]
    L = eng.model_config.num_hidden_layers
    assert all(len(gs) == L + 1 and all(len(g.calls) == 1 for g in gs)
               for gs in pw.graphs.values())
    eng.runner.piecewise = pw
    spy = Spy(pw)
    got, recs = greedy(eng)
    assert got == want
    small = [r for r in recs if r.num_tokens <= 64]
    assert small and all(r.cuda_graph for r in small)
    assert not any(r.cuda_graph for r in recs if r.num_tokens > 64)
    assert len(spy.tokens) == len(small)
    want_log = [(j, next(n for n in (16, 32, 64) if n >= t)) for t in spy.tokens
                for j in range(L + 1)]
    assert fake_cuda_graphs.log == want_log  # each piece in order, at the padded size


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
