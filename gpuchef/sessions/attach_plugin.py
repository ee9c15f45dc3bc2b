"""gpuchef's vLLM plugin as a source of an attached session (`top --attach URL --plugin
HOST:PORT`) and of its replay: ``tui.session.PluginSource``.

:class:`LivePlugin` reads every ``--plugin`` endpoint with one ``probes.plugin_reader``
``PluginReader`` (its own thread), turns each record into an iteration row
(``probes.plugin_steps.IterationLog``: the one conversion, shared with replay and the report),
keeps the newest records for a trace opened mid-session (``e``), and hands each record to the
session's trace. :class:`RecordedPlugin` is the same source over a trace's ``plugin`` records,
cut at the playback position.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Sequence

from ..engine_host.vocab.errors import ConfigError
from ..probes.plugin_reader import PluginReader, Received, normalize_url
from ..probes.plugin_steps import IterationLog, StreamCounts, iterations_of

#: records kept per stream for a trace opened mid-session (2 min at 100 batches/s)
KEEP_RECORDS = 12_000
#: the steps slot's words when no server has a plugin endpoint
NOT_GIVEN = "no plugin records (--plugin not given)"
#: the same in a replay of a trace recorded without one
NOT_RECORDED = "no plugin records (the trace was recorded without --plugin)"


def parse_plugin(value: str) -> str:
    """One ``--plugin`` value → ``tcp://HOST:PORT``; "-" (this server has no plugin) → "".
    Accepts what vLLM's ``GPUCHEF_PUBLISH`` takes (``127.0.0.1:5557``, ``[::1]:5557``, a
    leading ``tcp://``). Raises ConfigError naming the value and what is allowed."""
    from ..vllm_plugin.publisher import parse_publish

    text = value.strip()
    if text == "-":
        return ""
    allowed = ("allowed: HOST:PORT as vLLM was started with GPUCHEF_PUBLISH=HOST:PORT (e.g. "
               "127.0.0.1:5557, [::1]:5557), or - for a server without the plugin")
    try:
        cfg = parse_publish(text, allow_remote=True)
    except ConfigError as e:
        raise ConfigError(f"--plugin {value!r}: {e}; {allowed}") from None
    if cfg.port == 0:
        raise ConfigError(f"--plugin {value!r}: port 0 lets vLLM's plugin pick a free port; "
                          "give the port its log line names (gpuchef vLLM plugin: publishing "
                          f"... on tcp://HOST:PORT); {allowed}")
    return normalize_url(cfg.endpoint)


def pair_plugins(urls: Sequence[str], values: Sequence[str]) -> list[str]:
    """``--plugin`` values paired with the ``--attach`` URLs in order (fewer: the last servers
    have none): one endpoint or "" per URL. Raises ConfigError for a bad value, more values
    than URLs, or one endpoint twice."""
    if len(values) > len(urls):
        raise ConfigError(f"--plugin is given {len(values)} times for {len(urls)} --attach "
                          "URL(s): each --plugin pairs with the --attach of the same rank "
                          "(- for a server without the plugin)")
    eps = [parse_plugin(v) for v in values] + [""] * (len(urls) - len(values))
    seen = [e for e in eps if e]
    dup = sorted({e for e in seen if seen.count(e) > 1})
    if dup:
        raise ConfigError(f"--plugin {dup[0]} is given twice: one vLLM API server publishes on "
                          "one endpoint (its data-parallel engines share it: engine_idx tells "
                          "them apart)")
    return eps


