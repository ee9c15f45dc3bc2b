"""FlashInfer attention backend against the PyTorch reference (GPU only).

Every test is marked ``gpu`` (tests/conftest.py skips them without CUDA) and imports flashinfer
inside a fixture, so this module collects on a CPU-only machine without flashinfer.
Tolerance: relative error ``‖out − ref‖ / ‖ref‖ ≤ 1e-2`` in bf16 (REFERENCE §4 measured 2.2e-3
for FlashInfer's prefill against a float32 reference).
"""

from __future__ import annotations

import time

import pytest
import torch

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.attention import AttentionMetadata, ReferenceAttention, write_kv

pytestmark = pytest.mark.gpu

BLOCK = 16
RTOL = 1e-2
HEADS = pytest.mark.parametrize("hq,hkv", [(32, 8), (32, 32)], ids=["gqa32-8", "mha32"])
#: both kernels for decode rows (FlashInferAttention.decode_attention); "auto" is one of them
DECODE = pytest.mark.parametrize("decode_attention", ["flashinfer", "xqa"])


@pytest.fixture(scope="module")
def fi_backend():
    pytest.importorskip("flashinfer")
    from gpuchef.engine_host.flashinfer_backend import FlashInferAttention
    return FlashInferAttention


def make_batch(reqs, num_decodes, hq, hkv, d=128, num_blocks=512, seed=0,
               dtype=torch.bfloat16, device="cuda"):
    """A random step: ``reqs`` is a list of ``(kv_len, qo_len)``, decodes (qo_len 1) first.

    Pages are drawn from a shuffled pool, so no request's pages are contiguous; the whole pool
    starts random, so stale data outside each request's KV would show up as an error.
    Returns (meta, q, k, v, kv_cache).
    """
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    qo_indptr, kv_indptr, indices, last, slots, positions = [0], [0], [], [], [], []
    for kv_len, qo_len in reqs:
        assert 1 <= qo_len <= kv_len
        n_pages = -(-kv_len // BLOCK)
        pages, perm = perm[:n_pages], perm[n_pages:]
        assert len(pages) == n_pages, "pool too small for this batch"
        indices += pages
        qo_indptr.append(qo_indptr[-1] + qo_len)
        kv_indptr.append(kv_indptr[-1] + n_pages)
        last.append((kv_len - 1) % BLOCK + 1)
        for pos in range(kv_len - qo_len, kv_len):
            slots.append(pages[pos // BLOCK] * BLOCK + pos % BLOCK)
            positions.append(pos)
    i32 = dict(dtype=torch.int32)
    meta = AttentionMetadata(
        block_size=BLOCK,
        qo_indptr=torch.tensor(qo_indptr, **i32),
        kv_indptr=torch.tensor(kv_indptr, **i32),
        kv_indices=torch.tensor(indices, **i32),
        kv_last_page_len=torch.tensor(last, **i32),
        kv_lens=[r[0] for r in reqs],
        qo_lens=[r[1] for r in reqs],
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        num_decodes=num_decodes,
    )
    T = qo_indptr[-1]
    q = torch.randn(T, hq, d, generator=g).to(device, dtype)
    k = torch.randn(T, hkv, d, generator=g).to(device, dtype)
    v = torch.randn(T, hkv, d, generator=g).to(device, dtype)
    cache = torch.randn(num_blocks, 2, BLOCK, hkv, d, generator=g).to(device, dtype)
    return meta, q, k, v, cache


def rel_err(out, ref):
    return (out.float() - ref.float()).norm().item() / ref.float().norm().item()


def run_both(backend, meta, q, k, v, cache, layer=0):
    """Run FlashInfer and the reference on copies of ``cache``; return outputs and caches."""
    ref_backend = ReferenceAttention()
    ref_backend.begin_step(meta)
    ref_cache = cache.clone()
    ref = ref_backend.forward(layer, q, k, v, ref_cache)
    fi_cache = cache.clone()
    out = backend.forward(layer, q, k, v, fi_cache)
    torch.cuda.synchronize()
    return out, ref, fi_cache, ref_cache


# decode rows first (incl. a KV of 1 and exact page multiples), then prefill chunks aligned to
# the end of their KV: a fresh prompt of exactly one page, a chunk in the middle of a page, a
# whole 512-token prompt, a late chunk, and a one-token chunk.
MIXED = [(1, 1), (16, 1), (17, 1), (300, 1), (1024, 1),
         (16, 16), (100, 37), (512, 512), (1000, 256), (33, 1)]
DECODE_ONLY = [(1, 1), (15, 1), (16, 1), (64, 1), (777, 1), (2048, 1)]
PREFILL_ONLY = [(1, 1), (48, 48), (200, 64), (1500, 300)]


@HEADS
@pytest.mark.parametrize("kv_append", ["scatter", "flashinfer"])
@pytest.mark.parametrize("explicit_configure", [True, False], ids=["configure", "lazy"])
@pytest.mark.parametrize("mixed_attention", ["split", "single"])
@DECODE
def test_mixed_batch_matches_reference(fi_backend, hq, hkv, kv_append, explicit_configure,
                                       mixed_attention, decode_attention):
    be = fi_backend("cuda", kv_append=kv_append, mixed_attention=mixed_attention,
                    decode_attention=decode_attention)
    if explicit_configure:
        be.configure(hq, hkv, 128, torch.bfloat16)
    meta, q, k, v, cache = make_batch(MIXED, num_decodes=5, hq=hq, hkv=hkv, seed=1)
    be.begin_step(meta)
    out, ref, fi_cache, ref_cache = run_both(be, meta, q, k, v, cache)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out, ref) <= RTOL
    # per request too, so a single wrong request cannot hide in the global norm
    qo = meta.qo_indptr.tolist()
    for b in range(meta.num_reqs):
        assert rel_err(out[qo[b]:qo[b + 1]], ref[qo[b]:qo[b + 1]]) <= RTOL, f"request {b}"
    assert torch.equal(fi_cache, ref_cache), "K/V in the pages differ from write_kv's"


@HEADS
@DECODE
def test_decode_only(fi_backend, hq, hkv, decode_attention):
    be = fi_backend("cuda", decode_attention=decode_attention)
    be.configure(hq, hkv, 128, torch.bfloat16)
    meta, q, k, v, cache = make_batch(DECODE_ONLY, num_decodes=len(DECODE_ONLY),
                                      hq=hq, hkv=hkv, seed=2)
    be.begin_step(meta)
    out, ref, fi_cache, ref_cache = run_both(be, meta, q, k, v, cache)
    assert rel_err(out, ref) <= RTOL
    assert torch.equal(fi_cache, ref_cache)


@pytest.mark.parametrize("split", ["off"])
def test_decode_split_kv_settings_match_reference(fi_backend, monkeypatch, split):
    """GPUCHEF_DECODE_SPLIT_KV: FlashInfer's decode plan without split-KV (off), eager and in a
    mixed step, against the reference."""
    monkeypatch.setenv("GPUCHEF_DECODE_SPLIT_KV", split)
    be = fi_backend("cuda", decode_attention="flashinfer")
    assert be.decode_split_kv == {"disable_split_kv": True}
    be.configure(32, 8, 128, torch.bfloat16)
    for reqs, nd, seed in ((DECODE_ONLY, len(DECODE_ONLY), 2), (MIXED, 5, 1)):
        meta, q, k, v, cache = make_batch(reqs, num_decodes=nd, hq=32, hkv=8, seed=seed)
        be.begin_step(meta)
        out, ref, fi_cache, ref_cache = run_both(be, meta, q, k, v, cache)
        qo = meta.qo_indptr.tolist()
        for b in range(meta.num_reqs):
            assert rel_err(out[qo[b]:qo[b + 1]], ref[qo[b]:qo[b + 1]]) <= RTOL, f"request {b}"


@HEADS
def test_prefill_only(fi_backend, hq, hkv):
    be = fi_backend("cuda")
    be.configure(hq, hkv, 128, torch.bfloat16)
    meta, q, k, v, cache = make_batch(PREFILL_ONLY, num_decodes=0, hq=hq, hkv=hkv, seed=3)
    be.begin_step(meta)
    out, ref, fi_cache, ref_cache = run_both(be, meta, q, k, v, cache)
    assert rel_err(out, ref) <= RTOL
    assert torch.equal(fi_cache, ref_cache)


@DECODE
def test_plan_reused_across_layers_and_steps(fi_backend, decode_attention):
    """One plan serves every layer of a step; the next step's plan replaces it."""
    be = fi_backend("cuda", decode_attention=decode_attention)
    be.configure(32, 8, 128, torch.bfloat16)
    for step, (reqs, nd) in enumerate([(MIXED, 5), (DECODE_ONLY, 6), (PREFILL_ONLY, 0)]):
        meta, q, k, v, cache0 = make_batch(reqs, nd, 32, 8, seed=10 + step)
        be.begin_step(meta)
        for layer in range(3):
            g = torch.Generator(device="cuda").manual_seed(layer)
            ql = torch.randn(q.shape, generator=g, device="cuda").to(q.dtype)
            out, ref, fi_cache, ref_cache = run_both(be, meta, ql, k, v, cache0, layer=layer)
            assert rel_err(out, ref) <= RTOL, (step, layer)
            assert torch.equal(fi_cache, ref_cache)


def test_scatter_append_equals_write_kv(fi_backend):
    """The backend's K/V append (both paths) writes exactly what write_kv writes."""
    meta, q, k, v, cache = make_batch(MIXED, 5, 32, 8, seed=4)
    expect = cache.clone()
    write_kv(expect, k, v, meta.slot_mapping)
    for mode in ("scatter", "flashinfer"):
        be = fi_backend("cuda", kv_append=mode)
        be.begin_step(meta)
        got = cache.clone()
        be.append_kv(k, v, got)
        assert torch.equal(got, expect), mode


@DECODE
def test_fused_rope_append_equals_flashinfer_rope_then_append(fi_backend, decode_attention):
    """RoPE in the append (``forward(rope=...)``, engine_host.rope_append's Triton kernel,
    compiled) against FlashInfer's own RoPE kernel on q and k and then write_kv: the pages bit
    for bit (within one bf16 step where the two kernels' float32 FMAs round apart), q as
    rotated, and the attention output as the reference attends the rotated q, k."""
    from gpuchef.engine_host import ops, rope_append
    if not rope_append.available():
        pytest.skip("triton does not import")
    meta, q, k, v, cache = make_batch(MIXED, 5, 32, 8, seed=6)
    qkv = torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], dim=1)  # strided views, as
    qs, ks, vs = qkv.split([q[0].numel(), k[0].numel(), v[0].numel()], dim=1)  # the model's
    qs, ks, vs = qs.view(q.shape), ks.view(k.shape), vs.view(v.shape)
    cs = ops.rope_cos_sin_cache(128, 500000.0, None, 4096).cuda()
    assert ops.use_flashinfer_ops(True)
    try:
        rq, rk = ops.apply_rope(qs, ks, meta.positions, cs)  # FlashInfer's kernel
    finally:
        ops.use_flashinfer_ops(False)
    want = cache.clone()
    write_kv(want, rk, vs, meta.slot_mapping)
    got = cache.clone()
    got_q = rope_append.rope_append_kv(qs, ks, vs, meta.positions, cs, got, meta.slot_mapping)
    torch.cuda.synchronize()
    for a, b in ((got_q, rq), (got, want)):
        d = (a.float() - b.float()).abs()
        assert (d <= 2 ** -7 * b.float().abs() + 1e-6).all()
        assert (d > 0).float().mean().item() < 1e-3  # all but a few elements bit-identical
    be = fi_backend("cuda", decode_attention=decode_attention)
    be.begin_step(meta)
    ref_backend = ReferenceAttention()
    ref_backend.begin_step(meta)
    ref = ref_backend.forward(0, rq, rk, vs, cache.clone())
    fi_cache = cache.clone()
    out = be.forward(0, qs, ks, vs, fi_cache, rope=(meta.positions, cs))
    torch.cuda.synchronize()
    assert rel_err(out, ref) <= RTOL
    assert torch.equal(fi_cache, got)  # forward(rope=...) ran the same kernel


