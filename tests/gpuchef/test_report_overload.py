"""A saturated run (Poisson arrivals at 200 req/s into the tiny CPU engine: requests queue for
seconds behind the running ones), recorded by `gpuchef bench --trace`, then `gpuchef report`
(HTML, CSV, Perfetto) and `gpuchef replay` (driven with Textual's Pilot) of it: every number
they show is checked against an independent computation, numpy over the trace's per-request
records as read by the project's reader (probes.recorder.read_trace), with vllm bench serve's
definitions (TTFT = first token − arrival, TPOT = (E2EL − TTFT)/(n − 1), ITL = each gap between
distinct token times, pooled; duration from the load's start to the last token; goodput = the
requests within every SLO / duration). Not the report's code path (probes.metrics)."""

from __future__ import annotations

import asyncio
import csv
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.probes.metrics import load_start_ns
from gpuchef.probes.recorder import read_trace

_register()
SLOS = {"ttft": 1000.0, "tpot": 250.0}


def run(*args):
    r = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def saturated(tmp_path_factory):
    d = tmp_path_factory.mktemp("overload")
    p = d / "t.jsonl.gz"
    run("bench", "--device", "cpu", "--model", "tiny", "--request-rate", "200", "--num-prompts",
        "32", "--input-len", "256", "--output-len", "24", "--max-num-seqs", "8",
        "--sample-hz", "0", "--trace", p)
    return p


def lat(reqs):
    """Per-request TTFT, E2EL, TPOT (ms) and the pooled ITLs, from the records alone."""
    ttft = np.array([(r.token_times_ns[0] - r.arrival_ns) / 1e6 for r in reqs])
    e2el = np.array([(r.token_times_ns[-1] - r.arrival_ns) / 1e6 for r in reqs])
    n = np.array([len(r.token_times_ns) for r in reqs])
    tpot = np.where(n > 1, (e2el - ttft) / np.maximum(n - 1, 1), np.nan)
    itl = [(b - a) / 1e6 for r in reqs for a, b in zip(sorted(set(r.token_times_ns)),
                                                      sorted(set(r.token_times_ns))[1:])]
    return ttft, e2el, tpot, np.array(itl)


def independent(path):
    tr = read_trace(path)
    reqs = [r for r in tr.requests if r.token_times_ns and r.finish_reason in ("length", "stop")]
    assert len(reqs) == 32
    ttft, e2el, tpot, itl = lat(reqs)
    dur = (max(r.token_times_ns[-1] for r in reqs) - load_start_ns(tr.events)) / 1e9
    n_out = sum(len(r.token_times_ns) for r in reqs)
    n_in = sum(r.prompt_len for r in reqs)
    want = {"Successful requests": len(reqs), "Benchmark duration (s)": dur,
            "Total input tokens": n_in, "Total generated tokens": n_out,
            "Request throughput (req/s)": len(reqs) / dur,
            "Output token throughput (tok/s)": n_out / dur,
            "Total token throughput (tok/s)": (n_in + n_out) / dur,
            "Request goodput (req/s)": int(((ttft <= SLOS["ttft"])
                                            & (np.nan_to_num(tpot) <= SLOS["tpot"])).sum()) / dur}
    for name, a in (("TTFT", ttft), ("TPOT", tpot[np.isfinite(tpot)]), ("ITL", itl),
                    ("E2EL", e2el)):
        want[f"Mean {name} (ms)"] = a.mean()
        want[f"Median {name} (ms)"] = np.median(a)
        for q in (50, 90, 99):
            want[f"P{q} {name} (ms)"] = np.percentile(a, q)
    return tr, reqs, want


