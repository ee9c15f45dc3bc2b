"""Stopping `gpuchef serve` (SIGTERM, as Ctrl-C) with requests in flight: each ends with
finish_reason "abort" — a stream with its last chunk and ``data: [DONE]``, a non-streaming
request with its response — and the exit leaves no asyncio task behind. The trace (written by
the engine's process) is the reference for which requests were in flight."""

from __future__ import annotations

import http.client as hc
import json
import signal
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

from serve_proc import ServeProc, wait_until

pytest.importorskip("aiohttp")
from gpuchef.probes.recorder import read_trace  # noqa: E402
from gpuchef.serve.server import SHUTDOWN_GRACE_S  # noqa: E402
from test_serve import http, metrics, one  # noqa: E402

BODY = {"prompt": [7] * 32, "max_tokens": 4000, "ignore_eos": True}


def _post(u, body) -> hc.HTTPConnection:
    conn = hc.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    return conn


def test_sigterm_ends_streams_and_whole_requests_with_abort_then_exits(tmp_path):
    trace = tmp_path / "s.jsonl"
    s = ServeProc("--trace", str(trace)).__enter__()
    try:
        u = urlparse(s.url)
        # a client that goes away mid-request (non-streaming): its waiter was once left pending
        gone = _post(u, BODY)
        assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") == 1)
        gone.sock.shutdown(socket.SHUT_RDWR)
        gone.close()
        assert wait_until(lambda: one(metrics(s), "gpuchef:request_aborted_total") == 1)
        # in flight at the signal: one stream, one whole request
        conn = _post(u, {**BODY, "stream": True})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        whole: list = []
        t = threading.Thread(target=lambda: whole.append(
            http("POST", s.url + "/v1/completions", BODY)), daemon=True)
        t.start()
        assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") == 2)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        rest = resp.read().decode()  # raises IncompleteRead when the stream is cut
        t.join(30)
        rc = s.proc.wait(30)
        took = time.monotonic() - t0
    finally:
        s.stop()
    events = [ln[len("data: "):] for ln in rest.split("\n\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]", rest[-300:]
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "abort", last
    assert all(json.loads(e)["choices"][0]["finish_reason"] is None for e in events[:-2])
    (st, body), = whole
    assert st == 200, body
    assert body["choices"][0]["finish_reason"] == "abort"
    assert 0 < body["usage"]["completion_tokens"] < 4000
    assert rc == 0 and took < SHUTDOWN_GRACE_S + 15, (rc, took)
    assert "Task was destroyed" not in s.stderr, s.stderr
    assert "Traceback" not in s.stderr, s.stderr
    reqs = read_trace(trace).requests
    assert len(reqs) == 3 and {r.finish_reason for r in reqs} == {"abort"}


def test_no_pending_task_left_at_exit_after_clients_went_away():
    with ServeProc() as s:
        u = urlparse(s.url)
        for body in (BODY, {**BODY, "prompt": [[7] * 32, [8] * 32]}):  # one choice, a batch
            gone = _post(u, body)
            assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") >= 1)
            gone.sock.shutdown(socket.SHUT_RDWR)
            gone.close()
            assert wait_until(lambda: one(metrics(s), "vllm:num_requests_running") == 0)
        assert s.stop() == 0
    assert "Task was destroyed" not in s.stderr, s.stderr


#: minutes on a 2-core machine together with the other slow files: the full run only
pytestmark = pytest.mark.slow
