"""The one interface through which the engine's record stream reaches its consumers (vLLM's
``StatLoggerBase.record`` over a list of loggers is the model).

A host (``host.EngineHost`` in this process, ``core.EngineCoreClient`` for the engine in its own
process) hands every engine loop turn's records to its sinks as one :class:`RecordBatch`: the
commands applied before the step (EngineEvents), the step (StepRecord), its sampled tokens
(StepOutput), then the requests it finished (RequestRecords), in the order the engine emitted
them. Both hosts deliver the same batches — same grouping, same order — whichever process the
engine runs in; a turn that emitted nothing delivers nothing.

Sinks are called one after another, in the order of the host's list, each with the whole batch
before the next sink sees it. The order of the list is therefore a guarantee a composition can
rely on: e.g. /metrics is listed before the HTTP front door, so a request is counted before the
front door ends its stream.

``RecordSink.record`` runs on the thread that delivers the stream (the engine thread of an
in-thread host, the receiver thread of the client of an engine process) and must be cheap: an
append, a queue put. It must not raise. If it does, what happens today with a raising consumer
is kept:

* in-thread ``EngineHost``: the exception ends the engine loop as any engine-thread error does —
  the sinks after the raising one miss that batch, ``host.error`` is the exception, one "error"
  EngineEvent goes to the sinks in a batch of its own, ``wait_done`` returns, and the engine
  thread re-raises it (``threading.excepthook`` prints it);
* ``EngineCoreClient`` (engine in its own process): the same — the sinks after the raising one
  miss that batch, ``host.error`` is the exception, one "error" EngineEvent ("engine thread
  died: …") goes to the sinks in a batch of its own, ``wait_done`` returns, no later batch is
  delivered, and the engine process is told to stop this host (its requests abandoned).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Sequence

from .vocab.records import EngineEvent, RequestRecord, StepOutput, StepRecord


class RecordBatch:
    """One engine loop turn's records, read-only: ``records`` in the engine's order, and the
    same records by type (``steps``, ``outputs``, ``requests``, ``events``, each in order).

    The lists by type are split off ``records`` on first use (an engine process's engine thread
    only builds the batch; its output thread splits it), or given when the batch is decoded
    from the wire, which carries them split already."""

    __slots__ = ("records", "_by_type")

    def __init__(self, records: Sequence[Any],
                 by_type: tuple[Sequence[StepRecord], Sequence[StepOutput],
                                Sequence[RequestRecord], Sequence[EngineEvent]] | None = None
                 ) -> None:
        self.records = records
        self._by_type = by_type

    def _split(self) -> tuple:
        t = self._by_type
        if t is None:
            steps: list[StepRecord] = []
            outputs: list[StepOutput] = []
            requests: list[RequestRecord] = []
            events: list[EngineEvent] = []
            lists = {StepRecord: steps, StepOutput: outputs, RequestRecord: requests,
                     EngineEvent: events}
            for r in self.records:
                lists[type(r)].append(r)
            t = self._by_type = (steps, outputs, requests, events)
        return t

    @property
    def steps(self) -> Sequence[StepRecord]:
        return self._split()[0]

    @property
    def outputs(self) -> Sequence[StepOutput]:
        return self._split()[1]

    @property
    def requests(self) -> Sequence[RequestRecord]:
        return self._split()[2]

    @property
    def events(self) -> Sequence[EngineEvent]:
        return self._split()[3]

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.records)

    def __repr__(self) -> str:
        return f"RecordBatch({list(self.records)!r})"


class RecordSink(Protocol):
    """A consumer of the record stream. ``record(batch)``: one engine loop turn's records, on the
    thread that delivers the stream; cheap (append, queue put); must not raise (the module's
    docstring says what happens if it does)."""

    def record(self, batch: RecordBatch) -> None: ...


def _noop(_: Any) -> None:
    pass


class ListenerSink:
    """A sink calling per-record callbacks, each record in the batch's order: ``on_step``
    (StepRecord), ``on_output`` (StepOutput), ``on_request`` (RequestRecord), ``on_event``
    (EngineEvent); a callback not given drops its records. For consumers whose nature is one
    record at a time."""

    __slots__ = ("_calls",)

    def __init__(self, *, on_step: Callable[[StepRecord], None] | None = None,
                 on_output: Callable[[StepOutput], None] | None = None,
                 on_request: Callable[[RequestRecord], None] | None = None,
                 on_event: Callable[[EngineEvent], None] | None = None) -> None:
        self._calls = {StepRecord: on_step or _noop, StepOutput: on_output or _noop,
                       RequestRecord: on_request or _noop, EngineEvent: on_event or _noop}

    def record(self, batch: RecordBatch) -> None:
        calls = self._calls
        for r in batch.records:
            calls[type(r)](r)


__all__ = ["ListenerSink", "RecordBatch", "RecordSink"]
