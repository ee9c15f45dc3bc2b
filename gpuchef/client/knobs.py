"""gpuchef's knob endpoint as a client sees it (``GET``/``PATCH /gpuchef/v1/scheduler``, served
by `gpuchef serve`): the one owner of reading a server's knob state and changing it, for `top
--attach` (``sessions.attach.AttachedServer``) and the A/B over HTTP (``experiments.http``)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from ..engine_host.vocab.config import AUTO_BUDGET, KNOBS, SchedulerConfig
from ..engine_host.vocab.errors import ConfigError

KNOB_PATH = "/gpuchef/v1/scheduler"
KNOB_TIMEOUT_S = 2.0


def http_json(method: str, url: str, body: dict | None, api_key: str | None,
               timeout: float) -> tuple[int, Any]:
    """One JSON request; returns (status, parsed body or None). Raises OSError / URLError when
    nothing answers."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json",
                                          "Accept": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read(1 << 20)
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(1 << 20), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def config_from(state: Any) -> SchedulerConfig:
    """The SchedulerConfig a knob endpoint's state dict describes. Raises ConfigError / TypeError
    for one that is not gpuchef's."""
    if not isinstance(state, dict) or "mode" not in state:
        raise ConfigError("not gpuchef's knob endpoint (no 'mode' in its answer)")
    kw = {k: state[k] for k in KNOBS if k in state}
    if isinstance(state.get(AUTO_BUDGET), str):
        kw[AUTO_BUDGET] = state[AUTO_BUDGET]
    return SchedulerConfig(mode=state["mode"], **kw)


class KnobEndpoint:
    """The knob endpoint of the server at ``url`` (its base URL); ``api_key``: Bearer token.
    ``knobs``: the state last read (None: the server has no such endpoint, or it was not read
    yet), ``reason``: "" when the knobs are live, else why not; ``unreached``: the endpoint did
    not answer (nothing listened) — ask again once the server answers; ``read_at``: when it
    was last read (monotonic s)."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key
        self.knobs: SchedulerConfig | None = None
        self.reason = "knob endpoint not asked yet"
        self.unreached = False
        self.read_at = 0.0

    def read(self) -> SchedulerConfig | None:
        """GET the knob endpoint: sets ``knobs`` (None when the server has none) and
        ``reason`` ("" when live, else why not). Never raises."""
        self.read_at = time.monotonic()
        url = self.url + KNOB_PATH
        try:
            status, body = http_json("GET", url, None, self.api_key, KNOB_TIMEOUT_S)
        except (OSError, urllib.error.URLError) as e:
            if self.knobs is None:
                self.unreached = True
                self.reason = (f"cannot reach {url} ({getattr(e, 'reason', e)}); asked "
                               "again when a scrape succeeds")
            return self.knobs
        self.unreached = False
        if status != 200:
            self.knobs = None
            self.reason = (f"{self.url} has no gpuchef knob endpoint (GET {KNOB_PATH}: "
                           f"HTTP {status}); vLLM and SGLang take these knobs at start-up "
                           "(--max-num-batched-tokens, ...)")
            return None
        try:
            self.knobs = config_from(body)
            self.reason = ""
        except (ConfigError, TypeError) as e:
            self.knobs = None
            self.reason = f"{url}: {e}"
        return self.knobs

    def patch(self, changes: dict[str, Any]) -> dict[str, Any]:
        """PATCH the knob endpoint with ``changes``; returns what the server accepted. Raises
        ConfigError with the server's message (a refused value) or naming what failed."""
        url = self.url + KNOB_PATH
        try:
            status, body = http_json("PATCH", url, changes, self.api_key, KNOB_TIMEOUT_S)
        except (OSError, urllib.error.URLError) as e:
            raise ConfigError(f"knob change not sent: cannot reach {url} "
                              f"({getattr(e, 'reason', e)})") from None
        if status != 200 or not isinstance(body, dict):
            msg = ""
            if isinstance(body, dict):
                err = body.get("error")
                msg = err.get("message", "") if isinstance(err, dict) else str(err or "")
            raise ConfigError(msg or f"{url} refused the change (HTTP {status})")
        try:
            self.knobs = config_from(body.get("scheduler"))
        except (ConfigError, TypeError):
            self.read()
        return dict(body.get("accepted") or {})
