"""The session trace: a streaming, schema-versioned JSON Lines file (docs/trace-format.md).

One typed record a line: a ``meta`` record first (schema, version, versions of gpuchef/torch/
python, GPUs, model, config, the clock origin), then ``step``, ``gpu_sample``, ``host_sample``,
``request`` and ``event`` records as they happen, and an ``end`` record when the recorder is
closed (its absence means the writer was killed). Producers only append to a queue; a writer
thread serialises, writes and flushes at least every ``flush_interval_s`` (default 0.5 s), so a
killed process (SIGKILL) loses at most the last ~second. Flushing hands the bytes to the OS, which
survives the process; ``fsync=True`` also survives a power cut, at ~1–10 ms of disk time a flush.

Wiring: the recorder is one of the host's sinks (``engine_host.sinks``) and a sampler's sink::

    rec = TraceRecorder(args.trace, meta={"command": "bench", "model": cfg.model})
    host = make_host(engine, [timeline, rec]); sampler = NvmlSampler(on_sample=rec.record, ...)
    ...; rec.close()  # drains the queue, writes the end record

``TraceRecorder(...)`` raises ConfigError naming the path when it cannot be opened; after that
nothing raises into producers: a write error (disk full) is kept in ``recorder.error``, later
records counted in ``dropped``.

Reading: :func:`read_trace` returns a :class:`Trace` (typed records + ``problems``);
:func:`iter_trace` streams :class:`TraceRecord` s. A corrupt or truncated line is reported with its
line number and skipped; the rest is read. A file that does not start with a gpuchef meta record
raises :class:`TraceReadError` naming the file.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import queue
import socket
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.sinks import RecordBatch
from gpuchef.engine_host.vocab.records import EngineEvent, RequestRecord, StepOutput, StepRecord
from gpuchef.probes.metrics import json_safe

from .sampler import HostSample
from .nvml import GpuSample
from .plugin_reader import Received, received_from_json, received_to_json
from .scrape import ScrapeSample, sample_from_json, sample_to_json

NAN = float("nan")
TRACE_SCHEMA = "gpuchef-trace"
TRACE_VERSION = 1

# record type name <-> class; the order is the order of the docs
RECORD_TYPES: dict[str, type] = {
    "step": StepRecord,
    "gpu_sample": GpuSample,
    "host_sample": HostSample,
    "request": RequestRecord,
    "event": EngineEvent,
}
#: `top --attach`'s /metrics scrapes and vLLM plugin records: nested, each its writer and reader
SCRAPE_TYPE = "scrape"
PLUGIN_TYPE = "plugin"
NESTED_TYPES: dict[str, tuple[type, Callable[[Any], dict], Callable[[dict], Any]]] = {
    SCRAPE_TYPE: (ScrapeSample, sample_to_json, sample_from_json),
    PLUGIN_TYPE: (Received, received_to_json, received_from_json),
}
_TYPE_OF: dict[type, str] = {cls: name for name, cls in RECORD_TYPES.items()}
_TYPE_OF.update({cls: name for name, (cls, _, _) in NESTED_TYPES.items()})
_FIELDS: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls))
                                        for cls in RECORD_TYPES.values()}
_TOKEN_FIELDS = ("output_token_ids", "prompt_token_ids")  # written only with trace_prompts
_RESERVED_META = ("type", "schema", "version")


class TraceReadError(Exception):
    """The file is not a readable gpuchef trace (message names the file and why)."""


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    def dist(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    torch = sys.modules.get("torch")  # do not import torch just to name its version
    return {
        "gpuchef": dist("gpuchef"),
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None) or dist("torch"),
        "numpy": dist("numpy"),
        "nvidia-ml-py": dist("nvidia-ml-py"),
    }


def clock_origin() -> dict[str, int]:
    """Both clocks read back to back (the monotonic one twice, averaged), so that
    ``wall_ns = t_ns - monotonic_ns + time_ns`` maps any trace time to Unix time (ns)."""
    m0 = time.monotonic_ns()
    w = time.time_ns()
    m1 = time.monotonic_ns()
    return {"monotonic_ns": (m0 + m1) // 2, "time_ns": w, "uncertainty_ns": m1 - m0}


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if hasattr(o, "as_dict"):
        return o.as_dict()
    return str(o)


def _dumps(d: dict[str, Any]) -> str:
    try:
        return json.dumps(d, separators=(",", ":"), allow_nan=False, default=_json_default)
    except ValueError:  # NaN/inf somewhere: strict JSON has none, write null
        return json.dumps(json_safe(d), separators=(",", ":"), default=_json_default)


def encode_record(rec: Any, *, trace_prompts: bool = False) -> str:
    """One record as its JSON line (no newline): ``{"type": ..., <fields>}``.

    Faster than ``as_dict`` (which deep-copies through ``dataclasses.asdict``). Token ids are
    left out unless ``trace_prompts``. Raises TypeError for an object of no known record type.
    """
    cls = type(rec)
    if (kind := _TYPE_OF.get(cls)) in NESTED_TYPES:
        return _dumps({"type": kind, **NESTED_TYPES[kind][1](rec)})
    names = _FIELDS.get(cls)
    if names is None:
        raise TypeError(f"not a trace record: {cls.__name__}")
    d: dict[str, Any] = {"type": _TYPE_OF[cls]}
    for n in names:
        d[n] = getattr(rec, n)
    if cls is RequestRecord:
        d["token_times_ns"] = list(rec.token_times_ns)
    for n in _TOKEN_FIELDS:
        if n in d:
            if trace_prompts:
                d[n] = list(d[n])
            else:
                del d[n]
    return _dumps(d)


class _Cmd:
    __slots__ = ("kind", "arg", "done", "result")

    def __init__(self, kind: str, arg: Any = None) -> None:
        self.kind = kind
        self.arg = arg
        self.done = threading.Event()
        self.result: Any = None


class TraceRecorder:
    """Writes a session trace from any number of producer threads.

    ``path``: the file (created or truncated; parent folders are created; gzip when it ends in
    ``.gz``, ``is_gzip_name``). ``meta``: JSON-able facts for the meta record, e.g. ``{"command":
    "bench", "config": {...}, "gpus": {0: "NVIDIA H200"}}`` (``type``/``schema``/``version``:
    reserved). ``flush_interval_s`` in (0, 1]: the longest a written record waits for a flush
    (default 0.5). ``trace_prompts``: also write token ids (``--trace-prompts``); off by default.
    ``fsync``: ``os.fsync`` after each flush (survives power loss; costs disk time).
    ``max_pending``: queue items (records, or a host's batches) not yet written beyond which new
    ones are dropped (counted in ``dropped``) rather than grow memory without bound.

    Producers call ``record(obj)`` — a queue put, ~1 µs, never raises; a host's RecordBatch is
    one put. ``flush()`` blocks until everything queued is flushed; ``rotate(new_path)`` finishes
    this file and goes on in another; ``close()`` drains and writes the ``end`` record.
    Raises ConfigError when ``path`` cannot be opened for writing or an argument is out of range.
    """

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None, *,
                 flush_interval_s: float = 0.5, trace_prompts: bool = False, fsync: bool = False,
                 max_pending: int = 1_000_000) -> None:
        if not 0 < flush_interval_s <= 1.0:
            raise ConfigError(f"flush_interval_s {flush_interval_s!r} is out of range: "
                              "allowed (0, 1] s (the trace promises a flush at least once a second)")
        if max_pending < 1:
            raise ConfigError(f"max_pending {max_pending!r} must be >= 1")
        bad = [k for k in (meta or {}) if k in _RESERVED_META]
        if bad:
            raise ConfigError(f"trace meta key(s) {', '.join(bad)} are reserved")
        self.flush_interval_s = float(flush_interval_s)
        self.trace_prompts = bool(trace_prompts)
        self.fsync = bool(fsync)
        self.max_pending = int(max_pending)
        self.session_id = uuid.uuid4().hex
        self.clock = clock_origin()
        self._user_meta = dict(meta or {})
        self.error: str | None = None
        self.dropped = 0
        self.counts: dict[str, int] = {k: 0 for k in RECORD_TYPES}
        self.part = 0
        self.flushes = 0
        self.flush_ns_total = 0
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._close_lock = threading.Lock()
        self.path = Path(path).expanduser()  # as check_output_path checks it (--trace=~/t.jsonl)
        self._f = self._open(self.path, previous=None)
        self._thread = threading.Thread(target=self._run, name="gpuchef-trace", daemon=True)
        self._thread.start()

    # ---- meta ------------------------------------------------------------------------------
    def meta_record(self, previous: str | None = None) -> dict[str, Any]:
        """The meta record for the current part (what the first line holds)."""
        d: dict[str, Any] = {
            "type": "meta", "schema": TRACE_SCHEMA, "version": TRACE_VERSION,
            "session_id": self.session_id, "part": self.part,
            "created": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "clock": dict(self.clock),
            "versions": _versions(),
            "host": {"hostname": socket.gethostname(), "pid": os.getpid(),
                     "platform": platform.platform()},
            "trace_prompts": self.trace_prompts,
            "flush_interval_s": self.flush_interval_s,
        }
        if previous is not None:
            d["previous_part"] = previous
        for k, v in self._user_meta.items():
            d[k] = v
        return d

    def _open(self, path: Path, previous: str | None):
        try:
            if path.parent and not path.parent.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
            if is_gzip_name(path):  # each flush is a gzip sync point: readable while written
                f = gzip.open(path, "wt", compresslevel=6, encoding="utf-8", newline="\n")
            else:
                f = open(path, "w", encoding="utf-8", newline="\n", buffering=1 << 20)
        except OSError as e:
            raise ConfigError(f"--trace {str(path)!r}: cannot open for writing: "
                              f"{e.strerror or e}") from None
        try:
            f.write(_dumps(self.meta_record(previous)) + "\n")
            f.flush()
        except OSError as e:
            try:
                f.close()  # flushes what is buffered again: fails again on a full disk
            except OSError:
                pass
            raise ConfigError(f"--trace {str(path)!r}: cannot write: {e.strerror or e}") from None
        return f

    # ---- producers (any thread; cheap; never raise) ----------------------------------------
    def record(self, rec: Any) -> None:
        """Queue any record (StepRecord, RequestRecord, EngineEvent, GpuSample, HostSample) or a
        host's RecordBatch (a loop turn's records; its StepOutputs are not trace records)."""
        if self._closed:
            self.dropped += 1
            return
        if self._q.qsize() >= self.max_pending:
            self.dropped += 1
            return
        self._q.put(rec)

    # ---- control (any thread but the writer) ------------------------------------------------
    def _command(self, kind: str, arg: Any = None, timeout: float | None = 10.0) -> Any:
        if not self._thread.is_alive():
            return None
        c = _Cmd(kind, arg)
        self._q.put(c)
        c.done.wait(timeout)
        if isinstance(c.result, BaseException):
            raise c.result
        return c.result

    def flush(self, timeout: float | None = 10.0) -> None:
        """Block until every record queued before this call is written and flushed."""
        self._command("flush", timeout=timeout)

    def rotate(self, new_path: str | os.PathLike[str], timeout: float | None = 10.0) -> Path:
        """Finish the current file (all records queued so far, then an ``end`` record) and go on
        writing to ``new_path``, which starts with its own meta record (same ``session_id``,
        ``part`` + 1, ``previous_part`` naming the old file). Returns the finished file's path.
        Raises ConfigError when ``new_path`` cannot be opened (recording goes on in the old file).
        """
        if self._closed:
            raise ConfigError("the trace recorder is closed")
        return self._command("rotate", Path(new_path).expanduser(), timeout=timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Write everything queued, the ``end`` record, flush and close. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._q.put(_Cmd("close"))
        self._thread.join(timeout)

    def __enter__(self) -> "TraceRecorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def written(self) -> int:
        return sum(self.counts.values())

    # ---- the writer thread --------------------------------------------------------------------
    def _end_record(self) -> str:
        return _dumps({"type": "end", "t_ns": time.monotonic_ns(), "counts": dict(self.counts),
                       "dropped": self.dropped, "error": self.error})

    def _flush(self) -> None:
        t0 = time.perf_counter_ns()
        self._f.flush()
        if self.fsync:
            os.fsync(self._f.fileno())
        self.flushes += 1
        self.flush_ns_total += time.perf_counter_ns() - t0

    def _write(self, lines: list[str]) -> None:
        if not lines:
            return
        if self.error is not None:
            self.dropped += len(lines)
            return
        try:
            self._f.write("\n".join(lines) + "\n")
        except (OSError, ValueError) as e:
            self.error = f"trace write failed: {e}"
            self.dropped += len(lines)

    def _do_flush(self) -> None:
        if self.error is None:
            try:
                self._flush()
            except OSError as e:
                self.error = f"trace flush failed: {e}"

    def _run(self) -> None:
        q = self._q
        interval_ns = int(self.flush_interval_s * 1e9)
        last_flush = time.monotonic_ns()
        dirty = False
        counts = self.counts
        tp = self.trace_prompts
        while True:
            timeout = None if not dirty else max(0.0, (last_flush + interval_ns
                                                        - time.monotonic_ns()) / 1e9)
            try:
                item = q.get(timeout=timeout)
            except queue.Empty:
                item = None
            lines: list[str] = []
            cmd: _Cmd | None = None
            while item is not None:  # drain what is there into one write
                if isinstance(item, _Cmd):
                    cmd = item
                    break
                recs = item.records if type(item) is RecordBatch else (item,)
                for x in (r for r in recs if type(r) is not StepOutput):  # outputs: not traced
                    try:
                        lines.append(encode_record(x, trace_prompts=tp))
                        k = _TYPE_OF[type(x)]
                        counts[k] = counts.get(k, 0) + 1  # "scrape", "plugin": attached traces
                    except Exception:  # an unknown object or an unserialisable value: skip it
                        self.dropped += 1
                if len(lines) >= 4096:
                    break
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    item = None
            if lines:
                self._write(lines)
                dirty = True
            now = time.monotonic_ns()
            if cmd is not None:
                self._do_flush()
                dirty, last_flush = False, now
                if cmd.kind == "rotate":
                    cmd.result = self._rotate(cmd.arg)
                elif cmd.kind == "close":
                    self._finish()
                    cmd.done.set()
                    return
                cmd.done.set()
            elif dirty and now - last_flush >= interval_ns:
                self._do_flush()
                dirty, last_flush = False, now

    def _finish(self) -> None:
        self._write([self._end_record()])
        self._do_flush()
        try:
            self._f.close()
        except OSError:
            pass

    def _rotate(self, new_path: Path) -> Any:
        old = self.path
        try:
            same = new_path.exists() and os.path.samefile(new_path, old)
        except OSError:
            same = False
        if same:  # opening it for writing would truncate what this part has written
            return ConfigError(f"rotate: {str(new_path)!r} is the file being written: rotate "
                               "to another path (recording goes on in this one)")
        self.part += 1
        try:
            f = self._open(new_path, previous=str(old))
        except ConfigError as e:
            self.part -= 1
            return e
        self._finish()
        self._f, self.path = f, new_path
        self.counts = {k: 0 for k in RECORD_TYPES}
        self.dropped = 0
        self.error = None
        return old


# ---- reading -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One record read back: ``type`` ("meta", "step", …, "end"), ``line`` (1-based) and
    ``record`` (a StepRecord / GpuSample / HostSample / RequestRecord / EngineEvent, or a dict
    for ``meta`` and ``end``)."""

    type: str
    line: int
    record: Any


