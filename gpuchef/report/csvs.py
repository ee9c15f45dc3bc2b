"""Session traces as two CSV files, for spreadsheets and pandas: one row per engine step and one
row per request. Times are seconds since each trace's first record; latencies in ms with
``vllm bench serve``'s definitions; ``group`` is the A/B setting or mode the row was counted in
(see report/model.py)."""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path

from gpuchef.engine_host.records import StepRecord

from .model import ReportData, TraceView

STEP_FIELDS = [f.name for f in fields(StepRecord)]
STEP_HEADER = ["trace", "group", "window", "t_start_s", "t_end_s", "wall_ms", "num_tokens",
               "kind", *STEP_FIELDS]
REQUEST_HEADER = ["trace", "group", "window", "request_id", "arrival_s", "first_token_s",
                  "finish_s", "prompt_len", "output_len", "finish_reason", "num_preemptions",
                  "ttft_ms", "tpot_ms", "e2el_ms", "mean_itl_ms", "max_itl_ms", "is_probe"]


def _where(view: TraceView) -> tuple[dict[int, tuple[str, str]], dict[int, tuple[str, str]]]:
    steps, reqs = {}, {}
    for seg in view.segments:
        for s in seg.steps:
            steps[id(s)] = (seg.label, seg.name)
        for r in seg.requests:
            reqs[id(r)] = (seg.label, seg.name)
    return steps, reqs


def _f(v: float | None, nd: int = 3) -> str:
    return "" if v is None else f"{v:.{nd}f}"


def write(data: ReportData, prefix: str | Path) -> tuple[Path, Path, int, int]:
    """Write ``<prefix>.steps.csv`` and ``<prefix>.requests.csv``. Returns the two paths and
    their row counts (header not counted)."""
    prefix = str(prefix)
    if prefix.endswith(".csv"):
        prefix = prefix[:-4]
    sp, rp = Path(prefix + ".steps.csv"), Path(prefix + ".requests.csv")
    sp.parent.mkdir(parents=True, exist_ok=True)
    ns = nr = 0
    with open(sp, "w", newline="", encoding="utf-8") as fs, \
            open(rp, "w", newline="", encoding="utf-8") as fr:
        ws, wr = csv.writer(fs), csv.writer(fr)
        ws.writerow(STEP_HEADER)
        wr.writerow(REQUEST_HEADER)
        for v in data.views:
            gs, gr = _where(v)
            for s in sorted(v.trace.steps, key=lambda s: s.t_start_ns):
                g, w = gs.get(id(s), ("", ""))
                kind = ("mixed" if s.num_prefill_tokens and s.num_decode_reqs else
                        "prefill" if s.num_prefill_tokens else "decode")
                ws.writerow([v.name, g, w, _f(v.t(s.t_start_ns), 6), _f(v.t(s.t_end_ns), 6),
                             _f(s.wall_ms), s.num_tokens, kind,
                             *[getattr(s, k) for k in STEP_FIELDS]])
                ns += 1
            for r in sorted(v.trace.requests, key=lambda r: r.arrival_ns):
                g, w = gr.get(id(r), ("", ""))
                itl = r.itls_ms
                t = r.token_times_ns
                wr.writerow([v.name, g, w, r.request_id, _f(v.t(r.arrival_ns), 6),
                             _f(v.t(t[0]), 6) if t else "", _f(v.t(t[-1]), 6) if t else "",
                             r.prompt_len, r.output_len, r.finish_reason, r.num_preemptions,
                             _f(r.ttft_ms), _f(r.tpot_ms), _f(r.e2el_ms),
                             _f(sum(itl) / len(itl)) if itl else "", _f(max(itl)) if itl else "",
                             int(r.request_id.startswith("probe-"))])
                nr += 1
    return sp, rp, ns, nr
