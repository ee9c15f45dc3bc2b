"""`gpuchef ab` over HTTP (gpuchef/experiments/http.py): two knob settings of one `gpuchef serve`
(PATCHed before each run), and two servers on the same arrivals (mirrored or sequential).

Two `gpuchef serve --model tiny` subprocesses on loopback, started once for the module: A with
``max_num_batched_tokens`` 16, B with 2048, both chunked. With 256-token prompts a 16-token budget
needs 16 steps per prefill where 2048 needs one, so A's TTFT is the larger: the sign of B − A is
known. Independent references: server A's own trace (the budget of every step it ran inside each
client run's window: the PATCH was in force), the knob endpoint's state after the run (restored),
and the report of the client trace (``gpuchef report``'s A/B of the same records). The error paths
run against the fake aiohttp server of test_http_load.py.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import pytest
from click.testing import CliRunner
from serve_proc import ServeProc
from test_http_load import FakeServer

from gpuchef.commands.cli import _register, cli
from gpuchef.probes import ab as abdef
from gpuchef.probes.recorder import read_trace

_register()

LOAD = ["--num-prompts", "6", "--input-len", "256", "--output-len", "4", "--request-rate", "4"]


def _warm(url: str) -> None:
    body = json.dumps({"prompt": [1] * 256, "max_tokens": 4, "ignore_eos": True}).encode()
    rq = urllib.request.Request(f"{url}/v1/completions", body,
                                {"Content-Type": "application/json"})
    with urllib.request.urlopen(rq, timeout=60) as r:
        assert r.status == 200


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("abhttp")
    with ServeProc("--mode", "chunked", "--max-num-batched-tokens", "16",
                   "--trace", str(d / "a.jsonl")) as a, \
            ServeProc("--mode", "chunked", "--max-num-batched-tokens", "2048") as b:
        a.trace = d / "a.jsonl"
        for srv in (a, b):  # a first request each: a cold server's first run is not a side's
            _warm(srv.url)
        yield a, b


def ab(*args: str):
    return CliRunner().invoke(cli, ["ab", *args], catch_exceptions=False)


def knobs(url: str) -> dict:
    with urllib.request.urlopen(url + "/gpuchef/v1/scheduler", timeout=10) as r:
        return json.loads(r.read())


def row(d: dict, key: str) -> dict:
    return next(r for r in d["comparison"]["deltas"] if r["key"] == key)


def verdict_of(r: dict) -> str:
    """probes.ab's verdict of a row's per-repetition values: whether "B better" or "within
    spread" depends on the run-to-run noise of a shared CPU, so the row is held to the rule."""
    spec = next(s for s in abdef.metric_specs((50.0, 99.0), False, False) if s.key == r["key"])
    return abdef.verdict(spec, r["a_runs"], r["b_runs"], abdef.MIN_REPETITIONS)


