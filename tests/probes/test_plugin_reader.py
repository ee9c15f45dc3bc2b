"""probes/plugin_reader.py: the reader of gpuchef's vLLM plugin. Its per-(server, engine_idx)
sequence and drop accounting on crafted input (no sockets), then over real zmq sockets against
the plugin's Publisher: several servers, a reader that starts before the server, a server that
restarts, a background thread read through snapshot(), frames that are not records."""

from __future__ import annotations

import socket
import threading
import time

import msgspec
import pytest
import zmq

from gpuchef.probes.plugin_reader import PluginReader, SeqAccounts, normalize_url
from gpuchef.probes.plugin_wire import HELLO, Header, PluginRecord
from gpuchef.vllm_plugin.publisher import Publisher, PublishConfig


def rec(seq, engine=0, pub=7, **kw):
    return PluginRecord(v=1, pub=pub, engine_idx=engine, seq=seq, **kw)


# -- accounting ------------------------------------------------------------------------------
def test_gaps_and_reported_drops():
    acc = SeqAccounts()
    a = acc.ingest("s", 0, rec(5))  # joins at 5: the records before it are not gaps
    assert a.restarted and a.gap == 0
    b = acc.ingest("s", 0, rec(6))
    assert (b.gap, b.gap_dropped, b.restarted) == (0, 0, False)
    c = acc.ingest("s", 3, rec(10))  # 7, 8, 9 missing; the publisher says it dropped 3
    assert (c.gap, c.gap_dropped) == (3, 3)
    d = acc.ingest("s", 4, rec(13))  # 11, 12 missing, one of them reported
    assert (d.gap, d.gap_dropped) == (2, 1)
    st = acc.streams[("s", 0)]
    assert (st.received, st.first_seq, st.last_seq) == (4, 5, 13)
    assert (st.missing, st.reported_dropped, st.unexplained, st.restarts) == (5, 4, 1, 0)


def test_drop_counter_restart_is_a_reconnect():
    """The publisher counts drops from 0 again when it registers the reader again (after a
    reconnect): the records made between are lost without a report."""
    acc = SeqAccounts()
    acc.ingest("s", 0, rec(0))
    acc.ingest("s", 5, rec(6))  # 1..5 dropped, reported
    r = acc.ingest("s", 2, rec(12))  # counter went back: 2 reported since re-registering
    assert (r.gap, r.gap_dropped) == (5, 2)
    st = acc.streams[("s", 0)]
    assert (st.missing, st.reported_dropped, st.unexplained) == (10, 7, 3)


def test_new_publisher_or_seq_back_restarts_the_stream():
    acc = SeqAccounts()
    acc.ingest("s", 0, rec(0))
    acc.ingest("s", 0, rec(1))
    r = acc.ingest("s", 0, rec(0, pub=8))  # vLLM restarted: a new publisher id
    assert r.restarted and r.gap == 0
    acc.ingest("s", 0, rec(1, pub=8))
    r = acc.ingest("s", 0, rec(1, pub=8))  # a repeat or a seq going back
    assert r.restarted
    st = acc.streams[("s", 0)]
    assert (st.restarts, st.missing, st.received, st.pub) == (2, 0, 5, 8)


def test_streams_are_per_server_and_engine():
    acc = SeqAccounts()
    for seq in range(3):
        for server in ("a", "b"):
            for engine in (0, 1):
                acc.ingest(server, 0, rec(seq * 2 if server == "b" else seq, engine))
    assert set(acc.streams) == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    assert acc.streams[("a", 1)].missing == 0
    assert acc.streams[("b", 0)].missing == 2  # b skipped odd seqs, unreported
    assert acc.streams[("b", 0)].unexplained == 2


def test_normalize_url():
    assert normalize_url("127.0.0.1:5557") == "tcp://127.0.0.1:5557"
    assert normalize_url(" tcp://[::1]:5557 ") == "tcp://[::1]:5557"
    with pytest.raises(ValueError):
        PluginReader(["127.0.0.1:5557", "tcp://127.0.0.1:5557"])


# -- over sockets ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publish(pub: Publisher, n: int, engines=(0, 1)):
    for i in range(n):
        for e in engines:
            pub.publish(PluginRecord(engine_idx=e, running=i, ttfts=[0.1 * i]))


def register(pub, reader, timeout_s=10.0) -> bool:
    """Until ``pub`` has the reader (the reader says HELLO from its poll())."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reader.poll(0.02)
        if pub.wait_for_readers(1, 0.02):
            return True
    return False


def read_until(reader, n, timeout_s=10.0):
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += reader.poll(0.05)
    return got


def test_two_servers_one_reader():
    a = Publisher(PublishConfig("127.0.0.1", 0))
    b = Publisher(PublishConfig("127.0.0.1", 0))
    try:
        with PluginReader([a.endpoint, b.endpoint]) as reader:
            assert a.wait_for_readers(1, 10) and b.wait_for_readers(1, 10)
            publish(a, 10)
            publish(b, 7, engines=(0,))
            got = read_until(reader, 27)
        assert len(got) == 27
        by = {}
        for g in got:
            by.setdefault((g.server, g.record.engine_idx), []).append(g.record.seq)
        assert by == {(a.endpoint, 0): list(range(10)), (a.endpoint, 1): list(range(10)),
                      (b.endpoint, 0): list(range(7))}
        assert {g.record.pub for g in got if g.server == b.endpoint} == {b.pub_id}
        snap = reader.snapshot()
        assert snap.totals() == {"received": 27, "missing": 0, "reported_dropped": 0,
                                 "unexplained": 0}
    finally:
        a.close()
        b.close()


def test_reader_before_server_and_server_restart():
    """The dashboard starts first; vLLM comes up later, then restarts on the same port. The
    reader's heartbeat registers it each time; the restart shows as a new stream, not a gap."""
    port = free_port()
    cfg = PublishConfig("127.0.0.1", port)
    with PluginReader(f"127.0.0.1:{port}", heartbeat_s=0.1) as reader:
        assert reader.poll(0.2) == []
        first = Publisher(cfg)
        try:
            assert register(first, reader)
            publish(first, 5, engines=(0,))
            got = read_until(reader, 5)
        finally:
            first.close()
        second = Publisher(cfg)
        try:
            assert register(second, reader)
            publish(second, 4, engines=(0,))
            got += read_until(reader, 4)
        finally:
            second.close()
        st = reader.snapshot().streams[(f"tcp://127.0.0.1:{port}", 0)]
    assert [g.record.seq for g in got] == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert [g.restarted for g in got] == [True] + [False] * 4 + [True] + [False] * 3
    assert (st.received, st.restarts, st.missing, st.pub) == (9, 1, 0, second.pub_id)


