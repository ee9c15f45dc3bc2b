"""Latency figures: the TTFT / TPOT / ITL / E2EL CDFs of each group, and the per-window figures
of an A/B trace (the run-to-run spread a verdict is judged against)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from gpuchef.probes.metrics import is_completed, is_probe_id

from .data import AB_COLORS, Group, TraceView
from .plot_kit import CDF_POINTS, CHAR_W, INK, _figure, _log_x, _slug, _with_rc, to_svg


def _cdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(np.asarray([x for x in values if x is not None and math.isfinite(x)], float))
    if v.size == 0:
        return v, v
    # plotting positions (i − 0.5)/n stay inside (0, 1), as the logit axis needs
    if v.size > CDF_POINTS:  # quantile-sample: same curve, bounded size
        q = np.concatenate([np.linspace(0.5 / v.size, 0.9, CDF_POINTS // 2),
                            1 - np.geomspace(0.1, 0.5 / v.size, CDF_POINTS // 2)])
        return np.quantile(v, q), q
    return v, (np.arange(1, v.size + 1) - 0.5) / v.size


def latency_values(g: Group) -> dict[str, list[float]]:
    """TTFT and TPOT per completed request, ITL pooled (ms): vllm bench serve's definitions."""
    out: dict[str, list[float]] = {"TTFT": [], "ITL": [], "TPOT": []}
    for r in g.requests:
        if not is_completed(r.finish_reason) or not r.token_times_ns:
            continue
        if is_probe_id(r.request_id):
            continue
        out["TTFT"].append(r.ttft_ms)
        if r.output_len > 1:
            out["TPOT"].append((r.e2el_ms - r.ttft_ms) / (r.output_len - 1))
        out["ITL"].extend(r.itls_ms)
    return out


def latency_cdfs(groups: Sequence[Group]) -> str:
    """:func:`latency_figure` as SVG."""
    return to_svg(latency_figure(groups), "cdfs", "Latency CDFs per group")


#: Log-axis label sets, densest first: (subs, decade stride).
_LOG_TICKS = (((1.0, 2.0, 3.0, 5.0, 7.0), 1), ((1.0, 2.0, 5.0), 1), ((1.0, 3.0), 1),
              ((1.0,), 1), ((1.0,), 2), ((1.0,), 3), ((1.0,), 5))


def log_ticks(lo: float, hi: float, width_pt: float, font: float = 8.0
              ) -> tuple[tuple[float, ...], int]:
    """The densest (subs, decade stride) of ``_LOG_TICKS`` whose labels ("{:g}" of each tick in
    ``[lo, hi]``) fit side by side on a log axis ``width_pt`` points wide, 4 pt apart."""
    lo, hi = max(lo, 1e-12), max(hi, lo * 1.0001)
    span = math.log10(hi / lo)
    for subs, stride in _LOG_TICKS:
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1,
                                              math.ceil(math.log10(hi)) + 1)
                 if e % stride == 0 for m in subs]
        ticks = [t for t in ticks if lo <= t <= hi]
        pos = [math.log10(t / lo) / span * width_pt for t in ticks]
        half = [len(f"{t:g}") * CHAR_W * font / 2 for t in ticks]
        if all(pos[i + 1] - pos[i] >= half[i] + half[i + 1] + 4.0 for i in range(len(pos) - 1)):
            return subs, stride
    return _LOG_TICKS[-1]


@_with_rc
def latency_figure(groups: Sequence[Group]) -> Any:
    """Cumulative distributions of TTFT, ITL and TPOT (ms, log axis), one line per group, with
    the P99 marked; x labels thinned so that none overlaps (:func:`log_ticks`)."""
    from matplotlib.ticker import LogLocator, NullFormatter

    fig = _figure(11.5, 3.4)
    axes = fig.subplots(1, 3, sharey=True)
    vals = [latency_values(g) for g in groups]
    for ax, metric in zip(axes, ("TTFT", "ITL", "TPOT")):
        for g, v in zip(groups, vals):
            x, y = _cdf(v[metric])
            if not x.size:
                continue
            x = np.maximum(x, 1e-3)
            ax.plot(x, y, color=g.color, lw=1.4, label=g.label)
            p99 = float(np.percentile(v[metric], 99))
            ax.plot([max(p99, 1e-3)], [0.99], "o", color=g.color, ms=4)
        ax.axhline(0.99, color="#999999", lw=0.6, ls=":")
        _log_x(ax)
        ax.set_yscale("logit")
        ax.set_yticks([0.01, 0.1, 0.5, 0.9, 0.99, 0.999])
        ax.set_yticklabels(["1%", "10%", "50%", "90%", "99%", "99.9%"])
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{metric} (ms)")
        ax.set_title(metric + {"TTFT": ": time to first token", "ITL": ": gap between output "
                               "chunks", "TPOT": ": per request, excl. the 1st"}[metric])
        ax.set_ylim(0.005, 0.9995)
        lo, hi = ax.get_xlim()
        # a third of the figure, less the y labels: ~3 in of axis each
        subs, stride = log_ticks(lo, hi, 11.5 * 72 / 3 - 40)
        ax.xaxis.set_major_locator(LogLocator(base=10.0 ** stride, subs=subs))
    axes[0].set_ylabel("share ≤ x (logit axis)")
    axes[0].legend(loc="lower right")
    return fig


@_with_rc
def ab_windows_plot(view: TraceView, percentile: float = 99.0) -> str:
    """Per-window P-x TTFT and ITL and output throughput of an A/B trace, coloured by setting:
    the run-to-run spread the A/B verdict is judged against."""
    from gpuchef.probes.ab import pool

    fig = _figure(11.5, 2.6)
    axes = fig.subplots(1, 3)
    for seg in view.segments:
        if seg.result is None or not seg.result.requests:
            continue
        m, _ = pool([seg.result], (percentile,))  # probes.ab: the figures the tables show
        x = view.t(seg.t0_ns)
        c = AB_COLORS.get(seg.label[:1], INK)
        for ax, v in zip(axes, (m.percentiles_ttft_ms[0][1], m.percentiles_itl_ms[0][1],
                                m.output_throughput)):
            ax.plot([x], [v], "o", color=c, ms=5)
            ax.annotate(seg.name, (x, v), xytext=(3, 3), textcoords="offset points", fontsize=6.5,
                        color=c)
    p = f"P{percentile:g}"
    for ax, t in zip(axes, (f"{p} TTFT per window (ms)", f"{p} ITL per window (ms)",
                            "Output tokens/s per window")):
        ax.set_title(t)
        ax.set_xlabel("window start (s)")
        ax.set_ylim(bottom=0)
    return to_svg(fig, f"abwin-{_slug(view.name)}", f"A/B windows of {view.name}")