def test_knob_settings_of_one_server_are_patched_before_each_run(servers, tmp_path):
    a, _ = servers
    rj, tr = tmp_path / "r.json", tmp_path / "t.jsonl"
    r = ab("--base-url", a.url, "--a", "budget=16", "--b", "max_num_batched_tokens=2048",
           *LOAD, "--repetitions", "2", "--result-json", str(rj), "--trace", str(tr))
    assert r.exit_code == 0, r.output
    assert "A/B load: sequential" in r.output and "order A B | B A" in r.output
    assert "B − A" in r.output and "Mean TTFT (ms)" in r.output
    prog = [ln for ln in r.stderr.splitlines() if ln.startswith(("run ", "repetition "))]
    assert [ln.split(" (")[0] for ln in prog] == ["run 1/4: A", "run 2/4: B", "run 3/4: B",
                                                  "run 4/4: A"], prog
    d = json.loads(rj.read_text())
    assert d["ab_load"] == "sequential" and d["servers"] == {"A": a.url, "B": a.url}
    ttft = row(d, "mean_ttft_ms")
    # every repetition: the 16-token budget's prefill takes 16 steps, B's one
    assert all(y < x for x, y in zip(ttft["a_runs"], ttft["b_runs"])), ttft
    assert ttft["verdict"] == verdict_of(ttft) != "B worse"
    for k in ("A", "B"):  # vLLM's results block, pooled over the repetitions
        res = d["results"][k]
        assert res["completed"] == 12 and res["failed"] == 0 and len(res["ttfts"]) == 12
        assert res["total_input_tokens"] == 12 * 256
        # no steps seen from the client: vLLM's (input + output tokens) / duration
        assert res["total_token_throughput"] == pytest.approx(
            (res["total_input_tokens"] + res["total_output_tokens"]) / res["duration"])
    # the server put back as found
    assert knobs(a.url)["max_num_batched_tokens"] == 16
    # the server's own steps: each client run's window ran under its setting's budget
    ct = read_trace(tr)
    assert ct.meta["source"] == {"kind": "attached", "urls": [a.url]}
    _, wins, ended = abdef.windows(ct.events, 1)
    assert ended and [w.name for w in wins] == ["A1", "B1", "B2", "A2"]
    time.sleep(1.0)  # the server's trace flushes every 0.5 s
    steps = read_trace(a.trace).steps
    want = {"A": 16, "B": 2048}
    for w in wins:
        inside = [s for s in steps if w.t0_ns <= s.t_start_ns < w.t1_ns]
        assert inside and {s.max_num_batched_tokens for s in inside} == {want[w.label]}, w
    # gpuchef report of the client trace: the same comparison (probes.ab, one owner)
    from gpuchef.report.data import ab_results, view_trace

    view = view_trace(ct)
    cmp = ab_results(view, (50.0, 99.0), None)[1]
    got = {x.key: (x.a, x.b) for x in cmp.rows}
    assert got["mean_ttft_ms"] == pytest.approx((ttft["a"], ttft["b"]))
    assert got["p99_e2el_ms"] == pytest.approx((row(d, "p99_e2el_ms")["a"],
                                                row(d, "p99_e2el_ms")["b"]))


def test_two_servers_mirrored_get_each_request_at_the_same_time(servers, tmp_path):
    a, b = servers
    rj, tr = tmp_path / "r.json", tmp_path / "t.jsonl"
    r = ab("--a", f"url={a.url}", "--b", f"url={b.url}/v1", *LOAD, "--repetitions", "2",
           "--result-json", str(rj), "--trace", str(tr))
    assert r.exit_code == 0, r.output
    assert "A/B load: mirrored" in r.output and "do not share a GPU" in r.output
    # progress: one line per repetition, both servers at once (not "run 1/4: A", "run 2/4: B")
    prog = [ln for ln in r.stderr.splitlines() if ln.startswith(("run ", "repetition "))]
    assert len(prog) == 2, prog
    for n, ln in enumerate(prog, 1):
        assert re.fullmatch(rf"repetition {n}/2: A and B at once \(mirrored\): A 6 requests in "
                            r"[\d.]+ s; B 6 requests in [\d.]+ s", ln), ln
    d = json.loads(rj.read_text())
    assert d["ab_load"] == "mirrored" and d["servers"] == {"A": a.url, "B": b.url}
    ttft = row(d, "mean_ttft_ms")
    assert all(y < x for x, y in zip(ttft["a_runs"], ttft["b_runs"])), ttft
    assert d["results"]["A"]["completed"] == d["results"]["B"]["completed"] == 12
    ct = read_trace(tr)
    assert ct.meta["source"]["urls"] == [a.url, b.url] and ct.meta["ab"]["load"] == "mirrored"
    by = {q.request_id: q for q in ct.requests}
    # 6 requests per server per repetition, each id once: the side, the load's id, #repetition
    assert len(by) == len(ct.requests) == 24
    assert set(by) == {f"{k}/req-{i}#{n}" for k in "AB" for i in range(6) for n in (1, 2)}
    for i in range(6):  # sent on one clock: the POSTs of a pair close (2 shared cores: not µs)
        for n in (1, 2):
            qa, qb = by[f"A/req-{i}#{n}"], by[f"B/req-{i}#{n}"]
            assert abs(qa.arrival_ns - qb.arrival_ns) < 100e6, (i, n, qa.arrival_ns - qb.arrival_ns)
    assert "(request ids A/…#n and B/…#n: repetition n)" in r.stderr
    # the trace's windows: one AB mark per repetition (both servers' window n at once)
    _, wins, ended = abdef.windows(ct.events, 1)
    assert ended and [(w.name, w.mirrored) for w in wins] == [
        ("A1", True), ("B1", True), ("A2", True), ("B2", True)]
    report_agrees_with_result_json(tr, d, "mirrored")


