"""gpuchef's vLLM stat-logger plugin: vLLM's per-batch scheduler and iteration stats, published
on loopback for gpuchef's dashboard (docs/attach.md, "gpuchef's vLLM plugin").

Registered in pyproject.toml under the entry-point group ``vllm.stat_logger_plugins`` as
``gpuchef = "gpuchef.vllm_plugin:GpuchefStatLogger"``: ``pip install gpuchef`` in vLLM's
environment and ``GPUCHEF_PUBLISH=127.0.0.1:PORT vllm serve ...``. Without ``GPUCHEF_PUBLISH`` it
binds nothing and imports nothing beyond the standard library. The transport (a zmq ROUTER on
loopback, msgspec records, drops counted per reader) and why: ``publisher.py``'s docstring; the
record's fields: ``gpuchef.probes.plugin_wire``; the reader: ``gpuchef.probes.plugin_reader``.

Importing this package imports no vLLM, torch, Textual or the rest of gpuchef: ``GpuchefStatLogger``
is made on first access (PEP 562). When vLLM's ``vllm.v1.metrics.loggers`` is loaded (it is: vLLM
loads the plugin from there) the class is a subclass of vLLM's ``AggregateStatLoggerBase`` (or of
``StatLoggerBase`` in a vLLM without it), as vLLM's loader checks; when it is not (tests, a process
without vLLM) it is the plain ``GpuchefStatLoggerCore`` underneath, and this package does not
import vLLM to find out (that would import torch).
"""

from __future__ import annotations

import sys
import types

from .logger import GpuchefStatLoggerCore, build_record
from .publisher import ENV_ALLOW_REMOTE, ENV_HWM, ENV_PUBLISH, ConfigError, PublishConfig, parse_publish

__all__ = [
    "ENV_ALLOW_REMOTE", "ENV_HWM", "ENV_PUBLISH", "ConfigError", "GpuchefStatLogger",
    "GpuchefStatLoggerCore", "PublishConfig", "build_record", "parse_publish", "stat_logger_class",
]

_classes: dict = {}  # vLLM base class (or None) -> the class made on it


def _vllm_base():
    mod = sys.modules.get("vllm.v1.metrics.loggers")
    if mod is None and "vllm.plugins" in sys.modules:
        # inside vLLM but its loggers module not imported yet: importing it costs nothing new
        try:
            import vllm.v1.metrics.loggers as mod  # noqa: F811
        except Exception:
            mod = None
    if mod is None:
        return None
    return getattr(mod, "AggregateStatLoggerBase", None) or getattr(mod, "StatLoggerBase", None)


def stat_logger_class() -> type:
    """The plugin class on whatever vLLM base is loaded now (see the module's docstring)."""
    base = _vllm_base()
    cls = _classes.get(base)
    if cls is None:
        bases = (GpuchefStatLoggerCore,) if base is None else (GpuchefStatLoggerCore, base)
        cls = types.new_class("GpuchefStatLogger", bases,
                              exec_body=lambda ns: ns.update(__module__=__name__,
                                                             __qualname__="GpuchefStatLogger",
                                                             __doc__=GpuchefStatLoggerCore.__doc__))
        _classes[base] = cls
    return cls


def __getattr__(name: str):
    if name == "GpuchefStatLogger":
        return stat_logger_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
