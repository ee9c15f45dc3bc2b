"""What the dashboard needs from a live session: the contract between the TUI and its host.

The TUI imports engine_host and probes, never ``gpuchef`` itself: ``gpuchef/sessions/live.py``
builds the real session (engine + EngineHost + live load + samplers + timeline + trace) and tests
build a static one. Everything here is read from the UI thread and must not block: commands are queue
puts, reads are attributes or lock-free timeline snapshots. The one slow call, ``export_trace``,
is run by the app in a worker thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from gpuchef.engine_host.vocab.errors import ConfigError
from gpuchef.engine_host.vocab.config import SchedulerConfig
from gpuchef.probes.scrape import ScrapeDelta, ScrapeSample
from gpuchef.probes.timeline import Timeline

#: Highest rate a live control accepts: req/s for random arrivals, × for a trace.
MAX_RATE = 10_000.0
#: The refusal of every steering key on a replayed trace (``gpuchef replay``).
READ_ONLY = "replay is read-only: a saved trace cannot be steered"


def fmt_t(seconds: float) -> str:
    """Seconds → "mm:ss.s" (or "h:mm:ss.s" past an hour): replay's positions."""
    s = max(0.0, seconds)
    h, r = divmod(s, 3600)
    m, sec = divmod(r, 60)
    if h >= 1:
        return f"{int(h)}:{int(m):02d}:{sec:04.1f}"
    return f"{int(m):02d}:{sec:04.1f}"


def parse_time(text: str) -> float:
    """"83", "83.5", "1:23", "1:23.5" or "0:01:23" → seconds (replay's go-to). Raises
    ConfigError naming the text."""
    s = str(text).strip().rstrip("s").strip()
    try:
        parts = [float(p) for p in s.split(":")]
    except ValueError:
        raise ConfigError(f"time {text!r} is not seconds or mm:ss(.s)") from None
    if not parts or len(parts) > 3 or any(not math.isfinite(p) or p < 0 for p in parts):
        raise ConfigError(f"time {text!r} is not seconds or mm:ss(.s)")
    v = 0.0
    for p in parts:
        v = v * 60 + p
    return v


def parse_rate(value: Any, unit: str) -> float:
    """A live load rate from a control or the palette: req/s (``unit`` "req/s") or a trace's
    speed (×; "2", "2x", "×2"), in (0, MAX_RATE]. Raises ConfigError naming the value. Shared by
    the load (gpuchef.sessions.live_load) and the controls' validator, so the red mark and the refusal agree."""
    what = "request rate (req/s)" if unit == "req/s" else "trace speed (×)"
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a number in (0, {MAX_RATE:g}], got {value!r}")
    try:
        v = float(str(value).strip().lstrip("x×").rstrip("x×")) if isinstance(value, str) \
            else float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number in (0, {MAX_RATE:g}], got {value!r}") from None
    if not (math.isfinite(v) and 0 < v <= MAX_RATE):
        raise ConfigError(f"{what} {value!r} is out of range: allowed (0, {MAX_RATE:g}]")
    return v


