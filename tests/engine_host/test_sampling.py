"""The batched sampler (``engine_host.sampling``) against independent references: the draws'
frequencies against ``softmax(logits / temperature)`` (Pearson's chi-square; its critical value
by Wilson and Hilferty's 1931 cube-root approximation), the top-k / top-p support against a per-row numpy reading of the rules, the noise hash
against a pure-Python murmur3 finalizer, and a request's samples against the same request
sampled alone (batch composition, row order, chunking, async placeholders must not matter).

Every draw here is a deterministic function of seeds and positions, so the statistical checks
do not flake: they pass or fail the same way every run."""

from __future__ import annotations

import random
from statistics import NormalDist

import numpy as np
import pytest
import torch

from gpuchef.engine_host.request import PLACEHOLDER_TOKEN, Request, SamplingParams
from gpuchef.engine_host import sampling
from gpuchef.engine_host.sampling import (ROW_CHUNK, _fmix32, _fmix32_t, _i32, row_key,
                                          sample_tensor, uniform_noise)


def req(i, *, out=0, **sp) -> Request:
    r = Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=1000, **sp), 0)
    r.output_token_ids = [PLACEHOLDER_TOKEN] * out
    return r


def chi2_quantile(q: float, k: int) -> float:
    """The q-quantile of chi-square with k degrees of freedom (Wilson–Hilferty: within ~1 % for
    k >= 3 at these tails)."""
    z = NormalDist().inv_cdf(q)
    return k * (1 - 2 / (9 * k) + z * (2 / (9 * k)) ** 0.5) ** 3


def chi2_ok(counts: np.ndarray, probs: np.ndarray, alpha: float = 1e-4) -> tuple[bool, float]:
    """Pearson's statistic of ``counts`` against ``probs`` (cells with p > 0) below the
    1 - alpha quantile of chi-square with cells - 1 degrees of freedom."""
    keep = probs > 0
    n = counts.sum()
    if keep.sum() == 1:  # one possible token: every draw is it
        return bool(counts[keep].sum() == n), 0.0
    exp = probs[keep] * n
    stat = float((((counts[keep] - exp) ** 2) / exp).sum())
    return stat < chi2_quantile(1 - alpha, int(keep.sum()) - 1), stat


def test_hash_matches_the_python_finalizer():
    rng = random.Random(0)
    vals = [rng.getrandbits(32) for _ in range(20000)] + [0, 1, 2**31 - 1, 2**31, 2**32 - 1]
    got = _fmix32_t(torch.tensor([_i32(v) for v in vals], dtype=torch.int32)).tolist()
    assert got == [_i32(_fmix32(v)) for v in vals]


def test_noise_is_uniform_in_the_open_interval():
    keys = torch.tensor([row_key(req(i)) for i in range(64)], dtype=torch.int32)
    u = uniform_noise(keys, 4096).numpy().ravel()
    assert u.min() > 0 and u.max() < 1
    counts = np.histogram(u, bins=64, range=(0, 1))[0]
    ok, stat = chi2_ok(counts, np.full(64, 1 / 64))
    assert ok, stat


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_draws_follow_softmax_of_logits_over_temperature(temperature):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 6000
    reqs = [req(i, temperature=temperature) for i in range(n)]
    toks = sample_tensor(logits.repeat(n, 1), reqs).numpy()
    counts = np.bincount(toks, minlength=6)
    probs = torch.softmax(logits.double() / temperature, -1).numpy()
    ok, stat = chi2_ok(counts, probs)
    assert ok, (stat, counts, probs * n)


def test_successive_tokens_of_one_request_are_independent():
    """The noise of output position n and n + 1 of one request: pairs of draws over 4 equally
    likely tokens fill the 16 cells evenly (a hash that kept structure across positions would
    not)."""
    pairs = np.zeros((4, 4))
    logits = torch.zeros(1, 4)
    for i in range(1500):
        a = sample_tensor(logits.clone(), [req(i, temperature=1.0, out=7)]).item()
        b = sample_tensor(logits.clone(), [req(i, temperature=1.0, out=8)]).item()
        pairs[a, b] += 1
    ok, stat = chi2_ok(pairs.ravel(), np.full(16, 1 / 16))
    assert ok, (stat, pairs)


