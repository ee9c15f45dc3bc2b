"""Panels of an attached server (`top --attach`): what its ``/metrics`` says, per scrape interval.

A server gpuchef does not host gives no StepRecords: its queues, KV use, token counters and
latency histograms are read at each scrape (``probes.scrape``), and the charts draw the interval
between two scrapes. Every panel says so in its title ("from /metrics, 250 ms scrapes"); one with
no source for this server shows one line saying why. :class:`ScrapeFrame` bins a server's
intervals on the dashboard's time grid: a column shows the newest interval ending in it (held
across columns narrower than a scrape; NaN once the newest is older than three scrapes — the
server stopped answering).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from rich.text import Text
from textual.strip import Strip
from textual.widgets import Static

from gpuchef.probes.scrape import (SERIES, HistQuantile, ScrapeDelta, ScrapeSample,
                                   bucket_quantile, hist_quantile_text)

from .. import theme
from ..chart import Cells, fmt_num, last_value
from ..plotdata import TimeGrid, nice_max
from .bands import BandedPanel, band_tag
from .waveforms import BG, _gutter, _right

NAN = float("nan")
#: per-interval series a frame holds, and where each comes from in a ScrapeDelta
GAUGES = ("running", "waiting", "kv_usage")
RATES = ("prompt_tokens", "generation_tokens", "preemptions", "requests_finished")
MEANS = ("iteration_tokens", "step_prefill_tokens", "step_decode_rows", "ttft", "itl", "e2e")


def interval_label(hz: float) -> str:
    """"250 ms scrapes" for 4 Hz."""
    ms = 1000.0 / hz
    return f"{ms:.0f} ms scrapes" if ms < 1000 else f"{ms / 1000:g} s scrapes"


@dataclass
class ScrapeFrame:
    """One server's intervals on ``grid``: ``series[name]`` is a float array of ``grid.cols``
    (NaN where nothing is known). Gauges: the value at the interval's end (requests; KV 0–1);
    rates: per second over the interval (tokens/s, preemptions/s); means: the histogram's
    interval mean (tokens per iteration, seconds for latencies); ``iter_rate``: histogram
    observations per second of ``iteration_tokens`` (iterations/s). ``kind``: the server's
    kind; ``hz``: its scrape rate; ``latest``: the newest interval or None. From the newest
    scrape (good or failed): ``error`` ("" or why it failed), ``exported`` (the quantities its
    /metrics declares; None when not known) and ``bad`` (quantity → why its value was
    refused)."""

    grid: TimeGrid
    kind: str
    hz: float
    series: dict[str, np.ndarray] = field(default_factory=dict)
    latest: ScrapeDelta | None = None
    markers: tuple = ()
    server: str = ""  # named in the titles when several servers are attached
    url_label: str = ""  # host:port, the label of this server's band
    error: str = ""
    exported: frozenset[str] | None = None
    bad: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> np.ndarray:
        return self.series.get(name, np.full(self.grid.cols, NAN))

    def has(self, name: str) -> bool:
        """The server exports this series (a histogram with no observation yet counts)."""
        if np.isfinite(self.get(name)).any():
            return True
        d = self.latest
        if d is None:
            return False
        return name in d.gauges or name in d.rates or name in d.hist_count


def _value(d: ScrapeDelta, name: str) -> float | None:
    if name in GAUGES:
        return d.gauges.get(name)
    if name in RATES:
        return d.rates.get(name)
    if name in MEANS:
        return d.hist_mean.get(name)
    if name == "iter_rate":
        n = d.hist_count.get("iteration_tokens")
        return None if n is None else n / d.dt_s
    if name == "busy":  # gpuchef serve: engine step time / wall time
        n, m = d.hist_count.get("step_duration"), d.hist_mean.get("step_duration")
        return None if n is None or m is None else min(1.0, n * m / d.dt_s)
    return None


def build_scrape_frame(deltas: Sequence[ScrapeDelta], grid: TimeGrid, kind: str,
                       hz: float, last: ScrapeSample | None = None) -> ScrapeFrame:
    """Bin ``deltas`` (oldest first) on ``grid`` (see the module docstring). ``last``: the
    server's newest scrape, which says why a series has no data (failed, absent, refused)."""
    f = ScrapeFrame(grid, kind, hz, latest=deltas[-1] if deltas else None)
    if last is not None:
        f.error, f.bad = last.error, dict(last.bad)
        f.exported = None if last.error else last.exported
    n = grid.cols
    if not deltas:
        return f
    t = np.fromiter((d.t_ns for d in deltas), dtype=np.int64, count=len(deltas))
    right = grid.t0_ns + (np.arange(n, dtype=np.int64) + 1) * grid.bin_ns
    right[-1] = min(int(right[-1]), grid.now_ns)
    idx = np.searchsorted(t, right, side="right") - 1
    stale_ns = int(3e9 / hz) + grid.bin_ns
    ok = (idx >= 0)
    ok[ok] &= (right[ok] - t[idx[ok]]) <= stale_ns
    lo = max(0, int(idx[ok].min())) if ok.any() else len(deltas)
    used = deltas[lo:]
    for name in (*GAUGES, *RATES, *MEANS, "iter_rate", "busy"):
        vals = np.array([_value(d, name) if _value(d, name) is not None else NAN for d in used],
                        dtype=np.float64)
        if not np.isfinite(vals).any():
            continue
        col = np.full(n, NAN)
        col[ok] = vals[idx[ok] - lo]
        f.series[name] = col
    return f


