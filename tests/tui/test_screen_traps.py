"""Screen traps users met, each driven as a user would (Textual Pilot) over the static session:

* the header's load rate was the trace's hour-long mean ("≈2.8 req/s") while the first minutes
  arrive at a third of it: the rate arriving over the numbers' window is shown beside the mean,
  each labelled;
* `top --serve` driven by an outside load tool showed the paused internal load and nothing of
  the HTTP requests flowing: their arrival rate and how many are in flight are shown;
* the controls said "load on" beside the header's PAUSED;
* two busy/steps readings over different windows sat side by side unlabelled;
* at 160 columns the legends and the header were cut;
* the palette previewed "Set load rate to 0" and Enter then refused it;
* the help did not say how to close it;
* a replayed bench trace was titled "gpuchef top".
"""

from __future__ import annotations

import asyncio
import re
from bisect import bisect_right

import pytest
from tui_fakes import T0, StaticSession, capture_notes, palette, settle, simulate

from gpuchef.probes.recorder import TraceRecorder
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.commands import DashboardCommands
from gpuchef.tui.screens.help import HelpScreen
from gpuchef.tui.session import LoadState
from gpuchef.tui.widgets.controls import ControlsPanel
from gpuchef.tui.widgets.header import SessionHeader
from gpuchef.tui.widgets.numbers import NumbersPanel
from gpuchef.tui.widgets.waveforms import StepPanel

S = 1_000_000_000


def run(coro):
    return asyncio.run(coro)


def app_for(session, **kw):
    return GpuchefApp(session, window_s=60.0, show_ui_cost=False, **kw)


def header(app) -> str:
    return str(app.screen.query_one(SessionHeader).render())


def screen_rows(app) -> list[str]:
    """The screen as shown, one string per row (from Textual's own SVG export)."""
    import html

    svg = app.export_screenshot()
    rows: dict[int, dict[int, str]] = {}
    for m in re.finditer(r'<text class="terminal-[^"]*" x="([\d.]+)" y="[\d.]+" textLength='
                         r'"[\d.]+" clip-path="url\(#terminal-(?:\d+-)?line-(\d+)\)">([^<]*)'
                         r'</text>', svg):
        x, line, text = m.groups()
        col = round(float(x) / 12.2)
        r = rows.setdefault(int(line), {})
        for i, ch in enumerate(html.unescape(text).replace("\xa0", " ")):
            r[col + i] = ch
    return ["".join(r.get(i, " ") for i in range(max(r) + 1)) if r else ""
            for _, r in sorted(rows.items())]


def arrived_in_window(s: StaticSession) -> int:
    t0 = s.now - int(s.stats_window_s * S)
    return len(s.arrival_ns) - bisect_right(s.arrival_ns, t0)


# -- 8: what arrives, beside the trace's mean -----------------------------------------------------
def test_header_shows_the_rate_arriving_beside_the_trace_mean_each_labelled():
    s = StaticSession(gpu=True)
    a = app_for(s)

    async def go():
        async with a.run_test(size=(200, 60)) as pilot:
            await settle(pilot)
            return header(a)

    text = run(go())
    want = arrived_in_window(s) / s.stats_window_s
    assert f"arriving {want:.1f} req/s (last 30 s)" in text, text
    assert "trace mean 2.8 req/s" in text, text
    assert "≈" not in text  # the mean is no longer passed off as the rate


def _snap(tl, t):
    return tl.snapshot(t)


