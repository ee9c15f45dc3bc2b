"""`top --attach`: a server percentile read from a /metrics histogram is shown as the bucket it
lies in, not as the interpolated point. A fake server (tests/gpuchef/test_attach.py) serves vLLM
0.24's captured /metrics text, then the same text with 100 more requests counted in its
``vllm:e2e_request_latency_seconds`` histogram: 95 under 2.5 s and 5 in (2.5, 5] s near 2.85 s.
The true p99 (the 99th smallest, nearest rank) is 2.85 s; Prometheus' histogram_quantile
interpolates 4.5 s inside the 2.5–5 s bucket, which the numbers panel used to show as
"4,500.0" ms. It now shows the bucket, "2.5–5 s", under a heading that says so."""

from __future__ import annotations

import re

from test_attach import LOAD, FakeServer, build, drive, wait_for

#: the added requests' E2E latencies (s)
OBS = [0.4] * 60 + [1.2] * 35 + [2.6, 2.7, 2.8, 2.85, 2.9]


def with_more_e2e(text: str, obs) -> str:
    """``text`` with the observations ``obs`` (s) added to each E2E bucket line's cumulative
    count, and to its _count and _sum (one label set in the captured text)."""
    def bucket(m: re.Match) -> str:
        le = float(m.group(2).replace("+Inf", "inf"))
        return f"{m.group(1)}{float(m.group(3)) + sum(1 for x in obs if x <= le)}"

    text = re.sub(r'^(vllm:e2e_request_latency_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} )(\S+)$',
                  bucket, text, flags=re.M)
    text = re.sub(r"^(vllm:e2e_request_latency_seconds_count\{[^}]*\} )(\S+)$",
                  lambda m: f"{m.group(1)}{float(m.group(2)) + len(obs)}", text, flags=re.M)
    return re.sub(r"^(vllm:e2e_request_latency_seconds_sum\{[^}]*\} )(\S+)$",
                  lambda m: f"{m.group(1)}{float(m.group(2)) + sum(obs)}", text, flags=re.M)


def cell(scr, label: str) -> str:
    """The first server's cell of the numbers panel's row ``label`` ("" when no such row)."""
    row = next((ln for ln in str(scr.numbers.render()).splitlines() if ln.startswith(label)), "")
    return row[len(label):].strip()


def test_e2e_p99_from_the_histogram_shows_its_bucket_bounds(tmp_path):
    after = with_more_e2e(LOAD, OBS)
    assert after != LOAD
    assert sorted(OBS)[98] == 2.85
    with FakeServer(LOAD) as srv:
        app = build(["--attach", srv.url, "--scrape-hz", "10",
                     "--screenshot-dir", str(tmp_path)])
        s = app.session
        server = s.servers[0]

        async def go():
            async with app.run_test(size=(170, 50)) as pilot:
                scr = app.screen
                assert await wait_for(pilot, lambda: len(server.deltas()) >= 1)
                srv.text = after  # 100 requests finished between two scrapes
                assert await wait_for(pilot, lambda: any(
                    d.hist_count.get("e2e") for d in server.deltas()))
                assert await wait_for(pilot, lambda: cell(scr, " E2E p99") not in ("", "–"))
                lines = str(scr.numbers.render()).splitlines()
                assert cell(scr, " E2E p99") == "2.5–5 s", lines  # was "4,500.0" (ms)
                assert cell(scr, " E2E p50") == "300–500 ms", lines
                assert "  each percentile: the histogram bucket it is in" in lines, lines
                got = scr.shown[server.url]["e2e_p99"]  # seconds
                assert (got.lower, got.upper) == (2.5, 5.0) and abs(got.value - 4.5) < 1e-9
                assert got.lower < 2.85 <= got.upper
                await pilot.press("q")

        drive(s, go)


import pytest  # noqa: E402

#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
