"""TTFT of short and long prompts in one trace, split at the long-prompt lane's threshold
(``max_long_partial_prefills`` / ``long_prefill_token_threshold``): what the lane is for.
``benchmarks/lane_ttft.py`` prints it."""

from __future__ import annotations

import numpy as np

from .recorder import read_trace


def lane_ttft(path: str, short: int | None = None) -> dict:
    """TTFT of short and long prompts in one trace: what the long-prompt lane
    (``max_long_partial_prefills``) is for; a prompt is long when it has more than ``short``
    tokens (default: the ``long_prefill_token_threshold`` of the trace's first step).

    {"requests", "threshold", "no_first_token", "max_long_partial_prefills", "short": {...},
    "long": {...}} for one trace; each side {"n", "p50", "p90", "p99"} (ms; NaN when empty).
    Raises ValueError when no threshold is given and the trace's steps carry none (> 0), and
    ``probes.recorder.TraceReadError`` for a file that is not a readable trace."""
    tr = read_trace(path)
    first = tr.steps[0] if tr.steps else None
    thr = short if short is not None else (first.long_prefill_token_threshold if first else 0)
    if not thr or thr <= 0:
        raise ValueError(f"{path}: no lane threshold in its steps: give --short N")
    out = {"requests": len(tr.requests), "threshold": thr,
           "no_first_token": sum(r.ttft_ms is None for r in tr.requests),
           "max_long_partial_prefills": first.max_long_partial_prefills if first else None}
    for side, keep in (("short", lambda n: n <= thr), ("long", lambda n: n > thr)):
        v = np.array([r.ttft_ms for r in tr.requests
                      if r.ttft_ms is not None and keep(r.prompt_len)], dtype=np.float64)
        pct = np.percentile(v, [50, 90, 99]) if len(v) else [np.nan] * 3
        out[side] = {"n": int(len(v)), **dict(zip(("p50", "p90", "p99"), map(float, pct)))}
    return out
