"""The report's figure of an attached trace (`top --attach --trace`): the server's ``/metrics``
over time, per scrape interval — derived series, and labelled so.

A server gpuchef does not host leaves no steps in the trace; what the report can draw of it is
what the dashboard drew: the intervals between consecutive good scrapes
(``probes.scrape.delta``), one panel each for the queue (running/waiting), KV cache used, token
rates (prompt, generation), and the iteration-token histogram's interval mean (the batch
estimate). Each panel's title says "from /metrics, N ms scrapes".
"""

from __future__ import annotations

from typing import Any, Sequence

from gpuchef.probes.scrape import ScrapeDelta, ScrapeSample, deltas_of

from . import plots
from .data import TraceView


def trace_deltas(scrapes: Sequence[ScrapeSample]) -> dict[str, list[ScrapeDelta]]:
    """Each scraped URL's intervals (time order), as the live dashboard drew them
    (``probes.scrape.deltas_of``: an interval in which no step ended while requests ran is
    merged into the next)."""
    by_url: dict[str, list[ScrapeSample]] = {}
    for s in sorted(scrapes, key=lambda x: x.t_ns):
        by_url.setdefault(s.url, []).append(s)
    out = {u: deltas_of(ss) for u, ss in by_url.items()}
    return {u: d for u, d in out.items() if d}


#: (panel title, [(series, label, colour, scale)], unit)
PANELS = (
    ("Queue", [("running", "running", "#2ec4b6", 1.0), ("waiting", "waiting", "#e0a040", 1.0)],
     "requests"),
    ("KV cache used", [("kv_usage", "KV used", "#6a9f4f", 100.0)], "%"),
    ("Token rates", [("prompt_tokens", "prompt", "#ff9f1c", 1.0),
                     ("generation_tokens", "generation", "#3a86ff", 1.0)], "tokens/s"),
    ("Tokens per iteration (estimate)", [("iteration_tokens", "mean of the interval", "#8172B3",
                                          1.0)], "tokens"),
)


def _series(d: ScrapeDelta, name: str) -> float | None:
    if name in d.gauges:
        return d.gauges[name]
    if name in d.rates:
        return d.rates[name]
    return d.hist_mean.get(name)


@plots._with_rc
def scrape_figure(view: TraceView, hz: float | None = None) -> str | None:
    """The derived figure of ``view`` as SVG, or None when the trace has no two good scrapes of
    one server. ``hz``: the scrape rate named in the titles (default: the trace meta's)."""
    per_url = trace_deltas(view.trace.scrapes)
    if not per_url:
        return None
    hz = hz or float(view.meta.get("scrape_hz") or 0) or None
    every = f"{1000 / hz:.0f} ms scrapes" if hz else "per scrape interval"
    fig = plots._figure(11.5, 1.45 * len(PANELS) + 0.5)
    axes = fig.subplots(len(PANELS), 1, sharex=True)
    styles = ("-", "--", ":", "-.")
    for ax, (title, series, unit) in zip(axes, PANELS):
        drawn = False
        for k, (url, ds) in enumerate(per_url.items()):
            t = [view.t(d.t_ns) for d in ds]
            for name, label, colour, scale in series:
                ys = [_series(d, name) for d in ds]
                if all(y is None for y in ys):
                    continue
                ys = [float("nan") if y is None else y * scale for y in ys]
                lab = label if len(per_url) == 1 else f"{label} · {url.split('//')[-1]}"
                ax.step(t, ys, where="pre", color=colour, lw=1.1, ls=styles[k % len(styles)],
                        label=lab)
                drawn = True
        ax.set_title(f"{title} — from /metrics, {every} (derived)", loc="left", fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        if drawn:
            ax.legend(loc="upper right", fontsize=7)
        else:
            ax.text(0.5, 0.5, "no such series in this server's /metrics", ha="center",
                    va="center", transform=ax.transAxes, color="#888888", fontsize=8)
    axes[-1].set_xlabel("time (s) from the trace's start")
    return plots.to_svg(fig, f"scrape-{plots._slug(view.name)}",
                        f"Server /metrics of {view.name} (derived)")


__all__: list[Any] = ["PANELS", "scrape_figure", "trace_deltas"]