@dataclass
class Trace:
    """A whole trace in memory. ``problems``: one message per skipped line (with its number).
    ``complete``: the file ends with an ``end`` record (the writer was closed, not killed)."""

    path: Path
    meta: dict[str, Any]
    steps: list[StepRecord] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)
    host_samples: list[HostSample] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    scrapes: list[ScrapeSample] = field(default_factory=list)
    plugin: list[Received] = field(default_factory=list)
    end: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.end is not None

    def to_wall_ns(self, t_ns: int) -> int:
        """A trace time (monotonic ns) as Unix time in ns, from the meta record's clock origin."""
        c = self.meta["clock"]
        return t_ns - c["monotonic_ns"] + c["time_ns"]


def trace_span(tr: Trace) -> tuple[int, int]:
    """``(start_ns, end_ns)`` of a trace (monotonic ns, ``start <= end``): the earliest and
    latest record times over every stream, whatever the order of the lines (steps by
    ``t_start_ns``/``t_end_ns``, requests by their last token or arrival). A request's arrival
    counts for the start only when no other record is there: a rotated part holds requests that
    arrived in the part before it. No record: the meta clock's origin, twice. The one owner of a
    trace's time span (replay's timeline, the report's time 0 and end)."""
    lo: list[int] = []
    hi: list[int] = []
    if tr.steps:
        lo.append(min(s.t_start_ns for s in tr.steps))
        hi.append(max(s.t_end_ns for s in tr.steps))
    for xs in (tr.scrapes, tr.plugin, tr.gpu_samples, tr.host_samples, tr.events):
        if xs:
            lo.append(min(x.t_ns for x in xs))
            hi.append(max(x.t_ns for x in xs))
    for r in tr.requests:
        hi.append(r.closed_ns)
    if not lo and tr.requests:
        lo.append(min(r.entered_ns for r in tr.requests))
    if not lo:
        t = int((tr.meta.get("clock") or {}).get("monotonic_ns", 0))
        return t, t
    a = min(lo)
    return a, max(a, max(hi))


