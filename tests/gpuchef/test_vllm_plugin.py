"""gpuchef's vLLM stat-logger plugin (gpuchef/vllm_plugin) on CPU, without vLLM.

A fake host drives the plugin the way vLLM 0.24 does. What it mirrors, read from vLLM 0.24.0's
wheel:

- vllm/v1/metrics/loggers.py ``load_stat_logger_plugin_factories``: the entry point's object must
  be a class and a subclass of ``StatLoggerBase`` (else TypeError, and vLLM does not start);
  ``StatLoggerManager.__init__``: a subclass of ``AggregateStatLoggerBase`` is made once as
  ``cls(vllm_config=..., engine_indexes=[...])``, any other class once per engine as
  ``cls(vllm_config, engine_index)`` inside ``PerEngineStatLoggerAdapter``;
  ``StatLoggerManager.record`` calls ``record(scheduler_stats, iteration_stats,
  mm_cache_stats=..., engine_idx=...)``.
- vllm/v1/engine/async_llm.py ``output_handler``: per EngineCoreOutputs pulled, ``IterationStats()``
  only when the batch has request outputs (else None), then ``record(engine_idx=
  outputs.engine_index, scheduler_stats=outputs.scheduler_stats, iteration_stats=...,
  mm_cache_stats=...)``; ``scheduler_stats`` is None in a batch that carries none (with several
  API servers the engine sends them to one front end only).
- vllm/v1/metrics/stats.py: ``SchedulerStats``, ``PrefixCacheStats``, ``PromptTokenStats``,
  ``IterationStats``, ``FinishedRequestStats``; vllm/compilation/cuda_graph.py ``CUDAGraphStat``;
  vllm/v1/metrics/perf.py ``PerfStats``; vllm/v1/spec_decode/metrics.py ``SpecDecodingStats``:
  the stand-ins below have their field names and defaults.
"""

from __future__ import annotations

import abc
import importlib
import logging
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import gpuchef.vllm_plugin as plugin_pkg
from gpuchef.probes.plugin_reader import PluginReader
from gpuchef.vllm_plugin import GpuchefStatLoggerCore, parse_publish
from gpuchef.vllm_plugin.publisher import ConfigError, config_from_env

ROOT = Path(__file__).resolve().parents[2]
LOGGER = "vllm.gpuchef_plugin"
#: every record() must return within this, whatever the reader does (typical: 20-150 us)
RECORD_BOUND_S = 0.1


# -- vLLM 0.24's stats objects (field names and defaults as in its source) -----------------------
@dataclass
class PrefixCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


@dataclass
class SpecDecodingStats:
    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list = field(default_factory=list)
    num_draft_tokens_per_pos: list = field(default_factory=list)


@dataclass(frozen=True)
class CUDAGraphStat:
    num_unpadded_tokens: int
    num_padded_tokens: int
    num_paddings: int
    runtime_mode: str


@dataclass
class PerfStats:
    num_flops_per_gpu: int = 0
    num_read_bytes_per_gpu: int = 0
    num_write_bytes_per_gpu: int = 0
    debug_stats: object = None


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    step_counter: int = 0
    current_wave: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    connector_prefix_cache_stats: PrefixCacheStats | None = None
    kv_cache_eviction_events: list = field(default_factory=list)
    spec_decoding_stats: SpecDecodingStats | None = None
    kv_connector_stats: dict | None = None
    waiting_lora_adapters: dict = field(default_factory=dict)
    running_lora_adapters: dict = field(default_factory=dict)
    cudagraph_stats: CUDAGraphStat | None = None
    perf_stats: PerfStats | None = None


@dataclass
class FinishedRequestStats:
    finish_reason: str
    request_id: str | None = None
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0


@dataclass
class PromptTokenStats:
    computed: int = 0
    local_cache_hit: int = 0
    external_kv_transfer: int = 0
    cached_tokens: int = 0
    total: int = 0


class IterationStats:
    def __init__(self):
        self.iteration_timestamp = time.time()
        self.num_generation_tokens = 0
        self.prompt_token_stats = PromptTokenStats()
        self.num_preempted_reqs = 0
        self.finished_requests: list[FinishedRequestStats] = []
        self.max_num_generation_tokens_iter: list[int] = []
        self.n_params_iter: list[int] = []
        self.time_to_first_tokens_iter: list[float] = []
        self.inter_token_latencies_iter: list[float] = []
        self.num_corrupted_reqs: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return self.prompt_token_stats.total


