"""Step-level figures: close-ups of a busy stretch, step by step (bar width = wall time, height
= tokens), and the batch composition (steps and compute time by kind, tokens per step)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from gpuchef.probes.timeline import busy_fraction

from .data import Group
from .plot_kit import DECODE, MIXED, PREFILL, _figure, _log_x, _with_rc, to_svg


def closeup_window(steps: Sequence[Any], width_ns: int) -> tuple[int, int]:
    """The ``width_ns`` stretch with the most prefill tokens (ties: the earliest): where the
    difference between the modes shows. Returns (t0_ns, t1_ns)."""
    if not steps:
        return 0, width_ns
    st = sorted(steps, key=lambda s: s.t_start_ns)
    best, best_t, j, acc = -1, st[0].t_start_ns, 0, 0
    for i, s in enumerate(st):
        acc += s.num_prefill_tokens
        while st[j].t_start_ns < s.t_start_ns - width_ns:
            acc -= st[j].num_prefill_tokens
            j += 1
        if acc > best:
            best, best_t = acc, st[j].t_start_ns
    return best_t, best_t + width_ns


def closeup_steps(steps: Sequence[Any], a: int, b: int) -> list[Any]:
    """The steps that overlap ``[a, b)`` (ns), by start: a long prefill step that began before
    the stretch is in it (it was drawn as idle time when only starts in the stretch counted)."""
    return sorted((s for s in steps if s.t_start_ns < b and s.t_end_ns > a),
                  key=lambda s: s.t_start_ns)


def closeup_stats(steps: Sequence[Any], a: int, b: int) -> tuple[int, float]:
    """(steps overlapping ``[a, b)``, share of the stretch the model computed: each step's
    compute counted for the part of its wall time inside the stretch,
    ``probes.timeline.busy_fraction``)."""
    sel = closeup_steps(steps, a, b)
    return len(sel), busy_fraction(sel, a, b)


@_with_rc
def closeups(groups: Sequence[Group], aligned: bool = False) -> str:
    """Each group's busiest stretch (most prefill tokens) drawn step by step: a bar per step
    spanning its wall time, as high as its tokens (log axis), coloured by kind (decode only,
    mixed, prefill only), the budget dashed, and on the right axis the requests decoding in each
    step — under continuous batching it drops to zero during a prefill: the decodes stall.
    White gaps are time the engine was not stepping. ``aligned``: the groups replayed the same
    load (one trace each): show all at the first group's stretch, at the same time since each
    trace's start, so that they serve the same arrivals."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    walls = [np.median([s.t_end_ns - s.t_start_ns for s in g.steps]) for g in groups if g.steps]
    width = int(min(5e9, max(0.25e9, 100 * max(walls)))) if walls else int(1e9)
    fig = _figure(11.5, 2.0 * len(groups) + 0.6)
    axes = np.atleast_1d(fig.subplots(len(groups), 1, sharey=True))
    picks = []
    offset = None
    for g in groups:
        if aligned and offset is not None:
            a = g.view.origin_ns + offset
            b = a + width
        else:
            a, b = closeup_window(g.steps, width)
            offset = a - g.view.origin_ns
        picks.append((a, b, closeup_steps(g.steps, a, b)))
    dmax = max([s.num_decode_reqs for _, _, sel in picks for s in sel] or [1])
    tmax = max([s.num_tokens for _, _, sel in picks for s in sel] +
               [s.max_num_batched_tokens for _, _, sel in picks for s in sel] or [10])
    colors = {"decode only": DECODE, "mixed": MIXED, "prefill only": PREFILL}
    for ax, g, (a, b, sel) in zip(axes, groups, picks):
        ax2 = ax.twinx()
        if sel:
            x = np.array([(s.t_start_ns - a) / 1e6 for s in sel])
            w = np.array([(s.t_end_ns - s.t_start_ns) / 1e6 for s in sel])
            ax.bar(x, [max(s.num_tokens, 1) for s in sel], width=w, align="edge", lw=0,
                   color=[colors[_kind(s)] for s in sel])
            ends = x + w
            ax.step([0, *ends], [sel[0].max_num_batched_tokens,
                                 *[s.max_num_batched_tokens for s in sel]],
                    where="pre", color="#B03A2E", ls="--", lw=0.9)
            ax2.step([*x, ends[-1]], [*[s.num_decode_reqs for s in sel], sel[-1].num_decode_reqs],
                     where="post", color="#1F3B57", lw=1.1)
            n, share = closeup_stats(sel, a, b)
            ax.text(0.995, 0.97, f"{n} steps; model compute {share:.0%} of the stretch",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#555555")
        ax.set_yscale("log")
        ax.set_ylim(0.8, tmax * 3)
        ax.set_xlim(0, width / 1e6)
        ax.set_ylabel("tokens (log)")
        ax2.set_ylim(0, dmax * 1.25 + 1)
        ax2.set_ylabel("decoding")
        ax2.grid(False)
        ax2.spines["right"].set_visible(True)
        ax.set_title(f"{g.label} — t = {g.view.t(a):.2f} s … {g.view.t(b):.2f} s",
                     color=g.color)
    axes[-1].set_xlabel("ms into the stretch (bar width = the step's wall time)")
    handles = [Patch(color=DECODE, label="decode-only step"), Patch(color=MIXED, label="mixed step"),
               Patch(color=PREFILL, label="prefill-only step"),
               Line2D([], [], color="#B03A2E", ls="--", label="token budget"),
               Line2D([], [], color="#1F3B57", label="requests decoding in the step (right axis)")]
    fig.legend(handles=handles, loc="outside upper center", ncol=5)
    return to_svg(fig, "closeups", "Step-by-step close-up of each group's busiest stretch")


# ---- batch composition -----------------------------------------------------------------------------

def composition(steps: Sequence[Any]) -> dict[str, tuple[int, float, float]]:
    """Steps by kind — "decode only", "prefill only", "mixed" — as (count, share of steps,
    share of compute time) each."""
    kinds = {"decode only": [0, 0.0], "prefill only": [0, 0.0], "mixed": [0, 0.0]}
    for s in steps:
        k = _kind(s)
        kinds[k][0] += 1
        kinds[k][1] += s.gpu_ms
    n = sum(v[0] for v in kinds.values()) or 1
    t = sum(v[1] for v in kinds.values()) or 1.0
    return {k: (v[0], v[0] / n, v[1] / t) for k, v in kinds.items()}


_KIND_LABEL = {"prefill_only": "prefill only", "mixed": "mixed", "decode_only": "decode only"}


def _kind(s: Any) -> str:
    return _KIND_LABEL[s.kind]  # StepRecord.kind, in the report's words


@_with_rc
def composition_hist(groups: Sequence[Group]) -> str:
    """Histogram of tokens per step (log bins), stacked by step kind, one panel per group."""
    tot = [s.num_prefill_tokens + s.num_decode_reqs for g in groups for s in g.steps]
    top = max(tot) if tot else 2
    bins = np.unique(np.round(np.logspace(0, math.log10(max(2, top)) + 1e-9, 28)).astype(int))
    bins = np.append(bins, bins[-1] + 1)
    cols = min(len(groups), 3)
    rows = math.ceil(len(groups) / cols)
    fig = _figure(11.5, 2.6 * rows + 0.3)
    axes = np.atleast_1d(fig.subplots(rows, cols, sharex=True, sharey=True)).ravel()
    for ax, g in zip(axes, groups):
        data = {k: [s.num_prefill_tokens + s.num_decode_reqs for s in g.steps if _kind(s) == k]
                for k in ("decode only", "mixed", "prefill only")}
        ax.hist([data["decode only"], data["mixed"], data["prefill only"]], bins=bins,
                stacked=True, color=[DECODE, MIXED, PREFILL], label=list(data), lw=0)
        _log_x(ax)
        ax.set_title(g.label, color=g.color)
        ax.set_xlabel("tokens in the step")
        comp = composition(g.steps)
        ax.text(0.98, 0.95, "\n".join(f"{k}: {c[1]:.1%} of steps" for k, c in comp.items()),
                transform=ax.transAxes, ha="right", va="top", fontsize=7.5, color="#444444")
        ax.set_yscale("log")
    for ax in axes[len(groups):]:
        ax.set_visible(False)
    axes[0].set_ylabel("steps (log)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncol=3)
    return to_svg(fig, "composition", "Batch composition histogram per group")