def test_output_dtype_follows_q(fi_backend):
    """An fp32 q is run in the cache dtype and returned as fp32."""
    be = fi_backend("cuda")
    meta, q, k, v, cache = make_batch(MIXED, 5, 32, 8, seed=5)
    be.begin_step(meta)
    out, ref, _, _ = run_both(be, meta, q.float(), k, v, cache)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) <= RTOL


@pytest.mark.parametrize("kv_append", ["flashinfer", "scatter"])
@pytest.mark.parametrize("device_page_indices", [False, True])
@DECODE
def test_decode_cuda_graph_replay(fi_backend, kv_append, device_page_indices, decode_attention):
    """The CUDA-graph seam: capture one decode forward, re-plan, replay with new lengths (page
    indices given to the graph wrapper's plan on the host, or on the device as under async
    scheduling; XQA's page table copied into its fixed buffer)."""
    check_decode_graph_replay(fi_backend, kv_append, device_page_indices, decode_attention)


@pytest.mark.parametrize("split", ["off"])
def test_decode_cuda_graph_replay_with_split_kv_setting(fi_backend, monkeypatch, split):
    """GPUCHEF_DECODE_SPLIT_KV in a captured decode graph: re-planned steps of other lengths
    replay correctly (the graph's grid is fixed at capture)."""
    monkeypatch.setenv("GPUCHEF_DECODE_SPLIT_KV", split)
    check_decode_graph_replay(fi_backend, "flashinfer", True, "flashinfer")


