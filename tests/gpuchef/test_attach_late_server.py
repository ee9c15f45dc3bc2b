"""`top --attach URL` where nothing listens yet: one status line names the URL, says it cannot
be reached and that the scraper keeps trying; when the server comes up the line goes and what
was asked only at start is asked again — the knob endpoint (the knobs go live) and
``GET /v1/models`` (the header's model). Before, the scrapes recovered but the knobs stayed
"read-only: cannot reach …" and the model "(server's model)" for the whole session."""

from __future__ import annotations

import socket

from test_attach import FakeServer, build, drive, wait_for


def _free_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def test_a_server_that_comes_up_later_is_picked_up_knobs_and_model_included(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    app = build(["--attach", url, "--scrape-hz", "10", "--screenshot-dir", str(tmp_path)])
    s = app.session
    servers = []

    def header() -> str:
        return str(app.screen.query_one("#a-header").render())

    async def go():
        async with app.run_test(size=(170, 50)) as pilot:
            assert await wait_for(pilot, lambda: len(s.servers[0].samples()) >= 2, 30)
            lines = s.status_lines
            assert len(lines) == 1, lines
            assert lines[0].startswith(f"{url}/metrics: cannot reach it (") and \
                lines[0].endswith("; retrying every 100 ms"), lines
            assert await wait_for(pilot, lambda: lines[0] in header(), 10)
            assert s.knobs_reason.startswith(f"read-only: cannot reach {url}/gpuchef/v1/"
                                             "scheduler"), s.knobs_reason
            assert "model (server's model)" in header()
            servers.append(FakeServer(knobs=True, port=port).__enter__())
            srv = servers[0]
            assert await wait_for(pilot, lambda: not s.status_lines, 30), s.status_lines
            assert await wait_for(pilot, lambda: s.knobs_reason == "", 30), s.knobs_reason
            assert s.scheduler_config.max_num_batched_tokens == \
                srv.state["max_num_batched_tokens"]
            assert await wait_for(pilot, lambda: "model fake" in header(), 10), header()
            assert s.server_info[url].models == ["fake"] and srv.model_gets >= 1
            await pilot.press("m")  # the knobs are live: the mode is PATCHed
            assert await wait_for(pilot, lambda: srv.state["mode"] == "continuous", 10)
            await pilot.press("q")

    try:
        drive(s, go)
    finally:
        for srv in servers:
            srv.__exit__(None, None, None)