def window_quantiles(deltas: Sequence[ScrapeDelta], name: str, t0_ns: int,
                     qs: Sequence[float]) -> list[HistQuantile]:
    """The quantiles ``qs`` (0–100) of histogram ``name`` over the intervals ending after
    ``t0_ns``: their bucket counts summed, then ``probes.scrape.bucket_quantile`` (each the
    bucket it lies in and the interpolated value; empty when no observation fell in the
    window). Units: the histogram's (seconds for latencies)."""
    acc: dict[float, float] = {}
    for d in deltas:
        if d.t_ns <= t0_ns:
            continue
        for le, c in d.hist_buckets.get(name, ()):
            acc[le] = acc.get(le, 0.0) + c
    b = tuple(sorted(acc.items()))
    return [bucket_quantile(b, q / 100) for q in qs]


class ScrapePanel(BandedPanel):
    """A chart of one server's ScrapeFrame (several servers: a band each, ``set_frames``).
    ``NEEDS``: series without which the panel shows ``off_text()`` instead (one line, why)."""

    NEEDS: tuple[str, ...] = ()

    def set_frame(self, frame) -> None:  # a ScrapeFrame here
        hz = getattr(frame, "hz", 0) or 0
        src = f"{self.SOURCE_OF} · {interval_label(hz)}" if hz else self.SOURCE_OF
        if getattr(frame, "server", ""):
            src = f"{frame.server} · {src}"
        if src != self.SOURCE:
            self.SOURCE = src
        super().set_frame(frame)

    SOURCE_OF = "from /metrics"

    def off_text(self, f: ScrapeFrame) -> str:
        return f"{f.kind} server: no {', '.join(self.NEEDS)} series in its /metrics"

    def off_line(self, f: ScrapeFrame) -> tuple[str, str] | None:
        """None when the frame has one of ``NEEDS``; else (lead, why): the scrape failed, the
        values were refused, the series are exported but nothing changed yet (idle), or they
        are absent from /metrics (``off_text``)."""
        if not self.NEEDS or any(f.has(n) for n in self.NEEDS):
            return None
        if f.error:
            return "no scrape", f.error
        bad = [f.bad[n] for n in self.NEEDS if n in f.bad]
        if bad:
            return "refused", "; ".join(bad)
        shown = [SERIES[n][1][0] for n in self.NEEDS if f.exported and n in f.exported]
        if shown:
            return "idle", (f"{f.kind} server exports {', '.join(shown)}: no change in a scrape "
                            "interval yet (idle, or only one scrape so far)")
        return "no source", self.off_text(f)

    def band_label(self, i: int, fr: ScrapeFrame) -> list:
        return band_tag(i, fr.url_label, fr.kind)


