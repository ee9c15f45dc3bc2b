"""Where and how the HTTP load is sent (``HttpLoadConfig``: flag names as ``vllm bench serve``
spells them) and the base URL's one normal form (``normalize_base_url``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..engine_host.vocab.errors import ConfigError

ENDPOINTS: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")
#: Default per-request limit (s): the whole request, first byte to ``[DONE]``.
DEFAULT_REQUEST_TIMEOUT_S = 600.0


@dataclass
class HttpLoadConfig:
    """Where and how to send the load. Flag names as ``vllm bench serve`` spells them.

    ``base_url``: ``http(s)://host[:port]`` (a trailing ``/`` or ``/v1`` is dropped).
    ``endpoint``: one of ``ENDPOINTS``. ``model``: the name sent in each request (the server's
    ``--served-model-name``). ``api_key``: sent as ``Authorization: Bearer``; None reads
    ``OPENAI_API_KEY`` (vLLM's client does the same). ``max_concurrency``: requests in flight at
    most (None = unbounded); probes bypass it, as vLLM's probe requests do.
    ``request_timeout_s``: per request, from the POST to the end of the stream (s, > 0).
    ``ignore_eos``: sent with every request so that outputs have the forced lengths.
    ``continuous_usage``: ask for per-chunk usage (the chunk's token count).
    ``temperature`` (sent with every request; 0 = greedy, ``vllm bench serve``'s default when
    its ``--temperature`` is not given — a server's own default is 1), ``top_p`` and ``top_k``
    (sent when not None; ``top_k`` -1 or 0 = off, as vLLM takes them).
    Raises ConfigError (``validate``) naming the value and what is allowed.
    """

    base_url: str
    endpoint: str = "/v1/completions"
    model: str = ""
    api_key: str | None = None
    max_concurrency: int | None = None
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ignore_eos: bool = True
    continuous_usage: bool = True
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        self.base_url = normalize_base_url(self.base_url)
        ep = str(self.endpoint).strip()
        if not ep.startswith("/"):
            ep = "/" + ep
        if ep not in ENDPOINTS:
            raise ConfigError(f"--endpoint {self.endpoint!r} is not one of {', '.join(ENDPOINTS)}")
        self.endpoint = ep
        if self.max_concurrency is not None:
            if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, int) \
                    or self.max_concurrency < 1:
                raise ConfigError(f"--max-concurrency {self.max_concurrency!r} must be an "
                                  "integer >= 1 (or left out: no limit)")
        t = self.request_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or \
                not (math.isfinite(t) and t > 0):
            raise ConfigError(f"--request-timeout {t!r} must be a number of seconds > 0")
        self._check_sampling()
        if self.api_key is None:
            self.api_key = os.environ.get("OPENAI_API_KEY") or None

    def _check_sampling(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t)
                                                                          and t >= 0):
            raise ConfigError(f"--temperature {t!r} must be a number >= 0 (0 = greedy)")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float))
                              or not 0 < p <= 1):
            raise ConfigError(f"--top-p {p!r} is out of range: allowed (0, 1]")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < -1):
            raise ConfigError(f"--top-k {k!r} must be an integer >= 1, or -1 / 0 (off)")

    @property
    def is_chat(self) -> bool:
        return self.endpoint == "/v1/chat/completions"

    @property
    def api_url(self) -> str:
        return self.base_url + self.endpoint

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def normalize_base_url(url: str) -> str:
    """``http(s)://host[:port][/prefix]`` without a trailing ``/`` or ``/v1`` (users paste the
    OpenAI client's ``base_url``, which ends in ``/v1``). Raises ConfigError for another scheme,
    a missing host or a bad port."""
    raw = str(url).strip()
    try:
        parts = urlsplit(raw)
        port = parts.port  # ValueError for a port out of range or not a number
    except ValueError as e:
        raise ConfigError(f"--base-url {url!r} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--base-url {url!r} must be http://HOST[:PORT] or https://HOST[:PORT]")
    if parts.query or parts.fragment:
        raise ConfigError(f"--base-url {url!r}: give no query or fragment")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    del port
    return f"{parts.scheme}://{parts.netloc}{path}"
