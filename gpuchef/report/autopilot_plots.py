"""The autopilot's figure: its prefill allowance against the budget and the prefill it got,
predicted against actual step time, its fit error, and the states it was in."""

from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np

from gpuchef.engine_host.autopilot import (ERROR_ENTER, ERROR_LEAVE, FALLBACK, INFEASIBLE,
                                          LEARNING, NOT_STEERING, STATE_MEANING, STEERING)
from gpuchef.probes.metrics import autopilot_totals

from .data import TraceView
from .plot_kit import (_LEGEND, INK, PREFILL, _binned, _events_overlay, _ffill, _figure, _nice_bin,
                       _slug, _with_rc, to_svg)


#: The autopilot's per-step states (``StepRecord.autopilot_state``, named and explained by
#: ``engine_host.autopilot.STATES``) and their colours.
AP_STATES = {STEERING: "#2A9D8F", LEARNING: "#E9A23B", INFEASIBLE: "#7B4FA0", FALLBACK: "#C44E52"}
ALLOWANCE = "#5B8C2A"


def ap_state_label(state: str) -> str:
    """The legend's entry for a state the autopilot did not steer in: "not steering:
    infeasible — the model predicts the decodes alone … the static budget, for TTFT"."""
    return textwrap.fill(f"not steering: {state} — {STATE_MEANING[state]}", 44)


def autopilot_absent(view: TraceView) -> str | None:
    """Why the trace has no autopilot figure (None: it has one): the autopilot off throughout,
    or on but with no chunked step (it is idle in continuous mode)."""
    steps = view.trace.steps
    if not any(s.auto_budget for s in steps):
        return ("the autopilot was off throughout (no step ran with --auto-budget): there is "
                "no allowance or predicted step time to draw")
    if not any(s.auto_budget and s.prefill_allowance >= 0 for s in steps):
        return ("the autopilot was on but chose no allowance: no chunked step ran with it "
                "(in continuous mode prompts are never split, so it is idle)")
    return None


def autopilot_series(view: TraceView, span_s: float | None = None) -> dict[str, Any] | None:
    """The autopilot's figures per time bin, from the StepRecords that ran with it
    (``auto_budget`` set, ``prefill_allowance`` ≥ 0), binned by step start as the waveforms
    are: ``t_s`` (bin middles, s), ``allowance`` (mean ``prefill_allowance``, tokens),
    ``prefill`` (mean ``num_prefill_tokens`` of the same steps), ``budget`` (the largest
    ``max_num_batched_tokens``, carried over empty bins), ``wall_ms`` / ``predicted_ms`` (mean
    actual ``wall_ms`` and mean ``predicted_ms`` of the steps with a prediction — the same
    steps for both), ``fit_error_pct`` (mean ``fit_error`` × 100 of the steps tracking it),
    ``state`` (the last step's ``autopilot_state`` per bin, "" none); and totals: ``steps``,
    ``states`` (steps per state), ``last`` (the newest such StepRecord). None when
    :func:`autopilot_absent` gives a reason."""
    if autopilot_absent(view) is not None:
        return None
    ap = sorted((s for s in view.trace.steps if s.auto_budget and s.prefill_allowance >= 0),
                key=lambda s: s.t_start_ns)
    span = span_s or max(view.t(view.end_ns), 1e-3)
    bin_s = _nice_bin(span)
    nb = max(1, int(math.ceil(span / bin_s)))
    n = len(ap)
    ts = np.fromiter((s.t_start_ns for s in ap), np.int64, n)
    x = ((ts - view.origin_ns) / 1e9 / bin_s).astype(np.int64)

    def col(f):
        return np.fromiter((getattr(s, f) for s in ap), np.float64, n)

    pred, fe = col("predicted_ms"), col("fit_error")
    hp, he = pred >= 0, fe >= 0
    wall = col("wall_ms")
    state = [""] * nb
    for i, s in zip(np.clip(x, 0, nb - 1), ap):
        state[int(i)] = s.autopilot_state
    tot = autopilot_totals(ap)
    return {
        "t_s": np.arange(nb) * bin_s + bin_s / 2, "bin_s": bin_s,
        "allowance": _binned(x, col("prefill_allowance"), nb, "mean"),
        "prefill": _binned(x, col("num_prefill_tokens"), nb, "mean"),
        "budget": _ffill(_binned(x, col("max_num_batched_tokens"), nb, "max")),
        "wall_ms": _binned(x[hp], wall[hp], nb, "mean"),
        "predicted_ms": _binned(x[hp], pred[hp], nb, "mean"),
        "fit_error_pct": _binned(x[he], fe[he] * 100.0, nb, "mean"),
        "state": state, "steps": tot.steps, "states": tot.states, "last": tot.last,
        "totals": tot,
    }


