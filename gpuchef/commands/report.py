"""`gpuchef report TRACE...`: a saved session trace (or several) to a self-contained HTML report,
Perfetto/Chrome trace JSON, or CSV. The work is in gpuchef/report/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from ..engine_host.vocab.errors import ConfigError
from .options import check_output_path

MATPLOTLIB_HINT = ("the HTML report draws its plots with matplotlib, which is not installed: "
                   "pip install 'gpuchef[report]' (or pip install matplotlib). "
                   "--format perfetto and --format csv work without it.")
MAX_PROBLEMS_PRINTED = 20


def _default_output(paths: list[str], fmt: str) -> str:
    from ..probes.recorder import trace_name

    stem = trace_name(paths[0]) if len(paths) == 1 else "gpuchef-report"
    return {"html": f"{stem}.html", "perfetto": f"{stem}.perfetto.json", "csv": stem}[fmt]


def _output(output: str | None, paths: list[str], fmt: str) -> str:
    """-o as given; an existing folder, or a path ending with a separator, gets the default
    name inside it (``adir/`` → ``adir/run.html``, ``adir/run.steps.csv``, …)."""
    name = _default_output(paths, fmt)
    if not output:
        out = name
    else:
        seps = tuple(s for s in (os.sep, os.altsep) if s)
        p = Path(output).expanduser()
        out = str(p / name) if output.endswith(seps) or p.is_dir() else str(p)
    outs = [out] if fmt != "csv" else [f"{out}.{k}.csv" for k in ("steps", "requests",
                                                                 "gpu_samples")]
    for o in outs:
        if any(Path(o).resolve() == Path(t).resolve() for t in paths) or is_trace_file(o):
            raise ConfigError(f"-o {output!r} would overwrite the trace {o!r}: give another path")
        check_output_path(o, "-o")  # the one check of output paths: folder made, bad refused
    return out


def is_trace_file(path: str) -> bool:
    """True when ``path`` is an existing file whose first line is a gpuchef trace's meta record
    (``"type": "meta"``, ``"schema": "gpuchef-trace"``): any trace, not only the input ones,
    is refused as an output. Unreadable or other files: False."""
    import json

    from ..probes.recorder import TRACE_SCHEMA

    p = Path(path)
    try:
        if not p.is_file():
            return False
        with p.open("rb") as f:
            head = f.readline(1 << 20)
        rec = json.loads(head.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("type") == "meta" and rec.get("schema") == TRACE_SCHEMA


@click.command("report")
@click.argument("traces", nargs=-1, type=click.Path(dir_okay=False))
@click.option("-o", "--output", default=None,
              help="Output file (html: .html; perfetto: .json; csv: a prefix, writing "
                   "PREFIX.steps.csv, PREFIX.requests.csv and PREFIX.gpu_samples.csv). "
                   "A folder (one that exists, or a path ending in /) gets the default names "
                   "inside it. Default: named after the trace (one trace; else gpuchef-report), "
                   "in the current folder.")
@click.option("--format", "fmt", default="html", show_default=True,
              type=click.Choice(["html", "perfetto", "csv"]),
              help="html: the report with plots and tables; perfetto: Chrome Trace Event JSON "
                   "(open in ui.perfetto.dev or chrome://tracing); csv: steps, requests and GPU "
                   "samples (a gpu index per row).")
@click.option("--goodput", multiple=True,
              help="SLOs for the goodput row, KEY:MS pairs (ttft, tpot, e2el), as in bench.")
@click.option("--metric-percentiles", default="50,90,99", show_default=True,
              help="Percentiles in the results tables.")
@click.option("--title", default=None, help="Title of the HTML report.")
@click.option("--prometheus", default=None, metavar="URL",
              help="Report the vLLM, SGLang and gpuchef servers a Prometheus server scraped "
                   "over the last --since, read through its HTTP API (query_range), as a "
                   "`top --attach` trace of them would be. docs/attach.md.")
@click.option("--since", default="15m", show_default=True,
              help="With --prometheus: how far back (10m, 2h, seconds; up to 7 days).")
@click.option("--step", default=None,
              help="With --prometheus: one sample per server this often (default: --since / "
                   "600, at least 1 s).")
@click.option("--save-trace", default=None, metavar="PATH",
              help="With --prometheus: keep the trace read from it here (default: not kept).")
def report(traces: tuple[str, ...], output: str | None, fmt: str, goodput: tuple[str, ...],
           metric_percentiles: str, title: str | None, prometheus: str | None, since: str,
           step: str | None, save_trace: str | None) -> None:
    """Turn session traces (`gpuchef bench/ab/top --trace`) into a report.

    One trace: its modes (or the A/B settings of a `gpuchef ab` trace) side by side. Several
    traces (e.g. one bench run per mode on the same seeded load): every trace's groups compared
    in one report, the time axes aligned at each trace's start.

    The HTML report has the run's metadata, waveforms over time (engine busy, tokens per step
    against the budget, queue, KV cache, GPU saturation, latency) with knob changes, mode
    switches and A/B windows marked, step-by-step close-ups, the batch-composition histogram,
    latency CDFs and the bench results table of each group. A corrupt or cut-short trace gives a
    warning listing the problems (with line numbers) and a report of what could be read.

    Examples:

    \b
      gpuchef report run.jsonl                          # run.html
      gpuchef report chunked.jsonl continuous.jsonl -o compare.html
      gpuchef report run.jsonl --format perfetto        # run.perfetto.json
      gpuchef report run.jsonl --format csv -o out/run  # out/run.steps.csv, .requests.csv, .gpu_samples.csv
      gpuchef report run.jsonl -o out/                  # out/run.html
    """
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        paths = list(traces)
        tmp = None
        if prometheus:
            tmp, p = _prometheus_trace(prometheus, since, step, save_trace, err)
            paths.append(p)
        elif save_trace or step is not None or since != "15m":
            raise ConfigError("--since, --step and --save-trace go with --prometheus URL")
        if not paths:
            raise ConfigError("give a trace (gpuchef bench/ab/top --trace) or --prometheus URL")
        try:
            _report(paths, output, fmt, goodput, metric_percentiles, title, err)
        finally:
            if tmp is not None:
                tmp.cleanup()
    except ConfigError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(2)


def _prometheus_trace(url: str, since: str, step: str | None, save_trace: str | None,
                      err: Console):
    """The trace of the fleet the Prometheus server at ``url`` scraped over ``since``: written
    to ``save_trace``, else into a temporary folder (returned, for the caller to clean up).
    Returns (the folder or None, the trace's path). Raises ConfigError."""
    import tempfile

    from ..sessions.prometheus import record_history
    from .options import check_output_path, parse_duration

    since_s = parse_duration(since, "--since", 10, 7 * 86400)
    step_s = (parse_duration(step, "--step", 1, 86400) if step is not None
              else max(1.0, round(since_s / 600)))
    tmp = None
    if save_trace:
        check_output_path(save_trace, "--save-trace")
        path = save_trace
    else:
        tmp = tempfile.TemporaryDirectory(prefix="gpuchef-prometheus-")
        host = url.split("://", 1)[-1].split("/", 1)[0].replace(":", "_")
        path = str(Path(tmp.name) / f"prometheus-{host}.jsonl")
    cols = record_history(url, since_s, step_s, path)
    err.print(f"[dim]{len(cols)} server{'s' if len(cols) != 1 else ''} from {escape(url)} over "
              f"the last {since_s:g} s, every {step_s:g} s: {escape(', '.join(cols))}[/dim]")
    return tmp, path


def _read_once(paths: list[str], err: Console) -> list[str]:
    """``paths`` without repeats of one file (by its resolved path), each repeat named once on
    ``err``: the same trace twice would be two identical groups."""
    seen: dict[Path, str] = {}
    twice: list[str] = []
    for p in paths:
        k = Path(p).expanduser().resolve()
        if k in seen:
            if seen[k] not in twice:
                twice.append(seen[k])
            continue
        seen[k] = p
    for p in twice:
        err.print(f"[yellow]note:[/] {escape(p)} given twice: read once")
    return list(seen.values())


def _report(paths, output, fmt, goodput, metric_percentiles, title, err) -> None:
    from ..probes.metrics import parse_goodput, parse_percentiles
    from ..probes.recorder import TraceReadError

    paths = _read_once(paths, err)
    pcts = parse_percentiles(metric_percentiles)
    slos = parse_goodput(" ".join(goodput)) if goodput else {}
    out = _output(output, paths, fmt)  # before reading: a bad -o is refused at once
    if fmt == "html":
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError(MATPLOTLIB_HINT) from None
    from ..report import build

    try:
        data = build(paths, percentiles=pcts, goodput=slos)
    except TraceReadError as e:
        raise ConfigError(str(e)) from None
    if data.problems:
        n = len(data.problems)
        err.print(f"[yellow]warning:[/] {n} problem{'s' if n != 1 else ''} reading the "
                  f"trace{'s' if len(paths) > 1 else ''}; the report shows what could be read:")
        for p in data.problems[:MAX_PROBLEMS_PRINTED]:
            err.print(f"  {escape(p)}")
        if n > MAX_PROBLEMS_PRINTED:
            err.print(f"  … and {n - MAX_PROBLEMS_PRINTED} more")
    try:
        if fmt == "html":
            from ..report.html import render

            page = render(data, title=title,
                          progress=lambda s: err.print(f"[dim]plotting {s}[/dim]")
                          if err.is_terminal else None)
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(page, encoding="utf-8")
            size = Path(out).stat().st_size
            err.print(f"wrote {out} ({size / 1e6:.2f} MB): {len(data.views)} trace"
                      f"{'s' if len(data.views) != 1 else ''}, groups: "
                      + (", ".join(g.label for g in data.groups) or "none (no steps or requests)"))
        elif fmt == "perfetto":
            from ..report.perfetto import write

            Path(out).parent.mkdir(parents=True, exist_ok=True)
            n = write(data, out)
            err.print(f"wrote {out}: {n} trace events (open it in ui.perfetto.dev)")
        else:
            from ..report.csvs import write

            files = write(data, out)
            err.print("wrote " + ", ".join(f"{p} ({n} {what})" for p, n, what in files))
    except OSError as e:
        raise ConfigError(f"-o {out!r}: cannot write: {e.strerror or e}") from None
