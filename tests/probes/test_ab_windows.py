"""probes/ab.py, the one owner of A/B marks, windows, per-window figures and the verdict:
hand-computed references on small synthetic runs."""

import math

import pytest

from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes import ab

S = 1_000_000_000
MS = 1_000_000
T0 = 10**12


def mark(t_s, name, step=0):
    return EngineEvent("mark", step, T0 + int(t_s * S), name)


def req(rid, arr_s, token_s):
    a = T0 + int(arr_s * S)
    return RequestRecord(rid, a, 10, len(token_s), tuple(T0 + int(t * S) for t in token_s),
                         "length")


def step(i, t_s, dur_s, prefill=0, decode=1):
    t = T0 + int(t_s * S)
    return StepRecord(i, t, t + int(dur_s * S), dur_s * 1e3, "chunked", 512, 256, 0, 1,
                      1 if prefill else 0, prefill, decode, 0, decode, 0, 0, 10, 100)


def test_mark_format_round_trips_and_rejects():
    assert ab.mark_name(3, "B", 7) == "ab:3:B:7" and ab.mark_name(3, "end") == "ab:3:end"
    assert ab.parse_mark("ab:3:B:7") == ab.Mark(3, "B", 7)
    assert ab.parse_mark("ab:12:end") == ab.Mark(12, "end", None)
    for bad in ("ab:1:C:1", "ab:x:A:1", "ab:1:A", "ab:1:A:1:2", "rate→2×", "ab:1:end:3"):
        assert ab.parse_mark(bad) is None, bad
    with pytest.raises(ValueError, match="allowed A, B or AB"):
        ab.mark_name(1, "C", 1)
    with pytest.raises(ValueError):
        ab.mark_name(1, "A", 0)


def test_mirrored_marks_open_a_window_of_each_server_holding_its_own_requests():
    """``ab:<run>:AB:<n>``: repetition n sent to two servers at once — windows A n and B n over
    the same span, each with the requests of its side (ids A/…, B/…), no steps."""
    assert ab.mark_name(1, ab.MIRRORED, 2) == "ab:1:AB:2"
    assert ab.parse_mark("ab:1:AB:2") == ab.Mark(1, "AB", 2)
    assert [ab.side_of(x) for x in ("A/req-0", "B/x", "req-0", "AB/1", "")] == \
        ["A", "B", None, None, None]
    ev = [mark(0, "ab:1:AB:1"), mark(3, "ab:1:AB:2"), mark(6, "ab:1:end")]
    _, wins, ended = ab.windows(ev, 1)
    assert ended and [(w.name, w.t0_ns - T0, w.t1_ns - T0, w.mirrored) for w in wins] == [
        ("A1", 0, 3 * S, True), ("B1", 0, 3 * S, True), ("A2", 3 * S, 6 * S, True),
        ("B2", 3 * S, 6 * S, True)]
    # each server got the same two arrivals; B answers twice as fast as A
    reqs = [req("A/r0", 0.1, [0.5, 0.9]), req("B/r0", 0.1, [0.3, 0.5]),
            req("A/r1", 1.0, [1.4, 1.8]), req("B/r1", 1.0, [1.2, 1.4]),
            req("A/r0", 3.1, [3.5, 3.9]), req("B/r0", 3.1, [3.3, 3.5]),
            req("A/r1", 4.0, [4.4, 4.8]), req("B/r1", 4.0, [4.2, 4.4])]
    steps = [step(0, 0.2, 0.1, prefill=10)]  # neither server's: left out of mirrored windows
    res = {r.name: r for r in ab.window_results(wins, reqs, steps, whole_loads=True,
                                                 gpu_means=lambda a, b: {"sm_active": 50.0})}
    assert [q.request_id for q in res["A1"].requests] == ["A/r0", "A/r1"]
    assert [q.request_id for q in res["B2"].requests] == ["B/r0", "B/r1"]
    assert all(not r.steps and r.gpu == {} for r in res.values())  # neither side's alone
    # spans from the shared mark to each side's own last token
    assert res["A1"].duration_s == pytest.approx(1.8 + 1e-9) and \
        res["B1"].duration_s == pytest.approx(1.4 + 1e-9)
    cmp = ab.compare(list(res.values()), min_pairs=ab.MIN_REPETITIONS)
    row = next(r for r in cmp.rows if r.key == "mean_ttft_ms")
    assert row.a == pytest.approx(400.0) and row.b == pytest.approx(200.0)
    assert row.a_runs == pytest.approx([400.0, 400.0]) and row.verdict == "B better"