@dataclass
class EngineCoreOutputs:
    """What the front end pulls: one engine's output batch (the fields the host reads)."""

    engine_index: int
    num_outputs: int
    scheduler_stats: SchedulerStats | None


def make_batch(engine: int, step: int) -> tuple[EngineCoreOutputs, IterationStats | None]:
    """A varied batch: stats-only batches (no request output: no IterationStats), batches without
    SchedulerStats, with and without cudagraph/perf/spec stats."""
    k = step * 2 + engine
    sched = None
    if step % 7 != 3:
        sched = SchedulerStats(
            num_running_reqs=k % 13, num_waiting_reqs=k % 5, num_skipped_waiting_reqs=k % 2,
            step_counter=step, kv_cache_usage=(k % 100) / 100,
            prefix_cache_stats=PrefixCacheStats(requests=k % 3, queries=10 * k, hits=3 * k,
                                                reset=(k == 4)))
        if step % 2 == 0:
            sched.cudagraph_stats = CUDAGraphStat(num_unpadded_tokens=k, num_padded_tokens=k + 3,
                                                  num_paddings=3, runtime_mode="FULL")
        if step % 3 == 0:
            sched.perf_stats = PerfStats(num_flops_per_gpu=10**12 + k, num_read_bytes_per_gpu=2 * k,
                                         num_write_bytes_per_gpu=k)
        if step % 5 == 0:
            sched.spec_decoding_stats = SpecDecodingStats(num_spec_tokens=3, num_drafts=k,
                                                          num_draft_tokens=3 * k,
                                                          num_accepted_tokens=2 * k)
    n_out = 0 if step % 4 == 2 else 1 + k % 6
    it = None
    if n_out:
        it = IterationStats()
        it.num_generation_tokens = n_out
        it.prompt_token_stats = PromptTokenStats(computed=100 + k, cached_tokens=16,
                                                 local_cache_hit=16, total=116 + k)
        it.num_preempted_reqs = k % 2
        it.time_to_first_tokens_iter = [0.001 * k, 0.5]
        it.inter_token_latencies_iter = [0.01 + 0.001 * i for i in range(n_out)]
        it.finished_requests = [FinishedRequestStats("stop")] * (k % 3)
    return EngineCoreOutputs(engine, n_out, sched), it


def expected(engine: int, seq: int, out: EngineCoreOutputs, it: IterationStats | None) -> dict:
    """What the reader must see, written from the stand-ins (not from the plugin's code)."""
    s = out.scheduler_stats
    exp = {"engine_idx": engine, "seq": seq, "has_sched": s is not None, "has_iter": it is not None}
    if s is not None:
        exp.update(running=s.num_running_reqs, waiting=s.num_waiting_reqs,
                   skipped_waiting=s.num_skipped_waiting_reqs, kv_usage=s.kv_cache_usage,
                   prefix_requests=s.prefix_cache_stats.requests,
                   prefix_queries=s.prefix_cache_stats.queries,
                   prefix_hits=s.prefix_cache_stats.hits, prefix_reset=s.prefix_cache_stats.reset)
        cg, perf, sd = s.cudagraph_stats, s.perf_stats, s.spec_decoding_stats
        exp.update(
            cg_mode=cg and cg.runtime_mode, cg_unpadded_tokens=cg and cg.num_unpadded_tokens,
            cg_padded_tokens=cg and cg.num_padded_tokens, cg_paddings=cg and cg.num_paddings,
            flops_per_gpu=perf and perf.num_flops_per_gpu,
            read_bytes_per_gpu=perf and perf.num_read_bytes_per_gpu,
            write_bytes_per_gpu=perf and perf.num_write_bytes_per_gpu,
            spec_drafts=sd and sd.num_drafts, spec_draft_tokens=sd and sd.num_draft_tokens,
            spec_accepted_tokens=sd and sd.num_accepted_tokens)
    else:
        exp.update(running=None, waiting=None, kv_usage=None, cg_mode=None, flops_per_gpu=None)
    if it is not None:
        exp.update(iter_ts=it.iteration_timestamp, prompt_tokens=it.num_prompt_tokens,
                   prompt_computed=it.prompt_token_stats.computed,
                   prompt_cached=it.prompt_token_stats.cached_tokens,
                   generation_tokens=it.num_generation_tokens, preempted=it.num_preempted_reqs,
                   ttfts=it.time_to_first_tokens_iter, itls=it.inter_token_latencies_iter,
                   finished=len(it.finished_requests))
    else:
        exp.update(iter_ts=None, prompt_tokens=0, generation_tokens=0, preempted=0, ttfts=[],
                   itls=[], finished=0)
    return exp


