"""`gpuchef report` on recorded traces: the HTML parses, embeds every plot and fetches nothing;
the Perfetto JSON loads with nested slices, counters and instants; the CSVs have the right
headers and rows; a trace of several GPUs gets a per-GPU figure, table and CSV; a corrupt or
cut-short trace gives warnings and still a report; a file that is not a trace gives one clear
error; -o refuses to overwrite any gpuchef trace."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.probes.nvml import GpuSample
from gpuchef.probes.recorder import TraceRecorder, read_trace
from gpuchef.report.csvs import GPU_SAMPLE_HEADER, REQUEST_HEADER, STEP_HEADER

_register()

DATA = Path(__file__).parent / "data"
H200 = DATA / "h200_chunked_1s.jsonl"
TINY = ["--device", "cpu", "--model", "tiny", "--input-len", "96", "--output-len", "8",
        "--range-ratio", "0.5"]


def run(*args, ok=True):
    r = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    if ok:
        assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """A `bench` trace (one mode) and an interleaved `ab` trace (A/B windows, knob and mode
    events, marks), both from the tiny model on the CPU."""
    d = tmp_path_factory.mktemp("traces")
    bench = d / "bench.jsonl"
    run("bench", "--device", "cpu", "--model", "tiny", "--dataset", "azure-conv", "--num-prompts",
        "8", "--max-input-len", "96", "--max-output-len", "8", "--trace-speed", "8", "--mode",
        "continuous", "--trace", bench, "--result-json", d / "bench.json")
    ab = d / "ab.jsonl"
    run("ab", *TINY, "--num-prompts", "20", "--request-rate", "10", "--interleave", "--window",
        "0.5", "--b", "mode=chunked,max_num_batched_tokens=32", "--trace", ab)
    return {"bench": bench, "ab": ab, "dir": d}


class Page(HTMLParser):
    """Collects what the tests check: tags, ids, figures and the svgs inside them, URLs."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.figures: list[str] = []
        self.svg_in_figure = 0
        self.urls: list[str] = []
        self._fig: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if "id" in a:
            self.ids.add(a["id"])
        for k in ("src", "href", "xlink:href", "action", "data"):
            if k in a and a[k] is not None:
                self.urls.append(a[k])
        if tag == "figure" and "plot" in (a.get("class") or ""):
            self._fig = a["id"]
            self.figures.append(a["id"])
        if tag == "svg" and self._fig:
            self.svg_in_figure += 1

    def handle_endtag(self, tag):
        if tag == "figure":
            self._fig = None


def parse(path: Path) -> tuple[Page, str]:
    text = path.read_text(encoding="utf-8")
    p = Page()
    p.feed(text)
    p.close()
    return p, text


def assert_self_contained(page: Page, text: str) -> None:
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags
    assert "img" not in page.tags or all(u.startswith("data:") for u in page.urls if u)
    for u in page.urls:  # only in-page references (#id) or inline data
        assert u.startswith("#") or u.startswith("data:"), u
    assert not re.search(r"https?://", text), re.search(r".{40}https?://.{40}", text)
    assert "@import" not in text and not re.search(r"url\((?!#|data:)", text)


def test_html_report_of_a_bench_trace(traces, tmp_path):
    out = tmp_path / "r.html"
    r = run("report", traces["bench"], "-o", out)
    assert "wrote" in r.output and "warning" not in r.output
    page, text = parse(out)
    for sid in ("summary", "run", "waveforms", "closeups", "composition", "latency", "results"):
        assert sid in page.ids, sid
    assert "windows" not in page.ids  # no A/B marks in a bench trace
    want = {"fig-waveforms-bench", "fig-closeups", "fig-composition", "fig-latency"}
    assert set(page.figures) == want
    assert page.svg_in_figure == len(want)  # every plot embedded inline
    assert text.count("<svg") == len(want)
    assert_self_contained(page, text)
    # the results table is the bench block: same numbers as `probes.metrics.summarize`
    assert "Successful requests" in text and "P99 ITL (ms)" in text
    assert "tiny (random weights)" in text and "continuous" in text


def test_report_numbers_are_the_bench_numbers(traces):
    """A one-mode bench trace replayed through the report gives the block bench printed."""
    from gpuchef.report import build

    want = json.loads((traces["dir"] / "bench.json").read_text())
    (g,) = build([traces["bench"]], percentiles=(50, 99)).groups
    got = g.metrics.to_dict()
    for k in ("completed", "total_input_tokens", "total_output_tokens", "num_steps",
              "num_mixed_steps", "num_preemptions"):
        assert got[k] == want[k], k
    for k in ("p99_ttft_ms", "median_itl_ms", "mean_tpot_ms", "p99_e2el_ms", "busy_fraction"):
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
    # the trace records the load's start (probes.metrics.LOAD_START): bench's duration exactly
    assert got["duration"] == pytest.approx(want["duration"], rel=1e-12)


