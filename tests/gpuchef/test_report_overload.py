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

from gpuchef.cli import _register, cli
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
    from gpuchef.replay_cmd import build_app
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
