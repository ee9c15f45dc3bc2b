"""The live A/B screen's table when one attached server fails requests the other answers: the
failed-requests row, no better/worse verdict on latency or throughput, one line why — the rows
of ``probes.ab.compare`` over the timeline (tests/probes/test_ab_failures.py holds the rule)."""

from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord
from gpuchef.probes import ab
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.ab_live import ABAnalyser
from gpuchef.tui.screens.ab import ABScreen
from gpuchef.tui.session import ABState

S = 1_000_000_000
T0 = 10**12


def _mirrored(b_fails: int, reps: int = 2, n: int = 6):
    """Two servers on one clock: A answers in 400 ms, B in 100 ms but fails its first
    ``b_fails`` requests of each repetition at once (HTTP 500)."""
    tl = Timeline(origin_ns=T0, clock=lambda: T0 + (10 * reps + 1) * S)
    for r in range(reps):
        tl.add_event(EngineEvent("mark", 0, T0 + 10 * r * S, f"ab:1:AB:{r + 1}"))
        for i in range(n):
            arr = T0 + 10 * r * S + i * S // 2 + 1
            for side, ttft in (("A", 0.4), ("B", 0.1)):
                rid = f"{side}/{ab.rep_request_id(f'req-{i}', r + 1)}"
                if side == "B" and i < b_fails:
                    tl.add_request(RequestRecord(rid, arr, 10, 0, (), "error", error="HTTP 500",
                                                 ended_ns=arr + 1000))
                else:
                    t1 = arr + int(ttft * S)
                    tl.add_request(RequestRecord(rid, arr, 10, 2, (t1, t1 + S // 20), "length"))
    tl.add_event(EngineEvent("mark", 0, T0 + 10 * reps * S, "ab:1:end"))
    st = ABState(rounds=reps, run=1, load="mirrored", servers={"A": "http://a", "B": "http://b"})
    res = ABAnalyser({}, (50.0, 99.0)).analyse(tl.snapshot(), st)
    return res, ABScreen._table(None, res, st).plain  # the table reads only res and st


def test_screen_says_not_comparable_when_b_fails_half():
    res, text = _mirrored(b_fails=3)
    lines = text.splitlines()
    failed = next(x for x in lines if x.startswith("Failed requests"))
    assert failed.split()[2:5] == ["0", "6", "+6"] and failed.endswith("B worse")
    ttft = next(x for x in lines if x.startswith("Mean TTFT"))
    assert ttft.endswith(ab.NOT_COMPARABLE)
    assert lines[-1] == ("Not comparable: B failed 6 of 12 requests, A 0 of 12: latency and "
                         "throughput rows are not compared.")
    assert not [x for x in lines if x.endswith("B better")]
    assert res.comparison.counts["B"] == [ab.RequestCounts(6, 3, 3)] * 2


def test_screen_keeps_the_verdicts_without_failures():
    res, text = _mirrored(b_fails=0)
    lines = text.splitlines()
    assert next(x for x in lines if x.startswith("Mean TTFT")).endswith("B better")
    assert next(x for x in lines if x.startswith("Failed requests")).endswith("within spread")
    assert "Not comparable" not in text
