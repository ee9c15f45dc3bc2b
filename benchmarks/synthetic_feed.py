"""A fake engine for measuring the dashboard at a GPU's step rate on a CPU machine.

``SyntheticFeed(session, steps_per_s)`` drives a real :class:`gpuchef.sessions.live.LiveSession` (its
engine is built but never started) with made-up but realistic records: a thread emits one
StepRecord every ``1 / steps_per_s`` s and a RequestRecord (with a token time per decode step)
for every request that finishes, one RecordBatch a step to the session host's sinks — the same
path (Timeline + trace recorder) the real engine thread takes. GPUs come
from the session's NVML sampler (give it ``nvml=FakeNvml(2)``): the feed sets their GPM load so
that the GPU panels are not empty.

The model: requests arrive as a Poisson stream of ``req_rate`` req/s with prompts and outputs
drawn around ``prompt_len`` / ``output_len``; chunked prefill with a ``budget`` token budget,
every running request decodes one token per step; the engine is busy ``busy`` of each step
period (``gpu_ms``). With the defaults at 140 steps/s this looks like llama-3-8b on the H200
(benchmarks/results/2026-11-29-h200x2): ~30–60 running requests, a few thousand output tok/s.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from gpuchef.engine_host.sinks import RecordBatch
from gpuchef.engine_host.vocab.records import RequestRecord, StepRecord


def chunk_prefills(queue, budget: int) -> list:
    """Chunked prefill's split of a step's token ``budget`` (what is left after the decode
    rows): the requests of ``queue`` (in order) whose prompt is not all computed get chunks
    until the budget is spent; each one's ``prefilled`` advances. Returns (request, chunk)
    pairs."""
    out = []
    for q in queue:
        if budget <= 0:
            break
        if q.prefilled < q.prompt:
            c = min(budget, q.prompt - q.prefilled)
            q.prefilled += c
            budget -= c
            out.append((q, c))
    return out


@dataclass
class _Req:
    rid: str
    arrival_ns: int
    prompt: int
    out: int
    prefilled: int = 0
    times: list[int] = field(default_factory=list)


class SyntheticFeed:
    def __init__(self, session, steps_per_s: float, *, req_rate: float = 6.0,
                 prompt_len: int = 1000, output_len: int = 250, budget: int = 2048,
                 busy: float = 0.84, kv_blocks_total: int = 54915, seed: int = 0,
                 nvml=None) -> None:
        self.fake_nvml = nvml  # the FakeNvml the session samples, if any (its load is set)
        self.s = session
        self.period_ns = int(1e9 / steps_per_s)
        self.req_rate = req_rate
        self.prompt_len, self.output_len = prompt_len, output_len
        self.budget = budget
        self.busy = busy
        self.kv_total = kv_blocks_total
        self.rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.requests = 0

    def start(self) -> "SyntheticFeed":
        s = self.s
        s.nvml.start()
        if s.host_probe is not None:
            s.host_probe.start()
        fake = self.fake_nvml
        for g in range(getattr(fake, "n_gpus", 0)):
            fake.set_load(g, sm_active=70 - 5 * g, sm_occupancy=40, tensor_active=45,
                          dram_bw_util=60)
        self._thread = threading.Thread(target=self._run, name="synthetic-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _new_req(self, now: int) -> _Req:
        r = self.rng
        self.requests += 1
        return _Req(f"syn-{self.requests}", now,
                    max(16, int(r.lognormvariate(0, 0.6) * self.prompt_len)),
                    max(2, int(r.expovariate(1 / self.output_len))))

    def _run(self) -> None:
        sinks = self.s.host.sinks
        cfg = self.s.host.scheduler_config
        period = self.period_ns
        waiting: list[_Req] = []
        running: list[_Req] = []
        t = time.monotonic_ns()
        next_arrival = t + int(self.rng.expovariate(self.req_rate) * 1e9)
        step = 0
        while not self._stop.is_set():
            t_start = t
            while next_arrival <= t_start:
                waiting.append(self._new_req(next_arrival))
                next_arrival += int(self.rng.expovariate(self.req_rate) * 1e9)
            t_end = t_start + int(period * 0.95)
            # decode: one token for each running request whose prompt is done
            dec = [q for q in running if q.prefilled >= q.prompt]
            budget = self.budget - len(dec)
            pre_tok = pre_reqs = 0
            for q, c in chunk_prefills(running + waiting, budget):
                pre_tok += c
                pre_reqs += 1
                if q in waiting:
                    waiting.remove(q)
                    running.append(q)
                if q.prefilled >= q.prompt:
                    q.times.append(t_end)  # the prefill's last chunk samples a token
            for q in dec:
                q.times.append(t_end)
            fin = [q for q in running if len(q.times) >= q.out]
            if fin:
                running = [q for q in running if len(q.times) < q.out]
            partial = sum(1 for q in running if q.prefilled < q.prompt)
            used = sum((q.prefilled + len(q.times)) // 16 + 1 for q in running)
            rec = StepRecord(step, t_start, t_end, period * self.busy / 1e6, cfg.mode,
                             cfg.max_num_batched_tokens, cfg.max_num_seqs,
                             cfg.long_prefill_token_threshold, cfg.max_num_partial_prefills,
                             pre_reqs, pre_tok, len(dec), partial, len(running), len(waiting), 0,
                             min(used, self.kv_total), self.kv_total, len(fin), True)
            # wait for the step's end, then publish as the engine thread does
            self._sleep_until(t_end)
            batch = RecordBatch([rec] + [
                RequestRecord(q.rid, q.arrival_ns, q.prompt, len(q.times), tuple(q.times),
                              "length", max_tokens=q.out) for q in fin])
            for s in sinks:
                s.record(batch)
            step += 1
            self.steps = step
            t = t_start + period
            if time.monotonic_ns() > t + 50 * period:  # fell far behind (paused): catch up
                t = time.monotonic_ns()
            self._sleep_until(t)

    def _sleep_until(self, t_ns: int) -> None:
        d = (t_ns - time.monotonic_ns()) / 1e9
        if d > 0:
            self._stop.wait(d)