def report_agrees_with_result_json(tr, d: dict, load: str) -> None:
    """`gpuchef report` of an `ab` over HTTP trace: groups A and B, each with the command's
    pooled results (``--result-json``), the B − A of the command's comparison, the load stated;
    the page's B − A column; no engine-step rows (the client saw none)."""
    import html

    from gpuchef.report.data import ab_results, build
    from gpuchef.report.html import render, results_rows, run_table

    data = build([tr], percentiles=(50.0, 99.0))
    assert [g.short for g in data.groups] == ["A", "B"]
    for g in data.groups:
        res = d["results"][g.short]
        assert g.label.startswith(f"{g.short}: {d['servers'][g.short]}: ")
        assert g.metrics.completed == res["completed"] and g.metrics.failed == res["failed"]
        for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                    "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "request_throughput",
                    "output_throughput", "total_token_throughput", "duration"):
            got = {"p99_ttft_ms": dict(g.metrics.percentiles_ttft_ms).get(99.0),
                   "p99_itl_ms": dict(g.metrics.percentiles_itl_ms).get(99.0),
                   "duration": g.metrics.duration_s}.get(key, getattr(g.metrics, key, None))
            assert got == pytest.approx(res[key], rel=1e-9), (g.short, key)
        # each group holds its own server's requests (ids A/… or B/… when mirrored)
        assert len(g.requests) == res["completed"] + res["failed"]
        if load == "mirrored":
            assert {q.request_id[:2] for q in g.requests} == {f"{g.short}/"}
    cmp = ab_results(data.views[0], (50.0, 99.0), None)[1]
    want = {r["key"]: r for r in d["comparison"]["deltas"]}
    assert [r.key for r in cmp.rows if r.key in want] == list(want)
    for r in cmp.rows:
        if r.key in want:
            assert (r.a, r.b, r.verdict) == (pytest.approx(want[r.key]["a"], nan_ok=True),
                                             pytest.approx(want[r.key]["b"], nan_ok=True),
                                             want[r.key]["verdict"]), r.key
    rows = dict((r[0], r[1]) for r in run_table(data.views)[1])
    assert f"A/B load {load} — " in rows["Load"]
    # the servers' steps are not in a client's trace: no engine-step rows (they read 0 before),
    # and the page says why; the server's device and KV cache are not '?'
    assert not data.views[0].trace.steps
    res_rows = results_rows(data.groups, delta=True)
    assert ("Engine Steps (gpuchef)",) not in res_rows
    assert not {"Engine steps", "Mixed prefill+decode steps", "Preemptions",
                "Compute busy fraction (%)"} & {r[0] for r in res_rows}
    assert rows["Device / attention"] == "the server's (not seen from its client)"
    # what each server's /v1/models said (urls of the command's own --result-json)
    urls = list(dict.fromkeys(d["servers"].values()))
    lens = ", ".join(rf"{re.escape(u)}: \d+" for u in urls) if len(urls) > 1 else r"\d+"
    assert re.fullmatch(rf"the server's \(not seen from its client\); max_model_len {lens} "
                        r"\(GET /v1/models\)", rows["KV cache"]), rows["KV cache"]
    assert f"{d['results']['A']['completed'] // 2} requests per run to /v1/completions" in \
        rows["Load"]
    page = render(data)
    assert re.search(r"<th[^>]*>B − A</th>", page)
    assert ("No engine-step rows: the trace holds no steps — the load went over HTTP to a server "
            "gpuchef did not host") in html.unescape(page)
    # Perfetto: one slice per window; a mirrored repetition's two windows are one span
    from gpuchef.report.perfetto import trace_events

    names = [e["name"] for e in trace_events(data.views[0], 0) if e.get("cat") == "setting"]
    assert names == (["A1 | B1", "A2 | B2"] if load == "mirrored" else ["A1", "B1", "B2", "A2"])