def test_report_of_a_random_rate_bench_has_bench_duration_and_throughputs(tmp_path):
    """Poisson arrivals at 1 req/s: the first arrival is ~1 s after the load's start, which
    vLLM's (and bench's) duration counts; the report's must too (it once counted from the first
    arrival: 7.04 s and 1.14 req/s against bench's 8.06 s and 0.99 req/s)."""
    from gpuchef.probes.metrics import load_start_ns
    from gpuchef.report import build

    tr, js = tmp_path / "slow.jsonl", tmp_path / "slow.json"
    run("bench", "--device", "cpu", "--model", "tiny", "--num-prompts", "6", "--input-len", "16",
        "--output-len", "4", "--request-rate", "1", "--sample-hz", "0", "--trace", tr,
        "--result-json", js)
    want = json.loads(js.read_text())
    t = read_trace(tr)
    first = min(r.arrival_ns for r in t.requests)
    assert load_start_ns(t.events) is not None and load_start_ns(t.events) < first - 1e6
    data = build([tr], percentiles=(50, 99))
    (g,) = data.groups
    got = g.metrics.to_dict()
    assert not data.problems
    for k in ("duration", "request_throughput", "output_throughput", "total_token_throughput"):
        assert got[k] == pytest.approx(want[k], rel=1e-12), k
    # the HTML's results table prints them as bench did
    out = tmp_path / "slow.html"
    run("report", tr, "-o", out)
    text = out.read_text(encoding="utf-8")
    assert f"{want['request_throughput']:.2f}" in text and f"{want['duration']:.2f}" in text


def test_bench_trace_without_load_start_falls_back_with_a_note(traces, tmp_path):
    """A bench trace written before the load-start event: the old rule (first arrival), said."""
    from gpuchef.report import build

    old = tmp_path / "old.jsonl"
    old.write_text("".join(ln for ln in traces["bench"].read_text().splitlines(True)
                           if '"kind":"load"' not in ln))
    data = build([old], percentiles=(50, 99))
    assert any("no load-start event" in p and "first arrival" in p for p in data.problems)
    t = read_trace(old)
    first = min(r.arrival_ns for r in t.requests)
    last = max(r.token_times_ns[-1] for r in t.requests if r.token_times_ns)
    assert data.groups[0].metrics.duration_s == pytest.approx((last - first) / 1e9, rel=1e-9)


def test_ab_segments_of_several_dashboard_runs():
    from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord
    from gpuchef.report.data import _assign, ab_segments

    ev = [EngineEvent("mark", 0, t, n) for t, n in
          ((100, "ab:1:A:1"), (200, "ab:1:B:1"), (300, "ab:1:end"), (500, "ab:2:A:1"),
           (600, "ab:2:end"))]
    segs = ab_segments(ev, 1000)
    assert [(s.label, s.name, s.t0_ns, s.t1_ns) for s in segs] == [
        ("A (run 1)", "A1/1", 100, 200), ("B (run 1)", "B1/1", 200, 300),
        ("A (run 2)", "A1/2", 500, 600)]
    reqs = [RequestRecord(f"r{t}", t, 1, 1, (t + 1,), "length") for t in (50, 150, 250, 350, 550)]
    _assign(segs, reqs, [])
    # before, between and after the runs: in no window
    assert [[r.request_id for r in s.requests] for s in segs] == [["r150"], ["r250"], ["r550"]]


def test_html_report_of_an_ab_trace_marks_windows(traces, tmp_path):
    out = tmp_path / "ab.html"
    run("report", traces["ab"], "-o", out)
    page, text = parse(out)
    assert "windows" in page.ids
    assert "fig-abwindows-ab" in page.figures
    assert page.svg_in_figure == len(page.figures) == 5
    assert "A: mode=continuous" in text and "B: mode=chunked, max_num_batched_tokens=32" in text
    assert re.search(r"<td>A1</td>", text) and re.search(r"<td>B1</td>", text)
    assert_self_contained(page, text)