@dataclass(frozen=True)
class SessionInfo:
    """Facts fixed at start-up, shown in the header.

    ``model``: preset or folder name; ``random_weights``: weights were not loaded from a file.
    ``device``: "cpu" / "cuda:0"; ``attention``: the attention backend's name. ``kv_blocks`` and
    ``block_size``: KV cache size (blocks of ``block_size`` tokens). ``note``: a short line about
    defaults chosen for this machine (e.g. the CPU load), or "".
    ``engine``: the engine's name as the header shows it, e.g. "vLLM 0.24.0" ("" = gpuchef's
    native engine, not named). ``tensor_parallel_size``: GPUs the engine shards the model over.
    ``gpus``: the GPUs the engine runs on (NVML indices where known, e.g. ("0", "1")); empty on a
    CPU, or when the session did not say (the header then shows ``device``).
    ``source``: "hosted" (gpuchef runs the engine) or the attached servers' URLs, comma-joined.
    ``per_step_records``: the timeline gets a StepRecord per engine step (False for a server
    gpuchef does not host: its picture comes from /metrics scrapes, see ``AttachedSession``).
    ``async_scheduling``: the engine schedules step N+1 while N runs (None = not known).
    ``serving``: `top --serve`: the URL the HTTP front door listens on ("" = none); the header
    says "serving URL" while that process lives (HeaderState.server_error once it is gone).
    ``title``: what the header's first cell names the session (`gpuchef replay` names the trace
    and the command that wrote it).
    """

    model: str
    random_weights: bool
    device: str
    attention: str
    dtype: str = ""
    kv_blocks: int = 0
    block_size: int = 16
    max_model_len: int = 0
    note: str = ""
    engine: str = ""
    tensor_parallel_size: int = 1
    gpus: tuple[str, ...] = ()
    source: str = "hosted"
    per_step_records: bool = True
    async_scheduling: bool | None = None
    serving: str = ""
    title: str = "gpuchef top"


@dataclass(frozen=True)
class LoadState:
    """The live load as the header and the rate control show it.

    ``kind``: "random" (``rate`` in req/s), "trace" (``rate`` is the replay speed, ×) or
    "none" (no load of gpuchef's: ``name`` says what drives the server).
    ``name``: dataset name. ``mean_rate``: the trace's mean req/s at speed 1 over the whole
    trace (0 for random): not what arrives now (the Azure trace's first minutes arrive at a
    third of its hour's mean; tui/arrivals.py measures that).
    ``paused``: no new arrivals. ``submitted``: requests sent so far. ``done``: the stream ended
    (a bounded ``--num-prompts``/``--duration`` load). ``loop``: a trace restarts at its end.
    ``phase``: a phased workload's current phase ("" otherwise).
    The header's load line and the controls' load switch both read :attr:`status`.
    """

    kind: str
    name: str
    rate: float
    mean_rate: float = 0.0
    paused: bool = False
    submitted: int = field(default=0, compare=False)  # not shown: no redraw when it moves
    done: bool = False
    loop: bool = False
    phase: str = ""

    @property
    def rate_unit(self) -> str:
        return "req/s" if self.kind == "random" else "×"

    @property
    def trace_mean(self) -> float:
        """The trace's mean req/s at the current speed (0 for random arrivals or unknown)."""
        return self.rate * self.mean_rate if self.kind == "trace" else 0.0

    @property
    def status(self) -> str:
        """"PAUSED", "done" (a bounded load that ended) or "on": the one reading of whether new
        arrivals flow, for every place that shows it."""
        return "PAUSED" if self.paused else "done" if self.done else "on"

    def describe(self) -> str:
        """e.g. "azure-conv ×0.50, loop — PAUSED" or "random 4 req/s" (the trace's mean rate is
        :attr:`trace_mean`, shown beside it with its label)."""
        if self.kind == "none":
            return self.name
        if self.kind == "random":
            s = f"random {self.rate:g} req/s"
        else:
            s = f"{self.name} ×{self.rate:.2f}"
            if self.phase:
                s += f", phase {self.phase}"
            if self.loop:
                s += ", loop"
        if self.status != "on":
            s += f" — {self.status}"
        return s


