"""VllmEngine: vLLM 0.24's V1 engine core hosted in this process, behind LLMEngine's surface.

``EngineHost`` drives it exactly like the native engine: ``add_request`` / ``step`` / ``abort`` /
``has_unfinished`` / ``set_scheduler_config``, with the same attributes (``device``, ``dtype``,
``attn.name``, ``loaded``, ``model_config.vocab_size``, ``max_model_len``, ``num_blocks``,
``kv.block_size``, ``step_id``, ``requests``, ``config``).

* **In-process engine core**: vLLM's own ``EngineCore`` (vllm/v1/engine/core.py), built the way
  ``InprocClient`` builds it (vllm/v1/engine/core_client.py) and stepped the way it does:
  ``step_fn()`` then ``post_step()``. ``step_fn`` is ``EngineCore.step`` or, with async
  scheduling (vLLM 0.24's default, vllm/config/vllm.py ``VllmConfig.__post_init__``),
  ``step_with_batch_queue``, which schedules step N+1 before waiting for step N; ``step()`` here
  calls it until one step's output has been processed, so each call returns at most one record.
  No engine process, no busy loop: with ``--tensor-parallel-size`` 1 the model runs in this
  process too (``UniProcExecutor``); with N > 1 vLLM starts N worker processes
  (``MultiprocExecutor``) and the scheduler stays here.
* **Step records from the scheduler**: gpuchef's scheduler subclass (``vllm_scheduler.py``,
  passed as ``SchedulerConfig.scheduler_cls``) hands every SchedulerOutput to ``on_scheduled``
  (split into prefill/decode by ``vllm_mapping.split_scheduler_output``) and every
  ``update_from_output`` to ``on_updated``, which emits the StepRecord and the tokens; nothing is
  read from vLLM's output stream for the records, or from its Prometheus metrics.
* **Models**: ``vllm_models.resolve_vllm_model`` (a preset becomes a ``config.json`` folder
  loaded with random weights; a local folder is passed through). Always
  ``skip_tokenizer_init=True``: prompts are token ids.

vLLM is the ``[vllm]`` extra: nothing here imports it until a VllmEngine is built, and every
reason it cannot be built (``vllm_env.check_vllm_environment``: not installed, torch not the one
vLLM pins, no GPU; a model folder it cannot load) is one ConfigError line that leaves the process
usable for ``--engine native``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import torch

from .vocab.errors import ConfigError
from .vocab.config import EngineConfig, SchedulerConfig
from .engine import DEFAULT_MAX_MODEL_LEN, StepResult
from .kv_cache import KVUsage, cdiv
from .vocab.records import RequestRecord, StepOutput, StepRecord
from .request import SamplingParams, check_prompt
from .vllm_env import (INSTALL_HINT, VLLM_TESTED, check_vllm_environment, first_line, import_vllm,
                       use_spawn_for_workers)
from .vllm_mapping import (StepSplit, check_live_knobs, check_startup_knobs,
                           record_from_split, split_scheduler_output, vllm_sampling_kwargs)
from .vllm_models import VllmModelSource, model_info, resolve_vllm_model

ProgressFn = Callable[[str, int, int], None]


@dataclass(eq=False)
class _ReqState:
    request_id: str
    prompt_len: int
    arrival_ns: int
    max_tokens: int
    output_ids: list[int] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    num_preemptions: int = 0


@dataclass(eq=False)
class _Pending:
    """A scheduled step waiting for its output (async scheduling keeps up to two)."""

    so: Any
    step: int
    split: StepSplit | None
    knobs: SchedulerConfig
    t_sched_ns: int
    t_sched_end_ns: int
    partial: int
    ev0: Any = None
    ev1: Any = None


def _release_failed_start() -> None:
    """Best effort after a failed start: drop vLLM's process groups and cached GPU memory (what
    ``EngineCore.shutdown`` does), so that the native engine can still have the GPU."""
    import gc

    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        gc.collect()
        cleanup_dist_env_and_memory()
    except Exception:
        pass


class _VllmKV:
    """``engine.kv`` for vLLM: ``block_size`` (tokens) and ``usage()`` in blocks, from vLLM's
    block pool (vllm/v1/core/block_pool.py; block 0 is its null block, never free). Blocks that
    only hold prefix-cache data count as free, as vLLM's ``get_usage`` counts them."""

    def __init__(self, pool: Any, block_size: int) -> None:
        self._pool = pool
        self.block_size = block_size

    def usage(self) -> KVUsage:
        total = self._pool.num_gpu_blocks - 1
        return KVUsage(total - self._pool.get_num_free_blocks(), total)


