"""Ring / RingView (the timeline's buffers) against a ``deque(maxlen=...)`` as the reference."""

from __future__ import annotations

import random
import threading
from bisect import bisect_left
from collections import deque

import pytest

from gpuchef.probes.timeline import Ring, RingView


@pytest.mark.parametrize("maxlen,chunk", [(1, None), (7, 3), (100, 16), (1000, None), (64, 64),
                                          (10, 1)])
def test_view_is_the_last_maxlen_records_like_a_deque(maxlen, chunk):
    rng = random.Random(maxlen)
    ring, ref = Ring(maxlen, chunk), deque(maxlen=maxlen)
    for i in range(rng.randrange(0, 5 * maxlen + 50)):
        ring.append(i)
        ref.append(i)
        if rng.random() < 0.05:
            assert list(ring.view()) == list(ref)
    v, want = ring.view(), tuple(ref)
    assert len(v) == len(want) == len(ring) and bool(v) == bool(want)
    assert tuple(v) == want and v == want and v == list(want)
    assert list(reversed(v)) == list(reversed(want))
    for i in range(-len(want), len(want)):
        assert v[i] == want[i]
    for bad in (len(want), -len(want) - 1):
        with pytest.raises(IndexError):
            v[bad]
    for _ in range(200):
        a, b = rng.randint(-len(want) - 2, len(want) + 2), rng.randint(-len(want) - 2, len(want) + 2)
        step = rng.choice([None, 1, 2, -1, 3])
        sl = v[a:b:step]
        assert tuple(sl) == want[a:b:step]
        if step in (None, 1):
            assert isinstance(sl, RingView)
            # a slice of a slice too
            c, d = rng.randint(-3, len(sl) + 3), rng.randint(-3, len(sl) + 3)
            assert tuple(sl[c:d]) == want[a:b][c:d]
    for x in (-1, 0, len(want) // 2, 10**9):
        assert bisect_left(v, x) == bisect_left(want, x)


def test_a_view_does_not_change_when_records_are_added_later():
    ring = Ring(50, 8)
    for i in range(37):
        ring.append(i)
    v = ring.view()
    head = v[3:10]
    for i in range(37, 500):
        ring.append(i)
    assert tuple(v) == tuple(range(37)) and tuple(head) == tuple(range(3, 10))
    assert tuple(ring.view()) == tuple(range(450, 500))


def test_a_small_slice_keeps_only_the_chunks_it_covers():
    """An A/B window's steps kept for an hour must not pin the whole ring they were cut from."""
    ring = Ring(10_000, 100)
    for i in range(10_000):
        ring.append(i)
    v = ring.view()
    assert len(v._chunks) >= 100
    part = v[250:420]
    assert tuple(part) == tuple(range(250, 420))
    assert len(part._chunks) == 3  # chunks 2, 3 and 4 of 100 records
    assert len(v[0:0]._chunks) == 0 and tuple(v[5:5]) == ()


def test_two_producers_lose_nothing_and_a_concurrent_reader_sees_no_gap():
    n = 20_000
    ring = Ring(10 * n, 64)
    stop = threading.Event()
    bad: list[str] = []

    def produce(base: int) -> None:
        for i in range(n):
            ring.append((base, i))

    def read() -> None:
        while not stop.is_set():
            v = ring.view()
            for base in (0, 1):
                mine = [i for b, i in v if b == base]
                if mine != list(range(len(mine))):
                    bad.append(f"producer {base}: a gap or reorder in {len(mine)} records")
                    return

    reader = threading.Thread(target=read)
    reader.start()
    ps = [threading.Thread(target=produce, args=(b,)) for b in (0, 1)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    stop.set()
    reader.join()
    assert not bad
    got = ring.view()
    assert len(got) == 2 * n
    assert sorted(got) == sorted([(b, i) for b in (0, 1) for i in range(n)])