@dataclass(frozen=True)
class ABState:
    """A/B run as its controller sees it. ``settings``: {"A": {...}, "B": {...}} (mode and knob
    changes; what is not named stays as it was). ``window_s``: length of one window (s).
    ``rounds``: windows per setting to run (None = until stopped). ``current``: "A"/"B"/"" and
    ``index`` its 1-based window number; ``window_t0_ns``: when the current window began.
    ``run``: increments with every A/B started (marks carry it). ``load``: "" for the hosted
    engine's interleaved windows; "mirrored" or "sequential" for two attached servers, whose
    windows are whole loads (``rounds`` repetitions, ``index`` the one running; ``current``
    "AB" while a mirrored repetition runs on both); ``servers``: label → URL; ``status``: ""
    or one line on how the last run ended (a server not answering, stopped)."""

    active: bool = False
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    window_s: float = 0.0
    rounds: int | None = None
    current: str = ""
    index: int = 0
    window_t0_ns: int = 0
    run: int = 0
    settle_s: float = 0.0
    load: str = ""
    servers: dict[str, str] = field(default_factory=dict)
    status: str = ""


class LoadControl(Protocol):
    """The live load's controls. ``REASON``: "" when ``set_rate``/``pause``/``resume`` act;
    else one line saying why the load's rate and pause are fixed (an attached server's own
    clients, arrivals fixed at start, a replay): those calls raise ConfigError with it, and the
    palette previews that refusal (``GpuchefApp.check_rate``)."""

    REASON: str

    def state(self) -> LoadState: ...
    def set_rate(self, value: Any) -> float: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


class ABControl(Protocol):
    def state(self) -> ABState: ...
    def start(self, a: dict[str, Any], b: dict[str, Any], window_s: float,
              rounds: int | None = None) -> ABState: ...
    def stop(self) -> None: ...


class Session(Protocol):
    """A running session as the dashboard drives it (see ``gpuchef/sessions/live.py``).

    ``set_knob``/``set_config`` validate in the caller's thread (ConfigError naming the value and
    the allowed range; nothing changes) and take effect before the engine's next step.
    ``export_trace()`` blocks (file I/O): returns a one-line message, raises ConfigError.

    Every session has every member below; what differs between sessions is a value (``""``,
    ``False``, a ConfigError saying why), never a member that may be missing, so the app reads
    them without probing.
    """

    info: SessionInfo
    timeline: Timeline
    clock: Callable[[], int]
    load: LoadControl
    ab: ABControl
    slos: dict[str, float]
    percentiles: tuple[float, ...]
    stats_window_s: float
    start_ns: int

    @property
    def scheduler_config(self) -> SchedulerConfig: ...
    @property
    def gpu_status(self) -> str: ...
    @property
    def gpu_available(self) -> bool: ...
    @property
    def trace_path(self) -> str | None: ...
    @property
    def engine_error(self) -> str | None: ...
    @property
    def engine_paused(self) -> bool:
        """The engine is paused between steps (``P``; queued requests wait). False where the
        session has no engine of gpuchef's to pause (attached servers, a replay)."""
    @property
    def knobs_reason(self) -> str:
        """"" when ``set_knob``/``set_config`` reach the engine; else one line saying why the
        knobs are read-only (an attached server without gpuchef's knob endpoint, a replay's
        ``READ_ONLY``): ``set_knob`` then raises ConfigError saying so, and the palette
        previews that refusal (``GpuchefApp.check_knob``)."""

    def set_knob(self, name: str, value: Any) -> Any: ...
    def set_config(self, **changes: Any) -> dict[str, Any]: ...

    def pause_engine(self, paused: bool) -> None:
        """Pause (True) or resume (False) the engine between steps. Raises ConfigError saying
        why where there is no engine of gpuchef's to pause (``engine_paused`` stays False)."""

    def export_trace(self) -> str: ...
    def close(self) -> None: ...


class ScrapedServer(Protocol):
    """One attached server as the dashboard reads it (``gpuchef/sessions/attach.py``). ``url``: its base
    URL; ``kind``: "vllm" / "sglang" / "gpuchef" / "unknown" (from the names in its /metrics);
    ``hz``: scrapes per second; ``status``: "" or one line saying why the last scrape failed.
    ``samples()``: scrapes so far (oldest first, failed ones included, the last ~10 min);
    ``deltas()``: the intervals of its good scrapes (``probes.scrape.deltas_of``: one in which
    no step ended while requests ran is merged into the next). Both return snapshots: safe to
    read from the UI thread."""

    url: str
    hz: float

    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...

    def samples(self) -> Sequence[ScrapeSample]: ...
    def deltas(self) -> Sequence[ScrapeDelta]: ...


