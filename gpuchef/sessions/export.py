"""The session trace of a live or attached session, one owner for both: rotation into parts
(``e`` with a trace open) and the backfill that writes what a session holds when ``e`` opens a
trace mid-session, then records on there.

A session keeps ``_recorder`` (the open TraceRecorder, or None) and ``_pending`` (records that
arrive while a backfill gathers the backlog, or None) and routes each record through
:func:`record_to` (its host's batches through :class:`TraceSink`)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from ..engine_host.vocab.records import RequestRecord, StepOutput, StepRecord
from ..probes.recorder import TraceRecorder

#: records at one instant in a backfilled trace: in this order (by type name)
ORDER = ("StepRecord", "EngineEvent", "GpuSample", "HostSample", "ScrapeSample", "RequestRecord")


def next_part_path(path: Path) -> Path:
    """``run.jsonl`` → ``run.part2.jsonl``, ``run.part2.jsonl`` → ``run.part3.jsonl`` (first free)."""
    stem, suffix = path.stem, path.suffix
    base, n = stem, 2
    if ".part" in stem:
        head, _, num = stem.rpartition(".part")
        if num.isdigit():
            base, n = head, int(num) + 1
    while True:
        p = path.with_name(f"{base}.part{n}{suffix}")
        if not p.exists():
            return p
        n += 1


def default_trace_path() -> Path:
    """``gpuchef-top-<time>.jsonl`` in the current folder."""
    return Path(f"gpuchef-top-{datetime.now():%Y%m%d-%H%M%S}.jsonl")


class TraceOwner:
    """A session that writes its trace through ``_recorder`` (a ``TraceRecorder`` or None):
    ``trace_path`` is the file it writes now, None when none is open."""

    _recorder: TraceRecorder | None

    @property
    def trace_path(self) -> str | None:
        r = self._recorder
        return str(r.path) if r is not None else None


def record_to(owner: Any, rec: Any) -> None:
    """Write ``rec`` to ``owner``'s open trace, or keep it for the one being opened."""
    r = owner._recorder
    if r is not None:
        r.record(rec)
    elif owner._pending is not None:
        owner._pending.append(rec)


class TraceSink:
    """``owner``'s trace as one of its host's sinks: each batch to the open trace (one put), or
    kept for the one being opened (:func:`backfill`)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def record(self, batch: Any) -> None:
        owner = self.owner
        r = owner._recorder
        if r is not None:
            r.record(batch)
        elif owner._pending is not None:  # a StepOutput is no trace record
            owner._pending.extend(x for x in batch.records if not isinstance(x, StepOutput))


def rotate(recorder: TraceRecorder, path: str | None) -> str:
    """Finish the open trace (its end record) and go on in ``path`` (default: the next part).
    Returns the one-line message."""
    new = Path(path) if path else next_part_path(recorder.path)
    done = recorder.rotate(new)
    return f"trace {done} finished; now writing {new}"


def held_at(x: Any) -> tuple[int, int]:
    """Where a held record goes in a backfilled trace: a step at its end, a request when it
    closed, anything else at its ``t_ns``; records at one instant in :data:`ORDER`."""
    name = type(x).__name__
    rank = ORDER.index(name) if name in ORDER else len(ORDER)
    if isinstance(x, StepRecord):
        return x.t_end_ns, rank
    if isinstance(x, RequestRecord):
        return x.closed_ns, rank
    return x.t_ns, rank


def backfill(owner: Any, path: str | None, meta: dict[str, Any],
             held: Callable[[], Sequence[Any]], *, trace_prompts: bool = False) -> Path:
    """Open a trace at ``path`` (default :func:`default_trace_path`) for ``owner`` (a session
    with no trace open), write the records it holds (``held()``, gathered once records that
    arrive are kept aside; in :func:`held_at` order; the meta says
    ``backfilled_from_timeline``) and record on there; what arrived meanwhile is
    written once (a step by its id, a request by its id, anything else by identity). Returns
    the path. Raises ConfigError when the file cannot be opened."""
    p = Path(path) if path else default_trace_path()
    rec = TraceRecorder(p, meta={**meta, "backfilled_from_timeline": True},
                        trace_prompts=trace_prompts)
    owner._pending = []
    backlog = sorted(held(), key=held_at)
    steps = {x.step for x in backlog if isinstance(x, StepRecord)}
    reqs = {x.request_id for x in backlog if isinstance(x, RequestRecord)}
    seen = {id(x) for x in backlog}
    for x in backlog:
        rec.record(x)
    owner._recorder = rec
    pending, owner._pending = owner._pending, None
    for x in pending:
        if isinstance(x, StepRecord):
            dup = x.step in steps
        elif isinstance(x, RequestRecord):
            dup = x.request_id in reqs
        else:
            dup = id(x) in seen
        if not dup:
            rec.record(x)
    return p
