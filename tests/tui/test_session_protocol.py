"""Every session the dashboard runs on has every member ``tui.session``'s Protocols declare, of
the declared type: ``LiveSession`` (`top`), ``AttachSession`` (`top --attach`) and
``ReplaySession`` (`gpuchef replay`), their loads, A/B controls and scraped servers, and the
tests' ``StaticSession``. What differs between them is a value ("", False, a ConfigError), never
a member that may be missing, so the app reads them without ``hasattr``/``getattr`` probing —
and a test below finds none in ``tui/``."""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import re
import types
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from tui_fakes import T0, StaticSession, simulate

from gpuchef.engine_host.vocab.config import CacheConfig, ConfigError, EngineConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.vocab.workload import WorkloadConfig
from gpuchef.probes.nvml.fake import FakeNvml
from gpuchef.probes.recorder import TraceRecorder
from gpuchef.probes.timeline import Timeline
from gpuchef.sessions.attach import AttachSession, HttpLoadControl, NoLoad
from gpuchef.sessions.live import LiveSession
from gpuchef.sessions.replay import ReplayScrapedServer, ReplaySession
from gpuchef.tui import session as contract
from gpuchef.tui.session import (ABControl, AttachedSession, LoadControl, ReplayControl,
                                 ScrapedServer, Session)

TUI = Path(contract.__file__).resolve().parent


def members(proto: type) -> dict[str, str]:
    """Each member ``proto`` declares (its Protocol bases' included) → "data", "property" or
    "method"."""
    out: dict[str, str] = {}
    for klass in reversed(proto.__mro__):
        if not getattr(klass, "_is_protocol", False) or klass is typing.Protocol:
            continue
        for name in klass.__dict__.get("__annotations__", {}):
            out[name] = "data"
        for name, v in klass.__dict__.items():
            if name.startswith("_"):
                continue
            if isinstance(v, property):
                out[name] = "property"
            elif callable(v):
                out[name] = "method"
    return out