class ScrapeQueuePanel(ScrapePanel):
    TITLE = "Queue and KV cache"
    UNIT = "requests; KV cache used, %"
    SOURCE_OF = "from /metrics gauges"
    LEGEND = (("running", theme.RUNNING), ("waiting", theme.WAITING),
              ("× preempted", theme.PREEMPTED), ("KV", theme.KV))
    NEEDS = ("running", "waiting")

    def draw(self, f: ScrapeFrame, cols: int, h: int) -> list[Strip]:
        hk = max(1, h // 3) if h >= 3 else 0
        hq = h - hk
        run, wait = self.fit(f.get("running"), cols), self.fit(f.get("waiting"), cols)
        tot = np.nan_to_num(run) + np.nan_to_num(wait)
        top = nice_max(float(tot.max()) if len(tot) else 0.0, 4)
        c = Cells(hq, cols, [])
        c.stacked([run / top * hq, wait / top * hq], [theme.RUNNING, theme.WAITING])
        pre = np.nan_to_num(self.fit(f.get("preemptions"), cols))
        hit = np.nonzero(pre > 0)[0]
        if len(hit):
            c.chars[0, hit] = "×"
            c.fg[0, hit] = c.colour(theme.PREEMPTED)
        lt = f.latest
        r = lt.gauges.get("running", NAN) if lt else NAN
        w = lt.gauges.get("waiting", NAN) if lt else NAN
        p = lt.rates.get("preemptions") if lt else None
        rows = c.strips(_gutter(hq, fmt_num(top), "0"),
                        _right(hq, [(f"R {fmt_num(r)}", theme.RUNNING),
                                    (f"W {fmt_num(w)}", theme.WAITING),
                                    (f"× {fmt_num(p or 0.0)}/s", theme.PREEMPTED)]), BG)
        if hk:
            kv = self.fit(f.get("kv_usage"), cols)
            k = Cells(hk, cols, [])
            k.stacked([np.clip(kv, 0, 1) * hk], [theme.KV])
            cur = lt.gauges.get("kv_usage", NAN) * 100 if lt else NAN
            rows += k.strips(_gutter(hk, "KV 100%", "0%" if hk > 1 else ""),
                             _right(hk, [(f"{cur:.0f}%" if cur == cur else "–", theme.KV)]), BG)
        return rows


class TokenRatePanel(ScrapePanel):
    TITLE = "Token rates"
    UNIT = "tokens/s over each scrape interval"
    SOURCE_OF = "from /metrics counters"
    LEGEND = (("prompt", theme.PREFILL), ("generation", theme.DECODE))
    NEEDS = ("prompt_tokens", "generation_tokens")

    def draw(self, f: ScrapeFrame, cols: int, h: int) -> list[Strip]:
        pre, gen = self.fit(f.get("prompt_tokens"), cols), self.fit(f.get("generation_tokens"), cols)
        tot = np.nan_to_num(pre) + np.nan_to_num(gen)
        top = nice_max(float(tot.max()) if len(tot) else 0.0, 8)
        c = Cells(h, cols, [])
        c.stacked([pre / top * h, gen / top * h], [theme.PREFILL, theme.DECODE])
        lt = f.latest
        p = lt.rates.get("prompt_tokens") if lt else None
        g = lt.rates.get("generation_tokens") if lt else None
        right = _right(h, [("prompt", theme.PREFILL), (fmt_num(NAN if p is None else p),
                                                       theme.PREFILL),
                           ("gen", theme.DECODE), (fmt_num(NAN if g is None else g),
                                                   theme.DECODE)])
        return c.strips(_gutter(h, fmt_num(top), "0"), right, BG)


class BatchEstimatePanel(ScrapePanel):
    """vLLM: the mean of ``vllm:iteration_tokens_total`` over each interval (tokens per engine
    iteration, prefill and decode together: the histogram does not split them). gpuchef serve:
    ``gpuchef:step_prefill_tokens`` and ``step_decode_rows`` means, stacked."""

    TITLE = "Batch composition (estimate)"
    UNIT = "mean tokens per iteration in each scrape interval"
    NEEDS = ("iteration_tokens", "step_prefill_tokens")

    def set_frame(self, frame) -> None:
        gp = frame.has("step_prefill_tokens")
        self.SOURCE_OF = ("gpuchef:step_prefill_tokens/step_decode_rows deltas" if gp
                          else "vllm:iteration_tokens_total histogram deltas")
        self.LEGEND = ((("prefill", theme.PREFILL), ("decode", theme.DECODE)) if gp
                       else (("tokens/iteration", theme.MIXED),))
        super().set_frame(frame)

    def off_text(self, f: ScrapeFrame) -> str:
        return (f"{f.kind} server: its /metrics has no per-iteration token histogram "
                "(vllm:iteration_tokens_total)")

    def draw(self, f: ScrapeFrame, cols: int, h: int) -> list[Strip]:
        if f.has("step_prefill_tokens"):
            layers = [self.fit(f.get("step_prefill_tokens"), cols),
                      self.fit(f.get("step_decode_rows"), cols)]
            colours = [theme.PREFILL, theme.DECODE]
        else:
            layers, colours = [self.fit(f.get("iteration_tokens"), cols)], [theme.MIXED]
        tot = sum(np.nan_to_num(x) for x in layers)
        top = nice_max(float(tot.max()) if len(tot) else 0.0, 8)
        c = Cells(h, cols, [])
        c.stacked([x / top * h for x in layers], colours)
        lt = f.latest
        m = lt.hist_mean.get("iteration_tokens") if lt else None
        if m is None and lt is not None:
            a, b = lt.hist_mean.get("step_prefill_tokens"), lt.hist_mean.get("step_decode_rows")
            m = None if a is None else a + (b or 0.0)
        it = _value(lt, "iter_rate") if lt else None
        if it is None and lt is not None and "step_duration" in lt.hist_count:
            it = lt.hist_count["step_duration"] / lt.dt_s
        right = _right(h, [("tok/it", theme.LABEL), (fmt_num(NAN if m is None else m), theme.TITLE),
                           ("it/s", theme.LABEL), (fmt_num(NAN if it is None else it),
                                                   theme.TITLE)])
        return c.strips(_gutter(h, fmt_num(top), "0"), right, BG)


class ServerLatencyPanel(ScrapePanel):
    TITLE = "Server latency"
    # the server's histograms count every client's requests, not only gpuchef's load
    UNIT = "ms, every client's requests, interval means"
    SOURCE_OF = "from /metrics histograms"
    LEGEND = (("TTFT", theme.PREFILL), ("ITL", theme.DECODE))
    NEEDS = ("ttft", "itl")

    def draw(self, f: ScrapeFrame, cols: int, h: int) -> list[Strip]:
        rows: list[Strip] = []
        per = max(1, h // 2)
        for i, (name, label, colour) in enumerate((("ttft", "TTFT", theme.PREFILL),
                                                   ("itl", "ITL", theme.DECODE))):
            rh = per if i == 0 else h - per
            if rh <= 0:
                continue
            v = self.fit(f.get(name), cols) * 1e3
            top = nice_max(float(np.nanmax(v)) if np.isfinite(v).any() else 0.0, 1)
            c = Cells(rh, cols, [])
            c.stacked([v / top * rh], [colour])
            cur = last_value(v, 8)
            rows += c.strips(_gutter(rh, label, f"0–{fmt_num(top)}" if rh > 1 else ""),
                             _right(rh, [(fmt_num(cur, "ms"), colour)]), BG)
        return rows


# -- the numbers side panel ----------------------------------------------------------------------

def _fmt(v: float | None, nd: int = 1, unit: str = "") -> str:
    if v is None or not math.isfinite(v):
        return "–"
    return f"{v:,.{nd}f}{unit}"


@dataclass(frozen=True)
class ServerNumbers:
    """One server's column of the numbers panel: ``values``, the latest interval's figures
    (floats or None) and, under ``ttft_p50``-like keys, the latency quantiles over the stats
    window from the histograms' bucket counts (``probes.scrape.HistQuantile``, seconds: the
    bucket, not a bare number, so that no surface shows the interpolated point alone)."""

    url: str
    kind: str
    status: str
    values: dict[str, float | HistQuantile | None]


def server_numbers(url: str, kind: str, status: str, deltas: Sequence[ScrapeDelta],
                   now_ns: int, window_s: float, percentiles: tuple[float, ...],
                   latest: ScrapeSample | None = None) -> ServerNumbers:
    """The numbers of one server: the newest interval's rates, its gauges (running, waiting,
    KV usage) from ``latest`` — the newest good scrape — where that is newer (an interval is
    held open while no step ends, ``probes.scrape.DeltaStream``, but a gauge is true at each
    scrape), and the server's TTFT/ITL/E2E quantiles (``percentiles``' first and last) over
    the last ``window_s``."""
    lt = deltas[-1] if deltas else None
    v: dict[str, float | HistQuantile | None] = {}
    for name in ("running", "waiting", "kv_usage", "prompt_tokens", "generation_tokens",
                 "preemptions", "requests_finished", "iteration_tokens", "iter_rate", "busy"):
        v[name] = _value(lt, name) if lt is not None else None
    if latest is not None and not latest.error and (lt is None or latest.t_ns > lt.t_ns):
        for name in ("running", "waiting", "kv_usage"):
            if name in latest.values:
                v[name] = latest.values[name]
    t0 = now_ns - int(window_s * 1e9)
    qs = (percentiles[0], percentiles[-1])
    for name in ("ttft", "itl", "e2e"):
        lo, hi = window_quantiles(deltas, name, t0, qs)
        v[f"{name}_p{qs[0]:g}"] = lo
        v[f"{name}_p{qs[1]:g}"] = hi
    return ServerNumbers(url, kind, status, v)


def attach_numbers_text(servers: Sequence[ServerNumbers], client, percentiles: tuple[float, ...],
                        window_s: float) -> Text:
    """The numbers panel of an attached session: one column per server, then the client's
    TTFT/ITL (``client``: a probes.metrics.BenchMetrics of gpuchef's load, or None). The two
    blocks count different requests and each heading says which: the server's histograms hold
    every client's requests, observed in the scrape intervals of the last ``window_s`` (TTFT
    when the first token came), and its percentiles are shown as the histogram bucket each
    lies in (``probes.scrape.hist_quantile_text``); the client-side figures are gpuchef's own
    requests that finished in the last ``window_s``, exact per request, in ms."""
    lo, hi = percentiles[0], percentiles[-1]
    t = Text(no_wrap=True, overflow="ellipsis")
    names = [s.url.split("//", 1)[-1] for s in servers]
    width = 16
    t.append(f"{'':<14}", style=theme.LABEL)
    for n in names:
        t.append(f"{n[-width:]:>{width}} ", style=f"bold {theme.TITLE}")
    t.append("\n")

    def row(label: str, key: str, nd: int = 1, scale: float = 1.0, unit: str = "") -> None:
        t.append(f" {label:<13}", style=theme.LABEL)
        for s in servers:
            x = s.values.get(key)
            t.append(f"{_fmt(None if x is None else x * scale, nd, unit):>{width}} ",
                     style=f"bold {theme.TITLE}")
        t.append("\n")

    t.append(f"{'':<14}", style=theme.LABEL)
    for s in servers:
        t.append(f"{s.kind:>{width}} ", style=theme.AXIS)
    t.append("\n")
    t.append(" latest scrape interval\n", style=theme.AXIS)
    row("running", "running", 0)
    row("waiting", "waiting", 0)
    row("KV used", "kv_usage", 1, 100, "%")
    row("prompt tok/s", "prompt_tokens", 0)
    row("gen tok/s", "generation_tokens", 0)
    row("preempt/s", "preemptions", 2)
    row("finished/s", "requests_finished", 2)
    row("tok/iteration", "iteration_tokens", 1)
    row("iterations/s", "iter_rate", 1)
    # the two blocks count different requests over different events: say which, and when
    t.append(" server, /metrics histograms: every client's\n", style=theme.AXIS)
    t.append(f"  requests seen in the last {window_s:g} s (TTFT: first tokens)\n",
             style=theme.AXIS)
    # a histogram knows only which bucket a percentile falls in; the interpolated point can be
    # anywhere in it (4.5 s for a true 2.85 s in vLLM's 2.5–5 s E2E bucket): show the bucket
    t.append("  each percentile: the histogram bucket it is in\n", style=theme.AXIS)

    def hist_row(label: str, key: str) -> None:
        t.append(f" {label:<13}", style=theme.LABEL)
        for s in servers:
            x = s.values.get(key)
            cell = hist_quantile_text(x) if isinstance(x, HistQuantile) else "–"
            t.append(f"{cell:>{width}} ", style=f"bold {theme.TITLE}")
        t.append("\n")

    for m, label in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E")):
        hist_row(f"{label} p{lo:g}", f"{m}_p{lo:g}")
        hist_row(f"{label} p{hi:g}", f"{m}_p{hi:g}")
    t.append(" client-side (ms, exact): gpuchef's own load only,\n", style=theme.AXIS)
    t.append(f"  its requests finished in the last {window_s:g} s\n", style=theme.AXIS)
    if client is None:
        t.append("  no requests finished (no load from gpuchef, or none yet)\n", style=theme.AXIS)
    else:
        for label, attr in (("TTFT", "ttft"), ("ITL", "itl")):
            pct = dict(getattr(client, f"percentiles_{attr}_ms"))
            t.append(f" {label + ' p' + format(lo, 'g'):<13}", style=theme.LABEL)
            t.append(f"{_fmt(pct.get(lo)):>{width}}\n", style=f"bold {theme.TITLE}")
            t.append(f" {label + ' p' + format(hi, 'g'):<13}", style=theme.LABEL)
            t.append(f"{_fmt(pct.get(hi)):>{width}}\n", style=f"bold {theme.TITLE}")
        t.append(f" {'completed':<13}", style=theme.LABEL)
        t.append(f"{client.completed:>{width}}\n", style=f"bold {theme.TITLE}")
        if client.failed:
            t.append(f" {'failed':<13}", style=theme.LABEL)
            t.append(f"{client.failed:>{width}}\n", style=f"bold {theme.PREEMPTED}")
    return t


class AttachNumbersPanel(Static):
    DEFAULT_CSS = """
    AttachNumbersPanel { height: auto; padding: 0 0; }
    """

    def show(self, text: Text) -> None:
        self.update(text)
