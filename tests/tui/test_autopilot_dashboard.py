"""The autopilot on the dashboard, driven as a user would (Pilot) over the real engine (tiny,
CPU) under a load it cannot keep up with: ``b``, the controls' field and the palette turn it on,
change its targets and turn it off (each a knob event, the engine's config follows); bad targets
are refused with one message and change nothing; what the batch composition and the step-time
panel draw is what the StepRecords say (each column checked against the records, worked out
here by a plain loop)."""

import asyncio
import math
import time

import numpy as np
import pytest
from textual.command import CommandPalette
from textual.widgets import Input
from tui_fakes import capture_notes

from gpuchef.engine_host.autopilot import FALLBACK, INFEASIBLE, LEARNING, STEERING
from gpuchef.engine_host.vocab.config import (AUTO_BUDGET, CacheConfig, EngineConfig,
                                              SchedulerConfig, parse_value)
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.vocab.workload import WorkloadConfig
from gpuchef.sessions.live import LiveSession
from gpuchef.tui.app import DEFAULT_AUTO_BUDGET as DEFAULT_TYPED
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.widgets.waveforms import BatchPanel, StepTimePanel

SIZE = (160, 48)
DEFAULT_AUTO_BUDGET = parse_value(AUTO_BUDGET, DEFAULT_TYPED)  # canonical: itl_p99:50ms,ttft_p99:2000ms
START = SchedulerConfig(mode="chunked", max_num_batched_tokens=256, max_num_seqs=256,
                        long_prefill_token_threshold=0, max_num_partial_prefills=1)


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=512,
                                  cache=CacheConfig(num_gpu_blocks=2048)))


def make_app(engine, *, rate, start=START, input_len=48, output_len=12, num_prompts=100):
    engine.set_scheduler_config(start)
    wcfg = WorkloadConfig(dataset="random", request_rate=rate, input_len=input_len,
                          range_ratio=0.5, output_len=output_len, num_prompts=num_prompts,
                          vocab_size=engine.model_config.vocab_size,
                          max_model_len=engine.max_model_len)
    session = LiveSession(engine, wcfg, host_probe=False, sample_hz=10)
    app = GpuchefApp(session, window_s=10, show_ui_cost=False)
    app.notes = capture_notes(app)
    session.start()
    return app, session