def test_html_report_compares_several_traces_with_gpu_panels(traces, tmp_path):
    out = tmp_path / "cmp.html"
    r = run("report", traces["bench"], H200, "-o", out)
    page, text = parse(out)
    assert {"fig-waveforms-bench", "fig-waveforms-h200-chunked-1s"} <= set(page.figures)
    assert page.svg_in_figure == len(page.figures) == 5
    assert "gpus" not in page.ids and 'class="per-gpu"' not in text  # one GPU: no per-GPU part
    assert "NVIDIA H200" in text and "llama-3-8b (random weights)" in text
    assert "GPU SM active / tensor active (mean %)" in text
    out_text = " ".join(r.output.split())
    assert "continuous" in out_text and "chunked" in out_text
    assert_self_contained(page, text)


def _x_slices_nest(events):
    """Independent check: on each (pid, tid), any two X slices are disjoint or one holds the
    other."""
    by = {}
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            by.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for key, sl in by.items():
        sl.sort(key=lambda x: (x[0], -x[1]))
        open_ = []
        for a, b in sl:
            while open_ and open_[-1] <= a + 1e-6:  # µs floats: touching is not overlapping
                open_.pop()
            assert not open_ or b <= open_[-1] + 1e-6, (key, a, b, open_[-1])
            open_.append(b)
    return by


@pytest.mark.parametrize("which", ["ab", "h200"])
def test_perfetto_json(traces, tmp_path, which):
    src = traces["ab"] if which == "ab" else H200
    out = tmp_path / "t.json"
    run("report", src, "--format", "perfetto", "-o", out)
    obj = json.loads(out.read_text())
    ev = obj["traceEvents"]
    tr = read_trace(src)
    phases = {e["ph"] for e in ev}
    assert {"X", "C", "M"} <= phases
    by = _x_slices_nest(ev)
    steps = [e for e in ev if e["ph"] == "X" and e.get("cat") == "step"]
    assert len(steps) == len(tr.steps)
    assert {e["name"] for e in steps} <= {"prefill", "decode", "mixed"}
    assert all(isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
               for e in steps)
    reqs = [e for e in ev if e["ph"] == "X" and e.get("cat") == "request"
            and e["name"] != "waiting + prefill"]
    assert len(reqs) == len(tr.requests)
    counters = {e["name"] for e in ev if e["ph"] == "C"}
    assert {"tokens per step", "queue (requests)", "KV cache used (%)"} <= counters
    instants = [e for e in ev if e["ph"] == "i"]
    assert len(instants) == len(tr.events)
    names = {(e["name"], e["args"].get("name")) for e in ev if e["ph"] == "M"}
    assert any(n == "thread_name" and v == "engine steps" for n, v in names)
    assert any(n == "process_name" and str(v).startswith("gpuchef engine") for n, v in names)
    if which == "ab":
        assert any(e["args"].get("kind") == "mark" for e in instants)
        assert any(e["args"].get("kind") in ("knob", "mode") for e in instants)
        assert [e["name"] for e in ev if e["ph"] == "X" and e.get("cat") == "setting"][:2] == \
            ["A1", "B1"]
    else:
        assert {"utilisation (%)", "power (W)", "memory used (GiB)"} <= counters
        gpu = [e for e in ev if e["ph"] == "C" and e["name"] == "utilisation (%)"]
        assert "SM active" in gpu[0]["args"] and "DRAM bandwidth" in gpu[0]["args"]
    assert len(by) >= 2