def test_windows_of_one_run_and_which_are_counted():
    ev = [mark(0, "ab:1:A:1"), mark(2, "ab:1:B:1"), mark(4, "ab:1:A:2"), mark(6, "ab:1:B:2"),
          mark(6.5, "ab:1:end"), mark(9, "ab:2:A:1")]
    rid, wins, ended = ab.windows(ev, 1)
    assert rid == 1 and ended
    assert [(w.name, w.t0_ns - T0, w.t1_ns - T0) for w in wins] == [
        ("A1", 0, 2 * S), ("B1", 2 * S, 4 * S), ("A2", 4 * S, 6 * S), ("B2", 6 * S, int(6.5 * S))]
    assert ab.windows(ev)[0] == 2 and ab.windows(ev)[1][0].t1_ns is None  # newest, still open
    assert ab.runs_in(ev) == [1, 2]
    reqs = [req("a", 0.5, [0.6, 0.7]), req("b", 2.5, [2.6, 3.9]), req("c", 6.1, [6.2, 6.3])]
    res = ab.window_results(wins, reqs, [])
    by = {r.name: r for r in res}
    assert by["A1"].counted and by["B1"].counted
    assert not by["A2"].counted and by["A2"].why == "no finished request arrived in it"
    # B2 is 0.5 s of a 2 s median window: cut short by the stop
    assert not by["B2"].counted and "shorter than 0.5 of the median window (2 s)" in by["B2"].why
    with pytest.raises(ValueError, match="setting B has no window"):
        ab.compare([by["A1"]])


def test_whole_loads_are_counted_whatever_their_length():
    """Sequential repetitions (each window a whole load): a load half as long as the median is
    not "cut short by a stop" — `gpuchef ab` and the report both pass whole_loads."""
    ev = [mark(0, "ab:1:A:1"), mark(4, "ab:1:B:1"), mark(8, "ab:1:A:2"), mark(9, "ab:1:B:2"),
          mark(13, "ab:1:end")]
    reqs = [req("a", 0.5, [0.6, 3.0]), req("b", 4.5, [4.6, 7.0]), req("c", 8.1, [8.2, 8.9]),
            req("d", 9.1, [9.2, 12.0])]
    _, wins, _ = ab.windows(ev)
    short = {r.name: r for r in ab.window_results(wins, reqs, [])}
    assert not short["A2"].counted and short["A2"].why.startswith("shorter than")
    whole = {r.name: r for r in ab.window_results(wins, reqs, [], whole_loads=True)}
    assert all(r.counted for r in whole.values()), {k: r.why for k, r in whole.items()}
    *_, cmp = ab.analyse(ev, reqs, [], run=1, min_pairs=2, whole_loads=True)
    assert cmp is not None and len(cmp.runs) == 4 and not cmp.skipped
    *_, cmp = ab.analyse(ev, reqs, [], run=1, min_pairs=2)
    assert cmp is not None and [r.name for r in cmp.skipped] == ["A2"]


def test_window_throughput_is_work_done_while_in_force():
    """Hand-computed: A1 = [0, 2) s, B1 = [2, 4) s. Request p arrives in A1 and produces 1
    token in A1 and 2 in B1 (finishing there); q arrives and finishes in B1."""
    ev = [mark(0, "ab:1:A:1"), mark(2, "ab:1:B:1"), mark(4, "ab:1:end")]
    p = req("p", 1.0, [1.5, 2.5, 3.0])
    q = req("q", 2.2, [2.4, 3.5])
    steps = [step(0, 1.0, 0.5, prefill=10), step(1, 2.5, 0.5, decode=2), step(2, 3.5, 0.5)]
    _, wins, _ = ab.windows(ev)
    a1, b1 = ab.window_results(wins, [p, q], steps, percentiles=(50.0,))
    assert [r.request_id for r in a1.requests] == ["p"] and [x.step for x in a1.steps] == [0]
    # A1's span ends just after its last activity: step 0 ends at 1.5 s, p's token at 1.5 s
    assert a1.t1_ns == T0 + int(1.5 * S) + 1
    assert a1.work == {"finished": 0, "output_tokens": 1, "step_tokens": 11}
    assert a1.metrics.request_throughput == 0.0
    assert a1.metrics.output_throughput == pytest.approx(1 / 1.5)
    # B1: p and q finish in it; tokens 2.5, 3.0 (p) and 2.4, 3.5 (q); span to 4.0 (step 2's end)
    assert b1.work == {"finished": 2, "output_tokens": 4, "step_tokens": 2 + 1}
    assert b1.duration_s == pytest.approx(2.0)
    assert b1.metrics.request_throughput == pytest.approx(1.0)
    # latency is of the requests that arrived in the window: p's TTFT is A's (0.5 s)
    assert a1.metrics.mean_ttft_ms == pytest.approx(500.0)
    assert b1.metrics.mean_ttft_ms == pytest.approx(200.0)
    # goodput is good work done: of B1's two finished requests only q met TTFT <= 300 ms
    a1, b1 = ab.window_results(wins, [p, q], steps, percentiles=(50.0,), goodput={"ttft": 300})
    assert a1.metrics.request_goodput == 0.0
    assert b1.metrics.request_goodput == pytest.approx(1 / 2.0)
    assert b1.metrics.request_goodput <= b1.metrics.request_throughput