@_with_rc
def autopilot_figure(view: TraceView, span_s: float | None = None) -> Any | None:
    """Three panels over time for a trace with autopilot steps (None without): the prefill
    allowance it chose over the prefill tokens the steps carried and the static budget; the
    model's predicted vs the actual step time (ms); its fit error (%) against the thresholds
    at which it steers (≤ ERROR_ENTER) and falls back (> ERROR_LEAVE). Bins where it did not
    steer are shaded by state (learning, infeasible, fallback), the legend saying what each
    means (``STATE_MEANING``)."""
    d = autopilot_series(view, span_s)
    if d is None:
        return None
    t, bs = d["t_s"], d["bin_s"]
    fig = _figure(11.5, 5.2)
    ax1, ax2, ax3 = fig.subplots(3, 1, sharex=True)
    ax1.fill_between(t, np.nan_to_num(d["prefill"]), step="mid", color=PREFILL, alpha=0.8, lw=0,
                     label="prefill tokens per step (mean)")
    ax1.plot(t, d["allowance"], drawstyle="steps-mid", color=ALLOWANCE, lw=1.2,
             label="prefill allowance (autopilot, mean)")
    ax1.plot(t, d["budget"], drawstyle="steps-mid", color="#B03A2E", lw=1.0, ls="--",
             label="budget (max_num_batched_tokens)")
    for st in NOT_STEERING:
        on = np.array([x == st for x in d["state"]])
        if on.any():
            for a in (ax1, ax2, ax3):
                a.fill_between(t, 0, 1, where=on, step="mid", color=AP_STATES[st], alpha=0.12,
                               lw=0, transform=a.get_xaxis_transform(),
                               label=ap_state_label(st) if a is ax1 else None)
    ax1.set_ylim(bottom=0)
    ax1.set_ylabel("tokens")
    ax1.set_title("Autopilot: the prefill allowance it chose per step, over the prefill the "
                  f"steps carried (mean per {bs * 1e3:g} ms bin)")
    ax1.legend(**_LEGEND)
    ax2.plot(t, d["wall_ms"], drawstyle="steps-mid", color="#555555", lw=1.0,
             label="actual step time (wall_ms)")
    ax2.plot(t, d["predicted_ms"], drawstyle="steps-mid", color=ALLOWANCE, lw=1.0, ls="--",
             label="predicted (predicted_ms)")
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel("ms")
    ax2.set_title("Step time: the model's prediction vs the actual (the same steps, mean per bin)")
    ax2.legend(**_LEGEND)
    ax3.plot(t, d["fit_error_pct"], drawstyle="steps-mid", color=INK, lw=1.0,
             label="fit error (the model's tracked mean relative error)")
    ax3.axhline(ERROR_ENTER * 100, color=AP_STATES[STEERING], lw=0.8, ls=":",
                label=f"steers at ≤ {ERROR_ENTER:.0%}")
    ax3.axhline(ERROR_LEAVE * 100, color=AP_STATES[FALLBACK], lw=0.8, ls=":",
                label=f"falls back above {ERROR_LEAVE:.0%}")
    ax3.set_ylim(0, max(60.0, float(np.nanmax(d["fit_error_pct"])) * 1.15
                        if np.isfinite(d["fit_error_pct"]).any() else 60.0))
    ax3.set_ylabel("%")
    ax3.set_title("Fit error of the step-time model")
    ax3.legend(**_LEGEND)
    ax3.set_xlabel("time since the start of the trace (s)")
    ax3.set_xlim(0, span_s or max(view.t(view.end_ns), 1e-3))
    for a in (ax1, ax2, ax3):
        _events_overlay(a, view, label=False, span_s=span_s or max(view.t(view.end_ns), 1e-3))
    return fig


def autopilot(view: TraceView, span_s: float | None = None) -> str | None:
    """:func:`autopilot_figure` as SVG (None: no autopilot steps, see :func:`autopilot_absent`)."""
    fig = autopilot_figure(view, span_s)
    if fig is None:
        return None
    return to_svg(fig, f"autopilot-{_slug(view.name)}", f"The autopilot in {view.name}")
