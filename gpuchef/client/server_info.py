"""A server's answer to ``GET /v1/models`` (``ServerInfo``): its model ids and the first one's
context length, vocabulary and owner, asked once per server (``fetch_server_info``) for the
load's model name and the trace meta's ``server_models``."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from ..engine_host.vocab.errors import ConfigError
from .http_config import HttpLoadConfig
from .http_results import _error_message

#: Limit (s) on the start-up look-up of ``/v1/models``.
INFO_TIMEOUT_S = 10.0


@dataclass
class ServerInfo:
    """What ``GET /v1/models`` said: the model ids, and of the first model ``max_model_len``
    (vLLM says it), ``vocab_size`` (when the server says; vLLM does not), ``owned_by`` and
    ``root`` (vLLM: "vllm" and the model's path). ``note``: "" or why nothing (or not all) was
    read, e.g. "GET /v1/models: HTTP 404"; ``fatal``: nothing answered at the URL, or it refused
    the API key (the load cannot go there)."""

    models: list[str]
    max_model_len: int | None = None
    vocab_size: int | None = None
    owned_by: str | None = None
    root: str | None = None
    note: str = ""
    fatal: bool = False

    def meta(self) -> dict[str, Any]:
        """The trace meta's entry for this server (``server_models``): the fields read, and
        ``note`` when the answer lacked them."""
        d: dict[str, Any] = {"id": self.models[0] if self.models else None,
                             "max_model_len": self.max_model_len, "owned_by": self.owned_by,
                             "root": self.root}
        d = {k: v for k, v in d.items() if v is not None}
        if self.note or not self.models:
            d["note"] = self.note or "GET /v1/models listed no model"
        return d


async def _fetch_info(cfg: HttpLoadConfig, timeout_s: float) -> ServerInfo:
    import aiohttp

    url = cfg.base_url + "/v1/models"
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    def failed(why: str, fatal: bool = False) -> ServerInfo:
        return ServerInfo([], note=why, fatal=fatal)

    try:
        async with aiohttp.ClientSession(headers=cfg.headers(), timeout=timeout,
                                         trust_env=False) as s:
            async with s.get(url) as r:
                raw = await r.content.read(1 << 20)
                if r.status in (401, 403):
                    why = _error_message(r.status, r.reason or "", raw)
                    return failed(f"{why} — give --api-key or set OPENAI_API_KEY", True)
                if r.status != 200:
                    return failed(f"GET /v1/models: HTTP {r.status}")
    except TimeoutError:
        return failed(f"no answer from {url} within {timeout_s:g} s", True)
    except aiohttp.ClientConnectorError as e:
        return failed(f"cannot connect ({e.os_error or e})", True)
    except aiohttp.ClientError as e:
        return failed(f"{url} failed ({type(e).__name__}: {e})", True)
    try:
        data = json.loads(raw).get("data")
        if not isinstance(data, list):
            raise TypeError
        models = [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError, TypeError):
        return failed("GET /v1/models: not an OpenAI model list (JSON with a 'data' list)")
    first = data[0] if data and isinstance(data[0], dict) else {}

    def _pos_int(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    def _text(v: Any) -> str | None:
        return v if isinstance(v, str) and v else None

    return ServerInfo(models, _pos_int(first.get("max_model_len")),
                      _pos_int(first.get("vocab_size")), _text(first.get("owned_by")),
                      _text(first.get("root")))


def fetch_server_info(cfg: HttpLoadConfig, *, timeout_s: float = INFO_TIMEOUT_S,
                      strict: bool = True) -> ServerInfo:
    """``GET base_url/v1/models`` once (the one look-up of a server's models: the load's model
    name, vocabulary and context length, and the trace meta's ``server_models``). A server
    without the endpoint, or answering it with something unreadable, gives a ServerInfo with no
    models and the reason in ``note``. ``strict``: raise ConfigError (one line, naming
    ``--base-url``) when nothing answers at ``base_url`` within ``timeout_s``, or it refuses the
    API key; else that too is only ``note`` (``fatal`` set)."""
    info = asyncio.run(_fetch_info(cfg, timeout_s))
    if strict and info.fatal:
        raise ConfigError(f"--base-url {cfg.base_url}: {info.note}")
    return info


def server_models_meta(infos: dict[str, ServerInfo]) -> dict[str, dict[str, Any]]:
    """The trace meta's ``server_models``: base URL → ``ServerInfo.meta()``."""
    return {u: i.meta() for u, i in infos.items()}