# -- vLLM 0.24's loader and manager, as far as a plugin sees them ---------------------------------
def fake_vllm_loggers_module() -> types.ModuleType:
    mod = types.ModuleType("vllm.v1.metrics.loggers")

    class StatLoggerBase(abc.ABC):
        @abc.abstractmethod
        def __init__(self, vllm_config, engine_index: int = 0): ...

        @abc.abstractmethod
        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
                   engine_idx: int = 0): ...

        @abc.abstractmethod
        def log_engine_initialized(self): ...

        def log(self):  # noqa
            pass

        def record_sleep_state(self, is_awake: int, level: int):  # noqa
            pass

    class AggregateStatLoggerBase(StatLoggerBase):
        @abc.abstractmethod
        def __init__(self, vllm_config, engine_indexes: list[int]): ...

    mod.StatLoggerBase = StatLoggerBase
    mod.AggregateStatLoggerBase = AggregateStatLoggerBase
    return mod


class FakeHost:
    """vLLM 0.24's AsyncLLM front end as far as stat loggers go: the plugin check and the
    StatLoggerManager's construction, then one record() per engine output batch."""

    def __init__(self, plugin_cls, engine_indexes, loggers_mod=None, vllm_config=None):
        self.engine_indexes = list(engine_indexes)
        if loggers_mod is not None:  # load_stat_logger_plugin_factories
            if not isinstance(plugin_cls, type) or not issubclass(plugin_cls,
                                                                  loggers_mod.StatLoggerBase):
                raise TypeError(f"Stat logger plugin must be a subclass of StatLoggerBase")
        agg = getattr(loggers_mod, "AggregateStatLoggerBase", None)
        if loggers_mod is None or (agg is not None and issubclass(plugin_cls, agg)):
            self.loggers = {None: plugin_cls(vllm_config=vllm_config,
                                             engine_indexes=self.engine_indexes)}
        else:  # PerEngineStatLoggerAdapter
            self.loggers = {e: plugin_cls(vllm_config, e) for e in self.engine_indexes}
        for lg in self.loggers.values():
            lg.log_engine_initialized()

    @property
    def instances(self):
        return list(self.loggers.values())

    def output(self, out: EngineCoreOutputs, it: IterationStats | None) -> float:
        """The output handler's step 4; returns how long record() took."""
        lg = self.loggers.get(None) or self.loggers[out.engine_index]
        t = time.perf_counter()
        lg.record(engine_idx=out.engine_index, scheduler_stats=out.scheduler_stats,
                  iteration_stats=it if out.num_outputs else None, mm_cache_stats=None)
        return time.perf_counter() - t

    def close(self):
        for lg in self.loggers.values():
            lg.close()


@pytest.fixture
def publish_env(monkeypatch):
    for k in ("GPUCHEF_PUBLISH", "GPUCHEF_PUBLISH_ALLOW_REMOTE", "GPUCHEF_PUBLISH_HWM"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GPUCHEF_PUBLISH", "127.0.0.1:0")
    return monkeypatch


@pytest.fixture
def hosts():
    made = []
    yield made
    for h in made:
        h.close()


def plugin_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno >= logging.WARNING]


def drain(reader: PluginReader, want: int, timeout_s: float = 10.0) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += reader.poll(0.05)
    got += reader.poll(0.2)  # anything beyond ``want`` shows up too
    return got


