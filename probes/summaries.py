"""What a run's steps and GPU samples say beside its results block (``probes.metrics``):

* the GPU fields' means over the samples, one NaN policy for all (:func:`gpu_value`,
  :func:`gpu_means`; ``GPU_FIELDS`` sampled, ``GPU_SUMMARY_FIELDS`` shown);
* what the autopilot did (:func:`autopilot_totals`: steps per state, the targets in force at
  the end, and the ITL the steered steps got against its target, :func:`steered_itl_ms`).

``probes.metrics`` imports these names too (where callers have always found them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuchef.engine_host.autopilot import STEERING
from gpuchef.engine_host.vocab.config import parse_auto_budget
from gpuchef.engine_host.vocab.records import StepRecord

from .nvml.fields import MEAN_FIELDS, SUMMARY_FIELDS

NAN = float("nan")


#: The GPU fields averaged over a span (``probes.nvml.GpuSample`` attributes, % or W) and the
#: ones the summaries show (bench's results block, ``ab``, the report, the dashboard's GPU
#: panels): both from the one table of GPU fields, ``probes/nvml/fields.py``.
GPU_FIELDS = MEAN_FIELDS
GPU_SUMMARY_FIELDS = SUMMARY_FIELDS


def gpu_value(v: float | None) -> float:
    """A GpuSample field as a float: NaN when it was not measured — None (not read this tick)
    or NaN/inf (a GPM window NVML could not compute). The one NaN policy of every GPU mean."""
    if v is None:
        return NAN
    v = float(v)
    return v if math.isfinite(v) else NAN


def gpu_means(samples: Iterable[Any], fields: Sequence[str] = GPU_SUMMARY_FIELDS
              ) -> dict[str, float]:
    """Mean of each of ``fields`` over GpuSamples ``samples`` (all GPUs pooled), leaving out
    values that were not measured (:func:`gpu_value`); NaN for a field no sample has. On the
    H200 three NaN DRAM readings in 1448 must not turn a run's mean into "n/a"."""
    sums = dict.fromkeys(fields, 0.0)
    counts = dict.fromkeys(fields, 0)
    for g in samples:
        for f in fields:
            v = getattr(g, f)
            if v is not None and v == v and v not in (math.inf, -math.inf):
                sums[f] += v
                counts[f] += 1
    return {f: sums[f] / counts[f] if counts[f] else NAN for f in fields}


def gpu_result_rows(means: dict[str, float]) -> dict[str, str]:
    """The results block's GPU rows of :func:`gpu_means`' ``means`` (fields absent or NaN read
    "n/a"): SM active / tensor active, DRAM bandwidth / GPU-Util (mean %), power (mean W). The
    one spelling of those rows in bench, ab and the report."""
    def f(k: str) -> str:
        v = means.get(k, NAN)
        return "n/a" if v != v else f"{v:.1f}"

    return {"GPU SM active / tensor active (mean %):": f"{f('sm_active')} / {f('tensor_active')}",
            "GPU DRAM BW util / GPU-Util (mean %):": f"{f('dram_bw_util')} / {f('gpu_util')}",
            "GPU power (mean W):": f("power_w")}


