"""One scheduler, two policies, switchable between steps.

``continuous`` — vLLM V0's ``_schedule_default``: "First, it batches as many prefill requests as
possible" and "Don't schedule decodes if prefills are scheduled". Prompts are never split (a
request that was left mid-prefill by ``chunked`` gets its whole remainder). A prompt longer than
the token budget is admitted only as the step's first prefill, and then runs alone: V0 would
refuse it outright, which a live budget change must not do to queued requests.

``chunked`` — Sarathi-Serve's stall-free batching (vLLM V1 with chunked prefill): every running
decode first (one token each), then continuing prefill chunks, then new prefills, until the
token budget ``max_num_batched_tokens`` is spent. ``long_prefill_token_threshold`` caps one
request's chunk; ``max_num_partial_prefills`` caps the prompts left mid-prefill after a step;
``max_long_partial_prefills`` (vLLM V0) caps the long prompts among those in prefill so that
short ones pass them. With ``auto_budget`` set, the autopilot (autopilot.py) picks the step's
prefill allowance within the budget left after the decodes.

Both: at most ``max_num_seqs`` running requests; new requests are admitted FCFS and not in a
step that preempted (vLLM V1); when a decode needs a block and none is free, the most recently
admitted running request is preempted by recompute (its blocks freed, requeued at the front).
Admission keeps a watermark of 1 % of the blocks free for running decodes (vLLM V0's default
``watermark=0.01``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .autopilot import Autopilot, Decision
from .vocab.config import SchedulerConfig
from .kv_cache import KVCacheManager, cdiv
from .request import PLACEHOLDER_TOKEN, Request, RequestStatus


def _quiet(kind: str, message: str) -> None:
    pass


def watermark_blocks(num_blocks: int) -> int:
    """KV blocks that admission keeps free for running decodes in a cache of ``num_blocks``:
    1 % (at least 1) from 100 blocks up, none below (vLLM V0's ``watermark=0.01``)."""
    return max(1, num_blocks // 100) if num_blocks >= 100 else 0


def usable_blocks(num_blocks: int) -> int:
    """The most KV blocks one request may need in a cache of ``num_blocks``: all but the
    admission watermark. ``LLMEngine.add_request`` refuses requests above it, and the engine's
    start-up check of ``max_model_len`` against the cache uses it too."""
    return num_blocks - watermark_blocks(num_blocks)


def reaches_length(req: Request, num_output: int, max_model_len: int) -> bool:
    """Whether ``num_output`` output tokens end ``req`` by length: its ``max_tokens``, or the
    context ``max_model_len`` filled (vLLM's finish reason "length")."""
    return num_output >= req.sampling.max_tokens or req.prompt_len + num_output >= max_model_len


def stop_reason(req: Request, num_output: int, token: int, eos_token_ids: tuple[int, ...],
                max_model_len: int) -> str:
    """Why ``req`` ends with ``token`` as its ``num_output``-th output: "length" (see
    ``reaches_length``), "stop" (an EOS id unless ``ignore_eos``, or one of its
    ``stop_token_ids``), or "" when it goes on. vLLM's order: length is checked first."""
    if reaches_length(req, num_output, max_model_len):
        return "length"
    sp = req.sampling
    if (not sp.ignore_eos and token in eos_token_ids) or token in sp.stop_token_ids:
        return "stop"
    return ""


@dataclass
class SchedulerOutput:
    """One step's work: ``decodes`` get one token each, ``prefills`` are ``(request, chunk)``
    pairs. Runner order is decodes first, then prefills."""

    decodes: list[Request] = field(default_factory=list)
    prefills: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_partial_prefills: int = 0
    config: SchedulerConfig | None = None
    # the autopilot's decision for this step (None: off, or not a chunked step)
    autopilot: Decision | None = None

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefills)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + self.num_prefill_tokens

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills


@dataclass
class Postprocessed:
    """What ``Scheduler.postprocess`` made of one step: ``tokens`` (request id, token id) in
    row order, ``first`` (request id, arrival ns, prompt length) for each first output token,
    and the requests it ``finished``."""

    tokens: list[tuple[str, int]] = field(default_factory=list)
    first: list[tuple[str, int, int]] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)


