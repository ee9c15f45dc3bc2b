"""``attention.padded_block_table``: the CSR page table as the padded [B, width] table that XQA
reads, against a per-request Python loop."""

from __future__ import annotations

import numpy as np
import pytest

from gpuchef.engine_host.attention import padded_block_table


def loop_table(indptr, indices, width):
    out = [[0] * width for _ in range(len(indptr) - 1)]
    for b in range(len(indptr) - 1):
        for j, p in enumerate(indices[indptr[b]:indptr[b + 1]]):
            out[b][j] = p
    return np.array(out, dtype=np.int32).reshape(len(indptr) - 1, width)


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_loop_over_random_csr(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 40, size=rng.integers(1, 30))
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = rng.permutation(int(indptr[-1]) + 7)[:indptr[-1]].astype(np.int32) + 1
    t = padded_block_table(indptr, indices)
    assert t.dtype == np.int32 and t.shape == (len(counts), counts.max())
    np.testing.assert_array_equal(t, loop_table(indptr.tolist(), indices.tolist(), counts.max()))
    wide = padded_block_table(indptr, indices, width=64)
    np.testing.assert_array_equal(wide, loop_table(indptr.tolist(), indices.tolist(), 64))


def test_a_rebased_slice_of_the_csr():
    # the decode rows of a step are a prefix; a slice that does not start at 0 works the same
    indptr = np.array([3, 5, 6, 9], dtype=np.int32)
    indices = np.arange(100, 109, dtype=np.int32)
    np.testing.assert_array_equal(padded_block_table(indptr, indices),
                                  [[103, 104, 0], [105, 0, 0], [106, 107, 108]])


def test_a_request_wider_than_the_table_is_refused():
    with pytest.raises(ValueError, match="holds 3 pages; the page table holds 2"):
        padded_block_table(np.array([0, 3]), np.array([1, 2, 3]), width=2)
