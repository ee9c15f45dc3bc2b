"""gpuchef's scheduler classes for vLLM 0.24 (passed as ``SchedulerConfig.scheduler_cls``).

Imports vLLM: only ``vllm_engine.py`` imports this module, lazily. The classes live at module
level so that a ``VllmConfig`` naming them pickles into vLLM's tensor-parallel worker processes.

``GpuchefScheduler`` (sync) and ``GpuchefAsyncScheduler`` (async scheduling, vLLM 0.24's default
for a single process) add three things to vLLM's own scheduler, all decided by the pure functions
of ``vllm_mapping.py``:

* **Live knobs**, written each step into the attributes ``Scheduler.schedule`` reads each step
  (vllm/v1/core/sched/scheduler.py): ``max_num_scheduled_tokens`` (the token budget, copied from
  ``max_num_batched_tokens`` once in ``__init__``), ``max_num_running_reqs`` (copied from
  ``max_num_seqs`` in ``__init__``) and ``scheduler_config.long_prefill_token_threshold`` (read
  from the config in both loops). ``max_num_running_reqs`` is written as at least the current
  running count: vLLM's admission test is ``len(self.running) == self.max_num_running_reqs``
  and ``schedule`` asserts ``len(self.running) <= self.max_num_running_reqs``, so a cap lowered
  below the running count must let the running set drain instead.
* **Mode ``continuous``** (prefill-first): ``plan_continuous`` decides the step; vLLM's own
  ``schedule()`` then runs it with the requests the plan leaves out hidden from ``self.running``,
  new admissions stopped (``PauseState.PAUSED_NEW``) in a decode step, chunking off
  (``scheduler_config.enable_chunked_prefill``, read per step) and the budget set to the planned
  prefill total in a prefill step. Everything is put back before ``schedule`` returns.
* **``max_num_partial_prefills``** in chunked mode: ``chunked_admission_limit`` lowers
  ``max_num_running_reqs`` for the step so that vLLM admits no more prompts than the cap allows.

With the default knobs in chunked mode (no ``long_prefill_token_threshold``) ``schedule`` is
vLLM's own, untouched. Every step's SchedulerOutput and every ``update_from_output`` go to
``gc_observer`` (the VllmEngine), which builds the StepRecords.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from .vocab.config import SchedulerConfig
from .kv_cache import cdiv
from .vllm_mapping import (QueuedRequest, chunked_admission_limit, plan_continuous)


class _GpuchefMixin:
    """Shared by both classes; must come before vLLM's class in the bases."""

    # Set by VllmEngine after EngineCore built the scheduler; until then schedule() is vLLM's.
    gc_knobs: SchedulerConfig | None = None
    gc_observer: Any = None
    gc_ceiling_tokens: int = 0
    gc_prefill_blocked: bool = False

    # -- knobs -------------------------------------------------------------------------------
    def gc_set_knobs(self, knobs: SchedulerConfig) -> None:
        """Put ``knobs`` in force from the next ``schedule`` on (validated by the caller)."""
        self.gc_knobs = knobs
        self.gc_prefill_blocked = False
        self._gc_write_knobs(knobs)

    def _gc_write_knobs(self, knobs: SchedulerConfig) -> None:
        self.max_num_scheduled_tokens = knobs.max_num_batched_tokens
        self.max_num_running_reqs = max(knobs.max_num_seqs, len(self.running))
        self.scheduler_config.long_prefill_token_threshold = knobs.long_prefill_token_threshold

    def _gc_waiting(self):
        # FCFS order of Scheduler._select_waiting_queue_for_scheduling: skipped ones first.
        return itertools.chain(self.skipped_waiting, self.waiting)

    # -- the step ----------------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any):
        knobs = self.gc_knobs
        if knobs is None:
            return super().schedule(*args, **kwargs)
        t0 = time.monotonic_ns()
        self._gc_write_knobs(knobs)
        if knobs.mode == "continuous":
            out = self._gc_schedule_continuous(knobs, args, kwargs)
        elif knobs.long_prefill_token_threshold > 0 and (self.waiting or self.skipped_waiting):
            out = self._gc_schedule_capped(knobs, args, kwargs)
        else:
            out = super().schedule(*args, **kwargs)
        obs = self.gc_observer
        if obs is not None:
            obs.on_scheduled(self, out, t0, knobs)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        t0 = time.monotonic_ns()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        obs = self.gc_observer
        if obs is not None:
            obs.on_updated(self, scheduler_output, outputs, t0)
        return outputs

    def _gc_schedule_capped(self, knobs: SchedulerConfig, args, kwargs):
        running = self.running
        prefilling = [r.num_tokens - r.num_computed_tokens for r in running if r.is_prefill_chunk]
        limit = chunked_admission_limit(
            prefilling, len(running) - len(prefilling),
            (w.num_tokens - w.num_computed_tokens for w in self._gc_waiting()),
            budget=knobs.max_num_batched_tokens,
            threshold=knobs.long_prefill_token_threshold,
            max_num_partial_prefills=knobs.max_num_partial_prefills,
            num_running=len(running), max_num_seqs=knobs.max_num_seqs)
        if limit is not None:
            self.max_num_running_reqs = min(self.max_num_running_reqs, len(running) + limit)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_running_reqs = max(knobs.max_num_seqs, len(self.running))

    def _gc_schedule_continuous(self, knobs: SchedulerConfig, args, kwargs):
        running = self.running
        bs = self.block_size
        prefilling = [r for r in running if r.is_prefill_chunk]
        views = [QueuedRequest(r.request_id, r.num_tokens - r.num_computed_tokens,
                               cdiv(r.num_tokens, bs) - cdiv(r.num_computed_tokens, bs))
                 for r in prefilling]
        waiting = (QueuedRequest(w.request_id, w.num_tokens - w.num_computed_tokens,
                                 cdiv(w.num_tokens, bs)) for w in self._gc_waiting())
        kvm = self.kv_cache_manager
        plan = plan_continuous(
            views, len(running), waiting, budget=knobs.max_num_batched_tokens,
            ceiling=self.gc_ceiling_tokens or knobs.max_num_batched_tokens,
            max_num_seqs=knobs.max_num_seqs,
            free_blocks=kvm.block_pool.get_num_free_blocks(),
            watermark_blocks=getattr(kvm, "watermark_blocks", 0),
            prefill_blocked=self.gc_prefill_blocked)
        if plan.kind == "prefill":
            keep = set(plan.running_ids)
            visible = [r for r in prefilling if r.request_id in keep]
            out = self._gc_run(visible, knobs, args, kwargs, budget=plan.token_budget,
                               cap=len(visible) + plan.num_admit, chunk=plan.allow_split,
                               pause_new=False)
            self.gc_prefill_blocked = out.total_num_scheduled_tokens == 0
            return out
        decodes = [r for r in running if not r.is_prefill_chunk]
        if not decodes and prefilling and self.gc_prefill_blocked:
            # Every running request is mid-prefill and the blocks are gone: only vLLM's own
            # preemption can free some (gpuchef's native scheduler does the same).
            return super().schedule(*args, **kwargs)
        return self._gc_run(decodes, knobs, args, kwargs, budget=knobs.max_num_batched_tokens,
                            cap=max(knobs.max_num_seqs, len(running)), chunk=True,
                            pause_new=True)

    def _gc_run(self, visible: list, knobs: SchedulerConfig, args, kwargs, *, budget: int,
                cap: int, chunk: bool, pause_new: bool):
        """vLLM's ``schedule()`` with only ``visible`` running requests in view, then the
        running list put back together in its order (preempted ones out, new ones at the end)."""
        original = self.running
        cfg = self.scheduler_config
        saved_chunk = cfg.enable_chunked_prefill
        saved_pause = self._pause_state
        self.running = list(visible)  # vLLM appends to it; ``visible`` stays as it was
        self.max_num_scheduled_tokens = budget
        self.max_num_running_reqs = cap
        cfg.enable_chunked_prefill = chunk
        if not pause_new:
            cfg.long_prefill_token_threshold = 0  # whole prompts: no per-request chunk cap
        elif saved_pause == PauseState.UNPAUSED:
            self._pause_state = PauseState.PAUSED_NEW
        try:
            return super().schedule(*args, **kwargs)
        finally:
            after = self.running
            kept = sum(1 for r in visible if r.status == RequestStatus.RUNNING)
            merged = [r for r in original if r.status == RequestStatus.RUNNING]
            merged.extend(after[kept:])  # vLLM appends the requests it admitted
            self.running = merged
            cfg.enable_chunked_prefill = saved_chunk
            self._pause_state = saved_pause
            self._gc_write_knobs(knobs)


class GpuchefScheduler(_GpuchefMixin, Scheduler):
    """vLLM's ``Scheduler`` with gpuchef's knobs, modes and step observer (see module doc)."""


class GpuchefAsyncScheduler(_GpuchefMixin, AsyncScheduler):
    """vLLM's ``AsyncScheduler`` (async scheduling) with gpuchef's knobs, modes and observer."""
