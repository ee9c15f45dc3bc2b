"""The engine: ``add_request`` / ``step`` / ``abort`` over scheduler, KV cache, runner and model.

Single-threaded by design; ``EngineHost`` (host.py) runs it in a background thread and applies
commands between steps.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .attention import decode_split_kv_args
from .attention_choice import check_backend, make_backend
from .vocab.config import PIECEWISE_CAPTURE_SIZES, EngineConfig, SchedulerConfig
from .vocab.errors import ConfigError
from .kv_cache import KVCacheManager, cdiv
from .loader import LoadedModel, load_model
from .vocab.records import RequestRecord, StepOutput, StepRecord
from .request import Request, SamplingParams, check_prompt
from . import ops
from .runner import CudaGraphDecode, CudaGraphPiecewise, ModelRunner, StepHandle
from .scheduler import Postprocessed, Scheduler, SchedulerOutput, usable_blocks

#: A StepRecord's autopilot fields for a step it did not decide (off, or not a chunked step).
_NO_DECISION: dict = {}

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}
DEFAULT_MAX_MODEL_LEN = 8192
CPU_DEFAULT_BLOCKS = 4096


def resolve_device(name: str) -> torch.device:
    """"auto" → cuda when available, else cpu. Raises ConfigError for CUDA where there is none."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"--device {name!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available to this torch "
                          f"({torch.__version__}); use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r} is not supported: use auto, cpu, cuda or cuda:N")
    return dev


def resolve_async_scheduling(flag: bool | None, device: torch.device) -> bool:
    """``--async-scheduling`` / ``--no-async-scheduling`` as given; not given (None): on for
    CUDA, off for CPU (there the runner does a step's work in ``launch``: nothing overlaps)."""
    return device.type == "cuda" if flag is None else bool(flag)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto" → bfloat16 on CUDA, float32 on CPU. Raises ConfigError for unknown names."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"--dtype {name!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass
class StepResult:
    """What one call of ``step()`` produced: its record (None when there was nothing to run),
    the requests that finished in it, and its new tokens (``output``, None when it sampled
    none) for whoever streams them."""

    record: StepRecord | None
    finished: list[RequestRecord] = field(default_factory=list)
    output: StepOutput | None = None


def _step_output(step_id: int, t_ns: int, post: Postprocessed,
                 finished: list) -> StepOutput | None:
    return StepOutput(step_id, t_ns, tuple(post.tokens), tuple(post.first), tuple(finished)) \
        if post.tokens else None


@dataclass(eq=False)
class _InFlight:
    """A step launched and not yet completed (async scheduling).

    ``slots[i]``: index in ``output_token_ids`` of the placeholder for the token it samples for
    ``handle.sample_reqs[i]``. ``deferred_free``: requests that finished (or were aborted) while
    this step still writes their KV; their blocks go back when it completes.
    """

    step_id: int
    out: SchedulerOutput
    handle: StepHandle
    slots: list[int]
    t_sched_ns: int
    deferred_free: list[Request] = field(default_factory=list)