class PluginSource:
    """The rows of gpuchef's vLLM plugin for the attach screen (``tui.session.PluginSource``).
    ``endpoints``: server base URL → the plugin endpoint read for it (``tcp://HOST:PORT``);
    servers without one are not in it. ``log``: the rows; ``until``: a clock that cuts them (a
    replay's position; None: every row). ``not_given``: the words for a server without an
    endpoint."""

    def __init__(self, endpoints: dict[str, str], log: IterationLog | None = None, *,
                 until: Callable[[], int] | None = None, not_given: str = NOT_GIVEN) -> None:
        self.endpoints = dict(endpoints)
        self.log = log if log is not None else IterationLog()
        self._until = until
        self.not_given = not_given
        self.recorded = until is not None

    def keys(self) -> list[tuple[str, int]]:
        """The (endpoint, engine_idx) streams that sent a record, by server then engine."""
        return self.log.keys()

    def since(self, key: tuple[str, int], n: int) -> tuple[list[Any], int]:
        """``IterationLog.since``, cut at the replay's position when there is one."""
        return self.log.since(key, n, None if self._until is None else self._until())

    def counts(self, key: tuple[str, int]) -> StreamCounts:
        return self.log.counts(key)

    def status(self, server: str) -> str:
        """"" when ``server``'s endpoint sent records; else why there are none."""
        ep = self.endpoints.get(server)
        if not ep:
            return self.not_given
        if any(k[0] == ep for k in self.keys()):
            return ""
        if self.recorded:
            return f"no record from {ep} in this trace"
        hostport = ep.removeprefix("tcp://")
        return (f"no record from {ep} yet: is vLLM running with GPUCHEF_PUBLISH={hostport}, "
                "and busy? (an idle engine sends none)")

    @property
    def status_lines(self) -> list[str]:
        """One line per stream that lost records (the publisher dropped them for this reader,
        or they were made while the connection was being re-made)."""
        out = []
        for key in self.keys():
            c = self.counts(key)
            if c.lost:
                out.append(f"plugin {key[0]} engine {key[1]}: {c.lost} of {c.lost + c.received} "
                           f"records lost ({c.dropped} dropped by vLLM's publisher: this reader "
                           f"fell behind; {c.lost - c.dropped} while reconnecting)")
        return out


class LivePlugin(PluginSource):
    """The endpoints' records as they come (a PluginReader thread). ``on_record(received)``:
    called in that thread for each record (the session's trace). ``start``/``close`` the
    reader; ``held()``: the newest records of each stream (KEEP_RECORDS), for ``e``."""

    def __init__(self, endpoints: dict[str, str],
                 on_record: Callable[[Received], None] | None = None) -> None:
        super().__init__(endpoints)
        self._forward = on_record
        self._held: dict[tuple[str, int], deque[Received]] = {}
        self._lock = threading.Lock()
        # keep=1: the rows are this class's; the reader's own ring of recent records is unused
        self.reader = (PluginReader(sorted(set(self.endpoints.values())), on_record=self._got,
                                    keep=1) if self.endpoints else None)

    def _got(self, got: Received) -> None:
        self.log.add(got)
        key = (got.server, got.record.engine_idx)
        with self._lock:
            ring = self._held.get(key)
            if ring is None:
                ring = self._held[key] = deque(maxlen=KEEP_RECORDS)
            ring.append(got)
        if self._forward is not None:
            self._forward(got)

    def held(self) -> list[Received]:
        with self._lock:
            return [g for ring in self._held.values() for g in ring]

    @property
    def status_lines(self) -> list[str]:
        out = super().status_lines
        if self.reader is not None:
            for url, n in self.reader.snapshot().bad_frames.items():
                if n:
                    out.append(f"plugin {url}: {n} message(s) that are not gpuchef plugin "
                               "records (another program on that port?)")
        return out

    def start(self) -> None:
        if self.reader is not None:
            self.reader.start()

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def recorded_plugin(meta: dict[str, Any], records: list[Received],
                    until: Callable[[], int]) -> PluginSource:
    """The plugin source of a trace (its meta's ``source.plugin`` endpoints, its ``plugin``
    records), cut at ``until()``: what the live dashboard drew at that moment."""
    src = meta.get("source") if isinstance(meta.get("source"), dict) else {}
    eps = src.get("plugin") if isinstance(src.get("plugin"), dict) else {}
    eps = {str(k): str(v) for k, v in eps.items() if v}
    for got in records:  # a trace whose meta lost the mapping: name the streams by endpoint
        eps.setdefault(got.server, got.server)
    return PluginSource(eps, iterations_of(records), until=until, not_given=NOT_RECORDED)


__all__ = ["KEEP_RECORDS", "LivePlugin", "NOT_GIVEN", "NOT_RECORDED", "PluginSource",
           "pair_plugins", "parse_plugin", "recorded_plugin"]