# -- the records -----------------------------------------------------------------------------
def test_two_engines_records_arrive_exactly(publish_env, hosts):
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0, 1])
    hosts.append(host)
    (plugin,) = host.instances
    assert plugin.endpoint.startswith("tcp://127.0.0.1:")
    with PluginReader(plugin.endpoint) as reader:
        assert plugin.publisher.wait_for_readers(1, 10)
        sent = {0: [], 1: []}
        pid = os.getpid()
        t0_ns = time.time_ns()
        for step in range(40):
            for engine in (1, 0):  # the engines' batches interleave
                out, it = make_batch(engine, step)
                sent[engine].append(expected(engine, len(sent[engine]), out, it))
                host.output(out, it)
        t1_ns = time.time_ns()
        got = drain(reader, 80)
    assert len(got) == 80
    for engine in (0, 1):
        recs = [g for g in got if g.record.engine_idx == engine]
        assert [g.record.seq for g in recs] == list(range(40))
        assert all(g.gap == 0 and g.dropped == 0 for g in recs)
        for g, exp in zip(recs, sent[engine]):
            r = g.record
            assert r.v == 1 and r.pid == pid and r.pub == plugin.publisher.pub_id
            assert t0_ns <= r.t_ns <= t1_ns and r.mono_ns > 0
            for name, value in exp.items():
                assert getattr(r, name) == value, (engine, r.seq, name)
    # the optional objects did show up, and were absent where vLLM gave none
    recs = [g.record for g in got]
    assert any(r.cg_mode == "FULL" for r in recs) and any(r.cg_mode is None for r in recs)
    assert any(r.flops_per_gpu for r in recs) and any(r.spec_drafts for r in recs)
    assert any(not r.has_iter for r in recs) and any(not r.has_sched for r in recs)
    snap = reader.snapshot()
    assert {k[1]: st.received for k, st in snap.streams.items()} == {0: 40, 1: 40}
    assert snap.totals()["missing"] == 0


def test_no_reader_counts_unread_and_never_waits(publish_env, hosts):
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0, 1])
    hosts.append(host)
    pub = host.instances[0].publisher
    took = [host.output(*make_batch(i % 2, i // 2)) for i in range(2000)]
    assert max(took) < RECORD_BOUND_S
    assert pub.published == 2000 and pub.unread == 2000 and pub.dropped == 0


def test_stalled_reader_drops_are_counted_exactly(publish_env, hosts):
    """A reader that registers and then reads nothing (tiny queues both sides): record() keeps
    returning at once, and when the reader reads again, what it got plus what the publisher
    counted as dropped is every record, per engine, and the gaps it sees are those drops."""
    publish_env.setenv("GPUCHEF_PUBLISH_HWM", "16")
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0, 1])
    hosts.append(host)
    (plugin,) = host.instances
    pub = plugin.publisher
    n = 12_000
    with PluginReader(plugin.endpoint, rcvhwm=8, rcvbuf=4096) as reader:
        assert pub.wait_for_readers(1, 10)
        took = []
        for i in range(n):
            out, it = make_batch(i % 2, i // 2)
            it = it or IterationStats()
            it.inter_token_latencies_iter = [0.01] * 64  # ~0.7 KB a record: the buffers fill
            out.num_outputs = max(out.num_outputs, 1)
            took.append(host.output(out, it))
        assert max(took) < RECORD_BOUND_S, max(took)
        assert statistics.median(took) < 0.002
        (drops,) = pub.reader_drops().values()
        assert pub.dropped == drops[0] + drops[1] > 0
        got = drain(reader, n - pub.dropped)
        assert len(got) == n - pub.dropped
        # one more record per engine carries the last drops out
        for engine in (0, 1):
            host.output(*make_batch(engine, 0))
        got += drain(reader, 2)
    assert len(got) == n - pub.dropped + 2
    for engine in (0, 1):
        recs = [g for g in got if g.record.engine_idx == engine]
        assert recs[-1].record.seq == n // 2  # the last one made
        assert recs[-1].dropped == drops[engine]
        assert sum(g.gap for g in recs) == sum(g.gap_dropped for g in recs) == drops[engine]
        assert len(recs) + drops[engine] == n // 2 + 1
    snap = reader.snapshot()
    assert snap.totals()["unexplained"] == 0
    assert snap.totals()["reported_dropped"] == pub.dropped


def test_one_stalled_reader_costs_the_other_nothing(publish_env, hosts):
    """Default queue (1000 records a reader): the stalled reader loses records, the one that
    reads loses none."""
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0])
    hosts.append(host)
    (plugin,) = host.instances
    with PluginReader(plugin.endpoint, rcvhwm=8, rcvbuf=4096) as stalled, \
            PluginReader(plugin.endpoint) as live:
        assert plugin.publisher.wait_for_readers(2, 10)
        got = []
        for i in range(8000):
            out, it = make_batch(0, i)
            it = it or IterationStats()
            it.inter_token_latencies_iter = [0.01] * 64
            out.num_outputs = 1
            host.output(out, it)
            if i % 50 == 0:
                got += live.poll(0)
        got += drain(live, 8000 - len(got))
        drops = plugin.publisher.reader_drops()
        assert len(got) == 8000 and [g.record.seq for g in got] == list(range(8000))
        assert sorted(d.get(0, 0) for d in drops.values())[0] == 0  # the live one lost nothing
        assert plugin.publisher.dropped > 0  # the stalled one did
        del stalled