def check_decode_graph_replay(fi_backend, kv_append, device_page_indices, decode_attention):
    hq, hkv, n = 32, 8, 4
    be = fi_backend("cuda", kv_append=kv_append, decode_attention=decode_attention)
    be.device_page_indices = device_page_indices
    be.configure(hq, hkv, 128, torch.bfloat16)
    be.graph_decode_wrapper(n, max_pages=512, block_size=BLOCK, max_pages_per_req=128)
    metas = [make_batch([(kv, 1) for kv in kvs], n, hq, hkv, seed=20 + i)
             for i, kvs in enumerate([(5, 16, 300, 1024), (1, 33, 2000, 17), (64, 64, 64, 64)])]
    cache = metas[0][4]
    # static inputs the graph reads; later steps copy into them
    slot_s = metas[0][0].slot_mapping.clone()
    q_s, k_s, v_s = (t.clone() for t in metas[0][1:4])

    def step_meta(m):
        m.slot_mapping = slot_s  # the runner keeps slot_mapping in a static buffer
        return m

    m0 = step_meta(metas[0][0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        be.begin_step(m0)
        be.forward(0, q_s, k_s, v_s, cache)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    be.begin_step(m0)
    assert_graph_inputs(be, n, decode_attention)
    with torch.cuda.graph(graph):
        out_s = be.forward(0, q_s, k_s, v_s, cache)

    for meta, q, k, v, _ in metas[1:]:
        slot_s.copy_(meta.slot_mapping)
        m = step_meta(meta)
        be.begin_step(m)  # plan outside the graph
        q_s.copy_(q), k_s.copy_(k), v_s.copy_(v)
        ref_cache = cache.clone()
        ref_be = ReferenceAttention()
        ref_be.begin_step(m)
        ref = ref_be.forward(0, q, k, v, ref_cache)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out_s, ref) <= RTOL
        assert torch.equal(cache, ref_cache)


def assert_graph_inputs(be, n, decode_attention):
    """The step just planned feeds the CUDA-graph inputs of ``n`` rows of its kernel."""
    if decode_attention == "xqa":
        assert be._xqa_step[0] is be._xqa_graph[n][0] and be._xqa_step[1] is be._xqa_graph[n][1]
    else:
        assert be._active_decode is be._graph_decode[n]


@DECODE
def test_graph_plan_with_device_page_indices_does_not_wait(fi_backend, decode_attention):
    """Under async scheduling the next step is planned while the previous one runs: with
    ``device_page_indices`` a graph wrapper's plan (or XQA's page-table copy) returns without
    waiting for queued GPU work."""
    hq, hkv, n = 32, 8, 4
    be = fi_backend("cuda", decode_attention=decode_attention)
    be.configure(hq, hkv, 128, torch.bfloat16)
    be.graph_decode_wrapper(n, max_pages=256, block_size=BLOCK)
    be.device_page_indices = True
    meta = make_batch([(kv, 1) for kv in (5, 16, 300, 1024)], n, hq, hkv)[0]
    be.begin_step(meta)  # first plan: JIT and allocations outside the timed part
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of queued GPU work at H200 clocks
    t0 = time.perf_counter()
    be.begin_step(meta)
    planned_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    waited_ms = (time.perf_counter() - t0) * 1e3
    assert_graph_inputs(be, n, decode_attention)
    assert planned_ms < 0.2 * waited_ms, (planned_ms, waited_ms)


def test_make_backend_picks_flashinfer(fi_backend):
    from gpuchef.engine_host.attention_choice import make_backend
    assert make_backend("auto", "cuda").name == "flashinfer"
    assert make_backend("flashinfer", "cuda").name == "flashinfer"


def test_single_mixed_attention_switches_per_step(fi_backend):
    """``mixed_attention`` set on the instance between steps takes effect at the next plan; a
    decode-only step still goes through the decode wrapper either way."""
    be = fi_backend("cuda", mixed_attention="split")
    for mode in ("single", "split", "single"):
        be.mixed_attention = mode
        meta, q, k, v, cache = make_batch(MIXED, num_decodes=5, hq=32, hkv=8, seed=3)
        be.begin_step(meta)
        assert be._num_decode_rows == (0 if mode == "single" else 5)
        out, ref, _, _ = run_both(be, meta, q, k, v, cache)
        assert rel_err(out, ref) <= RTOL
    meta, q, k, v, cache = make_batch(DECODE_ONLY, num_decodes=len(DECODE_ONLY), hq=32, hkv=8)
    be.begin_step(meta)
    assert be._num_decode_rows == len(DECODE_ONLY)
    with pytest.raises(ValueError, match="mixed_attention must be one of split, single, got 'x'"):
        fi_backend("cuda", mixed_attention="x")


def test_decode_attention_choice(fi_backend):
    """"auto" is FlashInfer's wrapper; "xqa" is XQA where it applies and refused naming why
    elsewhere; an unknown name is refused naming the allowed ones."""
    be = fi_backend("cuda")
    be.configure(32, 8, 128, torch.bfloat16)
    assert be.decode_kernel(16) == "flashinfer" and be.decode_kernel(8) == "flashinfer"
    assert fi_backend("cuda", decode_attention="flashinfer").decode_kernel(16) == "flashinfer"
    x = fi_backend("cuda", decode_attention="xqa")
    x.configure(32, 8, 128, torch.bfloat16)
    assert x.decode_kernel(16) == "xqa"
    with pytest.raises(ValueError, match="block size 8 .XQA takes 16, 32, 64, 128"):
        x.decode_kernel(8)
    with pytest.raises(ValueError, match="decode_attention must be one of auto, flashinfer, "
                                         "xqa, got 'trtllm'"):
        fi_backend("cuda", decode_attention="trtllm")


def test_rejects_cpu_device(fi_backend):
    with pytest.raises(ValueError):
        fi_backend("cpu")



@pytest.mark.parametrize("hq,hkv", [(20, 4), (24, 4), (28, 4)], ids=["group5", "group6", "group7"])
@DECODE
def test_gqa_group_sizes_5_6_7_match_reference_or_are_refused_at_load(fi_backend, hq, hkv,
                                                                       decode_attention):
    """FlashInfer #996: decode kernels built for group sizes 1/2/4/8 failed for 5, 6, 7 (Qwen2-7B
    is 28/4 = 7). Each of these groups either matches the PyTorch reference in decode-only,
    mixed and prefill-only steps, or is refused when the backend is configured — one line, never
    a kernel error mid-run."""
    be = fi_backend("cuda", decode_attention=decode_attention)
    try:
        be.configure(hq, hkv, 128, torch.bfloat16)
        be.decode_kernel(16)
    except (ValueError, ConfigError) as e:
        assert "\n" not in str(e) and str(hq // hkv) in str(e)
        return
    for reqs, nd, seed in ((DECODE_ONLY, len(DECODE_ONLY), 2), (MIXED, 5, 1),
                           (PREFILL_ONLY, 0, 3)):
        meta, q, k, v, cache = make_batch(reqs, num_decodes=nd, hq=hq, hkv=hkv, seed=seed)
        be.begin_step(meta)
        out, ref, fi_cache, ref_cache = run_both(be, meta, q, k, v, cache)
        qo = meta.qo_indptr.tolist()
        for b in range(meta.num_reqs):
            assert rel_err(out[qo[b]:qo[b + 1]], ref[qo[b]:qo[b + 1]]) <= RTOL, f"request {b}"
