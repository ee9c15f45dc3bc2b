"""A saved trace as a read-only dashboard session: the playback clock is the dashboard's "now".

:class:`ReplaySession` offers what ``tui.session.Session`` asks of a live session (``info``,
``timeline``, ``clock``, ``load``, ``ab``, ``scheduler_config``, …) over a trace read with
``probes.recorder.read_trace``. Every record goes into one :class:`Timeline` whose rings hold the
whole trace; the screens take snapshots at ``clock()`` = the playback position, and a snapshot
cut at time t holds exactly the records stamped at or before t (steps by ``t_end_ns``), so the
panels show what the live dashboard showed at that moment.

Playback: ``position_ns`` (trace monotonic ns, in ``[start_ns, end_ns]``), ``speed``
(0.25×–16×), ``playing``; ``seek(t_ns)``, ``seek_s(seconds from start)``, ``step(±seconds)``,
``play()``, ``pause()``, ``set_speed(x)``. The position moves with the wall clock while playing
and stops (paused) at the end. Steering (knobs, mode, load rate, A/B, trace export) raises
ConfigError "replay is read-only".
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import SchedulerConfig
from gpuchef.probes.metrics import DEFAULT_PERCENTILES
from gpuchef.probes.recorder import Trace, read_trace, trace_span
from gpuchef.probes.timeline import Timeline
from gpuchef.tui.session import READ_ONLY, ABState, LoadState, SessionInfo

from .attach_plugin import recorded_plugin

SPEED_MIN, SPEED_MAX = 0.25, 16.0


def _read_only(what: str) -> ConfigError:
    return ConfigError(f"{READ_ONLY} ({what})")


class ReplayLoad:
    """The recorded load, read-only: ``state()`` describes it, ``paused`` mirrors playback."""

    REASON = READ_ONLY

    def __init__(self, session: "ReplaySession", kind: str, name: str, rate: float) -> None:
        self._s = session
        self._kind, self._name, self._rate = kind, name, rate

    def state(self) -> LoadState:
        return LoadState(self._kind, self._name, self._rate, 0.0, False, 0, False, False)

    def set_rate(self, value: Any) -> float:
        raise _read_only("load rate")

    def pause(self) -> None:
        raise _read_only("load")

    def resume(self) -> None:
        raise _read_only("load")


class ReplayAB:
    """No A/B in a replay: ``start`` raises ConfigError, ``stop`` does nothing."""

    def state(self) -> ABState:
        return ABState()

    def start(self, a, b, window_s, rounds=None) -> ABState:
        raise _read_only("A/B")

    def stop(self) -> None:
        pass


class ReplayScrapedServer:
    """One server of an attached trace (`top --attach --trace`) as ``tui.session.ScrapedServer``
    at the playback position: its scrapes and their intervals stamped at or before it."""

    def __init__(self, session: "ReplaySession", url: str, samples: list) -> None:
        from gpuchef.probes.scrape import deltas_of

        self._s = session
        self.url = url.removesuffix("/metrics")
        self._samples = sorted(samples, key=lambda x: x.t_ns)
        self._t = [x.t_ns for x in self._samples]
        self._deltas = deltas_of(self._samples)  # the live dashboard's intervals, as it drew them
        self._dt = [d.t_ns for d in self._deltas]
        hz = session.trace.meta.get("scrape_hz")
        self.hz = float(hz) if isinstance(hz, (int, float)) and hz > 0 else 4.0

    def _cut(self) -> int:
        from bisect import bisect_right
        return bisect_right(self._t, self._s.position_ns)

    def samples(self):
        return self._samples[:self._cut()]

    def deltas(self):
        from bisect import bisect_right
        return self._deltas[:bisect_right(self._dt, self._s.position_ns)]

    @property
    def kind(self) -> str:
        ok = [x for x in self.samples() if not x.error]
        return ok[-1].server if ok else "unknown"

    @property
    def status(self) -> str:
        """The failure of the newest scrape at the position ("" if it was good); for a server
        the trace holds no scrape of at all, that it has none."""
        if not self._samples:
            return f"{self.url}: no /metrics scrape in this trace"
        i = self._cut()
        x = self._samples[i - 1] if i else None
        return f"{x.url}: {x.error}" if x is not None and x.error else ""


class ReplaySession:
    """A trace played back. ``trace``: a path or a read :class:`Trace`; ``start_s``: initial
    position (s from the first record, clipped); ``speed``: initial speed (×, 0.25–16); ``wall``:
    the wall clock (s, default ``time.monotonic``; tests pass a fake). ``slos`` (ms) and
    ``percentiles``: for the numbers panel; default: the recorded ones (`gpuchef top` traces),
    else `top`'s defaults for the recorded device and (50, 99). Raises TraceReadError
    (not a trace / unreadable) and ConfigError (bad speed or start). ``problems``: skipped lines
    from the reader (each names its line number)."""

    def __init__(self, trace: str | Path | Trace, *, start_s: float = 0.0, speed: float = 1.0,
                 wall: Callable[[], float] = time.monotonic,
                 slos: dict[str, float] | None = None,
                 percentiles: tuple[float, ...] | None = None,
                 stats_window_s: float = 30.0) -> None:
        tr = trace if isinstance(trace, Trace) else read_trace(trace)
        self.trace = tr
        self.problems = list(tr.problems)
        self.path = str(tr.path)
        self._wall = wall
        self.start_ns, self.end_ns = trace_span(tr)
        self.slos = dict(slos if slos is not None else _default_slos(tr))
        self.percentiles = tuple(percentiles or _default_percentiles(tr))
        self.stats_window_s = float(stats_window_s)
        n = len(tr.steps)
        tl = Timeline(max_steps=max(1, n), max_requests=max(1, len(tr.requests)),
                      max_request_tokens=max(1, sum(len(r.token_times_ns) for r in tr.requests)),
                      max_gpu_samples=max(1, len(tr.gpu_samples)),
                      max_host_samples=max(1, len(tr.host_samples)),
                      max_events=max(1, len(tr.events)), percentiles=self.percentiles,
                      clock=self.clock_ns, origin_ns=self.start_ns)
        # each stream in time order, as a live session adds them (snapshots cut by bisection)
        for s in sorted(tr.steps, key=lambda s: s.t_end_ns):
            tl.add_step(s)
        for g in sorted(tr.gpu_samples, key=lambda g: g.t_ns):
            tl.add_gpu_sample(g)
        for h in sorted(tr.host_samples, key=lambda h: h.t_ns):
            tl.add_host_sample(h)
        for e in sorted(tr.events, key=lambda e: e.t_ns):
            tl.add_event(e)
        for r in sorted(tr.requests, key=lambda r: r.closed_ns):
            tl.add_request(r)
        self.timeline = tl
        # an attached trace: its scrapes, one server each, played back like the other records
        by_url: dict[str, list] = {}
        for x in tr.scrapes:
            by_url.setdefault(x.url.removesuffix("/metrics"), []).append(x)
        # a server the meta names but no scrape of which was written (the trace ended before
        # the first, or holds only plugin records): still a band, so that its plugin rows draw
        for u in _source(tr).get("source", "").split(","):
            if u:
                by_url.setdefault(u.removesuffix("/metrics"), [])
        self.servers = tuple(ReplayScrapedServer(self, u, xs) for u, xs in by_url.items())
        # and its vLLM plugin records: the rows the live dashboard drew, up to the position
        self.plugin = recorded_plugin(tr.meta, tr.plugin, self.clock_ns)
        self._steps = tl.snapshot(self.end_ns).steps
        self._step_ends = [s.t_end_ns for s in self._steps]
        self.info = _info(tr)
        self.load = ReplayLoad(self, *_load(tr))
        self.ab = ReplayAB()
        self._base_cfg = _base_config(tr)
        self.speed = 1.0
        self.set_speed(speed)
        self.playing = False
        self._anchor_pos = self.start_ns
        self._anchor_wall = wall()
        self.seek_s(start_s)
        self.clock = self.clock_ns

    # -- playback -----------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def position_ns(self) -> int:
        """The playback clock (trace monotonic ns); stops and pauses at the end."""
        if not self.playing:
            return self._anchor_pos
        p = self._anchor_pos + int((self._wall() - self._anchor_wall) * self.speed * 1e9)
        if p >= self.end_ns:
            self._anchor_pos, self.playing = self.end_ns, False
            return self.end_ns
        return p

    @property
    def position_s(self) -> float:
        """Seconds from the first record."""
        return (self.position_ns - self.start_ns) / 1e9

    def clock_ns(self) -> int:
        return self.position_ns

    def _anchor(self, pos: int) -> None:
        self._anchor_pos = min(max(int(pos), self.start_ns), self.end_ns)
        self._anchor_wall = self._wall()

    def seek(self, t_ns: int) -> int:
        """Move to trace time ``t_ns`` (clipped to the trace); keeps playing if it was."""
        self._anchor(t_ns)
        return self._anchor_pos

    def seek_s(self, seconds: float) -> int:
        """Move to ``seconds`` from the first record. Raises ConfigError for a non-number."""
        try:
            v = float(seconds)
        except (TypeError, ValueError):
            v = math.nan
        if not math.isfinite(v):
            raise ConfigError(f"replay time {seconds!r} is not a number of seconds")
        # clipped before the ns conversion: 1e300 s is the end, not an OverflowError
        return self.seek(self.start_ns + int(min(max(v, 0.0), self.duration_s + 1.0) * 1e9))

    def step(self, seconds: float) -> int:
        """Seek by ``seconds`` (negative: back), clipped to the trace."""
        d = self.duration_s + 1.0
        return self.seek(self.position_ns + int(min(max(float(seconds), -d), d) * 1e9))

    def play(self) -> None:
        """Play from here; from the end, start over."""
        if self.playing:
            return
        if self._anchor_pos >= self.end_ns:
            self._anchor_pos = self.start_ns
        self._anchor(self._anchor_pos)
        self.playing = True

    def pause(self) -> None:
        self._anchor(self.position_ns)
        self.playing = False

    def toggle(self) -> bool:
        """Play/pause; returns ``playing``."""
        self.pause() if self.playing else self.play()
        return self.playing

    def set_speed(self, x: Any) -> float:
        """Playback speed (×) in [0.25, 16]. Raises ConfigError otherwise."""
        try:
            v = float(x)
        except (TypeError, ValueError):
            v = math.nan
        if not (math.isfinite(v) and SPEED_MIN <= v <= SPEED_MAX):
            raise ConfigError(f"replay speed {x!r} is out of range: allowed "
                              f"[{SPEED_MIN:g}, {SPEED_MAX:g}]×")
        if getattr(self, "playing", False):
            self._anchor(self.position_ns)
        self.speed = v
        return v

    # -- what the dashboard reads ---------------------------------------------------------------
    def last_step(self, t_ns: int | None = None):
        """The last StepRecord ending at or before ``t_ns`` (default: the position), or None."""
        from bisect import bisect_right
        t = self.position_ns if t_ns is None else t_ns
        i = bisect_right(self._step_ends, t)
        return self._steps[i - 1] if i else None

    @property
    def scheduler_config(self) -> SchedulerConfig:
        """The settings in force at the position, from the last step's record."""
        s = self.last_step()
        if s is None:
            return self._base_cfg
        try:
            return self._base_cfg.with_changes(
                mode=s.mode, max_num_batched_tokens=s.max_num_batched_tokens,
                max_num_seqs=s.max_num_seqs,
                long_prefill_token_threshold=s.long_prefill_token_threshold,
                max_num_partial_prefills=s.max_num_partial_prefills)
        except ConfigError:
            return self._base_cfg

    @property
    def gpu_available(self) -> bool:
        return bool(self.trace.gpu_samples)

    @property
    def gpu_status(self) -> str:
        if not self.trace.gpu_samples:
            return "no GPU samples in this trace"
        gpus = self.trace.meta.get("gpus") or {}
        names = ", ".join(sorted(set(map(str, gpus.values())))) if isinstance(gpus, dict) else ""
        return f"recorded: {len(gpus) or 1} GPU" + (f" ({names})" if names else "")

    @property
    def trace_path(self) -> str:
        return self.path

    engine_error = None
    engine_paused = False  # a recording: no engine runs
    knobs_reason = READ_ONLY

    @property
    def status_lines(self) -> list[str]:
        return [x.status for x in self.servers if x.status]

    def set_knob(self, name: str, value: Any) -> Any:
        raise _read_only(name)

    def set_config(self, **changes: Any) -> dict[str, Any]:
        raise _read_only(", ".join(changes) or "settings")

    def pause_engine(self, paused: bool) -> None:
        raise _read_only("engine")

    def export_trace(self) -> str:
        raise _read_only("the trace is already saved")

    def close(self) -> None:
        self.playing = False


