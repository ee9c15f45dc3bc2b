"""What the engine emits: one StepRecord per step, one RequestRecord per finished request, and
an EngineEvent for each command applied between steps.

These are the contract between the engine and everything above it (probes, dashboard, traces).
They are plain frozen dataclasses of ints, floats and strings so that they can be handed across
threads and written as JSON without copies of tensors. Times are ``time.monotonic_ns()`` (ns).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


#: The kinds of step (``StepRecord.kind``); a step computes prefill tokens, decode rows or both.
STEP_KINDS = ("prefill_only", "mixed", "decode_only")


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step, emitted at the scheduler/runner boundary (docs/trace-format.md).

    ``t_start_ns``/``t_end_ns``: monotonic ns around schedule + forward + sample + bookkeeping.
    ``gpu_ms``: the forward pass in ms, from CUDA events on GPU, wall time on CPU.
    Token counts are the tokens computed this step: a decode request contributes one token, a
    prefill request its chunk. ``num_partial_prefills`` counts requests left mid-prefill after the
    step. ``num_preempted`` counts preemptions made while scheduling this step. Queue sizes and KV
    figures (blocks of ``block_size`` tokens) are taken after the step, finished requests gone.
    ``prefill_allowance``: the prefill tokens the autopilot allowed this step (-1: autopilot
    off or not a chunked step; while it learns, 1/8-1/2 of the budget left after the decodes;
    while it falls back or the ITL target is infeasible, all of it);
    ``predicted_ms``: its step-time model's prediction for the step as scheduled (ms; -1: none
    yet), to set against ``wall_ms``. ``auto_budget``: its targets in force ("" = off).
    ``autopilot_state``: what the allowance was, one of ``autopilot.STATES`` (the names and
    their meanings: "learning", "steering", "infeasible", "fallback"; "" = off).
    ``fit_error``: the model's tracked mean relative a-priori error |wall - predicted| / wall
    when the step was scheduled (fraction; -1: not tracked yet) — the number its status lines
    and fallback rule use. ``goal_ms``: the step time the autopilot aimed under while it
    steered (ms; -1: it did not steer this step): the ITL target × its model's margin × its
    feedback's factor, never above the target.
    ``itl_ms``: the inter-token latency the step's decode rows saw — from the previous step
    that emitted tokens to this step's tokens (ms; -1: no decode rows, or an engine that does
    not time it); it counts the engine's own work between steps, which ``wall_ms`` does not.
    ``cuda_graph``: the step's forward ran from CUDA graphs — for a decode-only step the full
    decode graph (vLLM's FULL), for a step with prefill tokens the piecewise graphs with
    attention eager between them (vLLM's PIECEWISE; docs/engine-graphs.md); ``kind`` tells
    which. False: eager (``--enforce-eager``, the CPU, a step above the largest capture size).
    """

    step: int
    t_start_ns: int
    t_end_ns: int
    gpu_ms: float
    mode: str
    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_token_threshold: int
    max_num_partial_prefills: int
    num_prefill_reqs: int
    num_prefill_tokens: int
    num_decode_reqs: int
    num_partial_prefills: int
    num_running: int
    num_waiting: int
    num_preempted: int
    kv_blocks_used: int
    kv_blocks_total: int
    num_finished: int = 0
    cuda_graph: bool = False
    max_long_partial_prefills: int = 1
    auto_budget: str = ""
    prefill_allowance: int = -1
    predicted_ms: float = -1.0
    autopilot_state: str = ""
    fit_error: float = -1.0
    goal_ms: float = -1.0
    itl_ms: float = -1.0

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decode_reqs

    @property
    def kind(self) -> str:
        """"prefill_only", "mixed" or "decode_only" (``STEP_KINDS``): what the step computed."""
        if self.num_prefill_tokens and self.num_decode_reqs:
            return "mixed"
        return "prefill_only" if self.num_prefill_tokens else "decode_only"

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_reqs

    @property
    def wall_ms(self) -> float:
        return (self.t_end_ns - self.t_start_ns) / 1e6

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A finished (or aborted) request, with the timestamps that latency metrics need.

    ``arrival_ns``: when the request reached the engine (``add_request``), or its scheduled arrival
    time from the load generator when that is given. ``token_times_ns``: when each output token
    was produced (end of the step that sampled it); the first is the first-token time.
    ``finish_reason``: "length" (forced/max length reached), "stop" (EOS, a stop token, or a
    stop string found by the server), "abort" (e.g. the client disconnected), "error", or the
    reason gpuchef withdrew it with (``probes.metrics.WITHDRAWN_REASONS``: "early stop",
    "session end").
    ``first_scheduled_ns``: start of the first step that computed any of its prompt (0 if none
    did); ``first_scheduled_ns − arrival_ns`` is vLLM's queue time. ``ended_ns``: when a record
    without tokens ended — its error (an HTTP request that failed), abort, or withdrawal — 0 when
    not recorded; earlier than ``arrival_ns`` for a request withdrawn *before* its arrival time
    (a capacity probe stopped early withdraws the arrivals still to come: it never arrived).
    Latency definitions follow ``vllm bench serve``: TTFT = first token − arrival,
    TPOT = (e2e − TTFT)/(output_len − 1), E2EL = last token − arrival, ITL = one gap per output
    chunk after the first. A chunk is the tokens that arrived at one time stamp: a step that
    emits k tokens for a request (vLLM's speculative or multi-step decoding, an SSE chunk of k
    tokens) repeats its time k times in ``token_times_ns`` and is one ITL, as ``vllm bench
    serve`` records one ITL per streamed chunk (vllm/benchmarks/lib/endpoint_request_func.py).
    So ``sum(itls_ms) == e2el_ms − ttft_ms``, and no ITL is a 0 that was not measured.
    """

    request_id: str
    arrival_ns: int
    prompt_len: int
    output_len: int
    token_times_ns: tuple[int, ...]
    finish_reason: str
    num_preemptions: int = 0
    max_tokens: int = 0
    error: str = ""
    output_token_ids: tuple[int, ...] = field(default=(), repr=False)
    first_scheduled_ns: int = 0
    ended_ns: int = 0

    @property
    def withdrawn(self) -> bool:
        """Withdrawn before its arrival time: it never reached the engine."""
        return 0 < self.ended_ns < self.arrival_ns

    @property
    def entered_ns(self) -> int:
        """When the request entered the recording's time line (ns): its arrival, or its
        withdrawal for one withdrawn before it arrived (whose ``arrival_ns`` lies later). Time
        windows (A/B windows, capacity probes) place a request by this."""
        return self.ended_ns if self.withdrawn else self.arrival_ns

    @property
    def closed_ns(self) -> int:
        """When the record closed (ns): its last token's time; for one without tokens its
        ``ended_ns`` when recorded, else its arrival."""
        t = self.token_times_ns
        return t[-1] if t else (self.ended_ns or self.arrival_ns)

    @property
    def ttft_ms(self) -> float | None:
        if not self.token_times_ns:
            return None
        return (self.token_times_ns[0] - self.arrival_ns) / 1e6

    @property
    def e2el_ms(self) -> float | None:
        if not self.token_times_ns:
            return None
        return (self.token_times_ns[-1] - self.arrival_ns) / 1e6

    @property
    def tpot_ms(self) -> float | None:
        n = len(self.token_times_ns)
        if n < 2:
            return None
        return (self.token_times_ns[-1] - self.token_times_ns[0]) / 1e6 / (n - 1)

    @property
    def chunk_sizes(self) -> list[int]:
        """Tokens per output chunk (a run of one time stamp in ``token_times_ns``), in order."""
        out: list[int] = []
        t = self.token_times_ns
        for i, x in enumerate(t):
            if i and x == t[i - 1]:
                out[-1] += 1
            else:
                out.append(1)
        return out

    @property
    def itls_ms(self) -> list[float]:
        """Inter-token latencies (ms), one per chunk after the first (see the class docstring):
        the gaps between consecutive distinct token times."""
        t = self.token_times_ns
        return [(t[i] - t[i - 1]) / 1e6 for i in range(1, len(t)) if t[i] != t[i - 1]]

    def as_dict(self, with_tokens: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["token_times_ns"] = list(self.token_times_ns)
        if with_tokens:
            d["output_token_ids"] = list(self.output_token_ids)
        else:
            d.pop("output_token_ids")
        return d


@dataclass(frozen=True, slots=True)
class StepOutput:
    """The tokens one step sampled, for streaming (the HTTP front door) and live counters.

    ``t_ns``: when they were sampled (the time in each request's ``token_times_ns``).
    ``tokens``: ``(request_id, token_id)`` for every request that got a token this step.
    ``first_tokens``: ``(request_id, arrival_ns, prompt_len)`` for those whose first token it
    is (TTFT). A request that finishes this step is in ``tokens`` and, after it, its
    RequestRecord goes to ``on_request``; ``finished`` holds those records too, so that a
    streaming consumer can send a request's last token and its end together.
    """

    step: int
    t_ns: int
    tokens: tuple[tuple[str, int], ...]
    first_tokens: tuple[tuple[str, int, int], ...] = ()
    finished: tuple["RequestRecord", ...] = ()


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """A command that took effect (or was refused) between steps.

    ``kind``: "knob" (a knob changed), "mode" (mode switched), "pause", "resume", "mark" (a label
    from above, e.g. an A/B window), "warning", "notice", "error" (a command refused: ``message``
    says why). ``step``: the id of the first step that runs with the change in force; -1 for a
    notice not tied to a step (the GPU sampler's status: ``name`` "nvml"). ``source``: who
    asked for a change: "http" (the knob endpoint), "" (the dashboard or the command itself).
    """

    kind: str
    step: int
    t_ns: int
    name: str = ""
    old: Any = None
    new: Any = None
    message: str = ""
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
