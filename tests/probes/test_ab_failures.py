"""probes/ab.py with failed requests: the comparison carries each side's requests sent /
completed / failed per window, its first row counts the failures, and when A and B lost
different shares of their requests no latency or throughput row is called better or worse (a
side that failed half its load fast answered a smaller one). Synthetic mirrored runs whose
figures are worked out by hand; the ungated rule (``probes.ab.verdict`` on the same per-window
values) is the reference that shows what the gate withholds."""

import math

import pytest

from gpuchef.experiments.ab_text import format_deltas
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord
from gpuchef.probes import ab

S = 1_000_000_000
T0 = 10**12


def mark(t_s, name):
    return EngineEvent("mark", 0, T0 + int(t_s * S), name)


def ok(rid, arr_s, ttft_s):
    a = T0 + int(arr_s * S)
    return RequestRecord(rid, a, 10, 2, (a + int(ttft_s * S), a + int((ttft_s + 0.1) * S)),
                         "length")


def failed(rid, arr_s):
    a = T0 + int(arr_s * S)
    return RequestRecord(rid, a, 10, 0, (), "error", error="http: HTTP 500",
                         ended_ns=a + int(0.01 * S))


def mirrored_run(b_fails: dict[int, int], a_fails: dict[int, int] | None = None,
                 reps: int = 2, n: int = 4):
    """``reps`` mirrored repetitions of ``n`` requests each: A answers with TTFT 400 ms, B with
    200 ms; ``b_fails[rep]`` / ``a_fails[rep]``: how many of that repetition's requests (the
    first ones) failed on that side. Returns the window results."""
    a_fails = a_fails or {}
    ev = [mark(10 * r, f"ab:1:AB:{r + 1}") for r in range(reps)] + [mark(10 * reps, "ab:1:end")]
    reqs = []
    for r in range(reps):
        for i in range(n):
            t = 10 * r + 0.5 * i + 0.1
            for side, ttft, fails in (("A", 0.4, a_fails), ("B", 0.2, b_fails)):
                rid = f"{side}/req-{i}#{r + 1}"
                reqs.append(failed(rid, t) if i < fails.get(r + 1, 0) else ok(rid, t, ttft))
    _, wins, _ = ab.windows(ev, 1)
    return ab.window_results(wins, reqs, [], whole_loads=True)


def rows(cmp):
    return {r.key: r for r in cmp.rows}


def test_a_side_that_failed_half_its_requests_gets_no_latency_or_throughput_verdict():
    res = mirrored_run(b_fails={1: 2, 2: 2})
    cmp = ab.compare(res, min_pairs=ab.MIN_REPETITIONS)
    r = rows(cmp)
    # the counts per window, in window order: B sent 4, 2 completed, 2 failed, each time
    assert cmp.counts["A"] == [ab.RequestCounts(4, 4, 0)] * 2
    assert cmp.counts["B"] == [ab.RequestCounts(4, 2, 2)] * 2
    assert cmp.requests("B") == ab.RequestCounts(8, 4, 4)
    # the failed row: vLLM's key, first, B worse (every pair, beyond the spread of 0)
    assert cmp.rows[0].key == ab.FAILED_ROW == "failed"
    f = r["failed"]
    assert (f.a, f.b, f.a_runs, f.b_runs, f.verdict) == (0.0, 4.0, [0.0, 0.0], [2.0, 2.0],
                                                         "B worse")
    # B's surviving requests were faster: the plain rule would call B better ...
    ttft = r["mean_ttft_ms"]
    assert ttft.a_runs == pytest.approx([400.0, 400.0]) and \
        ttft.b_runs == pytest.approx([200.0, 200.0])
    spec = next(s for s in ab.metric_specs((50.0, 99.0), False, False) if s.key == "mean_ttft_ms")
    assert ab.verdict(spec, ttft.a_runs, ttft.b_runs, ab.MIN_REPETITIONS) == "B better"
    # ... the comparison does not: every judged row but the failed one is not comparable
    judged = [x for x in cmp.rows if x.better and x.key != "failed" and x.verdict != "n/a"]
    assert judged and {x.verdict for x in judged} == {ab.NOT_COMPARABLE}
    assert {"mean_ttft_ms", "p99_e2el_ms", "request_throughput", "output_throughput"} <= \
        {x.key for x in judged}
    assert cmp.not_comparable == ("B failed 4 of 8 requests, A 0 of 8: latency and throughput "
                                  "rows are not compared")
    # the figures themselves are still shown
    assert ttft.a == pytest.approx(400.0) and ttft.b == pytest.approx(200.0)
    # gpuchef ab's table: the failed row, no "better" anywhere, one line why
    text = format_deltas(cmp)
    line = next(x for x in text.splitlines() if x.startswith("Failed requests"))
    assert line.split()[2:6] == ["0", "4", "+4", "n/a"] and line.endswith("B worse")
    assert not [x for x in text.splitlines() if x.endswith("B better")]
    assert "Not comparable: B failed 4 of 8 requests, A 0 of 8: latency and throughput rows " \
           "are not compared." in text
    mean = next(x for x in text.splitlines() if x.startswith("Mean TTFT"))
    assert mean.endswith(ab.NOT_COMPARABLE)
    # JSON: per setting pooled and per window, and why
    d = cmp.requests_dict()
    assert d["B"] == {"sent": 8, "completed": 4, "failed": 4,
                      "per_window": [{"sent": 4, "completed": 2, "failed": 2}] * 2}
    assert d["not_comparable"] == cmp.not_comparable


