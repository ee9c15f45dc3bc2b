"""build_decode_inputs (the CUDA-graph decode step's host inputs) against the list-based logic it
replaced, and its block-table cache against growth, preemption and reallocation."""

from __future__ import annotations

import random

import pytest
import torch

from gpuchef.engine_host.decode_inputs import BlockTableCache, build_decode_inputs
from gpuchef.engine_host.kv_cache import KVCacheManager, cdiv
from gpuchef.engine_host.request import Request, SamplingParams


def reference(reqs, n, bs, sb):
    """The per-request loop that ``build_decode_inputs`` replaced in ``CudaGraphDecode``."""
    B = len(reqs)
    ids, pos, slots, indices, indptr, last = [], [], [], [], [0], []
    for r in reqs:
        p = r.num_computed_tokens
        ids.append(r.token_slice(p, 1)[0])
        pos.append(p)
        slots.append(r.block_ids[p // bs] * bs + p % bs)
        pages = p // bs + 1
        indices.extend(r.block_ids[:pages])
        indptr.append(len(indices))
        last.append(p - (pages - 1) * bs + 1)
    pad = n - B
    ids += [0] * pad
    pos += [0] * pad
    slots += [sb * bs] * pad
    indices += [sb] * pad
    indptr += range(indptr[-1] + 1, indptr[-1] + 1 + pad)
    last += [1] * pad
    i32, i64 = torch.int32, torch.int64
    return dict(input_ids=torch.tensor(ids, dtype=i64), positions=torch.tensor(pos, dtype=i64),
                slot_mapping=torch.tensor(slots, dtype=i64),
                kv_indptr=torch.tensor(indptr, dtype=i32), kv_indices=torch.tensor(indices, dtype=i32),
                kv_last_page_len=torch.tensor(last, dtype=i32), kv_lens=[p + 1 for p in pos])


def check(reqs, n, bs, sb, cache=None):
    got = build_decode_inputs(reqs, n, bs, sb, cache)
    want = reference(reqs, n, bs, sb)
    for name, w in want.items():
        g = getattr(got, name)
        if name == "kv_lens":
            assert g == w and all(type(v) is int for v in g)
            continue
        assert g.dtype == w.dtype and g.device.type == "cpu" and g.is_contiguous(), name
        assert torch.equal(g, w), name
    assert got.input_ids.shape == (n,) and got.kv_indptr.shape == (n + 1,)
    return got


def make_request(rng: random.Random, i: int, p: int, bs: int, next_block: list[int],
                 extra_blocks: int = 0) -> Request:
    """A decode at position ``p``: ``p + 1`` tokens (prompt, maybe some outputs), with a block
    table covering position ``p`` (plus ``extra_blocks``), block ids drawn from a shuffled pool."""
    n_tok = p + 1
    n_out = rng.randint(0, min(3, n_tok - 1))
    r = Request(f"r{i}", [rng.randrange(50_000) for _ in range(n_tok - n_out)], SamplingParams(),
                0, output_token_ids=[rng.randrange(50_000) for _ in range(n_out)])
    r.num_computed_tokens = p
    r.prefill_target = min(p, r.prompt_len)
    k = p // bs + 1 + extra_blocks
    r.block_ids = next_block[:k]
    del next_block[:k]
    return r


def random_positions(rng: random.Random, B: int, bs: int) -> list[int]:
    out = []
    for _ in range(B):
        kind = rng.randrange(4)
        m = rng.randint(0, 40)
        if kind == 0:
            out.append(m * bs)  # p % bs == 0: first token of a fresh page
        elif kind == 1:
            out.append(m * bs + bs - 1)  # p % bs == bs − 1: last slot of a page
        else:
            out.append(rng.randint(0, 40 * bs))
    return out


@pytest.mark.parametrize("bs", [1, 4, 16])
@pytest.mark.parametrize("seed", range(6))
def test_matches_list_reference(bs, seed):
    rng = random.Random(seed * 100 + bs)
    sb = 7_777
    cache = BlockTableCache()
    for B in (0, 1, 2, 5, 17, 64):
        pool = list(range(5_000))
        rng.shuffle(pool)
        reqs = [make_request(rng, i, p, bs, pool, extra_blocks=rng.randint(0, 2))
                for i, p in enumerate(random_positions(rng, B, bs))]
        for n in {max(B, 1), B + 1, B + 3, 2 * B + 8}:
            if n < B or n == 0:
                continue
            check(reqs, n, bs, sb, cache)
            check(reqs, n, bs, sb, None)  # no cache: same result


def test_position_zero_and_padding_only():
    bs, sb = 16, 99
    r = Request("a", [5], SamplingParams(), 0, num_computed_tokens=0, block_ids=[3])
    got = check([r], 4, bs, sb)
    assert got.kv_indices.tolist() == [3, sb, sb, sb]
    assert got.kv_indptr.tolist() == [0, 1, 2, 3, 4]
    assert got.slot_mapping.tolist() == [3 * bs, sb * bs, sb * bs, sb * bs]
    got = check([], 2, bs, sb)
    assert got.kv_lens == [1, 1] and got.kv_last_page_len.tolist() == [1, 1]


def test_errors_like_the_list_code():
    bs = 4
    r = Request("a", list(range(9)), SamplingParams(), 0, num_computed_tokens=8,
                block_ids=[0, 1])  # position 8 needs a third block
    with pytest.raises(IndexError):
        build_decode_inputs([r], 1, bs, 10)
    with pytest.raises(IndexError):
        reference([r], 1, bs, 10)
    with pytest.raises(ValueError):
        build_decode_inputs([r, r], 1, bs, 10)


def test_cache_follows_growth_preemption_and_reallocation():
    """Decode through the KV manager's real grow/free path; the cached block tables must track
    every append, the ``free`` on preemption and the reallocation after it."""
    bs, num_blocks = 4, 64
    kv = KVCacheManager(1, num_blocks, bs, 1, 8, torch.float32, torch.device("cpu"))
    sb = kv.scratch_block
    cache = BlockTableCache()
    rng = random.Random(3)
    reqs = [Request(f"r{i}", [rng.randrange(1000) for _ in range(3 + 2 * i)], SamplingParams(), 0)
            for i in range(3)]
    for r in reqs:  # prefill all but the last prompt token, then decode
        r.prefill_target = r.prompt_len - 1
        kv.grow(r, r.prefill_target)
        r.num_computed_tokens = r.prefill_target

    def decode_steps(k):
        for _ in range(k):
            for r in reqs:
                kv.grow(r, 1)
            check(reqs, 4, bs, sb, cache)
            for r in reqs:
                r.num_computed_tokens += 1
                if r.num_computed_tokens == r.num_tokens:
                    r.output_token_ids.append(rng.randrange(1000))

    decode_steps(2 * bs + 1)  # crosses page boundaries: block tables grow in place
    grown = reqs[0].block_ids
    assert len(grown) > 2 and cache.get(reqs[0]).tolist() == grown

    # Preempt r0 (blocks freed: a new empty list), let r1 take blocks, then recompute r0 into
    # different blocks: the cache must not serve r0's old table.
    victim = reqs[0]
    old_blocks = list(victim.block_ids)
    kv.free(victim)
    assert victim.block_ids == [] and cache.get(victim).tolist() == []
    kv.grow(reqs[1], 3 * bs)
    kv.pool.allocate(2)  # shift the free list so that r0 gets different block ids back
    victim.num_computed_tokens = 0
    victim.prefill_target = victim.num_tokens - 1
    kv.grow(victim, victim.prefill_target)
    victim.num_computed_tokens = victim.prefill_target
    assert victim.block_ids != old_blocks[:len(victim.block_ids)]
    decode_steps(bs + 2)
    assert cache.get(victim).tolist() == victim.block_ids


def test_cache_sees_replacement_of_equal_length():
    r = Request("a", list(range(8)), SamplingParams(), 0, num_computed_tokens=7, block_ids=[1, 2])
    cache = BlockTableCache()
    check([r], 1, 4, 50, cache)
    r.block_ids = [5, 6]  # a new list of the same length (reallocation after preemption)
    check([r], 1, 4, 50, cache)
    r.block_ids.append(9)  # in-place growth
    check([r], 1, 4, 50, cache)
    r.block_ids[:] = [7, 8, 10]  # in-place rewrite, same length: caught by the last block
    check([r], 1, 4, 50, cache)


def test_cache_prunes_absent_requests():
    cache = BlockTableCache()
    rs = [Request(f"r{i}", [1], SamplingParams(), 0, block_ids=[i]) for i in range(200)]
    for r in rs:
        cache.get(r)
    cache.prune(rs[:2])
    assert len(cache) == 2
    assert cache.get(rs[0]).tolist() == [0]


def test_matches_at_benchmark_shape():
    """256 requests, 1024-token prompt + 1 output, 65 blocks each, block size 16."""
    bs = 16
    reqs = []
    for i in range(256):
        r = Request(f"r{i}", list(range(1024)), SamplingParams(), 0, output_token_ids=[i])
        r.num_computed_tokens = r.prefill_target = 1024
        r.block_ids = list(range(65 * i, 65 * i + cdiv(1025, bs)))
        reqs.append(r)
    cache = BlockTableCache()
    got = check(reqs, 256, bs, 10**6, cache)
    assert got.kv_indices.numel() == 256 * 65
    check(reqs, 256, bs, 10**6, cache)  # cached path
