"""The live A/B screen: settings A and B side by side on the same arrival stream — the same
waveforms (each setting's newest window, on its own axis from the window's start) and the same
numbers, with the difference B − A and whether it is beyond the run-to-run spread."""

from __future__ import annotations

import math
import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static

from gpuchef.engine_host.vocab.config import setting_short

from .. import theme
from gpuchef.probes.ab import FAILED_ROW, pool

from ..ab_live import ABResult, ABWindow
from ..chart import GUTTER_L, GUTTER_R
from ..plotdata import TimeGrid, build_frame
from ..widgets.header import SessionHeader
from ..widgets.waveforms import BatchPanel, GpuPanel, StepPanel, TimeAxis
from .main import header_state

REFRESH_S = 0.5


def describe_setting(d: dict) -> str:
    """An A/B setting as typed: ``budget=512, chunk=off``."""
    return ", ".join(f"{setting_short(k)}={'off' if k == 'long_prefill_token_threshold' and v == 0 else v}"
                     for k, v in d.items()) or "as before"


class SideTitle(Static):
    DEFAULT_CSS = """
    SideTitle { height: 1; background: #1b2130; padding: 0 1; }
    """


class ABScreen(Screen):
    BINDINGS = [("a,escape", "app.pop_screen", "back"), ("x", "app.ab_stop", "stop A/B"),
                ("r", "app.ab_restart", "run again")]
    # layout: tui/gpuchef.tcss (ABScreen)

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.ready = False  # set once the first tick has drawn every panel
        self._last = 0.0
        self._drawn: dict[str, tuple] = {}
        #: two attached servers: per side the pooled client figures shown (BenchMetrics/None)
        self.figures: dict = {}
        self.rows: list = []  # ... and the B − A rows shown

    @property
    def attached(self) -> bool:
        """Two servers gpuchef does not host (`top --attach`): no steps to draw; each side
        shows its server's client-side figures."""
        return not self.app.session.info.per_step_records

    def compose(self) -> ComposeResult:
        attached = self.attached
        if attached:
            yield Static(id="ab-aheader")
        else:
            yield SessionHeader(id="header")
        yield Static(id="ab-banner")
        with Horizontal(id="ab-sides"):
            for label in ("A", "B"):
                with Vertical(id=f"side-{label}"):
                    yield SideTitle(id=f"title-{label}")
                    if attached:
                        yield Static(id=f"nums-{label}", classes="ab-nums")
                        continue
                    yield GpuPanel(id=f"gpu-{label}")
                    yield StepPanel(id=f"step-{label}")
                    yield BatchPanel(id=f"batch-{label}")
                    yield TimeAxis(id=f"axis-{label}")
        yield Static(id="ab-table")
        yield Footer()

    def on_mount(self) -> None:
        if self.attached:
            self.call_after_refresh(self._first_tick)
            return
        for label in ("A", "B"):
            self.query_one(f"#axis-{label}", TimeAxis).from_start = True
            # half-width panels: short titles (the main screen's help names the sources)
            for pid, unit in (("gpu", "% · NVML/GPM"), ("step", "busy % · StepRecord"),
                              ("batch", "tokens, largest step · StepRecord")):
                p = self.query_one(f"#{pid}-{label}")
                p.UNIT, p.SOURCE = unit, ""
        self.call_after_refresh(self._first_tick)

    def _first_tick(self) -> None:
        self.tick(force=True)
        self.ready = True

    def on_resize(self) -> None:
        if self.ready:
            self.call_after_refresh(self.tick, True)

    def on_screen_resume(self) -> None:
        if self.ready:
            self.tick(force=True)

    def tick(self, force: bool = False) -> None:
        wall = time.monotonic()
        if not force and wall - self._last < REFRESH_S:
            return
        self._last = wall
        app = self.app
        s = app.session
        now = s.clock()
        if self.attached:
            self._tick_attached(s, now)
            return
        self.query_one(SessionHeader).show(header_state(app))
        st = s.ab.state()
        snap = s.timeline.snapshot(now)
        res = app.ab_analyser.analyse(snap, st)
        _show(self.query_one("#ab-banner", Static), self._banner(st, res, now))
        gpu_on = bool(s.gpu_available)
        for label in ("A", "B"):
            w = _newest(res.windows, label)
            title = self.query_one(f"#title-{label}", SideTitle)
            colour = theme.AB_COLOURS[label]
            t = Text()
            t.append(f" {label} ", style=f"bold {theme.PANEL_BG} on {colour}")
            t.append(f"  {describe_setting(st.settings.get(label, {}))}", style=f"bold {theme.TITLE}")
            if w is None:
                t.append("   no window yet", style=theme.LABEL)
            else:
                state = "complete" if w.complete else "running"
                t.append(f"   window {label}#{w.n} ({state}), from step {w.step0}",
                         style=theme.LABEL)
            title.update(t, layout=False)  # one line, fixed height
            gpu = self.query_one(f"#gpu-{label}", GpuPanel)
            gpu.set_class(not gpu_on, "off")
            if w is None or st.window_s <= 0:
                continue
            step = self.query_one(f"#step-{label}", StepPanel)
            cols = step.size.width - GUTTER_L - GUTTER_R
            if cols <= 0:
                continue
            t1 = w.t0_ns + int(st.window_s * 1e9)
            if w.t1_ns is not None:
                t1 = w.t1_ns
            key = (w.t0_ns, w.t1_ns, cols, gpu_on)
            if w.complete and self._drawn.get(label) == key and not force:
                continue  # a finished window's picture does not change
            self._drawn[label] = key
            grid = TimeGrid.spanning(w.t0_ns, t1, cols, now)
            frame = build_frame(snap, grid, gpu=gpu_on)
            for pid in ("gpu", "step", "batch", "axis"):
                p = self.query_one(f"#{pid}-{label}")
                if pid == "gpu" and not gpu_on:
                    continue
                p.set_frame(frame)
        _show(self.query_one("#ab-table", Static), self._table(res, st))

    # -- two attached servers ----------------------------------------------------------------------
    def _tick_attached(self, s, now: int) -> None:
        """The banner (the A/B load, stated), per server its client-side figures pooled over
        its counted repetitions (``figures``, read by tests), the B − A table and verdict."""
        from .attach import attach_header_text

        self.query_one("#ab-aheader", Static).update(
            attach_header_text(s, int((now - s.start_ns) // 1_000_000_000)))
        st = s.ab.state()
        res = self.app.ab_analyser.analyse(s.timeline.snapshot(now), st)
        _show(self.query_one("#ab-banner", Static), self._banner_attached(st, res))
        self.figures, self.rows = {}, res.rows
        for label in ("A", "B"):
            side = res.settings[label]
            m = side.pooled
            if m is None and side.windows:  # B has none yet: A's counted ones alone
                m = pool(side.windows, self.app.session.percentiles, s.slos or None)[0]
            self.figures[label] = m
            t = Text()
            t.append(f" {label} ", style=f"bold {theme.PANEL_BG} on {theme.AB_COLOURS[label]}")
            t.append(f"  {st.servers.get(label, '?')}", style=f"bold {theme.TITLE}")
            t.append(f"   {len(side.windows)} counted repetition"
                     f"{'' if len(side.windows) == 1 else 's'}", style=theme.LABEL)
            self.query_one(f"#title-{label}", SideTitle).update(t, layout=False)
            _show(self.query_one(f"#nums-{label}", Static),
                  client_figures(m, res.run, side.windows))
        _show(self.query_one("#ab-table", Static), self._table(res, st))

    def _banner_attached(self, st, res: ABResult) -> Text:
        t = Text()
        if res.run is None and not st.active:
            t.append("No A/B run yet. ", style=f"bold {theme.TITLE}")
            t.append("Press a to send gpuchef's load to both servers (A = the first --attach, "
                     "B = the second).", style=theme.LABEL)
            return t  # a status line (why the last run ended badly) is the header's
        t.append(f"A/B run #{st.run}", style=f"bold {theme.TITLE}")
        t.append(" · two servers · load ", style=theme.LABEL)
        t.append(st.load, style=f"bold {theme.TITLE}")
        t.append(" — " + AB_LOAD_WORDS.get(st.load, ""), style=theme.LABEL)
        t.append(f"\nrepetitions of each: {st.rounds}", style=theme.TITLE)
        if res.pairs < res.min_pairs:
            t.append(f" (verdict after {res.min_pairs} each)", style=theme.LABEL)
        if st.active:
            now = "both servers" if st.current == "AB" else st.servers.get(st.current, "")
            t.append(f"   now repetition {st.index} · {st.current} ({now})",
                     style=f"bold {theme.TITLE}")
            t.append("    x stop · a/esc back", style=theme.AXIS)
        else:
            t.append("   finished", style=theme.LABEL)
            t.append("    r run again · a/esc back", style=theme.AXIS)
        return t

    # -- text ------------------------------------------------------------------------------------
    def _banner(self, st, res: ABResult, now: int) -> Text:
        t = Text()
        if res.run is None:
            t.append("No A/B run yet. ", style=f"bold {theme.TITLE}")
            t.append("Press a on the main screen (A = the setting in force, B = the other mode), "
                     "or type 'ab budget=2048 vs budget=512' in the command palette (ctrl+p).",
                     style=theme.LABEL)
            return t
        t.append(f"A/B run #{res.run}", style=f"bold {theme.TITLE}")
        t.append(f" · windows of {st.window_s:g} s alternating A, B on the same arrival stream · "
                 "a request counts in the window it arrived in, once it has finished",
                 style=theme.LABEL)
        nA, nB = len(res.settings["A"].windows), len(res.settings["B"].windows)
        t.append(f"\ncounted windows: A {nA}, B {nB}", style=theme.TITLE)
        if res.pairs < res.min_pairs:
            t.append(f" (verdict after {res.min_pairs} each)", style=theme.LABEL)
        if st.active:
            left = max(0.0, st.window_s - (now - st.window_t0_ns) / 1e9)
            t.append("   now ", style=theme.LABEL)
            t.append(f" {st.current}#{st.index} ", style=f"bold {theme.PANEL_BG} on "
                     f"{theme.AB_COLOURS.get(st.current, theme.TITLE)}")
            t.append(f" {left:.1f} s left", style=theme.TITLE)
            if st.rounds:
                t.append(f" (of {st.rounds} windows per setting)", style=theme.LABEL)
            t.append("    x stop · a/esc back", style=theme.AXIS)
        else:
            t.append("   finished — settings restored" if res.ended else "", style=theme.LABEL)
            t.append("    r run again · a/esc back", style=theme.AXIS)
        return t

    def _table(self, res: ABResult, st) -> Text:
        """The A/B table as fixed-width lines (cheap to redraw twice a second): pooled A, B and
        B − A, then the per-window paired deltas' median and range, and the verdict — the rows
        of ``probes.ab.compare``, as ``gpuchef ab`` prints them (failed requests first; when A
        and B lost different shares of their requests, one line why the rest are not compared)."""
        t = Text(no_wrap=True, overflow="crop")
        head = f"bold {theme.TITLE}"
        if not res.rows:
            t.append("No counted window of both settings yet.", style=theme.LABEL)
            return t
        unit = "repetition" if st.load else "window"  # two attached servers: whole loads
        t.append(f"{'':<32}{f'pooled (all counted {unit}s)':^46}{f'per {unit} (pairs)':^32}\n",
                 style=theme.LABEL)
        t.append(f"{'metric':<32}", style=head)
        t.append(f"{'A':>12}", style=f"bold {theme.AB_COLOURS['A']}")
        t.append(f"{'B':>12}", style=f"bold {theme.AB_COLOURS['B']}")
        t.append(f"{'B − A':>12}{'B − A %':>10}{'median Δ':>11}{'Δ min..max':>21}  verdict\n",
                 style=head)
        for r in res.rows:
            if r.verdict == "n/a":  # e.g. SM active without NVML
                continue
            nd = 0 if r.key == FAILED_ROW else 2 if r.unit in ("req/s",) else 1
            colour = {"B better": theme.RUNNING, "B worse": theme.PREEMPTED,
                      "differs": theme.WAITING}.get(r.verdict, theme.AXIS)
            lo, hi = r.spread
            t.append(f"{r.label[:31]:<32}", style=theme.LABEL)
            t.append(f"{_f(r.a, nd):>12}{_f(r.b, nd):>12}{_f(r.delta, nd, sign=True):>12}"
                     f"{_f(r.delta_pct, 0, sign=True, unit='%'):>10}", style=theme.TITLE)
            rng = f"{_f(lo, nd)}..{_f(hi, nd)}" if lo == lo else "–"
            t.append(f"{_f(r.median_delta, nd, sign=True):>11} {rng:>20}  ", style=theme.LABEL)
            t.append(r.verdict + "\n", style=colour)
        why = res.comparison.not_comparable if res.comparison is not None else ""
        if why:  # the judged rows read "not comparable": say why
            t.append(f"Not comparable: {why}.", style=theme.PREEMPTED)
        t.rstrip()
        return t


#: The A/B load of two attached servers, as the screen states it (``ABState.load``).
AB_LOAD_WORDS = {
    "mirrored": "every request sent to both servers at the same arrival time (fair only when "
                "they do not share a GPU)",
    "sequential": "the whole load to one server, then the other; repetitions alternating "
                  "A B, B A, …"}


def client_figures(m, run, reps=()) -> Text:
    """One server's client-side figures (``probes.metrics.BenchMetrics`` pooled over its
    counted repetitions, vllm bench serve's definitions): requests, TTFT, TPOT, ITL, E2EL
    mean / P50 / P-last, output throughput; then one line per repetition (``reps``: its
    ``probes.ab.WindowResult``s), the spread the verdict is judged against."""
    t = Text(no_wrap=True, overflow="crop")
    if m is None:
        t.append("no counted repetition yet" if run is not None else "", style=theme.LABEL)
        return t
    t.append(f"{'client-side, ms':<16}{'mean':>10}{'median':>10}", style=theme.LABEL)
    pw = [q for q, _ in m.percentiles_ttft_ms][-1:] or [99.0]
    t.append(f"{'P' + format(pw[0], 'g'):>10}\n", style=theme.LABEL)
    for name, stem in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el")):
        pct = getattr(m, f"percentiles_{stem}_ms")
        t.append(f"{name:<16}", style=theme.LABEL)
        t.append(f"{_f(getattr(m, f'mean_{stem}_ms'), 1):>10}"
                 f"{_f(getattr(m, f'median_{stem}_ms'), 1):>10}"
                 f"{_f(pct[-1][1] if pct else None, 1):>10}\n", style=theme.TITLE)
    t.append(f"{'requests':<16}", style=theme.LABEL)
    t.append(f"{m.completed} completed, {m.failed} failed", style=theme.TITLE)
    t.append(f"\n{'output tok/s':<16}", style=theme.LABEL)
    t.append(f"{_f(m.output_throughput, 1)}", style=theme.TITLE)
    if reps:
        t.append(f"\n\n{'repetition':<16}{'requests':>10}{'mean TTFT':>11}{'mean ITL':>10}"
                 f"{'out tok/s':>11}{'span s':>9}", style=theme.LABEL)
    for w in reps:
        x = w.metrics
        t.append(f"\n{w.name:<16}", style=theme.LABEL)
        t.append(f"{x.completed:>10}{_f(x.mean_ttft_ms, 1):>11}{_f(x.mean_itl_ms, 1):>10}"
                 f"{_f(x.output_throughput, 1):>11}{w.duration_s:>9.2f}", style=theme.TITLE)
    return t


def _show(w: Static, text: Text) -> None:
    """Update ``w``; relayout only when its number of lines changed (a relayout measures and
    places every widget on the screen)."""
    lines = text.plain.count("\n") + 1
    if getattr(w, "_lines", None) != lines:
        w._lines = lines
        w.styles.height = lines
        w.update(text)
    else:
        w.update(text, layout=False)


def _newest(wins: list[ABWindow], label: str) -> ABWindow | None:
    """The newest complete window of ``label``, else the one running."""
    mine = [w for w in wins if w.label == label]
    done = [w for w in mine if w.complete]
    if done:
        return done[-1]
    return mine[-1] if mine else None


def _f(v: float, nd: int = 1, sign: bool = False, unit: str = "") -> str:
    if v is None or not math.isfinite(v):
        return "–"
    s = f"{v:+,.{nd}f}" if sign else f"{v:,.{nd}f}"
    return s + unit
