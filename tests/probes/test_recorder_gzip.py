"""A trace path ending in .gz is written as gzip (probes.recorder.is_gzip_name, the one rule the
writer and trace_name share); the reader takes it by its magic bytes, so a plain file named .gz by
an older gpuchef still reads."""

from __future__ import annotations

import gzip
import json

from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.probes.recorder import (TraceRecorder, is_gzip_name, read_trace, trace_name)

from test_recorder import EVENTS, GPU, HOST, REQ, STEP

_register()


def _write(p, **kw):
    with TraceRecorder(p, {"model": "tiny"}, **kw) as rec:
        rec.record(STEP)
        rec.record(REQ)
        rec.record(GPU)
        rec.record(HOST)
        for e in EVENTS:
            rec.record(e)


def test_gz_name_writes_gzip_that_both_readers_read(tmp_path):
    z, plain = tmp_path / "t.jsonl.gz", tmp_path / "t.jsonl"
    _write(z)
    _write(plain)
    assert z.read_bytes()[:2] == b"\x1f\x8b" and plain.read_bytes()[:1] == b"{"
    with gzip.open(z, "rt", encoding="utf-8") as f:
        zl = [json.loads(x) for x in f.read().splitlines()]
    pl = [json.loads(x) for x in plain.read_text().splitlines()]
    # the same records line by line (session ids, times of creation and the end differ)
    assert [r["type"] for r in zl] == [r["type"] for r in pl]
    assert zl[1:-1] == pl[1:-1]
    tz, tp = read_trace(z), read_trace(plain)
    assert tz.problems == [] and tz.complete
    assert (tz.steps, tz.requests, tz.gpu_samples, tz.host_samples, tz.events) == (
        tp.steps, tp.requests, tp.gpu_samples, tp.host_samples, tp.events)
    assert trace_name(z) == "t"


def test_suffix_rule():
    assert is_gzip_name("a/run.jsonl.gz") and is_gzip_name("RUN.JSONL.GZ")
    assert not is_gzip_name("run.jsonl") and not is_gzip_name("run.gzip") \
        and not is_gzip_name("gz")


def test_a_gzip_trace_is_readable_while_it_is_written(tmp_path):
    """Each flush is a gzip sync point: a reader sees the flushed records before close (the
    stream's end is missing: the trace is incomplete, as a plain one without its end record)."""
    z = tmp_path / "live.jsonl.gz"
    rec = TraceRecorder(z, flush_interval_s=0.5)
    try:
        rec.record(STEP)
        rec.flush()
        tr = read_trace(z)
        assert tr.steps == [STEP] and not tr.complete
    finally:
        rec.close()
    tr = read_trace(z)
    assert tr.complete and tr.steps == [STEP] and tr.problems == []


def test_rotate_from_plain_to_gz(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    rec = TraceRecorder(a)
    rec.record(STEP)
    assert rec.rotate(b) == a
    rec.record(GPU)
    rec.close()
    assert a.read_bytes()[:1] == b"{" and b.read_bytes()[:2] == b"\x1f\x8b"
    assert read_trace(a).steps == [STEP] and read_trace(b).gpu_samples == [GPU]
    assert read_trace(b).complete


def test_a_plain_file_named_gz_still_reads(tmp_path):
    """Traces an older gpuchef wrote as plain text under a .gz name."""
    plain, old = tmp_path / "t.jsonl", tmp_path / "old.jsonl.gz"
    _write(plain)
    old.write_bytes(plain.read_bytes())
    assert read_trace(old).steps == [STEP] and read_trace(old).complete


def test_bench_trace_gz_then_report(tmp_path, monkeypatch):
    z = tmp_path / "x.jsonl.gz"
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--num-prompts",
                                 "3", "--input-len", "16", "--output-len", "3", "--sample-hz",
                                 "0", "--trace", str(z)])
    assert r.exit_code == 0, r.output
    assert z.read_bytes()[:2] == b"\x1f\x8b"
    with gzip.open(z, "rt", encoding="utf-8") as f:
        types = [json.loads(x)["type"] for x in f.read().splitlines()]
    assert types[0] == "meta" and types[-1] == "end" and types.count("request") == 3
    tr = read_trace(z)
    assert tr.complete and len(tr.requests) == 3 and tr.problems == []
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["report", str(z)])
    assert r.exit_code == 0, r.output
    html = (tmp_path / "x.html").read_text()
    assert "x" in html and "<html" in html.lower()


import pytest  # noqa: E402

#: each test starts the engine's process (seconds on 2 cores): the full run only
pytestmark = pytest.mark.slow