def conforms(value: Any, hint: Any) -> bool:
    """``value`` is of the declared type ``hint`` (a Protocol: has its members)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(conforms(value, a) for a in get_args(hint))
    if origin is collections.abc.Callable:
        return callable(value)
    if origin is tuple:
        args = get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(x, args[0]) for x in value)
        return True
    if origin is not None:
        return isinstance(value, origin)
    if getattr(hint, "_is_protocol", False):
        return not problems(value, hint)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def problems(obj: Any, proto: type) -> list[str]:
    """What ``obj`` lacks of ``proto``: a missing member, a value of another type, a method
    that cannot be called with the declared parameters."""
    hints = get_type_hints(proto)
    out = []
    for name, kind in members(proto).items():
        if not hasattr(obj, name):
            out.append(f"{type(obj).__name__} has no {name!r}")
            continue
        value = getattr(obj, name)
        if kind == "data" and not conforms(value, hints[name]):
            out.append(f"{type(obj).__name__}.{name} = {value!r} is not {hints[name]}")
        elif kind == "property":
            want = get_type_hints(getattr(proto, name).fget)["return"]
            if not conforms(value, want):
                out.append(f"{type(obj).__name__}.{name} = {value!r} is not {want}")
        elif kind == "method":
            if not callable(value):
                out.append(f"{type(obj).__name__}.{name} is not callable")
                continue
            declared = inspect.signature(getattr(proto, name))
            required = [p for p in list(declared.parameters.values())[1:]
                        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            try:
                inspect.signature(value).bind(*[None] * len(required))
            except TypeError as e:
                out.append(f"{type(obj).__name__}.{name}{inspect.signature(value)} does not take "
                           f"{declared}: {e}")
    return out


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=512,
                                  cache=CacheConfig(num_gpu_blocks=256)))


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    tl = Timeline(origin_ns=T0, clock=lambda: T0)
    end = simulate(tl, start_ns=T0, seconds=5.0, mode_at=[(0, "continuous")])
    snap = tl.snapshot(end)
    path = tmp_path_factory.mktemp("protocol") / "toy.jsonl"
    rec = TraceRecorder(path, meta={"command": "top", "device": "cpu"})
    for r in (*snap.steps, *snap.gpu_samples, *snap.events, *snap.requests):
        rec.record(r)
    rec.close()
    return path


def live(engine) -> LiveSession:
    wcfg = WorkloadConfig(dataset="random", request_rate=2.0, input_len=16, output_len=4,
                          num_prompts=4, vocab_size=engine.model_config.vocab_size,
                          max_model_len=engine.max_model_len)
    return LiveSession(engine, wcfg, nvml=FakeNvml(1, pcie_window_s=0), host_probe=False)


def attach() -> AttachSession:
    def fetch(url, timeout):
        raise ConnectionError("no server (a test)")
    return AttachSession(["http://127.0.0.1:9"], fetch=fetch)


def test_live_session_has_what_the_dashboard_reads(engine):
    s = live(engine)
    try:
        assert problems(s, Session) == []
        assert s.knobs_reason == "" and s.engine_paused is False and s.load.REASON == ""
    finally:
        s.close()


def test_attached_session_has_what_the_dashboard_reads():
    s = attach()
    try:
        assert problems(s, AttachedSession) == []
        assert s.engine_paused is False and s.load.REASON  # NoLoad: gpuchef sends no load
        with pytest.raises(ConfigError, match="cannot be paused"):
            s.pause_engine(True)
        assert s.engine_paused is False
    finally:
        s.close()


def test_p_on_attached_servers_says_why_the_engine_cannot_pause(tmp_path):
    from tui_fakes import capture_notes

    from gpuchef.tui.app import GpuchefApp

    s = attach()
    app = GpuchefApp(s, window_s=10.0, screenshot_dir=str(tmp_path), show_ui_cost=False)
    notes = capture_notes(app)
    s.start()

    async def go():
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("P")
            await pilot.pause(0.3)
    try:
        asyncio.run(go())
    finally:
        s.close()
    assert [n for n in notes if "cannot be paused" in n] and not s.engine_paused


def test_replay_session_has_what_the_dashboard_reads(trace_path):
    s = ReplaySession(trace_path, wall=lambda: 0.0)
    assert problems(s, ReplayControl) == []
    assert s.servers == () and s.engine_paused is False and s.knobs_reason == contract.READ_ONLY
    with pytest.raises(ConfigError, match="read-only"):
        s.pause_engine(True)
    # a recorded server of an attached trace is a ScrapedServer too
    assert problems(ReplayScrapedServer(s, "http://127.0.0.1:9/metrics", []), ScrapedServer) == []


def test_every_load_and_ab_control_has_the_declared_members(engine):
    prepared = SimpleNamespace(wcfg=SimpleNamespace(is_random=True, request_rate=2.0,
                                                    trace_speed=1.0, dataset="random"))
    for load in (NoLoad(), HttpLoadControl(prepared, lambda r: None)):
        assert problems(load, LoadControl) == []
        assert load.REASON  # their rate and pause are fixed: the refusal says why
    s = live(engine)
    try:
        assert problems(s.load, LoadControl) == [] and problems(s.ab, ABControl) == []
    finally:
        s.close()


def test_the_tests_static_session_is_a_session():
    assert problems(StaticSession(seconds=2.0), Session) == []


def test_a_missing_member_or_a_wrong_type_is_found():
    s = StaticSession(seconds=2.0)
    copy = {name: getattr(s, name) for name in members(Session) if name != "knobs_reason"}
    assert problems(SimpleNamespace(**copy), Session) == ["SimpleNamespace has no 'knobs_reason'"]
    copy.update(knobs_reason="", engine_paused=None)
    assert problems(SimpleNamespace(**copy), Session) == [
        "SimpleNamespace.engine_paused = None is not <class 'bool'>"]


def test_the_app_does_not_probe_the_session():
    """The app reads what the Protocols declare: no ``hasattr(session, "x")`` or
    ``getattr(session, "x", default)`` (nor of ``s``, its local name, or its load) in tui/."""
    probe = re.compile(r"\b(hasattr|getattr)\(\s*(self\.app\.|self\.|app\.)?(session|s|load)\s*,"
                       r"\s*[\"']")
    found = [f"{p.relative_to(TUI)}:{i}: {line.strip()}"
             for p in sorted(TUI.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert found == []