class PluginSource(Protocol):
    """gpuchef's vLLM plugin in attached servers as the attach screen reads it
    (``gpuchef/sessions/attach_plugin.py``: live, or a trace's records at the replay position).
    ``endpoints``: server base URL → the plugin endpoint read for it (``tcp://HOST:PORT``);
    servers without one are absent. ``keys()``: the (endpoint, engine_idx) streams that sent a
    record, by server then engine. ``since(key, n)``: the stream's rows
    (``probes.plugin_steps.Iteration``, time ordered) numbered ``n`` and up, and the number
    after the last (the screen asks again from there). ``counts(key)``: the stream's
    ``probes.plugin_steps.StreamCounts``. ``status(server)``: "" when that server's plugin sent
    records, else one line saying why there are none (no endpoint given, none arrived yet).
    All safe to call from the UI thread."""

    endpoints: dict[str, str]

    def keys(self) -> Sequence[tuple[str, int]]: ...
    def since(self, key: tuple[str, int], n: int) -> tuple[Sequence[Any], int]: ...
    def counts(self, key: tuple[str, int]) -> Any: ...
    def status(self, server: str) -> str: ...


class AttachedSession(Session, Protocol):
    """A session on servers gpuchef does not host (``info.per_step_records`` is False): the
    timeline holds the client's requests (when gpuchef sends the load), GPU samples (``--gpus``)
    and events, never steps. ``servers``: the attached servers, in ``--attach`` order (the first
    is the one whose knobs ``set_knob`` reaches). ``knobs_reason`` (see ``Session``): "" when
    ``set_knob`` reaches the first server's knob endpoint. ``scheduler_config`` is what the
    server said (meaningless while read-only). ``plugin``: the servers' vLLM plugin records
    (:class:`PluginSource`; its ``endpoints`` are empty when no ``--plugin`` was given)."""

    servers: tuple[ScrapedServer, ...]
    plugin: PluginSource

    @property
    def status_lines(self) -> Sequence[str]:
        """One line per thing that is wrong now (a scrape failing, the load stopped, how the
        last A/B ended); empty when all is well. The attach screen's header lists them."""


class ReplayControl(AttachedSession, Protocol):
    """A saved trace played back as a session (``gpuchef/sessions/replay.py``'s ReplaySession): the
    timeline holds what was recorded up to ``position_ns``; every steering call raises
    ConfigError (``READ_ONLY``). A trace of `top --attach` plays on the attach screen, so a
    replay is also an ``AttachedSession``: ``servers`` holds its recorded servers (empty for a
    trace of a hosted engine). ``path``: the trace; ``start_ns``/``end_ns``: its span
    (monotonic ns of the recording); ``playing``, ``speed`` (× real time). ``seek``/``seek_s``/
    ``step`` move the position (ns; seconds from the start; seconds relative) and return the
    new ``position_ns``; ``toggle`` plays or pauses and returns ``playing``; ``set_speed``
    validates (ConfigError) and returns the speed; ``last_step(t_ns)``: the last StepRecord
    ending by ``t_ns`` (default: the position), or None."""

    path: Any
    end_ns: int
    playing: bool
    speed: float

    @property
    def duration_s(self) -> float: ...
    @property
    def position_ns(self) -> int: ...
    @property
    def position_s(self) -> float: ...

    def seek(self, t_ns: int) -> int: ...
    def seek_s(self, seconds: float) -> int: ...
    def step(self, seconds: float) -> int: ...
    def toggle(self) -> bool: ...
    def set_speed(self, x: Any) -> float: ...
    def last_step(self, t_ns: int | None = None) -> Any: ...