# -- facts from the meta record -------------------------------------------------------------------
def _default_slos(tr: Trace) -> dict[str, float]:
    """The recorded SLOs (`gpuchef top` writes them), else `top`'s defaults for the device."""
    rec = tr.meta.get("slos_ms")
    if isinstance(rec, dict) and rec and all(isinstance(v, (int, float)) for v in rec.values()):
        return {str(k): float(v) for k, v in rec.items()}
    dev = str(tr.meta.get("device", ""))
    return {"ttft": 500.0, "tpot": 50.0} if dev.startswith("cuda") else \
        {"ttft": 3000.0, "tpot": 250.0}


def _default_percentiles(tr: Trace) -> tuple[float, ...]:
    rec = tr.meta.get("percentiles")
    if isinstance(rec, list) and rec and all(isinstance(v, (int, float)) and 0 < v < 100
                                             for v in rec):
        return tuple(float(v) for v in rec)
    return DEFAULT_PERCENTILES


def _info(tr: Trace) -> SessionInfo:
    m = tr.meta
    model = m.get("model")
    if isinstance(model, dict):
        name, rnd, dtype = str(model.get("name", "?")), bool(model.get("random_weights")), \
            str(model.get("dtype", ""))
    else:
        name, rnd, dtype = str(model or "?"), False, ""
    bad = f"; {len(tr.problems)} bad line(s) skipped" if tr.problems else ""
    part = "" if tr.complete else "; no end record (cut short, or still being written)"
    ec = m.get("engine_config")
    asy = ec.get("async_scheduling") if isinstance(ec, dict) else None
    return SessionInfo(name, rnd, str(m.get("device", "?")), str(m.get("attention_backend", "?")),
                       dtype, int(m.get("kv_blocks") or 0), int(m.get("block_size") or 16),
                       int(m.get("max_model_len") or 0),
                       f"recorded {tr.meta.get('created', '')[:19]}{bad}{part}",
                       async_scheduling=asy if isinstance(asy, bool) else None,
                       title=replay_title(tr), **_source(tr))


