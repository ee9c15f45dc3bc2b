"""probes/prometheus.py: a fleet read through the Prometheus HTTP API gives what scraping each
server's /metrics gives — checked against a real Prometheus (Debian's `prometheus`) scraping
two `gpuchef serve` on loopback, and, without one, against prometheus_client's own exposition
and parser."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpuchef.probes.prometheus import PrometheusFleet, column_key, to_text
from gpuchef.probes.scrape import parse_metrics


def _series_of(text: str) -> list[tuple[str, dict[str, str], float]]:
    """What Prometheus stores of an exposition: every sample as (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def _exposition() -> str:
    """A vLLM-like exposition made by prometheus_client itself: gauges, counters, a labelled
    histogram (two engines), and an unrelated series."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    g = Gauge("vllm:num_requests_running", "r", ["engine"], registry=reg)
    g.labels("0").set(3)
    g.labels("1").set(4)
    Gauge("vllm:kv_cache_usage_perc", "kv", registry=reg).set(0.25)
    c = Counter("vllm:prompt_tokens", "p", registry=reg)
    c.inc(1234)
    Counter("vllm:generation_tokens", "g", registry=reg).inc(99)
    h = Histogram("vllm:e2e_request_latency_seconds", "e2e", ["engine"],
                  buckets=(0.5, 1.0, 2.5, 5.0), registry=reg)
    for v in (0.2, 0.7, 3.0, 9.0):
        h.labels("0").observe(v)
    h.labels("1").observe(1.5)
    Gauge("process_open_fds", "x", registry=reg).set(7)
    return generate_latest(reg).decode()


def test_series_written_back_read_as_the_exposition_itself():
    text = _exposition()
    want = parse_metrics(text, url="u", t_ns=1)
    got = parse_metrics(to_text(_series_of(text)), url="u", t_ns=1)
    assert got.values == want.values and got.hists == want.hists
    assert got.server == want.server == "vllm"
    assert want.values["prompt_tokens"] == 1234 and want.hists["e2e"].count == 5


def test_columns_split_by_instance_and_engine_label():
    # a canned /api/v1/query reply: two instances, one with two engines
    text = _exposition()
    result = []
    for inst in ("10.0.0.1:8000", "10.0.0.2:8000"):
        for name, lab, v in _series_of(text):
            if inst.startswith("10.0.0.2") and "engine" in lab:
                continue
            result.append({"metric": {"__name__": name, "instance": inst, "job": "vllm", **lab},
                           "value": [1700000000.5, repr(v)]})
    replies = {"query": {"status": "success",
                         "data": {"resultType": "vector", "result": result}}}
    fleet = PrometheusFleet("http://prom:9090",
                            fetch=lambda url, t: json.dumps(replies["query"]))
    s = fleet.sample()
    # two engines: a column each, with the instance's series that name no engine in both
    assert set(s) == {column_key("10.0.0.1:8000", "0"), column_key("10.0.0.1:8000", "1"),
                      column_key("10.0.0.2:8000")}
    e0, e1 = "http://10.0.0.1:8000#engine=0", "http://10.0.0.1:8000#engine=1"
    assert s[e0].values["running"] == 3 and s[e1].values["running"] == 4
    assert s[e1].hists["e2e"].count == 1 and s[e0].hists["e2e"].count == 4
    assert s[e1].values["prompt_tokens"] == 1234
    assert s["http://10.0.0.2:8000"].values["prompt_tokens"] == 1234
    # the same timestamps again: Prometheus has not scraped since, so nothing new
    assert fleet.sample() == {}
    assert len(fleet.sample(only_new=False)) == 3


@pytest.mark.parametrize("reply, says", [
    ("<html>not json</html>", "not JSON"),
    ('{"status": "error", "error": "bad query"}', "bad query"),
])
def test_a_reply_that_is_not_the_prometheus_api_is_one_line(reply, says):
    fleet = PrometheusFleet("http://prom:9090", fetch=lambda url, t: reply)
    with pytest.raises(ConnectionError, match=says) as e:
        fleet.targets()
    assert "\n" not in str(e.value) and "http://prom:9090/api/v1/targets" in str(e.value)


def test_unreachable_server_and_bad_url_are_one_line():
    port = _free_port()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}.*cannot reach it"):
        PrometheusFleet(f"http://127.0.0.1:{port}", timeout_s=2).targets()
    with pytest.raises(ValueError, match="not an http"):
        PrometheusFleet("127.0.0.1:9090")


# -- a real Prometheus scraping two `gpuchef serve` ------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="needs Debian's prometheus (.ci/run installs it)")
def test_real_prometheus_scraping_two_gpuchef_servers(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpuchef"))
    from serve_proc import PrometheusProc, ServeProc, wait_until
    from openai import OpenAI

    with ServeProc() as a, ServeProc() as b:
        inst = [u.split("://", 1)[1] for u in (a.url, b.url)]
        cols = [a.url, b.url]  # the columns are named by the servers' base URLs
        prom = PrometheusProc(inst, tmp_path).__enter__()
        port = prom.port
        try:
            fleet = PrometheusFleet(f"http://127.0.0.1:{port}")

            def up():
                try:
                    t = fleet.targets()
                except ConnectionError:
                    return False
                return len(t) == 2 and all(x.health == "up" for x in t) and t
            targets = wait_until(up, 60, 0.5)
            assert targets, "Prometheus never scraped both servers"
            assert sorted(t.instance for t in targets) == sorted(inst)
            assert all(t.job == "gpuchef" and t.scrape_url.endswith("/metrics")
                       for t in targets)
            # load on the first server only
            c = OpenAI(base_url=a.url + "/v1", api_key="x")
            for n in (5, 9, 17):
                c.completions.create(model="tiny", prompt=[11] * n, max_tokens=4)
            direct = {u: parse_metrics(_get(u + "/metrics")) for u in cols}
            # until Prometheus has scraped both after the load (the servers are idle now)
            def caught_up():
                s = fleet.sample(only_new=False)
                ok = all(k in s and s[k].values.get("requests_finished") ==
                         direct[k].values.get("requests_finished") for k in cols)
                return ok and s
            got = wait_until(caught_up, 30, 0.5)
            assert got, "Prometheus's values never matched the servers' own /metrics"
            for k in cols:
                assert got[k].server == direct[k].server == "gpuchef"
                for q in ("prompt_tokens", "generation_tokens", "requests_finished", "running",
                          "waiting", "kv_usage"):
                    assert got[k].values.get(q) == pytest.approx(direct[k].values.get(q)), q
                for q in ("e2e", "ttft"):
                    assert got[k].hists[q] == direct[k].hists[q], q
            assert got[cols[0]].values["prompt_tokens"] == 5 + 9 + 17
            assert got[cols[0]].hists["e2e"].count == 3
            assert got[cols[1]].values.get("prompt_tokens", 0) == 0
            # the same over a time range (what `report --prometheus` reads): per column, one
            # sample a step, counters never going back, ending where the servers are
            now = time.time()
            hist = fleet.history(now - 30, now, 1.0)
            assert set(hist) == set(cols)
            for k in cols:
                ps = [x.values.get("prompt_tokens", 0.0) for x in hist[k]]
                assert len(ps) >= 2 and ps == sorted(ps)  # from its first scrape
                assert ps[-1] == direct[k].values.get("prompt_tokens", 0.0)
                ts = [x.t_ns for x in hist[k]]
                assert ts == sorted(ts) and ts[1] - ts[0] == 1_000_000_000
            with pytest.raises(ValueError, match="allowed a start before the end"):
                fleet.history(now, now - 5, 1.0)
        finally:
            prom.__exit__()
