"""`gpuchef serve` as a subprocess on a free loopback port, for tests (started and stopped by
the test; nothing listens beyond 127.0.0.1)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

URL_RE = re.compile(r"on (http://[0-9.\[\]:a-f]+:\d+) ")


class ServeProc:
    """``with ServeProc("--max-model-len", "512") as s: s.url`` — the server's base URL.

    ``args``: extra `gpuchef serve` flags (``--device cpu --model tiny --port 0`` are given).
    ``stderr`` keeps what the server printed. Raises RuntimeError when it does not come up.
    """

    def __init__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120.0,
                 model: str = "tiny") -> None:
        self.args = ["--device", "cpu", "--model", model, "--port", "0", *args]
        self.env = {**os.environ, **(env or {})}
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.lines: list[str] = []

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def __enter__(self) -> "ServeProc":
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuchef", "serve", *self.args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env)
        found = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                m = URL_RE.search(line)
                if m and not self.url:
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        found.wait(self.timeout)
        if not self.url:
            self.stop()
            raise RuntimeError(f"gpuchef serve did not start:\n{self.stderr}")
        return self

    def stop(self) -> int:
        p = self.proc
        if p is None:
            return 0
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        return p.returncode

    def __exit__(self, *exc) -> None:
        self.stop()


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuchef", *args], capture_output=True,
                          text=True, timeout=timeout)


def wait_until(cond, timeout: float = 20.0, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(every)
    return cond()


class PrometheusProc:
    """Debian's ``prometheus`` on a free loopback port scraping ``targets`` (host:port) every
    second: ``with PrometheusProc(targets, tmp_path) as p: p.url``. Stopped by the test."""

    def __init__(self, targets: list[str], workdir: Path) -> None:
        import json
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = Path(workdir)
        (self.workdir / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: gpuchef\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "PrometheusProc":
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


__all__ = ["PrometheusProc", "ServeProc", "run_cli", "wait_until", "Path"]
