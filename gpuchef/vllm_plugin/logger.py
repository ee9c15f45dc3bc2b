"""The stat logger itself, with no vLLM import: ``GpuchefStatLoggerCore`` does all the work and
``gpuchef.vllm_plugin.GpuchefStatLogger`` puts vLLM's base class under it when vLLM is there.

vLLM 0.24 (vllm/v1/metrics/loggers.py) takes a plugin class from the entry-point group
``vllm.stat_logger_plugins`` and, because the class is an ``AggregateStatLoggerBase``, makes ONE
instance per ``AsyncLLM``: ``cls(vllm_config=..., engine_indexes=[...])``; a plain
``StatLoggerBase`` would be made once per engine as ``cls(vllm_config, engine_index)``. Both are
accepted here. Then, per EngineCoreOutputs message the front end pulls (one engine's output
batch): ``record(scheduler_stats=..., iteration_stats=..., mm_cache_stats=...,
engine_idx=...)``; every ``VLLM_LOG_STATS_INTERVAL`` seconds ``log()``; once
``log_engine_initialized()``; around sleep mode ``record_sleep_state(...)``.

Nothing here may raise into vLLM. The first error (a stats object without a field this version
reads, a socket error) logs one line on the ``vllm.gpuchef_plugin`` logger and the instance goes
quiet: it publishes nothing more, and each later call returns at once.
"""

from __future__ import annotations

import logging
import time

from . import publisher as _publisher

#: a child of vLLM's logger, so that in vLLM its lines come out with vLLM's handler, format and
#: level (VLLM_LOGGING_LEVEL); vLLM's own "vllm" logger does not propagate to the root
LOGGER_NAME = "vllm.gpuchef_plugin"
log = logging.getLogger(LOGGER_NAME)


def _opt_int(obj, name):
    v = getattr(obj, name, None)
    return None if v is None else int(v)


def build_record(record_cls, scheduler_stats, iteration_stats, engine_idx: int, t_ns: int,
                 mono_ns: int):
    """One PluginRecord from vLLM's stats objects (field names of vLLM 0.24,
    vllm/v1/metrics/stats.py). The fields every 0.24 object has are read directly: a version
    without them raises AttributeError here (and the plugin goes quiet) rather than publish
    zeros. The optional objects (prefix cache, spec decoding, cudagraph, perf) are read when
    present."""
    rec = record_cls(engine_idx=int(engine_idx), t_ns=t_ns, mono_ns=mono_ns)
    s = scheduler_stats
    if s is not None:
        rec.has_sched = True
        rec.running = int(s.num_running_reqs)
        rec.waiting = int(s.num_waiting_reqs)
        rec.kv_usage = float(s.kv_cache_usage)
        rec.skipped_waiting = _opt_int(s, "num_skipped_waiting_reqs")
        pc = getattr(s, "prefix_cache_stats", None)
        if pc is not None:
            rec.prefix_requests = int(pc.requests)
            rec.prefix_queries = int(pc.queries)
            rec.prefix_hits = int(pc.hits)
            rec.prefix_reset = bool(getattr(pc, "reset", False))
        sd = getattr(s, "spec_decoding_stats", None)
        if sd is not None:
            rec.spec_drafts = int(sd.num_drafts)
            rec.spec_draft_tokens = int(sd.num_draft_tokens)
            rec.spec_accepted_tokens = int(sd.num_accepted_tokens)
        cg = getattr(s, "cudagraph_stats", None)
        if cg is not None:
            rec.cg_mode = str(cg.runtime_mode)
            rec.cg_unpadded_tokens = int(cg.num_unpadded_tokens)
            rec.cg_padded_tokens = int(cg.num_padded_tokens)
            rec.cg_paddings = int(cg.num_paddings)
        perf = getattr(s, "perf_stats", None)
        if perf is not None:
            rec.flops_per_gpu = int(perf.num_flops_per_gpu)
            rec.read_bytes_per_gpu = int(perf.num_read_bytes_per_gpu)
            rec.write_bytes_per_gpu = int(perf.num_write_bytes_per_gpu)
    it = iteration_stats
    if it is not None:
        rec.has_iter = True
        rec.iter_ts = float(it.iteration_timestamp)
        rec.prompt_tokens = int(it.num_prompt_tokens)
        rec.generation_tokens = int(it.num_generation_tokens)
        rec.preempted = int(it.num_preempted_reqs)
        rec.ttfts = [float(x) for x in it.time_to_first_tokens_iter]
        rec.itls = [float(x) for x in it.inter_token_latencies_iter]
        rec.finished = len(it.finished_requests)
        pts = getattr(it, "prompt_token_stats", None)
        if pts is not None:
            rec.prompt_computed = int(pts.computed)
            rec.prompt_cached = int(pts.cached_tokens)
    return rec


