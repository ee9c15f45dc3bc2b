"""Cost of the NVML/GPM sampler: µs per tick and CPU % of one core at 10, 20 and 50 Hz.

Run:  python benchmarks/bench_sampler.py [--hz 10,20,50] [--seconds 5] [--fake] [--json OUT]

With a working NVML (the GPU machine) it samples the real GPUs; without one (a CPU machine, or
``--fake``) it runs against ``probes.nvml.fake.FakeNvml`` and says so — then the figures are the
sampler's Python overhead only, not the driver's ioctl time.

Columns:
* ``us/tick`` mean / p99: wall time of one tick over all sampled GPUs (all NVML calls + building
  the samples), measured around ``_tick`` on the sampler thread.
* ``CPU %``: CPU time of the sampler thread (``time.thread_time_ns``) / wall time, % of one core.
* ``GPM ms``: the shortest spacing of two GPM samples (NVML wants > 100 ms).
* ``calls/tick`` (and ``/GPU``): NVML calls made inside ticks (counted by a wrapper around the
  module, PCIe thread excluded) per tick, and per tick and GPU. Each pynvml call is one ctypes
  call, which releases the GIL and must win it back — behind a GIL-bound thread that can take up
  to ``sys.getswitchinterval()`` (5 ms by default; every gpuchef session sets 0.5 ms, as does
  this script unless ``--switch-interval``), so this count bounds the rate the sampler can keep.
* ``busy %`` (IQR): throughput of a GIL-bound Python worker thread with the sampler on, relative
  to the run without it just before (median and inter-quartile range of ``--rounds`` pairs) — a
  proxy for what the in-process engine thread loses. The issue's target is >= 99 % of engine
  throughput at 20 Hz; measure the real engine on the H200 for the record. On a small shared VM
  the IQR is several % wide: read the column only when the IQR is narrow.
PCIe runs on its own thread (1 s period); its measured call time is printed once.

``--fake-release-gil`` makes the stand-in's calls go through a C function via ctypes, as pynvml's
do, so the GIL round trips (and the busy thread's effect on the achieved rate) show on a CPU
machine too; ``--fake-call-us`` adds time inside that C call.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

from gpuchef.engine_host.host import DEFAULT_SWITCH_INTERVAL_S
from gpuchef.probes.nvml import NvmlSampler, NvmlUnavailable, nvml_library, parse_gpus
from gpuchef.probes.nvml.fake import FakeNvml



class CountingNvml:
    """Wraps an NVML module (pynvml or FakeNvml): counts calls to its ``nvml*`` functions."""

    def __init__(self, module):
        self._module = module
        self.n_calls = 0
        self.by_name: dict[str, int] = {}
        self._wrapped: dict[str, object] = {}

    def __getattr__(self, name):
        v = getattr(self._module, name)
        if not (name.startswith("nvml") and callable(v)):
            return v
        w = self._wrapped.get(name)
        if w is None:
            def w(*a, _f=v, _n=name):
                self.n_calls += 1
                self.by_name[_n] = self.by_name.get(_n, 0) + 1
                return _f(*a)
            self._wrapped[name] = w
        return w


class TimedSampler(NvmlSampler):
    """NvmlSampler that keeps the duration of every tick (ns) and the NVML calls made in ticks."""

    def __init__(self, *a, counter: CountingNvml | None = None, **kw):
        super().__init__(*a, nvml=counter, **kw)
        self.tick_ns: list[int] = []
        self.counter = counter
        self.tick_calls = 0

    def _tick(self):
        c = self.counter
        n0 = c.n_calls - c.by_name.get("nvmlDeviceGetPcieThroughput", 0)
        t0 = time.perf_counter_ns()
        out = super()._tick()
        self.tick_ns.append(time.perf_counter_ns() - t0)
        self.tick_calls += c.n_calls - c.by_name.get("nvmlDeviceGetPcieThroughput", 0) - n0
        return out


def busy_worker(stop: threading.Event, out: list[int]) -> None:
    """A GIL-bound loop: counts small units of pure-Python work until stopped."""
    n = 0
    while not stop.is_set():
        x = 0
        for i in range(2000):
            x += i * i
        n += 1
    out.append(n)


def run_busy(seconds: float, sampler: NvmlSampler | None) -> float:
    stop, out = threading.Event(), []
    th = threading.Thread(target=busy_worker, args=(stop, out))
    if sampler is not None:
        sampler.start()
        sampler.wait_ready(5.0)
    t0 = time.perf_counter()
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    dt = time.perf_counter() - t0
    if sampler is not None:
        sampler.stop()
    return out[0] / dt


def tight_loop_us(nvml, n: int = 2000, **opts) -> float:
    """Mean µs of ``sample_once`` back to back (warm caches, no thread wake-ups)."""
    fake = None if nvml is None else FakeNvml(nvml.n_gpus, pcie_window_s=0)
    s = NvmlSampler(nvml=fake, pcie_interval_s=0, **opts)
    s.sample_once()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        s.sample_once()
    dt = time.perf_counter_ns() - t0
    s.stop()
    return dt / n / 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hz", default="10,20,50", help="comma-separated rates (Hz), each in [1, 100]")
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="seconds per rate with the sampler on (and as many off; default 10)")
    ap.add_argument("--rounds", type=int, default=10,
                    help="alternating off/on segments per rate (default 10)")
    ap.add_argument("--fake", action="store_true", help="use the NVML stand-in even with a GPU")
    ap.add_argument("--fake-gpus", type=int, default=1, help="GPUs of the stand-in (default 1)")
    ap.add_argument("--fake-release-gil", action="store_true",
                    help="the stand-in's calls release the GIL through ctypes, as pynvml's do")
    ap.add_argument("--fake-call-us", type=int, default=0,
                    help="µs spent inside each emulated C call (with --fake-release-gil)")
    ap.add_argument("--slow-interval", type=float, default=None,
                    help="sampler's slow_interval_s (temperature, clocks); 0 = every field every "
                         "tick, the behaviour before it existed (default: the sampler's, 1 s)")
    ap.add_argument("--parallel", action="store_true",
                    help="sampler's parallel=True: one worker thread per GPU")
    ap.add_argument("--gpus", default=None,
                    help="GPUs to sample, as `gpuchef --gpus` (e.g. 0 or 0,1; default: all)")
    ap.add_argument("--switch-interval", type=float, default=DEFAULT_SWITCH_INTERVAL_S,
                    help="sys.setswitchinterval for the run, s (default "
                         f"{DEFAULT_SWITCH_INTERVAL_S}: what every gpuchef session sets, see "
                         "engine_host.host; 0.005 is Python's own default)")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    if not 1e-6 <= args.switch_interval <= 1.0:
        ap.error(f"--switch-interval {args.switch_interval}: allowed [1e-06, 1.0] s")
    # how long a thread that released the GIL (every NVML call) waits to get it back from a
    # GIL-bound thread: the engine host shortens it for the same reason (REFERENCE §4b)
    sys.setswitchinterval(args.switch_interval)
    print(f"# sys.setswitchinterval({args.switch_interval})")
    gpus = parse_gpus(args.gpus) if args.gpus else None
    rates = [float(x) for x in args.hz.split(",") if x.strip()]

    nvml = None  # None: real NVML; else a FakeNvml marks "fake" (a fresh one per segment)
    source = "real NVML"
    if not args.fake:
        try:
            nvml_library().device_count()
        except NvmlUnavailable as e:
            source = f"FAKE NVML (real NVML not available: {e})"
            nvml = FakeNvml(args.fake_gpus)
    else:
        source = "FAKE NVML (--fake)"
        nvml = FakeNvml(args.fake_gpus)
    if nvml is not None:
        print(f"# {source}: figures are the sampler's Python overhead only, not driver time")

    def new_fake():
        return FakeNvml(args.fake_gpus, release_gil=args.fake_release_gil,
                        call_us=args.fake_call_us)

    if nvml is not None and args.fake_release_gil:
        print(f"# stand-in calls release the GIL via ctypes ({args.fake_call_us} us inside)")
    real_counter = None
    if nvml is None:
        import pynvml
        real_counter = CountingNvml(pynvml)
    opts = {} if args.slow_interval is None else {"slow_interval_s": args.slow_interval}
    if args.parallel:
        opts["parallel"] = True
    rows = []
    pcie_ms = None
    status = ""
    rounds = max(1, args.rounds)
    seg = args.seconds / rounds
    for hz in rates:
        # off and on segments alternate and each pair is compared: a shared VM drifts by
        # several % over seconds, far more than the effect being measured
        offs, ons, tick_ns = [], [], []
        ticks = run_ns = cpu_ns = periods = tick_calls = span_ns = 0
        gpm_ms = None
        for _ in range(rounds):
            fake = new_fake() if nvml is not None else None
            counter = real_counter if fake is None else CountingNvml(fake)
            s = TimedSampler(gpus=gpus, sample_hz=hz, counter=counter, **opts)
            offs.append(run_busy(seg, None))
            ons.append(run_busy(seg, s))
            status = s.status
            tick_ns += s.tick_ns[1:]
            # n ticks span n - 1 periods, first tick to last (as PeriodicSampler.achieved_hz)
            ticks, run_ns, cpu_ns = ticks + s.ticks, run_ns + s.run_ns, cpu_ns + s.cpu_ns_total
            periods += max(0, s.ticks - 1)
            span_ns += max(0, s.last_tick_ns - s.first_tick_ns)
            tick_calls += s.tick_calls
            n_gpus = len(s.gpu_names) or 1
            if fake is not None and fake.gpm_intervals_ns.get(0):
                m = min(fake.gpm_intervals_ns[0]) / 1e6
                gpm_ms = m if gpm_ms is None else min(gpm_ms, m)
            pcie_ms = s.pcie_query_ms if s.pcie_query_ms is not None else pcie_ms
        t_us = np.array(tick_ns, dtype=np.float64) / 1e3
        ratios = 100.0 * np.array(ons) / np.array(offs)  # each "on" against the "off" before it
        rows.append({
            "hz": hz, "gpus": n_gpus, "ticks": ticks,
            "achieved_hz": periods / (span_ns / 1e9) if span_ns else float("nan"),
            "us_per_tick_mean": float(t_us.mean()) if t_us.size else float("nan"),
            "us_per_tick_p99": float(np.percentile(t_us, 99)) if t_us.size else float("nan"),
            "cpu_pct_one_core": 100.0 * cpu_ns / run_ns if run_ns else float("nan"),
            "nvml_calls_per_tick": tick_calls / ticks if ticks else float("nan"),
            "nvml_calls_per_tick_gpu": tick_calls / ticks / n_gpus if ticks else float("nan"),
            "gpm_min_interval_ms": gpm_ms,
            "busy_thread_pct": float(np.median(ratios)),
            "busy_thread_pct_iqr": [float(np.percentile(ratios, 25)),
                                    float(np.percentile(ratios, 75))],
        })

    print(f"# {status}")
    hdr = f"{'Hz':>5} {'GPUs':>4} {'ticks':>6} {'got Hz':>7} {'us/tick':>8} {'p99 us':>8} " \
          f"{'CPU %':>6} {'GPM ms':>7} {'busy %':>7} {'(IQR)':>13} {'calls/tick':>10} {'/GPU':>5}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        gpm = f"{r['gpm_min_interval_ms']:7.1f}" if r["gpm_min_interval_ms"] else f"{'-':>7}"
        print(f"{r['hz']:5.0f} {r['gpus']:4d} {r['ticks']:6d} {r['achieved_hz']:7.2f} "
              f"{r['us_per_tick_mean']:8.1f} {r['us_per_tick_p99']:8.1f} "
              f"{r['cpu_pct_one_core']:6.2f} {gpm} {r['busy_thread_pct']:7.1f} "
              f"({r['busy_thread_pct_iqr'][0]:5.1f}-{r['busy_thread_pct_iqr'][1]:5.1f}) "
              f"{r['nvml_calls_per_tick']:10.2f} {r['nvml_calls_per_tick_gpu']:5.2f}")
    warm = tight_loop_us(nvml, **opts)
    print(f"# warm tick in a tight loop (sample_once x 2000, GPM windows mostly skipped): "
          f"{warm:.1f} us")
    if pcie_ms is not None:
        print(f"# PCIe TX+RX query (own thread, every 1 s): {pcie_ms:.1f} ms per GPU")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"source": source, "status": status, "pcie_query_ms": pcie_ms,
                       "switch_interval_s": args.switch_interval,
                       "warm_tick_us": warm,
                       "python": sys.version.split()[0], "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
