"""A fleet's past, read from the Prometheus server that scraped it, as an attached session's
trace (`gpuchef report --prometheus URL`): the same scrape records `top --attach` (or
`top --prometheus`) writes, so the report, replay and every figure read it as they read those.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from ..engine_host.vocab.errors import ConfigError
from ..probes.prometheus import PrometheusFleet
from ..probes.recorder import TraceRecorder

#: server kinds a column must have for it to be kept (``ScrapeSample.server``)
SERVER_KINDS = ("vllm", "sglang", "gpuchef")
#: Prometheus refuses a range query of more points than this per series
MAX_POINTS = 11_000


def record_history(url: str, since_s: float, step_s: float, path: str | Path, *,
                   until_s: float | None = None) -> list[str]:
    """Write the trace of the fleet the Prometheus server at ``url`` scraped over the last
    ``since_s`` seconds (up to ``until_s``, Unix s; now by default), one scrape record per
    ``step_s`` per column (``PrometheusFleet.history``), to ``path``. Returns the columns (the
    servers' base URLs). Raises ConfigError, one line: a bad URL, Prometheus not reachable or
    not its API, a range of more than ``MAX_POINTS`` steps, or no vLLM/SGLang/gpuchef series in
    the range."""
    if since_s / step_s > MAX_POINTS:
        raise ConfigError(f"--since {since_s:g} s every --step {step_s:g} s is "
                          f"{since_s / step_s:.0f} points a series: Prometheus allows "
                          f"{MAX_POINTS}; give a larger --step")
    end = time.time() if until_s is None else until_s
    try:
        fleet = PrometheusFleet(url)
        fleet.targets()  # the scrape URLs' schemes name the columns
        cols = fleet.history(end - since_s, end, step_s)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    except ConnectionError as e:
        raise ConfigError(f"--prometheus: {e}") from None
    served = {k: xs for k, xs in cols.items() if any(x.server in SERVER_KINDS for x in xs)}
    if not served:
        raise ConfigError(f"--prometheus {url}: no vLLM, SGLang or gpuchef series in the last "
                          f"{since_s:g} s")
    keys = sorted(served)
    meta = {"command": "report --prometheus",
            "model": {"name": "(the servers' models)", "random_weights": None,
                      "source": keys[0]},
            "device": "remote",
            "source": {"kind": "attached", "urls": keys, "prometheus": fleet.url,
                       "range_s": [end - since_s, end], "step_s": step_s},
            "scrape_hz": 1.0 / step_s}
    rec = TraceRecorder(path, meta=meta)
    # Prometheus's times are Unix ns: onto the trace's monotonic clock through its origin
    off = rec.clock["monotonic_ns"] - rec.clock["time_ns"]
    for _, k, x in sorted(((x.t_ns, k, x) for k, xs in served.items() for x in xs),
                          key=lambda r: (r[0], r[1])):
        rec.record(replace(x, t_ns=x.t_ns + off))
    rec.close()
    return keys
