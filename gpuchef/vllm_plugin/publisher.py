"""The plugin's publisher: its configuration (``GPUCHEF_PUBLISH``) and its socket.

Transport: a zmq ROUTER socket bound on loopback TCP, records encoded by msgspec (msgpack), one
frame pair per registered reader. Why this and not the alternatives:

- **Never blocks vLLM.** ``record()`` runs on vLLM's asyncio output-handler task, between two
  engine batches. Every send is ``NOBLOCK``; zmq's I/O thread (C, no GIL) does the writing. No
  Python thread of ours runs in vLLM's process.
- **Drops are counted, exactly, per reader.** A plain PUB socket drops silently at its
  high-water mark: nobody would know. ROUTER with ``ROUTER_MANDATORY`` instead answers
  ``EAGAIN`` when one reader's queue (``SNDHWM`` messages, then the kernel's buffers) is full, so
  the publisher counts that record as dropped *for that reader*, and the count goes out with the
  next record it does hand over (``Header.dropped``, cumulative per reader and engine). One slow
  reader does not cost a fast one anything. ``EHOSTUNREACH`` (the reader is gone) unregisters it.
- **No reader, no work.** Records made while no reader is registered are counted (``unread``)
  and not encoded further than once; a reader that comes later sees where it joined from the
  per-engine sequence numbers.
- **Readers come and go.** A reader's DEALER socket reconnects by itself (vLLM restarted, the
  dashboard started first); it says ``HELLO`` every second so the publisher learns of it again.
- **Light.** pyzmq and msgspec are gpuchef dependencies already, both C; the engine core's own
  record stream (engine_host/core.py) uses the same pair. A plain TCP server would need a
  thread per reader in vLLM's process and its own framing and reconnection.

Loopback by default: a non-loopback host is refused unless ``GPUCHEF_PUBLISH_ALLOW_REMOTE=1``
(the records carry request timings of every client of the server).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import random
import threading
import time
from dataclasses import dataclass
from ..engine_host.vocab.errors import ConfigError

ENV_PUBLISH = "GPUCHEF_PUBLISH"
ENV_ALLOW_REMOTE = "GPUCHEF_PUBLISH_ALLOW_REMOTE"
ENV_HWM = "GPUCHEF_PUBLISH_HWM"
#: messages queued per reader before records are dropped for it (then the kernel's buffers)
DEFAULT_HWM = 1000
#: readers a publisher serves at once; HELLOs beyond are ignored
MAX_READERS = 16
#: inbound messages (HELLO/BYE) handled per record() at most
DRAIN_LIMIT = 64


@dataclass(frozen=True)
class PublishConfig:
    host: str  # an IP literal (IPv6 without brackets) or, with allow_remote, an interface
    port: int  # 0: a free port, chosen at bind (the log line and ``endpoint`` say which)
    hwm: int = DEFAULT_HWM

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_publish(value: str, *, allow_remote: bool = False, hwm: int = DEFAULT_HWM) -> PublishConfig:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; a leading ``tcp://`` is accepted) -> config."""
    text = value.strip()
    if text.startswith("tcp://"):
        text = text[len("tcp://"):]
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(f"{value!r} is not HOST:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise ConfigError(f"{value!r} is not HOST:PORT (an IPv6 host goes in brackets)")
    if not host:
        raise ConfigError(f"{value!r} has no host (127.0.0.1 for this machine only)")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{value!r}: the port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{value!r}: the port {port} is not in 0..65535")
    if host == "localhost":
        host = "127.0.0.1"
    if not _is_loopback(host) and not allow_remote:
        raise ConfigError(
            f"{host} is not a loopback address: the records carry every client's request timings, "
            f"so gpuchef publishes on loopback only unless {ENV_ALLOW_REMOTE}=1")
    if hwm < 1:
        raise ConfigError(f"{ENV_HWM}={hwm} is below 1")
    return PublishConfig(host, port, hwm)


def config_from_env(environ=None) -> PublishConfig | None:
    """None when ``GPUCHEF_PUBLISH`` is unset or empty (the plugin is off)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_PUBLISH, "").strip()
    if not value:
        return None
    allow_remote = env.get(ENV_ALLOW_REMOTE, "").strip() == "1"
    hwm_text = env.get(ENV_HWM, "").strip()
    try:
        hwm = int(hwm_text) if hwm_text else DEFAULT_HWM
    except ValueError:
        raise ConfigError(f"{ENV_HWM}={hwm_text!r} is not a number") from None
    return parse_publish(value, allow_remote=allow_remote, hwm=hwm)


class Publisher:
    """One bound ROUTER socket. ``publish()`` is called from one thread at a time (a lock makes
    sure); it never blocks: every send is NOBLOCK and inbound reading is bounded."""

    def __init__(self, config: PublishConfig):
        import msgspec
        import zmq

        from gpuchef.probes.plugin_wire import BYE, HELLO, WIRE_VERSION, Header

        self._zmq = zmq
        self._hello, self._bye, self._version, self._header = HELLO, BYE, WIRE_VERSION, Header
        self._enc = msgspec.msgpack.Encoder()
        self._header0 = self._enc.encode(Header(0))
        self.config = config
        self._ctx = zmq.Context(io_threads=1)  # its own: vLLM's contexts are none of ours
        try:
            sock = self._ctx.socket(zmq.ROUTER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            sock.setsockopt(zmq.SNDHWM, config.hwm)
            sock.setsockopt(zmq.RCVHWM, 1000)
            if ":" in config.host:
                sock.setsockopt(zmq.IPV6, 1)
            sock.bind(config.endpoint)
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._sock = sock
        self.endpoint: str = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.pub_id = random.getrandbits(62) + 1
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._seq: dict[int, int] = {}
        #: routing id -> {engine_idx: records dropped for that reader}
        self._readers: dict[bytes, dict[int, int]] = {}
        self.published = 0  # record() calls that reached publish()
        self.unread = 0  # of those, made while no reader was registered
        self.dropped = 0  # (reader, record) pairs dropped: a reader's queue was full
        self.closed = False

    # -- readers -------------------------------------------------------------------------------
    def _drain(self, limit: int = DRAIN_LIMIT) -> None:
        zmq = self._zmq
        sock = self._sock
        for _ in range(limit):
            if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 2:
                continue
            ident, msg = frames
            if msg == self._hello:
                if ident not in self._readers and len(self._readers) < MAX_READERS:
                    self._readers[ident] = {}
            elif msg == self._bye:
                self._readers.pop(ident, None)

    def wait_for_readers(self, n: int, timeout_s: float) -> bool:
        """Until ``n`` readers are registered or ``timeout_s`` passed (tests and tools; vLLM's
        path never waits)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                self._drain()
                if len(self._readers) >= n:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._sock.poll(min(left, 0.05) * 1000)

    @property
    def readers(self) -> int:
        return len(self._readers)

    def reader_drops(self) -> dict[bytes, dict[int, int]]:
        with self._lock:
            return {k: dict(v) for k, v in self._readers.items()}

    # -- records -------------------------------------------------------------------------------
    def publish(self, rec) -> None:
        """Stamp ``rec`` (a PluginRecord) with version, publisher id, pid and its engine's next
        sequence number, and hand it to every registered reader whose queue has room."""
        zmq = self._zmq
        with self._lock:
            if self.closed:
                raise RuntimeError("the publisher is closed")
            self._drain()
            e = rec.engine_idx
            seq = self._seq.get(e, 0)
            self._seq[e] = seq + 1
            self.published += 1
            if not self._readers:
                self.unread += 1
                return
            rec.v, rec.pub, rec.pid, rec.seq = self._version, self.pub_id, self.pid, seq
            body = self._enc.encode(rec)
            gone = []
            for ident, drops in self._readers.items():
                d = drops.get(e, 0)
                head = self._header0 if d == 0 else self._enc.encode(self._header(d))
                try:
                    self._sock.send_multipart((ident, head, body), zmq.NOBLOCK)
                except zmq.Again:
                    drops[e] = d + 1
                    self.dropped += 1
                except zmq.ZMQError as exc:
                    if exc.errno != errno.EHOSTUNREACH and exc.errno != zmq.EHOSTUNREACH:
                        raise
                    gone.append(ident)  # disconnected: it says HELLO again if it comes back
            for ident in gone:
                del self._readers[ident]

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                self._sock.close(linger=0)
            finally:
                self._ctx.destroy(linger=0)


# One publisher per GPUCHEF_PUBLISH value in a process: vLLM may construct the logger more than
# once (one instance per engine where the class is a per-engine logger, an AsyncLLM made twice),
# and a second bind of the same port would fail.
_registry: dict[str, list] = {}  # endpoint as configured -> [Publisher, users]
_registry_lock = threading.Lock()


def acquire(config: PublishConfig) -> Publisher:
    with _registry_lock:
        entry = _registry.get(config.endpoint)
        if entry is not None and not entry[0].closed:
            entry[1] += 1
            return entry[0]
        pub = Publisher(config)
        _registry[config.endpoint] = [pub, 1]
        return pub


def release(pub: Publisher) -> None:
    with _registry_lock:
        for key, entry in list(_registry.items()):
            if entry[0] is pub:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del _registry[key]
                break
    pub.close()
