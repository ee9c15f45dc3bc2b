"""Live A/B analysis for the dashboard's A/B screen: ``probes.ab`` over a timeline snapshot.

Marks, windows, which requests and steps a window holds, the window throughput, pooling, the
B − A rows and the verdict are all ``probes.ab``'s — the same code ``gpuchef ab`` and
``gpuchef report`` run, so a trace of the session gives the report the numbers the screen
showed. A request enters a window's figures when it has finished (the timeline holds finished
requests): the newest windows' figures can still change while their requests run. The verdict
waits for ``probes.ab.MIN_WINDOWS`` pairs of windows ("not enough windows yet"); an A/B of two
attached servers (``ABState.load``) runs whole loads, judged as ``gpuchef ab`` judges them
(``MIN_REPETITIONS`` pairs, no window-length rule, no step rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuchef.probes.ab import (LABELS, MIN_REPETITIONS, MIN_WINDOWS, STEP_ROWS, Comparison,
                               DeltaRow, Window, WindowResult, analyse)
from gpuchef.probes.ab import windows as ab_windows
from gpuchef.probes.metrics import gpu_means
from gpuchef.probes.timeline import TimelineSnapshot

from .session import ABState

ABWindow = Window  # the name the screen used

__all__ = ["ABAnalyser", "ABResult", "ABWindow", "SettingResult", "ab_windows"]


@dataclass
class SettingResult:
    """One setting: its counted windows' results (``windows``) and pooled figures (None until
    it has a counted window)."""

    label: str
    windows: list[WindowResult] = field(default_factory=list)
    pooled: object | None = None


@dataclass
class ABResult:
    """A/B run ``run`` as the screen shows it: every window (``windows``, the running one
    last), ``ended``, per setting its counted windows, the B − A ``rows`` (empty until both
    settings have a counted window) and the ``comparison`` they come from."""

    run: int | None
    windows: list[Window]
    ended: bool
    settings: dict[str, SettingResult]
    rows: list[DeltaRow]
    comparison: Comparison | None = None
    min_pairs: int = MIN_WINDOWS

    @property
    def pairs(self) -> int:
        return min(len(self.settings[k].windows) for k in LABELS)


class ABAnalyser:
    """:meth:`analyse` a snapshot; a window whose records did not change is not recomputed."""

    def __init__(self, slos: dict[str, float], percentiles: tuple[float, ...]) -> None:
        self.slos = dict(slos)
        self.percentiles = tuple(percentiles)
        self._cache: dict = {}

    def analyse(self, snap: TimelineSnapshot, state: ABState) -> ABResult:
        # two attached servers (state.load): each window a whole load, as `gpuchef ab` judges
        whole = bool(state.load)
        pairs = MIN_REPETITIONS if whole else MIN_WINDOWS
        run, wins, ended, results, cmp = analyse(
            snap.events, snap.requests, snap.steps, run=state.run or None,
            percentiles=self.percentiles, goodput=self.slos or None, min_pairs=pairs,
            gpu_means=lambda a, b: gpu_means(snap.gpu_samples_between(a, b)), cache=self._cache,
            whole_loads=whole)
        if len(self._cache) > 4096:  # old runs' windows
            self._cache.clear()
        settings = {k: SettingResult(k) for k in LABELS}
        for r in results:
            if r.counted:
                settings[r.label].windows.append(r)
        if cmp is not None:
            for k in LABELS:
                settings[k].pooled = cmp.pooled[k]
        rows = cmp.rows if cmp else []
        if whole:  # the client sees no server's steps (gpuchef ab over HTTP drops them too)
            rows = [r for r in rows if r.key not in STEP_ROWS]
        return ABResult(run, wins, ended, settings, rows, cmp, pairs)