def test_a_window_span_holds_every_request_it_counts():
    """A request that arrives after the window's last activity, just before the switch (its
    first step runs in the next window), is a member of the window it arrived in, and that
    window's span runs past its arrival: [t0, t1) holds every member (the span ended at the
    last step before, and a run's member arrived after its own window's end; seen in
    tests/gpuchef/test_ab.py's interleaved run, about one run in two)."""
    ev = [mark(0, "ab:1:A:1"), mark(2, "ab:1:B:1"), mark(4, "ab:1:end")]
    p = req("p", 0.5, [0.8, 1.0])
    late = req("late", 1.9, [2.3, 2.6])  # arrives after A1's last activity (1.0 s)
    steps = [step(0, 0.5, 0.3, prefill=10), step(1, 0.8, 0.2), step(2, 2.1, 0.2, prefill=10),
             step(3, 2.4, 0.2)]
    _, wins, _ = ab.windows(ev)
    a1, b1 = ab.window_results(wins, [p, late], steps, percentiles=(50.0,))
    assert [r.request_id for r in a1.requests] == ["p", "late"]
    assert a1.t1_ns == T0 + int(1.9 * S) + 1  # past late's arrival, not 1.0 s + 1 ns
    assert all(a1.t0_ns <= r.arrival_ns < a1.t1_ns for r in a1.requests)
    assert a1.duration_s == pytest.approx(1.9, abs=1e-6)
    # its work is what A did: p's two tokens and p finished; late's tokens are B's
    assert a1.work["finished"] == 1 and a1.work["output_tokens"] == 2
    assert b1.work["output_tokens"] == 2 and not b1.requests


def test_pooled_and_per_window_come_from_the_same_windows():
    """Pooled throughput is the summed work over the summed spans of exactly the counted
    windows, and a pooled median lies within the windows' medians when every window's requests
    are alike."""
    ev, reqs = [], []
    for w in range(8):
        label, n = "AB"[w % 2], w // 2 + 1
        ev.append(mark(2 * w, ab.mark_name(1, label, n)))
        for k in range(3):
            t = 2 * w + 0.2 + 0.5 * k
            ttft = (0.1 if label == "A" else 0.2) + 0.01 * w
            reqs.append(req(f"{w}-{k}", t, [t + ttft, t + ttft + 0.05]))
    ev.append(mark(15.9, "ab:1:A:5"))  # cut short at once: not counted
    ev.append(mark(16, "ab:1:end"))
    _, _, _, res, cmp = ab.analyse(ev, reqs, [], percentiles=(50.0,))
    assert [r.name for r in cmp.skipped] == ["A5"]
    for k in "AB":
        mine = [r for r in cmp.runs if r.label == k]
        assert len(mine) == 4
        done = sum(r.work["finished"] for r in mine)
        span = sum(r.duration_s for r in mine)
        assert done == 12
        assert cmp.pooled[k].request_throughput == pytest.approx(done / span)
    row = next(r for r in cmp.rows if r.key == "p50_ttft_ms")
    assert min(row.a_runs) <= row.a <= max(row.a_runs)
    assert min(row.b_runs) <= row.b <= max(row.b_runs)
    lo, hi = row.spread
    # B_n is window 2n−1 and A_n window 2n−2: 100 ms slower by setting, 10 ms by the drift
    assert lo == pytest.approx(110.0, abs=1e-3) and hi == pytest.approx(110.0, abs=1e-3)
    assert row.median_delta == pytest.approx(110.0, abs=1e-3)
    assert row.verdict == "B worse"  # 4 pairs, every B window slower


