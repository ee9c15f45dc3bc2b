"""``POST /start_profile`` and ``POST /stop_profile``: in gpuchef a profile is a session trace
of the window between the two calls (vLLM's pair starts and stops the torch profiler; AIPerf's
``--server-profiler`` calls them around its run).

``ProfileSwitch`` lives in the engine's process, beside the ``--trace`` recorder, and is fed
the same records (steps, requests, events, GPU samples); the HTTP server's process reaches it
through the bridge (process.py: ``RemoteHost.profile``). A ``--trace`` being written does not
stand in the way: the profile is a file of its own.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..engine_host.vocab.errors import ConfigError


class ProfileError(Exception):
    """A profile request refused: ``status`` is the HTTP status to answer (409: already
    started / not started; 500: the file cannot be written; 501: no profiles here)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ProfileSwitch:
    """Writes a trace while a profile is on. ``meta``: the trace's meta record (as ``--trace``
    writes it; ``"profile": true`` is added); ``directory``: where the files go (created when
    the first profile starts); ``trace_prompts``: as ``--trace-prompts``.

    ``record`` is a sink of the host (a RecordBatch) and the samplers' listener (a sample): one
    attribute read when off. ``start()`` / ``stop()`` return the file's path or raise
    ProfileError; ``close()`` stops a profile still on (the server's shutdown). ``note``: called
    with one line when a profile starts or ends (`gpuchef serve` prints it)."""

    def __init__(self, meta: dict[str, Any], directory: str | Path = ".", *,
                 trace_prompts: bool = False, note: Callable[[str], None] | None = None) -> None:
        self.meta = {**meta, "profile": True}
        self.directory = Path(directory).expanduser()
        self.trace_prompts = trace_prompts
        self.note = note or (lambda _msg: None)
        self._rec: Any = None
        self._lock = threading.Lock()

    def record(self, rec: Any) -> None:
        r = self._rec
        if r is not None:  # one closed meanwhile drops the record (TraceRecorder counts it)
            r.record(rec)

    def _new_path(self) -> Path:
        stem = f"gpuchef-profile-{time.strftime('%Y%m%d-%H%M%S')}"
        path = self.directory / f"{stem}.jsonl"
        n = 1
        while path.exists():  # two profiles in one second: never overwrite the first
            n += 1
            path = self.directory / f"{stem}-{n}.jsonl"
        return path

    def start(self) -> str:
        from ..probes.recorder import TraceRecorder

        with self._lock:
            if self._rec is not None:
                raise ProfileError(409, f"a profile is already being written to "
                                        f"{self._rec.path}: POST /stop_profile first")
            path = self._new_path()
            try:
                self._rec = TraceRecorder(path, meta=self.meta, trace_prompts=self.trace_prompts)
            except ConfigError as e:
                raise ProfileError(500, f"the profile {str(path)!r} cannot be written: "
                                        f"{str(e).split(': ', 1)[-1]}") from None
            self.note(f"profile: writing {path} (POST /stop_profile ends it)")
            return str(path)

    def stop(self) -> str:
        with self._lock:
            rec = self._rec
            if rec is None:
                raise ProfileError(409, "no profile is being written: POST /start_profile first")
            self._rec = None
            rec.close()  # writes what is queued and the end record
            self.note(f"profile: {rec.path} written")
            return str(rec.path)

    def close(self) -> None:
        try:
            self.stop()
        except ProfileError:
            pass
