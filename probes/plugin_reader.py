"""Reader of gpuchef's vLLM stat-logger plugin (``gpuchef.vllm_plugin``): connects to one or
several publishers (``tcp://127.0.0.1:PORT``, one per vLLM server), yields their records, and
keeps per-(server, engine_idx) sequence accounting so that a dashboard sees gaps and what the
publisher said it dropped.

Each record carries ``seq``, 0, 1, 2, ... per (publisher, engine_idx) over every ``record()`` call
vLLM made, and a header with ``dropped``: how many records of that engine the publisher could
not queue for *this* reader (cumulative since the reader registered). Between two consecutive
records of a stream the reader counts

- ``gap``: the seq numbers skipped;
- ``gap_dropped``: the growth of ``dropped``: of the gap, what the publisher knowingly dropped for
  this reader (its queue was full: the reader was slow or stalled);
- the rest (``StreamStats.unexplained``) was lost without the publisher knowing: the connection
  broke and was made again (records made then were never queued for this reader), or a reader
  that had not registered yet.

A stream starts at its first record (the seq numbers before it were made before this reader
came; they are not gaps). A new publisher id (vLLM restarted) or a seq that goes back starts the
stream again (``restarts``).

Use: ``poll()`` / ``records()`` in the caller's thread, or ``start()`` a background thread and
read ``snapshot()`` from any thread (the dashboard's way). zmq sockets belong to one thread: with
``start()`` only that thread touches them.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

import msgspec

from .plugin_wire import BYE, HELLO, Header, PluginRecord

#: how often a reader says HELLO (a publisher that restarted, or dropped it, learns of it again)
HEARTBEAT_S = 1.0


@dataclass(frozen=True)
class Received:
    """One record as this reader received it."""

    server: str  # the URL it came from
    record: PluginRecord
    dropped: int  # the header: records of this engine the publisher dropped for this reader
    gap: int  # seq numbers of this stream skipped right before this record
    gap_dropped: int  # of the gap, the publisher's count of its drops for this reader
    restarted: bool  # the first record of its stream (or of a restarted publisher)
    recv_ns: int  # time.time_ns() here when it was decoded
    #: time.monotonic_ns() here when it was decoded (0: not known): the session's time axis
    recv_mono_ns: int = 0

    @property
    def t_ns(self) -> int:
        """Where a trace places this record: when this process received it (monotonic ns)."""
        return self.recv_mono_ns


@dataclass
class StreamStats:
    """Accounting of one (server, engine_idx) stream."""

    server: str
    engine_idx: int
    pub: int = 0
    received: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    missing: int = 0  # seq numbers skipped since the stream (re)started
    reported_dropped: int = 0  # of those, what the publisher counted as dropped for us
    restarts: int = 0  # publisher id changed, or seq went back
    last_dropped: int = 0  # the last header's ``dropped``
    last_recv_ns: int = 0
    last: PluginRecord | None = None

    @property
    def unexplained(self) -> int:
        """Skipped records the publisher did not report dropping (lost on a reconnect)."""
        return self.missing - self.reported_dropped


class SeqAccounts:
    """Per-(server, engine_idx) sequence and drop accounting; no sockets (tests feed it)."""

    def __init__(self):
        self.streams: dict[tuple[str, int], StreamStats] = {}

    def ingest(self, server: str, dropped: int, rec: PluginRecord, recv_ns: int = 0,
               recv_mono_ns: int = 0) -> Received:
        key = (server, rec.engine_idx)
        st = self.streams.get(key)
        fresh = st is None
        if st is None:
            st = self.streams[key] = StreamStats(server, rec.engine_idx)
        elif rec.pub != st.pub or st.last_seq is None or rec.seq <= st.last_seq:
            st.restarts += 1
            fresh = True
        if fresh:
            st.pub = rec.pub
            st.first_seq = rec.seq
            gap = gap_dropped = 0
        else:
            gap = rec.seq - st.last_seq - 1
            # the count restarts at 0 when the publisher registered us again (a reconnect)
            gap_dropped = dropped - st.last_dropped if dropped >= st.last_dropped else dropped
            st.missing += gap
            st.reported_dropped += gap_dropped
        st.last_seq = rec.seq
        st.last_dropped = dropped
        st.received += 1
        st.last_recv_ns = recv_ns
        st.last = rec
        return Received(server, rec, dropped, gap, gap_dropped, fresh, recv_ns, recv_mono_ns)


@dataclass(frozen=True)
class ReaderSnapshot:
    """A consistent copy of a reader's state, safe to keep and read from any thread."""

    taken_ns: int
    streams: dict[tuple[str, int], StreamStats]
    #: the newest records of each stream, oldest first (at most ``keep`` of them)
    recent: dict[tuple[str, int], tuple[Received, ...]]
    #: per server: messages that were not a gpuchef record (wrong frames, undecodable)
    bad_frames: dict[str, int] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        """received, missing, reported_dropped, unexplained over every stream."""
        out = {"received": 0, "missing": 0, "reported_dropped": 0, "unexplained": 0}
        for st in self.streams.values():
            out["received"] += st.received
            out["missing"] += st.missing
            out["reported_dropped"] += st.reported_dropped
            out["unexplained"] += st.unexplained
        return out