def test_two_servers_sequential_with_knobs_after_url(servers, tmp_path):
    a, b = servers
    rj = tmp_path / "r.json"
    # A's server set to B's budget and B's to A's: the sign flips
    r = ab("--ab-load", "sequential", "--a", f"url={a.url},max_num_batched_tokens=2048",
           "--b", f"url={b.url},budget=16", *LOAD, "--repetitions", "2", "--result-json", str(rj),
           "--trace", str(tmp_path / "t.jsonl"))
    assert r.exit_code == 0, r.output
    assert "A/B load: sequential" in r.output
    d = json.loads(rj.read_text())
    ttft = row(d, "mean_ttft_ms")
    assert all(y > x for x, y in zip(ttft["a_runs"], ttft["b_runs"])), ttft
    assert ttft["verdict"] == verdict_of(ttft) != "B better"
    assert knobs(a.url)["max_num_batched_tokens"] == 16
    assert knobs(b.url)["max_num_batched_tokens"] == 2048
    # the trace's ids: each side's prefixed (A/, as the hosted A/B), each repetition's suffixed
    # (#rep): unique in the trace
    ct = read_trace(tmp_path / "t.jsonl")
    res = abdef.analyse(ct.events, ct.requests, [], whole_loads=True)[3]
    for k in "AB":
        ids = [q.request_id for w in res if w.label == k for q in w.requests]
        assert sorted(ids) == sorted(f"{k}/req-{i}#{n}" for i in range(6) for n in (1, 2)), ids
    report_agrees_with_result_json(tmp_path / "t.jsonl", d, "sequential")


# ---- bad input ------------------------------------------------------------------------------


@pytest.fixture
def fakes():
    s1, s2 = FakeServer(ttft_s=0.01, itl_s=0.005).start(), FakeServer(ttft_s=0.01).start()
    yield s1, s2
    s1.stop()
    s2.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FAST = ["--num-prompts", "4", "--input-len", "8", "--output-len", "3", "--request-rate", "50",
        "--vocab-size", "100"]


def one_error(r, *words):
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    for w in words:
        assert w in r.output, (w, r.output)


def test_unreachable_url_is_one_error_naming_it(fakes):
    url = f"http://127.0.0.1:{free_port()}"
    one_error(ab("--a", f"url={fakes[0].url}", "--b", f"url={url}", *FAST),
              url, "cannot connect", "--b url=")


def test_a_url_given_twice(fakes):
    u = fakes[0].url
    one_error(ab("--a", f"url={u}", "--b", f"url={u}/", *FAST), "both name", u, "--base-url")
    one_error(ab("--a", f"url={u},url={fakes[1].url}", "--b", f"url={u}", *FAST),
              "--a 'url=", "url= is given twice")


def test_url_on_one_side_only_and_with_base_url(fakes):
    u = fakes[0].url
    one_error(ab("--a", f"url={u}", "--b", "budget=16", *FAST), "--a names url=",
              "--b names no url=")
    one_error(ab("--base-url", u, "--a", f"url={fakes[1].url}", *FAST), "--base-url", "give one")
    one_error(ab("--base-url", u, "--ab-load", "mirrored", *FAST), "--ab-load mirrored")
    one_error(ab("--base-url", u, "--interleave", *FAST), "--interleave")
    one_error(ab("--base-url", u, "--mode", "chunked", *FAST), "--mode", "does not apply")


def test_knob_specs_on_a_server_without_the_knob_endpoint(fakes):
    u = fakes[0].url
    one_error(ab("--base-url", u, "--a", "budget=16", "--b", "budget=2048", *FAST),
              u, "has no gpuchef knob endpoint", "HTTP 404", "--a 'budget=16'")
    assert fakes[0].n_requests == 0  # refused before any request was sent


def test_a_server_that_errors_mid_run_is_counted_and_the_comparison_goes_on(fakes, tmp_path):
    s1, s2 = fakes
    s2.plan["req-2"] = "500"
    rj = tmp_path / "r.json"
    r = ab("--a", f"url={s1.url}", "--b", f"url={s2.url}", *FAST, "--repetitions", "2",
           "--result-json", str(rj))
    assert r.exit_code == 0, r.output
    assert "failed (B" in r.output and "2 requests: HTTP 500" in r.output
    d = json.loads(rj.read_text())
    assert d["results"]["B"]["failed"] == 2 and d["results"]["A"]["failed"] == 0
    assert d["results"]["B"]["error_counts"] == {"HTTP 500": 2}
    assert [x["error_counts"] for x in d["runs"] if x["label"] == "B"] == [{"HTTP 500": 1}] * 2
    assert d["comparison"] is not None and row(d, "mean_ttft_ms")["b"] is not None


