"""Drawing waveforms as terminal cells: stacked bars in eighth blocks, built straight into Strips.

No Rich layout runs per frame: a chart is a grid of (character, foreground, background) cells
computed with numpy a row at a time, then merged into one Segment per run of equal style. A
120-column, 6-row chart costs ~0.1 ms to build this way.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from . import theme

EIGHTHS = np.array(list(" ▁▂▃▄▅▆▇█"))
GUTTER_L = 8   # y-axis labels / series names
GUTTER_R = 8   # latest value


@lru_cache(maxsize=512)
def style(fg: str | None = None, bg: str | None = None, bold: bool = False,
          dim: bool = False) -> Style:
    """A cached Rich Style (building Styles is the slow part of drawing)."""
    return Style(color=fg, bgcolor=bg, bold=bold, dim=dim)


class Cells:
    """A ``rows × cols`` grid of characters with foreground/background palette indices.

    ``palette[i]`` is a colour string; index -1 means "none" (the panel background).
    """

    def __init__(self, rows: int, cols: int, palette: Sequence[str]) -> None:
        self.rows, self.cols = rows, cols
        self.palette = list(palette)
        self.chars = np.full((rows, cols), " ", dtype="<U1")
        self.fg = np.full((rows, cols), -1, dtype=np.int16)
        self.bg = np.full((rows, cols), -1, dtype=np.int16)

    def colour(self, c: str) -> int:
        try:
            return self.palette.index(c)
        except ValueError:
            self.palette.append(c)
            return len(self.palette) - 1

    def stacked(self, layers: Sequence[np.ndarray], colours: Sequence[str], top: int = 0,
                height: int | None = None) -> None:
        """Draw stacked bars from the bottom of rows ``[top, top+height)``.

        ``layers``: per-column heights in rows (float, NaN = 0), bottom layer first. The top of
        each bar is exact to 1/8 of a row (eighth blocks); the boundaries between layers are
        rounded to whole rows. That keeps one style per colour (a full "█" and a partial top
        block share it), so a row is a few long runs instead of one run per cell: the terminal
        and Textual's compositor work per run.
        """
        h = self.rows - top if height is None else height
        if h <= 0 or not layers:
            return
        cidx = np.array([self.colour(c) for c in colours], dtype=np.int16)
        L = len(layers)
        cum = np.cumsum(np.nan_to_num(np.vstack([np.asarray(x, float) for x in layers]),
                                      nan=0.0, posinf=0.0).clip(min=0), axis=0)
        cum = np.minimum(cum, h)
        total8 = np.rint(cum[-1] * 8).astype(np.int64)            # exact top, in eighths
        r = np.arange(h)[:, None]                                  # row 0 = bottom
        fill = np.clip(total8[None, :] - 8 * r, 0, 8)              # (h, cols)
        if L > 1:  # layer owning each row: inner (whole-row) boundaries at or below it
            inner = np.minimum(np.rint(cum[:-1]), cum[-1])         # (L-1, cols)
            k = (inner[None, :, :] <= r[:, None, :]).sum(axis=1)
        else:
            k = np.zeros_like(fill)
        on = fill > 0
        rows = slice(top + h - 1, top - 1 if top > 0 else None, -1)  # bottom row first
        self.chars[rows] = np.where(on, EIGHTHS[fill], self.chars[rows])
        self.fg[rows] = np.where(on, cidx[np.minimum(k, L - 1)], self.fg[rows])

    def hline(self, level: np.ndarray, colour: str, top: int = 0, height: int | None = None,
              char: str = "╌", over: bool = False) -> None:
        """A dashed line at ``level`` rows above the bottom (per column, NaN = none), drawn
        only in empty cells; ``over``: through bars too (the bar's colour becomes the cell's
        background), so that a level inside a bar still shows."""
        h = self.rows - top if height is None else height
        lv = np.asarray(level, float)
        ok = np.isfinite(lv) & (lv > 0) & (lv <= h + 1e-9)
        if not ok.any():
            return
        cols = np.nonzero(ok)[0]
        rows = np.clip(top + h - np.ceil(lv[cols] - 1e-9).astype(np.int64), top, top + h - 1)
        empty = self.chars[rows, cols] == " "
        if over:
            full = self.chars[rows, cols] == "█"  # a partial top block gives way to the line
            self.bg[rows[full], cols[full]] = self.fg[rows[full], cols[full]]
            empty[:] = True
        rows, cols = rows[empty], cols[empty]
        self.chars[rows, cols] = char
        self.fg[rows, cols] = self.colour(colour)

    def markers(self, cols: Sequence[int], colour: str = theme.MARKER, char: str = "┊") -> None:
        """Vertical lines at ``cols`` through every empty cell (knob changes, mode switches)."""
        ci = self.colour(colour)
        for c in cols:
            if 0 <= c < self.cols:
                empty = self.chars[:, c] == " "
                self.chars[empty, c] = char
                self.fg[empty, c] = ci

    def strips(self, left: Sequence[tuple[str, Style]] = (), right: Sequence[tuple[str, Style]] = (),
               bg: str | None = None) -> list[Strip]:
        """One Strip per row, with gutter texts ``left[r]`` (GUTTER_L wide) and ``right[r]``.

        Runs of equal colours are found with numpy, so the Python work is per run, not per cell.
        """
        pal = self.palette
        n = self.cols
        styles: dict[int, Style] = {}
        blank_l = (" " * GUTTER_L, style(bg=bg))
        blank_r = (" " * GUTTER_R, style(bg=bg))
        # A blank cell shows no foreground, so it takes its left neighbour's: then a row is one
        # run per colour change instead of one per filled/blank edge (Textual and the terminal
        # pay per run). Leading blanks take the first colour to their right.
        fg = self.fg.astype(np.int32)
        blank = (self.chars == " ") & (self.bg < 0)
        if blank.any():
            idx = np.where(blank, -1, np.arange(self.cols)[None, :])
            np.maximum.accumulate(idx, axis=1, out=idx)
            first = np.where(blank.all(axis=1), 0, np.argmax(~blank, axis=1))
            idx = np.where(idx < 0, first[:, None], idx)
            fg = np.take_along_axis(fg, idx, axis=1)
        keys = (fg + 1) * 65536 + (self.bg.astype(np.int32) + 1)
        text_all = self.chars.tobytes().decode("utf-32-le")  # '<U1' cells: 4 bytes each
        empty = np.zeros(0, dtype=np.int64)
        rr, cc = np.nonzero(keys[:, 1:] != keys[:, :-1]) if n > 1 else (empty, empty)
        cuts: list[list[int]] = [[] for _ in range(self.rows)]
        for a, b in zip(rr.tolist(), (np.asarray(cc) + 1).tolist()):
            cuts[a].append(b)
        firsts = keys[:, 0].tolist() if n else []
        out = []
        for r in range(self.rows):
            lt, ls = left[r] if r < len(left) else blank_l
            segs = [Segment(lt[:GUTTER_L].ljust(GUTTER_L), ls)]
            if n:
                text = text_all[r * n:(r + 1) * n]
                starts = [0] + cuts[r]
                ends = cuts[r] + [n]
                row_keys = keys[r]
                for a, b in zip(starts, ends):
                    key = firsts[r] if a == 0 else int(row_keys[a])
                    st = styles.get(key)
                    if st is None:
                        f, g = key // 65536 - 1, key % 65536 - 1
                        st = styles[key] = style(pal[f] if f >= 0 else None,
                                                 pal[g] if g >= 0 else bg)
                    segs.append(Segment(text[a:b], st))
            rt, rs = right[r] if r < len(right) else blank_r
            segs.append(Segment(rt[:GUTTER_R].rjust(GUTTER_R), rs))
            out.append(Strip(segs, GUTTER_L + n + GUTTER_R))
        return out


def text_strip(parts: Sequence[tuple[str, Style]], width: int, bg: str | None = None) -> Strip:
    """A one-line Strip from (text, style) parts, cropped or padded to ``width``."""
    segs = [Segment(t, s) for t, s in parts if t]
    strip = Strip(segs)
    if strip.cell_length > width:
        return strip.crop(0, width)
    pad = width - strip.cell_length
    if pad:
        segs.append(Segment(" " * pad, style(bg=bg)))
    return Strip(segs, width)


def fmt_num(v: float, unit: str = "") -> str:
    """Compact number: 1234 -> "1.2k", 0.5 -> "0.5", NaN -> "–"."""
    if v is None or not np.isfinite(v):
        return "–"
    a = abs(v)
    if a >= 1e6:
        s = f"{v / 1e6:.1f}M"
    elif a >= 1e4:
        s = f"{v / 1e3:.0f}k"
    elif a >= 1e3:
        s = f"{v / 1e3:.1f}k"
    elif a >= 100 or v == int(v):
        s = f"{v:.0f}"
    elif a >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.2f}"
    return s + unit


#: A readout older than this (s) says how old it is.
STALE_S = 1.0


def fmt_age(s: float) -> str:
    """How old a readout is, at most 8 cells: 3.2 -> "3.2s ago", 75 -> "1.2m ago"; "" for a
    fresh one (< STALE_S) or an unknown age."""
    if not np.isfinite(s) or s < STALE_S:
        return ""
    if s < 10:
        return f"{s:.1f}s ago"
    if s < 60:
        return f"{s:.0f}s ago"
    if s < 600:
        return f"{s / 60:.1f}m ago"
    return f"{s / 60:.0f}m ago" if s < 6000 else f"{s / 3600:.0f}h ago"


def last_value(a: np.ndarray, back: int = 3) -> float:
    """The newest finite value among the last ``back`` columns (NaN if none)."""
    tail = np.asarray(a, float)[-back:]
    ok = np.nonzero(np.isfinite(tail))[0]
    return float(tail[ok[-1]]) if len(ok) else float("nan")