def test_equal_failures_keep_the_verdicts():
    base = ab.compare(mirrored_run(b_fails={}), min_pairs=ab.MIN_REPETITIONS)
    same = ab.compare(mirrored_run(b_fails={1: 1, 2: 1}, a_fails={1: 1, 2: 1}),
                      min_pairs=ab.MIN_REPETITIONS)
    for cmp in (base, same):
        assert cmp.not_comparable == "" and cmp.requests_dict()["not_comparable"] is None
        assert rows(cmp)["mean_ttft_ms"].verdict == "B better"
        assert rows(cmp)["failed"].verdict == "within spread"
        assert ab.NOT_COMPARABLE not in {x.verdict for x in cmp.rows}
        assert "Not comparable" not in format_deltas(cmp)
    assert same.requests("A") == same.requests("B") == ab.RequestCounts(8, 6, 2)
    assert rows(base)["failed"].a == rows(base)["failed"].b == 0.0


def test_the_same_failures_in_different_pairs_are_not_comparable():
    """Pooled A and B each lost one request, but in different repetitions: pair 1 compares a
    full load of B with a short one of A."""
    cmp = ab.compare(mirrored_run(b_fails={2: 1}, a_fails={1: 1}), min_pairs=ab.MIN_REPETITIONS)
    assert cmp.requests("A") == cmp.requests("B") == ab.RequestCounts(8, 7, 1)
    assert cmp.not_comparable == ("A failed 1 of 8 requests, B 1 of 8, not in the same pairs "
                                  "(A1 1 of 4, B1 0 of 4): latency and throughput rows are not "
                                  "compared")
    assert rows(cmp)["mean_ttft_ms"].verdict == ab.NOT_COMPARABLE


def test_one_pair_and_unequal_failures_say_not_comparable_not_wait():
    cmp = ab.compare(mirrored_run(b_fails={1: 2}, reps=1), min_pairs=ab.MIN_REPETITIONS)
    assert rows(cmp)["mean_ttft_ms"].verdict == ab.NOT_COMPARABLE
    # the failed row is a count, not a noisy figure: judged at once
    assert rows(cmp)["failed"].verdict == "B worse"


def test_failures_differ_compares_shares_exactly():
    c = ab.RequestCounts
    assert ab.failures_differ([c(4, 4, 0)], [c(4, 4, 0)]) == ""
    assert ab.failures_differ([c(4, 3, 1)], [c(8, 6, 2)]) == ""  # 1 of 4 = 2 of 8
    assert ab.failures_differ([c(4, 3, 1)], [c(8, 7, 1)]).startswith("A failed 1 of 4 requests, "
                                                                     "B 1 of 8")
    assert ab.failures_differ([c(0, 0, 0)], [c(0, 0, 0)]) == ""
    assert math.isclose(c.total([c(4, 3, 1), c(2, 2, 0)]).sent, 6)


def test_the_same_share_failed_on_different_requests_of_one_load_is_not_comparable():
    # a tester's case: A lost the first requests of each repetition, B the last ones — the same
    # counts, but each side was timed on a different part of the load
    res = mirrored_run(b_fails={1: 2, 2: 2}, a_fails={1: 2, 2: 2})
    for w in res:  # B's failures move to the last two requests of its load
        if w.label == "B":
            w.requests = [failed(r.request_id, (r.arrival_ns - T0) / S)
                          if int(r.request_id.split("-")[1].split("#")[0]) >= 2 else
                          ok(r.request_id, (r.arrival_ns - T0) / S, 0.2) for r in w.requests]
    cmp = ab.compare(res, min_pairs=ab.MIN_REPETITIONS)
    assert cmp.requests("A") == cmp.requests("B") == ab.RequestCounts(8, 4, 4)
    assert cmp.not_comparable == ("A and B failed different requests of the same load (pair 1: "
                                  "2 failed on A only, 2 on B only): latency and throughput rows "
                                  "are not compared")
    assert rows(cmp)["mean_ttft_ms"].verdict == ab.NOT_COMPARABLE


def test_the_same_requests_failed_on_both_sides_keeps_the_verdicts():
    res = mirrored_run(b_fails={1: 2, 2: 2}, a_fails={1: 2, 2: 2})
    cmp = ab.compare(res, min_pairs=ab.MIN_REPETITIONS)
    assert cmp.not_comparable == ""
    assert rows(cmp)["mean_ttft_ms"].verdict == "B better"


def test_the_failed_row_is_judged_on_its_counts_when_they_differ():
    # A 0 of 4, B 1 of 4 in one pair and 0 in the other: the spread would say "within spread"
    cmp = ab.compare(mirrored_run(b_fails={1: 1}), min_pairs=ab.MIN_REPETITIONS)
    assert cmp.not_comparable and rows(cmp)["failed"].verdict == "B worse"
