"""An attached trace (`top --attach --trace`): scrapes are their own record type (written and
read back exactly, a bad one skipped with its line number, old traces unchanged), and
`gpuchef report` and `gpuchef replay` work on it, labelling the derived series. The trace is
written here with the recorder from vLLM 0.24's real /metrics text at known times, so the
expected values come from the text, not from the code under test."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from gpuchef.engine_host.vocab.records import RequestRecord
from gpuchef.probes.recorder import TraceRecorder, read_trace
from gpuchef.probes.scrape import ScrapeSample, parse_metrics

DATA = Path(__file__).parents[1] / "probes" / "data"
LOAD = (DATA / "vllm_0.24_metrics_load.txt").read_text()
AFTER = (DATA / "vllm_0.24_metrics_after.txt").read_text()
URL = "http://10.0.0.7:8000"
T0 = 5_000_000_000_000  # monotonic ns of the first scrape


def _value(text: str, name: str) -> float:
    tot = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", line)
        if m:
            tot += float(m.group(1))
    return tot


def write_trace(path: Path, *, error_at: int | None = None) -> list[ScrapeSample]:
    """Scrapes every 250 ms for 4 s: LOAD for the first 2 s, AFTER from then on (one failed
    scrape at index ``error_at``), and 6 client requests."""
    rec = TraceRecorder(path, meta={"command": "top", "device": "remote",
                                    "model": {"name": "llama-3-8b", "random_weights": None},
                                    "source": {"kind": "attached", "urls": [URL]},
                                    "scrape_hz": 4.0, "percentiles": [50.0, 99.0],
                                    "load": {"desc": "random, 3.0 req/s"}})
    out = []
    for i in range(17):
        t = T0 + i * 250_000_000
        if i == error_at:
            s = ScrapeSample(t, URL + "/metrics", error="HTTP 500 Internal Server Error")
        else:
            s = parse_metrics(LOAD if i < 8 else AFTER, url=URL + "/metrics", t_ns=t)
        rec.record(s)
        out.append(s)
    for k in range(6):
        a = T0 + k * 500_000_000
        rec.record(RequestRecord(f"r{k}", a, 100, 4, tuple(a + (j + 1) * 40_000_000
                                                          for j in range(4)), "length",
                                 max_tokens=4))
    rec.close()
    return out


def test_scrapes_round_trip_exactly_and_a_bad_one_is_skipped(tmp_path):
    p = tmp_path / "a.jsonl"
    wrote = write_trace(p, error_at=3)
    t = read_trace(p)
    assert t.scrapes == wrote  # histograms with their +Inf buckets, the failed one too
    assert t.scrapes[3].error and not t.scrapes[3].values
    assert t.end["counts"]["scrape"] == 17 and t.meta["source"]["kind"] == "attached"
    assert t.steps == [] and len(t.requests) == 6 and not t.problems
    # a hand-broken scrape line: one problem naming its line, the rest is read
    lines = p.read_text().splitlines()
    d = json.loads(lines[2])
    d["hists"] = {"ttft": {"buckets": "oops"}}
    lines[2] = json.dumps(d)
    p.write_text("\n".join(lines) + "\n")
    t2 = read_trace(p)
    assert len(t2.scrapes) == 16 and len(t2.problems) == 1 and "line 3" in t2.problems[0]


def test_a_trace_without_scrapes_reads_as_before(tmp_path):
    p = tmp_path / "old.jsonl"
    with TraceRecorder(p, meta={"command": "bench"}) as rec:
        rec.record(RequestRecord("x", 1, 3, 1, (2,), "length"))
    t = read_trace(p)
    assert t.scrapes == [] and "scrape" not in t.end["counts"] and len(t.requests) == 1


def test_report_of_an_attached_trace_groups_the_clients_requests_and_labels_derived(tmp_path):
    from gpuchef.report.html import render
    from gpuchef.report.data import ATTACHED, build
    from gpuchef.report.scrape_plots import trace_deltas

    p = tmp_path / "a.jsonl"
    write_trace(p, error_at=3)
    data = build([p], percentiles=(50.0, 99.0))
    assert [g.segments[0].label for g in data.groups] == [ATTACHED]
    g = data.groups[0]
    assert g.metrics.completed == 6 and g.metrics.total_output == 24
    assert g.metrics.mean_ttft_ms == pytest.approx(40.0)
    assert URL in g.description
    # the derived series: the interval that crossed LOAD → AFTER has the counters' difference;
    # LOAD's stretch (7 requests running, no counter moving: no step ended) is merged into it,
    # as the live dashboard merges it (probes.scrape.DeltaStream), so it spans 0 → 2 s
    ds = trace_deltas(read_trace(p).scrapes)[URL + "/metrics"]
    cross = [d for d in ds if d.rates.get("prompt_tokens")]
    assert len(cross) == 1
    dp = _value(AFTER, "vllm:prompt_tokens_total") - _value(LOAD, "vllm:prompt_tokens_total")
    assert cross[0].rates["prompt_tokens"] * cross[0].dt_s == pytest.approx(dp)
    assert cross[0].dt_s == pytest.approx(2.0)
    page = render(data)
    assert "drawn from its /metrics — derived series" in page
    assert "no steps or requests recorded" not in page


def test_replay_of_an_attached_trace_shows_the_servers_values_at_the_position(tmp_path):
    from gpuchef.tui.replay import ReplayAttachScreen
    from gpuchef.commands.replay import build_app

    p = tmp_path / "a.jsonl"
    write_trace(p, error_at=12)
    app = build_app(str(p), paused=True, screenshot_dir=str(tmp_path))
    s = app.session

    async def go():
        async with app.run_test(size=(170, 50)) as pilot:
            await pilot.pause(0.3)
            assert isinstance(app.screen, ReplayAttachScreen)
            app.seek_to("1.1")  # inside the LOAD stretch
            await pilot.pause(1.2)
            shown = app.screen.shown[URL]
            # the gauges are the newest scrape's; no step ended yet (no counter moved while 7
            # requests ran), so no interval has closed and no rate is shown (DeltaStream)
            assert shown["running"] == _value(LOAD, "vllm:num_requests_running") == 7
            assert shown["prompt_tokens"] is None
            app.seek_to("2.05")  # just after the interval that crossed
            await pilot.pause(1.2)
            shown = app.screen.shown[URL]
            dp = _value(AFTER, "vllm:prompt_tokens_total") - _value(LOAD,
                                                                    "vllm:prompt_tokens_total")
            assert shown["prompt_tokens"] == pytest.approx(dp / 2.0)  # over the merged 0 → 2 s
            assert shown["running"] == 0
            app.seek_to("3.05")  # the failed scrape is the newest: its status line
            await pilot.pause(0.4)
            assert s.status_lines == [f"{URL}/metrics: HTTP 500 Internal Server Error"]
            header = str(app.screen.query_one("#a-header").render())
            assert "HTTP 500" in header and "random, 3.0 req/s (as recorded)" in header
            assert "read-only" in s.knobs_reason
            await pilot.press("q")

    asyncio.run(go())


def test_a_headless_hosted_trace_names_its_source_hosted(tmp_path):
    """Issue 14 item 4: every trace's meta says where its records come from — gpuchef's own
    engine ("hosted") or the attached servers' URLs."""
    from click.testing import CliRunner

    from gpuchef.commands.cli import _register, cli

    _register()
    t = tmp_path / "b.jsonl"
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--dataset",
                                 "random", "--num-prompts", "2", "--input-len", "8",
                                 "--output-len", "2", "--trace", str(t)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert read_trace(t).meta["source"] == {"kind": "hosted"}


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