class GpuchefStatLoggerCore:
    """vLLM's stat-logger interface, publishing one record per ``record()`` call when
    ``GPUCHEF_PUBLISH=HOST:PORT`` is set; off (nothing bound, nothing imported) otherwise."""

    def __init__(self, vllm_config=None, engine_indexes=None, engine_index=None):
        self._pub = None
        self._record_cls = None
        self._quiet = False
        self.vllm_config = vllm_config
        try:
            idx = engine_indexes if engine_indexes is not None else engine_index
            if idx is None:
                self.engine_indexes = [0]
            elif isinstance(idx, int):  # a per-engine logger: (vllm_config, engine_index)
                self.engine_indexes = [idx]
            else:
                self.engine_indexes = [int(i) for i in idx]
            config = _publisher.config_from_env()
        except _publisher.ConfigError as exc:
            self._quiet = True
            log.warning("gpuchef vLLM plugin: %s=%r refused: %s; it publishes nothing",
                        _publisher.ENV_PUBLISH, _env_value(), exc)
            return
        except Exception as exc:
            self._fail("reading its settings", exc)
            return
        if config is None:
            return
        try:
            from gpuchef.probes.plugin_wire import PluginRecord

            self._record_cls = PluginRecord
            self._pub = _publisher.acquire(config)
        except Exception as exc:
            self._fail(f"binding {config.endpoint}", exc)
            return
        log.info("gpuchef vLLM plugin: publishing engine %s stats on %s",
                 ",".join(map(str, self.engine_indexes)), self._pub.endpoint)

    # -- what vLLM calls -----------------------------------------------------------------------
    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        pub = self._pub
        if pub is None:
            return
        try:
            rec = build_record(self._record_cls, scheduler_stats, iteration_stats,
                               0 if engine_idx is None else engine_idx, time.time_ns(),
                               time.monotonic_ns())
            pub.publish(rec)
        except Exception as exc:
            self._fail("record()", exc)

    def log_engine_initialized(self):
        pass

    def log(self):
        pass

    def record_sleep_state(self, is_awake=0, level=0):
        pass

    # -- for tools and tests -------------------------------------------------------------------
    @property
    def publisher(self):
        """The Publisher (None when off or quiet)."""
        return self._pub

    @property
    def endpoint(self) -> str | None:
        """``tcp://HOST:PORT`` as bound (the real port when GPUCHEF_PUBLISH gave 0)."""
        return None if self._pub is None else self._pub.endpoint

    @property
    def quiet(self) -> bool:
        return self._quiet

    def close(self) -> None:
        pub, self._pub = self._pub, None
        if pub is not None:
            _publisher.release(pub)

    def _fail(self, what: str, exc: BaseException) -> None:
        try:
            if self._quiet:
                return
            self._quiet = True
            log.warning("gpuchef vLLM plugin: %s failed (%s: %s); it publishes nothing more",
                        what, type(exc).__name__, exc)
            self.close()
        except Exception:
            self._pub = None


def _env_value() -> str:
    import os

    return os.environ.get(_publisher.ENV_PUBLISH, "")
