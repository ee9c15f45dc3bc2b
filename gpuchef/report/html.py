"""The self-contained HTML report: one file, inline CSS, plots as inline SVG, no scripts, no
external resources — it opens offline and can be mailed or attached to a ticket as is."""

from __future__ import annotations

import html
import math
import numbers
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from gpuchef.experiments.capacity import SATURATION_TOLERANCE, WARMUP_SHARE, rules_note
from gpuchef.probes.metrics import (GPU_SUMMARY_FIELDS, STEPS_SECTION, format_value,
                                    results_block_rows)
from gpuchef.probes.nvml.fields import BY_NAME
from gpuchef.probes.summaries import gpu_result_rows

from . import plots
from .data import (Group, ReportData, TraceView, capacity_probes, gpu_indices, gpu_names,
                    per_gpu_means)
# run_table and _run_rows are imported from here too (the Run section's table)
from .run_facts import _run_rows, gpus_text, model_text, run_table  # noqa: F401

#: Section ids, in page order (tests and the table of contents use them).
SECTIONS = {
    "summary": "Summary",
    "run": "Run",
    "waveforms": "Waveforms",
    "gpus": "Per-GPU",
    "closeups": "Step close-ups",
    "composition": "Batch composition",
    "autopilot": "Autopilot",
    "latency": "Latency CDFs",
    "results": "Results",
    "capacity": "Capacity probes",
    "windows": "A/B windows",
}
MAX_PROBLEMS_SHOWN = 40
MAX_WINDOW_ROWS = 200

