"""The per-GPU figure: each GPU of a trace over time, the spread across GPUs, DRAM bandwidth and
power per GPU (tensor-parallel ranks should move in lock step)."""

from __future__ import annotations

import math

import numpy as np

from gpuchef.probes.nvml.fields import BY_NAME

from .data import PALETTE, TraceView, gpu_indices, gpu_names, per_gpu_means
from .plot_kit import (_LEGEND, LABEL_ROW_PT, _events_overlay, _figure, _nice_bin, _slug, _timeline,
                       _with_rc, to_svg)


#: The per-GPU figure's utilisation measure, best first: (GpuSample field, what it is), e.g.
#: "SM active (GPM: share of SMs busy)" — label, source and meaning from the table of GPU fields.
UTIL_FIELDS = tuple((f, f"{g.label} ({g.source}: {g.what})")
                    for f in ("sm_active", "gpu_util") for g in [BY_NAME[f]])


def util_field(view: TraceView) -> tuple[str, str] | None:
    """The utilisation measure the per-GPU figure plots, as (field, description): SM active when
    every GPU of the trace has it, else GPU-Util when any GPU has that (one measure for all the
    GPUs, so that they compare), else None."""
    gpus = set(gpu_indices(view))
    for f, what in UTIL_FIELDS:
        have = {g.gpu for g in view.trace.gpu_samples if getattr(g, f) is not None}
        if have == gpus or (have and f == "gpu_util"):
            return f, what
    return None


def spread(v: np.ndarray) -> np.ndarray:
    """Max − min across GPUs per bin: ``v`` (n_gpus, n_bins) → (n_bins,), NaN where fewer than
    two GPUs have a value."""
    ok = np.isfinite(v).sum(axis=0) >= 2
    return np.where(ok, np.fmax.reduce(v, axis=0) - np.fmin.reduce(v, axis=0), np.nan)


@_with_rc
def per_gpu(view: TraceView, span_s: float | None = None) -> str | None:
    """Each GPU of a multi-GPU trace over time, one line per GPU (mean per bin of >= 0.1 s, the
    GPM window): utilisation (%; SM active, or GPU-Util when GPM was off — see ``util_field``)
    with the min…max band across GPUs, the spread across GPUs per bin (max − min, percentage
    points: a rank of a tensor-parallel group that lags or idles shows as a lasting spread),
    DRAM bandwidth (% of peak) and power (W) when sampled. None when no such field was sampled."""
    tr = view.trace
    gpus = gpu_indices(view)
    names = gpu_names(view)
    means = per_gpu_means(view)
    util = util_field(view)
    dram, power = BY_NAME["dram_bw_util"], BY_NAME["power_w"]
    extra = [(f.name, t, f.unit) for f, t in (
        (dram, f"{dram.label} per GPU ({dram.source}, {dram.unit} of peak)"),
        (power, f"Board {power.label} per GPU ({power.source})"))
        if any(getattr(g, f.name) is not None for g in tr.gpu_samples)]
    same = len({names.get(k) for k in gpus}) == 1 and names.get(gpus[0])  # one name for all
    panels: list[tuple[str, str, str]] = []
    if util:
        panels += [(util[0], f"{util[1]} per GPU, % (band: min…max across GPUs)"
                    + (f" — {len(gpus)} × {same}" if same else ""), "%"),
                   ("spread", "Spread across GPUs: max − min of "
                    f"{util[1].split(' (')[0]} per bin", "pp")]
    panels += extra
    if not panels:
        return None
    span = span_s or max(view.t(view.end_ns), 1e-3)
    gb = max(_nice_bin(span), 0.1)  # GPM windows are >= 100 ms: finer bins only repeat values
    gn = max(1, int(math.ceil(span / gb)))
    mids = np.arange(gn) * gb + gb / 2
    t0 = view.origin_ns
    t1 = t0 + int(gn * gb * 1e9)
    snap = _timeline(view)
    ratios = [0.55 if f == "spread" else 1.0 for f, _, _ in panels]
    fig = _figure(11.5, 1.6 * sum(ratios) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(panels), 1, sharex=True,
                                      gridspec_kw={"height_ratios": ratios}))
    series: dict[str, np.ndarray] = {}
    for ax, (f, title, unit) in zip(axes, panels):
        if f == "spread":
            sp = spread(series[util[0]])
            ax.fill_between(mids, np.nan_to_num(sp), step="mid", color="#C44E52", alpha=0.35, lw=0)
            ax.plot(mids, sp, drawstyle="steps-mid", color="#9B2D30", lw=0.8)
            have = np.flatnonzero(np.isfinite(sp))
            if have.size:  # the mean, drawn over the bins it is taken over
                ax.hlines(float(np.nanmean(sp)), mids[have[0]] - gb / 2, mids[have[-1]] + gb / 2,
                          color="#9B2D30", lw=0.8, ls="--", label=f"mean {np.nanmean(sp):.1f} pp")
                ax.legend(**_LEGEND)
            ax.set_ylim(bottom=0)
        else:
            v = np.vstack([snap.sample_waveform(f, t0, t1, gn, gpu=k)[1] for k in gpus])
            series[f] = v
            if f == (util[0] if util else None) and len(gpus) > 1:
                lo, hi = np.fmin.reduce(v, axis=0), np.fmax.reduce(v, axis=0)
                ax.fill_between(mids, lo, hi, step="mid", color="#999999", alpha=0.2, lw=0,
                                label="min…max")
            for i, k in enumerate(gpus):
                m = means[k][f]
                lab = f"GPU {k}" + (f" · {names[k]}" if names.get(k) and not same else "")
                lab += f" (mean {m:.0f} {unit})" if math.isfinite(m) else " (not sampled)"
                ax.plot(mids, v[i], drawstyle="steps-mid", color=PALETTE[i % len(PALETTE)],
                        lw=1.0, label=lab)
            if unit == "%":
                ax.set_ylim(0, 105)
            else:
                ax.set_ylim(bottom=0)
            ax.legend(**_LEGEND)
        ax.set_ylabel(unit)
        ax.set_title(title, pad=12 if ax is axes[0] else None)
    axes[-1].set_xlabel("time since the start of the trace (s)")
    axes[-1].set_xlim(0, span)
    for i, a in enumerate(axes):
        rows = _events_overlay(a, view, label=(i == 0), span_s=span)
        if i == 0 and rows > 1:
            a.set_title(a.get_title(loc="left"), loc="left", pad=12 + LABEL_ROW_PT * (rows - 1))
    return to_svg(fig, f"gpus-{_slug(view.name)}", f"Per-GPU utilisation of {view.name}")