async def until(pilot, pred, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        await pilot.pause(0.05)
    return pred()


async def palette(pilot, typed: str) -> None:
    """Open the command palette, put ``typed`` in its field and run the first hit (typed whole:
    key by key, each key's search made a 30-key command take seconds on a loaded machine)."""
    await pilot.press("ctrl+p")
    assert await until(pilot, lambda: isinstance(pilot.app.screen, CommandPalette))
    pilot.app.screen.query_one(Input).value = typed
    await pilot.pause(0.5)
    await pilot.press("enter")
    await pilot.pause(0.3)


def knob_events(s):
    return [e for e in s.timeline.snapshot().events if e.kind == "knob" and e.name == "auto_budget"]


async def reaches(pilot, s, value):
    """A step at or after now runs with ``auto_budget == value``, as do all later ones."""
    sid = s.host.step_id

    def ok():
        later = [x for x in s.timeline.snapshot().steps if x.step >= sid]
        hit = [i for i, x in enumerate(later) if x.auto_budget == value]
        return bool(hit) and all(x.auto_budget == value for x in later[hit[0]:])

    return await until(pilot, ok)


def test_toggle_by_key_field_and_palette_and_bad_targets_are_refused(engine):
    app, s = make_app(engine, rate=25.0)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: len(s.timeline.snapshot().steps) > 3)
            assert not app.screen.query_one(StepTimePanel).display  # off: no step-time panel
            # b: on with the default targets, recorded as a knob change
            await pilot.press("b")
            assert await reaches(pilot, s, DEFAULT_AUTO_BUDGET)
            assert s.scheduler_config.auto_budget == DEFAULT_AUTO_BUDGET
            assert engine.scheduler_config.auto_budget == DEFAULT_AUTO_BUDGET  # the engine's own
            assert engine.scheduler.autopilot is not None
            ev = knob_events(s)
            assert [(e.old, e.new) for e in ev] == [("", DEFAULT_AUTO_BUDGET)]
            first = next(x for x in s.timeline.snapshot().steps if x.step == ev[0].step)
            assert first.auto_budget == DEFAULT_AUTO_BUDGET  # in force from the event's step
            assert await until(pilot, lambda: app.screen.query_one(StepTimePanel).display)
            assert await until(pilot, lambda: app.screen.query_one("#auto-budget").value
                               == DEFAULT_AUTO_BUDGET)
            # the palette: new targets (canonical form in the config and the event)
            await palette(pilot, "auto itl_p50:80ms")
            assert await reaches(pilot, s, "itl_p50:80ms")
            assert knob_events(s)[-1].old == DEFAULT_AUTO_BUDGET
            # the controls' field
            field = app.screen.query_one("#auto-budget")
            field.focus()
            field.value = "itl_p99:0.1s,ttft_p99:3s"
            await pilot.press("enter")
            assert await reaches(pilot, s, "itl_p99:100ms,ttft_p99:3000ms")

            # bad targets: one message naming the value, nothing changes, the session goes on
            before = s.scheduler_config
            n_events = len([e for e in s.timeline.snapshot().events if e.kind in ("knob", "mode")])
            for how, text, msg in (
                    ("field", "itl_p99:0ms", "out of range: allowed [1 ms, 600 s]"),
                    ("field", "itl_p99:-5ms", "is negative"),
                    ("palette", "fast please", "is not METRIC_STAT:DURATION"),
                    ("palette", "itl_p99:abc", "'abc' is not a duration"),
                    ("palette", "itl_p99:100ms,ttft_p99:50ms", "below one step")):
                n_notes = len(app.notes)
                if how == "field":
                    field.focus()
                    field.value = text
                    assert field.has_class("-invalid")
                    await pilot.press("enter")
                    await pilot.pause(0.3)
                else:
                    await palette(pilot, f"auto {text}")
                new = app.notes[n_notes:]
                assert sum(msg in n for n in new) == 1, (text, new)
                assert s.scheduler_config == before
            await pilot.pause(0.3)
            assert len([e for e in s.timeline.snapshot().events
                        if e.kind in ("knob", "mode")]) == n_events
            assert field.value == "itl_p99:100ms,ttft_p99:3000ms"  # back to what is in force
            assert s.engine_error is None
            # b again: off; b once more: on with the last targets in force, not the default
            await pilot.press("b")
            assert await reaches(pilot, s, "")
            assert knob_events(s)[-1].new == ""
            await pilot.press("b")
            assert await reaches(pilot, s, "itl_p99:100ms,ttft_p99:3000ms")
            await palette(pilot, "auto off")
            assert await reaches(pilot, s, "")
            assert engine.scheduler_config.auto_budget == ""
            assert [e.new for e in knob_events(s)] == [
                DEFAULT_AUTO_BUDGET, "itl_p50:80ms", "itl_p99:100ms,ttft_p99:3000ms", "",
                "itl_p99:100ms,ttft_p99:3000ms", ""]

    try:
        asyncio.run(go())
    finally:
        s.close()


def _columns(steps, grid):
    """Per column of ``grid``, worked out by a plain loop: the allowance of the largest step
    (by tokens; the later one on a tie) ending in it, and the mean actual and predicted step
    time of the steps ending in it (predicted: of those that have one)."""
    out = {}
    for c in range(grid.cols):
        a, b = grid.t0_ns + c * grid.bin_ns, grid.t0_ns + (c + 1) * grid.bin_ns
        ended = [x for x in steps if a <= x.t_end_ns < b]
        if not ended:
            continue
        best = None
        for x in ended:
            if best is None or x.num_tokens >= best.num_tokens:
                best = x
        pred = [x.predicted_ms for x in ended if x.predicted_ms >= 0]
        out[c] = (best.prefill_allowance, sum(x.wall_ms for x in ended) / len(ended),
                  sum(pred) / len(pred) if pred else None)
    return out


