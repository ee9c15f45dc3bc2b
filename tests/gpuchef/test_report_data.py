"""gpuchef.report.data: a capacity trace cut into its probes and grouped by setting; requests
withdrawn by an early stop stay in the probe that withdrew them; a trace cut inside a probe does
not judge that probe as whole. ``write_trace`` (the committed H200 trace's records, with other
meta and events) serves the report's other test files too."""

from __future__ import annotations

from pathlib import Path

from gpuchef.engine_host.vocab.records import EngineEvent
from gpuchef.probes.recorder import TraceRecorder, read_trace

H200 = Path(__file__).parent / "data" / "h200_chunked_1s.jsonl"


def write_trace(path, meta, events=(), steps=None, requests=None):
    src = read_trace(H200)
    rec = TraceRecorder(path, meta=meta)
    for r in (*(src.steps if steps is None else steps),
              *(src.requests if requests is None else requests), *events):
        rec.record(r)
    rec.close()
    return path


def test_capacity_trace_is_cut_into_its_probes_and_grouped_by_setting(tmp_path):
    """A trace with capacity marks (A at 1 and 4 req/s, A stopped early, B at 1): segments are
    the probes (a stop mark does not cut), groups A and B hold the requests that arrived in
    their probes, and capacity_probes judges the same probes."""
    from gpuchef.report.data import build, capacity_probes

    src = read_trace(H200)
    arr = sorted(r.arrival_ns for r in src.requests)
    t0, t1, t2 = arr[0], arr[len(arr) // 3], arr[2 * len(arr) // 3]
    meta = {"command": "ab", "workload": {"dataset": "random", "request_rate": 1.0},
            "ab": {"capacity": True, "slo_spec": "itl_p99:500ms",
                   "settings": {"A": {"describe": "mode=chunked, max_num_batched_tokens=2048"},
                                "B": {"describe": "mode=chunked, max_num_batched_tokens=256"}}}}
    p = write_trace(tmp_path / "cap.jsonl", meta, events=[
        EngineEvent("mark", 0, t0, "capacity:A:1"), EngineEvent("mark", 1, t1, "capacity:A:4"),
        EngineEvent("mark", 2, (t1 + t2) // 2, "capacity:A:stopped:itl_p99 broken"),
        EngineEvent("mark", 3, t2, "capacity:B:1")])
    data = build([p])
    v = data.views[0]
    assert v.capacity and not v.ab
    assert [(s.label, s.name, s.probe_rate) for s in v.segments] == \
        [("A", "A@1", 1.0), ("A", "A@4", 4.0), ("B", "B@1", 1.0)]
    assert [g.short for g in data.groups] == ["A", "B"]
    assert data.groups[0].label == "A: mode=chunked, max_num_batched_tokens=2048"
    n_a = sum(1 for a in arr if a < t2)
    assert [len(g.requests) for g in data.groups] == [n_a, len(arr) - n_a]
    probes, slos = capacity_probes(v)
    assert [s.key for s in slos] == ["itl_p99"]
    assert [(x.label, x.target) for x in probes] == [("A", 1.0), ("A", 4.0), ("B", 1.0)]
    assert [bool(x.stopped_early) for x in probes] == [False, True, False]


def test_requests_withdrawn_by_an_early_stop_stay_in_their_probe(tmp_path):
    """A probe stopped early withdraws its requests not yet arrived; their planned arrivals lie
    in the next probe's time. The report must place them in the probe that withdrew them
    (where `gpuchef ab` judged them): on the H200 (2026-12-02) the next probe got 962 of them
    and the report called it saturated where the command had not."""
    from dataclasses import replace

    from gpuchef.report.data import build, capacity_probes

    src = read_trace(H200)
    reqs = sorted(src.requests, key=lambda r: r.arrival_ns)
    arr = [r.arrival_ns for r in reqs]
    t0, t1 = arr[0], arr[len(arr) // 2]
    stop = (t0 + t1) // 2
    # A's probe [t0, t1) stopped at `stop`: 7 requests planned after t1 were withdrawn then
    withdrawn = [replace(reqs[0], request_id=f"w-{i}", arrival_ns=t1 + (i + 1) * 1000,
                         token_times_ns=(), output_len=0, first_scheduled_ns=0,
                         finish_reason="early stop", ended_ns=stop + i) for i in range(7)]
    assert all(w.arrival_ns >= t1 > w.ended_ns and w.withdrawn for w in withdrawn)
    meta = {"command": "ab", "workload": {"dataset": "random", "request_rate": 1.0},
            "ab": {"capacity": True, "slo_spec": "itl_p99:500ms"}}
    p = write_trace(tmp_path / "cap.jsonl", meta, requests=[*reqs, *withdrawn], events=[
        EngineEvent("mark", 0, t0, "capacity:A:1"),
        EngineEvent("mark", 1, stop, "capacity:A:stopped:itl_p99 broken"),
        EngineEvent("mark", 2, t1, "capacity:B:1")])
    v = build([p]).views[0]
    a_seg, b_seg = v.segments
    assert {r.request_id for r in withdrawn} <= {r.request_id for r in a_seg.requests}
    assert not any(r.withdrawn for r in b_seg.requests)
    assert len(b_seg.requests) == sum(1 for x in arr if x >= t1)
    # B is judged on its own requests alone: every one of them finished
    probes, _ = capacity_probes(v)
    assert probes[1].label == "B" and probes[1].metrics.completed == len(b_seg.requests)
    assert not probes[1].metrics.failed
    # the round trip keeps the field; a withdrawn request is not a slice in the Perfetto trace
    back = read_trace(p)
    assert sorted(r.ended_ns for r in back.requests if r.withdrawn) == \
        sorted(w.ended_ns for w in withdrawn)
    from gpuchef.report.perfetto import trace_events
    names = {e.get("name") for e in trace_events(v, 0)}
    assert "w-0" not in names and reqs[0].request_id in names

    # a trace written before ended_ns: the withdrawn records follow, in the file, the
    # records that closed before the stop — placed by that, they stay in A's probe too
    done = replace(reqs[0], request_id="done", arrival_ns=t0 + 1000,
                   token_times_ns=(t0 + 2000, stop - 1000), output_len=2)  # closed before
    before = [done, *(r for r in reqs if r.closed_ns < stop)]
    after = [r for r in reqs if r.closed_ns >= stop]
    legacy = [replace(w, ended_ns=0) for w in withdrawn]
    p2 = write_trace(tmp_path / "cap_old.jsonl", meta, requests=[*before, *legacy, *after],
                events=[EngineEvent("mark", 0, t0, "capacity:A:1"),
                        EngineEvent("mark", 1, stop, "capacity:A:stopped:itl_p99 broken"),
                        EngineEvent("mark", 2, t1, "capacity:B:1")])
    a2, b2 = build([p2]).views[0].segments
    assert {r.request_id for r in legacy} <= {r.request_id for r in a2.requests}
    assert len(b2.requests) == len(b_seg.requests)


def test_a_capacity_trace_cut_inside_a_probe_does_not_judge_that_probe_as_whole(tmp_path):
    """The recording stopped inside B's probe (no end record): that probe is shown as cut
    short and not met — judged on part of its requests it read 'meets yes' at an offered rate
    the command never measured (a tester's report); the probes before it stand. A trace that
    does not record its rules says that today's judge it."""
    from gpuchef.experiments.capacity import judging_rules, rules_note
    from gpuchef.report.data import build, capacity_probes

    src = read_trace(H200)
    arr = sorted(r.arrival_ns for r in src.requests)
    meta = {"command": "ab", "ab": {"capacity": True, "slo_spec": "itl_p99:5000ms"}}
    p = write_trace(tmp_path / "cap.jsonl", meta, events=[
        EngineEvent("mark", 0, arr[0], "capacity:A:1"), EngineEvent("mark", 1, arr[2],
                                                                    "capacity:B:1")])
    whole = capacity_probes(build([p]).views[0])[0]
    assert [x.met for x in whole] == [True, True]
    lines = p.read_text().splitlines(keepends=True)
    assert '"type":"end"' in lines[-1].replace(" ", "")
    p.write_text("".join(lines[:-1]))  # killed before the end record
    v = build([p]).views[0]
    cut = capacity_probes(v)[0]
    assert cut[0].met and not cut[1].met
    assert cut[1].fails[0].startswith("cut short: the trace ends inside this probe")
    assert "does not record the rules" in rules_note(v.meta["ab"].get("rules"))
    assert rules_note(judging_rules()) == ""
    assert "saturation_tolerance 0.1 then" in rules_note({**judging_rules(),
                                                         "saturation_tolerance": 0.1})