def _type_ok(ann: str, v: Any) -> tuple[bool, Any]:
    """Check ``v`` against a records.py annotation string; returns (ok, converted value)."""
    opt = ann.endswith("| None")
    base = ann[: -len("| None")].strip() if opt else ann
    if v is None:
        if base == "float" and not opt:
            return True, NAN  # the writer turns NaN into null (strict JSON has no NaN)
        return opt or base == "Any", v
    if base == "int":
        return isinstance(v, int) and not isinstance(v, bool), v
    if base == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool), (float(v) if isinstance(
            v, (int, float)) else v)
    if base == "str":
        return isinstance(v, str), v
    if base == "bool":
        return isinstance(v, bool), v
    if base.startswith("tuple[int"):
        if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return True, tuple(v)
        return False, v
    return True, v


_REQUIRED: dict[type, tuple[str, ...]] = {}
_ANN: dict[type, dict[str, str]] = {}
for _cls in RECORD_TYPES.values():
    _REQUIRED[_cls] = tuple(f.name for f in fields(_cls)
                            if f.default is MISSING and f.default_factory is MISSING)
    _ANN[_cls] = {f.name: str(f.type) for f in fields(_cls)}


#: fields that count (tokens, requests, blocks, steps) or measure a duration: never negative
_NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "step": ("step", "gpu_ms", "max_num_batched_tokens", "max_num_seqs",
             "long_prefill_token_threshold", "max_num_partial_prefills", "num_prefill_reqs",
             "num_prefill_tokens", "num_decode_reqs", "num_partial_prefills", "num_running",
             "num_waiting", "num_preempted", "kv_blocks_used", "kv_blocks_total", "num_finished"),
    "request": ("prompt_len", "output_len", "num_preemptions", "max_tokens"),
}