_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error",
           "repetition": "stop"}


@dataclass(frozen=True)
class _BackendName:
    """vLLM's attention backend as the surfaces name it (contract.BackendInfo)."""

    name: str


class VllmEngine:
    """vLLM 0.24's engine core in this process, with LLMEngine's surface (see module doc).

    ``config``: gpuchef's EngineConfig (model, dtype, seed, max_model_len, block size, KV sizing,
    enforce_eager, attention backend "auto" or "flashinfer", scheduler knobs and mode).
    ``tensor_parallel_size``: GPUs for vLLM (its worker processes when > 1). ``progress(stage,
    done, total)``: called around vLLM's start-up (minutes on a cold compile cache).
    ``enable_prefix_caching``: vLLM's prefix cache, off by default: gpuchef's loads are seeded
    synthetic prompts that an A/B replays identically, so a cache would let the second arm skip
    the first arm's prefills (set it to match a plain vLLM run, as the benchmark does).

    Raises ConfigError, one line, for: vLLM missing, mismatched torch or no GPU
    (``check_vllm_environment``); a device other than CUDA 0; a tensor-parallel size above the
    GPU count; ``--attention-backend reference``; start-up knobs vLLM refuses; a model it cannot
    resolve or load (vLLM's own error's first line, e.g. an architecture it does not know).
    """

    def __init__(self, config: EngineConfig, tensor_parallel_size: int = 1,
                 progress: ProgressFn | None = None,
                 enable_prefix_caching: bool = False) -> None:
        self.config = config
        tp = int(tensor_parallel_size)
        version = check_vllm_environment()
        if config.device not in ("auto", "cuda", "cuda:0"):
            raise ConfigError(f"--device {config.device!r} is not supported with --engine vllm: "
                              "use auto or cuda (pick GPUs with CUDA_VISIBLE_DEVICES)")
        if tp < 1 or tp > torch.cuda.device_count():
            raise ConfigError(f"--tensor-parallel-size {tp} is out of range: this machine has "
                              f"{torch.cuda.device_count()} GPU(s), allowed [1, "
                              f"{torch.cuda.device_count()}]")
        if config.attention_backend not in ("auto", "flashinfer"):
            raise ConfigError(f"--attention-backend {config.attention_backend} is gpuchef's own; "
                              "with --engine vllm use auto (vLLM picks) or flashinfer")
        check_startup_knobs(config.scheduler)
        src = resolve_vllm_model(config.model)
        import_vllm(version)
        self.vllm_version = version
        self.tensor_parallel_size = tp
        self.enable_prefix_caching = bool(enable_prefix_caching)
        if tp > 1:
            use_spawn_for_workers()
        self._core = self._start(src, tp, progress)
        self._after_start(src)

    # -- start-up ----------------------------------------------------------------------------
    def _start(self, src: VllmModelSource, tp: int, progress: ProgressFn | None) -> Any:
        try:
            from vllm.engine.arg_utils import EngineArgs
            from vllm.usage.usage_lib import UsageContext
            from vllm.v1.engine.core import EngineCore
            from vllm.v1.executor import Executor

            from . import vllm_scheduler
        except ImportError as e:  # another vLLM than the one this was written against
            raise ConfigError(f"vLLM {self.vllm_version} lacks what gpuchef hosts "
                              f"({first_line(e)}): gpuchef is tested with vLLM {VLLM_TESTED}; "
                              f"{INSTALL_HINT}") from None

        cfg, sc, cc = self.config, self.config.scheduler, self.config.cache
        limit = int(src.hf_config.get("max_position_embeddings") or DEFAULT_MAX_MODEL_LEN)
        max_model_len = (min(limit, DEFAULT_MAX_MODEL_LEN) if cfg.max_model_len is None
                         else cfg.max_model_len)
        if not 2 <= max_model_len <= limit:
            raise ConfigError(f"--max-model-len {max_model_len} is out of range for {src.path}: "
                              f"allowed [2, {limit}]")
        dtype = "bfloat16" if cfg.dtype == "auto" else cfg.dtype
        kw: dict[str, Any] = dict(
            model=src.path, load_format=src.load_format, skip_tokenizer_init=True, dtype=dtype,
            seed=cfg.seed, max_model_len=max_model_len, block_size=cc.block_size,
            gpu_memory_utilization=cc.gpu_memory_utilization,
            num_gpu_blocks_override=cc.num_gpu_blocks, enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=tp, max_num_batched_tokens=sc.max_num_batched_tokens,
            max_num_seqs=sc.max_num_seqs,
            long_prefill_token_threshold=sc.long_prefill_token_threshold,
            enable_chunked_prefill=True, enable_prefix_caching=self.enable_prefix_caching,
            disable_log_stats=True)
        if cfg.async_scheduling is not None:  # None: vLLM's own default decides
            kw["async_scheduling"] = cfg.async_scheduling
        if cc.kv_cache_memory_gb is not None:
            kw["kv_cache_memory_bytes"] = int(cc.kv_cache_memory_gb * 2**30)
        if cfg.attention_backend == "flashinfer":
            kw["attention_backend"] = "FLASHINFER"
        stage = "start vLLM: load, compile, capture graphs (first run: minutes)"
        if progress:
            progress(stage, 0, 1)
        try:
            vcfg = EngineArgs(**kw).create_engine_config(UsageContext.ENGINE_CONTEXT)
            vs = vcfg.scheduler_config
            # Async scheduling needs AsyncScheduler's bookkeeping (output placeholders).
            vs.scheduler_cls = (vllm_scheduler.GpuchefAsyncScheduler if vs.async_scheduling
                                else vllm_scheduler.GpuchefScheduler)
            core = EngineCore(vcfg, Executor.get_class(vcfg), log_stats=False)
        except ConfigError:
            raise
        except Exception as e:  # vLLM raises many kinds; the user needs the first line
            _release_failed_start()
            raise ConfigError(f"vLLM {self.vllm_version} could not start model {src.name!r} "
                              f"({src.path}): {type(e).__name__}: {first_line(e)}") from None
        if progress:
            progress(stage, 1, 1)
        self.vllm_config = vcfg
        return core

    def _after_start(self, src: VllmModelSource) -> None:
        from vllm.utils.torch_utils import current_stream

        vcfg = self.vllm_config
        core = self._core
        sched = core.scheduler
        self.device = torch.device("cuda", 0)
        self.dtype = vcfg.model_config.dtype
        self.max_model_len = vcfg.model_config.max_model_len
        self.loaded, self.model_config = model_info(src, self.dtype)
        vocab = vcfg.model_config.get_vocab_size()
        if vocab and getattr(self.model_config, "vocab_size", 0) != vocab:
            self.model_config = SimpleNamespace(vocab_size=vocab,
                                                eos_token_ids=self.model_config.eos_token_ids)
        pool = sched.kv_cache_manager.block_pool
        self.num_blocks = pool.num_gpu_blocks - 1  # block 0 is vLLM's null block
        self.kv = _VllmKV(pool, sched.block_size)
        backend = vcfg.attention_config.backend
        self.attn = _BackendName(f"vllm ({backend.name.lower() if backend else 'auto'})")
        self.async_scheduling = bool(vcfg.scheduler_config.async_scheduling)
        # vLLM keeps its CUDA stream per thread (vllm/utils/torch_utils.py current_stream); the
        # host steps from its own thread, which must use the stream the graphs were built on.
        # With TP > 1 the model runs in vLLM's worker processes: no CUDA work here at all.
        in_process = vcfg.parallel_config.world_size == 1
        self._attach(core, stream=current_stream() if in_process else None, timing=in_process)

    def _attach(self, core: Any, *, stream: Any = None, timing: bool = False) -> None:
        """Take over ``core`` (an EngineCore whose scheduler is a gpuchef subclass): request
        bookkeeping, the knobs in force, the step observer, and (``timing``) CUDA events around
        each step. Needs ``config``, ``model_config``, ``max_model_len``, ``num_blocks`` and
        ``kv`` set. The ceilings of the live knobs are the scheduler's start-up values."""
        self._core = core
        sched = core.scheduler
        self.max_num_batched_tokens_limit = sched.max_num_scheduled_tokens
        self.max_num_seqs_limit = sched.max_num_running_reqs
        self.requests: dict[str, _ReqState] = {}
        self.step_id = 0
        self._prompt_lens: dict[str, int] = {}
        self._targets: dict[str, int] = {}
        self._pending: deque[_Pending] = deque()
        self._records: list[StepRecord] = []
        self._finished: list[RequestRecord] = []
        self._outputs: list[StepOutput] = []
        self._updates = 0
        self._last_end_ns = 0
        self._last_update_ns = 0
        self._knobs = self.config.scheduler
        sched.gc_ceiling_tokens = self.max_num_batched_tokens_limit
        sched.gc_set_knobs(self._knobs)
        sched.gc_observer = self
        self._stream = stream
        self._bound_thread = threading.get_ident()
        self._events: list[Any] = []
        self._awaiting_end: _Pending | None = None
        self._timing = timing
        if timing:
            self._wrap_executor(core.model_executor)

    def _wrap_executor(self, ex: Any) -> None:
        """CUDA events around each step on the engine's stream: one before the forward is
        launched (``execute_model``), one after sampling is (``sample_tokens``). With async
        scheduling the first one completes when the previous step's work does, so ``gpu_ms`` is
        the step's span on the GPU timeline. Only for an in-process model (TP 1)."""
        run, sample = ex.execute_model, ex.sample_tokens

        def execute_model(scheduler_output, non_block=False):
            p = self._pending[-1] if self._pending else None
            if p is not None and p.so is scheduler_output and p.split is not None:
                p.ev0 = self._event()
                p.ev0.record()
                self._awaiting_end = p
            return run(scheduler_output, non_block)

        def sample_tokens(grammar_output, non_block=False):
            out = sample(grammar_output, non_block)
            p, self._awaiting_end = self._awaiting_end, None
            if p is not None:
                p.ev1 = self._event()
                p.ev1.record()
            return out

        ex.execute_model = execute_model
        ex.sample_tokens = sample_tokens

    def _event(self) -> Any:
        return self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)

    def _bind_thread(self) -> None:
        tid = threading.get_ident()
        if tid != self._bound_thread:
            self._bound_thread = tid
            if self._stream is None:
                return
            torch.cuda.set_device(self.device)
            torch.cuda.set_stream(self._stream)  # vLLM patches this to set its per-thread stream

    @property
    def engine_name(self) -> str:
        return f"vLLM {self.vllm_version}".strip()

    @property
    def has_step_in_flight(self) -> bool:
        return False  # vLLM's own async scheduling completes each step inside step()

    def drain(self) -> StepResult:
        return StepResult(None)

    def close(self) -> None:
        """Shut vLLM's engine core down (frees the GPU; stops TP worker processes). Idempotent."""
        core, self._core = getattr(self, "_core", None), None
        if core is not None:
            core.shutdown()

    # -- knobs -------------------------------------------------------------------------------
    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self._knobs

    def validate_scheduler_config(self, cfg: SchedulerConfig) -> None:
        """Raise ConfigError if vLLM cannot take ``cfg`` live (``check_live_knobs``)."""
        check_live_knobs(cfg, max_num_batched_tokens=self.max_num_batched_tokens_limit,
                         max_num_seqs=self.max_num_seqs_limit)

    def set_scheduler_config(self, cfg: SchedulerConfig) -> None:
        """Put ``cfg`` in force from the next scheduled step on. Raises ConfigError (nothing
        changes) for ``max_num_batched_tokens`` or ``max_num_seqs`` above their start-up values.
        With async scheduling one step may already be scheduled under the old config; its
        record says so."""
        self.validate_scheduler_config(cfg)
        self._knobs = cfg
        self._core.scheduler.gc_set_knobs(cfg)

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int],
                    sampling: SamplingParams | None = None,
                    arrival_ns: int | None = None) -> _ReqState:
        """Queue a request. ``arrival_ns`` (monotonic ns) defaults to now.

        Raises ConfigError — and changes nothing — for a duplicate id, an empty prompt, a token
        id outside ``[0, vocab_size)``, a prompt that leaves no room in ``max_model_len``, or a
        request that could not fit in the whole KV cache (the native engine's rules).
        """
        from vllm.v1.engine import EngineCoreRequest

        sampling = sampling or SamplingParams()
        if request_id in self.requests:
            raise ConfigError(f"request id {request_id!r} is already in the engine")
        tolist = getattr(prompt_token_ids, "tolist", None)
        prompt = [int(t) for t in (tolist() if tolist else prompt_token_ids)]
        check_prompt(request_id, prompt, self.model_config.vocab_size, self.max_model_len)
        total = min(len(prompt) + sampling.max_tokens, self.max_model_len)
        need = cdiv(total, self.kv.block_size)
        if need > self.num_blocks:
            raise ConfigError(f"request {request_id!r}: {total} tokens need {need} KV blocks, "
                              f"the cache has {self.num_blocks}")
        req = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=prompt, mm_features=None,
            sampling_params=self._vllm_sampling(sampling), pooling_params=None,
            arrival_time=time.time(), lora_request=None, cache_salt=None,
            data_parallel_rank=None)
        core = self._core
        vreq, wave = core.preprocess_add_request(req)
        core.add_request(vreq, wave)
        st = _ReqState(request_id, len(prompt),
                       arrival_ns if arrival_ns is not None else time.monotonic_ns(),
                       sampling.max_tokens)
        self.requests[request_id] = st
        self._prompt_lens[request_id] = len(prompt)
        return st

    def _vllm_sampling(self, s: SamplingParams) -> Any:
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        sp = VllmSamplingParams(**vllm_sampling_kwargs(s))
        eos = tuple(getattr(self.model_config, "eos_token_ids", ()) or ())
        if eos:
            # what vLLM's InputProcessor does with the model's generation config, ignore_eos or
            # not (then EOS does not stop, but min_tokens still masks it: all_stop_token_ids)
            sp.update_from_generation_config({"eos_token_id": list(eos)}, eos[0])
        return sp

    def abort(self, request_id: str, reason: str = "abort") -> RequestRecord | None:
        """Stop a request and free its blocks. Returns its record (``finish_reason`` =
        ``reason``), None if it is unknown."""
        st = self.requests.get(request_id)
        if st is None:
            return None
        self._core.abort_requests([request_id])
        self._core.scheduler.gc_prefill_blocked = False
        return self._finish(st, reason)

    def _finish(self, st: _ReqState, reason: str) -> RequestRecord:
        rid = st.request_id
        del self.requests[rid]
        self._prompt_lens.pop(rid, None)
        self._targets.pop(rid, None)
        return RequestRecord(
            request_id=rid, arrival_ns=st.arrival_ns, prompt_len=st.prompt_len,
            output_len=len(st.output_ids), token_times_ns=tuple(st.times),
            finish_reason=reason, num_preemptions=st.num_preemptions, max_tokens=st.max_tokens,
            output_token_ids=tuple(st.output_ids))

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self._core.batch_queue)

    @property
    def num_waiting(self) -> int:
        s = self._core.scheduler
        return len(s.waiting) + len(s.skipped_waiting)

    @property
    def num_running(self) -> int:
        return len(self._core.scheduler.running)

    # -- the step ----------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Run vLLM's engine core until one step's output has been processed. Returns that
        step's record (None for an empty step, or when there was nothing to run) and the
        requests that finished with it."""
        self._bind_thread()
        core = self._core
        start = self._updates
        while self._updates == start:
            if not core.scheduler.has_requests() and not core.batch_queue:
                break
            _, executed = core.step_fn()
            core.post_step(executed)
        rec = self._records.pop() if self._records else None
        self._records.clear()
        finished, self._finished = self._finished, []
        outs, self._outputs = self._outputs, []
        if len(outs) > 1:  # several updates in one call: one hand-over, each token its own time
            outs = [StepOutput(outs[-1].step, outs[-1].t_ns,
                               tuple(t for o in outs for t in o.tokens),
                               tuple(f for o in outs for f in o.first_tokens),
                               tuple(f for o in outs for f in o.finished))]
        return StepResult(rec, finished, outs[0] if outs else None)

    # -- called by the scheduler subclass ----------------------------------------------------
    def on_scheduled(self, sched: Any, so: Any, t0_ns: int, knobs: SchedulerConfig) -> None:
        """A step was scheduled: split its tokens now (the counts it carries are pre-step)."""
        t1 = time.monotonic_ns()
        if so.total_num_scheduled_tokens:
            split = split_scheduler_output(so, self._prompt_lens, self._targets)
            sid = self.step_id
            self.step_id += 1
            if split.num_preempted:
                for rid in so.preempted_req_ids:
                    st = self.requests.get(rid)
                    if st is not None:
                        st.num_preemptions += 1
            inflight = getattr(sched, "_inflight_prefills", None)
            partial = len(inflight) if inflight is not None else split.num_partial_prefills
        else:
            split, sid, partial = None, -1, 0
        self._pending.append(_Pending(so, sid, split, knobs, t0_ns, t1, partial))

    def on_updated(self, sched: Any, so: Any, outputs: dict[int, Any], t0_ns: int) -> None:
        """A step's output was processed: tokens, finished requests, and the StepRecord."""
        t1 = time.monotonic_ns()
        p = self._pending.popleft() if self._pending else None
        if p is not None and p.so is not so:  # update_from_output runs in FIFO order; be safe
            self._pending.appendleft(p)
            p = next((x for x in self._pending if x.so is so), None)
            if p is not None:
                self._pending.remove(p)
        finished = []
        tokens: list[tuple[str, int]] = []
        first: list[tuple[str, int, int]] = []
        get = self.requests.get
        for eco in outputs.values():
            for o in eco.outputs:  # per step and request: keep it lean (it runs ~1000×/step)
                st = get(o.request_id)
                if st is None:
                    continue
                new = o.new_token_ids
                if new and not st.output_ids:
                    first.append((st.request_id, st.arrival_ns, st.prompt_len))
                if len(new) == 1:
                    st.output_ids.append(new[0])
                    st.times.append(t1)
                    tokens.append((st.request_id, new[0]))
                elif new:
                    st.output_ids.extend(new)
                    st.times.extend([t1] * len(new))
                    tokens.extend((st.request_id, t) for t in new)
                if o.finish_reason is not None:
                    finished.append(self._finish(st, _FINISH.get(str(o.finish_reason), "error")))
        if finished:
            sched.gc_prefill_blocked = False
        if p is not None and p.split is not None:
            usage = self.kv.usage()
            self._records.append(record_from_split(
                p.split, step=p.step, t_start_ns=max(p.t_sched_ns, self._last_end_ns),
                t_end_ns=t1, gpu_ms=self._gpu_ms(p, t0_ns), config=p.knobs,
                num_running=len(sched.running),
                num_waiting=len(sched.waiting) + len(sched.skipped_waiting),
                kv_blocks_used=usage.used, kv_blocks_total=usage.total,
                num_finished=len(finished), num_partial_prefills=p.partial))
        self._finished.extend(finished)
        if tokens:
            self._outputs.append(StepOutput(p.step if p is not None else -1, t1, tuple(tokens),
                                            tuple(first), tuple(finished)))
        self._last_end_ns = t1
        self._last_update_ns = t0_ns
        self._updates += 1

    def _gpu_ms(self, p: _Pending, t_update_ns: int) -> float:
        """CUDA-event span of the step (ms); else the wall time from when it could start (its
        schedule ended and the previous step's output landed) to when its output landed."""
        if p.ev0 is not None and p.ev1 is not None:
            try:
                if not p.ev1.query():
                    p.ev1.synchronize()
                ms = float(p.ev0.elapsed_time(p.ev1))
                self._events += (p.ev0, p.ev1)
                return ms
            except RuntimeError:
                pass
        return max(0.0, (t_update_ns - max(p.t_sched_end_ns, self._last_update_ns)) / 1e6)