def test_stalled_reader_gaps_match_the_publishers_count():
    pub = Publisher(PublishConfig("127.0.0.1", 0, hwm=8))
    try:
        with PluginReader(pub.endpoint, rcvhwm=4, rcvbuf=4096) as reader:
            assert pub.wait_for_readers(1, 10)
            for i in range(6000):
                pub.publish(PluginRecord(engine_idx=i % 2, itls=[0.01] * 64))
            assert pub.dropped > 0
            got = read_until(reader, 6000 - pub.dropped)
            publish(pub, 1)  # carries the last drops out
            got += read_until(reader, 2)
            (drops,) = pub.reader_drops().values()
        assert len(got) == 6000 - pub.dropped + 2
        snap = reader.snapshot()
        for e in (0, 1):
            st = snap.streams[(pub.endpoint, e)]
            assert st.last_seq == 3000 and st.missing == st.reported_dropped == drops[e]
            assert st.received + drops[e] == 3001
        assert snap.totals()["unexplained"] == 0
    finally:
        pub.close()


def test_background_thread_and_snapshot():
    pub = Publisher(PublishConfig("127.0.0.1", 0))
    reader = PluginReader(pub.endpoint, keep=16).start()
    try:
        assert pub.wait_for_readers(1, 10)
        with pytest.raises(RuntimeError):
            reader.poll(0)  # the sockets are the thread's
        seen = []
        stop = threading.Event()

        def dashboard():  # reads snapshots while records arrive
            while not stop.is_set():
                snap = reader.snapshot()
                seen.append(sum(st.received for st in snap.streams.values()))
                for ring in snap.recent.values():
                    seqs = [g.record.seq for g in ring]
                    assert seqs == sorted(seqs) and len(seqs) <= 16
                time.sleep(0.001)

        t = threading.Thread(target=dashboard)
        t.start()
        for i in range(200):
            for e in (0, 1):
                pub.publish(PluginRecord(engine_idx=e, running=i))
            if i % 20 == 0:
                time.sleep(0.01)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sum(st.received for st in reader.snapshot().streams.values()) == 400:
                break
            time.sleep(0.02)
        stop.set()
        t.join()
        snap = reader.snapshot()
        assert snap.totals()["received"] == 400 and snap.totals()["missing"] == 0
        assert seen == sorted(seen)  # counts only grow between snapshots
        assert [g.record.seq for g in snap.recent[(pub.endpoint, 1)]] == list(range(184, 200))
        assert snap.streams[(pub.endpoint, 0)].last.running == 199
    finally:
        reader.close()
        pub.close()


def test_frames_that_are_not_records_are_counted_not_raised():
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    url = f"tcp://127.0.0.1:{port}"
    try:
        with PluginReader(url) as reader:
            assert router.poll(10_000)
            ident, hello = router.recv_multipart()
            assert hello == HELLO
            good = msgspec.msgpack.encode(PluginRecord(seq=0, running=3))
            head = msgspec.msgpack.encode(Header(0))
            router.send_multipart([ident, b"one frame"])
            router.send_multipart([ident, head, b"\xc1"])  # not msgpack
            router.send_multipart([ident, b"\xc1", good])
            router.send_multipart([ident, head, msgspec.msgpack.encode({"seq": "x"})])  # bad type
            router.send_multipart([ident, head, good])
            router.send_multipart([ident, head, msgspec.msgpack.encode({"seq": 1, "new": 1})])
            got = read_until(reader, 2)
            time.sleep(0.1)
            got += reader.poll(0.1)
            snap = reader.snapshot()
        assert [g.record.seq for g in got] == [0, 1]  # an unknown key is ignored
        assert got[0].record.running == 3
        assert snap.bad_frames == {url: 4}
    finally:
        router.close()


# -- as a trace record ------------------------------------------------------------------------
def test_a_record_as_trace_json_round_trips_and_bad_fields_are_named():
    import json

    from gpuchef.probes.plugin_reader import Received, received_from_json, received_to_json

    r = rec(4, engine=1, running=3, kv_usage=0.5, itls=[0.01, 0.02], cg_unpadded_tokens=260,
            has_sched=True, has_iter=True)
    g = Received("tcp://127.0.0.1:5557", r, 2, 1, 1, False, 1_700_000_000_000_000_000, 123_456)
    d = json.loads(json.dumps(received_to_json(g)))
    assert d["t_ns"] == 123_456 == g.t_ns
    assert received_from_json(d) == g
    for k, v, why in (("gap", -1, "gap=-1"), ("server", 5, "server"),
                      ("record", {"seq": "x"}, "plugin record")):
        with pytest.raises(ValueError, match=why):
            received_from_json({**d, k: v})
