"""One request as the HTTP load client saw it (``ClientResult``: its times, chunks, tokens and
failure kind) and what a run's results become: ``RequestRecord``s for ``probes.metrics``
(``to_request_records``), failures counted and said by kind (``error_counts``,
``error_lines``), the client's punctuality (``lateness_stats``), vLLM's peaks
(``peak_stats``) and per-request arrays (``result_arrays``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..engine_host.vocab.records import RequestRecord

#: Error kinds, in the order ``error_lines`` prints them.
ERROR_KINDS: tuple[str, ...] = ("http", "refused", "connection", "timeout", "stream_cut",
                                "stream_error", "no_token", "bad_stream", "client")
_KIND_TEXT = {
    "refused": "connection refused",
    "connection": "connection failed",
    "timeout": "timed out",
    "stream_cut": "stream closed early (no [DONE])",
    "stream_error": "error in the stream",
    "no_token": "stream carried no token",
    "bad_stream": "stream not readable as SSE JSON",
    "client": "client error",
}


@dataclass
class ClientResult:
    """One request as the client saw it. Times are ``time.monotonic_ns()``.

    ``due_ns``: its scheduled send time (t0 + arrival_s); ``dispatch_ns``: when its task started
    (``dispatch_ns − due_ns`` is the client's lateness); ``start_ns``: when the POST was issued
    (after the concurrency semaphore: ``start_ns − dispatch_ns`` is vLLM's ``client_queue_time``).
    ``chunk_times_ns`` / ``chunk_tokens``: each chunk that carried tokens, and how many (1 when the
    server does not say). ``output_tokens``: from the usage chunk, else ``sum(chunk_tokens)``.
    ``prompt_len``: the server's ``prompt_tokens`` when it says, else the prompt's length.
    ``error_kind``: "" for success, else one of ``ERROR_KINDS``; ``status``: the HTTP status
    (0 before one was read); ``error``: one line, the server's message when it gave one.
    """

    request_id: str
    is_probe: bool
    prompt_len: int
    max_tokens: int
    due_ns: int = 0
    dispatch_ns: int = 0
    start_ns: int = 0
    end_ns: int = 0
    status: int = 0
    chunk_times_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    usage_output_tokens: int | None = None
    finish_reason: str = ""
    generated_text: str = ""
    error_kind: str = ""
    error: str = ""

    @property
    def success(self) -> bool:
        return not self.error_kind

    @property
    def output_tokens(self) -> int:
        if self.usage_output_tokens is not None:
            return self.usage_output_tokens
        return sum(self.chunk_tokens)

    @property
    def lateness_ms(self) -> float:
        return (self.dispatch_ns - self.due_ns) / 1e6

    @property
    def queue_time_s(self) -> float:
        return (self.start_ns - self.dispatch_ns) / 1e9

    @property
    def ttft_s(self) -> float:
        return (self.chunk_times_ns[0] - self.start_ns) / 1e9 if self.chunk_times_ns else 0.0

    @property
    def latency_s(self) -> float:
        return (self.chunk_times_ns[-1] - self.start_ns) / 1e9 if self.chunk_times_ns else 0.0

    @property
    def itls_s(self) -> list[float]:
        t = self.chunk_times_ns
        return [(t[i] - t[i - 1]) / 1e9 for i in range(1, len(t))]

    def fail(self, kind: str, message: str) -> None:
        self.error_kind = kind
        self.error = " ".join(str(message).split())[:300]


def _error_message(status: int, reason: str, body: bytes) -> str:
    """'HTTP 400 Bad Request: <the OpenAI-shaped error's message, or the body's start>'."""
    text = body.decode("utf-8", "replace").strip()
    msg = text
    try:
        obj = json.loads(text)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict):
            msg = str(err.get("message") or err.get("detail") or err)
        elif isinstance(err, str):
            msg = err
    except ValueError:
        pass
    head = f"HTTP {status} {reason or ''}".rstrip()
    return f"{head}: {msg}" if msg else head


def to_request_records(results: Sequence[ClientResult]) -> list[RequestRecord]:
    """ClientResults as RequestRecords for ``probes.metrics.summarize``: ``arrival_ns`` = the
    POST's start (vLLM's TTFT origin); a chunk of k tokens repeats its time k times in
    ``token_times_ns`` (RequestRecord's chunk convention: one ITL per chunk). When the usage
    total differs from the chunks' sum (a server that does not say per chunk), ``output_len``
    is the usage total and the times stay one per chunk. A failed request is finish_reason
    "error" with its message, no tokens, ``ended_ns`` when the failure was seen."""
    out = []
    for r in results:
        if r.success:
            times: list[int] = []
            for t, k in zip(r.chunk_times_ns, r.chunk_tokens):
                times.extend([t] * k)
            n_out = r.output_tokens
            reason = r.finish_reason if r.finish_reason in ("length", "stop") else "length"
            out.append(RequestRecord(r.request_id, r.start_ns, r.prompt_len, n_out, tuple(times),
                                     reason, max_tokens=r.max_tokens))
        else:
            out.append(RequestRecord(r.request_id, r.start_ns or r.dispatch_ns, r.prompt_len, 0,
                                     (), "error", max_tokens=r.max_tokens,
                                     error=f"{r.error_kind}: {r.error}", ended_ns=r.end_ns))
    return out


def _error_key(r: ClientResult) -> str:
    if r.error_kind == "http":
        return f"HTTP {r.status}"
    return _KIND_TEXT.get(r.error_kind, r.error_kind)


def error_counts(results: Sequence[ClientResult]) -> dict[str, int]:
    """Failed requests by kind ("HTTP 500", "connection refused", "timed out", ...), probes
    included."""
    order = {k: i for i, k in enumerate(ERROR_KINDS)}
    bad = sorted((r for r in results if not r.success),
                 key=lambda r: (order.get(r.error_kind, 99), r.status))
    return dict(Counter(_error_key(r) for r in bad))


def error_lines(results: Sequence[ClientResult]) -> list[str]:
    """One line per kind of failure: ``"7 requests: HTTP 500 — first: <message>"``."""
    first: dict[str, str] = {}
    for r in results:
        if not r.success:
            first.setdefault(_error_key(r), r.error)
    lines = []
    for key, n in error_counts(results).items():
        msg = first[key]
        lines.append(f"{n} request{'s' if n != 1 else ''}: {key} — first: {msg}" if msg
                     else f"{n} request{'s' if n != 1 else ''}: {key}")
    return lines


def lateness_stats(results: Sequence[ClientResult]) -> dict[str, float]:
    """The client's own punctuality (ms): each request's task start − its due time; p50, p99,
    max over the run (NaN with no requests)."""
    a = np.array([r.lateness_ms for r in results], dtype=np.float64)
    if not a.size:
        return {"p50": math.nan, "p99": math.nan, "max": math.nan}
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def peak_stats(results: Sequence[ClientResult]) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` (the most output tokens received in one 1-s bucket from
    the first request's start; a chunk of k counts k, where vLLM counts 1 per chunk) and
    ``max_concurrent_requests`` (the peak of successful requests in flight, [start, last chunk)),
    over the successful requests (vllm/benchmarks/serve.py ``calculate_metrics``)."""
    ok = [r for r in results if r.success and r.chunk_times_ns]
    if not ok:
        return 0.0, 0
    t_min = min(r.start_ns for r in ok)
    t_max = max(r.chunk_times_ns[-1] for r in ok)
    nb = int(math.ceil((t_max - t_min) / 1e9)) + 1
    buckets = np.zeros(nb)
    for r in ok:
        idx = ((np.asarray(r.chunk_times_ns, dtype=np.int64) - t_min) // 1_000_000_000).astype(int)
        inside = (idx >= 0) & (idx < nb)
        np.add.at(buckets, idx[inside], np.asarray(r.chunk_tokens)[inside])
    ev = sorted([(r.start_ns, 1) for r in ok] + [(r.chunk_times_ns[-1], -1) for r in ok])
    cur = peak = 0
    for _, d in ev:
        cur += d
        peak = max(peak, cur)
    return float(buckets.max()), peak


def result_arrays(results: Sequence[ClientResult]) -> dict[str, list]:
    """vLLM's per-request arrays (``--save-detailed``), over the load's requests (probes left
    out), in request order: ``input_lens``, ``output_lens`` (0 when failed), ``ttfts``,
    ``itls`` (lists), ``latencies``, ``start_times``, ``queue_times`` (seconds; monotonic clock,
    which is vLLM's ``perf_counter`` on Linux), ``generated_texts``, ``errors`` ("" when it
    succeeded); plus gpuchef's ``chunk_tokens`` (tokens per chunk, aligned with ``itls`` shifted
    by one: chunk 0 is the first token's) and ``lateness_ms``."""
    load = [r for r in results if not r.is_probe]
    return {
        "input_lens": [r.prompt_len for r in load],
        "output_lens": [r.output_tokens if r.success else 0 for r in load],
        "ttfts": [r.ttft_s if r.success else 0.0 for r in load],
        "itls": [r.itls_s if r.success else [] for r in load],
        "latencies": [r.latency_s if r.success else 0.0 for r in load],
        "start_times": [r.start_ns / 1e9 for r in load],
        "queue_times": [r.queue_time_s for r in load],
        "generated_texts": [r.generated_text for r in load],
        "errors": ["" if r.success else f"{_error_key(r)}: {r.error}" for r in load],
        "chunk_tokens": [list(r.chunk_tokens) if r.success else [] for r in load],
        "lateness_ms": [r.lateness_ms for r in load],
    }
