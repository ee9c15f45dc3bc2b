"""Session traces as CSV files, for spreadsheets and pandas: one row per engine step, one row per
request and one row per GPU sample (``gpu``: the NVML index of the sampled GPU). Times are
seconds since each trace's first record; latencies in ms with ``vllm bench serve``'s
definitions; ``group`` is the A/B setting or mode the row was counted in (see report/data.py)."""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path

from gpuchef.engine_host.vocab.records import StepRecord

from gpuchef.probes.metrics import is_probe_id
from gpuchef.probes.nvml.fields import SAMPLE_COLUMNS

from .data import ReportData, TraceView, segment_finder

STEP_FIELDS = [f.name for f in fields(StepRecord)]
STEP_HEADER = ["trace", "group", "window", "t_start_s", "t_end_s", "wall_ms", "num_tokens",
               "kind", *STEP_FIELDS]
REQUEST_HEADER = ["trace", "group", "window", "request_id", "arrival_s", "first_token_s",
                  "finish_s", "prompt_len", "output_len", "finish_reason", "num_preemptions",
                  "ttft_ms", "tpot_ms", "e2el_ms", "mean_itl_ms", "max_itl_ms", "is_probe"]
GPU_SAMPLE_FIELDS = list(SAMPLE_COLUMNS)  # GpuSample's attributes: the table of GPU fields
GPU_SAMPLE_HEADER = ["trace", "group", "window", "t_s", *GPU_SAMPLE_FIELDS]


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


def _prefix(prefix: str | Path) -> str:
    prefix = str(prefix)
    return prefix[:-4] if prefix.endswith(".csv") else prefix


def write_gpu_samples(data: ReportData, prefix: str | Path) -> tuple[Path, int]:
    """Write ``<prefix>.gpu_samples.csv``: GPU_SAMPLE_HEADER, one row per GPU sample of every
    trace, by time (``t_s``: s since the trace's start; then every GpuSample field as recorded:
    %, W, bytes, MHz, °C, KB/s; empty where not sampled). ``group``/``window``: the segment the
    sample's time falls in (empty outside every segment). Returns the path and its row count
    (header not counted)."""
    gp = Path(_prefix(prefix) + ".gpu_samples.csv")
    gp.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(gp, "w", newline="", encoding="utf-8") as fg:
        wg = csv.writer(fg)
        wg.writerow(GPU_SAMPLE_HEADER)
        for v in data.views:
            find = segment_finder(v.segments)
            for x in sorted(v.trace.gpu_samples, key=lambda x: (x.t_ns, x.gpu)):
                seg = find(x.t_ns)
                wg.writerow([v.name, seg.label if seg else "", seg.name if seg else "",
                             _f(v.t(x.t_ns), 6),
                             *["" if (val := getattr(x, k)) is None else val
                               for k in GPU_SAMPLE_FIELDS]])
                n += 1
    return gp, n


def write(data: ReportData, prefix: str | Path) -> list[tuple[Path, int, str]]:
    """Write ``<prefix>.steps.csv`` and ``<prefix>.requests.csv``, and
    ``<prefix>.gpu_samples.csv`` (``write_gpu_samples``; a header only when the traces have no
    GPU samples). Returns ``(path, rows, what)`` for each file, rows not counting the header."""
    prefix = _prefix(prefix)
    gp, ng = write_gpu_samples(data, prefix)
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
                             int(is_probe_id(r.request_id))])
                nr += 1
    return [(sp, ns, "steps"), (rp, nr, "requests"), (gp, ng, "GPU samples")]