def _impossible(kind: str, rec: Any) -> str:
    """Why a well-typed record cannot be what a writer recorded ("" if it can): a negative count
    or duration, a step ending before it starts, token times going back."""
    for n in _NON_NEGATIVE.get(kind, ()):
        v = getattr(rec, n)
        if v < 0:  # NaN (a float not measured) compares False: kept
            return f"{kind} field {n}={_short(v)} is negative (allowed: >= 0)"
    if kind == "step" and rec.t_end_ns < rec.t_start_ns:
        return (f"step t_end_ns={rec.t_end_ns} is before t_start_ns={rec.t_start_ns} (a step "
                "cannot end before it starts)")
    if kind == "request":
        t = rec.token_times_ns
        if any(b < a for a, b in zip(t, t[1:])):
            return "request token_times_ns go back in time (allowed: non-decreasing)"
    return ""


def decode_record(kind: str, d: dict[str, Any]) -> Any:
    """Rebuild the typed record of type ``kind`` from its JSON dict.

    Unknown keys are ignored (newer minor writers may add fields). Raises ValueError naming a
    missing required field, a value of the wrong type, or an impossible value (a negative count
    or duration, a step that ends before it starts, token times going back).
    """
    cls = RECORD_TYPES[kind]
    missing = [n for n in _REQUIRED[cls] if n not in d]
    if missing:
        raise ValueError(f"{kind} record lacks required field(s) {', '.join(missing)}")
    kw: dict[str, Any] = {}
    for n, ann in _ANN[cls].items():
        if n not in d:
            continue
        try:
            ok, v = _type_ok(ann, d[n])
        except OverflowError:  # an integer too large for a float field
            ok = False
        if not ok:
            raise ValueError(f"{kind} field {n}={_short(d[n])} is not {ann}")
        kw[n] = v
    rec = cls(**kw)
    why = _impossible(kind, rec)
    if why:
        raise ValueError(why)
    return rec


