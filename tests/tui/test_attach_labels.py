"""`top --attach`: the server's TTFT (its /metrics histogram, every client's first tokens in the
scrape intervals of the stats window) and the client's TTFT (gpuchef's own requests finished in
that window) count different requests; the numbers panel and the server latency chart say which
is which and over what window. Pilot on a fake attached session whose server histogram and
client requests have known, different TTFTs (every first token in the (0.5, 0.75] s bucket:
the server's p50 reads as that bucket, "500–750 ms", not Prometheus' interpolated 625 ms;
the client's 40 ms exactly)."""

from __future__ import annotations

import asyncio

from gpuchef.engine_host.vocab.config import SchedulerConfig
from gpuchef.engine_host.vocab.records import RequestRecord
from gpuchef.probes.scrape import delta, parse_metrics
from gpuchef.probes.timeline import Timeline
from gpuchef.sessions.attach_plugin import PluginSource
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.session import ABState, LoadState, SessionInfo

T0 = 1_000_000_000_000
URL = "http://127.0.0.1:8000"
WINDOW_S = 20.0


def _vllm_text(n: int) -> str:
    """vLLM's names: queue gauges and a TTFT histogram with ``n`` first tokens, all in the
    (0.5, 0.75] s bucket."""
    lab = 'model_name="m"'
    return "\n".join([
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} 3",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} 1",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        *[f'vllm:time_to_first_token_seconds_bucket{{le="{le}",{lab}}} {c}'
          for le, c in (("0.25", 0), ("0.5", 0), ("0.75", n), ("+Inf", n))],
        f"vllm:time_to_first_token_seconds_count{{{lab}}} {n}",
        f"vllm:time_to_first_token_seconds_sum{{{lab}}} {0.6 * n}", ""])


class Server:
    """``tui.session.ScrapedServer``: 4 Hz scrapes over 10 s, two first tokens per interval."""

    hz = 4.0
    url = URL
    kind = "vllm"
    status = ""

    def __init__(self) -> None:
        self._s = [parse_metrics(_vllm_text(2 * i), url=URL + "/metrics", t_ns=T0 + i * 250_000_000)
                   for i in range(41)]
        self._d = [delta(a, b) for a, b in zip(self._s, self._s[1:])]

    def samples(self):
        return tuple(self._s)

    def deltas(self):
        return tuple(self._d)


class NoLoad:
    REASON = "not gpuchef's load (a fake)"

    def state(self) -> LoadState:
        return LoadState("random", "random", 2.0)


class NoAB:
    def state(self) -> ABState:
        return ABState()


class Session:
    """``tui.session.AttachedSession`` over one fake server and 8 client requests (TTFT 40 ms)."""

    def __init__(self) -> None:
        self.now = T0 + 10_000_000_000
        self.clock = lambda: self.now
        self.start_ns = T0
        self.timeline = Timeline(origin_ns=T0, clock=self.clock)
        for k in range(8):
            a = T0 + 1_000_000_000 * (k + 1)
            self.timeline.add_request(RequestRecord(
                f"r{k}", a, 100, 4, tuple(a + (j + 1) * 40_000_000 for j in range(4)), "length",
                max_tokens=4))
        self.servers = (Server(),)
        self.plugin = PluginSource({})  # no --plugin
        self.info = SessionInfo("m", False, "remote", "(server's)", source=URL,
                                per_step_records=False)
        self.load, self.ab = NoLoad(), NoAB()
        self.slos: dict[str, float] = {}
        self.percentiles = (50.0, 99.0)
        self.stats_window_s = WINDOW_S
        self.knobs_reason = "read-only: no knob endpoint (a fake)"
        self.scheduler_config = SchedulerConfig()
        self.trace_path = None
        self.engine_error = None
        self.engine_paused = False
        self.status_lines: list[str] = []
        self.gpu_available = False
        self.gpu_status = "no --gpus"

    def close(self) -> None:
        pass


def test_server_and_client_ttft_say_whose_requests_and_over_what_window():
    app = GpuchefApp(Session(), fps=10, show_ui_cost=False)

    async def go():
        async with app.run_test(size=(180, 60)) as pilot:
            for _ in range(100):
                if getattr(app.screen, "ready", False):
                    break
                await pilot.pause(0.05)
            app.screen.tick(force=True)
            await pilot.pause()
            lines = [str(ln) for ln in
                     str(app.screen.query_one("#a-numbers").render()).splitlines()]
            i = lines.index(" server, /metrics histograms: every client's")
            j = lines.index(" client-side (ms, exact): gpuchef's own load only,")
            server, client = lines[i:j], lines[j:]
            assert server[1] == "  requests seen in the last 20 s (TTFT: first tokens)", lines
            assert server[2] == "  each percentile: the histogram bucket it is in", lines
            assert client[1] == "  its requests finished in the last 20 s", lines
            assert all(len(ln) <= 58 for ln in (*server[:3], *client[:2]))  # the side panel
            # each block holds its own requests' figures: the server's bucket, the client's 40 ms
            row = next(ln for ln in server if ln.startswith(" TTFT p50"))
            assert row.split(None, 2)[-1].strip() == "500–750 ms", server
            row = next(ln for ln in client if ln.startswith(" TTFT p50"))
            assert row.split()[-1] == "40.0", client
            p50 = app.screen.shown[URL]["ttft_p50"]  # seconds; the interpolated point is kept
            assert (p50.lower, p50.upper) == (0.5, 0.75) and p50.value == 0.625
            # the chart of the server's histograms says whose requests it draws
            title = app.screen.query_one("#a-latency")._strips[0].text
            assert "Server latency" in title and "every client's requests" in title, title
            await pilot.press("q")

    asyncio.run(go())