def steered_itl_ms(steps: Iterable[StepRecord], stat: str) -> float:
    """The ITL statistic ``stat`` ("p99", "p<q>", "median" or "mean", as an autopilot target
    names it) over the decode tokens of the steps the autopilot steered (ms; NaN when there
    are none): each step's ``itl_ms`` counted once per decode row, which is the pooled
    per-token ITL ``vllm bench serve`` computes (one gap per token, linear interpolation) for
    the tokens those steps produced. The number the autopilot's promise is about: its ITL
    target holds where this is within it (docs/autopilot.md, "The ITL contract")."""
    itl, rows = [], []
    for x in steps:
        if x.autopilot_state == STEERING and x.itl_ms > 0 and x.num_decode_reqs:
            itl.append(x.itl_ms)
            rows.append(x.num_decode_reqs)
    if not itl:
        return NAN
    a, w = np.asarray(itl), np.asarray(rows)
    if stat == "mean":
        return float(np.dot(a, w) / w.sum())
    q = 50.0 if stat == "median" else float(stat[1:])
    # np.percentile's linear interpolation over the tokens (each step's ITL ``w`` times),
    # read off the cumulative counts instead of repeating the values (the dashboard asks this
    # every frame over its window: 6000 steps × 256 rows repeated cost 18 ms a call)
    o = np.argsort(a, kind="stable")
    xs, c = a[o], np.cumsum(w[o])
    pos = q / 100.0 * (c[-1] - 1)
    lo = int(math.floor(pos))
    v_lo = xs[np.searchsorted(c, lo, side="right")]
    v_hi = xs[np.searchsorted(c, min(lo + 1, int(c[-1]) - 1), side="right")]
    return float(v_lo + (pos - lo) * (v_hi - v_lo))


@dataclass
class AutopilotTotals:
    """What the autopilot did over a run: ``steps`` (StepRecords that ran with it: ``auto_budget``
    set and a ``prefill_allowance`` ≥ 0, i.e. chunked steps), ``states`` (steps per
    ``autopilot_state``, engine_host.autopilot.STATES' names), ``last`` (the newest such step),
    ``itl_ms`` (the ITL statistic of the targets in force at the end, over the steered steps'
    decode tokens: :func:`steered_itl_ms`; NaN when none)."""
    steps: int
    states: dict[str, int]
    last: StepRecord
    itl_ms: float = NAN

    def itl_text(self) -> str:
        """``"P99 ITL 47.2 ms ≤ 50 ms: kept"`` / ``"… > 50 ms: missed"`` (steered steps), ""
        when no steered step had decode rows."""
        if self.itl_ms != self.itl_ms:
            return ""
        spec = parse_auto_budget(self.last.auto_budget)
        kept = self.itl_ms <= spec.itl_ms
        return (f"{spec.itl_stat.upper() if spec.itl_stat.startswith('p') else spec.itl_stat} "
                f"ITL {self.itl_ms:.1f} ms {'≤' if kept else '>'} {spec.itl_ms:g} ms: "
                f"{'kept' if kept else 'missed'}")

    def short(self) -> str:
        """``"steering 858/940"``: the share of steps the model chose (fits an A/B column)."""
        return f"{STEERING} {self.states.get(STEERING, 0)}/{self.steps}"

    def line(self) -> str:
        """``"itl_p99:50ms,ttft_p99:2000ms; 940 steps: steering 858, learning 72; fit error at
        the end 12 %; steered: P99 ITL 47.2 ms ≤ 50 ms: kept"`` (the targets in force at the
        end)."""
        states = ", ".join(f"{k} {v}" for k, v in sorted(self.states.items()))
        fe = self.last.fit_error
        err = f"{fe * 100:.0f} %" if fe is not None and fe >= 0 else "not tracked yet"
        itl = self.itl_text()
        return (f"{self.last.auto_budget}; {self.steps} steps: {states}; fit error at the end "
                f"{err}" + (f"; steered: {itl}" if itl else ""))


def autopilot_totals(steps: Iterable[StepRecord]) -> AutopilotTotals | None:
    """:class:`AutopilotTotals` of the StepRecords, in step order (by ``t_start_ns``); None when
    no step ran with the autopilot choosing an allowance (off throughout, or idle: continuous
    mode never asks it)."""
    ap = sorted((x for x in steps if x.auto_budget and x.prefill_allowance >= 0),
                key=lambda x: x.t_start_ns)
    if not ap:
        return None
    states: dict[str, int] = {}
    for x in ap:
        states[x.autopilot_state] = states.get(x.autopilot_state, 0) + 1
    last = ap[-1]
    stat = parse_auto_budget(last.auto_budget).itl_stat
    return AutopilotTotals(len(ap), states, last,
                           steered_itl_ms((x for x in ap if x.auto_budget == last.auto_budget),
                                          stat))