# -- going quiet -----------------------------------------------------------------------------
def test_stats_missing_a_field_one_line_then_quiet(publish_env, hosts, caplog):
    """SchedulerStats of an older vLLM (``gpu_cache_usage``, no ``kv_cache_usage``): one log line,
    nothing published after it, record() never raises, the port is let go."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0, 1])
    hosts.append(host)
    (plugin,) = host.instances
    endpoint = plugin.endpoint
    with PluginReader(endpoint) as reader:
        assert plugin.publisher.wait_for_readers(1, 10)
        for step in range(3):
            host.output(*make_batch(0, step * 4))
        old = types.SimpleNamespace(num_running_reqs=1, num_waiting_reqs=0, gpu_cache_usage=0.3)
        host.output(EngineCoreOutputs(1, 0, old), None)
        for step in range(50):  # well-formed again: still quiet
            host.output(*make_batch(step % 2, step))
        got = drain(reader, 3)
    assert [g.record.seq for g in got] == [0, 1, 2]
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "kv_cache_usage" in lines[0] and "record()" in lines[0]
    assert plugin.quiet and plugin.publisher is None
    port = int(endpoint.rsplit(":", 1)[1])
    with socket.socket() as s:  # nothing listens on the port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_iteration_stats_of_another_shape_one_line_then_quiet(publish_env, hosts, caplog):
    """IterationStats without ``inter_token_latencies_iter`` (vLLM 0.7 called its list
    ``time_per_output_tokens_iter``)."""
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0])
    hosts.append(host)
    (plugin,) = host.instances
    old = types.SimpleNamespace(iteration_timestamp=time.time(), num_prompt_tokens=3,
                                num_generation_tokens=1, num_preempted_reqs=0,
                                time_to_first_tokens_iter=[0.1], time_per_output_tokens_iter=[],
                                finished_requests=[])
    for _ in range(5):
        assert plugin.record(SchedulerStats(), old, None, 0) is None
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "inter_token_latencies_iter" in lines[0]
    assert plugin.quiet


def test_socket_error_one_line_then_quiet(publish_env, hosts, caplog):
    import zmq

    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0, 1])
    hosts.append(host)
    (plugin,) = host.instances
    pub = plugin.publisher
    host.output(*make_batch(0, 0))
    pub._sock.close(linger=0)  # the socket breaks under the plugin
    for step in range(20):
        host.output(*make_batch(step % 2, step))
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "ZMQError" in lines[0], lines
    assert plugin.quiet and pub.closed


def test_a_send_error_one_line_then_quiet(publish_env, hosts, caplog):
    import errno

    import zmq

    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0])
    hosts.append(host)
    (plugin,) = host.instances
    with PluginReader(plugin.endpoint) as reader:
        assert plugin.publisher.wait_for_readers(1, 10)

        class Broken:
            def __init__(self, sock):
                self._s = sock

            def __getattr__(self, name):
                return getattr(self._s, name)

            def send_multipart(self, *a, **k):
                raise zmq.ZMQError(errno.ENOBUFS)

        plugin.publisher._sock = Broken(plugin.publisher._sock)
        for step in range(10):
            host.output(*make_batch(0, step))
        assert reader.poll(0.2) == []
    assert len(plugin_lines(caplog)) == 1 and plugin.quiet


def test_bind_conflict_one_line_then_quiet(publish_env, hosts, caplog):
    """Port taken (a second API-server process, another program): one line, and vLLM goes on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        publish_env.setenv("GPUCHEF_PUBLISH", f"127.0.0.1:{s.getsockname()[1]}")
        host = FakeHost(plugin_pkg.GpuchefStatLogger, [0])
        hosts.append(host)
        for step in range(5):
            host.output(*make_batch(0, step))
    (plugin,) = host.instances
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "binding tcp://127.0.0.1:" in lines[0]
    assert plugin.quiet and plugin.endpoint is None


