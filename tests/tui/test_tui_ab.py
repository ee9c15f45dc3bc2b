"""Live A/B analysis: windows read back from marks; difference against the per-window spread."""

import math

from gpuchef.engine_host.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.ab import ABAnalyser, ab_windows
from gpuchef.tui.model import ABState

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
    assert [(w.label, w.index, w.complete, w.step0) for w in wins] == [
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
    tl, st = _session(ttft_a_ms=100, ttft_b_ms=300)
    res = ABAnalyser({"ttft": 200.0}, (50.0, 99.0)).analyse(tl.snapshot(), st)
    assert len(res.settings["A"].windows) == 2 and len(res.settings["B"].windows) == 2
    row = next(r for r in res.rows if r.metric.key == "p50_ttft")
    assert row.b > row.a and row.delta > 0
    assert row.verdict == "B worse"
    good = next(r for r in res.rows if r.metric.key == "goodput")
    assert good.verdict == "B worse"  # A meets the TTFT SLO, B never does
    assert math.isfinite(row.spread_a) and row.spread_a < 5


def test_within_spread_and_too_few_windows():
    tl, st = _session(ttft_a_ms=100, ttft_b_ms=100.5)
    res = ABAnalyser({}, (50.0, 99.0)).analyse(tl.snapshot(), st)
    row = next(r for r in res.rows if r.metric.key == "p50_ttft")
    assert row.verdict == "within spread"
    assert not any(r.metric.key == "goodput" for r in res.rows)
    tl, st = _session(ttft_a_ms=100, ttft_b_ms=300, windows=2)
    res = ABAnalyser({}, (50.0, 99.0)).analyse(tl.snapshot(), st)
    assert {r.metric.key: r.verdict for r in res.rows if r.verdict != "need ≥2 windows each"} \
        == {"sm": "no data"}  # no GPU samples at all


def test_settle_time_leaves_out_requests_of_the_previous_setting():
    tl, st = _session(ttft_a_ms=100, ttft_b_ms=300)
    an = ABAnalyser({}, (50.0,))
    res = an.analyse(tl.snapshot(), st)
    # every request finishes >= 0.6 s into its window, after the 0.5 s settle: all 10 counted
    assert [m.completed for m, _ in res.settings["A"].per_window] == [10, 10]
    st2 = ABState(**{**st.__dict__, "settle_s": 1.05})
    res2 = ABAnalyser({}, (50.0,)).analyse(tl.snapshot(), st2)
    assert [m.completed for m, _ in res2.settings["A"].per_window] == [5, 5]
