"""vLLM's scheduler, seen from gpuchef: pure functions, no vLLM import.

Three jobs, kept free of vLLM's classes so that CPU tests can feed hand-built inputs (plain values
and duck-typed objects); ``vllm_scheduler.py`` is the thin glue that feeds them from vLLM 0.24.

1. **A StepRecord from a SchedulerOutput** (vllm/v1/core/sched/output.py). vLLM has no prefill or
   decode phase: each step gives a request ``n`` tokens so that its ``num_computed_tokens`` catches
   up with its token count (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``, the note at its
   top). gpuchef splits those tokens the way its native engine does (request.py
   ``prefill_target``): positions below the request's *prefill target* are prefill — the prompt for
   a new request, prompt + outputs so far for one resumed after a preemption (vLLM recomputes them:
   ``Scheduler._preempt_request`` sets ``num_computed_tokens = 0``) — and the rest are decode.
   The SchedulerOutput carries each scheduled request's ``num_computed_tokens`` *before* the step
   (``NewRequestData.from_request`` and ``Scheduler._make_cached_request_data`` read it before
   ``_update_after_schedule`` advances it), so the split needs nothing read after the fact.
2. **The continuous (prefill-first) policy** that vLLM V1 no longer has: vLLM V0's
   ``_schedule_default`` — admit whole prompts FCFS while the token budget and KV blocks allow; a
   step that prefills carries no decodes; otherwise a decode step. ``plan_continuous`` decides; the
   glue makes vLLM's own ``schedule()`` carry it out (it hides the requests the plan leaves out).
3. **``max_num_partial_prefills``**, which V1 rejects (vllm/engine/arg_utils.py
   ``_check_feature_supported``): ``chunked_admission_limit`` caps the new prompts vLLM may admit
   in a step so that at most that many prompts are left mid-prefill (vLLM V0's meaning).

Plus a request's sampling parameters as vLLM's ``SamplingParams`` takes them
(``vllm_sampling_kwargs``), and the live-knob limits: vLLM sizes its model runner's persistent
buffers and CUDA graphs for the start-up ``max_num_batched_tokens`` and ``max_num_seqs``
(vllm/v1/worker/gpu/model_runner.py ``GPUModelRunner.__init__``: ``max_num_tokens``,
``max_num_reqs``), so those two may move live only within ``[1, start-up value]``;
``check_live_knobs`` refuses the rest with a message that says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .vocab.errors import ConfigError
from .vocab.config import SchedulerConfig
from .vocab.records import StepRecord
from .request import SamplingParams


# ------------------------------------------------------------------------------ the step record


@dataclass(frozen=True, slots=True)
class StepSplit:
    """One step's scheduled tokens, split (tokens and requests).

    ``num_partial_prefills``: scheduled requests still mid-prefill after this step.
    ``num_preempted``: requests vLLM preempted while scheduling this step.
    ``total_tokens``: ``SchedulerOutput.total_num_scheduled_tokens``.
    """

    num_prefill_reqs: int
    num_prefill_tokens: int
    num_decode_reqs: int
    num_decode_tokens: int
    num_partial_prefills: int
    num_preempted: int
    total_tokens: int


def split_scheduler_output(so: Any, prompt_lens: Mapping[str, int],
                           prefill_targets: MutableMapping[str, int]) -> StepSplit:
    """Split one SchedulerOutput's tokens into prefill and decode.

    ``so`` needs (duck-typed, as vLLM 0.24's ``SchedulerOutput``): ``num_scheduled_tokens``
    (dict req_id → tokens this step), ``total_num_scheduled_tokens``, ``preempted_req_ids`` (set
    or None), ``scheduled_new_reqs`` (objects with ``req_id``, ``num_computed_tokens``,
    ``prompt_token_ids`` and optionally ``prefill_token_ids``) and ``scheduled_cached_reqs`` (with
    the parallel lists ``req_ids``, ``num_computed_tokens``, ``num_output_tokens`` and the set
    ``resumed_req_ids``). Token counts are tokens; ``num_computed_tokens`` is before the step.

    ``prompt_lens``: prompt length of every request (tokens). ``prefill_targets`` (updated in
    place): per request, the token count to compute before its next sample. It is set here for a
    request scheduled for the first time — its ``prefill_token_ids`` (vLLM's V2 model runner puts
    prompt + outputs there, resumed requests included: ``Scheduler.schedule``,
    ``use_v2_model_runner``) or else its prompt — and for a request resumed after a preemption
    under the V1 model runner (in ``resumed_req_ids``: prompt + its outputs so far). A cached
    request with no entry falls back to its prompt length. The caller drops finished requests.

    Rule: of the ``n`` tokens at positions ``[c, c + n)``, those below the target are prefill,
    the rest decode (one token a step without speculative decoding). A request with any prefill
    token counts as a prefill request, one with any decode token as a decode request.
    """
    nst = so.num_scheduled_tokens
    pf_reqs = pf_tok = dc_reqs = dc_tok = partial = 0

    def add(rid: str, computed: int, target: int) -> None:
        nonlocal pf_reqs, pf_tok, dc_reqs, dc_tok, partial
        n = nst.get(rid, 0)
        if n <= 0:
            return
        p = target - computed
        if p > 0:
            if p > n:
                p = n
                partial += 1
            pf_reqs += 1
            pf_tok += p
            n -= p
        if n > 0:
            dc_reqs += 1
            dc_tok += n

    for nr in so.scheduled_new_reqs:
        rid = nr.req_id
        ids = getattr(nr, "prefill_token_ids", None)
        if ids is None:
            ids = nr.prompt_token_ids
        target = len(ids) if ids is not None else prompt_lens.get(rid, 0)
        prefill_targets[rid] = target
        add(rid, nr.num_computed_tokens, target)
    cached = so.scheduled_cached_reqs
    resumed = cached.resumed_req_ids or ()
    for rid, computed, n_out in zip(cached.req_ids, cached.num_computed_tokens,
                                    cached.num_output_tokens):
        if rid in resumed:
            target = prompt_lens.get(rid, 0) + n_out
            prefill_targets[rid] = target
        else:
            target = prefill_targets.get(rid)
            if target is None:
                target = prompt_lens.get(rid, 0)
        add(rid, computed, target)
    preempted = getattr(so, "preempted_req_ids", None)
    return StepSplit(pf_reqs, pf_tok, dc_reqs, dc_tok, partial,
                     len(preempted) if preempted else 0, so.total_num_scheduled_tokens)


def record_from_split(split: StepSplit, *, step: int, t_start_ns: int, t_end_ns: int,
                      gpu_ms: float, config: SchedulerConfig, num_running: int,
                      num_waiting: int, kv_blocks_used: int, kv_blocks_total: int,
                      num_finished: int = 0, num_partial_prefills: int | None = None,
                      cuda_graph: bool = False) -> StepRecord:
    """The StepRecord of a split step. ``num_partial_prefills`` None = the split's own count
    (scheduled requests left mid-prefill); the glue passes vLLM's count of every running request
    mid-prefill, scheduled or not. ``num_decode_reqs`` is the decode token count (one a
    decoding request)."""
    return StepRecord(
        step=step, t_start_ns=t_start_ns, t_end_ns=t_end_ns, gpu_ms=gpu_ms, mode=config.mode,
        max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        max_num_partial_prefills=config.max_num_partial_prefills,
        num_prefill_reqs=split.num_prefill_reqs, num_prefill_tokens=split.num_prefill_tokens,
        num_decode_reqs=split.num_decode_tokens,
        num_partial_prefills=(split.num_partial_prefills if num_partial_prefills is None
                              else num_partial_prefills),
        num_running=num_running, num_waiting=num_waiting, num_preempted=split.num_preempted,
        kv_blocks_used=kv_blocks_used, kv_blocks_total=kv_blocks_total,
        num_finished=num_finished, cuda_graph=cuda_graph)


def step_record_from_scheduler_output(
        so: Any, *, prompt_lens: Mapping[str, int], prefill_targets: MutableMapping[str, int],
        step: int, t_start_ns: int, t_end_ns: int, gpu_ms: float, config: SchedulerConfig,
        num_running: int, num_waiting: int, kv_blocks_used: int, kv_blocks_total: int,
        num_finished: int = 0, num_partial_prefills: int | None = None,
        cuda_graph: bool = False) -> StepRecord | None:
    """One StepRecord from one vLLM SchedulerOutput, or None for an empty step (no tokens).

    See ``split_scheduler_output`` for what ``so``, ``prompt_lens`` and ``prefill_targets`` are
    (``prefill_targets`` is updated in place). Times: monotonic ns; ``gpu_ms`` in ms. Queue sizes
    and KV blocks are the caller's, taken after the step (``records.StepRecord``).
    """
    if not so.total_num_scheduled_tokens:
        return None
    split = split_scheduler_output(so, prompt_lens, prefill_targets)
    return record_from_split(
        split, step=step, t_start_ns=t_start_ns, t_end_ns=t_end_ns, gpu_ms=gpu_ms,
        config=config, num_running=num_running, num_waiting=num_waiting,
        kv_blocks_used=kv_blocks_used, kv_blocks_total=kv_blocks_total,
        num_finished=num_finished, num_partial_prefills=num_partial_prefills,
        cuda_graph=cuda_graph)


# ------------------------------------------------------------------------------ policies


class QueuedRequest(NamedTuple):
    """A request as the policies see it.

    ``num_new_tokens``: tokens it needs computed before its next sample (a waiting request: all
    of prompt + outputs not yet computed; a running one mid-prefill: the rest of its prompt).
    ``num_blocks``: KV blocks it needs on top of what it holds to run them all (blocks).
    """

    request_id: str
    num_new_tokens: int
    num_blocks: int


@dataclass(frozen=True, slots=True)
class ContinuousPlan:
    """What one prefill-first step does.

    ``kind``: "prefill" (``running_ids`` are the running requests mid-prefill that get their
    whole remainder; ``num_admit`` waiting requests are admitted whole, FCFS) or "decode" (every
    running decode, one token each; nothing admitted). ``token_budget``: the budget vLLM gets for
    the step (tokens: the planned prefill total, or the knob for a decode step). ``allow_split``:
    the step's single prefill is longer than vLLM's start-up budget and must be chunked.
    """

    kind: str
    running_ids: tuple[str, ...]
    num_admit: int
    token_budget: int
    allow_split: bool = False


def plan_continuous(prefilling: Sequence[QueuedRequest], num_running: int,
                    waiting: Iterable[QueuedRequest], *, budget: int, ceiling: int,
                    max_num_seqs: int, free_blocks: int, watermark_blocks: int = 0,
                    prefill_blocked: bool = False) -> ContinuousPlan:
    """Classic continuous batching for one step (vLLM V0 ``_schedule_default``: "First, it
    batches as many prefill requests as possible. And it schedules decodes." and "Don't schedule
    decodes if prefills are scheduled.").

    ``prefilling``: running requests left mid-prefill (by chunked mode, or a preemption), in
    running order; ``num_running``: all running requests; ``waiting``: waiting requests FCFS
    (consumed lazily, only as far as needed). ``budget``: the live ``max_num_batched_tokens``;
    ``ceiling``: vLLM's start-up value, the most one step can hold. ``free_blocks``: free KV
    blocks; ``watermark_blocks``: blocks admission must leave free (vLLM applies its watermark to
    waiting requests only). ``prefill_blocked``: the last planned prefill step got nothing from
    vLLM (its own block check said no), so decode until a request finishes.

    Prefill first: running requests mid-prefill take their whole remainder, in order, then
    waiting requests are admitted whole, FCFS, each while the prefill total stays within
    ``budget`` (the step's first prefill may exceed it and then runs alone, as gpuchef's native
    scheduler does), the blocks fit and ``max_num_seqs`` allows; each list stops at its first
    request that does not fit. A first prefill longer than ``ceiling`` runs alone in
    ``ceiling``-sized chunks (vLLM cannot run more tokens in one step). If nothing can prefill,
    a decode step. Token counts in tokens, blocks in KV blocks.
    """
    if not prefill_blocked:
        chosen: list[str] = []
        used = blocks = 0
        for r in prefilling:
            n = r.num_new_tokens
            if chosen and used + n > budget:
                break
            if blocks + r.num_blocks > free_blocks:
                break
            if n > ceiling:  # only as the step's first prefill (else the budget check broke)
                return ContinuousPlan("prefill", (r.request_id,), 0, ceiling, True)
            chosen.append(r.request_id)
            used += n
            blocks += r.num_blocks
        admit = 0
        for w in waiting:
            if num_running + admit >= max_num_seqs:
                break
            n = w.num_new_tokens
            first = not chosen and not admit
            if not first and used + n > budget:
                break
            if blocks + w.num_blocks > free_blocks - watermark_blocks:
                break
            if n > ceiling:
                if first:
                    return ContinuousPlan("prefill", (), 1, ceiling, True)
                break
            admit += 1
            used += n
            blocks += w.num_blocks
        if chosen or admit:
            return ContinuousPlan("prefill", tuple(chosen), admit, used)
    return ContinuousPlan("decode", (), 0, budget)


def chunked_admission_limit(prefilling_remaining: Sequence[int], num_decodes: int,
                            waiting_remaining: Iterable[int], *, budget: int, threshold: int,
                            max_num_partial_prefills: int, num_running: int,
                            max_num_seqs: int) -> int | None:
    """How many waiting requests chunked prefill may admit this step so that at most
    ``max_num_partial_prefills`` prompts are left mid-prefill after it (vLLM V0's meaning of
    ``--max-num-partial-prefills``; V1 rejects the flag). None = no limit needed.

    Simulates vLLM V1's step (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``): running
    requests first — ``num_decodes`` decodes of one token each, then each running request still
    mid-prefill (``prefilling_remaining``, tokens left, in running order) gets
    ``min(left, threshold, budget left)`` — then waiting requests (``waiting_remaining``, tokens
    each, FCFS, consumed lazily) while budget and ``max_num_seqs`` last; a waiting request whose
    chunk would leave it mid-prefill is admitted only while fewer than the cap are. ``threshold``
    is ``long_prefill_token_threshold`` (0 = the budget). With threshold 0 at most one prompt is
    ever left mid-prefill (the budget is spent when a prompt is cut), so the cap (≥ 1) never
    binds and the answer is None: vLLM's own scheduler runs untouched.
    """
    if threshold <= 0 or max_num_partial_prefills < 1:
        return None
    left = budget - min(num_decodes, budget)
    partial = 0
    for rem in prefilling_remaining:
        n = min(rem, threshold, left)
        left -= n
        if n < rem:
            partial += 1
    admit = 0
    for rem in waiting_remaining:
        if left <= 0 or num_running + admit >= max_num_seqs:
            break
        n = min(rem, threshold, left)
        if n < rem:
            if partial >= max_num_partial_prefills:
                break
            partial += 1
        admit += 1
        left -= n
    return admit


# ------------------------------------------------------------------------------ sampling


def vllm_sampling_kwargs(s: SamplingParams) -> dict[str, Any]:
    """``s`` as keyword arguments of vLLM 0.24's ``vllm.sampling_params.SamplingParams``: one
    sequence, no detokenisation (gpuchef's front door detokenises), every field gpuchef's
    SamplingParams has under vLLM's name and convention (``top_k`` 0 = off in both).
    ``min_tokens`` masks the EOS ids and ``stop_token_ids`` in vLLM too once the engine adds
    the model's EOS ids (``update_from_generation_config``, as vLLM's InputProcessor does)."""
    return dict(n=1, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, seed=s.seed,
                max_tokens=s.max_tokens, min_tokens=s.min_tokens, ignore_eos=s.ignore_eos,
                stop_token_ids=list(s.stop_token_ids) or None, detokenize=False)


# ------------------------------------------------------------------------------ knob limits


def check_native_only(cfg: SchedulerConfig) -> None:
    """Refuse the settings only gpuchef's own scheduler has: the autopilot (``auto_budget``)
    and the long-prompt lane (``max_long_partial_prefills`` > 1; vLLM V1 has no lane).
    Raises ConfigError naming the setting."""
    if cfg.auto_budget:
        raise ConfigError(f"auto_budget={cfg.auto_budget} needs --engine native: the autopilot "
                          "steers gpuchef's own scheduler")
    if cfg.max_long_partial_prefills != 1:
        raise ConfigError(f"max_long_partial_prefills={cfg.max_long_partial_prefills} needs "
                          "--engine native: vLLM V1 has no long-prompt lane (allowed: 1)")


def check_startup_knobs(cfg: SchedulerConfig) -> None:
    """Refuse start-up knobs vLLM 0.24 refuses (vllm/config/scheduler.py
    ``SchedulerConfig.verify_max_model_len``: the budget must hold one token per running
    request) and those only the native engine has (``check_native_only``). Raises ConfigError
    naming both values."""
    check_native_only(cfg)
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise ConfigError(
            f"--max-num-batched-tokens {cfg.max_num_batched_tokens} must be >= --max-num-seqs "
            f"{cfg.max_num_seqs} for vLLM (one token per running request); raise the budget or "
            "lower --max-num-seqs")


def check_live_knobs(cfg: SchedulerConfig, *, max_num_batched_tokens: int,
                     max_num_seqs: int) -> None:
    """Refuse a live change vLLM cannot take. ``max_num_batched_tokens``/``max_num_seqs``: the
    start-up values, which sized vLLM's model-runner buffers and CUDA graphs (vllm/v1/worker/gpu/
    model_runner.py ``GPUModelRunner.__init__``), so live values may only be at most those.
    Raises ConfigError saying so; ``long_prefill_token_threshold``,
    ``max_num_partial_prefills`` and the mode are always live."""
    check_native_only(cfg)
    if cfg.max_num_batched_tokens > max_num_batched_tokens:
        raise ConfigError(
            f"max_num_batched_tokens={cfg.max_num_batched_tokens} cannot be set live on vLLM: it "
            f"sized its buffers and CUDA graphs for {max_num_batched_tokens} at start-up, so the "
            f"live range is [1, {max_num_batched_tokens}] (restart with "
            f"--max-num-batched-tokens {cfg.max_num_batched_tokens})")
    if cfg.max_num_seqs > max_num_seqs:
        raise ConfigError(
            f"max_num_seqs={cfg.max_num_seqs} cannot be set live on vLLM: it sized its request "
            f"slots for {max_num_seqs} at start-up, so the live range is [1, {max_num_seqs}] "
            f"(restart with --max-num-seqs {cfg.max_num_seqs})")