def _short(v: Any, limit: int = 80) -> str:
    """``repr(v)`` cut to ``limit`` characters (a problem line must stay one readable line)."""
    r = repr(v)
    return r if len(r) <= limit else f"{r[:limit]}… ({len(r):,} characters)"


def _json_error(e: BaseException) -> str:
    """Why ``json.loads`` refused a line, in a few words."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at column {e.colno}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split(";")[0]  # e.g. an integer of more than 4300 digits


# meta keys gpuchef writes and its readers rely on, with the JSON type each must have
# (docs/trace-format.md; the caller's keys are those of session.trace_meta)
_META_TYPES: dict[str, tuple[type, ...]] = {
    "session_id": (str,), "part": (int,), "previous_part": (str,), "created": (str,),
    "clock": (dict,), "versions": (dict,), "host": (dict,), "trace_prompts": (bool,),
    "flush_interval_s": (int, float), "command": (str,), "model": (dict, str), "device": (str,),
    "attention_backend": (str,), "decode_attention": (str,), "kernels": (dict,), "engine_config": (dict,), "config": (dict,), "workload": (dict,),
    "max_model_len": (int,), "kv_blocks": (int,), "block_size": (int,), "gpus": (dict,),
}
_JSON_NAMES = {dict: "an object", str: "a string", int: "an integer", float: "a number",
               bool: "true or false"}


def _meta_problems(meta: dict[str, Any]) -> list[str]:
    """Drop the meta keys whose value has the wrong JSON type (a hand-edited or foreign file),
    so that readers fall back to their defaults; returns one message per key dropped."""
    out = []
    for key, types in _META_TYPES.items():
        v = meta.get(key)
        if v is None or (isinstance(v, types) and not (isinstance(v, bool) and bool not in types)):
            continue
        del meta[key]
        want = " or ".join(_JSON_NAMES[t] for t in types)
        out.append(f"meta field {key}={_short(v)} is not {want} — ignored")
    clock = meta.get("clock")
    if clock is not None and not all(isinstance(clock.get(k), int) and not isinstance(
            clock.get(k), bool) for k in ("monotonic_ns", "time_ns")):
        del meta["clock"]
        out.append(f"meta field clock={_short(clock)} lacks integer monotonic_ns and time_ns — "
                   "ignored (no wall-clock times)")
    sched = (meta.get("engine_config") or {}).get("scheduler")
    if sched is not None and not isinstance(sched, dict):
        del meta["engine_config"]["scheduler"]
        out.append(f"meta field engine_config.scheduler={_short(sched)} is not an object — "
                   "ignored")
    return out


def _check_meta(path: Path, line: str) -> dict[str, Any]:
    try:
        meta = json.loads(line)
    except (ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict) or meta.get("type") != "meta" \
            or meta.get("schema") != TRACE_SCHEMA:
        raise TraceReadError(f"{path}: not a gpuchef trace (line 1 is not a "
                             f'{{"type":"meta","schema":"{TRACE_SCHEMA}"}} record)')
    v = meta.get("version")
    if not isinstance(v, int) or isinstance(v, bool):
        raise TraceReadError(f"{path}: meta record has no integer version")
    if v > TRACE_VERSION:
        raise TraceReadError(f"{path}: trace format version {v} is newer than this gpuchef reads "
                             f"(up to {TRACE_VERSION}); upgrade gpuchef")
    if v < 1:
        raise TraceReadError(f"{path}: trace format version {v} is not valid")
    return meta


def _numbered_lines(f: Any, path: Path,
                    on_problem: Callable[[str], None]) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` from line 2 on; a read error (a failing disk, a network mount
    gone) ends the file with one problem naming the line that could not be read."""
    n = 1
    try:
        for n, line in enumerate(f, start=2):
            yield n, line
    except (OSError, EOFError, zlib.error) as e:  # gzip: a stream cut short or corrupt
        on_problem(f"{path} line {n + 1}: cannot read ({getattr(e, 'strerror', None) or e}) — "
                   "the rest of the file is not read")


