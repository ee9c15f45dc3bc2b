"""Requests arriving at the hosted engine: the rate per source over the last window and the HTTP
requests in flight. The one place the dashboard computes them; the header shows them.

Two sources feed a hosted engine: gpuchef's own load (its ``LoadState.submitted``, requests it
has sent so far) and, under `top --serve`, the HTTP front door, whose request ids start with
:data:`HTTP_ID_PREFIX`. The timeline holds a request only once it finished, so requests still
in flight are counted from the engine's queues: the newest StepRecord's running + waiting, plus
the requests gpuchef's load sent since that step (no step has counted them yet), are every
request in flight; gpuchef's own in flight are the ones it sent less the ones of its that
finished; HTTP's are the rest. An HTTP request that arrives while no step runs (the engine
paused) is counted from the next step on.

Each source's arrivals so far (HTTP: finished + in flight) are sampled on every
:meth:`ArrivalMeter.update`; the rate is the growth over the last ``window_s`` seconds (the
numbers' stats window) divided by the time it spans — less than ``window_s`` in the session's
first window, and said so (:attr:`Arrivals.span_s`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpuchef.probes.timeline import TimelineSnapshot

from .session import LoadState

#: The id prefix of requests from `top --serve`'s HTTP front door (gpuchef/serve/server.py's
#: HTTP_ID_PREFIX; tests/tui/test_arrivals.py checks that the two agree).
HTTP_ID_PREFIX = "http-"
#: Shortest span (s) a rate is given over; before it the rate is unknown (NaN, shown "–").
MIN_SPAN_S = 1.0


@dataclass(frozen=True)
class Arrivals:
    """One reading, rounded as the header shows it (so that an unchanged reading compares
    equal and redraws nothing). ``window_s``: the window asked for (s); ``span_s``: the whole
    seconds the rates are over (``window_s`` once the session is that old, less before).
    ``load_rate``/``http_rate``: req/s that arrived from gpuchef's load / over HTTP in that
    span, to 0.1 (NaN: under :data:`MIN_SPAN_S` measured yet). ``http_in_flight``: HTTP
    requests not finished now. ``http_seen``: an HTTP request arrived in this session."""

    window_s: float
    span_s: float
    load_rate: float
    http_rate: float
    http_in_flight: int = 0
    http_seen: bool = False

    def span_label(self) -> str:
        """"last 30 s" (the seconds the rates are over, whole), or "measuring" before
        :data:`MIN_SPAN_S`."""
        if not math.isfinite(self.load_rate):
            return "measuring"
        return f"last {min(self.span_s, self.window_s):.0f} s"


def fmt_rate(v: float) -> str:
    """req/s to one decimal ("–" when unknown)."""
    return "–" if not math.isfinite(v) else f"{v:.1f}"


class ArrivalMeter:
    """Measures :class:`Arrivals` over the last ``window_s`` seconds. Call :meth:`update` often
    (the app does, on every refresh tick, whatever the screen): each call reads the finished
    requests added since the last one, and a request that fell out of the timeline's ring
    before a call saw it is not counted."""

    def __init__(self, window_s: float) -> None:
        self.window_s = float(window_s)
        self._reset()

    def _reset(self) -> None:
        self._hist: deque[tuple[int, int, int]] = deque()  # (t_ns, load arrivals, HTTP arrivals)
        self._last_rec = None       # the newest finished request counted
        self._last_key: int | None = None
        self.http_done = 0          # HTTP requests finished so far
        self.own_done = 0           # gpuchef's load's requests finished so far
        self._http_arrived = 0
        self._seen_step = (-1, 0)   # (newest step id, load.submitted when it was first seen)
        self.last: Arrivals | None = None

    def _count_finished(self, snap: TimelineSnapshot) -> None:
        pairs = snap._req_pairs  # ((finish key, RequestRecord), ...), ascending keys
        i = len(pairs)
        if self._last_rec is not None:
            while i > 0 and pairs[i - 1][1] is not self._last_rec:
                i -= 1
            if i == 0 and self._last_key is not None:  # it fell out of the ring: by its key
                i = next((k for k, p in enumerate(pairs) if p[0] > self._last_key), len(pairs))
        else:
            i = 0
        for key, r in pairs[i:]:
            if r.request_id.startswith(HTTP_ID_PREFIX):
                self.http_done += 1
            else:
                self.own_done += 1
        if len(pairs) > i:
            self._last_key, self._last_rec = pairs[-1]

    def update(self, snap: TimelineSnapshot, load: LoadState) -> Arrivals:
        """The reading at ``snap.t_ns`` (also kept as :attr:`last`). A snapshot older than the
        last one starts the measure over from it (a live clock never goes back)."""
        t = snap.t_ns
        if self._hist and t < self._hist[-1][0]:
            self._reset()
        self._count_finished(snap)
        last = snap.steps[-1] if snap.steps else None
        newest = last.step if last is not None else -1
        if newest != self._seen_step[0]:
            self._seen_step = (newest, load.submitted)
        queued = (last.num_running + last.num_waiting if last is not None else 0) + \
            max(0, load.submitted - self._seen_step[1])
        own_in_flight = max(0, load.submitted - self.own_done)
        http_in_flight = max(0, queued - own_in_flight)
        # arrivals so far never shrink: a snapshot cut between a step and its finished records
        # reads one request too few for a moment
        self._http_arrived = max(self._http_arrived, self.http_done + http_in_flight)
        h = self._hist
        h.append((t, load.submitted, self._http_arrived))
        w_ns = int(self.window_s * 1e9)
        # keep one sample at or before the window's start: the base the growth is measured from
        while len(h) > 2 and h[1][0] <= t - w_ns:
            h.popleft()
        t0, load0, http0 = h[0]
        span = (t - t0) / 1e9
        if span >= MIN_SPAN_S:
            load_rate = round((load.submitted - load0) / span, 1)
            http_rate = round((self._http_arrived - http0) / span, 1)
        else:
            load_rate = http_rate = math.nan
        self.last = Arrivals(self.window_s, float(round(span)), load_rate, http_rate,
                             http_in_flight, self._http_arrived > 0)
        return self.last


__all__ = ["Arrivals", "ArrivalMeter", "HTTP_ID_PREFIX", "fmt_rate"]
