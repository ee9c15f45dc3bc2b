"""The attach screen's panels drawn from gpuchef's vLLM plugin (`top --attach URL --plugin
HOST:PORT`): a vLLM server's output batches, per engine (data-parallel rank), at iteration
resolution — a band per (server, engine_idx).

- :class:`IterationPanel` ("Step waveform"): per slice, the front-end time between output
  batches (mean of the batches ending there whose interval is known), coloured by what the
  slice's largest batch held (prefill only, mixed, decode only), and the engine core's ITL of
  their decode rows (━). The interval is the API server's time between two output batches of
  that engine, not GPU time (docs/attach.md).
- :class:`PluginBatchPanel`, :class:`PluginQueuePanel`: the hosted batch-composition and
  queue/KV panels over the plugin's rows (``tui.iterations``: the same figures — the largest
  batch in each slice, the queue state held between batches).

Every title says where its numbers come from ("from gpuchef's vLLM plugin · per output
batch"); a band whose server's plugin sent nothing says why. :class:`PluginView` keeps the
screen's per-stream columns and builds the frames; :func:`plugin_numbers_text` and
:func:`sources_text` are the side panel's blocks.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from rich.text import Text
from textual.strip import Strip

from .. import theme
from ..chart import Cells, fmt_num
from ..iterations import (KIND_DECODE, KIND_MIXED, KIND_PREFILL, IterationColumns,
                          IterationFrame, fmt_ms)
from ..plotdata import TimeGrid, nice_max
from .bands import BandedPanel, band_tag
from .queue_kv import QueueKvPanel
from .waveforms import BG, BatchPanel, StepPanel, _gutter, _right, fmt_span

#: where every plugin panel's numbers come from (its title says so)
SOURCE = "from gpuchef's vLLM plugin · per output batch"
PREFILL_SCHEDULED = "prefill = scheduled tokens − decode rows"
PREFILL_COMPLETED = "prefill = prompts completed (vLLM without --cudagraph-metrics)"
#: the step waveform's scale: this percentile of its slices (the few above it are cut, ▲)
SCALE_PCT = 95
NAN = float("nan")


class PluginPanel(BandedPanel):
    """A panel of IterationFrames, one band per (server, engine_idx)."""

    def source_extra(self, frames: Sequence[IterationFrame]) -> str:
        return ""

    def set_frames(self, frames: Sequence[IterationFrame]) -> None:
        src = SOURCE + (f" · {frames[0].label}" if len(frames) == 1 else
                        " · a band per server and engine")
        extra = self.source_extra(frames)
        src = f"{src} · {extra}" if extra else src
        if src != self.SOURCE:
            self.SOURCE = src
        super().set_frames(frames)

    def band_label(self, i: int, fr: IterationFrame) -> list:
        return band_tag(i, fr.label, "vLLM plugin")

    def off_line(self, fr: IterationFrame) -> tuple[str, str] | None:
        return ("no records", fr.off) if fr.off else None


class IterationPanel(PluginPanel):
    TITLE = "Step waveform"
    UNIT = "ms between output batches (front end); ━ ITL (engine core)"
    UNIT_SHORT = "ms between batches"
    LEGEND = (("prefill-only", theme.PREFILL, "prefill"), ("mixed", theme.MIXED),
              ("decode-only batch", theme.DECODE, "decode"))

    def title_right(self) -> str:
        """The readouts' window, as the hosted step panel's ("last 1.9 s")."""
        f = self._frame
        if f is None or f.wave is None or not len(f.wave.busy):
            return ""
        return f"last {fmt_span(StepPanel.readout_cols(f.wave) * f.wave.grid.bin_s)}"

    def draw(self, f: IterationFrame, cols: int, h: int) -> list[Strip]:
        iv, itl, kind = self.fit(f.interval_ms, cols), self.fit(f.itl_ms, cols), \
            self.fit(f.kind, cols)
        vals = np.concatenate([iv[np.isfinite(iv)], itl[np.isfinite(itl)]])
        # the scale of most slices: a batch after a stall (a long prefill, a preemption)
        # would squash the rest; it is cut at the top and marked ▲
        top = nice_max(float(np.percentile(vals, SCALE_PCT)) if len(vals) else 0.0, 1)
        c = Cells(h, cols, [])
        c.stacked([np.where(kind == k, np.minimum(iv, top), 0) / top * h
                   for k in (KIND_PREFILL, KIND_MIXED, KIND_DECODE)],
                  [theme.PREFILL, theme.MIXED, theme.DECODE])
        c.hline(np.minimum(itl, top) / top * h, theme.BUDGET, char="━", over=True)
        over = np.nonzero(np.nan_to_num(np.fmax(iv, itl)) > top)[0]
        c.chars[0, over] = "▲"
        c.fg[0, over] = c.colour(theme.PREEMPTED)
        return c.strips(_gutter(h, fmt_num(top, "ms"), "0",
                                {h // 2: fmt_num(top / 2)} if h >= 5 else None),
                        self.readouts(f, h), BG)

    @staticmethod
    def readouts(f: IterationFrame, h: int) -> list:
        """Over the newest complete columns (~2 s; the title row says how long exactly):
        batches/s, the median time between them and the engine core's ITL — a label row and
        a value row each, or one row each ("99/s", "↔9.9ms", "━10ms") on a short band."""
        w = f.wave
        k = StepPanel.readout_cols(w)
        done = slice(-k - 1, -1) if len(w.steps) > 1 else slice(None)
        per_s = float(np.nansum(w.steps[done])) / max(1e-9, k * w.grid.bin_s)
        ivd, itd = f.interval_ms[done], f.itl_ms[done]
        gap = float(np.median(ivd[np.isfinite(ivd)])) if np.isfinite(ivd).any() else NAN
        itl = float(np.mean(itd[np.isfinite(itd)])) if np.isfinite(itd).any() else NAN
        if h >= 6:
            return _right(h, [("it/s", theme.LABEL), (fmt_num(per_s), theme.TITLE),
                              ("between", theme.LABEL), (fmt_num(gap, "ms"), theme.TITLE),
                              ("ITL", theme.LABEL), (fmt_num(itl, "ms"), theme.BUDGET)])
        return _right(h, [(f"{fmt_num(per_s)}/s", theme.TITLE),
                          (f"↔{fmt_num(gap, 'ms')}", theme.TITLE),
                          (f"━{fmt_num(itl, 'ms')}", theme.BUDGET)])


class PluginBatchPanel(PluginPanel, BatchPanel):
    """The hosted batch composition over the plugin's batches: the largest batch ending in
    each slice, prefill tokens under decode rows (no budget line: vLLM's budget is not in the
    records)."""

    UNIT = "tokens of the largest output batch in each slice"
    UNIT_SHORT = "tokens per batch"
    BUDGET = False
    LEGEND = (("prefill", theme.PREFILL), ("decode rows", theme.DECODE, "decode"))

    def source_extra(self, frames: Sequence[IterationFrame]) -> str:
        live = [fr for fr in frames if fr.wave is not None and fr.latest is not None]
        if len(frames) == 1 and live:
            return PREFILL_SCHEDULED if live[0].prefill_scheduled else PREFILL_COMPLETED
        return ""

    def band_label(self, i: int, fr: IterationFrame) -> list:
        out = super().band_label(i, fr)
        if fr.latest is not None:
            out[-1] = (out[-1][0] + " · " + (PREFILL_SCHEDULED if fr.prefill_scheduled
                                             else PREFILL_COMPLETED), out[-1][1])
        return out

    def draw(self, f: IterationFrame, cols: int, h: int) -> list[Strip]:
        return BatchPanel.draw(self, f.wave, cols, h)

    def marker_cols(self, f: Any, cols: int) -> list[int]:
        return []


class PluginQueuePanel(PluginPanel, QueueKvPanel):
    """The hosted queue/KV panel over the plugin's batches: running and waiting stacked, × where
    a batch carried preemptions, KV cache used (vLLM's ``kv_cache_usage``)."""

    UNIT = "requests; KV cache used, %"
    UNIT_SHORT = "requests; KV %"

    def draw(self, f: IterationFrame, cols: int, h: int) -> list[Strip]:
        return QueueKvPanel.draw(self, f.wave, cols, h)

    def marker_cols(self, f: Any, cols: int) -> list[int]:
        return []


def _label(server: str, engine_idx: int) -> str:
    return f"{server.split('//', 1)[-1]} · engine {engine_idx}"


class PluginView:
    """The attach screen's copy of the plugin's rows: an IterationColumns per stream, fed from
    the session's ``plugin`` (``tui.session.PluginSource``) at each tick. ``reset()`` after a
    replay seek (the rows are asked again from the start)."""

    def __init__(self) -> None:
        self.cols: dict[tuple[str, int], IterationColumns] = {}

    def reset(self) -> None:
        self.cols.clear()

    def update(self, src: Any) -> None:
        for key in src.keys():
            c = self.cols.get(key)
            if c is None:
                c = self.cols[key] = IterationColumns(*key)
            rows, n = src.since(key, c.next)
            c.extend(rows, n)

    def streams(self, src: Any, servers: Sequence[Any]) -> list[tuple[str, IterationColumns | None]]:
        """(server URL, columns) per stream of the servers that have a plugin endpoint, in the
        servers' order then by engine; (URL, None) for such a server with no stream yet."""
        out: list[tuple[str, IterationColumns | None]] = []
        for srv in servers:
            ep = src.endpoints.get(srv.url)
            if not ep:
                continue
            mine = sorted((k for k in self.cols if k[0] == ep), key=lambda k: k[1])
            out += [(srv.url, self.cols[k]) for k in mine] or [(srv.url, None)]
        return out

    @staticmethod
    def why_empty(src: Any, url: str, c: IterationColumns | None) -> str:
        """Why a server (``c``: one of its streams, or None) has no row to draw: no endpoint, no
        record yet (``src.status``), records that were no engine step's output, or (a replay)
        no batch before the position."""
        why = src.status(url)
        if why or c is None:
            return why or "no record yet"
        if src.counts((c.server, c.engine_idx)).rows:
            return "no output batch recorded before this point"
        return "its records so far are no engine step's output (aborts, wave notices)"

    def frames(self, src: Any, servers: Sequence[Any], grid: TimeGrid) -> list[IterationFrame]:
        """A frame per stream (see :meth:`streams`); a server with no row yet gets a frame
        whose ``off`` says why."""
        out = []
        for url, c in self.streams(src, servers):
            if c is None or not len(c):
                out.append(IterationFrame(url, -1 if c is None else c.engine_idx, None,
                                          off=self.why_empty(src, url, c),
                                          label=_label(url, 0 if c is None else c.engine_idx)))
                continue
            f = c.frame(grid)
            f.label = _label(url, c.engine_idx)
            out.append(f)
        return out

    def covered(self, src: Any, servers: Sequence[Any]) -> set[str]:
        """The URLs of the servers whose plugin has sent rows (their /metrics panels of the
        same figures can give way)."""
        return {url for url, c in self.streams(src, servers) if c is not None and len(c)}


def plugin_numbers_text(src: Any, streams: Sequence[tuple[str, IterationColumns | None]],
                        now_ns: int, window_s: float) -> Text:
    """The side panel's block of the plugin: one column per (server, engine) stream, the
    figures of its batches in the last ``window_s`` (``IterationColumns.window``), the newest
    batch's queues and KV share, and the records' accounting."""
    t = Text(no_wrap=True, overflow="ellipsis")
    live = [(u, c) for u, c in streams if c is not None]
    if not live:
        return t
    width = 16
    t.append(f" gpuchef's vLLM plugin: per output batch, last {window_s:g} s\n",
             style=theme.AXIS)
    for line in ([u.split("//", 1)[-1][-width:] for u, _ in live],
                 [f"engine {c.engine_idx}" for _, c in live]):
        t.append(f"{'':<14}", style=theme.LABEL)
        for x in line:
            t.append(f"{x:>{width}} ", style=f"bold {theme.TITLE}")
        t.append("\n")
    figs = [c.window(now_ns, window_s) for _, c in live]
    counts = [src.counts((c.server, c.engine_idx)) for _, c in live]

    def row(label: str, cells: Sequence[str]) -> None:
        t.append(f" {label:<13}", style=theme.LABEL)
        for x in cells:
            t.append(f"{x:>{width}} ", style=f"bold {theme.TITLE}")
        t.append("\n")

    def num(v: float, nd: int = 1) -> str:
        return "–" if v != v else f"{v:,.{nd}f}"

    row("batches/s", [num(f.per_s) for f in figs])
    row("between p50", [fmt_ms(f.interval_p50_ms) for f in figs])
    row("ITL (core)", [fmt_ms(f.itl_mean_ms) for f in figs])
    row("prefill/batch", [num(f.prefill_per_it) for f in figs])
    row("decode/batch", [num(f.decode_per_it) for f in figs])
    lt = [f.latest for f in figs]
    row("running", [str(x.running) if x and x.running >= 0 else "–" for x in lt])
    row("waiting", [str(x.waiting) if x and x.waiting >= 0 else "–" for x in lt])
    row("KV used", [f"{x.kv_usage * 100:.1f}%" if x and x.kv_usage == x.kv_usage else "–"
                    for x in lt])
    row("records", [f"{k.received:,}" for k in counts])
    row("lost", [f"{k.lost:,}" + (f" ({k.dropped:,} dr.)" if k.dropped else "") for k in counts])
    return t


def sources_text(s: Any, covered: set[str], plugin_on: bool) -> Text:
    """The side panel's "Sources" block: which source each panel draws, per server."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append("Sources\n", style=f"bold {theme.TITLE}")
    gpu = ("local NVML/GPM (--gpus)" if s.gpu_available else
           "off: " + (s.gpu_status or "no --gpus"))
    lines = []
    for srv in s.servers:
        name = srv.url.split("//", 1)[-1]
        if srv.url in covered:
            lines.append(f" {name}: steps, batches, queue/KV from gpuchef's vLLM plugin "
                         f"({s.plugin.endpoints[srv.url]})")
        else:
            why = s.plugin.status(srv.url)
            lines.append(f" {name}: queue/KV, batch estimate from /metrics" +
                         (f"; {why}" if why else ""))
    lines.append(" token rates, server latency: /metrics")
    lines.append(f" GPU panels: {gpu}")
    if not plugin_on:
        lines.append(" step waveform: none (its line says why)")
    t.append("\n".join(lines), style=theme.LABEL)
    return t