def test_drawn_allowance_and_step_times_are_the_records_under_overload(engine):
    # prompts of ~100-300 tokens at 40 req/s against a 256-token budget: the queue grows
    start = START.with_changes(auto_budget="itl_p99:40ms,ttft_p99:2s")
    app, s = make_app(engine, rate=40.0, start=start, input_len=200, output_len=16,
                      num_prompts=400)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            # past the model's 24 steps, with predictions drawn
            assert await until(pilot, lambda: sum(x.predicted_ms >= 0 for x in
                                                  s.timeline.snapshot().steps) > 40, 60)
            s.pause_engine(True)  # freeze, so that the frame and the records are the same steps
            await pilot.pause(0.5)
            app.screen.tick(force=True)
            await pilot.pause(0.2)
            batch = app.screen.query_one(BatchPanel)
            panel = app.screen.query_one(StepTimePanel)
            f = batch._frame
            assert panel.display and panel._frame is f
            steps = s.timeline.snapshot().steps
            inwin = [x for x in steps if f.grid.t0_ns <= x.t_end_ns < f.grid.t1_ns]
            # overloaded, not idle: requests waited through the window
            assert sum(x.num_waiting > 0 for x in inwin) > len(inwin) / 2
            assert all(x.auto_budget == "itl_p99:40ms,ttft_p99:2000ms" for x in inwin)
            want = _columns(steps, f.grid)
            assert len(want) > 10
            for c in range(f.grid.cols):
                if c not in want:
                    assert math.isnan(f.allowance[c]) and math.isnan(f.step_ms[c])
                    continue
                allow, wall, pred = want[c]
                assert f.allowance[c] == allow if allow >= 0 else math.isnan(f.allowance[c])
                assert f.step_ms[c] == pytest.approx(wall, rel=1e-9)
                if pred is None:
                    assert math.isnan(f.predicted_ms[c])
                else:
                    assert f.predicted_ms[c] == pytest.approx(pred, rel=1e-9)
            assert sum(want[c][0] >= 0 for c in want) > 10  # allowances were drawn
            # the readouts: the newest record's allowance, prediction, fit error and status
            last = steps[-1]
            ap = f.autopilot
            assert (ap.allowance, ap.predicted_ms, ap.fit_error, ap.state) == (
                last.prefill_allowance, last.predicted_ms, last.fit_error, last.autopilot_state)
            assert last.autopilot_state in (LEARNING, FALLBACK, STEERING, INFEASIBLE)
            assert last.fit_error >= 0
            title = "".join(seg.text for seg in panel.render_line(0))
            err = f"{last.fit_error * 100:.0f} %"
            assert err in title, title
            assert {STEERING: f"{STEERING} {last.auto_budget}: ", FALLBACK: "fallback: allowance",
                    LEARNING: "learning: not fitted",
                    INFEASIBLE: "infeasible: decodes alone"}[last.autopilot_state] in title
            btitle = "".join(seg.text for seg in batch.render_line(0))
            assert "━ autopilot allowance" in btitle, btitle
            right = "".join(seg.text for y in range(batch.size.height)
                            for seg in batch.render_line(y))
            assert "allow" in right

    try:
        asyncio.run(go())
    finally:
        s.close()


@pytest.mark.parametrize("state, fit_error, says", [
    ("steering", 0.07, ["steering itl_p99:50ms: fitted, err 7 %"]),
    ("fallback", 0.62, ["fallback: allowance 64 of budget 2048 set by the measured ITL",
                         "err 62 %", "≤ 30%"]),
    ("infeasible", 0.04, ["infeasible: decodes alone over ITL 50 ms", "static budget 2048 for TTFT",
                          "err 4 %"]),
    ("learning", -1.0, ["learning: not fitted", "err –", "budget 2048"]),
    ("", -1.0, ["off: the static budget"]),
])
def test_status_line_names_the_state_the_budget_and_the_error(state, fit_error, says):
    from gpuchef.engine_host.vocab.records import StepRecord
    from gpuchef.tui.plotdata import AutopilotStatus

    rec = StepRecord(1, 0, 10**6, 1.0, "chunked", 2048, 256, 0, 1, 1, 64, 2, 0, 3, 0, 0, 5, 100,
                     auto_budget="itl_p99:50ms" if state else "", autopilot_state=state,
                     fit_error=fit_error, prefill_allowance=64 if state else -1)
    st = AutopilotStatus.of(rec)
    for s in says:
        assert s in st.line(), (s, st.line())
    if state:
        assert st.itl_target_ms == 50.0
    else:
        assert math.isnan(st.itl_target_ms)  # off: no target line


@pytest.mark.parametrize("itls, says", [
    ([(40.0, 60), (45.0, 30), (49.0, 10)], "P99 ITL 49.0 ≤ 50 ms: kept"),
    ([(40.0, 50), (45.0, 45), (70.0, 5)], "P99 ITL 70.0 > 50 ms: missed"),
])
def test_status_line_says_whether_the_window_kept_the_itl_promise(itls, says):
    # the window's steered steps, each ITL once per decode row, against the target; steps not
    # steered (here an infeasible one with a 900 ms ITL) and other targets' steps are not in it
    from gpuchef.engine_host.vocab.records import StepRecord
    from gpuchef.tui.plotdata import AutopilotStatus

    def rec(i, itl, rows, state="steering", spec="itl_p99:50ms"):
        return StepRecord(i, i * 10**7, i * 10**7 + 10**6, 1.0, "chunked", 2048, 256, 0, 1, 1,
                          64, rows, 0, 3, 0, 0, 5, 100, auto_budget=spec,
                          autopilot_state=state, fit_error=0.07, prefill_allowance=64,
                          itl_ms=itl)

    window = [rec(i, itl, rows) for i, (itl, rows) in enumerate(itls)]
    window += [rec(10, 900.0, 50, state="infeasible"), rec(11, 900.0, 50, spec="itl_p99:80ms")]
    st = AutopilotStatus.of(window[0], window)
    pooled = [itl for itl, rows in itls for _ in range(rows)]  # one ITL per decode token
    assert st.achieved_ms == pytest.approx(float(np.percentile(pooled, 99)))
    assert says in st.line(), st.line()
    assert st.line().startswith("steering itl_p99:50ms: ") and st.line().endswith("err 7 %")


