"""The wire format between gpuchef's vLLM stat-logger plugin (``gpuchef.vllm_plugin``, in vLLM's
API-server process) and its reader (``probes.plugin_reader``, in the dashboard).

The one definition both sides import: the plugin is in the top room and may import probes; the
reader is here. It imports msgspec and nothing else, so the plugin stays light in vLLM's process.

A message from the publisher to one reader is two zmq frames (after the ROUTER's routing id):

- ``Header`` (msgpack array): ``dropped``, how many records of this record's ``engine_idx`` the
  publisher could not hand to *this* reader since the reader registered (its queue was full).
  Cumulative, so a reader that lost a message still knows the total.
- ``PluginRecord`` (msgpack map, default-valued fields omitted): one ``record()`` call of vLLM's
  stat-logger interface. A map, not an array, so that a plugin and a reader of different gpuchef
  versions still decode each other: unknown keys are ignored, missing ones take their default.

A reader registers by sending ``HELLO`` (and again every second: after a reconnect the publisher
learns of it again); ``BYE`` unregisters it.
"""

from __future__ import annotations

import msgspec

#: bumped when a field changes meaning (adding a field does not need it)
WIRE_VERSION = 1

HELLO = b"gpuchef-hello/1"
BYE = b"gpuchef-bye/1"


class Header(msgspec.Struct, array_like=True):
    dropped: int = 0


class PluginRecord(msgspec.Struct, omit_defaults=True):
    """One vLLM ``StatLoggerBase.record()`` call: one engine output batch of one engine.

    ``None`` means vLLM did not give the value in this call (no ``SchedulerStats``, or the
    optional stats object absent: cudagraph stats need ``--cudagraph-metrics``, FLOPs/bytes need
    ``--enable-mfu-metrics``, spec-decoding stats need a draft model). Times in seconds unless
    the name says ``_ns``.
    """

    #: the publisher's WIRE_VERSION (0: a record that did not say)
    v: int = 0
    #: publisher id, random at the publisher's start: a new one means vLLM (re)started
    pub: int = 0
    pid: int = 0
    engine_idx: int = 0
    #: per (publisher, engine_idx): 0, 1, 2, ... over every record() call, sent or not
    seq: int = 0
    #: time.time_ns() and time.monotonic_ns() in vLLM's API-server process at record()
    t_ns: int = 0
    mono_ns: int = 0
    #: IterationStats.iteration_timestamp: time.time() when the front end began processing
    #: this batch (None without IterationStats)
    iter_ts: float | None = None
    has_sched: bool = False
    has_iter: bool = False
    # -- SchedulerStats: the scheduler's state when it made this batch's output
    running: int | None = None
    waiting: int | None = None
    skipped_waiting: int | None = None
    kv_usage: float | None = None
    #: prefix cache, this step only (vLLM resets the counters each step)
    prefix_requests: int | None = None
    prefix_queries: int | None = None
    prefix_hits: int | None = None
    prefix_reset: bool = False
    #: spec decoding, this step
    spec_drafts: int | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    #: CUDAGraphStat of this step (--cudagraph-metrics)
    cg_mode: str | None = None
    cg_unpadded_tokens: int | None = None
    cg_padded_tokens: int | None = None
    cg_paddings: int | None = None
    #: PerfStats of this step, per GPU (--enable-mfu-metrics)
    flops_per_gpu: int | None = None
    read_bytes_per_gpu: int | None = None
    write_bytes_per_gpu: int | None = None
    # -- IterationStats: the requests' outputs in this batch
    #: prompt tokens of the requests whose first token is in this batch (whole prompts, counted
    #: when prefill completes, not per chunk); computed = not from a cache
    prompt_tokens: int = 0
    prompt_computed: int | None = None
    prompt_cached: int | None = None
    generation_tokens: int = 0
    #: PREEMPTED events delivered with this batch's outputs
    preempted: int = 0
    #: one per request whose first token is in this batch: arrival to this batch (front end)
    ttfts: list[float] = msgspec.field(default_factory=list)
    #: one per decoding request in this batch: engine-core time since its previous output
    itls: list[float] = msgspec.field(default_factory=list)
    finished: int = 0