def test_a_server_whose_every_request_fails_exits_1_after_the_table(fakes):
    s1, s2 = fakes
    s2.plan.update({f"req-{i}": "500" for i in range(4)})
    r = ab("--a", f"url={s1.url}", "--b", f"url={s2.url}", *FAST)
    assert r.exit_code == 1, r.output
    assert "4 requests: HTTP 500" in r.output and f"no request to {s2.url} (B) succeeded" \
        in r.output and "Traceback" not in r.output


def test_mirrored_probe_requests_stay_probes(fakes, tmp_path):
    """--probe-interval over a mirrored A/B: the probes (ids A/probe-…, B/probe-…) are left out
    of the load's figures, as `bench --base-url` leaves them out (they were counted as load)."""
    from gpuchef.probes.metrics import is_probe_id

    s1, s2 = fakes
    rj, tr = tmp_path / "r.json", tmp_path / "t.jsonl"
    r = ab("--a", f"url={s1.url}", "--b", f"url={s2.url}", *FAST, "--probe-interval", "0.05",
           "--result-json", str(rj), "--trace", str(tr))
    assert r.exit_code == 0, r.output
    d = json.loads(rj.read_text())
    probes = [q for q in read_trace(tr).requests if is_probe_id(q.request_id)]
    assert probes and {q.request_id[:8] for q in probes} == {"A/probe-", "B/probe-"}
    for k in "AB":
        res = d["results"][k]
        assert res["completed"] == res["num_prompts"] == 4, (k, res["completed"])
        assert res["probe_completed"] == sum(q.request_id[0] == k for q in probes)
    assert [is_probe_id(x) for x in ("probe-1", "A/probe-1#2", "B/probe-0", "req-1",
                                     "A/req-1", "C/probe-1", "")] == \
        [True, True, True, False, False, False, False]


def test_two_servers_header_names_each_sides_url_model_and_settings():
    """Each server serves its own model: the header names both (not A's alone)."""
    s1, s2 = FakeServer(models=("model-a",)).start(), FakeServer(models=("model-b",)).start()
    try:
        r = ab("--a", f"url={s1.url}", "--b", f"url={s2.url}", *FAST)
    finally:
        s1.stop()
        s2.stop()
    assert r.exit_code == 0, r.output
    head = r.stdout.splitlines()
    assert f"A: {s1.url} — model model-a — the server's own settings" in head
    assert f"B: {s2.url} — model model-b — the server's own settings" in head
    assert not [x for x in head if x.startswith("Model:")]
    # the bodies each server got name its own model (what the header says was asked)
    assert {b["model"] for b in s1.bodies.values()} == {"model-a"}
    assert {b["model"] for b in s2.bodies.values()} == {"model-b"}