class Scheduler:
    """Holds the waiting queue and the running list; ``schedule()`` picks one step's batch.

    ``running`` is in admission order (the tail is preempted first). The engine calls
    ``schedule()``, runs the batch, then ``advance()`` and ``postprocess()`` (which appends the
    sampled tokens and ``finish``es requests); the engine changes the queues only through these
    methods, ``add`` and ``finish``.
    """

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.watermark_blocks = watermark_blocks(kv.num_blocks)
        self.autopilot: Autopilot | None = None  # built when config.auto_budget is set
        self.notify: Callable[[str, str], None] = _quiet  # the autopilot's status (host sets it)

    # -- queue management --------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def unschedule(self, req: Request) -> None:
        """Drop ``req`` from whichever queue holds it (if any); its blocks stay."""
        if req in self.running:
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass

    def remove(self, req: Request) -> None:
        """Drop ``req`` from whichever queue holds it and free its blocks."""
        self.unschedule(req)
        self.kv.free(req)

    def finish(self, req: Request, reason: str, in_flight_step: int = -1,
               hold: list[Request] | None = None) -> None:
        """End ``req`` with finish reason ``reason`` ("stop", "length", "abort"): out of the
        queues, its blocks freed, its trailing placeholder tokens (outputs not seen yet)
        dropped. Async scheduling: if ``req`` is in step ``in_flight_step`` (launched, not
        completed: ``req.last_step``), that step still writes its KV, so ``req`` is appended to
        ``hold`` instead, for the caller to free when the step completes."""
        self.unschedule(req)
        if hold is not None and req.last_step == in_flight_step:
            hold.append(req)
        else:
            self.kv.free(req)
        ids = req.output_token_ids
        while ids and ids[-1] == PLACEHOLDER_TOKEN:
            ids.pop()
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason

    # -- after a step runs (nano-vllm's Scheduler.postprocess) --------------------------------
    def advance(self, out: SchedulerOutput, step_id: int, t_ns: int) -> None:
        """Book ``out`` as computed once the runner has its inputs (sync: executed; async:
        launched, as vLLM books at schedule time): each request's ``num_computed_tokens``
        grows by its tokens, ``last_step`` = ``step_id``, and a first prefill stamps
        ``first_scheduled_ns`` = ``t_ns`` (monotonic ns, when the step was scheduled)."""
        for r in out.decodes:
            r.num_computed_tokens += 1
            r.last_step = step_id
        for r, n in out.prefills:
            if not r.first_scheduled_ns:
                r.first_scheduled_ns = t_ns
            r.num_computed_tokens += n
            r.last_step = step_id

    def reserve_outputs(self, reqs: list[Request], max_model_len: int) -> list[int]:
        """Async scheduling: give each request sampling in a launched step a placeholder
        output (``PLACEHOLDER_TOKEN``); returns their indices in ``output_token_ids``. One that
        surely ends by length with it leaves the running list, so it is not scheduled again;
        ``postprocess`` finishes it when the step completes."""
        slots: list[int] = []
        for r in reqs:
            ids = r.output_token_ids
            ids.append(PLACEHOLDER_TOKEN)
            slots.append(len(ids) - 1)
            if reaches_length(r, len(ids), max_model_len):
                self.unschedule(r)
        return slots

    def postprocess(self, sampled: list[tuple[Request, int]], now_ns: int,
                    eos_token_ids: tuple[int, ...], max_model_len: int,
                    slots: list[int] | None = None, in_flight_step: int = -1,
                    hold: list[Request] | None = None) -> "Postprocessed":
        """Take one completed step's sampled tokens ``(request, token id)``: append each (or,
        with ``slots`` from ``reserve_outputs``, put it in place of its placeholder), time it
        ``now_ns``, check ``stop_reason`` and ``finish`` those that end (``in_flight_step`` and
        ``hold``: see ``finish``). Rows of requests already finished (stopped a step before,
        or aborted, while this step ran) are discarded."""
        res = Postprocessed()
        for i, (r, tok) in enumerate(sampled):
            if r.status is RequestStatus.FINISHED:
                continue
            ids = r.output_token_ids
            if slots is None:
                slot = len(ids)
                ids.append(tok)
            else:
                slot = slots[i]
                ids[slot] = tok
            if slot == 0:
                res.first.append((r.request_id, r.arrival_ns, r.prompt_len))
            r.token_times_ns.append(now_ns)
            res.tokens.append((r.request_id, tok))
            reason = stop_reason(r, slot + 1, tok, eos_token_ids, max_model_len)
            if reason:
                self.finish(r, reason, in_flight_step, hold)
                res.finished.append(r)
        return res

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- the autopilot (engine_host/autopilot.py) -------------------------------------------
    def _autopilot(self, cfg: SchedulerConfig) -> Autopilot | None:
        """The controller for ``cfg.auto_budget`` (None when off). Turning it off and on, or
        new targets, keep its fitted model: the step time does not depend on them."""
        ap = self.autopilot
        if not cfg.auto_budget:
            return None
        if ap is None:
            ap = self.autopilot = Autopilot(cfg.auto_budget_spec,
                                            notify=lambda k, m: self.notify(k, m))
        elif ap.canonical != cfg.auto_budget:
            ap.set_spec(cfg.auto_budget_spec)
        return ap

    def observe(self, out: SchedulerOutput, wall_ms: float, itl_ms: float = -1.0) -> None:
        """Tell the autopilot how one executed step went: its measured time ``wall_ms`` and
        the gap ``itl_ms`` its decode rows saw since their previous token (ms; -1: none)."""
        if out.autopilot is not None and self.autopilot is not None:
            self.autopilot.observe(out.autopilot, wall_ms, itl_ms, len(out.decodes))

    def preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Preempt ``victim`` by recompute (vLLM's ``PreemptionMode.RECOMPUTE``): its blocks
        freed, its computed tokens dropped, requeued at the front of the waiting queue, and
        noted in ``out.preempted``. Its output tokens so far stay: re-admitted, it recomputes
        prompt + outputs before sampling again."""
        self.running.remove(victim)
        self.kv.free(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        self.waiting.appendleft(victim)
        out.preempted.append(victim)

    def _admit(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Move the head of the queue to running with a first chunk of ``n`` tokens, if its
        blocks fit above the watermark. Returns False (and changes nothing) if they don't."""
        if cdiv(n, self.kv.block_size) > self.kv.pool.num_free - self.watermark_blocks:
            return False
        self.waiting.popleft()
        req.prefill_target = req.num_tokens
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        self.kv.grow(req, n)
        out.prefills.append((req, n))
        return True

    # -- the step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        out = SchedulerOutput(config=cfg)
        policy = self._schedule_continuous if cfg.mode == "continuous" else self._schedule_chunked
        policy(out)
        # Running requests all mid-prefill with no block free: nothing could move. Preempt
        # from the tail until something fits (only happens when the pool is nearly full).
        while out.is_empty and len(self.running) > 1:
            self.preempt(self.running[-1], out)
            policy(out)
        return out

    def may_preempt(self) -> bool:
        """Whether ``schedule()`` now could preempt (conservative: never a false "no"); async
        scheduling asks before scheduling a step while another is in flight.

        Preemption happens only (a) in ``_schedule_decodes``, when a decode needs a new block
        and none is free — decodes are scheduled before any block is taken in a step (chunked:
        first; continuous: only in a step without prefills) — or (b) in ``schedule``'s
        fallback, when nothing at all could be scheduled with more than one request running,
        which needs every running request to be mid-prefill and stuck."""
        kv = self.kv
        bs = kv.block_size
        need = 0
        any_decode = False
        first_prefill = None
        for r in self.running:
            if r.is_prefill:
                if first_prefill is None:
                    first_prefill = r
                continue
            any_decode = True
            if r.num_computed_tokens >= len(r.block_ids) * bs:  # _schedule_decodes' slow path
                need += 1
        free = kv.pool.num_free
        if any_decode:
            return need > free
        if len(self.running) <= 1:
            return False
        if self.config.mode == "chunked":
            return free == 0
        return not kv.can_grow(first_prefill, first_prefill.remaining_prefill)

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> int:
        """Give every running decode one token, in admission order, while the budget lasts;
        preempt from the tail when a decode needs a block. Returns the budget left."""
        i = 0
        bs = self.kv.block_size
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.is_prefill:
                i += 1
                continue
            if req.num_computed_tokens < len(req.block_ids) * bs:
                # fast path (15 steps in 16 at block size 16): its last block has room
                out.decodes.append(req)
                budget -= 1
                i += 1
                continue
            while not self.kv.can_grow(req, 1):
                victim = self.running[-1]
                self.preempt(victim, out)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break  # preempted itself: everyone after it is gone too
            self.kv.grow(req, 1)
            out.decodes.append(req)
            budget -= 1
            i += 1
        return budget

    def _schedule_chunked(self, out: SchedulerOutput) -> None:
        cfg = self.config
        budget = self._schedule_decodes(out, cfg.max_num_batched_tokens)
        ap = self._autopilot(cfg) if cfg.auto_budget else None
        if ap is not None:
            decision = ap.choose(self, out, budget)
            budget = decision.allowance
        limit = cfg.chunk_limit
        partial = 0
        # the long-prompt lane (vLLM V0's PartialPrefillMetadata): with more than one partial
        # prefill allowed, at most max_long_partial_prefills of the prompts in prefill may be
        # long (remaining > long_prefill_token_threshold); a long one past that waits in its
        # place while shorter ones behind it are admitted
        thr = cfg.long_prefill_token_threshold
        lane = cfg.max_num_partial_prefills > 1 and thr > 0
        long_n = 0
        # continuing chunks, in admission order
        for req in self.running:
            if not req.is_prefill:
                continue
            if lane and req.remaining_prefill > thr:
                long_n += 1
            n = min(req.remaining_prefill, budget, limit, self.kv.tokens_that_fit(req))
            if n > 0:
                self.kv.grow(req, n)
                out.prefills.append((req, n))
                budget -= n
            if n < req.remaining_prefill:
                partial += 1
        # new prefills, FCFS, not in a step that preempted
        passed: list[Request] = []  # long prompts the lane holds back, in queue order
        while (self.waiting and budget > 0 and not out.preempted
               and len(self.running) < cfg.max_num_seqs):
            req = self.waiting[0]
            remaining = req.num_tokens
            is_long = lane and remaining > thr
            if is_long and long_n >= cfg.max_long_partial_prefills:
                passed.append(self.waiting.popleft())
                continue
            n = min(remaining, budget, limit)
            if n < remaining and partial >= cfg.max_num_partial_prefills:
                break
            if not self._admit(req, n, out):
                break
            budget -= n
            if n < remaining:
                partial += 1
            if is_long:
                long_n += 1
        if passed:
            self.waiting.extendleft(reversed(passed))
        out.num_partial_prefills = partial
        if ap is not None:
            out.autopilot = ap.finish(out, decision)

    def _schedule_continuous(self, out: SchedulerOutput) -> None:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        used = 0
        # running requests left mid-prefill (by chunked mode) finish their prompt whole
        for req in self.running:
            if not req.is_prefill:
                continue
            n = req.remaining_prefill
            if (out.prefills and used + n > budget) or not self.kv.can_grow(req, n):
                break
            self.kv.grow(req, n)
            out.prefills.append((req, n))
            used += n
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            n = req.num_tokens
            if out.prefills and used + n > budget:
                break
            if not self._admit(req, n, out):
                break
            used += n
        if not out.prefills:
            self._schedule_decodes(out, budget)
        out.num_partial_prefills = sum(1 for r in self.running if r.is_prefill) - len(out.prefills)
