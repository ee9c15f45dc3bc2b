"""Host probe (psutil): this process's CPU and RSS, and system CPU, sampled by a daemon thread.

Also home of :class:`PeriodicSampler`, the deadline-scheduled sampling thread that the NVML
sampler (``probes/nvml/sampler.py``) builds on, so that both probes start, stop and report cost
alike.

Usage::

    with HostSampler(sample_hz=2, on_sample=timeline.add_host_sample) as host:
        ...                      # host.samples (bounded deque), host.latest, host.status

Process CPU % is of ONE core (psutil's convention, as in ``top``): a process that keeps two cores
busy reads 200 %. System CPU % is of ALL cores (0–100). Linux accounts CPU time in clock ticks
(10 ms at the usual USER_HZ = 100), so a window of 1/50 s can only read 0, 50 or 100 % of a core;
that is why the host probe defaults to 2 Hz while the GPU probe runs at 10 Hz or more.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpuchef.engine_host.vocab.errors import ConfigError


def check_sample_hz(value: Any, lo: float, hi: float, flag: str = "--sample-hz") -> float:
    """Validate a sampling rate in Hz; returns it as float.

    Raises ConfigError naming the value and the allowed range ``[lo, hi]``.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{flag} must be a number in [{lo:g}, {hi:g}] Hz, got {value!r}")
    try:
        hz = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} must be a number in [{lo:g}, {hi:g}] Hz, got {value!r}") from None
    if not lo <= hz <= hi:  # also refuses NaN
        raise ConfigError(f"{flag} {value!r} is out of range: allowed [{lo:g}, {hi:g}] Hz")
    return hz