def test_a_faster_server_that_fails_half_its_requests_is_not_called_better(tmp_path):
    """B answers 10x faster than A but fails half of each repetition's requests (HTTP 500 at
    once): B's surviving requests' latency is lower, and the plain verdict rule on the same
    per-repetition values (the reference) would call B better; `gpuchef ab` prints the failed
    row and says the rest are not compared. The same failures on both sides keep the verdict."""
    import html

    from gpuchef.report.data import build
    from gpuchef.report.html import render

    rj, tr = tmp_path / "r.json", tmp_path / "t.jsonl"

    def run(plan_a, plan_b):
        s1, s2 = FakeServer(ttft_s=0.08, itl_s=0.01).start(), \
            FakeServer(ttft_s=0.008, itl_s=0.01).start()
        try:
            s1.plan.update(plan_a)
            s2.plan.update(plan_b)
            r = ab("--a", f"url={s1.url}", "--b", f"url={s2.url}", *FAST, "--repetitions", "2",
                   "--result-json", str(rj), "--trace", str(tr))
            return r, json.loads(rj.read_text()), (s1.url, s2.url)
        finally:
            s1.stop()
            s2.stop()

    half = {"req-0": "500", "req-1": "500"}
    r, d, (ua, ub) = run({}, half)
    assert r.exit_code == 0, r.output
    ttft = row(d, "mean_ttft_ms")
    assert all(y < x for x, y in zip(ttft["a_runs"], ttft["b_runs"])), ttft
    assert verdict_of(ttft) == "B better"  # what the plain rule says of these values
    assert ttft["verdict"] == abdef.NOT_COMPARABLE
    for key in ("request_throughput", "output_throughput", "p99_e2el_ms", "mean_itl_ms"):
        assert row(d, key)["verdict"] == abdef.NOT_COMPARABLE, key
    f = row(d, "failed")
    # req-0 and req-1 failed in both repetitions: the ids sent are the load's own, unsuffixed
    assert (f["a"], f["b"], f["a_runs"], f["b_runs"]) == (0, 4, [0, 0], [2, 2])
    assert d["results"]["B"]["failed"] == 4  # the results block's own count agrees
    why = "B failed 4 of 8 requests, A 0 of 8: latency and throughput rows are not compared"
    assert d["comparison"]["requests"]["not_comparable"] == why
    assert d["comparison"]["requests"]["B"]["per_window"] == [
        {"sent": 4, "completed": 2, "failed": 2}] * 2
    table = r.stdout[r.stdout.index(" B − A: "):]
    line = next(x for x in table.splitlines() if x.startswith("Failed requests"))
    assert line.split()[2:5] == ["0", "4", "+4"], line
    assert f"Not comparable: {why}." in table
    assert not [x for x in table.splitlines() if x.endswith(("B better", "B worse"))
                and not x.startswith("Failed requests")]
    # the report of the trace: the same comparison, and the results table says it
    data = build([tr], percentiles=(50.0, 99.0))
    assert data.views[0].comparisons[1].not_comparable == why
    assert f"Not comparable (t): {why}." in html.unescape(render(data))
    # the same requests fail on both servers: judged as before
    r, d, _ = run(half, half)
    assert r.exit_code == 0, r.output
    assert d["comparison"]["requests"]["not_comparable"] is None
    assert row(d, "mean_ttft_ms")["verdict"] == verdict_of(row(d, "mean_ttft_ms")) == "B better"
    assert "Not comparable" not in r.stdout
    assert "Not comparable" not in html.unescape(render(build([tr], percentiles=(50.0, 99.0))))


class KnobFake(FakeServer):
    """FakeServer with a knob endpoint that refuses a budget of 16 (as a server with a limit of
    its own would), in its own words; ``patches``: the bodies it got."""

    STATE = {"mode": "chunked", "max_num_batched_tokens": 2048, "max_num_seqs": 256,
             "long_prefill_token_threshold": 0, "max_num_partial_prefills": 1,
             "max_long_partial_prefills": 1, "auto_budget": ""}

    async def _start(self):
        from aiohttp import web

        self.patches = []

        async def get(request):
            return web.json_response(self.STATE)

        async def patch(request):
            body = await request.json()
            self.patches.append(body)
            if body.get("max_num_batched_tokens") == 16:
                return web.json_response({"error": {"message": "max_num_batched_tokens 16 is "
                                                    "below this engine's floor of 32"}}, status=400)
            return web.json_response({"accepted": body, "scheduler": {**self.STATE, **body}})

        app = web.Application()
        app.router.add_get("/v1/models", self.models_handler)
        app.router.add_post("/v1/completions", self.handler)
        app.router.add_get("/gpuchef/v1/scheduler", get)
        app.router.add_patch("/gpuchef/v1/scheduler", patch)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_a_setting_the_server_refuses_is_one_error_before_any_request():
    s = KnobFake().start()
    try:
        one_error(ab("--base-url", s.url, "--a", "budget=16", "--b", "budget=1024", *FAST),
                  "setting A (max_num_batched_tokens=16)", s.url, "below this engine's floor")
        assert s.n_requests == 0
        # the server was put back as found: the last PATCH is its initial state
        assert s.patches[-1]["max_num_batched_tokens"] == 2048
    finally:
        s.stop()


