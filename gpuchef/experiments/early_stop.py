"""Early stop of a capacity probe: as the probe runs, decide when an SLO is broken *beyond
doubt* (whatever the requests still to come do, the statistic cannot come back under its
limit), so the probe stops and saves device time (``gpuchef ab --capacity``, docs/capacity.md).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..engine_host.vocab.workload import PROBE_ID_PREFIX
from ..probes.metrics import is_completed


class EarlyStop:
    """Decides, as a probe runs, when an SLO is broken *beyond doubt*: whatever the requests
    still to come do, the statistic cannot come back under its limit — so the probe can stop
    and save device time.

    ``slos``: the SLOs (``capacity.SLO``); ``arrivals_ns``/``output_lens``: each (non-probe)
    request's arrival (monotonic ns; :meth:`start` shifts offsets by the load's t0) and output
    length, so the
    final number of values is known in advance — requests (TTFT, E2EL), requests with > 1
    output token (TPOT), token gaps Σ(len − 1) (ITL: an upper bound when chunks carry several
    tokens, which only makes the test stricter). For P_q over N values (linear interpolation
    at h = q/100·(N − 1)) the statistic exceeds L once k ≥ N − ⌊h⌋ values are known to exceed
    it; a mean once the values so far sum to more than N·L (values are ≥ 0).

    Values known to exceed L at time t: those measured (a TTFT at a first token, a gap at a
    token, a TPOT or E2EL at a finish) and those still open — a request that arrived before
    t − L without its first token (TTFT) or without finishing (E2EL), a running request whose
    last token is older than t − L (ITL). Feed :meth:`on_output` (each StepOutput) and
    :meth:`on_request` (each finished RequestRecord); both return the reason once, else ""."""

    CHECK_EVERY_NS = 200_000_000  # the open-value scan: at most every 0.2 s of engine time

    def __init__(self, slos: Sequence[Any], output_lens: Sequence[int],
                 arrivals_ns: Sequence[int] = (), ids: Sequence[str] = ()) -> None:
        n = len(output_lens)
        self.total = {"ttft": n, "e2el": n, "tpot": sum(1 for x in output_lens if x > 1),
                      "itl": sum(max(0, x - 1) for x in output_lens)}
        self.slos = list(slos)
        self.over = {s.key: 0 for s in slos}
        self.sums = {s.key: 0.0 for s in slos}
        self.reason = ""
        self._off = sorted(zip(arrivals_ns, ids)) if ids else []
        self._arr = {rid: t for t, rid in self._off}
        self.t0_ns = 0
        self._last: dict[str, int] = {}     # running request → its last token time
        self._first: set[str] = set()       # requests with a first token
        self._done: set[str] = set()
        self._checked = 0
        self._limit = {s.metric: s.limit_ms for s in slos}

    def start(self, t0_ns: int) -> None:
        """The load's clock origin: arrivals given as offsets count from it."""
        self.t0_ns = int(t0_ns)

    def _need(self, s: Any) -> float:
        n = self.total[s.metric]
        q = 50.0 if s.stat == "median" else s.percentile
        return n - math.floor(q / 100.0 * (n - 1)) if n else math.inf

    def _judge(self, open_over: dict[str, int]) -> str:
        for s in self.slos:
            n = self.total[s.metric]
            if s.stat == "mean":
                if n > 0 and self.sums[s.key] > n * s.limit_ms:
                    self.reason = (f"{s.key} > {s.limit_ms:g} ms certain (the values so far "
                                   f"sum to more than {n} × {s.limit_ms:g} ms)")
            else:
                k = self.over[s.key] + open_over.get(s.metric, 0)
                if k >= self._need(s):
                    self.reason = (f"{s.key} > {s.limit_ms:g} ms certain ({k} of {n} values "
                                   f"already > {s.limit_ms:g} ms)")
            if self.reason:
                return self.reason
        return ""

    def _count(self, metric: str, v: float) -> None:
        for s in self.slos:
            if s.metric == metric:
                self.sums[s.key] += v
                if v > s.limit_ms:
                    self.over[s.key] += 1

    def on_output(self, out: Any) -> str:
        if self.reason:
            return ""
        t = out.t_ns
        for rid, arr, _ in out.first_tokens:
            if rid in self._arr:
                self._first.add(rid)
                self._count("ttft", (t - arr) / 1e6)
        for rid, _ in out.tokens:
            if rid not in self._arr:
                continue
            prev = self._last.get(rid)
            if prev is not None and t != prev:  # one ITL per chunk, as summarize counts them
                self._count("itl", (t - prev) / 1e6)
            self._last[rid] = t
        if t - self._checked < self.CHECK_EVERY_NS:
            return ""
        self._checked = t
        return self._judge(self._open(t))

    def _open(self, t: int) -> dict[str, int]:
        out: dict[str, int] = {}
        lim = self._limit
        if "itl" in lim:
            cut = t - int(lim["itl"] * 1e6)
            out["itl"] = sum(1 for rid, x in self._last.items() if x < cut)
        for metric, seen in (("ttft", self._first), ("e2el", self._done)):
            if metric in lim:
                cut = t - int(lim[metric] * 1e6) - self.t0_ns
                k = 0
                for a, rid in self._off:
                    if a >= cut:
                        break
                    k += rid not in seen
                out[metric] = k
        return out

    def on_request(self, r: Any) -> str:
        if self.reason or str(r.request_id).startswith(PROBE_ID_PREFIX):
            return ""
        rid = r.request_id
        self._done.add(rid)
        self._last.pop(rid, None)
        if not is_completed(r.finish_reason) or not r.token_times_ns:
            return ""
        if rid not in self._arr:  # no StepOutput stream: take the record's values
            self._count("ttft", r.ttft_ms)
            for g in r.itls_ms:
                self._count("itl", g)
        if r.output_len > 1:
            self._count("tpot", (r.e2el_ms - r.ttft_ms) / (r.output_len - 1))
        self._count("e2el", r.e2el_ms)
        return self._judge({})