def test_verdict_waits_for_enough_pairs():
    spec = ab.MetricSpec("x", "x", "lower", lambda m, g: 0.0)
    a, b = [1.0, 1.1, 1.2, 1.05], [2.0, 2.1, 2.2, 2.05]
    assert ab.verdict(spec, a[:3], b[:3]) == "not enough windows yet (3 of 4)"
    assert ab.verdict(spec, a, b) == "B worse"
    assert ab.verdict(spec, a[:2], b[:2], min_pairs=ab.MIN_REPETITIONS) == "B worse"
    assert ab.verdict(spec, [1.0, 2.0, 1.0, 2.0], [1.5, 1.5, 1.5, 1.5]) == "within spread"
    assert ab.verdict(spec, [math.nan], [1.0]) == "n/a"


def test_a_side_whose_requests_failed_is_timed_to_its_failures():
    """A server that died mid-run: its requests after the death failed (no tokens, ended_ns
    when the client saw the failure). The window runs to the last failure, as vllm bench
    serve's duration runs until every request answered — ended at the last token, the side got
    a 1.7 s span and a throughput above what was offered (a tester's report)."""
    ev = [mark(0, "ab:1:A:1"), mark(10, "ab:1:end")]
    ok = [req(f"ok{i}", 0.2 * i, [0.2 * i + 0.1, 0.2 * i + 0.3]) for i in range(8)]  # to 1.7 s
    dead = [RequestRecord(f"x{i}", T0 + int((2 + 0.25 * i) * S), 10, 0, (), "error",
                          error="connect: refused", ended_ns=T0 + int((2.01 + 0.25 * i) * S))
            for i in range(12)]  # 2.0 .. 4.75 s, each failing at once
    _, wins, _ = ab.windows(ev)
    (w,) = ab.window_results(wins, ok + dead, [], whole_loads=True)
    assert (w.t1_ns - w.t0_ns) / S == pytest.approx(2.01 + 0.25 * 11, abs=1e-6)
    m = w.metrics
    assert m.completed == 8 and m.failed == 12
    assert m.request_throughput == pytest.approx(8 / (2.01 + 0.25 * 11), rel=1e-3)


def test_rep_request_id_is_a_suffix_that_keeps_probe_and_side_prefixes():
    from gpuchef.probes.metrics import summarize

    assert ab.rep_request_id("req-3", 2) == "req-3#2"
    assert ab.rep_request_id("req-3", 2, run=3) == "req-3#3.2"  # a later run of one session
    assert len({ab.rep_request_id("req-0", n, r) for n in (1, 2, 12) for r in (1, 2, 21)}) == 9
    assert ab.side_of("A/" + ab.rep_request_id("req-0", 2)) == "A"
    probe = ab.rep_request_id("probe-1", 2)
    m = summarize([req(probe, 0.0, [0.1]), req(ab.rep_request_id("req-0", 2), 0.0, [0.1, 0.2])],
                  1.0)
    assert (m.probe_completed, m.completed) == (1, 1)  # still a probe: left out of the load
    for bad in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="must be >= 1"):
            ab.rep_request_id("req-0", *bad)


def test_an_aborted_request_is_not_work_finished_but_its_tokens_are():
    """A request aborted after some tokens (a client gone, a dashboard quit) produced tokens in
    the window but did not finish: request throughput counts only completed requests, as
    ``probes.metrics.is_completed`` rules for bench's *completed* (a tester's finding: the
    report's per-mode stretches credited aborts as finished)."""
    ev = [mark(0, "ab:1:A:1"), mark(2, "ab:1:end")]
    done = req("done", 0.1, [0.5, 1.0])
    cut = RequestRecord("cut", T0 + int(0.2 * S), 10, 2, (T0 + int(0.6 * S), T0 + int(1.2 * S)),
                        "abort")
    _, wins, _ = ab.windows(ev)
    (a1,) = ab.window_results(wins, [done, cut], [step(0, 0.1, 1.5)], percentiles=(50.0,))
    assert a1.work["finished"] == 1 and a1.work["output_tokens"] == 4
    assert a1.metrics.request_throughput == pytest.approx(1 / a1.duration_s)
    assert a1.metrics.output_throughput == pytest.approx(4 / a1.duration_s)
