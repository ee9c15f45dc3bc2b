"""TraceRecorder / read_trace: round trip, damaged lines, flushing, rotation, errors."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from dataclasses import replace

import pytest

from gpuchef.engine_host.config import ConfigError
from gpuchef.engine_host.records import EngineEvent, RequestRecord, StepRecord
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
        rec.record_step(STEP)
        rec.record_request(REQ)
        rec.record_gpu_sample(GPU)
        rec.record_gpu_sample(GPU_NA)
        rec.record_host_sample(HOST)
        for e in EVENTS:
            rec.record_event(e)
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
        rec.record_step(STEP)
        rec.record_gpu_sample(GPU)
        time.sleep(1.2)
        with open(p, encoding="utf-8") as other:  # another handle; the recorder is still open
            types = [json.loads(x)["type"] for x in other.read().splitlines()]
        assert types == ["meta", "step", "gpu_sample"]
        # a steady stream is flushed on time too, not only when the queue goes idle
        stop = threading.Event()

        def produce():
            while not stop.is_set():
                rec.record_host_sample(HOST)
                time.sleep(0.0005)

        th = threading.Thread(target=produce)
        th.start()
        time.sleep(0.3)
        mark = time.monotonic()
        rec.record_event(EVENTS[2])
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
            rec.record_step(STEP)

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
        "from gpuchef.engine_host.records import EngineEvent\n"
        f"rec = TraceRecorder({str(p)!r})\n"
        "i = 0\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    rec.record_event(EngineEvent('mark', i, time.monotonic_ns(), str(time.time())))\n"
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