def is_gzip_name(path: str | os.PathLike[str]) -> bool:
    """Whether a trace path names a gzip file (it ends in ``.gz``, any case): the recorder then
    writes gzip and ``trace_name`` drops the suffix. Reading goes by the file's first bytes
    instead (gzip's magic), so a plain trace named ``.gz`` by an older gpuchef still reads."""
    return Path(path).suffix.lower() == ".gz"


def trace_name(path: str | os.PathLike[str]) -> str:
    """A trace's name for titles and default outputs: its file name without ``.gz`` and then its
    last suffix (``run.jsonl.gz`` → ``run``, ``run.jsonl`` → ``run``)."""
    p = Path(path)
    if is_gzip_name(p):
        p = p.with_suffix("")
    return p.stem


def iter_trace(path: str | os.PathLike[str],
               on_problem: Callable[[str], None] | None = None) -> Iterator[TraceRecord]:
    """Stream a trace: the meta record first, then each valid record in file order.

    ``on_problem(message)`` is called for each skipped line ("<file> line N: ..."); default:
    ``warnings.warn``. Raises TraceReadError when the file is missing, empty, not a gpuchef trace
    or of a newer major version.
    """
    p = Path(path)
    if on_problem is None:
        import warnings

        def on_problem(msg: str) -> None:
            warnings.warn(msg, stacklevel=3)
    try:
        fb = open(p, "rb")
    except OSError as e:
        raise TraceReadError(f"{p}: cannot open: {e.strerror or e}") from None
    try:
        with fb:
            gz = fb.read(2) == b"\x1f\x8b"  # gzip's magic: a compressed trace is read as is
        f = (gzip.open(p, "rt", encoding="utf-8", errors="replace", newline="\n") if gz else
             open(p, encoding="utf-8", errors="replace", newline="\n"))
    except OSError as e:
        raise TraceReadError(f"{p}: cannot read: {e.strerror or e}") from None
    with f:
        meta = _read_meta_line(f, p)
        for msg in _meta_problems(meta):
            on_problem(f"{p} line 1: {msg}")
        yield TraceRecord("meta", 1, meta)
        for n, line in _numbered_lines(f, p, on_problem):
            got = _record_from_line(p, n, line)
            if isinstance(got, str):
                on_problem(got)
            elif got is not None:
                yield got