class Rows(HTMLParser):
    """Every table row's cell texts."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th") and self.rows:
            self._cell = True
            self.rows[-1].append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = False

    def handle_data(self, data):
        if self._cell:
            self.rows[-1][-1] += data


def test_the_html_report_of_a_saturated_run_agrees_with_the_records(saturated, tmp_path):
    tr, reqs, want = independent(saturated)
    ttft = lat(reqs)[0]
    assert np.median(ttft) > 5 * np.median(lat(reqs)[2])  # it was saturated: requests queued
    out = tmp_path / "r.html"
    run("report", saturated, "-o", out, "--goodput", " ".join(f"{k}:{v:g}" for k, v in
                                                             SLOS.items()))
    p = Rows()
    p.feed(out.read_text(encoding="utf-8"))
    shown = {r[0].strip(): r[1].strip() for r in p.rows if len(r) == 2}
    assert 0 < want["Request goodput (req/s)"] < want["Request throughput (req/s)"]
    for k, v in want.items():
        assert k in shown, k
        got = float(shown[k].replace(",", ""))
        assert got == pytest.approx(v, abs=0.0051 if isinstance(v, float) else 0), (k, got, v)


def test_the_csv_and_perfetto_exports_agree_with_the_records(saturated, tmp_path):
    tr, reqs, _ = independent(saturated)
    run("report", saturated, "--format", "csv", "-o", tmp_path / "x")
    rows = {r["request_id"]: r for r in csv.DictReader(open(tmp_path / "x.requests.csv"))}
    assert set(rows) == {r.request_id for r in tr.requests}
    ttft, e2el, tpot, _ = lat(reqs)
    for r, a, b, c in zip(reqs, ttft, e2el, tpot):
        row = rows[r.request_id]
        assert float(row["ttft_ms"]) == pytest.approx(a, abs=1e-3)
        assert float(row["e2el_ms"]) == pytest.approx(b, abs=1e-3)
        assert float(row["tpot_ms"]) == pytest.approx(c, abs=1e-3)
        assert int(row["output_len"]) == len(r.token_times_ns)
    steps = list(csv.DictReader(open(tmp_path / "x.steps.csv")))
    assert [int(s["step"]) for s in steps] == [s.step for s in tr.steps]
    run("report", saturated, "--format", "perfetto", "-o", tmp_path / "p.json")
    ev = json.loads((tmp_path / "p.json").read_text())["traceEvents"]
    xs = sorted((e for e in ev if e["ph"] == "X" and e.get("cat") == "step"),
                key=lambda e: e["args"]["step"])
    assert [e["args"]["step"] for e in xs] == [s.step for s in tr.steps]
    for e, s in zip(xs, tr.steps):  # µs, as the Trace Event format has it
        assert e["dur"] == pytest.approx((s.t_end_ns - s.t_start_ns) / 1e3, abs=1e-3)


def test_replay_of_a_saturated_run_shows_the_window_the_records_give(saturated):
    """The replay's numbers panel at a position: the requests that finished in the stats
    window before it, their TTFT/TPOT/E2EL percentiles and throughput, as numpy gives them."""
    from gpuchef.commands.replay import build_app
    from gpuchef.tui.widgets.numbers import NumbersPanel

    tr, reqs, _ = independent(saturated)
    app = build_app(str(saturated), paused=True)
    s = app.session
    ends = sorted(r.token_times_ns[-1] for r in reqs)
    seen = {}

    async def go():
        async with app.run_test(size=(200, 50)) as pilot:
            for at_ns in (ends[len(ends) // 2] + 1, ends[-1] + 1):  # half done; all done
                app.seek_to(f"{(at_ns - s.start_ns) / 1e9:.3f}")
                want_pos = s.position_ns
                text = ""
                for _ in range(100):  # until the panel has redrawn at the new position
                    await pilot.pause(0.1)
                    text = str(app.screen.query_one(NumbersPanel).render())
                    done = re.search(r"done / failed\s+(\d+)", text)
                    w0 = want_pos - s.stats_window_s * 1e9
                    n = sum(1 for e in ends if w0 <= e < want_pos)
                    if done and int(done.group(1)) == n:
                        break
                seen[want_pos] = text
            await pilot.press("q")

    asyncio.run(go())
    assert len(seen) == 2
    for pos, text in seen.items():
        w0 = pos - s.stats_window_s * 1e9
        win = [r for r in reqs if w0 <= r.token_times_ns[-1] < pos]
        assert win
        ttft, e2el, tpot, _ = lat(win)
        dur = (pos - max(w0, s.start_ns)) / 1e9

        def shown(name):
            m = re.search(rf"{name}\s+([\d,.]+)(?:\s+([\d,.]+))?", text)
            return [float(x.replace(",", "")) for x in m.groups() if x]

        assert shown("done / failed") == [len(win), 0]
        for name, a in (("TTFT", ttft), ("TPOT", tpot), ("E2EL", e2el)):
            p50, p99 = shown(name)
            # the panel rounds: 4 significant figures at most
            assert p50 == pytest.approx(np.percentile(a, 50), rel=2e-3, abs=0.06), name
            assert p99 == pytest.approx(np.percentile(a, 99), rel=2e-3, abs=0.06), name
        assert shown("requests/s")[0] == pytest.approx(len(win) / dur, abs=0.006)


def test_a_mode_switch_under_overload_credits_each_mode_with_its_own_work(tmp_path):
    """`top` saturated (30 req/s of 128-token prompts into the CPU engine), the mode switched
    with `m` while requests queue: many that arrived under continuous finish under chunked
    (the load is then paused and the queue drained, so that no request is cut off at quit).
    The report's throughputs per mode are the work done while it was in force (requests whose
    last token fell in its stretch, tokens produced in it, per second of the stretch up to its
    last activity), as an A/B window's; it credited continuous with every request that arrived
    in it (34.8 req/s for a stretch that finished none, chunked 0). Latencies stay by arrival."""
    import io

    from rich.console import Console

    from gpuchef.report import build
    from gpuchef.commands.top import _build, top

    trace = tmp_path / "mode.jsonl"
    ctx = top.make_context("top", [
        "--device", "cpu", "--model", "tiny", "--dataset", "random", "--request-rate", "30",
        "--input-len", "128", "--output-len", "16", "--mode", "continuous", "--sample-hz", "1",
        "--trace", str(trace), "--screenshot-dir", str(tmp_path)])
    app = _build(ctx, dict(ctx.params), Console(file=io.StringIO()))
    s = app.session

    async def until(pilot, cond, limit_s=60.0):
        for _ in range(int(limit_s / 0.05)):
            if cond():
                return
            await pilot.pause(0.05)
        raise AssertionError("timed out")

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: s.host.step_id > 10 and s.load.state().submitted > 30)
            await pilot.press("m")
            await until(pilot, lambda: s.scheduler_config.mode == "chunked")
            step0 = s.host.step_id
            await until(pilot, lambda: s.host.step_id > step0 + 5)
            await pilot.press("p")  # the load stops; the queue drains under chunked
            await until(pilot, lambda: s.load.paused and not s.engine.has_unfinished(), limit_s=240)
            await pilot.press("q")

    try:
        asyncio.run(go())
    finally:
        s.close()
    tr = read_trace(trace)
    steps = sorted(tr.steps, key=lambda x: x.t_start_ns)
    cut = next(x.t_start_ns for a, x in zip(steps, steps[1:]) if x.mode != a.mode)
    start = min([r.entered_ns for r in tr.requests] + [steps[0].t_start_ns])
    end = max([x.t_end_ns for x in steps] + [t for r in tr.requests for t in r.token_times_ns])
    done = [r for r in tr.requests if r.token_times_ns and r.finish_reason in ("length", "stop")]
    late = [r for r in done if r.entered_ns < cut <= r.token_times_ns[-1]]
    assert late  # the point of the test: arrived under continuous, finished under chunked
    assert all(r.finish_reason in ("length", "stop") for r in tr.requests if r.token_times_ns)
    data = build([trace])
    groups = {g.label: g.metrics for g in data.groups}
    assert set(groups) == {"continuous", "chunked"}
    for mode, t0, t1 in (("continuous", start, cut), ("chunked", cut, end + 1)):
        m = groups[mode]
        acts = [t for r in tr.requests for t in r.token_times_ns if t0 <= t < t1] + \
            [x.t_end_ns for x in steps if t0 <= x.t_start_ns < t1]
        span = (max(acts) + 1 - t0) / 1e9
        fin = sum(1 for r in done if t0 <= r.token_times_ns[-1] < t1)
        toks = sum(1 for r in tr.requests for t in r.token_times_ns if t0 <= t < t1)
        computed = sum(x.num_prefill_tokens + x.num_decode_reqs for x in steps
                       if t0 <= x.t_start_ns < t1)
        assert m.duration_s == pytest.approx(span, rel=1e-6), mode
        assert m.request_throughput == pytest.approx(fin / span, rel=1e-6), mode
        assert m.output_throughput == pytest.approx(toks / span, rel=1e-6), mode
        assert m.total_token_throughput == pytest.approx(computed / span, rel=1e-6), mode
        arrived = [r for r in done if t0 <= r.entered_ns < t1]
        assert m.completed == len(arrived), mode  # counts and latencies: by arrival
        if arrived:
            assert m.mean_ttft_ms == pytest.approx(lat(arrived)[0].mean(), rel=1e-9), mode
    out = tmp_path / "r.html"
    run("report", trace, "-o", out)
    assert "The mode changed during the load" in out.read_text(encoding="utf-8")


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