def normalize_url(url: str) -> str:
    """``127.0.0.1:PORT`` -> ``tcp://127.0.0.1:PORT``; a ``tcp://`` URL as it is."""
    url = url.strip()
    return url if "://" in url else f"tcp://{url}"


class PluginReader:
    """Connects to the publishers at ``urls`` (a DEALER socket each; zmq reconnects by itself,
    and the reader may start before vLLM does). ``on_record(received)``: called for each record
    in the thread that polls (the reader's own after ``start()``), after it is counted; it must
    return quickly and not raise."""

    def __init__(self, urls: str | Iterable[str], *, heartbeat_s: float = HEARTBEAT_S,
                 rcvhwm: int = 10_000, rcvbuf: int | None = None, keep: int = 2048,
                 on_record: Callable[[Received], None] | None = None):
        import zmq

        self._zmq = zmq
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("no publisher URL")
        self.urls = [normalize_url(u) for u in urls]
        if len(set(self.urls)) != len(self.urls):
            raise ValueError(f"a publisher URL is given twice: {self.urls}")
        self.heartbeat_s = heartbeat_s
        self._keep = keep
        self._on_record = on_record
        self._dec_head = msgspec.msgpack.Decoder(Header)
        self._dec_rec = msgspec.msgpack.Decoder(PluginRecord)
        self._ctx = zmq.Context(io_threads=1)
        self._socks: dict[object, str] = {}
        try:
            for url in self.urls:
                s = self._ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.ROUTING_ID, b"gpuchef-reader-" + secrets.token_hex(8).encode())
                s.setsockopt(zmq.RCVHWM, rcvhwm)
                s.setsockopt(zmq.SNDHWM, 4)  # HELLOs queued while unconnected: a few are enough
                if rcvbuf is not None:
                    s.setsockopt(zmq.RCVBUF, rcvbuf)
                if "[" in url:
                    s.setsockopt(zmq.IPV6, 1)
                s.connect(url)
                self._socks[s] = url
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._poller = zmq.Poller()
        for s in self._socks:
            self._poller.register(s, zmq.POLLIN)
        self._lock = threading.Lock()
        self._accounts = SeqAccounts()
        self._recent: dict[tuple[str, int], deque] = {}
        self._bad: dict[str, int] = {u: 0 for u in self.urls}
        self._last_hello = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._hello()

    # -- sockets (the owning thread only) -------------------------------------------------------
    def _hello(self, msg: bytes = HELLO) -> None:
        for s in self._socks:
            try:
                s.send(msg, self._zmq.NOBLOCK)
            except self._zmq.Again:
                pass
        self._last_hello = time.monotonic()

    def _check_thread(self) -> None:
        t = self._thread
        if t is not None and t.is_alive() and threading.get_ident() != t.ident:
            raise RuntimeError("this reader runs its own thread (start()): read snapshot()")
        if self._closed:
            raise RuntimeError("the reader is closed")

    def poll(self, timeout_s: float = 0.0, max_records: int = 100_000) -> list[Received]:
        """The records that arrived, waiting up to ``timeout_s`` for the first one."""
        self._check_thread()
        zmq = self._zmq
        if time.monotonic() - self._last_hello >= self.heartbeat_s:
            self._hello()
        out: list[Received] = []
        ready = dict(self._poller.poll(max(0.0, timeout_s) * 1000))
        if not ready:
            return out
        for s, url in self._socks.items():
            while len(out) < max_records:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                recv_ns, recv_mono = time.time_ns(), time.monotonic_ns()
                try:
                    head, body = frames
                    dropped = self._dec_head.decode(head).dropped
                    rec = self._dec_rec.decode(body)
                except (ValueError, msgspec.DecodeError):
                    with self._lock:
                        self._bad[url] += 1
                    continue
                with self._lock:
                    got = self._accounts.ingest(url, dropped, rec, recv_ns, recv_mono)
                    key = (url, rec.engine_idx)
                    ring = self._recent.get(key)
                    if ring is None:
                        ring = self._recent[key] = deque(maxlen=self._keep)
                    ring.append(got)
                out.append(got)
                if self._on_record is not None:
                    self._on_record(got)
        return out

    def records(self, idle_timeout_s: float | None = None) -> Iterator[Received]:
        """Yield records as they come; stop after ``idle_timeout_s`` without one (None: never)."""
        last = time.monotonic()
        while True:
            got = self.poll(0.1)
            if got:
                last = time.monotonic()
                yield from got
            elif idle_timeout_s is not None and time.monotonic() - last >= idle_timeout_s:
                return

    # -- a background thread and its snapshot ---------------------------------------------------
    def start(self) -> PluginReader:
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(target=self._run, name="gpuchef-plugin-reader",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll(0.05)

    def snapshot(self) -> ReaderSnapshot:
        with self._lock:
            return ReaderSnapshot(
                taken_ns=time.time_ns(),
                streams={k: replace(v) for k, v in self._accounts.streams.items()},
                recent={k: tuple(v) for k, v in self._recent.items()},
                bad_frames=dict(self._bad),
            )

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._closed = True
        try:
            self._hello(BYE)
        finally:
            for s in self._socks:
                s.close(linger=100)  # a moment for the BYE to go out
            self._ctx.term()

    def __enter__(self) -> PluginReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- as a trace record (probes.recorder's ``plugin`` type, docs/trace-format.md) ------------------
_JSON_INTS = ("t_ns", "recv_ns", "dropped", "gap", "gap_dropped")


def received_to_json(got: Received) -> dict:
    """``got`` as a trace's ``plugin`` record: when it arrived here (``t_ns``: monotonic ns, the
    trace's axis; ``recv_ns``: Unix ns), from which server, its accounting, and the
    PluginRecord's fields as the wire carries them (defaults left out)."""
    return {"t_ns": got.recv_mono_ns, "recv_ns": got.recv_ns, "server": got.server,
            "dropped": got.dropped, "gap": got.gap, "gap_dropped": got.gap_dropped,
            "restarted": got.restarted, "record": msgspec.to_builtins(got.record)}


def received_from_json(d: dict) -> Received:
    """The Received that :func:`received_to_json` wrote. Raises ValueError naming the field
    that is missing, of the wrong type or negative."""
    for k in _JSON_INTS:
        v = d.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"plugin field {k}={v!r} is not an int >= 0")
    if not isinstance(d.get("server"), str) or not isinstance(d.get("restarted"), bool):
        raise ValueError("plugin record lacks its server (str) or restarted (bool)")
    if not isinstance(d.get("record"), dict):
        raise ValueError("plugin record lacks its record (an object)")
    try:
        rec = msgspec.convert(d["record"], PluginRecord)
    except msgspec.ValidationError as e:
        raise ValueError(f"plugin record: {e}") from None
    return Received(d["server"], rec, d["dropped"], d["gap"], d["gap_dropped"], d["restarted"],
                    d["recv_ns"], d["t_ns"])
