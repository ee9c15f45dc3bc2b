"""One chart, several sources: a band per frame (a server's scrapes, an engine's plugin
records), each a label row and then the chart at its own scale; when the bands do not fit, the
first frame alone. The attach screen's panels (``tui.widgets.scrape``, ``tui.widgets.iterations``)
share this layout."""

from __future__ import annotations

from typing import Any, Sequence

from rich.style import Style
from textual.strip import Strip

from .. import theme
from ..chart import GUTTER_L, GUTTER_R, style, text_strip
from .waveforms import BG, MIN_COLS, ChartPanel


class BandedPanel(ChartPanel):
    """A ChartPanel of several frames (:meth:`set_frames`). Subclasses give each band's label
    (:meth:`band_label`) and, for a frame with nothing to draw, one line saying why
    (:meth:`off_line`: (lead, why) or None)."""

    #: fewest rows a band takes (its label row + the chart) before the panel falls back to the
    #: first frame alone
    MIN_BAND = 4
    frames: tuple[Any, ...] = ()

    def set_frames(self, frames: Sequence[Any]) -> None:
        """One band per frame when they fit at ``MIN_BAND`` rows; else the first alone."""
        self.frames = tuple(frames)
        self.set_frame(self.frames[0])

    def band_label(self, i: int, frame: Any) -> list[tuple[str, Style]]:  # pragma: no cover
        raise NotImplementedError

    def off_line(self, frame: Any) -> tuple[str, str] | None:
        return None

    def _rebuild(self) -> None:
        f = self._frame
        w, h = self.size.width, self.size.height
        n = len(self.frames)
        cols = w - GUTTER_L - GUTTER_R
        if n > 1 and w > 0 and cols >= MIN_COLS and (h - 1) // n >= self.MIN_BAND:
            rows = [self.title_strip(w)]
            band = (h - 1) // n
            for i, fr in enumerate(self.frames):
                bh = band if i < n - 1 else h - 1 - band * (n - 1)
                label = self.band_label(i, fr)
                off = self.off_line(fr)
                if off is not None:
                    label.append((f"  ⊘ {off[0]} — {off[1]}", style(theme.LABEL, BG)))
                    rows += [text_strip(label, w, BG)] + [Strip.blank(w, style(bg=BG))] * (bh - 1)
                    continue
                rows.append(text_strip(label, w, BG))
                rows += self.draw(fr, cols, bh - 1)
            self._publish(rows, w, h)
            return
        off = self.off_line(f) if f is not None and w > 0 else None
        if off is not None:
            parts = [(" ▍", style(theme.AXIS, BG)), (self.TITLE, style(theme.TITLE, BG, bold=True)),
                     (f"  ⊘ {off[0]} — ", style(theme.PREEMPTED, BG, bold=True)),
                     (off[1], style(theme.LABEL, BG))]
            self._publish([text_strip(parts, w, BG)] + [Strip.blank(w, style(bg=BG))] *
                          max(0, h - 1), w, h)
            return
        super()._rebuild()


def band_tag(i: int, name: str, kind: str) -> list[tuple[str, Style]]:
    """A band's label: " 1: host:port " on a darker cell, then its kind."""
    return [(f" {i + 1}: {name} ", style(theme.TITLE, "#1b2130", bold=True)),
            (f" {kind}", style(theme.LABEL, BG))]
