"""The report's figures, drawn with matplotlib (``Figure`` objects: no pyplot, no GUI backend)
and returned as inline SVG text for the HTML page — one module per figure family, gathered here
so that the page (``html``) and its callers name them as ``plots.<name>``:

* ``plot_kit``: the rc style, ``to_svg``, colours, time binning, the event overlay;
* ``waveform_plots``: the run over time (``waveforms``);
* ``autopilot_plots``: the autopilot's allowance, predictions and states (``autopilot``);
* ``gpu_plots``: each GPU of a trace (``per_gpu``);
* ``step_plots``: step close-ups (``closeups``) and batch composition (``composition_hist``);
* ``latency_plots``: latency CDFs (``latency_cdfs``) and A/B windows (``ab_windows_plot``).

Each figure function takes the :class:`~gpuchef.report.data.ReportData` (or one of its views)
and returns an SVG string (``<svg …>…</svg>``: no XML prolog, no RDF metadata, ids salted per
figure so that several SVGs can live in one HTML document). Dense artists (thousands of step
bars or points) are kept few by binning and quantile-sampling, so the page stays small.
"""

from __future__ import annotations

from .plot_kit import (CDF_POINTS, CHAR_W, DECODE, GRID, INK, LABEL_FONT, LABEL_ROW_PT, LABEL_ROWS,
                       _LEGEND, MIXED, PREFILL, _RC, TARGET_BINS, _attr, _binned, _events_overlay,
                       _ffill, _figure, _log_x, _nice_bin, place_labels, _slug, _timeline, to_svg,
                       _with_rc)  # noqa: F401
from .waveform_plots import waveforms, waveforms_figure  # noqa: F401
from .autopilot_plots import (ALLOWANCE, AP_STATES, ap_state_label, autopilot, autopilot_absent,
                              autopilot_figure, autopilot_series)  # noqa: F401
from .gpu_plots import UTIL_FIELDS, per_gpu, spread, util_field  # noqa: F401
from .step_plots import (_KIND_LABEL, closeup_stats, closeup_steps, closeup_window, closeups,
                         composition, composition_hist, _kind)  # noqa: F401
from .latency_plots import (_LOG_TICKS, ab_windows_plot, _cdf, latency_cdfs, latency_figure,
                            latency_values, log_ticks)  # noqa: F401
