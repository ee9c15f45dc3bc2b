"""gpuchef.serve.process: the HTTP server's process, watched from the engine's side. When it dies
(the OOM killer's SIGKILL) `gpuchef serve` exits with status 1 and one line saying so, as it
does when the engine dies (docs/serve.md), so that a supervisor restarts it — never running on
with nothing listening."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

import psutil

from serve_proc import ServeProc


def test_serve_exits_1_when_its_http_process_is_killed(tmp_path):
    trace = tmp_path / "t.jsonl"
    with ServeProc("--trace", str(trace), "--sample-hz", "0") as s:
        with urllib.request.urlopen(s.url + "/health", timeout=10) as r:
            assert r.status == 200
        # the HTTP server's process is the child that listens on the port (the engine's own
        # process is another child)
        port = int(s.url.rsplit(":", 1)[-1])
        kids = psutil.Process(s.proc.pid).children()
        http = [k for k in kids if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                                       for c in k.net_connections("tcp"))]
        assert len(http) == 1, [k.cmdline() for k in kids]
        os.kill(http[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        rc = s.proc.wait(15)
        took = time.monotonic() - t0
        time.sleep(0.2)  # the reader thread takes the last lines
        assert rc == 1, s.stderr
        assert took < 5, took
        assert "the HTTP server process is gone (killed by SIGKILL)" in s.stderr, s.stderr
        assert f"nothing listens on {s.url}" in s.stderr
        assert "Traceback" not in s.stderr
        host, port = s.url.rsplit("/", 1)[-1].rsplit(":", 1)
        with socket.socket() as c:  # nothing listens any more
            assert c.connect_ex((host, int(port))) != 0
    # the engine was stopped cleanly: the trace has its end record
    assert '"type":"end"' in trace.read_text().splitlines()[-1]


import pytest  # noqa: E402

#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