# -- off, refused, settings ------------------------------------------------------------------
def test_env_var_off_binds_and_imports_nothing():
    code = textwrap.dedent("""
        import sys, time
        import gpuchef.vllm_plugin as p
        lg = p.GpuchefStatLogger(vllm_config=None, engine_indexes=[0, 1])
        lg.log_engine_initialized()
        lg.record(None, None, None, 0); lg.log()
        assert lg.publisher is None and lg.endpoint is None and not lg.quiet
        bad = [m for m in sys.modules if m.split('.')[0] in ('zmq', 'msgspec', 'torch', 'textual')]
        assert not bad, bad
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCHEF_PUBLISH")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_import_is_light():
    """import gpuchef.vllm_plugin, and even a publishing logger, import no torch, Textual or the
    rest of gpuchef (only stdlib, pyzmq, msgspec, the wire module and the one error class, whose
    packages' __init__ files import nothing)."""
    code = textwrap.dedent("""
        import os, sys
        os.environ["GPUCHEF_PUBLISH"] = "127.0.0.1:0"
        import gpuchef.vllm_plugin
        assert not [m for m in sys.modules if m.split('.')[0] in ('torch', 'textual', 'vllm')]
        lg = gpuchef.vllm_plugin.GpuchefStatLogger(vllm_config=None, engine_indexes=[0])
        lg.record(None, None, None, 0)
        assert lg.endpoint and lg.publisher.published == 1
        heavy = [m for m in sys.modules
                 if m.split('.')[0] in ('torch', 'textual', 'numpy', 'rich', 'vllm', 'aiohttp')]
        ours = sorted(m for m in sys.modules if m.startswith('gpuchef'))
        assert not heavy, heavy
        assert ours == ['gpuchef', 'gpuchef.engine_host', 'gpuchef.engine_host.vocab',
                        'gpuchef.engine_host.vocab.errors', 'gpuchef.probes',
                        'gpuchef.probes.plugin_wire', 'gpuchef.vllm_plugin',
                        'gpuchef.vllm_plugin.logger', 'gpuchef.vllm_plugin.publisher'], ours
        lg.close()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("value", ["0.0.0.0:5557", "10.1.2.3:5557", "example.com:80", "*:5557"])
def test_non_loopback_refused_without_allow_remote(publish_env, hosts, caplog, value):
    publish_env.setenv("GPUCHEF_PUBLISH", value)
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0])
    hosts.append(host)
    host.output(*make_batch(0, 0))
    (plugin,) = host.instances
    lines = plugin_lines(caplog)
    assert len(lines) == 1 and "not a loopback address" in lines[0]
    assert "GPUCHEF_PUBLISH_ALLOW_REMOTE=1" in lines[0]
    assert plugin.endpoint is None and plugin.quiet


def test_allow_remote_lets_a_non_loopback_host_through():
    cfg = config_from_env({"GPUCHEF_PUBLISH": "0.0.0.0:5557", "GPUCHEF_PUBLISH_ALLOW_REMOTE": "1"})
    assert cfg.host == "0.0.0.0" and cfg.port == 5557 and cfg.endpoint == "tcp://0.0.0.0:5557"
    with pytest.raises(ConfigError):
        config_from_env({"GPUCHEF_PUBLISH": "0.0.0.0:5557", "GPUCHEF_PUBLISH_ALLOW_REMOTE": "yes"})


@pytest.mark.parametrize("value", ["127.0.0.1", "127.0.0.1:http", "127.0.0.1:70000", ":5557",
                                   "::1:5557", "[::1]5557"])
def test_bad_values_one_line_and_off(publish_env, hosts, caplog, value):
    publish_env.setenv("GPUCHEF_PUBLISH", value)
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0])
    hosts.append(host)
    host.output(*make_batch(0, 0))
    assert len(plugin_lines(caplog)) == 1
    assert host.instances[0].endpoint is None


def test_bad_hwm_one_line_and_off(publish_env, hosts, caplog):
    publish_env.setenv("GPUCHEF_PUBLISH_HWM", "lots")
    host = FakeHost(plugin_pkg.GpuchefStatLogger, [0])
    hosts.append(host)
    assert len(plugin_lines(caplog)) == 1 and host.instances[0].endpoint is None


def test_parse_publish():
    assert parse_publish("localhost:5557").endpoint == "tcp://127.0.0.1:5557"
    assert parse_publish("tcp://127.0.0.1:5557").port == 5557
    assert parse_publish("127.0.0.2:1").host == "127.0.0.2"
    six = parse_publish("[::1]:5557")
    assert six.host == "::1" and six.endpoint == "tcp://[::1]:5557"
    assert config_from_env({}) is None and config_from_env({"GPUCHEF_PUBLISH": "  "}) is None


# -- how vLLM finds and makes it -------------------------------------------------------------
def entry_point_object():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    value = meta["project"]["entry-points"]["vllm.stat_logger_plugins"]["gpuchef"]
    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_loaded_as_vllm_0_24_loads_it(publish_env, hosts, monkeypatch):
    """With vLLM's loggers module loaded (as when vLLM loads the entry point), the entry point's
    class subclasses AggregateStatLoggerBase: vLLM's check passes, no abstract method is left,
    and it is made once for both engines with keyword arguments."""
    mod = fake_vllm_loggers_module()
    for name in ("vllm", "vllm.v1", "vllm.v1.metrics"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.metrics.loggers", mod)
    cls = entry_point_object()
    assert issubclass(cls, mod.AggregateStatLoggerBase) and issubclass(cls, GpuchefStatLoggerCore)
    assert not getattr(cls, "__abstractmethods__", None)
    assert entry_point_object() is cls  # made once per base
    host = FakeHost(cls, [0, 1], loggers_mod=mod)
    hosts.append(host)
    (plugin,) = host.instances
    assert plugin.engine_indexes == [0, 1]
    with PluginReader(plugin.endpoint) as reader:
        assert plugin.publisher.wait_for_readers(1, 10)
        for step in range(5):
            for engine in (0, 1):
                host.output(*make_batch(engine, step))
        plugin.record_sleep_state(1, 1)
        plugin.log()
        got = drain(reader, 10)
    assert sorted((g.record.engine_idx, g.record.seq) for g in got) == \
        [(e, s) for e in (0, 1) for s in range(5)]


def test_without_vllm_it_is_the_plain_class(monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm.v1.metrics.loggers", raising=False)
    monkeypatch.delitem(sys.modules, "vllm.plugins", raising=False)
    cls = entry_point_object()
    assert cls.__mro__[1:] == (GpuchefStatLoggerCore, object)


def test_per_engine_construction_shares_one_publisher(publish_env, hosts, monkeypatch):
    """A vLLM whose base has no AggregateStatLoggerBase makes the class once per engine,
    ``cls(vllm_config, engine_index)``: both instances publish through one socket, each engine
    with its own sequence."""
    mod = fake_vllm_loggers_module()
    del mod.AggregateStatLoggerBase
    monkeypatch.setitem(sys.modules, "vllm.v1.metrics.loggers", mod)
    cls = plugin_pkg.stat_logger_class()
    assert issubclass(cls, mod.StatLoggerBase)
    host = FakeHost(cls, [0, 1], loggers_mod=mod)
    hosts.append(host)
    a, b = host.instances
    assert (a.engine_indexes, b.engine_indexes) == ([0], [1])
    assert a.publisher is b.publisher
    with PluginReader(a.endpoint) as reader:
        assert a.publisher.wait_for_readers(1, 10)
        for step in range(6):
            for engine in (0, 1):
                host.output(*make_batch(engine, step))
        got = drain(reader, 12)
    for engine in (0, 1):
        assert [g.record.seq for g in got if g.record.engine_idx == engine] == list(range(6))
    a.close()
    assert not b.publisher.closed  # still used by b