def test_arrival_meter_counts_each_source_and_the_http_requests_in_flight():
    """gpuchef's load from its sends, HTTP from its finished records plus what the engine's
    queues hold beyond gpuchef's own; over the window it has measured."""
    from gpuchef.engine_host.vocab.records import RequestRecord, StepRecord
    from gpuchef.tui.arrivals import HTTP_ID_PREFIX, ArrivalMeter

    tl = Timeline(origin_ns=T0, clock=lambda: T0)
    m = ArrivalMeter(30.0)

    def step(k, t, running, waiting):
        tl.add_step(StepRecord(k, t - 1000, t, 0.001, "chunked", 512, 256, 0, 1, 0, 0, running, 0,
                               running, waiting, 0, 0, 100))

    def done(rid, t):
        tl.add_request(RequestRecord(rid, t - S // 2, 10, 2, (t - S // 4, t), "length"))

    load = LoadState("trace", "azure-conv", 1.0, 2.0, submitted=10)
    step(0, T0 + S, 12, 0)  # 10 of gpuchef's + 2 HTTP in flight
    first = m.update(_snap(tl, T0 + S), load)
    assert first.http_in_flight == 2 and first.span_label() == "measuring"
    # 20 s later: gpuchef sent 40 more (30 finished), HTTP 10 more: 9 finished, 3 in flight
    for i in range(30):
        done(f"req-{i}", T0 + 2 * S + i * S // 2)
    for i in range(9):
        done(f"{HTTP_ID_PREFIX}{i}", T0 + 2 * S + i * S)
    step(1, T0 + 21 * S, 20 + 3, 0)
    r = m.update(_snap(tl, T0 + 21 * S), LoadState("trace", "azure-conv", 1.0, 2.0,
                                                      submitted=50))
    assert r.span_s == pytest.approx(20.0) and r.span_label() == "last 20 s"
    assert r.load_rate == pytest.approx(40 / 20) and r.http_in_flight == 3
    assert r.http_rate == pytest.approx((9 + 3 - 2) / 20) and r.http_seen


def test_http_id_prefix_is_the_servers():
    from gpuchef.tui.arrivals import HTTP_ID_PREFIX

    server = pytest.importorskip("gpuchef.serve.server")
    assert HTTP_ID_PREFIX == server.HTTP_ID_PREFIX


# -- 10: `top --serve` driven from outside: the HTTP load shows -----------------------------------
def test_serve_header_shows_the_http_load_flowing_beside_the_paused_internal_load():
    s = StaticSession(gpu=True, http=True)
    a = app_for(s)

    async def go():
        async with a.run_test(size=(200, 60)) as pilot:
            await settle(pilot)
            return header(a), a.arrivals

    text, got = run(go())
    last = s.timeline.snapshot(s.now).steps[-1]
    assert "internal load azure-conv ×0.50, loop — PAUSED" in text, text
    m = re.search(r"HTTP load arriving ([\d.]+) req/s \(last 30 s\) · (\d+) in flight", text)
    assert m, text
    assert int(m.group(2)) == last.num_running + last.num_waiting
    # what the simulation sent over HTTP in the window, to a request or so (a request that
    # arrived after the step before the window's start is counted from the next step on)
    assert float(m.group(1)) == pytest.approx(arrived_in_window(s) / 30, abs=0.15)


def test_controls_and_header_agree_on_the_load_state():
    s = StaticSession(gpu=True, http=True)  # the internal load paused
    a = app_for(s)

    async def go():
        async with a.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            panel = a.screen.query_one(ControlsPanel)
            labels = [str(w.render()) for w in panel.query("Label")]
            seen = {"paused": (header(a), labels, str(panel.query_one("#load-hint").render()))}
            await pilot.press("p")
            await settle(pilot)
            seen["on"] = (header(a), None, str(panel.query_one("#load-hint").render()))
            return seen

    seen = run(go())
    text, labels, hint = seen["paused"]
    assert "PAUSED" in text and "load on" not in labels and "PAUSED" in hint, (labels, hint)
    text, _, hint = seen["on"]
    assert "PAUSED" not in text and "PAUSED" not in hint and hint.startswith("on"), hint


# -- 9: every busy / steps figure says its window; nothing cut at 120, 160, 200 -------------------
def test_busy_and_steps_readings_say_their_window():
    a = app_for(StaticSession(gpu=True))

    async def go():
        async with a.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            step = a.screen.query_one(StepPanel)
            title = "".join(seg.text for seg in step.render_line(0))
            nums = str(a.screen.query_one(NumbersPanel).render())
            return title, nums, step._frame.grid.bin_s

    title, nums, bin_s = run(go())
    # the readouts are over the newest complete columns spanning ~2 s
    span = max(1, round(2.0 / bin_s)) * bin_s
    assert title.rstrip().endswith(f"last {span:.1f} s"), title
    engine = next(line for line in nums.splitlines() if line.startswith("engine"))
    assert engine.rstrip().endswith("last 30 s"), engine


#: every legend entry, whole, in its long or short name
LEGENDS = {"Step waveform": (r"■ prefill(-only)?", r"■ mixed", r"■ decode(-only step)?"),
           "Batch composition": (r"■ prefill", r"■ decode", r"■ ╌ (token )?budget"),
           "Queue and KV cache": (r"■ running", r"■ waiting", r"■ × preempt(ed)?", r"■ KV")}


@pytest.mark.parametrize("size", [(120, 40), (160, 48), (200, 60)])
def test_legends_and_header_are_whole_at(size):
    a = app_for(StaticSession(gpu=False))  # the CPU note makes the longest header

    async def go():
        async with a.run_test(size=size) as pilot:
            await settle(pilot)
            return screen_rows(a), a.screen.query_one(SessionHeader)

    rows, hdr = run(go())
    shown = "\n".join(rows)
    assert "…" not in shown, shown  # nothing cropped with an ellipsis
    for title, names in LEGENDS.items():
        row = next(r for r in rows if f"▍{title}" in r)
        legend = row.split("▏")[0]  # the side panel's border ends the charts' row
        for name in names:
            assert re.search(name + r"(\s|$)", legend), (name, legend)
    # the header's items all show: the note and the load's figures whole
    head = "\n".join(rows[:hdr.lines])
    for part in ("CPU defaults: trace ×0.5, prompts ≤1024", "trace mean 2.8 req/s",
                 "trace off (e: write one)", "partial 1"):
        assert part in head, (part, head)


# -- 10: the palette previews what Enter does -----------------------------------------------------
def hits_for(app, queries, size=(160, 48)):
    out = {}

    async def go():
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            provider = DashboardCommands(app.screen)
            for q in queries:
                out[q] = [str(h.match_display) async for h in provider.search(q)]

    run(go())
    return out


def test_palette_previews_the_refusal_enter_would_give():
    s = StaticSession(gpu=True)
    got = hits_for(app_for(s), ["rate 0", "rate 2", "rate 1e9"])
    msg = "trace speed (×) '0' is out of range: allowed (0, 10000]"
    assert got["rate 0"][0] == f"⚠ {msg}", got["rate 0"]
    assert not any(t.startswith("Set load rate to") for t in got["rate 0"])
    assert got["rate 2"] == ["Set load rate to ×2 (trace speed)"]
    assert got["rate 1e9"][0].startswith("⚠ trace speed (×) '1e9' is out of range")
    # and Enter on it says the same, changing nothing
    a = app_for(s)
    notes = capture_notes(a)

    async def go():
        async with a.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            await palette(pilot, "rate 0")

    run(go())
    assert msg in notes and s.load.calls == [] and s.load.rate == 0.5


def test_palette_previews_a_knob_refused_while_an_ab_run_sets_the_knobs():
    s = StaticSession(gpu=True, seconds=30, ab_window_s=10)  # an A/B run is going
    got = hits_for(app_for(s), ["budget 512"])
    assert got["budget 512"][0] == "⚠ an A/B run sets the knobs now: stop it first (x)"


# -- 10: the help says how to close it ------------------------------------------------------------
def test_help_says_esc_closes_it_where_it_opens():
    a = app_for(StaticSession(gpu=False))

    async def go():
        async with a.run_test(size=(160, 48)) as pilot:
            await settle(pilot)
            await pilot.press("question_mark")
            await pilot.pause(0.3)
            assert isinstance(a.screen, HelpScreen)
            first = "\n".join(screen_rows(a))
            await pilot.press("end")  # scrolled to the end, it still says so
            await pilot.pause(0.3)
            last = "\n".join(screen_rows(a))
            await pilot.press("escape")
            await pilot.pause(0.2)
            return first, last, isinstance(a.screen, HelpScreen)

    first, last, still = run(go())
    assert "Esc closes" in first and "Esc closes" in last and not still


# -- 10: a replayed trace is titled after its command ---------------------------------------------
def test_replay_of_a_bench_trace_is_titled_after_it(tmp_path):
    from gpuchef.commands.replay import build_app

    tl = Timeline(origin_ns=T0, clock=lambda: T0)
    end = simulate(tl, start_ns=T0, seconds=12.0, mode_at=[(0, "continuous")], gpu=False)
    snap = tl.snapshot(end)
    path = tmp_path / "run.jsonl"
    rec = TraceRecorder(path, meta={"command": "bench", "device": "cpu",
                                    "attention_backend": "reference",
                                    "model": {"name": "tiny", "random_weights": True},
                                    "workload": {"dataset": "random", "request_rate": 3.0}})
    for r in (*snap.steps, *snap.events, *snap.requests):
        rec.record(r)
    rec.close()
    app = build_app(str(path), paused=True, screenshot_dir=str(tmp_path))

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(0.5)
            return header(app), app.title

    text, title = run(go())
    assert title == "gpuchef replay — bench trace run.jsonl"
    assert text.startswith(" gpuchef replay — bench trace run.jsonl ") and "gpuchef top" not in text