def test_palette_ab_takes_the_autopilot_with_its_comma():
    from gpuchef.engine_host.vocab.errors import ConfigError
    from gpuchef.tui.commands import parse_ab

    a, b, w = parse_ab("budget=1024 vs auto=itl_p99:50ms,ttft_p99:2s, budget=2048 window=5")
    assert a == {"max_num_batched_tokens": 1024}
    assert b == {AUTO_BUDGET: parse_value(AUTO_BUDGET, "itl_p99:50ms,ttft_p99:2s"),
                 "max_num_batched_tokens": 2048} and w == 5
    a, b, _ = parse_ab("auto_budget=itl_p50:80ms vs auto=off")
    assert a == {AUTO_BUDGET: "itl_p50:80ms"} and b == {AUTO_BUDGET: ""}
    for bad, msg in (("auto=itl_p99:0ms vs budget=512", "out of range"),
                     ("auto=itl_p99:100ms,ttft_p99:50ms vs budget=512", "below one step")):
        with pytest.raises(ConfigError, match=msg):
            parse_ab(bad)


def test_infeasible_target_shows_its_status_line(engine, monkeypatch):
    # the fit hears a known step time (CPU timing on a shared machine is not one) whose decodes
    # alone take 6 ms + 0.1 ms per decode: over the 5 ms ITL target whatever the allowance
    sched = engine.scheduler
    sched.autopilot = None  # a fresh controller: the earlier tests fitted this one to the CPU
    orig = sched.observe
    monkeypatch.setattr(sched, "observe", lambda out, ms, itl: orig(
        out, 6.0 + 0.5 * bool(out.prefills) + 0.1 * len(out.decodes)
        + 0.01 * out.num_prefill_tokens))
    start = START.with_changes(auto_budget="itl_p99:5ms")
    app, s = make_app(engine, rate=40.0, start=start, input_len=200, output_len=16,
                      num_prompts=400)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: any(
                x.autopilot_state == INFEASIBLE for x in s.timeline.snapshot().steps[-3:]), 60)
            s.pause_engine(True)
            await pilot.pause(0.5)
            app.screen.tick(force=True)
            await pilot.pause(0.2)
            last = s.timeline.snapshot().steps[-1]
            assert last.autopilot_state == INFEASIBLE
            assert last.prefill_allowance == 256 - last.num_decode_reqs  # the static budget
            panel = app.screen.query_one(StepTimePanel)
            assert panel.display and panel._frame.autopilot.state == INFEASIBLE
            title = "".join(seg.text for seg in panel.render_line(0))
            want = (f"infeasible: decodes alone over ITL 5 ms; static budget 256 for TTFT (err "
                    f"{last.fit_error * 100:.0f} %)")
            assert want in title, title
            warned = [e for e in s.timeline.snapshot().events
                      if e.name == "auto_budget" and "before any prefill" in e.message]
            assert warned and warned[0].kind == "warning"

    try:
        asyncio.run(go())
    finally:
        s.close()
        sched.autopilot = None  # the next test's controller is not this one's


def test_switched_to_continuous_the_panel_says_the_autopilot_is_idle(engine):
    """A tester pressed b, then m: the title read 'no chunked step yet' though chunked steps had
    steered; in continuous mode the autopilot chooses nothing, and the title says so."""
    start = START.with_changes(auto_budget="itl_p99:200ms")
    app, s = make_app(engine, rate=20.0, start=start, num_prompts=300)

    async def go():
        async with app.run_test(size=SIZE) as pilot:
            assert await until(pilot, lambda: any(
                x.mode == "chunked" and x.prefill_allowance >= 0
                for x in s.timeline.snapshot().steps), 30)
            await pilot.press("m")
            assert await until(pilot, lambda: s.timeline.snapshot().steps[-1].mode ==
                               "continuous", 30)
            app.screen.tick(force=True)
            await pilot.pause(0.2)
            panel = app.screen.query_one(StepTimePanel)
            title = "".join(seg.text for seg in panel.render_line(0))
            assert "itl_p99:200ms: idle in continuous mode" in title, title
            assert "no chunked step yet" not in title

    try:
        asyncio.run(go())
    finally:
        s.close()


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
