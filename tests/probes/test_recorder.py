"""TraceRecorder / read_trace: round trip, damaged lines, flushing, rotation, errors."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from dataclasses import asdict, replace

import pytest

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepRecord
from gpuchef.probes.sampler import HostSample
from gpuchef.probes.nvml import GpuSample
from gpuchef.probes.recorder import (TRACE_SCHEMA, TRACE_VERSION, TraceReadError, TraceRecorder,
                                     encode_record, iter_trace, read_trace)

STEP = StepRecord(7, 1_000, 9_000, 0.006, "chunked", 2048, 256, 512, 2, 1, 512, 30, 1, 31, 4, 1,
                  120, 4096, num_finished=2, cuda_graph=True)
REQ = RequestRecord("req-1", 500, 128, 3, (2_000, 3_000, 4_500), "length", num_preemptions=1,
                    max_tokens=3, output_token_ids=(11, 12, 13))
GPU = GpuSample(5_000, 0, 98, 23, 10 * 2**30, 141 * 2**30, 612.5, 1980, 2619, 61, 1024, 2048,
                94.0, 14.0, 91.0, 16.0)
GPU_NA = GpuSample(5_100, 1, gpu_util=3)
HOST = HostSample(6_000, 103.5, 2_000_000_000, 37.5, 12, 16)
EVENTS = [EngineEvent("knob", 8, 7_000, "max_num_batched_tokens", 2048, 512),
          EngineEvent("mode", 9, 7_500, "mode", "continuous", "chunked"),
          EngineEvent("mark", 10, 7_600, "A", message="phase A"),
          EngineEvent("warning", 10, 7_700, message="GPU 0 lost mid-run"),
          EngineEvent("error", 11, 7_800, "max_num_seqs", 256, 99999, "out of range")]


def test_round_trip_of_every_record_type(tmp_path):
    p = tmp_path / "t.jsonl"
    meta = {"command": "bench", "model": "tiny", "config": {"mode": "chunked"},
            "gpus": {"0": "NVIDIA H200"}}
    with TraceRecorder(p, meta) as rec:
        rec.record(STEP)
        rec.record(REQ)
        rec.record(GPU)
        rec.record(GPU_NA)
        rec.record(HOST)
        for e in EVENTS:
            rec.record(e)
    tr = read_trace(p)
    assert tr.problems == [] and tr.complete
    assert tr.steps == [STEP]
    assert tr.requests == [replace(REQ, output_token_ids=())]  # no token ids by default
    assert tr.gpu_samples == [GPU, GPU_NA] and tr.host_samples == [HOST]
    assert tr.events == EVENTS
    m = tr.meta
    assert m["schema"] == TRACE_SCHEMA and m["version"] == TRACE_VERSION
    assert m["model"] == "tiny" and m["config"] == {"mode": "chunked"} and m["command"] == "bench"
    assert {"gpuchef", "torch", "python"} <= set(m["versions"])
    assert m["clock"]["monotonic_ns"] > 0 and m["clock"]["time_ns"] > 1.6e18
    assert m["trace_prompts"] is False
    assert tr.end["counts"] == {"step": 1, "gpu_sample": 2, "host_sample": 1, "request": 1,
                                "event": 5}
    assert abs(tr.to_wall_ns(m["clock"]["monotonic_ns"]) - m["clock"]["time_ns"]) == 0
    # every line is one typed JSON object
    lines = p.read_text().splitlines()
    assert [json.loads(x)["type"] for x in lines] == (
        ["meta", "step", "request", "gpu_sample", "gpu_sample", "host_sample"]
        + ["event"] * 5 + ["end"])


def test_token_ids_only_with_trace_prompts(tmp_path):
    assert "output_token_ids" not in encode_record(REQ)
    assert json.loads(encode_record(REQ, trace_prompts=True))["output_token_ids"] == [11, 12, 13]
    p = tmp_path / "t.jsonl"
    with TraceRecorder(p, trace_prompts=True) as rec:
        rec.record(REQ)
    tr = read_trace(p)
    assert tr.requests == [REQ] and tr.meta["trace_prompts"] is True


def test_nan_is_written_as_null_and_read_back_as_nan(tmp_path):
    p = tmp_path / "t.jsonl"
    with TraceRecorder(p) as rec:
        rec.record(replace(STEP, gpu_ms=float("nan")))
    raw = p.read_text()
    assert "NaN" not in raw
    (s,) = read_trace(p).steps
    assert math.isnan(s.gpu_ms)


def test_truncated_last_line_and_corrupt_middle_line(tmp_path):
    p = tmp_path / "t.jsonl"
    with TraceRecorder(p) as rec:
        for i in range(5):
            rec.record(replace(STEP, step=i))
    lines = p.read_text().splitlines(keepends=True)
    assert len(lines) == 7  # meta, 5 steps, end
    lines[3] = '{"type":"step","step":2,"t_start_ns":1,"t_end_ns\x00garbage\n'  # line 4
    lines[4] = '{"type":"step","step":"three"}\n'                                # line 5
    lines[-1] = lines[-1][: len(lines[-1]) // 2]                                # line 7, cut
    p.write_text("".join(lines))
    with pytest.warns(UserWarning):
        list(iter_trace(p))
    tr = read_trace(p)
    assert [s.step for s in tr.steps] == [0, 1, 4]
    assert not tr.complete
    assert len(tr.problems) == 3
    assert "line 4: not valid JSON" in tr.problems[0] and str(p) in tr.problems[0]
    assert "line 5: step record lacks required field(s)" in tr.problems[1]
    assert "line 7: truncated last record" in tr.problems[2]


def test_wrong_types_and_unknown_records(tmp_path):
    p = tmp_path / "t.jsonl"
    with TraceRecorder(p) as rec:
        rec.record(GPU)
    lines = p.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["gpu_util"] = "lots"
    extra = json.loads(lines[1])
    extra["new_field_from_a_newer_minor"] = 1
    lines[1:1] = [json.dumps(bad), json.dumps({"type": "hologram"}), "[1, 2]",
                  json.dumps(extra)]
    p.write_text("\n".join(lines) + "\n")
    tr = read_trace(p)
    assert tr.gpu_samples == [GPU, GPU]  # the unknown field is ignored
    assert "line 2: gpu_sample field gpu_util='lots' is not int | None" in tr.problems[0]
    assert "line 3: unknown record type 'hologram'" in tr.problems[1]
    assert "line 4: not a JSON object" in tr.problems[2]


def test_not_a_trace_is_an_error_naming_the_file(tmp_path):
    p = tmp_path / "notes.jsonl"
    p.write_text('{"hello": 1}\n')
    with pytest.raises(TraceReadError, match="notes.jsonl: not a gpuchef trace"):
        read_trace(p)
    e = tmp_path / "empty.jsonl"
    e.write_text("")
    with pytest.raises(TraceReadError, match="empty.jsonl: empty file"):
        read_trace(e)
    n = tmp_path / "new.jsonl"
    n.write_text(json.dumps({"type": "meta", "schema": TRACE_SCHEMA, "version": 99}) + "\n")
    with pytest.raises(TraceReadError, match="version 99 is newer"):
        read_trace(n)
    with pytest.raises(TraceReadError, match="missing.jsonl: cannot open"):
        read_trace(tmp_path / "missing.jsonl")


def test_flushed_within_a_second_without_closing(tmp_path):
    p = tmp_path / "live.jsonl"
    rec = TraceRecorder(p, flush_interval_s=0.5)
    try:
        rec.record(STEP)
        rec.record(GPU)
        time.sleep(1.2)
        with open(p, encoding="utf-8") as other:  # another handle; the recorder is still open
            types = [json.loads(x)["type"] for x in other.read().splitlines()]
        assert types == ["meta", "step", "gpu_sample"]
        # a steady stream is flushed on time too, not only when the queue goes idle
        stop = threading.Event()

        def produce():
            while not stop.is_set():
                rec.record(HOST)
                time.sleep(0.0005)

        th = threading.Thread(target=produce)
        th.start()
        time.sleep(0.3)
        mark = time.monotonic()
        rec.record(EVENTS[2])
        try:
            seen = False
            while time.monotonic() - mark < 1.0 and not seen:
                time.sleep(0.05)
                seen = '"kind":"mark"' in p.read_text()
            assert seen, "an event recorded during a steady stream was not flushed within 1 s"
        finally:
            stop.set()
            th.join()
    finally:
        rec.close()
    assert read_trace(p).complete


def test_flush_rotate_and_close(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "sub" / "b.jsonl"
    rec = TraceRecorder(a, {"model": "tiny"})
    rec.record(STEP)
    rec.flush()
    assert len(a.read_text().splitlines()) == 2
    assert rec.rotate(b) == a
    rec.record(GPU)
    rec.close()
    rec.close()  # idempotent
    rec.record(GPU)  # after close: dropped, no exception
    assert rec.dropped == 1
    ta, tb = read_trace(a), read_trace(b)
    assert ta.complete and ta.steps == [STEP] and ta.gpu_samples == []
    assert tb.complete and tb.gpu_samples == [GPU] and tb.steps == []
    assert tb.meta["part"] == 1 and tb.meta["previous_part"] == str(a)
    assert tb.meta["session_id"] == ta.meta["session_id"] and tb.meta["model"] == "tiny"
    assert tb.meta["clock"] == ta.meta["clock"]


def test_rotate_to_bad_path_keeps_recording(tmp_path):
    a = tmp_path / "a.jsonl"
    (tmp_path / "blocker").write_text("a file, not a folder")
    with TraceRecorder(a) as rec:
        with pytest.raises(ConfigError, match="cannot open"):
            rec.rotate(tmp_path / "blocker" / "b.jsonl")
        rec.record(STEP)
    assert read_trace(a).steps == [STEP]


def test_bad_arguments(tmp_path):
    (tmp_path / "blocker").write_text("x")
    with pytest.raises(ConfigError, match="--trace .*cannot open for writing"):
        TraceRecorder(tmp_path / "blocker" / "t.jsonl")
    with pytest.raises(ConfigError, match="flush_interval_s"):
        TraceRecorder(tmp_path / "t.jsonl", flush_interval_s=2)
    with pytest.raises(ConfigError, match="reserved"):
        TraceRecorder(tmp_path / "t.jsonl", {"version": 2})


def test_unknown_objects_are_dropped_not_raised(tmp_path):
    p = tmp_path / "t.jsonl"
    with TraceRecorder(p) as rec:
        rec.record(object())
        rec.record(STEP)
    assert rec.dropped == 1 and read_trace(p).steps == [STEP]


def test_producers_from_many_threads_and_cost(tmp_path):
    p = tmp_path / "t.jsonl"
    rec = TraceRecorder(p)
    n_threads, per = 4, 5000

    def produce():
        for _ in range(per):
            rec.record(STEP)

    ts = [threading.Thread(target=produce) for _ in range(n_threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    per_call_us = (time.perf_counter() - t0) / (n_threads * per) * 1e6
    rec.close()
    tr = read_trace(p)
    assert len(tr.steps) == n_threads * per and tr.end["counts"]["step"] == n_threads * per
    assert per_call_us < 200  # a queue put, loose bound for a busy CI box


def test_sigkill_loses_at_most_the_last_second(tmp_path):
    # The recorder alone in a child process (the `gpuchef bench --trace` version of this test
    # belongs to the CLI); the child stamps each event with its wall time.
    import os
    import signal
    import subprocess
    p = tmp_path / "killed.jsonl"
    code = (
        "import time\n"
        "from gpuchef.probes.recorder import TraceRecorder\n"
        "from gpuchef.engine_host.vocab.records import EngineEvent\n"
        f"rec = TraceRecorder({str(p)!r})\n"
        "i = 0\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    rec.record(EngineEvent('mark', i, time.monotonic_ns(), str(time.time())))\n"
        "    i += 1\n"
        "    time.sleep(0.002)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(2.0)
        killed_at = time.time()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)
    finally:
        if child.poll() is None:
            child.kill()
    tr = read_trace(p)
    assert not tr.complete and len(tr.events) > 100
    assert all("truncated last record" in m for m in tr.problems)  # at most the cut last line
    last_wall = float(tr.events[-1].name)
    assert killed_at - last_wall <= 1.0
    assert [e.step for e in tr.events] == list(range(len(tr.events)))  # nothing missing before


# ---- damaged lines, odd files, impossible records: one problem naming the line, the rest read --

#: a step with the fields' defaults (no finished requests, no CUDA graph)
BARE_STEP = StepRecord(0, 1_000, 9_000, 0.006, "chunked", 2048, 256, 512, 2, 1, 512, 30, 1, 31, 4,
                       1, 120, 4096)


def _trace_with(tmp_path, bad_lines: list[str]):
    """A closed 3-step trace with ``bad_lines`` inserted after the first step (from line 3)."""
    p = tmp_path / "t.jsonl"
    with TraceRecorder(p) as rec:
        for i in range(3):
            rec.record(replace(BARE_STEP, step=i))
    lines = p.read_text().splitlines()
    lines[2:2] = bad_lines
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("bad, why", [
    ('{"type":"step","step":' + "9" * 5000 + "}", "4300 digits"),  # int over Python's limit
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),            # RecursionError
], ids=["huge-int", "deep-nesting"])
def test_lines_json_cannot_decode_are_skipped_with_their_number(tmp_path, bad, why):
    p = _trace_with(tmp_path, [bad])
    tr = read_trace(p)
    assert [s.step for s in tr.steps] == [0, 1, 2] and tr.complete
    assert len(tr.problems) == 1
    assert f"{p} line 3: not valid JSON" in tr.problems[0] and why in tr.problems[0]


def test_a_type_that_is_not_a_string_is_skipped_with_its_line_number(tmp_path):
    p = _trace_with(tmp_path, ['{"type":["step"]}', '{"type":{"a":1}}', '{"type":5}',
                               '{"step":3}'])
    tr = read_trace(p)
    assert [s.step for s in tr.steps] == [0, 1, 2] and tr.complete
    assert tr.problems == [
        f"{p} line 3: record type ['step'] is not a string — skipped",
        f"{p} line 4: record type {{'a': 1}} is not a string — skipped",
        f"{p} line 5: record type 5 is not a string — skipped",
        f'{p} line 6: has no "type" key — skipped',
    ]


def test_a_huge_bad_value_gives_a_short_problem_line(tmp_path):
    rec = json.loads(_trace_with(tmp_path, []).read_text().splitlines()[1])
    rec["mode"] = ["x" * 1_000_000]
    p = _trace_with(tmp_path, [json.dumps(rec)])
    tr = read_trace(p)
    assert len(tr.problems) == 1 and "line 3: step field mode=['xxx" in tr.problems[0]
    assert len(tr.problems[0]) < 300 and "characters)" in tr.problems[0]


def test_a_first_line_nested_too_deeply_is_not_a_trace(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TraceReadError, match="deep.jsonl: not a gpuchef trace"):
        read_trace(p)


def _closed_trace(tmp_path) -> bytes:
    p = tmp_path / "src.jsonl"
    with TraceRecorder(p) as rec:
        rec.record(BARE_STEP)
    return p.read_bytes()


def test_first_line_problems_say_what_the_file_is(tmp_path):
    import gzip

    src = _closed_trace(tmp_path)
    cases = {
        "lead.jsonl": (b"\n" + src, "lead.jsonl: line 1 is blank"),   # not an "empty file"
        "bad.jsonl.gz": (b"\x1f\x8b" + b"not a gzip stream", "bad.jsonl.gz: cannot read"),
        "ps.jsonl": (src.decode().encode("utf-16"), "ps.jsonl: UTF-16 text"),
    }
    for name, (data, msg) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(TraceReadError) as ei:
            read_trace(tmp_path / name)
        assert msg in str(ei.value)
    e = tmp_path / "empty.jsonl"
    e.write_bytes(b"")
    with pytest.raises(TraceReadError, match="empty.jsonl: empty file"):
        read_trace(e)


@pytest.mark.slow  # imports the report
def test_a_gzip_compressed_trace_reads_as_the_plain_one_and_a_cut_one_keeps_its_records(
        tmp_path):
    """Traces come back from a GPU machine gzipped: read them as they are. A copy cut short
    keeps the records before the cut, with one problem naming the line, as a plain file does."""
    import gzip

    p = tmp_path / "src.jsonl"
    with TraceRecorder(p) as rec:
        for i in range(200):
            rec.record(replace(BARE_STEP, step=i))
    plain = read_trace(p)
    z = tmp_path / "t.jsonl.gz"
    z.write_bytes(gzip.compress(p.read_bytes()))
    tr = read_trace(z)
    assert tr.steps == plain.steps and len(tr.steps) == 200 and tr.complete
    assert tr.problems == [] and tr.meta == plain.meta
    # named as the plain trace is: the report's title and default output
    from gpuchef.probes.recorder import trace_name
    from gpuchef.report.data import view_trace
    from gpuchef.commands.report import _default_output
    assert trace_name(z) == "t" and trace_name(p) == "src"
    assert view_trace(tr).name == "t" and _default_output([str(z)], "html") == "t.html"
    assert _default_output([str(p)], "csv") == "src"
    cut = tmp_path / "cut.jsonl.gz"
    data = gzip.compress(p.read_bytes())
    cut.write_bytes(data[: len(data) * 2 // 3])
    tr = read_trace(cut)
    assert 0 < len(tr.steps) < 200 and tr.steps == plain.steps[:len(tr.steps)]
    assert not tr.complete
    assert any("cut.jsonl.gz line" in x and ("cannot read" in x or "truncated" in x)
               for x in tr.problems), tr.problems
    # corrupt in the middle (zlib.error, neither OSError nor EOFError): the same, not a traceback
    bad = bytearray(data)
    for i in range(len(bad) // 2, len(bad) // 2 + 64):
        bad[i] ^= 0x5A
    cor = tmp_path / "corrupt.jsonl.gz"
    cor.write_bytes(bytes(bad))
    tr = read_trace(cor)
    assert len(tr.steps) < 200 and tr.steps == plain.steps[:len(tr.steps)]
    assert any("corrupt.jsonl.gz line" in x and "cannot read" in x for x in tr.problems)
    # corrupt from the first bytes of the stream: one error, as for any unreadable line 1
    bad = bytearray(data)
    for i in range(10, 80):
        bad[i] ^= 0x5A
    cor.write_bytes(bytes(bad))
    with pytest.raises(TraceReadError, match="corrupt.jsonl.gz: cannot read"):
        read_trace(cor)


def test_a_utf8_byte_order_mark_is_read_past(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + _closed_trace(tmp_path))  # what some Windows editors save
    tr = read_trace(p)
    assert tr.steps == [BARE_STEP] and tr.complete and tr.problems == []


@pytest.mark.slow  # imports the report and the replay app
@pytest.mark.parametrize("key, value, why", [
    ("host", "gpu-box", "meta field host='gpu-box' is not an object — ignored"),
    ("versions", "0.1.0", "meta field versions='0.1.0' is not an object"),
    ("created", 5, "meta field created=5 is not a string"),
    ("workload", [1], "meta field workload=[1] is not an object"),
    ("engine_config", {"scheduler": "chunked"}, "meta field engine_config.scheduler='chunked' "
                                                "is not an object"),
    ("kv_blocks", "many", "meta field kv_blocks='many' is not an integer"),
    ("clock", {"monotonic_ns": "1", "time_ns": 2}, "lacks integer monotonic_ns and time_ns"),
], ids=["host", "versions", "created", "workload", "scheduler", "kv_blocks", "clock"])
def test_a_meta_field_of_the_wrong_type_is_a_line_1_problem_not_a_crash(tmp_path, key, value,
                                                                       why):
    # a hand-edited meta record crashed `gpuchef report` (host, versions) and `gpuchef replay`
    # (created, workload, engine_config.scheduler, kv_blocks) with a traceback
    from gpuchef.commands.replay import build_app
    from gpuchef.report.html import render
    from gpuchef.report import build

    p = tmp_path / "t.jsonl"
    with TraceRecorder(p, {"device": "cpu", "workload": {"dataset": "random"},
                           "engine_config": {"scheduler": {"mode": "chunked"}}}) as rec:
        for i in range(3):
            rec.record(replace(BARE_STEP, step=i, t_start_ns=i * 10_000,
                               t_end_ns=i * 10_000 + 9_000))
    lines = p.read_text().splitlines()
    meta = json.loads(lines[0])
    meta[key] = value
    p.write_text("\n".join([json.dumps(meta), *lines[1:]]) + "\n")
    tr = read_trace(p)
    assert len(tr.problems) == 1, tr.problems
    assert tr.problems[0].startswith(f"{p} line 1: meta field {key}") and why in tr.problems[0]
    assert key not in tr.meta or key == "engine_config"  # dropped, so readers use defaults
    assert len(tr.steps) == 3 and tr.complete and tr.meta["schema"] == "gpuchef-trace"
    render(build([p]))
    build_app(str(p))


def test_rotate_onto_the_file_being_written_is_refused_and_nothing_is_lost(tmp_path,
                                                                          monkeypatch):
    # before: the file was reopened for writing (truncated): the part's records were lost and
    # a run of NUL bytes stood where they had been
    from gpuchef.engine_host.vocab.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    rec = TraceRecorder(tmp_path / "run.jsonl")
    for i in range(50):
        rec.record(replace(BARE_STEP, step=i))
    for same in ("run.jsonl", tmp_path / "run.jsonl", "./sub/../run.jsonl"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(ConfigError, match="is the file being written"):
            rec.rotate(same)
    rec.record(replace(BARE_STEP, step=50))
    rec.close()
    tr = read_trace(tmp_path / "run.jsonl")
    assert [s.step for s in tr.steps] == list(range(51)) and tr.problems == [] and tr.complete
    assert tr.meta["part"] == 0 and tr.end["counts"]["step"] == 51


def test_an_integer_too_large_for_a_float_field_is_a_problem_not_a_crash(tmp_path):
    # float(10**400) raised OverflowError out of read_trace
    rec = json.loads(_trace_with(tmp_path, []).read_text().splitlines()[1])
    rec["gpu_ms"] = 10**400
    p = _trace_with(tmp_path, [json.dumps(rec)])
    tr = read_trace(p)
    assert [s.step for s in tr.steps] == [0, 1, 2] and tr.complete
    assert len(tr.problems) == 1
    assert tr.problems[0].startswith(f"{p} line 3: step field gpu_ms=1000")
    assert tr.problems[0].endswith("characters) is not float — skipped")


class _FailingFile:
    """A text file whose reads fail with EIO after ``ok`` lines (a disk or network mount failing
    under the reader)."""

    def __init__(self, f, ok: int) -> None:
        self.f, self.ok = f, ok

    def readline(self):
        if self.ok <= 0:
            raise OSError(5, "Input/output error")
        self.ok -= 1
        return self.f.readline()

    def read(self, n=-1):  # the reader's sniff for gzip's magic bytes
        if self.ok <= 0:
            raise OSError(5, "Input/output error")
        return self.f.read(n)

    def __iter__(self):
        return iter(self.readline, "")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


@pytest.mark.parametrize("ok", [0, 3])
def test_a_read_error_is_a_message_not_a_traceback(tmp_path, monkeypatch, ok):
    import gpuchef.probes.recorder as recorder

    p = _trace_with(tmp_path, [])  # meta, 3 steps, end
    real_open = open
    monkeypatch.setattr(recorder, "open", lambda *a, **k: _FailingFile(real_open(*a, **k), ok),
                        raising=False)
    if ok == 0:
        with pytest.raises(TraceReadError, match=r"t.jsonl: cannot read: Input/output error"):
            read_trace(p)
        return
    tr = read_trace(p)  # meta + 2 steps read, line 4 fails
    assert [s.step for s in tr.steps] == [0, 1] and not tr.complete
    assert tr.problems == [f"{p} line 4: cannot read (Input/output error) — the rest of the "
                           "file is not read"]


@pytest.mark.parametrize("change, why", [
    ({"num_prefill_tokens": -3}, "step field num_prefill_tokens=-3 is negative (allowed: >= 0)"),
    ({"gpu_ms": -0.5}, "step field gpu_ms=-0.5 is negative (allowed: >= 0)"),
    ({"t_end_ns": 999}, "step t_end_ns=999 is before t_start_ns=1000 (a step cannot end before "
                        "it starts)"),
], ids=["negative-count", "negative-gpu-ms", "ends-before-start"])
def test_an_impossible_step_is_skipped_with_its_line_number(tmp_path, change, why):
    bad = json.dumps({"type": "step", **{**asdict(BARE_STEP), "step": 7, **change}})
    tr = read_trace(_trace_with(tmp_path, [bad]))
    assert [s.step for s in tr.steps] == [0, 1, 2]
    assert tr.problems == [f"{tmp_path / 't.jsonl'} line 3: {why} — skipped"]


def test_what_a_writer_does_write_is_not_impossible(tmp_path):
    """The -1 sentinels (autopilot off), a NaN gpu_ms (null), a zero-length step and equal
    token times (one chunk) are read as written."""
    from gpuchef.engine_host.vocab.records import RequestRecord

    p = tmp_path / "t.jsonl"
    with TraceRecorder(p) as rec:
        rec.record(replace(BARE_STEP, gpu_ms=float("nan"), t_end_ns=BARE_STEP.t_start_ns))
        rec.record(RequestRecord("r", 5, 0, 2, (7, 7), "length"))
    tr = read_trace(p)
    assert not tr.problems and len(tr.steps) == 1 and len(tr.requests) == 1
    assert tr.steps[0].prefill_allowance == -1 and tr.steps[0].predicted_ms == -1
    bad = RequestRecord("q", 5, 3, 2, (9, 8), "length")
    with TraceRecorder(p) as rec:
        rec.record(bad)
    tr = read_trace(p)
    assert not tr.requests
    assert tr.problems[0].endswith("request token_times_ns go back in time (allowed: "
                                   "non-decreasing) — skipped")


def test_recorder_expands_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # where a literal ./~ folder would go
    with TraceRecorder("~/a.jsonl") as rec:
        assert rec.path == tmp_path / "a.jsonl"
        assert rec.rotate("~/b.jsonl") == tmp_path / "a.jsonl"
    assert read_trace(tmp_path / "a.jsonl").complete and read_trace(tmp_path / "b.jsonl").complete