class PeriodicSampler:
    """A daemon thread that calls :meth:`_tick` every ``1/sample_hz`` s and keeps what it returns.

    Ticks are scheduled on absolute deadlines (``t0 + k/sample_hz``), so the rate does not drift
    with the cost of a tick; a tick that overruns its slot is not made up for (no bursts after a
    stall). Waiting is on an Event, so :meth:`stop` returns within one tick.

    Subclasses implement ``_setup()`` (runs in the thread; may set ``self.status``), ``_tick()``
    (returns an iterable of samples) and ``_teardown()``; returning ``False`` from ``_setup`` or
    raising ``StopIteration`` from ``_tick`` ends the thread quietly. An exception escaping either
    is caught: the thread ends and ``status`` says why (the process goes on).

    Attributes: ``samples`` (deque, newest last, bounded by ``maxlen``), ``status`` (one line),
    ``ticks`` (count), ``first_tick_ns`` / ``last_tick_ns`` (monotonic ns at which the first and
    the latest tick began; :attr:`achieved_hz` is the rate kept between them), ``tick_ns_total``
    (wall ns spent inside ticks), ``cpu_ns_total`` (CPU ns of
    the sampling thread, from ``time.thread_time_ns``; with the wall time it gives the probe's CPU %
    of one core).
    """

    thread_name = "gpuchef-sampler"

    def __init__(self, sample_hz: float, *, maxlen: int = 4096,
                 on_sample: Callable[[Any], None] | None = None,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        if maxlen < 1:
            raise ConfigError(f"maxlen {maxlen} must be >= 1")
        self.sample_hz = float(sample_hz)
        self.clock = clock
        self.on_sample = on_sample
        self.samples: deque = deque(maxlen=maxlen)
        self.status = "starting"
        self.ticks = 0
        self.first_tick_ns = 0  # monotonic ns at which the first / latest tick began
        self.last_tick_ns = 0
        self.tick_ns_total = 0
        self.cpu_ns_total = 0
        self.run_ns = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        self._torn_down = False

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> "PeriodicSampler":
        """Start the thread (idempotent; a stopped sampler cannot be restarted). Returns self."""
        with self._lifecycle:
            if self._thread is not None:
                return self
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Ask the thread to end and wait up to ``timeout`` s for it (and its teardown).

        Also tears down a sampler that was only driven by ``sample_once`` (no thread)."""
        self._stop.set()
        self.join(timeout)
        if self._thread is None:
            self._teardown_once()

    def _teardown_once(self) -> None:
        with self._lifecycle:
            if self._torn_down:
                return
            self._torn_down = True
        try:
            self._teardown()
        except Exception:
            pass

    def join(self, timeout: float | None = None) -> None:
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until set-up has finished (status is then final for start-up). True if it has."""
        return self._ready.wait(timeout)

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- cost ------------------------------------------------------------------------------
    @property
    def mean_tick_us(self) -> float:
        """Mean wall time of one tick in µs (NaN before the first tick)."""
        return self.tick_ns_total / self.ticks / 1e3 if self.ticks else float("nan")

    @property
    def achieved_hz(self) -> float:
        """Ticks per second kept, from the first tick to the latest (set-up, teardown and the
        wait before ``stop`` excluded); NaN before two ticks. Below ``sample_hz`` when ticks
        overran their period (the missed slots are skipped)."""
        span = self.last_tick_ns - self.first_tick_ns
        return (self.ticks - 1) / (span / 1e9) if self.ticks > 1 and span > 0 else float("nan")

    @property
    def cpu_percent(self) -> float:
        """CPU time of the sampling thread as % of one core over its run (NaN before it ran)."""
        return 100.0 * self.cpu_ns_total / self.run_ns if self.run_ns else float("nan")

    # ---- to override -----------------------------------------------------------------------
    def _setup(self) -> bool:
        return True

    def _tick(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _teardown(self) -> None:
        pass

    # ---- the loop --------------------------------------------------------------------------
    def _emit(self, sample: Any) -> None:
        self.samples.append(sample)
        cb = self.on_sample
        if cb is not None:
            try:
                cb(sample)
            except Exception as e:  # a consumer's bug must not kill the probe
                self.status = f"{self.status} (on_sample failed: {type(e).__name__}: {e})"
                self.on_sample = None

    def _run(self) -> None:
        run0 = time.monotonic_ns()
        cpu0 = time.thread_time_ns()
        try:
            try:
                ok = self._setup()
            finally:
                self._ready.set()
            if ok is False:
                return
            period_ns = int(1e9 / self.sample_hz)
            next_ns = time.monotonic_ns()
            while not self._stop.is_set():
                t0 = time.monotonic_ns()
                try:
                    out = self._tick()
                except StopIteration:
                    break
                for s in out or ():
                    self._emit(s)
                t1 = time.monotonic_ns()
                if not self.ticks:
                    self.first_tick_ns = t0
                self.last_tick_ns = t0
                self.ticks += 1
                self.tick_ns_total += t1 - t0
                self.cpu_ns_total = time.thread_time_ns() - cpu0
                self.run_ns = t1 - run0
                next_ns += period_ns
                if next_ns <= t1:  # overran: skip the missed slots rather than burst
                    next_ns = t1 + period_ns - (t1 - next_ns) % period_ns
                if self._stop.wait((next_ns - t1) / 1e9):
                    break
        except Exception as e:
            self.status = f"{type(self).__name__} failed: {type(e).__name__}: {e} — sampling stopped"
        finally:
            self._teardown_once()
            self.cpu_ns_total = time.thread_time_ns() - cpu0
            self.run_ns = time.monotonic_ns() - run0


@dataclass(frozen=True, slots=True)
class HostSample:
    """One host reading.

    ``t_ns``: ``time.monotonic_ns()`` when taken. ``process_cpu_pct``: this process's CPU time
    over the last interval, % of ONE core (may exceed 100). ``rss_bytes``: resident set size (bytes).
    ``system_cpu_pct``: all cores busy (user+system+nice+irq+…, i.e. not idle/iowait), % of all
    cores (0–100). ``num_threads``: threads in this process. ``cpu_count``: logical CPUs.
    CPU figures are None on the first sample (no interval yet).
    """

    t_ns: int
    process_cpu_pct: float | None
    rss_bytes: int
    system_cpu_pct: float | None
    num_threads: int = 0
    cpu_count: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class HostSampler(PeriodicSampler):
    """psutil sampler of this process (CPU % of one core, RSS) and the system (CPU %).

    ``sample_hz`` in [0.1, 50] (default 2: see the module docstring for why not faster); ConfigError
    otherwise. ``pid`` None = this process. ``psutil_module`` injects a stand-in for tests.
    Process CPU comes from ``Process.cpu_times()`` deltas against wall time; system CPU from
    ``psutil.cpu_times()`` deltas computed here (not ``psutil.cpu_percent``, whose module-global
    state would be shared with any other caller in the process).
    """

    thread_name = "gpuchef-host"

    def __init__(self, sample_hz: float = 2.0, *, pid: int | None = None, maxlen: int = 4096,
                 on_sample: Callable[[HostSample], None] | None = None,
                 clock: Callable[[], int] = time.monotonic_ns, psutil_module: Any = None) -> None:
        super().__init__(check_sample_hz(sample_hz, 0.1, 50.0, "--host-sample-hz"), maxlen=maxlen,
                         on_sample=on_sample, clock=clock)
        self._pid = pid
        self._psutil = psutil_module
        self._proc = None
        self._prev: tuple[int, float, float, float] | None = None  # (t_ns, proc cpu s, sys busy s, sys total s)
        self._ncpu = 0

    @property
    def latest(self) -> HostSample | None:
        try:
            return self.samples[-1]
        except IndexError:
            return None

    def _setup(self) -> bool:
        ps = self._psutil
        if ps is None:
            try:
                import psutil as ps
            except ImportError:
                self.status = "host probe off: psutil is not installed"
                return False
            self._psutil = ps
        try:
            self._proc = ps.Process(self._pid)
            self._ncpu = ps.cpu_count() or 1
        except Exception as e:
            self.status = f"host probe off: {type(e).__name__}: {e}"
            return False
        self.status = f"host: pid {self._proc.pid}, {self._ncpu} CPUs"
        return True

    @staticmethod
    def _sys_times(ct: Any) -> tuple[float, float]:
        # guest time is already counted in user/nice on Linux (as psutil's cpu_percent does)
        total = sum(ct) - getattr(ct, "guest", 0.0) - getattr(ct, "guest_nice", 0.0)
        idle = ct.idle + getattr(ct, "iowait", 0.0)
        return total - idle, total

    def sample_once(self) -> HostSample:
        """Take one reading now (sets the probe up on first use). Not to be mixed with the thread."""
        if self._proc is None and not self._setup():
            raise RuntimeError(self.status)
        p = self._proc
        with p.oneshot():
            pt = p.cpu_times()
            rss = p.memory_info().rss
            nthreads = p.num_threads()
        t = self.clock()
        busy, total = self._sys_times(self._psutil.cpu_times())
        proc_s = pt.user + pt.system
        pcpu = scpu = None
        if self._prev is not None:
            t_prev, proc_prev, busy_prev, total_prev = self._prev
            dt = (t - t_prev) / 1e9
            if dt > 0:
                pcpu = max(0.0, 100.0 * (proc_s - proc_prev) / dt)
            dtot = total - total_prev
            if dtot > 0:
                scpu = min(100.0, max(0.0, 100.0 * (busy - busy_prev) / dtot))
        self._prev = (t, proc_s, busy, total)
        return HostSample(t, pcpu, int(rss), scpu, int(nthreads), self._ncpu)

    def _tick(self):
        try:
            return (self.sample_once(),)
        except Exception as e:  # process gone or /proc unreadable: say so and stop
            self.status = f"host probe stopped: {type(e).__name__}: {e}"
            raise StopIteration from None
