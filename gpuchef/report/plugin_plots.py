"""The report's figure of gpuchef's vLLM plugin records in an attached trace (`top --attach URL
--plugin HOST:PORT --trace FILE`): the server's output batches over time, per engine.

The records are turned into rows by ``probes.plugin_steps`` (the conversion the dashboard and
replay use) and binned by ``tui.iterations.IterationColumns`` on one grid over the trace: the
same figures the dashboard's plugin panels draw, per bin — the time between output batches
(front end) and the engine core's ITL, the largest batch's prefill tokens and decode rows, the
queues and KV cache held between batches. One line style per (server, engine_idx) stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuchef.probes.plugin_steps import IterationLog, iterations_of
from gpuchef.tui.iterations import IterationColumns, IterationFrame
from gpuchef.tui.plotdata import TimeGrid

from . import plots
from .data import TraceView

#: where the numbers come from, in every panel's title
SOURCE = "from gpuchef's vLLM plugin, per output batch"
STYLES = ("-", "--", ":", "-.")


def trace_frames(view: TraceView, bins: int = plots.TARGET_BINS
                 ) -> list[tuple[str, IterationFrame]]:
    """(label, frame) per stream of ``view``'s plugin records, binned over the trace: label
    "host:port engine N" (the attached server the endpoint belongs to, from the meta)."""
    tr = view.trace
    if not tr.plugin:
        return []
    log: IterationLog = iterations_of(tr.plugin)
    src = tr.meta.get("source") if isinstance(tr.meta.get("source"), dict) else {}
    eps = src.get("plugin") if isinstance(src.get("plugin"), dict) else {}
    server_of = {str(v): str(k) for k, v in eps.items()}
    grid = TimeGrid.spanning(view.origin_ns, view.end_ns + 1, bins)
    out = []
    for key in log.keys():
        cols = IterationColumns(*key, max_age_ns=1 << 62)
        cols.extend(log.rows(key), 0)
        name = server_of.get(key[0], key[0]).split("//", 1)[-1]
        out.append((f"{name} engine {key[1]}", cols.frame(grid)))
    return out


def _panels(frames: list[tuple[str, IterationFrame]]) -> list[tuple[str, str, list]]:
    """(title, unit, [(label, colour, series)]) of each panel."""
    rows: list[tuple[str, str, list]] = [
        ("Time between output batches (front end, mean per bin); ITL (engine core)", "ms", []),
        ("Tokens of the largest output batch in each bin", "tokens", []),
        ("Queue after each batch", "requests", []),
        ("KV cache used", "%", [])]
    for label, f in frames:
        w = f.wave
        rows[0][2].extend([(f"between · {label}", plots.MIXED, f.interval_ms),
                           (f"ITL · {label}", "#555555", f.itl_ms)])
        rows[1][2].extend([(f"prefill · {label}", plots.PREFILL, w.prefill_per_step),
                           (f"decode rows · {label}", plots.DECODE, w.decode_per_step)])
        rows[2][2].extend([(f"running · {label}", "#2ec4b6", w.running),
                           (f"waiting · {label}", "#e0a040", w.waiting)])
        rows[3][2].append((f"KV used · {label}", "#6a9f4f", w.kv * 100))
    return rows


@plots._with_rc
def plugin_figure(view: TraceView) -> str | None:
    """The figure of ``view``'s plugin records as SVG, or None when it has none."""
    frames = trace_frames(view)
    if not frames:
        return None
    grid = frames[0][1].grid
    t = np.array([view.t(grid.t0_ns + (i + 0.5) * grid.bin_ns) for i in range(grid.cols)])
    panels = _panels(frames)
    fig = plots._figure(11.5, 1.6 * len(panels) + 0.5)
    axes = fig.subplots(len(panels), 1, sharex=True)
    n = len(frames)
    for ax, (title, unit, series) in zip(axes, panels):
        per = len(series) // n
        for k, (label, colour, ys) in enumerate(series):
            ys = np.asarray(ys, float)
            if not np.isfinite(ys).any():
                continue
            ok = np.isfinite(ys)
            ax.plot(t[ok], ys[ok], color=colour, lw=1.0, ls=STYLES[(k // per) % len(STYLES)],
                    marker="." if ok.sum() < 60 else None, ms=3, label=label)
        ax.set_title(f"{title} — {SOURCE}", loc="left", fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_ylim(bottom=0)
        if ax.lines:
            ax.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("time (s) from the trace's start")
    return plots.to_svg(fig, f"plugin-{plots._slug(view.name)}",
                        f"vLLM plugin records of {view.name}")


__all__: list[Any] = ["SOURCE", "plugin_figure", "trace_frames"]