def _read_meta_line(f: Any, p: Path) -> dict[str, Any]:
    """Line 1, the meta record; TraceReadError when unreadable, empty, blank, UTF-16 or no meta."""
    try:
        first = f.readline()
    except (OSError, EOFError, zlib.error) as e:  # gzip: a bad header, a cut or corrupt stream
        raise TraceReadError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if not first:
        raise TraceReadError(f"{p}: empty file, not a gpuchef trace")
    if not first.strip():
        raise TraceReadError(f"{p}: line 1 is blank, not a gpuchef trace (a trace starts "
                             "with its meta record on line 1)")
    if first.startswith("\ufffd\ufffd") and "\x00" in first[:8]:  # a UTF-16 byte-order mark
        raise TraceReadError(f"{p}: UTF-16 text (e.g. saved through PowerShell's '>'); a "
                             "trace is UTF-8 JSON Lines — convert it back to UTF-8")
    return _check_meta(p, first.removeprefix("\ufeff"))  # a UTF-8 BOM an editor added


def _record_from_line(p: Path, n: int, line: str) -> TraceRecord | str | None:
    """Line ``n`` as a TraceRecord, or the problem that skips it (str: the caller reports it, so
    the default warning's stacklevel holds), or None (a blank line)."""
    s = line.strip()
    if not s:
        return None
    try:
        d = json.loads(s)
    except (ValueError, RecursionError) as e:
        if not line.endswith("\n"):  # the last line, cut short
            return f"{p} line {n}: truncated last record (the writer stopped mid-line) — skipped"
        return f"{p} line {n}: not valid JSON ({_json_error(e)}) — skipped"
    if not isinstance(d, dict):
        return f"{p} line {n}: not a JSON object — skipped"
    kind = d.get("type")
    if not isinstance(kind, str):  # e.g. a list: not hashable, not a type name
        why = ('has no "type" key' if kind is None
               else f'record type {_short(kind)} is not a string')
        return f"{p} line {n}: {why} — skipped"
    if kind == "end":
        return TraceRecord("end", n, d)
    if kind == "meta":
        return f"{p} line {n}: a second meta record — skipped"
    if kind in NESTED_TYPES:
        try:
            return TraceRecord(kind, n, NESTED_TYPES[kind][2](d))
        except ValueError as e:
            return f"{p} line {n}: {e} — skipped"
    if kind not in RECORD_TYPES:
        return f"{p} line {n}: unknown record type {_short(kind)} — skipped"
    try:
        rec = decode_record(kind, d)
    except (ValueError, TypeError) as e:
        return f"{p} line {n}: {e} — skipped"
    return TraceRecord(kind, n, rec)


_LISTS = {"step": "steps", "gpu_sample": "gpu_samples", "host_sample": "host_samples",
          "request": "requests", "event": "events", SCRAPE_TYPE: "scrapes",
          PLUGIN_TYPE: "plugin"}


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a whole trace into a :class:`Trace`; skipped lines are listed in ``problems``.

    Raises TraceReadError as :func:`iter_trace` does.
    """
    problems: list[str] = []
    it = iter_trace(path, problems.append)
    first = next(it)
    tr = Trace(Path(path), first.record, problems=problems)
    for r in it:
        if r.type == "end":
            tr.end = r.record
        else:
            getattr(tr, _LISTS[r.type]).append(r.record)
    return tr
