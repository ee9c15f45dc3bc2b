"""`gpuchef report`: session traces to a self-contained HTML report, Chrome/Perfetto trace JSON,
or CSV. ``model.build`` reads the traces and computes the groups compared (A/B settings or
modes); ``html.render``, ``perfetto.write`` and ``csvs.write`` turn them into files. matplotlib
(the ``report`` extra) is needed only for the HTML report."""

from .data import Group, ReportData, Segment, TraceView, build

__all__ = ["Group", "ReportData", "Segment", "TraceView", "build"]