def reference_support(logits: np.ndarray, temperature: float, top_k: int, top_p: float):
    """The tokens top-k then top-p leave, and their renormalised probabilities (numpy, one row):
    top-k keeps values >= the k-th largest; top-p keeps, in descending order, each token whose
    preceding mass is <= top_p (the one crossing the threshold stays)."""
    x = logits / temperature
    keep = np.ones_like(x, dtype=bool)
    if 0 < top_k < len(x):
        keep &= x >= np.sort(x)[::-1][top_k - 1]
    if top_p < 1.0:
        z = np.where(keep, x, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        order = np.argsort(-z, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        drop = np.zeros_like(keep)
        drop[order[before > top_p]] = True
        keep &= ~drop
    q = np.where(keep, np.exp(x - x[keep].max()), 0.0)
    return keep, q / q.sum()


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.8), (5, 0.6), (1, 1.0), (0, 0.05)])
def test_top_k_top_p_support_and_frequencies(top_k, top_p):
    g = torch.Generator().manual_seed(top_k * 10 + int(top_p * 100))
    logits = torch.randn(12, generator=g) * 1.5
    keep, probs = reference_support(logits.double().numpy(), 0.9, top_k, top_p)
    n = 4000
    reqs = [req(i, temperature=0.9, top_k=top_k, top_p=top_p) for i in range(n)]
    toks = sample_tensor(logits.repeat(n, 1), reqs).numpy()
    counts = np.bincount(toks, minlength=12)
    assert set(np.nonzero(counts)[0]) <= set(np.nonzero(keep)[0])
    ok, stat = chi2_ok(counts, probs)
    assert ok, (stat, counts, probs * n)


def test_filter_keeps_everything_off_and_each_rows_own_rule():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 50, generator=g)
    top_k = torch.tensor([0, 7, 0, 50])
    top_p = torch.tensor([1.0, 1.0, 0.7, 1.0])
    got = sampling.filter_top_k_top_p(x, top_k, top_p)
    for r in range(4):
        keep, _ = reference_support(x[r].double().numpy(), 1.0, int(top_k[r]), float(top_p[r]))
        assert np.array_equal(torch.isfinite(got[r]).numpy(), keep), r
        assert torch.equal(got[r][torch.isfinite(got[r])], x[r][torch.from_numpy(keep)])


def test_a_requests_token_does_not_depend_on_its_batch():
    """Alone, in a shuffled batch with greedy and other sampled rows, and across the row chunks:
    the same token. What moves it is its own seed and output position."""
    V = 300
    g = torch.Generator().manual_seed(1)
    n = ROW_CHUNK * 2 + 5
    logits = torch.randn(n, V, generator=g)
    reqs = [req(i, temperature=0.0 if i % 5 == 0 else 1.3, top_p=0.95 if i % 3 else 1.0,
                top_k=40 if i % 4 == 1 else 0, out=i % 7) for i in range(n)]
    alone = [sample_tensor(logits[i:i + 1].clone(), [reqs[i]]).item() for i in range(n)]
    batched = sample_tensor(logits.clone(), reqs).tolist()
    assert batched == alone
    perm = list(range(n))
    random.Random(2).shuffle(perm)
    shuffled = sample_tensor(logits[perm].clone(), [reqs[p] for p in perm]).tolist()
    assert shuffled == [alone[p] for p in perm]
    for i in range(n):  # greedy rows are the argmax
        if i % 5 == 0:
            assert alone[i] == int(logits[i].argmax())


def test_seed_and_position_key_the_noise():
    assert row_key(req(1, temperature=1.0, seed=7)) == row_key(req(2, temperature=1.0, seed=7))
    assert row_key(req(1, temperature=1.0, seed=7)) != row_key(req(1, temperature=1.0, seed=8))
    assert row_key(req(1, temperature=1.0, seed=7, out=1)) != row_key(
        req(1, temperature=1.0, seed=7, out=2))
    # unseeded: the engine seed and the request id
    assert row_key(req(1, temperature=1.0), 0) != row_key(req(1, temperature=1.0), 1)
    assert row_key(req(1, temperature=1.0)) != row_key(req(2, temperature=1.0))
    # the extremes of the allowed seed range hash without error, and differently
    lo, hi = req(1, temperature=1.0, seed=-(1 << 63)), req(1, temperature=1.0, seed=(1 << 64) - 1)
    assert row_key(lo) != row_key(hi)


@pytest.mark.gpu
def test_cuda_draws_equal_cpu_draws():
    """The hash and the Gumbel draw give the same tokens on the GPU as on the CPU (same keys,
    the same float32 logits): a seeded request is reproducible across devices."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    V = 128256
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(70, V, generator=g)
    reqs = [req(i, temperature=1.0, top_p=0.9 if i % 2 else 1.0, out=i) for i in range(70)]
    cpu = sample_tensor(logits.clone(), reqs).tolist()
    gpu = sample_tensor(logits.cuda(), reqs).tolist()
    assert gpu == cpu