CSS = """
:root { --ink:#24292f; --muted:#57606a; --line:#d8dee4; --bg:#f6f8fa; --card:#ffffff;
        --accent:#2f5f8a; --warn-bg:#fff8e6; --warn:#9a6700; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
header { background:#1f2d3d; color:#fff; padding:22px 32px 18px; }
header h1 { margin:0 0 4px; font-size:22px; font-weight:650; letter-spacing:.2px; }
header .sub { color:#c9d3dd; font-size:13px; }
nav { background:#fff; border-bottom:1px solid var(--line); padding:8px 32px; position:sticky;
      top:0; z-index:2; font-size:13px; }
nav a { color:var(--accent); text-decoration:none; margin-right:18px; }
main { max-width:1240px; margin:0 auto; padding:18px 32px 40px; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px;
          padding:16px 20px 18px; margin:18px 0; overflow-x:auto; }
h2 { font-size:17px; margin:0 0 10px; }
h3 { font-size:14px; margin:18px 0 6px; color:var(--muted); }
p.note { color:var(--muted); font-size:12.5px; margin:4px 0 10px; max-width:1000px; }
figure { margin:8px 0 4px; }
figure svg { width:100%; height:auto; display:block; }
figcaption { color:var(--muted); font-size:12px; margin-top:4px; }
table { border-collapse:collapse; font-size:12.5px; margin:6px 0; }
th, td { padding:4px 10px; border-bottom:1px solid var(--line); text-align:left;
         vertical-align:top; }
th { background:#f0f3f6; font-weight:600; }
td:first-child { white-space:nowrap; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tr.sec td { background:#fafbfc; color:var(--muted); font-weight:600; font-size:11.5px;
            text-transform:uppercase; letter-spacing:.4px; }
.cards { display:flex; flex-wrap:wrap; gap:12px; }
.card { flex:1 1 260px; border:1px solid var(--line); border-top:4px solid var(--c);
        border-radius:6px; padding:10px 14px; background:#fff; }
.card h4 { margin:0 0 2px; font-size:14px; color:var(--c); }
.card .desc { color:var(--muted); font-size:12px; margin-bottom:6px; }
.card dl { display:grid; grid-template-columns:auto auto; gap:1px 12px; margin:0; font-size:12.5px; }
.card dt { color:var(--muted); } .card dd { margin:0; text-align:right;
           font-variant-numeric:tabular-nums; }
.warn { background:var(--warn-bg); border:1px solid #f0d58c; color:var(--warn); border-radius:6px;
        padding:10px 14px; margin:14px 0; font-size:13px; }
.warn ul { margin:6px 0 0 18px; padding:0; } .warn code { color:#6e4b00; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:6px;
          vertical-align:baseline; }
.empty { color:var(--muted); font-style:italic; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:10px 0 30px; }
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    if isinstance(v, int):
        return f"{v:,}"
    return fmt.format(v)


def _pct_value(m: Any, stem: str, q: float) -> float:
    return next((v for p, v in getattr(m, f"percentiles_{stem}_ms") if p == q), math.nan)


# ---- pieces ---------------------------------------------------------------------------------------

#: What the Summary and Results say of a capacity trace's groups.
CAPACITY_POOLED_NOTE = (
    " A capacity search (gpuchef ab --capacity): a setting's card and column pool its probes, "
    "which ran at different rates (each side's own bisection), so no B − A is drawn from them; "
    "the Capacity probes section compares the settings, probe by probe.")


STRETCH_WORK_NOTE = (
    " The mode changed during the load: a mode's throughputs (and goodput) are the work done "
    "while it was in force — requests finished and tokens produced or computed in its stretches, "
    "per second of them, as an A/B window's (probes.ab) — while its request counts and latencies "
    "are those of the requests that arrived in its stretches (under overload many finish in the "
    "next one).")


#: Several traces share one time scale only when the shortest is at least this share of the
#: longest (an 11 s part drawn to a 300 s scale is a flat line).
SHARE_SPAN_MIN = 0.5


def shared_span(views: Sequence[TraceView]) -> float | None:
    """The time span (s) the traces' waveforms share: the longest, when there are several and
    the shortest is at least ``SHARE_SPAN_MIN`` of it; else None (each its own length)."""
    spans = [max(v.t(v.end_ns), 1e-3) for v in views]
    if len(spans) < 2 or min(spans) < SHARE_SPAN_MIN * max(spans):
        return None
    return max(spans)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], num_cols: Sequence[int] = (),
           raw: bool = False, cls: str = "") -> str:
    out = [f'<table class="{cls}">' if cls else "<table>", "<thead><tr>"]
    for i, h in enumerate(head):
        out.append(f'<th class="num">{esc(h)}</th>' if i in num_cols else f"<th>{esc(h)}</th>")
    out.append("</tr></thead><tbody>")
    for r in rows:
        if isinstance(r, tuple) and len(r) == 1:  # a section row
            out.append(f'<tr class="sec"><td colspan="{len(head)}">{esc(r[0])}</td></tr>')
            continue
        out.append("<tr>")
        for i, c in enumerate(r):
            cell = c if raw else esc(c)
            out.append(f'<td class="num">{cell}</td>' if i in num_cols else f"<td>{cell}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def results_rows(groups: Sequence[Group], delta: bool = False) -> list[Any]:
    """The bench results block of every group (``probes.metrics.results_block_rows``), merged
    into rows (label, value per group as the block prints it), in the block's order; section
    headers as 1-tuples. ``delta``: each row also gets B − A and its % (two groups), from the
    measured values, not from their 2-decimal cells."""

    per: list[dict[tuple[str, str], Any]] = []
    order: list[tuple[str, str]] = []
    for g in groups:
        rows = {}
        for sec, label, v in results_block_rows(g.metrics, extra=_gpu_extra(g)):
            rows[(sec, label)] = v
            if (sec, label) not in order:
                order.append((sec, label))
        per.append(rows)
    out: list[Any] = []
    last = None
    for sec, label in order:
        if sec != last:
            if sec:
                out.append((sec,))
            last = sec
        vals = [p.get((sec, label)) for p in per]
        # a group without steps has no step rows: unknown there, not blank or 0
        row = [label.rstrip(":")] + [format_value(v).strip() if (sec, label) in p else
                                     "n/a" if sec == STEPS_SECTION else ""
                                     for p, v in zip(per, vals)]
        out.append(row + (_delta(*vals[:2]) if delta and len(vals) == 2 else []))
    return out


def failures_note(groups: Sequence[Group]) -> str:
    """One sentence per A/B run of the groups' traces whose two settings lost different shares
    of their requests (``probes.ab.Comparison.not_comparable``): their B − A of latency and
    throughput compares different loads. "" when there is none."""
    out = []
    for v in {id(g.view): g.view for g in groups}.values():
        runs = {rid: c for rid, c in v.comparisons.items() if c is not None and c.not_comparable}
        for rid, c in runs.items():
            where = v.name + (f" A/B run {rid}" if len(v.comparisons) > 1 else "")
            out.append(f" Not comparable ({where}): {c.not_comparable}.")
    return "".join(out)


def no_steps_note(groups: Sequence[Group]) -> str:
    """Why the results table has no (or n/a) engine-step rows for some groups ("" when every
    group's figures include steps): a server gpuchef did not host is seen from its client, which
    sees requests, not the steps that served them."""
    missing = [g for g in groups if not g.metrics.steps_measured]
    if not missing:
        return ""
    attached = all(isinstance(g.view.meta.get("source"), dict)
                   and g.view.meta["source"].get("kind") == "attached" for g in missing)
    who = "" if len(missing) == len(groups) else " for " + ", ".join(g.short for g in missing)
    why = ("the load went over HTTP to a server gpuchef did not host, and its client sees "
           "requests, not the steps that served them (the server's own trace has those: "
           "gpuchef serve --trace)" if attached else "no engine step was recorded in their windows")
    return f" No engine-step rows{who}: the trace holds no steps — {why}."


def _gpu_extra(g: Group) -> dict[str, str]:
    gp = g.gpu
    if not any(math.isfinite(v) for v in gp.values()):
        return {}
    return gpu_result_rows(gp)


def _delta(a: Any, b: Any) -> list[str]:
    """(b − a, (b − a)/a in %) of two measured values, blank when they are not both numbers
    (a str, None, NaN); integers (counts) as integers."""
    if isinstance(a, (bool, str)) or isinstance(b, (bool, str)) or a is None or b is None:
        return ["", ""]
    x, y = float(a), float(b)
    if not (math.isfinite(x) and math.isfinite(y)):
        return ["", ""]
    d = y - x
    pct = f"{d / x * 100:+.1f} %" if x else ""
    ints = isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral)
    return [f"{int(d):+d}" if ints else f"{d:+.2f}", pct]


def _card(g: Group, pcts: Sequence[float]) -> str:
    m = g.metrics
    hi = max(pcts) if pcts else 99.0
    lo = min(pcts) if pcts else 50.0
    rows = [("requests done", _num(m.completed)),
            ("request throughput", f"{_num(m.request_throughput)} req/s"),
            ("output tokens/s", _num(m.output_throughput, "{:.1f}")),
            (f"TTFT P{lo:g} / P{hi:g}", f"{_num(_pct_value(m, 'ttft', lo), '{:.1f}')} / "
                                      f"{_num(_pct_value(m, 'ttft', hi), '{:.1f}')} ms"),
            (f"ITL P{lo:g} / P{hi:g}", f"{_num(_pct_value(m, 'itl', lo), '{:.1f}')} / "
                                     f"{_num(_pct_value(m, 'itl', hi), '{:.1f}')} ms"),
            ("mean tokens per step", _num(m.mean_tokens_per_step, "{:.1f}")),
            ("engine busy", f"{_num(m.busy_fraction * 100, '{:.1f}')} %")]
    if m.request_goodput is not None:
        rows.insert(2, ("goodput", f"{_num(m.request_goodput)} req/s"))
    if math.isfinite(g.gpu.get("sm_active", math.nan)):
        rows.append(("GPU SM active (mean)", f"{g.gpu['sm_active']:.1f} %"))
    dl = "".join(f"<dt>{esc(a)}</dt><dd>{esc(b)}</dd>" for a, b in rows)
    desc = g.description if g.description and g.description not in g.label else ""
    where = f"{g.view.name}" + (f" · {len(g.segments)} windows" if g.view.ab else "")
    if g.view.capacity:  # pooled over probes of different rates: a description, not a result
        rates = ", ".join(f"{s.probe_rate:g}" for s in g.segments)
        where += (f" · {len(g.segments)} capacity probes pooled (asked {rates} req/s): not "
                  "comparable across settings — see Capacity probes")
    return (f'<div class="card" style="--c:{g.color}"><h4>{esc(g.label)}</h4>'
            f'<div class="desc">{esc(desc + (" · " if desc else "") + where)}</div>'
            f"<dl>{dl}</dl></div>")


def _figure(svg: str, fig_id: str, caption: str) -> str:
    return (f'<figure class="plot" id="fig-{esc(fig_id)}">{svg}'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


AUTOPILOT_NOTE = (
    "The autopilot (--auto-budget, docs/autopilot.md) picks each chunked step's prefill "
    "allowance from a step-time model fitted online to the engine's own steps. From the "
    "StepRecords: prefill_allowance, predicted_ms against wall_ms, fit_error (the model's "
    "tracked mean relative error, the number its fallback rule uses) and autopilot_state.")


def autopilot_body(view: TraceView, span: float | None) -> str:
    """One trace's part of the autopilot section: its figure and a line of totals, or why
    there is none (:func:`plots.autopilot_absent`)."""
    why = plots.autopilot_absent(view)
    head = f"<h3>{esc(view.name)}</h3>"
    if why is not None:
        return head + f'<p class="empty">No autopilot figure: {esc(why)}.</p>'
    d = plots.autopilot_series(view, span)
    line = f"The autopilot: {d['totals'].line()}."  # as bench's and ab's results block say it
    svg = plots.autopilot(view, span)
    return head + f"<p>{esc(line)}</p>" + _figure(
        svg, f"autopilot-{plots._slug(view.name)}",
        f"{view.name}: the allowance over the prefill the steps carried and the budget, the "
        "predicted vs the actual step time, and the fit error; shaded where it did not steer.")


def _section(sid: str, body: str, note: str = "") -> str:
    n = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{sid}"><h2>{esc(SECTIONS[sid])}</h2>{n}{body}</section>'


def _windows_table(view: TraceView, pct: float) -> str:
    """Every A/B window: its own figures (``probes.ab``: the same windows the groups pool) and
    whether it is counted (else why not)."""
    rows = []
    for seg in view.segments[:MAX_WINDOW_ROWS]:
        r = seg.result
        m = r.metrics if r is not None else None
        if m is None:
            rows.append([seg.name, view.settings.get(seg.label, ""), f"{view.t(seg.t0_ns):.2f}",
                         f"{(seg.t1_ns - seg.t0_ns) / 1e9:.2f}", "", "", "", "", "", "", "",
                         "no: still open at the end of the trace"])
            continue
        rows.append([seg.name, view.settings.get(seg.label, ""), f"{view.t(seg.t0_ns):.2f}",
                     f"{r.duration_s:.2f}", _num(len(r.requests)), _num(m.completed),
                     _num(m.request_throughput), _num(m.output_throughput, "{:.1f}"),
                     _num(_pct_value(m, "ttft", pct), "{:.1f}"),
                     _num(_pct_value(m, "itl", pct), "{:.1f}"),
                     _num(m.mean_tokens_per_step, "{:.1f}"),
                     "yes" if r.counted else f"no: {r.why}"])
    more = len(view.segments) - MAX_WINDOW_ROWS
    extra = f'<p class="note">… and {more} more windows (see the CSV export).</p>' if more > 0 else ""
    return _table(["window", "setting", "start (s)", "span (s)", "arrived", "completed",
                   "finished req/s", "output tok/s", f"P{pct:g} TTFT (ms)", f"P{pct:g} ITL (ms)",
                   "tokens/step", "counted"], rows, num_cols=range(2, 11)) + extra


def capacity_table(probes: Sequence[Any], slos: Sequence[Any]) -> str:
    """One row per probe: setting, rate asked, offered and achieved req/s, requests, each SLO's
    value, whether it met, and every rule it broke (or its notes)."""
    rows = []
    for p in probes:
        rows.append([p.label, _num(p.target, "{:.3g}"), _num(p.rate, "{:.3g}"),
                     _num(p.achieved, "{:.3g}"), _num(p.judged_offered, "{:.3g}"),
                     _num(p.metrics.completed),
                     *[p.value_text(s.key) for s in slos],
                     "yes" if p.met else "no", "; ".join([*p.fails, *p.notes])])
    head = ["setting", "asked req/s", "offered req/s", "achieved req/s",
            "arrived req/s (same requests)", "completed",
            *[f"{s.key} (ms, ≤ {s.limit_ms:g})" for s in slos], "meets", "why not / notes"]
    return _table(head, rows, num_cols=range(1, 6 + len(slos)))


#: The per-GPU table's columns: (per_gpu_means key, header); the GPU fields are the summaries'
#: (GPU_SUMMARY_FIELDS), headed as the table of GPU fields says ("SM active %").
GPU_TABLE_COLUMNS = (("samples", "samples"),
                     *((f, BY_NAME[f].header) for f in GPU_SUMMARY_FIELDS),
                     ("mem_used_gib", "memory used GiB"))


def gpu_table(view: TraceView) -> str:
    """The per-GPU table of one trace: a row per GPU with the means over the whole trace of
    ``GPU_TABLE_COLUMNS`` (%, W, GiB), then the mean over the GPUs and the spread (max − min of
    the GPUs' means); "n/a" where a field was never sampled (spread: on fewer than two GPUs)."""
    means = per_gpu_means(view)
    names = gpu_names(view)
    rows: list[Any] = []
    for k, m in means.items():
        rows.append([f"GPU {k}", names.get(k, "")] +
                    [_num(int(m[c])) if c == "samples" else _num(m[c], "{:.1f}")
                     for c, _ in GPU_TABLE_COLUMNS])
    for label, agg in (("mean (all GPUs)", lambda v: sum(v) / len(v) if v else math.nan),
                       ("spread (max − min)",
                        lambda v: max(v) - min(v) if len(v) > 1 else math.nan)):
        cells = []
        for c, _ in GPU_TABLE_COLUMNS[1:]:
            v = [m[c] for m in means.values() if math.isfinite(m[c])]
            cells.append(_num(agg(v), "{:.1f}"))
        rows.append([label, "", ""] + cells)
    return _table(["GPU", "name", *[h for _, h in GPU_TABLE_COLUMNS]], rows,
                  num_cols=range(2, 2 + len(GPU_TABLE_COLUMNS)), cls="per-gpu")


def render(data: ReportData, *, progress: Callable[[str], None] | None = None,
           title: str | None = None) -> str:
    """The whole report page (a str of HTML). ``progress(name)`` is called before each figure
    (figures take ~0.1–1 s each). Raises ImportError when matplotlib is missing."""
    import matplotlib  # noqa: F401  (fail early, before any work)

    say = progress or (lambda s: None)
    groups, views = data.groups, data.views
    pcts = data.percentiles
    hi = max(pcts) if pcts else 99.0
    parts: list[str] = []
    if data.problems:
        parts.append(_problems_box(data.problems, len(views)))
    parts.append(_summary_section(groups, pcts))
    head, rows = run_table(views)
    parts.append(_section("run", _table(head, rows)))
    span = shared_span(views)
    parts.append(_waveforms_section(views, span, say))
    parts += _gpus_section(views, span, say)
    with_steps = [g for g in groups if g.steps]
    if with_steps:
        parts.append(_closeups_section(with_steps, say))
        parts.append(_composition_section(with_steps, say))
    # the autopilot: its allowance, predicted vs actual step time, fit error
    if any(v.trace.steps for v in views):
        parts.append(_section("autopilot", "".join(autopilot_body(v, span) for v in views
                                                   if v.trace.steps), AUTOPILOT_NOTE))
    if any(g.requests for g in groups):
        parts.append(_latency_section(groups, say))
    if groups:
        parts.append(_results_section(groups, data.goodput))
    parts += _capacity_section(views)
    abviews = [v for v in views if v.ab]
    if abviews:
        parts.append(_windows_section(abviews, hi, say))
    return _page(parts, views, title)


def _page(parts: Sequence[str], views: Sequence[TraceView], title: str | None) -> str:
    """The page around the sections: head with the inline CSS, header, the table of contents
    (the sections present, in SECTIONS' order), footer."""
    first = views[0].meta if views else {}
    sub = " · ".join(x for x in [
        model_text(first, notes=False),
        "a remote server" if first.get("device") == "remote" and
        "attention_backend" not in first else
        f"{first.get('device', '?')} / {first.get('attention_backend', '?')}",
        gpus_text(first) if first.get("gpus") else "",
        f"{len(views)} trace{'s' if len(views) != 1 else ''}: " + ", ".join(v.name for v in views),
    ] if x)
    present = [sid for sid in SECTIONS if f'<section id="{sid}"' in "".join(parts)]
    nav = "".join(f'<a href="#{sid}">{esc(SECTIONS[sid])}</a>' for sid in present)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        from importlib.metadata import version
        gv = version("gpuchef")
    except Exception:  # not installed (running from a checkout)
        gv = ""
    doc_title = title or "gpuchef report — " + ", ".join(v.name for v in views)
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(doc_title)}</title><style>{CSS}</style></head><body>",
        f"<header><h1>{esc(title or 'gpuchef report')}</h1><div class=\"sub\">{esc(sub)}</div>"
        "</header>",
        f"<nav>{nav}</nav><main>", *parts, "</main>",
        f"<footer>Generated by gpuchef {esc(gv)} report on {now}. Self-contained: no scripts, "
        "no external resources.</footer></body></html>\n",
    ])


