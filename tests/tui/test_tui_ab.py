"""Live A/B analysis: windows read back from marks; difference against the per-window spread."""

import math

from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.ab_live import ABAnalyser, ab_windows
from gpuchef.tui.session import ABState

S = 1_000_000_000
T0 = 10**12


def mark(t_s, label, step=0):
    return EngineEvent("mark", step, T0 + int(t_s * S), label)


def test_windows_from_marks_newest_run_and_open_last_window():
    evs = [mark(0, "ab:1:A:1"), mark(1, "ab:1:B:1"), mark(2, "ab:1:end"),
           mark(5, "ab:2:A:1", 50), mark(6, "ab:2:B:1", 60), mark(7, "ab:2:A:2", 70),
           EngineEvent("knob", 71, T0 + int(7.5 * S), "max_num_seqs", 1, 2)]
    run, wins, ended = ab_windows(evs)
    assert run == 2 and not ended
    assert [(w.label, w.n, w.complete, w.step0) for w in wins] == [
        ("A", 1, True, 50), ("B", 1, True, 60), ("A", 2, False, 70)]
    run, wins, ended = ab_windows(evs, run=1)
    assert ended and [w.label for w in wins] == ["A", "B"]
    assert ab_windows([]) == (None, [], False)


def _session(ttft_a_ms, ttft_b_ms, windows=4, window_s=2.0):
    """Requests finishing in each window with a TTFT set by the window's setting (plus a
    little per-window noise), one step per 100 ms."""
    tl = Timeline(origin_ns=T0, clock=lambda: T0 + int((windows * window_s + 1) * S))
    n = 0
    for w in range(windows):
        label = "AB"[w % 2]
        t0 = w * window_s
        tl.add_event(mark(t0, f"ab:1:{label}:{w // 2 + 1}", w * 100))
        base = ttft_a_ms if label == "A" else ttft_b_ms
        for k in range(int(window_s * 10)):
            t = T0 + int((t0 + k * 0.1) * S)
            tl.add_step(StepRecord(n, t, t + 50_000_000, 50.0, "chunked", 512, 256, 0, 1, 1, 100,
                                   3, 0, 3, 0, 0, 10, 100))
            n += 1
        for k in range(10):
            fin = T0 + int((t0 + 0.6 + k * 0.1) * S)
            ttft = (base + w + k * 0.1) * 1e6
            arr = fin - int(ttft) - 20_000_000
            tl.add_request(RequestRecord(f"r{w}-{k}", arr, 100, 3,
                                         (arr + int(ttft), fin - 10_000_000, fin), "length"))
    tl.add_event(mark(windows * window_s, "ab:1:end", n))
    st = ABState(False, {"A": {"mode": "chunked"}, "B": {"mode": "continuous"}}, window_s, 2,
                 "", 0, 0, 1, 0.5)
    return tl, st


def test_difference_beyond_spread_is_called_with_direction():
    tl, st = _session(ttft_a_ms=100, ttft_b_ms=300, windows=8)
    res = ABAnalyser({"ttft": 200.0}, (50.0, 99.0)).analyse(tl.snapshot(), st)
    assert len(res.settings["A"].windows) == 4 and len(res.settings["B"].windows) == 4
    row = next(r for r in res.rows if r.key == "p50_ttft_ms")
    assert row.b > row.a and row.delta > 0
    assert row.verdict == "B worse"
    good = next(r for r in res.rows if r.key == "request_goodput")
    assert good.verdict == "B worse"  # A meets the TTFT SLO, B never does
    lo, hi = row.spread
    assert math.isfinite(lo) and 190 < lo <= hi < 215  # B_n − A_n: 200 ms plus the window drift


def test_within_spread_and_not_enough_windows():
    tl, st = _session(ttft_a_ms=100, ttft_b_ms=100.5, windows=8)
    res = ABAnalyser({}, (50.0, 99.0)).analyse(tl.snapshot(), st)
    row = next(r for r in res.rows if r.key == "p50_ttft_ms")
    assert row.verdict == "within spread"
    assert not any(r.key == "request_goodput" for r in res.rows)
    # 3 windows each of a 200 ms difference: the verdict waits (2-3 windows called "B better"
    # at the same offered load on the H200)
    tl, st = _session(ttft_a_ms=100, ttft_b_ms=300, windows=6)
    res = ABAnalyser({}, (50.0, 99.0)).analyse(tl.snapshot(), st)
    assert {r.verdict for r in res.rows} <= {"not enough windows yet (3 of 4)", "n/a"}
    assert res.pairs == 3 and res.min_pairs == 4


def test_a_request_counts_in_the_window_it_arrived_in():
    """A request arriving late in A1 and finishing in B1 is A's (probes.ab membership), and
    B1's throughput counts it as finished work of B1 (work done while B was in force)."""
    tl = Timeline(origin_ns=T0, clock=lambda: T0 + 10 * S)
    for i, (t, name) in enumerate([(0, "ab:1:A:1"), (2, "ab:1:B:1"), (4, "ab:1:end")]):
        tl.add_event(mark(t, name, i))
    ms = 1_000_000
    a = T0 + int(1.9 * S)  # arrives in A1, tokens in B1
    tl.add_request(RequestRecord("x", a, 10, 2, (a + 200 * ms, a + 300 * ms), "length"))
    b = T0 + int(2.5 * S)
    tl.add_request(RequestRecord("y", b, 10, 2, (b + 100 * ms, b + 150 * ms), "length"))
    st = ABState(False, {"A": {}, "B": {}}, 2.0, 1, "", 0, 0, 1, 0.0)
    res = ABAnalyser({}, (50.0,)).analyse(tl.snapshot(), st)
    (wa,), (wb,) = res.settings["A"].windows, res.settings["B"].windows
    assert [r.request_id for r in wa.requests] == ["x"]
    assert sorted(r.request_id for r in wb.requests) == ["y"]
    assert wa.work["finished"] == 0 and wb.work["finished"] == 2
    # B1's span ends at its last token (2.65 s): 2 finished / 0.65 s
    assert abs(res.settings["B"].pooled.request_throughput - 2 / (0.65 + 1e-9)) < 1e-6