def replay_title(tr: Trace) -> str:
    """"gpuchef replay — bench trace run.jsonl": the trace's file name and the command that
    wrote it (its meta record's ``command``: bench, top, serve, ab …), not `gpuchef top`."""
    cmd = tr.meta.get("command")
    what = f"{cmd} trace" if isinstance(cmd, str) and cmd else "trace"
    path = getattr(tr, "path", None)
    return f"gpuchef replay — {what}" + (f" {Path(str(path)).name}" if path else "")


def _source(tr: Trace) -> dict[str, Any]:
    """An attached trace (`top --attach`): its servers and no per-step records."""
    src = tr.meta.get("source")
    if isinstance(src, dict) and src.get("kind") == "attached" and not tr.steps:
        urls = [str(u) for u in src.get("urls") or []]
        return {"source": ",".join(urls), "per_step_records": False}
    return {}


def _load(tr: Trace) -> tuple[str, str, float]:
    if _source(tr):  # `top --attach`: gpuchef's HTTP load as it described it, or none
        ld = tr.meta.get("load")
        desc = ld.get("desc") if isinstance(ld, dict) else None
        return "none", (f"{desc} (as recorded)" if desc else
                        "none from gpuchef (the server's own clients)"), 0.0
    w = tr.meta.get("workload") or {}
    ds = str(w.get("dataset") or "?")
    if ds == "random":
        rate = w.get("request_rate")
        return "random", ds, float(rate) if isinstance(rate, (int, float)) else math.inf
    speed = w.get("trace_speed")
    return "trace", ds, float(speed) if isinstance(speed, (int, float)) else 1.0


def _base_config(tr: Trace) -> SchedulerConfig:
    sch = ((tr.meta.get("engine_config") or {}).get("scheduler") or {})
    try:
        return SchedulerConfig(**{k: v for k, v in sch.items()
                                  if k in SchedulerConfig.__dataclass_fields__})
    except (ConfigError, TypeError, ValueError):
        return SchedulerConfig()