def test_report_of_a_hosted_and_a_client_trace_says_n_a_for_the_client_groups(servers, tmp_path):
    """One report of the server's own trace (steps) beside a client's A/B trace (none): the
    engine-step rows hold the server's counts and "n/a" for the client's groups, not 0, and
    the note names those groups."""
    from gpuchef.report.data import build
    from gpuchef.report.html import no_steps_note, results_rows

    a, b = servers
    tr = tmp_path / "c.jsonl"
    r = ab("--a", f"url={a.url}", "--b", f"url={b.url}", "--num-prompts", "2", "--input-len",
           "16", "--output-len", "2", "--request-rate", "8", "--trace", str(tr))
    assert r.exit_code == 0, r.output
    time.sleep(1.0)  # the server's trace flushes every 0.5 s
    data = build([a.trace, tr], percentiles=(50.0, 99.0))
    client = [g for g in data.groups if g.view.trace.path == tr]
    hosted = [g for g in data.groups if g.view.trace.path != tr]
    assert len(client) == 2 and hosted
    rows = results_rows(data.groups)
    cells = dict(zip((g.short for g in data.groups),
                     next(x for x in rows if x[0] == "Engine steps")[1:]))
    for g in client:
        assert cells[g.short] == "n/a"
    assert sum(int(cells[g.short]) for g in hosted) == len(read_trace(a.trace).steps) > 0
    for label in ("Mixed prefill+decode steps", "Preemptions"):
        assert [next(x for x in rows if x[0] == label)[1:][data.groups.index(g)]
                for g in client] == ["n/a", "n/a"]
    assert no_steps_note(data.groups).startswith(
        f" No engine-step rows for {', '.join(g.short for g in client)}: the trace holds no "
        "steps — the load went over HTTP")
    assert no_steps_note(hosted) == ""


def test_progress_lines_count_load_requests_not_probes(fakes, tmp_path):
    """With --probe-interval the progress line of each repetition counts the load's requests
    (the results' ``completed``), the probes named apart; they were counted as load."""
    s1, s2 = fakes
    rj = tmp_path / "r.json"
    r = ab("--a", f"url={s1.url}", "--b", f"url={s2.url}", *FAST, "--probe-interval", "0.05",
           "--result-json", str(rj))
    assert r.exit_code == 0, r.output
    d = json.loads(rj.read_text())
    prog = [ln for ln in r.stderr.splitlines() if ln.startswith("repetition ")]
    assert prog
    for ln in prog:
        for k in "AB":
            m = re.search(rf"{k} (\d+) requests in [\d.]+ s \(\+(\d+) probes\)", ln)
            assert m, ln
            assert int(m.group(1)) == d["results"][k]["completed"] == 4


def test_one_repetition_the_default_gives_no_verdict_and_says_how_to_get_one(servers, tmp_path):
    """--repetitions defaults to 1: a quick look. A's 16-token budget makes its TTFT far larger
    than B's (known sign), yet one pair has no noise estimate, so no row says B better or worse;
    the table says why and how to get one, and --help says what the default gives."""
    a, b = servers
    rj = tmp_path / "r.json"
    r = ab("--a", f"url={a.url}", "--b", f"url={b.url}", *LOAD, "--result-json", str(rj))
    assert r.exit_code == 0, r.output
    d = json.loads(rj.read_text())
    ttft = row(d, "mean_ttft_ms")
    assert len(ttft["a_runs"]) == len(ttft["b_runs"]) == 1
    assert ttft["b_runs"][0] < ttft["a_runs"][0]  # the effect is there
    assert {x["verdict"] for x in d["comparison"]["deltas"]}.isdisjoint({"B better", "B worse"})
    assert ttft["verdict"] == verdict_of(ttft)
    assert (f"a verdict needs {abdef.MIN_REPETITIONS} (--repetitions {abdef.MIN_REPETITIONS} "
            "or more)") in r.output
    table = r.output.split(" B − A: ")[1].split("\n-----")[0]  # the rows, not the legend
    assert "Mean TTFT" in table and "B better" not in table and "B worse" not in table
    h = ab("--help").output.replace("\n", " ")
    assert "[default: 1]" in h and "no noise estimate" in " ".join(h.split()), h


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