def test_csv_headers_and_rows(traces, tmp_path):
    prefix = tmp_path / "out" / "run"
    r = run("report", traces["ab"], "--format", "csv", "-o", prefix)
    tr = read_trace(traces["ab"])
    with open(f"{prefix}.steps.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == STEP_HEADER and len(rows) - 1 == len(tr.steps)
    assert {r[1] for r in rows[1:]} == {"A", "B"}  # the group column: the A/B setting
    with open(f"{prefix}.requests.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == REQUEST_HEADER and len(rows) - 1 == len(tr.requests)
    i = REQUEST_HEADER.index("ttft_ms")
    assert all(float(r[i]) > 0 for r in rows[1:])
    assert f"({len(tr.steps)} steps)" in r.output
    assert f"({len(tr.requests)} requests)" in r.output and "(0 GPU samples)" in r.output
    with open(f"{prefix}.gpu_samples.csv") as f:  # a CPU run: the header alone
        assert list(csv.reader(f)) == [GPU_SAMPLE_HEADER]


def _edit_lines(src: Path, dst: Path, kind: str, edit, every: int = 1) -> int:
    """Copy a trace with ``edit(record_dict)`` applied to every ``every``-th record of ``kind``;
    returns how many were edited."""
    out, n, k = [], 0, 0
    for ln in src.read_text().splitlines(True):
        d = json.loads(ln)
        if d.get("type") == kind:
            if k % every == 0:
                edit(d)
                n += 1
            k += 1
            ln = json.dumps(d) + "\n"
        out.append(ln)
    dst.write_text("".join(out))
    return n


def test_unreadable_steps_still_report_the_requests(traces, tmp_path):
    """Every step's t_start_ns garbled: the requests are intact and are reported (one group, the
    meta's mode), with a problem line saying the steps could not be read — not "no steps or
    requests" (a tester's report)."""
    from gpuchef.report import build

    src = tmp_path / "nosteps.jsonl"
    n = _edit_lines(traces["bench"], src, "step", lambda d: d.update(t_start_ns="bad"))
    want = json.loads((traces["dir"] / "bench.json").read_text())
    data = build([src], percentiles=(50, 99))
    (g,) = data.groups
    assert g.short == "continuous" and g.metrics.completed == want["completed"]
    got = g.metrics.to_dict()
    assert got["total_output_tokens"] == want["total_output_tokens"]
    for k in ("p99_ttft_ms", "duration", "output_throughput"):  # the load start still counts
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
    assert data.problems[0] == (f"{src}: no step record could be read ({n} step lines "
                                f"unreadable): its {want['completed']} requests are reported in "
                                "one group (the mode its meta record names), without engine-step "
                                "figures")
    r = run("report", src, "-o", tmp_path / "nosteps.html")
    assert "groups: continuous" in r.output and "no steps or requests" not in r.output


def test_impossible_values_are_refused_as_problem_lines(traces, tmp_path):
    """A negative prompt_len and a step that ends before it starts are refused by the reader,
    one problem line each (naming the field and what is allowed), and never reach the tables
    or the CSV export (a tester saw prompt_len -5 and wall_ms -0.001 rows)."""
    from gpuchef.report import build

    mid = tmp_path / "mid.jsonl"
    n_req = _edit_lines(traces["bench"], mid, "request", lambda d: d.update(prompt_len=-5),
                        every=3)
    src = tmp_path / "weird.jsonl"
    n_step = _edit_lines(mid, src, "step",
                         lambda d: d.update(t_end_ns=d["t_start_ns"] - 1000), every=4)
    assert n_req >= 2 and n_step >= 2
    good = read_trace(traces["bench"])
    tr = read_trace(src)
    assert len(tr.requests) == len(good.requests) - n_req
    assert len(tr.steps) == len(good.steps) - n_step
    neg = [p for p in tr.problems if "request field prompt_len=-5 is negative (allowed: >= 0)"
           in p]
    back = [p for p in tr.problems if "is before t_start_ns" in p]
    assert len(neg) == n_req and len(back) == n_step and len(tr.problems) == n_req + n_step
    assert all(re.search(r" line \d+: ", p) and p.endswith("— skipped") for p in neg + back)
    data = build([src])
    assert data.groups[0].metrics.completed == len(good.requests) - n_req
    prefix = tmp_path / "csv" / "w"
    r = run("report", src, "--format", "csv", "-o", prefix)
    assert f"{n_req + n_step} problems" in " ".join(r.output.split())
    for name, col in (("requests", "prompt_len"), ("steps", "wall_ms")):
        with open(f"{prefix}.{name}.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows and all(float(x[col]) >= 0 for x in rows), name


# ---- several GPUs ---------------------------------------------------------------------------------

N_GPUS, N_TICKS, TICK_NS = 4, 30, 40_000_000
SLOW = 3  # the lagging rank: SM active about half the others'


def _multi_gpu_trace(path: Path, gpm: bool = True, n_gpus: int = N_GPUS) -> dict[str, np.ndarray]:
    """The H200 fixture's steps and requests with GPU samples of ``n_gpus`` GPUs written by the
    real recorder: every GPU sampled each 40 ms tick; GPU 3 the slow rank; GPU 2 (of more than two)
    without power.
    ``gpm`` False: no GPM fields (sm_active, tensor_active, dram_bw_util all None). Returns the
    generated values, each (n_gpus, N_TICKS) float (NaN where not sampled)."""
    src = read_trace(H200)
    t0 = min(s.t_start_ns for s in src.steps)
    rng = np.random.default_rng(7)
    base = np.where(np.arange(n_gpus)[:, None] == SLOW, 30.0, 60.0)
    vals = {"sm_active": base + rng.normal(0, 4, (n_gpus, N_TICKS)),
            "tensor_active": base / 10 + rng.uniform(0, 1, (n_gpus, N_TICKS)),
            "dram_bw_util": base * 0.8 + rng.normal(0, 3, (n_gpus, N_TICKS)),
            "gpu_util": rng.integers(70, 100, (n_gpus, N_TICKS)).astype(float),
            "power_w": 300 + base * 4 + rng.normal(0, 10, (n_gpus, N_TICKS)),
            "mem_used_bytes": rng.integers(100, 130, (n_gpus, N_TICKS)).astype(float) * 2**30}
    if not gpm:
        for f in ("sm_active", "tensor_active", "dram_bw_util"):
            vals[f][:] = np.nan
    if n_gpus > 2:
        vals["power_w"][2] = np.nan
    rec = TraceRecorder(path, meta={"command": "bench", "device": "cuda",
                                    "attention_backend": "flashinfer",
                                    "gpus": {str(k): "NVIDIA H200" for k in range(n_gpus)}})
    for r in (*src.steps, *src.requests):
        rec.record(r)
    for i in range(N_TICKS):
        for k in range(n_gpus):
            v = {f: (None if np.isnan(a[k, i]) else
                     int(a[k, i]) if f in ("gpu_util", "mem_used_bytes") else float(a[k, i]))
                 for f, a in vals.items()}
            rec.record(GpuSample(t_ns=t0 + i * TICK_NS, gpu=k, mem_total_bytes=150 * 2**30, **v))
    rec.close()
    return vals


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    d = tmp_path_factory.mktemp("multi")
    return {"gpm": (d / "tp4.jsonl", _multi_gpu_trace(d / "tp4.jsonl")),
            "nogpm": (d / "tp2.jsonl", _multi_gpu_trace(d / "tp2.jsonl", gpm=False, n_gpus=2))}


class Tables(HTMLParser):
    """The cells of every ``<table class="per-gpu">``: one list of row cell texts per table."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._in = self._cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._in = "per-gpu" in (dict(attrs).get("class") or "")
            if self._in:
                self.tables.append([])
        elif self._in and tag == "tr":
            self.tables[-1].append([])
        elif self._in and tag in ("td", "th"):
            self._cell = True
            self.tables[-1][-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self._in = False
        elif tag in ("td", "th"):
            self._cell = False

    def handle_data(self, data):
        if self._in and self._cell:
            self.tables[-1][-1][-1] += data


def _cell(x: str) -> float:
    return math.nan if x == "n/a" else float(x.replace(",", ""))


def test_html_report_of_several_gpus_has_a_per_gpu_figure_and_table(multi, tmp_path):
    src, vals = multi["gpm"]
    out = tmp_path / "tp4.html"
    run("report", src, "-o", out)
    page, text = parse(out)
    assert "gpus" in page.ids and "fig-gpus-tp4" in page.figures
    assert page.svg_in_figure == len(page.figures) == text.count("<svg")
    assert 'aria-label="Per-GPU utilisation of tp4"' in text
    assert_self_contained(page, text)
    t = Tables()
    t.feed(text)
    (rows,) = t.tables
    head, body = rows[0], rows[1:]
    assert [r[0] for r in body] == [f"GPU {k}" for k in range(N_GPUS)] + [
        "mean (all GPUs)", "spread (max − min)"]
    col = {h: i for i, h in enumerate(head)}
    want_means = {"SM active %": np.nanmean(vals["sm_active"], axis=1),
                  "tensor active %": np.nanmean(vals["tensor_active"], axis=1),
                  "DRAM BW %": np.nanmean(vals["dram_bw_util"], axis=1),
                  "GPU-Util %": np.nanmean(vals["gpu_util"], axis=1),
                  "memory used GiB": np.nanmean(vals["mem_used_bytes"], axis=1) / 2**30}
    power = [np.mean(vals["power_w"][k]) if k != 2 else math.nan for k in range(N_GPUS)]
    want_means["power W"] = np.array(power)
    for h, want in want_means.items():
        got = np.array([_cell(r[col[h]]) for r in body[:N_GPUS]])
        np.testing.assert_allclose(got, want, atol=0.051, err_msg=h)
        ok = want[np.isfinite(want)]
        assert _cell(body[N_GPUS][col[h]]) == pytest.approx(ok.mean(), abs=0.051), h
        assert _cell(body[N_GPUS + 1][col[h]]) == pytest.approx(ok.max() - ok.min(), abs=0.051), h
    assert body[2][col["power W"]] == "n/a"  # GPU 2 never reported its power
    assert [r[col["samples"]] for r in body[:N_GPUS]] == [str(N_TICKS)] * N_GPUS
    assert {r[1] for r in body[:N_GPUS]} == {"NVIDIA H200"}
    # the slow rank shows: its SM active is the lowest, and the spread is about the gap
    sm = [_cell(r[col["SM active %"]]) for r in body[:N_GPUS]]
    assert int(np.argmin(sm)) == SLOW and _cell(body[-1][col["SM active %"]]) > 20


def test_per_gpu_figure_without_gpm_uses_gpu_util(multi, tmp_path):
    from gpuchef.report import build
    from gpuchef.report.plots import spread, util_field

    src, vals = multi["nogpm"]
    (view,) = build([src]).views
    assert util_field(view) == ("gpu_util", "GPU-Util (NVML: any kernel running)")
    (mview,) = build([multi["gpm"][0]]).views
    assert util_field(mview)[0] == "sm_active"
    out = tmp_path / "tp2.html"
    run("report", src, "-o", out)
    page, text = parse(out)
    assert "fig-gpus-tp2" in page.figures
    t = Tables()
    t.feed(text)
    (rows,) = t.tables
    col = {h: i for i, h in enumerate(rows[0])}
    assert [r[col["SM active %"]] for r in rows[1:]] == ["n/a"] * 4  # 2 GPUs, mean, spread
    assert [_cell(r[col["GPU-Util %"]]) for r in rows[1:3]] == pytest.approx(
        vals["gpu_util"].mean(axis=1), abs=0.051)
    # the spread per bin: max − min across the GPUs that have a value, NaN under two
    v = np.array([[1.0, np.nan, 5.0, np.nan], [4.0, 2.0, 5.0, np.nan], [2.0, np.nan, 9.0, 1.0]])
    np.testing.assert_array_equal(spread(v), [3.0, np.nan, 4.0, np.nan])


def test_csv_of_several_gpus_has_a_row_per_gpu_sample(multi, tmp_path):
    src, vals = multi["gpm"]
    prefix = tmp_path / "tp4"
    run("report", src, "--format", "csv", "-o", prefix)
    with open(f"{prefix}.gpu_samples.csv") as f:
        rows = list(csv.DictReader(f))
    with open(f"{prefix}.gpu_samples.csv") as f:
        assert next(csv.reader(f)) == GPU_SAMPLE_HEADER
    assert "gpu" in GPU_SAMPLE_HEADER and len(rows) == N_GPUS * N_TICKS
    assert [sum(r["gpu"] == str(k) for r in rows) for k in range(N_GPUS)] == [N_TICKS] * N_GPUS
    for k in range(N_GPUS):
        sm = [float(r["sm_active"]) for r in rows if r["gpu"] == str(k)]
        np.testing.assert_allclose(sm, vals["sm_active"][k])  # by time, as generated
    assert all(r["power_w"] == "" for r in rows if r["gpu"] == "2")
    assert {r["group"] for r in rows} <= {"chunked", ""} and rows[0]["trace"] == "tp4"
    t = [float(r["t_s"]) for r in rows]
    assert t == sorted(t)


def test_corrupt_and_truncated_trace_warns_and_still_reports(traces, tmp_path):
    lines = traces["bench"].read_text().splitlines(keepends=True)
    # a garbage line in the middle, the end record gone and the last record cut mid-line
    bad = lines[:5] + ["{this is not json\n"] + lines[5:-2] + [lines[-2][: len(lines[-2]) // 2]]
    src = tmp_path / "cut.jsonl"
    src.write_text("".join(bad))
    out = tmp_path / "cut.html"
    r = run("report", src, "-o", out)
    text = " ".join(r.output.split())
    assert "warning: 3 problems" in text
    assert "line 6: not valid JSON" in text
    assert f"line {len(bad)}: truncated last record" in text
    assert "no end record" in text
    page, html = parse(out)
    assert "problems" in page.ids and "line 6" in html
    assert "fig-waveforms-cut" in page.figures and page.svg_in_figure == len(page.figures) >= 3
    # the Perfetto export of the same file works too
    run("report", src, "--format", "perfetto", "-o", tmp_path / "cut.json")
    json.loads((tmp_path / "cut.json").read_text())


def test_a_trace_still_being_written_is_not_called_killed(tmp_path):
    """A live session's trace has no end record yet: the problem line says it may still be
    written, not only that the process was killed (a tester's wording note)."""
    from gpuchef.engine_host.vocab.records import RequestRecord
    from gpuchef.report import build

    p = tmp_path / "live.jsonl"
    rec = TraceRecorder(p, meta={"command": "serve"})
    try:
        rec.record(RequestRecord("http-0", 10, 4, 2, (20, 30), "length"))
        rec.flush()
        data = build([p])
    finally:
        rec.close()
    (line,) = [x for x in data.problems if "no end record" in x]
    assert "killed" in line and "still running and writing it" in line
    assert not [x for x in build([p]).problems if "no end record" in x]  # closed: complete


def test_trace_with_only_a_meta_record(traces, tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_text(traces["bench"].read_text().splitlines()[0] + "\n")
    out = tmp_path / "empty.html"
    r = run("report", src, "-o", out)
    assert "no end record" in " ".join(r.output.split())
    page, text = parse(out)
    assert "summary" in page.ids and "nothing to compare" in text


@pytest.mark.parametrize("content", ["TIMESTAMP,ContextTokens,GeneratedTokens\n1,2,3\n", "",
                                     '{"type":"step"}\n'])
def test_a_file_that_is_not_a_trace_is_one_clear_error(tmp_path, content):
    src = tmp_path / "data.csv"
    src.write_text(content)
    r = run("report", src, "-o", tmp_path / "x.html", ok=False)
    assert r.exit_code == 2
    assert "not a gpuchef trace" in r.output
    assert "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) <= 3  # one message (rich may wrap it)
    assert not (tmp_path / "x.html").exists()


def test_missing_file_is_one_clear_error(tmp_path):
    r = run("report", tmp_path / "nope.jsonl", ok=False)
    assert r.exit_code == 2 and "cannot open" in r.output


def test_missing_matplotlib_says_how_to_install(traces, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    r = run("report", traces["bench"], "-o", tmp_path / "x.html", ok=False)
    assert r.exit_code == 2
    assert "pip install 'gpuchef[report]'" in " ".join(r.output.split())
    # the other formats do not need it
    run("report", traces["bench"], "--format", "csv", "-o", tmp_path / "x")


def test_default_output_names(traces, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(traces["bench"], tmp_path / "b.jsonl")
    run("report", "b.jsonl", "--format", "perfetto")
    assert (tmp_path / "b.perfetto.json").exists()


# ---- output folders, trace names ------------------------------------------------------------------

@pytest.mark.parametrize("fmt,names", [
    ("csv", ["h200_chunked_1s.steps.csv", "h200_chunked_1s.requests.csv",
             "h200_chunked_1s.gpu_samples.csv"]),
    ("perfetto", ["h200_chunked_1s.perfetto.json"]),
    ("html", ["h200_chunked_1s.html"]),
])
@pytest.mark.parametrize("how", ["existing", "slash"])
def test_output_folder_gets_the_default_names(tmp_path, fmt, names, how):
    d = tmp_path / "adir"
    if how == "existing":
        d.mkdir()
        o = str(d)
    else:  # a folder not made yet, said by the trailing separator
        o = str(d) + "/"
    run("report", H200, "--format", fmt, "-o", o)
    assert sorted(p.name for p in d.iterdir()) == sorted(names)


def test_output_expands_home_and_never_overwrites_a_trace(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("HOME", str(tmp_path))
    run("report", H200, "--format", "perfetto", "-o", "~/out/")
    assert (tmp_path / "out" / "h200_chunked_1s.perfetto.json").is_file()
    src = tmp_path / "t.jsonl"
    shutil.copy(H200, src)
    before = src.read_bytes()
    for fmt in ("html", "perfetto"):
        r = run("report", src, "--format", fmt, "-o", str(src), ok=False)
        assert r.exit_code == 2 and "would overwrite the trace" in r.output, r.output
    assert src.read_bytes() == before


def test_same_file_twice_gets_distinct_names(tmp_path):
    from gpuchef.report.data import build

    data = build([H200, H200])
    assert [v.name for v in data.views] == ["h200_chunked_1s", "h200_chunked_1s (2)"]
    labels = [g.label for g in data.groups]
    assert len(set(labels)) == len(labels) == 2, labels
    # the CLI reads a file given twice once (also by another spelling of its path), and says so
    prefix = tmp_path / "twice"
    other = os.path.relpath(H200)
    r = run("report", H200, other, H200, "--format", "csv", "-o", prefix)
    assert r.output.count("given twice: read once") == 1, r.output
    assert f"{H200} given twice" in " ".join(r.output.split())
    with open(f"{prefix}.steps.csv") as f:
        assert {r[0] for r in list(csv.reader(f))[1:]} == {"h200_chunked_1s"}


def test_same_file_name_in_two_folders_is_named_by_folder(tmp_path):
    from gpuchef.report.data import build

    for d in ("chunked", "continuous"):
        (tmp_path / d).mkdir()
        shutil.copy(H200, tmp_path / d / "run.jsonl")
    data = build([tmp_path / "chunked" / "run.jsonl", tmp_path / "continuous" / "run.jsonl"])
    assert [v.name for v in data.views] == ["chunked/run", "continuous/run"]


def test_ab_stopped_before_any_step_has_a_plain_label(tmp_path):
    """A dashboard A/B stopped at once: marks with nothing between them, no settings in the meta."""
    from gpuchef.engine_host.vocab.records import EngineEvent
    from gpuchef.report.data import build

    src = read_trace(H200)
    t = max(s.t_end_ns for s in src.steps) + 1_000_000
    path = tmp_path / "top.jsonl"
    rec = TraceRecorder(path, meta={"command": "top", "device": "cpu"})
    for r in (*src.steps, *src.requests):
        rec.record(r)
    for i, name in enumerate(("ab:1:A:1", "ab:1:end")):
        rec.record(EngineEvent("mark", 0, t + i * 1_000_000, name))
    rec.close()
    data = build([path])
    # probes.ab: a window no request arrived in is not counted, so A has no group (as in the
    # live screen and gpuchef ab); the window is still listed, saying why
    assert data.groups == []
    (seg,) = data.views[0].segments
    assert seg.name == "A1" and seg.label == "A" and not seg.counted
    assert seg.result.why == "no finished request arrived in it"


def test_report_o_refuses_any_existing_trace(tmp_path):
    other = tmp_path / "other_trace.jsonl"
    other.write_bytes(H200.read_bytes())
    before = other.read_bytes()
    r = CliRunner().invoke(cli, ["report", str(H200), "-o", str(other)])
    assert r.exit_code == 2, r.output
    assert "would overwrite the trace" in r.output and "other_trace.jsonl" in r.output
    assert other.read_bytes() == before
    # a file that is not a trace is an ordinary output
    old = tmp_path / "old.html"
    old.write_text("<html>old</html>")
    from gpuchef.commands.report import is_trace_file
    assert is_trace_file(str(other)) and not is_trace_file(str(old))
    assert not is_trace_file(str(tmp_path / "missing.jsonl"))


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="needs Debian's prometheus (.ci/run installs it)")
def test_report_of_a_fleet_read_from_prometheus(tmp_path):
    """`report --prometheus URL`: the two gpuchef servers a real Prometheus scraped, as a trace
    of scrape records (kept with --save-trace) whose values end where the servers' own
    /metrics are, and an HTML report with each server's scrape figure (issue 29 item 3)."""
    import time
    import urllib.request

    from openai import OpenAI

    sys.path.insert(0, str(Path(__file__).parent))
    from serve_proc import PrometheusProc, ServeProc, wait_until

    from gpuchef.probes.prometheus import PrometheusFleet
    from gpuchef.probes.scrape import parse_metrics

    with ServeProc() as a, ServeProc() as b, \
            PrometheusProc([u.split("://", 1)[1] for u in (a.url, b.url)], tmp_path) as prom:
        c = OpenAI(base_url=a.url + "/v1", api_key="x")
        for n in (7, 9):
            c.completions.create(model="tiny", prompt=[13] * n, max_tokens=3)
        with urllib.request.urlopen(a.url + "/metrics", timeout=10) as r:
            direct = parse_metrics(r.read().decode())
        fleet = PrometheusFleet(prom.url)

        def scraped():
            try:
                got = fleet.sample(only_new=False)
            except ConnectionError:
                return False
            return got.get(a.url) is not None and got[a.url].values.get(
                "prompt_tokens") == direct.values["prompt_tokens"] and b.url in got
        assert wait_until(scraped, 60, 0.5), "Prometheus never scraped the load"
        time.sleep(2.5)  # a few more points after the load
        out = tmp_path / "fleet.html"
        kept = tmp_path / "fleet.jsonl"
        r = run("report", "--prometheus", prom.url, "--since", "1m", "--step", "1s", "-o", out,
                "--save-trace", kept)
        assert r.exit_code == 0, r.output
    tr = read_trace(kept)
    assert tr.meta["source"]["prometheus"] == prom.url
    assert set(tr.meta["source"]["urls"]) == {a.url, b.url}
    by = {u: [x for x in tr.scrapes if x.url == u and not x.error] for u in (a.url, b.url)}
    assert len(by[a.url]) >= 3 and len(by[b.url]) >= 3
    assert by[a.url][-1].values["prompt_tokens"] == direct.values["prompt_tokens"] == 16
    assert by[b.url][-1].values.get("prompt_tokens", 0) == 0
    ts = [x.t_ns for x in by[a.url]]
    assert ts == sorted(ts) and ts[1] - ts[0] == 1_000_000_000
    page = out.read_text()
    assert page.count('id="scrape-') >= 2 or page.count("scrape-") >= 2
    assert a.url.split("//")[1] in page and b.url.split("//")[1] in page