def _problems_box(problems: Sequence[str], n_views: int) -> str:
    """The warning above the sections: the lines skipped while reading (the first
    MAX_PROBLEMS_SHOWN, then a count)."""
    items = "".join(f"<li><code>{esc(p)}</code></li>" for p in problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    if more > 0:
        items += f"<li>… and {more} more</li>"
    return (f'<div class="warn" id="problems"><b>{len(problems)} problem'
            f'{"s" if len(problems) != 1 else ""} reading the trace'
            f'{"s" if n_views != 1 else ""}</b> — the report shows what could be '
            f"read:<ul>{items}</ul></div>")


def _summary_section(groups: Sequence[Group], pcts: Sequence[float]) -> str:
    if not groups:
        return _section("summary", '<p class="empty">No engine steps or requests were '
                                   "recorded: nothing to compare.</p>")
    cards = "".join(_card(g, pcts) for g in groups)
    note = ("Each card is one group of the comparison: an A/B setting (pooled over its "
            "windows) or a scheduler mode. Latency definitions are vllm bench serve's.")
    if any(g.view.capacity for g in groups):
        note += CAPACITY_POOLED_NOTE
    return _section("summary", f'<div class="cards">{cards}</div>', note)


def _waveforms_caption(v: TraceView) -> str:
    """What a trace's waveforms figure marks, in words."""
    marks = []
    if v.ab:
        marks.append("A/B windows shaded (A blue, B orange, labelled at the top)")
    if v.capacity:
        marks.append("capacity probes shaded (A blue, B orange, labelled A@<rate asked> "
                     "at the top)")
    if any(e.kind == "mode" for e in v.events):
        marks.append("mode switches as solid purple lines")
    if any(e.kind == "knob" for e in v.events):
        marks.append("knob changes as dashed grey lines")
    if any(e.kind == "mark" and not str(e.name).startswith("ab:") for e in v.events):
        marks.append("other marks as dotted lines")
    return f"{v.name}: the run over time" + (f"; {', '.join(marks)}." if marks else ".")


def _attached_figures(v: TraceView) -> str:
    """An attached trace's figures: its vLLM plugin records when it has them (per output
    batch), then the servers' /metrics (derived, per scrape interval)."""
    from .plugin_plots import plugin_figure
    from .scrape_plots import scrape_figure

    out = ""
    svg = plugin_figure(v)
    if svg:
        out += _figure(svg, f"plugin-{plots._slug(v.name)}",
                       f"{v.name}: the server's output batches from gpuchef's vLLM plugin, per "
                       "engine (per bin: the time between batches as the API server saw it — "
                       "not GPU time — and the engine core's ITL, the largest batch's prefill "
                       "tokens and decode rows, the queues and KV cache after it).")
    svg = scrape_figure(v)
    out += (_figure(svg, f"scrape-{plots._slug(v.name)}",
                    f"{v.name}: a server gpuchef did not host, drawn from its /metrics — derived "
                    "series, one value per scrape interval (no per-step records: the engine's "
                    "steps are the server's own).") if svg else
            '<p class="empty">fewer than two good scrapes of a server</p>')
    return out


def _waveforms_section(views: Sequence[TraceView], span: float | None,
                       say: Callable[[str], None]) -> str:
    body = []
    for v in views:
        say(f"waveforms {v.name}")
        if (v.trace.scrapes or v.trace.plugin) and not v.trace.steps:  # `top --attach`
            body.append(f"<h3>{esc(v.name)}</h3>" + _attached_figures(v))
            continue
        if not v.trace.steps and not v.trace.requests:
            body.append(f'<h3>{esc(v.name)}</h3><p class="empty">no steps or requests recorded</p>')
            continue
        svg, _ = plots.waveforms(v, span_s=span)
        body.append(f"<h3>{esc(v.name)}</h3>"
                    + _figure(svg, f"waveforms-{plots._slug(v.name)}", _waveforms_caption(v)))
    note = ("Engine busy is the share of wall time spent in the model's forward pass; gaps are "
            "time the engine waited (for work or for the CPU). Tokens per step: what each step "
            "computed against the token budget (log axis). "
            + ("With several traces the time axes are aligned at each trace's start and share "
               "one scale." if span is not None else
               "Each trace is drawn over its own length (their lengths differ by more than "
               f"{1 / SHARE_SPAN_MIN:g}×: a shared scale would squash the shorter)."
               if len(views) > 1 else ""))
    return _section("waveforms", "".join(body), note)


def _gpus_section(views: Sequence[TraceView], span: float | None,
                  say: Callable[[str], None]) -> list[str]:
    """The Per-GPU section ([] when no trace sampled several GPUs)."""
    body = []
    for v in views:
        if len(gpu_indices(v)) < 2:
            continue
        say(f"per-GPU {v.name}")
        svg = plots.per_gpu(v, span_s=span)
        fig = _figure(svg, f"gpus-{plots._slug(v.name)}", (
            f"{v.name}: each GPU over time (mean per bin), the spread across GPUs per bin "
            "(max − min) and, when sampled, DRAM bandwidth and power per GPU.")) if svg else ""
        body.append(f"<h3>{esc(v.name)}</h3>{fig}{gpu_table(v)}")
    if not body:
        return []
    return [_section("gpus", "".join(body), (
        "One line per GPU of the trace. The GPUs of a tensor-parallel group run the same "
        "kernels in lock step, so their utilisation should match: a lasting spread means a "
        "rank that lags (throttled, on a slow link) or idles at each collective waiting for "
        "the others. SM active is GPM's share of SMs busy; when GPM was off the figure uses "
        "GPU-Util, which only says that some kernel was running. The table's means are over "
        "the whole trace."))]


def _closeups_section(with_steps: Sequence[Group], say: Callable[[str], None]) -> str:
    say("close-ups")
    views_of = [g.view for g in with_steps]
    aligned = (len(set(map(id, views_of))) == len(views_of) > 1
               and all(v.meta.get("workload") == views_of[0].meta.get("workload")
                       and v.meta.get("workload") for v in views_of))
    return _section("closeups", _figure(
        plots.closeups(with_steps, aligned), "closeups",
        ("The same stretch of the same load in every trace (chosen as the first one's "
         "busiest), step by step" if aligned else
         "Each group's busiest stretch (most prefill tokens), step by step") +
        ": bar width is the "
        "step's wall time, height its tokens (log axis), colour its kind; the dark line "
        "(right axis) counts the requests decoding in each step; white space is time "
        "between steps."),
        "Continuous batching runs whole prompts in prefill-only steps, and the running "
        "requests' decodes wait meanwhile (the dark line drops to 0: an inter-token stall); "
        "chunked prefill packs every decode and a prefill chunk into each step within the "
        "budget, so decodes never stop.")


def _composition_section(with_steps: Sequence[Group], say: Callable[[str], None]) -> str:
    say("composition")
    comp_rows = []
    for g in with_steps:
        c = plots.composition(g.steps)
        comp_rows.append([f'<span class="swatch" style="background:{g.color}"></span>'
                          f"{esc(g.label)}"] +
                         [f"{c[k][1] * 100:.1f} % / {c[k][2] * 100:.1f} %"
                          for k in ("decode only", "mixed", "prefill only")] +
                         [_num(g.metrics.mean_prefill_tokens_per_step, "{:.1f}"),
                          _num(g.metrics.mean_decode_tokens_per_step, "{:.1f}")])
    table = _table(["group", "decode only (steps / compute)", "mixed", "prefill only",
                    "mean prefill tokens/step", "mean decode tokens/step"], comp_rows,
                   num_cols=range(1, 6), raw=True)
    return _section("composition", _figure(
        plots.composition_hist(with_steps), "composition",
        "Histogram of tokens per step, stacked by step kind, per group.") + table,
        "Share of steps and of compute time by kind: decode only, prefill only, or mixed "
        "(prefill chunks and decodes in one batch).")


def _latency_section(groups: Sequence[Group], say: Callable[[str], None]) -> str:
    say("latency CDFs")
    return _section("latency", _figure(
        plots.latency_cdfs(groups), "latency",
        "Cumulative distributions (log time axis); the dots mark each group's P99."),
        "TTFT = first token − arrival; ITL = the gap before each output chunk after the first "
        "(tokens that arrive at one time stamp are one chunk, one ITL), pooled; "
        "TPOT = (E2EL − TTFT)/(output tokens − 1) per request (vllm bench serve).")


def _results_section(groups: Sequence[Group], goodput: dict[str, float]) -> str:
    head = ["metric", *[g.short for g in groups]]
    # capacity groups pool probes of different rates: a B − A of them compares nothing
    pair = len(groups) == 2 and not any(g.view.capacity for g in groups)
    rows = results_rows(groups, delta=pair)
    if pair:
        head += [f"{groups[1].short} − {groups[0].short}", "%"]
    legend = "; ".join(f"{g.short}: {g.description}" for g in groups
                       if g.description and g.description != g.short)
    slo = (f" Columns — {legend}." if legend else "") + ((
        " Goodput SLOs: " + ", ".join(f"{k} ≤ {v:g} ms" for k, v in goodput.items())
        + ".") if goodput else "")
    if any(g.view.capacity for g in groups):
        slo += CAPACITY_POOLED_NOTE
    if any(g.view.stretch_work for g in groups):
        slo += STRETCH_WORK_NOTE
    slo += no_steps_note(groups) + failures_note(groups)
    return _section("results", _table(head, rows, num_cols=range(1, len(head))),
                    "The gpuchef bench results block of each group, computed from "
                    "the trace's requests and steps (probes.metrics.summarize)." + slo)


def _capacity_section(views: Sequence[TraceView]) -> list[str]:
    """The Capacity probes section (gpuchef ab --capacity; [] for other traces)."""
    body = []
    for v in views:
        probes, slos = capacity_probes(v)
        if probes:
            meta_ab = v.meta.get("ab") if isinstance(v.meta.get("ab"), dict) else {}
            note = rules_note(meta_ab.get("rules"))
            body.append(f"<h3>{esc(v.name)}</h3>" + (f"<p>{esc(note)}</p>" if note else "")
                        + capacity_table(probes, slos))
    if not body:
        return []
    return [_section("capacity", "".join(body), (
        "Each probe of the capacity search, judged from the trace as gpuchef ab judged it "
        "(docs/capacity.md): offered = the probe's requests' count over their arrival "
        "span; achieved = the finish rate of the requests that arrived after the first "
        f"{WARMUP_SHARE:.0%} of it, beside the arrival rate of the same requests (each over "
        "the inner 80 % of them); a probe fails an SLO, or as saturated (achieved below "
        f"{1 - SATURATION_TOLERANCE:.0%} of offered, or the waiting queue growing), or "
        "stops early once an SLO is broken beyond doubt."))]


def _windows_section(abviews: Sequence[TraceView], hi: float, say: Callable[[str], None]) -> str:
    body = []
    for v in abviews:
        say(f"A/B windows {v.name}")
        body.append(f"<h3>{esc(v.name)}</h3>" + _figure(
            plots.ab_windows_plot(v, hi), f"abwindows-{plots._slug(v.name)}",
            f"Per-window P{hi:g} TTFT, P{hi:g} ITL and output throughput: the spread "
            "between windows of one setting is the noise a difference must exceed.")
            + _windows_table(v, hi))
    return _section("windows", "".join(body),
                    "A request belongs to the window it arrived in, a step to the "
                    "window it started in; throughputs are the work done in the "
                    "window (requests finished, tokens produced) per second of its "
                    "span. The groups above pool the counted windows: the same "
                    "definitions as gpuchef ab and the dashboard's A/B screen "
                    "(probes/ab.py).")
