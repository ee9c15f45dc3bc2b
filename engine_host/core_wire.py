"""The record stream's wire between the engine process (``core_proc``) and its client
(``core``): msgpack by msgspec, one ``OutBatch`` per engine loop turn out, tagged
``msgspec.Struct`` messages in (``Inbound``). Both sides import this module and nothing of
each other's, so the message shapes live in one place.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from .vocab.config import SchedulerConfig
from .vocab.records import EngineEvent, RequestRecord, StepOutput, StepRecord
from .request import SamplingParams
from .sinks import RecordBatch

#: ``OutBatch.order``'s code of each record type: which list the next record comes from
CODES = {StepRecord: 115, StepOutput: 111, RequestRecord: 114, EngineEvent: 101}  # s o r e


class OutBatch(msgspec.Struct, array_like=True):
    """One engine loop turn's records, in emission order: ``order`` holds one code per record
    (b"s" step, b"o" output, b"r" request, b"e" event) saying which list the next one comes from.
    The rest is the host's status after the turn."""

    host: int
    order: bytes
    steps: list[StepRecord]
    outputs: list[StepOutput]
    requests: list[RequestRecord]
    events: list[EngineEvent]
    state: Union[tuple[int, int, int, int], None]
    step_id: int
    submitted: int
    done: bool
    paused: bool
    load_paused: bool
    sched: Union[SchedulerConfig, None] = None
    error: str = ""
    final: bool = False


class NewHost(msgspec.Struct, tag="host", array_like=True):
    host: int


class Workload(msgspec.Struct, tag="workload", array_like=True):
    specs: list[tuple[str, float, list[int], int]]  # request_id, arrival_s, prompt, output_len
    t0_ns: Union[int, None]


class Start(msgspec.Struct, tag="start", array_like=True):
    t0_ns: int


class Submit(msgspec.Struct, tag="submit", array_like=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_ns: Union[int, None]
    load: bool


class Command(msgspec.Struct, tag="cmd", array_like=True):
    kind: str  # an EngineHost method, one of _COMMANDS
    args: list[Any]
    kwargs: dict[str, Any]


class Stop(msgspec.Struct, tag="stop", array_like=True):
    abort_remaining: bool
    abort_reason: str


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class Subscribe(msgspec.Struct, tag="sub", array_like=True):
    """Send the stream to ``addr`` too (``on`` False: stop), e.g. the HTTP server's process."""

    addr: str
    on: bool


Inbound = Union[NewHost, Workload, Start, Submit, Command, Stop, Shutdown, Subscribe]
#: the EngineHost methods a Command may name
_COMMANDS = ("set_config", "pause", "resume", "pause_load", "resume_load", "mark", "abort")


def batch_records(b: OutBatch) -> list[Any]:
    """An OutBatch's records in the engine's order (for a subscriber decoding the stream)."""
    it = {115: iter(b.steps), 111: iter(b.outputs), 114: iter(b.requests), 101: iter(b.events)}
    return [next(it[code]) for code in b.order]


def record_batch(b: OutBatch) -> RecordBatch:
    """The RecordBatch an OutBatch carries (the lists by type as decoded)."""
    return RecordBatch(batch_records(b), (b.steps, b.outputs, b.requests, b.events))


__all__ = ["CODES", "Command", "Inbound", "NewHost", "OutBatch", "Shutdown", "Start", "Stop",
           "Submit", "Subscribe", "Workload", "batch_records", "record_batch"]
