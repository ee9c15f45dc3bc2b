"""The waveforms figure: a run over time, one panel per concern (engine busy, tokens per step,
queue, KV cache, GPU, latency), all on the bins of one time axis."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuchef.probes.metrics import GPU_SUMMARY_FIELDS
from gpuchef.probes.nvml.fields import BY_NAME, GPM

from .autopilot_plots import ALLOWANCE, autopilot_absent, autopilot_series
from .data import TraceView
from .plot_kit import (_LEGEND, DECODE, LABEL_ROW_PT, PREFILL, TARGET_BINS, _binned,
                       _events_overlay, _ffill, _figure, _nice_bin, _slug, _timeline, _with_rc,
                       to_svg)


#: the GPU panel's % series: the summaries' GPM fields (SM active, tensor active, DRAM bandwidth)
_GPM_SHOWN = tuple(f for f in GPU_SUMMARY_FIELDS if BY_NAME[f].cadence == GPM)


def waveforms(view: TraceView, span_s: float | None = None,
              token_ylim: float | None = None) -> tuple[str, list[str]]:
    """:func:`waveforms_figure` as SVG: (SVG, panel titles)."""
    fig, panels = waveforms_figure(view, span_s, token_ylim)
    return to_svg(fig, f"wave-{_slug(view.name)}", f"Waveforms of {view.name}"), panels


@dataclass
class _Bins:
    """One time axis's bins, shared by every panel: ``span`` and ``bin_s`` (s), ``nb`` bins with
    middles ``mids`` (s since the trace's origin), ``t0``/``t1`` (ns) their ends; ``steps`` by
    start time and ``x``, each step's bin (by its start); ``snap`` the trace's Timeline."""

    span: float
    bin_s: float
    nb: int
    mids: np.ndarray
    t0: int
    t1: int
    snap: Any
    steps: list[Any]
    x: np.ndarray | None


@_with_rc
def waveforms_figure(view: TraceView, span_s: float | None = None,
                     token_ylim: float | None = None) -> tuple[Any, list[str]]:
    """The run over time, one panel each: engine busy (%), tokens per step (prefill/decode means
    stacked, the largest step, the budget), queue (running/waiting), KV cache used (%), GPU
    (SM active, tensor active, DRAM bandwidth %, power W) when sampled, and latency (each
    request's TTFT at its arrival, P99 ITL per bin). Returns (SVG, panel titles)."""
    tr = view.trace
    span = span_s or max(view.t(view.end_ns), 1e-3)
    bin_s = _nice_bin(span)
    nb = max(1, int(math.ceil(span / bin_s)))
    edges_s = np.arange(nb + 1) * bin_s
    mids = edges_s[:-1] + bin_s / 2
    snap = _timeline(view)
    t0 = view.origin_ns
    t1 = t0 + int(nb * bin_s * 1e9)
    gpu_fields = [f for f in _GPM_SHOWN if any(getattr(g, f) is not None for g in tr.gpu_samples)]
    has_power = any(g.power_w is not None for g in tr.gpu_samples)
    panels = ["Engine busy", "Tokens per step", "Queue", "KV cache", "Latency"]
    if gpu_fields or has_power:
        panels.insert(4, "GPU")
    fig = _figure(11.5, 1.45 * len(panels) + 0.5)
    axes = fig.subplots(len(panels), 1, sharex=True)
    ax_of = dict(zip(panels, axes))
    steps = sorted(tr.steps, key=lambda s: s.t_start_ns)
    x = None
    if steps:
        ts = np.fromiter((s.t_start_ns for s in steps), np.int64, len(steps))
        x = ((ts - t0) / 1e9 / bin_s).astype(np.int64)
    b = _Bins(span, bin_s, nb, mids, t0, t1, snap, steps, x)

    _busy_panel(ax_of["Engine busy"], b)
    _tokens_panel(ax_of["Tokens per step"], b, view, span_s, token_ylim)
    _queue_panel(ax_of["Queue"], b)
    _kv_panel(ax_of["KV cache"], b)
    if "GPU" in ax_of:
        _gpu_panel(ax_of["GPU"], b, tr.gpu_samples, gpu_fields, has_power)
    _latency_panel(ax_of["Latency"], b, view)
    axes[-1].set_xlabel("time since the start of the trace (s)")
    axes[-1].set_xlim(0, span)
    for i, a in enumerate(axes):
        rows = _events_overlay(a, view, label=(i == 0), span_s=span)
        if i == 0 and rows > 1:  # room for the stacked labels under the title
            a.set_title(a.get_title(loc="left"), loc="left", pad=12 + LABEL_ROW_PT * (rows - 1))
    return fig, panels


def _busy_panel(ax: Any, b: _Bins) -> None:
    """Engine busy: the share of each bin the model computed (%)."""
    if b.steps:
        wf = b.snap.step_waveform(b.t0, b.t1, b.nb)
        ax.fill_between(b.mids, wf.busy * 100, step="mid", color="#5B8DB8", alpha=0.75, lw=0)
        ax.plot(b.mids, wf.busy * 100, drawstyle="steps-mid", color="#2F5F8A", lw=0.5)
    ax.set_ylim(0, 105)
    ax.set_ylabel("busy %")
    ax.set_title(f"Engine busy: model compute per {b.bin_s * 1e3:g} ms bin", pad=12)


def _tokens_panel(ax: Any, b: _Bins, view: TraceView, span_s: float | None,
                  token_ylim: float | None) -> None:
    """Tokens per step (log axis): decode and prefill means stacked, the largest step, the
    budget, and the autopilot's prefill allowance when it ran."""
    steps, n, nb, mids, x = b.steps, len(b.steps), b.nb, b.mids, b.x
    if n:
        pre = np.fromiter((s.num_prefill_tokens for s in steps), np.float64, n)
        dec = np.fromiter((s.num_decode_reqs for s in steps), np.float64, n)
        budget = np.fromiter((s.max_num_batched_tokens for s in steps), np.float64, n)
        mp, md = _binned(x, pre, nb, "mean"), _binned(x, dec, nb, "mean")
        mx = _binned(x, pre + dec, nb, "max")
        bud = _ffill(_binned(x, budget, nb, "max"))
        md0, mp0 = np.nan_to_num(md), np.nan_to_num(mp)
        # log axis: the mean step (tens of tokens) and the budget (thousands) both readable
        ax.fill_between(mids, 0.5, np.maximum(md0, 0.5), step="mid", color=DECODE, alpha=0.85,
                        lw=0, label="decode (mean)")
        ax.fill_between(mids, np.maximum(md0, 0.5), np.maximum(md0 + mp0, 0.5), step="mid",
                        color=PREFILL, alpha=0.9, lw=0, label="prefill (mean, on top)")
        ax.plot(mids, mx, drawstyle="steps-mid", color="#555555", lw=0.5, alpha=0.7,
                label="largest step")
        ax.plot(mids, bud, drawstyle="steps-mid", color="#B03A2E", lw=1.0, ls="--",
                label="budget (max_num_batched_tokens)")
        ap = autopilot_series(view, span_s)  # the same bins (span, step start)
        if ap is not None:
            ax.plot(mids, ap["allowance"], drawstyle="steps-mid", color=ALLOWANCE, lw=0.9,
                    label="prefill allowance (autopilot, mean)")
        top = token_ylim or np.nanmax(np.concatenate([mx, bud])) * 1.5
        ax.set_yscale("log")
        ax.set_ylim(0.5, top if math.isfinite(top) and top > 1 else 10)
        ax.legend(**_LEGEND)
    ax.set_ylabel("tokens (log)")
    ax.set_title("Tokens per step: prefill and decode (mean per bin, stacked), largest step, "
                 "token budget" + (", the autopilot's prefill allowance"
                                   if n and autopilot_absent(view) is None else ""))


def _queue_panel(ax: Any, b: _Bins) -> None:
    """Running and waiting requests, mean per bin, carried over bins without a step."""
    steps, n = b.steps, len(b.steps)
    if n:
        run = np.fromiter((s.num_running for s in steps), np.float64, n)
        wait = np.fromiter((s.num_waiting for s in steps), np.float64, n)
        ax.plot(b.mids, _ffill(_binned(b.x, run, b.nb, "mean")), drawstyle="steps-mid",
                color="#4C72B0", lw=1.0, label="running")
        ax.plot(b.mids, _ffill(_binned(b.x, wait, b.nb, "mean")), drawstyle="steps-mid",
                color="#C44E52", lw=1.0, label="waiting")
        ax.legend(**_LEGEND)
        ax.set_ylim(bottom=0)
    ax.set_ylabel("requests")
    ax.set_title("Queue: running and waiting requests (mean per bin)")


def _kv_panel(ax: Any, b: _Bins) -> None:
    """KV cache blocks in use (%), max per bin."""
    steps, n = b.steps, len(b.steps)
    if n:
        kv = np.fromiter((s.kv_blocks_used / s.kv_blocks_total * 100 if s.kv_blocks_total else 0.0
                          for s in steps), np.float64, n)
        y = _ffill(_binned(b.x, kv, b.nb, "max"))
        ax.fill_between(b.mids, np.nan_to_num(y), step="mid", color="#8172B3", alpha=0.5, lw=0)
        ax.plot(b.mids, y, drawstyle="steps-mid", color="#5A4E8C", lw=0.7)
        top = np.nanmax(y) if np.isfinite(y).any() else 1.0
        ax.set_ylim(0, max(1.0, min(100.0, top * 1.25)))
    ax.set_ylabel("KV used %")
    ax.set_title("KV cache blocks in use (max per bin)")


def _gpu_panel(ax: Any, b: _Bins, samples: Any, gpu_fields: list[str], has_power: bool) -> None:
    """The GPU's utilisation fields (%) and, on a right axis, its power (W); the mean of the
    GPUs when there are several."""
    colours = {"sm_active": "#4C72B0", "tensor_active": "#55A868", "dram_bw_util": "#DD8452"}
    gb = max(b.bin_s, 0.1)  # GPM windows are >= 100 ms: finer bins only repeat values
    gn = max(1, int(math.ceil(b.span / gb)))
    gm = np.arange(gn) * gb + gb / 2
    t0 = b.t0
    for f in gpu_fields:
        _, v = b.snap.sample_waveform(f, t0, t0 + int(gn * gb * 1e9), gn)
        ax.plot(gm, v, color=colours[f], lw=0.9, label=f"{BY_NAME[f].label} {BY_NAME[f].unit}")
    ax.set_ylim(0, 105)
    ax.set_ylabel("%")
    handles, labels = ax.get_legend_handles_labels()
    if has_power:
        ax2 = ax.twinx()
        _, pw = b.snap.sample_waveform("power_w", t0, t0 + int(gn * gb * 1e9), gn)
        ax2.plot(gm, pw, color="#888888", lw=0.8, ls="-", alpha=0.9, label="power W")
        ax2.set_ylabel("W")
        ax2.set_ylim(bottom=0)
        ax2.grid(False)
        ax2.spines["right"].set_visible(True)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, **{**_LEGEND, "bbox_to_anchor": (1.075, 1.0)})
    ng = len({g.gpu for g in samples})
    ax.set_title("GPU (NVML/GPM): SM active, tensor active, DRAM bandwidth, power"
                 + (f" — mean of {ng} GPUs (each: see Per-GPU)" if ng > 1 else ""))


def _latency_panel(ax: Any, b: _Bins, view: TraceView) -> None:
    """Each request's TTFT at its arrival, and the P99 inter-token gap per coarse bin (about 60
    of them: a percentile needs gaps to pool) — log ms."""
    span, t0 = b.span, b.t0
    reqs = [r for r in view.trace.requests if r.token_times_ns]
    if reqs:
        at = np.array([view.t(r.arrival_ns) for r in reqs])
        ttft = np.array([r.ttft_ms for r in reqs])
        ax.scatter(at, np.maximum(ttft, 1e-3), s=5, color="#C44E52", alpha=0.6, lw=0,
                   label="TTFT of each request (at its arrival)", rasterized=len(reqs) > 3000)
        coarse = max(b.bin_s, _nice_bin(span * TARGET_BINS / 60))
        cn = max(1, int(math.ceil(span / coarse)))
        gaps: list[list[float]] = [[] for _ in range(cn)]
        for r in reqs:
            t = r.token_times_ns
            for i in range(1, len(t)):
                k = int((t[i] - t0) / 1e9 / coarse)
                if 0 <= k < cn:
                    gaps[k].append((t[i] - t[i - 1]) / 1e6)
        p99 = np.array([np.percentile(g, 99) if g else np.nan for g in gaps])
        ax.plot(np.arange(cn) * coarse + coarse / 2, p99, drawstyle="steps-mid", color="#2F5F8A",
                lw=1.1, label=f"P99 ITL per {coarse:g} s")
        ax.set_yscale("log")
        ax.legend(**_LEGEND)
    ax.set_ylabel("ms")
    ax.set_title("Latency over time: TTFT per request, P99 inter-token latency")