class LLMEngine:
    """A Llama-family engine with a paged KV cache and a two-mode scheduler; implements
    ``contract.Engine``.

    Raises ConfigError at construction for a bad device, dtype, model or cache size.
    """

    engine_name = ""  # gpuchef's own: the header does not name it
    tensor_parallel_size = 1

    def __init__(self, config: EngineConfig,
                 progress: Callable[[str, int, int], None] | None = None) -> None:
        ops.check_rope_append_env()
        decode_split_kv_args(os.environ.get("GPUCHEF_DECODE_SPLIT_KV"))  # a bad value: one line
        self.device = resolve_device(config.device)
        # ``config`` as run: async scheduling resolved for the device
        config = self.config = dataclasses.replace(
            config, async_scheduling=resolve_async_scheduling(config.async_scheduling, self.device))
        self.dtype = resolve_dtype(config.dtype, self.device)
        check_backend(config.attention_backend, self.device)  # before minutes of weight loading
        self.loaded: LoadedModel = load_model(config.model, dtype=self.dtype, device=self.device,
                                              seed=config.seed, progress=progress)
        mc = self.model_config = self.loaded.config
        limit = mc.max_context  # max_position_embeddings, or the sliding window if smaller
        self.max_model_len = (min(limit, DEFAULT_MAX_MODEL_LEN) if config.max_model_len is None
                              else config.max_model_len)
        if not 2 <= self.max_model_len <= limit:
            raise ConfigError(f"--max-model-len {self.max_model_len} is out of range for "
                              f"{self.loaded.name}: allowed [2, {limit}]")
        bs = config.cache.block_size
        self.num_blocks = self._num_blocks()
        self.kv = KVCacheManager(mc.num_hidden_layers, self.num_blocks, bs,
                                 mc.num_key_value_heads, mc.head_dim, self.dtype, self.device)
        self.attn = make_backend(config.attention_backend, self.device, config.decode_attention)
        self.attn.configure(num_qo_heads=mc.num_attention_heads,
                            num_kv_heads=mc.num_key_value_heads, head_dim=mc.head_dim,
                            dtype=self.dtype)
        self.scheduler = Scheduler(config.scheduler, self.kv)
        if config.async_scheduling:
            self.attn.device_page_indices = True
        self.runner = ModelRunner(self.loaded.model, self.kv, self.attn, self.device, config.seed)
        # FlashInfer's fused norm/RoPE/activation kernels go with its attention (process-wide
        # switch: the engine last built decides).
        self.fused_ops = ops.use_flashinfer_ops(self.attn.name == "flashinfer")
        #: the kernel choices this engine's graphs capture (the trace's meta, --result-json)
        self.kernels = {"blas": ops.prefer_blas(self.device),
                        "rope_append": ops.rope_append_mode()}
        if self.device.type == "cuda":
            self._warm_up(progress)
        self.requests: dict[str, Request] = {}
        self.step_id = 0  # the id the next scheduled step gets
        self._preempted_total = 0
        self._inflight: _InFlight | None = None  # async scheduling: the step on the GPU
        self._last_t_end = 0

    def _warm_up(self, progress: Callable[[str, int, int], None] | None) -> None:
        """Compile JIT kernels, then capture CUDA graphs (piecewise ones for steps with prefill
        tokens unless ``cudagraph_mode`` is FULL_DECODE_ONLY, full ones for decode-only steps;
        one memory pool), each shown as a named progress step, the piecewise one naming its
        capture sizes (FlashInfer's first JIT compile takes minutes)."""
        stage = "compile kernels (first run: minutes)"
        if progress:
            progress(stage, 0, 1)
        self.runner.warm_up()
        torch.cuda.synchronize(self.device)
        if progress:
            progress(stage, 1, 1)
        if self.attn.name == "flashinfer" and not self.config.enforce_eager:
            pool = torch.cuda.graph_pool_handle()
            if self.config.cudagraph_mode == "FULL_AND_PIECEWISE":
                self.runner.piecewise = CudaGraphPiecewise(
                    self.runner, self.config.cudagraph_capture_sizes or PIECEWISE_CAPTURE_SIZES,
                    progress=progress, pool=pool)
            self.runner.graphs = CudaGraphDecode(self.runner, self.max_model_len,
                                                 progress=progress, pool=pool)

    # -- sizing ----------------------------------------------------------------------------
    def _num_blocks(self) -> int:
        cc = self.config.cache
        mc = self.model_config
        per_block = KVCacheManager.bytes_per_block(mc.num_hidden_layers, cc.block_size,
                                                   mc.num_key_value_heads, mc.head_dim, self.dtype)
        if cc.num_gpu_blocks is not None:
            n = cc.num_gpu_blocks
        elif cc.kv_cache_memory_gb is not None:
            n = int(cc.kv_cache_memory_gb * 2**30) // per_block
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            # keep room for activations and the logits of a full budget (≈3 GiB at 8B shapes)
            usable = int(total * cc.gpu_memory_utilization) - (total - free) - 3 * 2**30
            n = usable // per_block
        else:
            n = CPU_DEFAULT_BLOCKS
        # A request of max_model_len tokens must pass add_request, which counts only the blocks
        # above the admission watermark: check against those, not all n.
        need = cdiv(self.max_model_len, cc.block_size)
        usable = usable_blocks(n)
        if usable < need:
            least = need
            while usable_blocks(least) < need:
                least += 1
            raise ConfigError(
                f"KV cache of {n} block{'s' * (n != 1)} ({n * cc.block_size} tokens) has {usable} "
                f"usable ({n - usable} kept free by the 1 % admission watermark) and cannot hold "
                f"one request of max_model_len {self.max_model_len}: allowed ≥ {least} blocks "
                f"(raise the KV memory) or --max-model-len ≤ {usable * cc.block_size}")
        return n

    @property
    def scheduler_config(self) -> SchedulerConfig:
        return self.scheduler.config

    @property
    def async_scheduling(self) -> bool:
        return self.config.async_scheduling

    @property
    def decode_attention(self) -> str:
        """The kernel decode rows run on: "xqa" or "flashinfer" (FlashInfer's decode wrapper)
        on FlashInfer, else the backend's name ("reference"); ``config.decode_attention``
        resolved."""
        kernel = getattr(self.attn, "decode_kernel", None)
        return kernel(self.kv.block_size) if kernel is not None else self.attn.name

    def set_scheduler_config(self, cfg: SchedulerConfig) -> None:
        """Put ``cfg`` in force from the next step on."""
        self.scheduler.config = cfg

    def validate_scheduler_config(self, cfg: SchedulerConfig) -> None:
        """Any valid SchedulerConfig can be put in force live: nothing to refuse."""

    def close(self) -> None:
        """Nothing beyond memory to release."""

    # -- requests --------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: Sequence[int],
                    sampling: SamplingParams | None = None, arrival_ns: int | None = None) -> Request:
        """Queue a request. ``arrival_ns`` (monotonic ns) defaults to now.

        Raises ConfigError — and changes nothing — for a duplicate id, an empty prompt, a token
        id outside ``[0, vocab_size)``, a prompt that leaves no room in ``max_model_len``, or a
        request that could not fit in the whole KV cache.
        """
        sampling = sampling or SamplingParams()
        if request_id in self.requests:
            raise ConfigError(f"request id {request_id!r} is already in the engine")
        prompt = list(prompt_token_ids)
        check_prompt(request_id, prompt, self.model_config.vocab_size, self.max_model_len)
        total = min(len(prompt) + sampling.max_tokens, self.max_model_len)
        usable = usable_blocks(self.num_blocks)
        if cdiv(total, self.kv.block_size) > usable:
            raise ConfigError(f"request {request_id!r}: {total} tokens need "
                              f"{cdiv(total, self.kv.block_size)} KV blocks, the cache has "
                              f"{usable} usable")
        req = Request(request_id, prompt, sampling,
                      arrival_ns if arrival_ns is not None else time.monotonic_ns())
        if sampling.min_tokens:  # the ids it masks: vLLM's all_stop_token_ids, EOS included
            req.min_tokens_stop_ids = tuple(sorted(
                set(self.model_config.eos_token_ids) | set(sampling.stop_token_ids)))
        self.requests[request_id] = req
        self.scheduler.add(req)
        return req

    def abort(self, request_id: str, reason: str = "abort") -> RequestRecord | None:
        """Stop a request and free its blocks. Returns its record (``finish_reason`` =
        ``reason``: "abort" for a client gone, "stop" for a stop string found above the
        engine), None if it is unknown."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req, reason, *self._holding(self._inflight))
        return self._record(req)

    def has_unfinished(self) -> bool:
        """Requests left, or (async scheduling) a step still to complete and return."""
        return bool(self.requests) or self._inflight is not None

    @property
    def has_step_in_flight(self) -> bool:
        return self._inflight is not None

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- the step --------------------------------------------------------------------------
    def step(self) -> StepResult:
        """Schedule, run and sample one step. Returns its record and the finished requests;
        ``record`` is None (and the step id unchanged) when there is nothing to run.

        With ``config.async_scheduling`` see ``_step_async``: the record returned is that of the
        step launched by the previous call, if one is in flight."""
        if self.config.async_scheduling:
            return self._step_async()
        t_start = time.monotonic_ns()
        out = self.scheduler.schedule()
        if out.is_empty:
            return StepResult(None)
        sampled, gpu_ms = self.runner.execute(out)
        now = time.monotonic_ns()
        self.scheduler.advance(out, self.step_id, t_start)
        post = self.scheduler.postprocess(sampled, now, self.model_config.eos_token_ids,
                                          self.max_model_len)
        finished = self._retire(post)
        rec = self._step_record(self.step_id, out, t_start, gpu_ms, len(finished),
                                self.runner.last_step_used_graph, self._itl_ms(out, now))
        self.step_id += 1
        return StepResult(rec, finished, _step_output(rec.step, now, post, finished))

    def _retire(self, post: Postprocessed) -> list[RequestRecord]:
        """Forget the requests ``post`` finished; their records, in finishing order."""
        for r in post.finished:
            del self.requests[r.request_id]
        return [self._record(r) for r in post.finished]

    def _step_record(self, step_id: int, out: SchedulerOutput, t_start: int, gpu_ms: float,
                     num_finished: int, cuda_graph: bool, itl_ms: float) -> StepRecord:
        cfg = out.config
        d = out.autopilot
        usage = self.kv.usage()
        rec = StepRecord(
            step=step_id, t_start_ns=t_start, t_end_ns=time.monotonic_ns(), gpu_ms=gpu_ms,
            mode=cfg.mode, max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
            long_prefill_token_threshold=cfg.long_prefill_token_threshold,
            max_num_partial_prefills=cfg.max_num_partial_prefills,
            num_prefill_reqs=len(out.prefills), num_prefill_tokens=out.num_prefill_tokens,
            num_decode_reqs=len(out.decodes), num_partial_prefills=out.num_partial_prefills,
            num_running=self.num_running, num_waiting=self.num_waiting,
            num_preempted=len(out.preempted), kv_blocks_used=usage.used,
            kv_blocks_total=usage.total, num_finished=num_finished, cuda_graph=cuda_graph,
            max_long_partial_prefills=cfg.max_long_partial_prefills, auto_budget=cfg.auto_budget,
            itl_ms=itl_ms, **(_NO_DECISION if d is None else dict(
                prefill_allowance=d.allowance, predicted_ms=d.predicted_ms,
                autopilot_state=d.state, fit_error=d.fit_error, goal_ms=d.goal_ms)),
        )
        # the autopilot learns from the step (after the record: its model's update is the
        # step's, not the record's, business)
        self.scheduler.observe(out, rec.wall_ms, itl_ms)
        return rec

    @staticmethod
    def _itl_ms(out: SchedulerOutput, now: int) -> float:
        """The gap (ms) the step's decode rows saw since their previous token, timed on its
        first decode row (the longest running: in a chunked step every decode row got its
        previous token in the same step, but in continuous mode a request admitted since got
        its first token later). -1 for a step without decode rows, or one whose first row's
        token was discarded (its request ended while the step ran)."""
        if not out.decodes:
            return -1.0
        t = out.decodes[0].token_times_ns
        return (now - t[-2]) / 1e6 if len(t) >= 2 and t[-1] == now else -1.0

    # -- async scheduling ------------------------------------------------------------------
    def _step_async(self) -> StepResult:
        """One step of the pipeline: launch step N if nothing is in flight, schedule and launch
        step N+1 while N runs (its decode inputs read N's sampled tokens on the device), then
        wait for N, post-process it and return N's record. At most one step stays in flight.

        Falls back to completing N before scheduling N+1 when scheduling might preempt (a
        preempted request must not have a token in flight); the next call then schedules with
        nothing in flight, exactly as the synchronous engine does.
        """
        t_sched = time.monotonic_ns()
        cur = self._inflight
        if cur is None:
            out = self.scheduler.schedule()
            if out.is_empty:
                return StepResult(None)
            cur = self._launch(out, None, t_sched)
            t_sched = time.monotonic_ns()
        nxt = None
        if not self.scheduler.may_preempt():
            out = self.scheduler.schedule()
            if any(v.last_step == cur.step_id for v in out.preempted):
                raise RuntimeError("async scheduling preempted a request of the step in flight")
            if not out.is_empty:
                nxt = self._launch(out, cur, t_sched)
        self._inflight = nxt
        return self._complete(cur, nxt)

    def drain(self) -> StepResult:
        """Complete the step in flight (async scheduling) and return it; StepResult(None) if
        there is none. Schedules nothing."""
        cur = self._inflight
        if cur is None:
            return StepResult(None)
        self._inflight = None
        return self._complete(cur, None)

    def _launch(self, out: SchedulerOutput, prev: _InFlight | None, t_sched: int) -> _InFlight:
        """Launch ``out`` and book it as done: computed tokens advance now (vLLM does so at
        schedule time), each sampling request gets a placeholder token, and a request that
        surely finishes in this step (its length) leaves the running list so that it is not
        scheduled again; its blocks stay until the step completes."""
        sid = self.step_id
        self.step_id += 1
        h = self.runner.launch(out, prev.handle if prev is not None else None)
        self.scheduler.advance(out, sid, t_sched)
        slots = self.scheduler.reserve_outputs(h.sample_reqs, self.max_model_len)
        return _InFlight(sid, out, h, slots, t_sched)

    @staticmethod
    def _holding(inflight: _InFlight | None) -> tuple[int, list[Request] | None]:
        """``Scheduler.finish``'s ``(in_flight_step, hold)`` for the step ``inflight``."""
        return (inflight.step_id, inflight.deferred_free) if inflight is not None else (-1, None)

    def _complete(self, cur: _InFlight, nxt: _InFlight | None) -> StepResult:
        """Wait for ``cur``, put its tokens in place of the placeholders, finish requests (a
        request also in ``nxt`` keeps its blocks until ``nxt`` completes; its row there is
        discarded), free what waited on ``cur``, and return ``cur``'s record."""
        sampled, gpu_ms = self.runner.wait(cur.handle)
        now = time.monotonic_ns()
        post = self.scheduler.postprocess(sampled, now, self.model_config.eos_token_ids,
                                          self.max_model_len, cur.slots, *self._holding(nxt))
        finished = self._retire(post)
        for r in cur.deferred_free:
            self.kv.free(r)
        t_start = max(cur.t_sched_ns, self._last_t_end)
        rec = self._step_record(cur.step_id, cur.out, t_start, gpu_ms, len(finished),
                                cur.handle.used_graph, self._itl_ms(cur.out, now))
        self._last_t_end = rec.t_end_ns
        return StepResult(rec, finished, _step_output(cur.step_id, now, post, finished))

    @staticmethod
    def _record(r: Request) -> RequestRecord:
        return RequestRecord(
            request_id=r.request_id, arrival_ns=r.arrival_ns, prompt_len=r.prompt_len,
            output_len=len(r.output_token_ids), token_times_ns=tuple(r.token_times_ns),
            finish_reason=r.finish_reason, num_preemptions=r.num_preemptions,
            max_tokens=r.sampling.max_tokens, output_token_ids=tuple(r.output_token_ids),
            first_scheduled_ns=r.first_scheduled_ns)
