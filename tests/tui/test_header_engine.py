"""The header names what runs: the engine (vLLM and its version), the tensor-parallel size and the
GPUs used (issue 8) — read from what the session reports about the engine — and, for the native
engine on CUDA, the GPU it runs on. No snapshots: the header's text is asserted."""

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import torch
from tui_fakes import StaticSession

from gpuchef.engine_host.vocab.config import CacheConfig, EngineConfig
from gpuchef.engine_host.engine import LLMEngine
from gpuchef.engine_host.vocab.workload import WorkloadConfig
from gpuchef.sessions.live import LiveSession, engine_identity
from gpuchef.probes.nvml.fake import FakeNvml
from gpuchef.tui.app import GpuchefApp
from gpuchef.tui.widgets.header import SessionHeader

SIZE = (170, 50)  # benchmarks/make_screenshots.py's size


def header_of(session) -> str:
    """The header's text once the app has drawn it (Pilot)."""
    out = {}

    async def go():
        app = GpuchefApp(session, window_s=10, show_ui_cost=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.3)
            out["text"] = str(app.screen.query_one(SessionHeader).render())

    asyncio.run(go())
    return out["text"]


def fake_engine(kind="vllm", tp=2, device=("cuda", 0), version="0.24.0"):
    """Only what ``engine_identity`` reads."""
    return SimpleNamespace(config=SimpleNamespace(engine=kind, tensor_parallel_size=tp),
                           tensor_parallel_size=tp, engine_name=f"vLLM {version}",
                           device=torch.device(*device))


def test_identity_vllm_tp2(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert engine_identity(fake_engine()) == ("vLLM 0.24.0", 2, ("0", "1"))


def test_identity_maps_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert engine_identity(fake_engine())[2] == ("2", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc,GPU-def")  # UUIDs: CUDA ordinals
    assert engine_identity(fake_engine())[2] == ("0", "1")


def test_identity_native(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    native = SimpleNamespace(config=SimpleNamespace(engine="native", tensor_parallel_size=1),
                             engine_name="", tensor_parallel_size=1,
                             device=torch.device("cuda", 1))
    assert engine_identity(native) == ("", 1, ("1",))
    native.device = torch.device("cpu")
    assert engine_identity(native) == ("", 1, ())


def test_header_vllm_tp2_names_engine_tp_and_gpus():
    s = StaticSession(gpu=True, n_gpus=2)
    s.info = replace(s.info, engine="vLLM 0.24.0", tensor_parallel_size=2, gpus=("0", "1"))
    text = header_of(s)
    assert "vLLM 0.24.0 TP 2" in text
    assert "GPUs 0,1" in text
    assert "cuda:0" not in text  # the GPU list replaces the device
    assert len(text.splitlines()[0]) <= SIZE[0]  # the knobs still fit on the first line


def test_header_native_names_its_gpu():
    s = StaticSession(gpu=True)
    s.info = replace(s.info, gpus=("3",))
    text = header_of(s)
    assert "GPU 3" in text and "vLLM" not in text and " TP " not in text


def test_header_cpu_unchanged():
    text = header_of(StaticSession(gpu=False))
    assert "  cpu float32" in text and "GPU" not in text.splitlines()[0]


def test_live_session_reports_vllm_tp2_to_the_header(monkeypatch):
    """The real LiveSession over an engine that reports itself as vLLM 0.24.0 with TP 2 on
    cuda:0 (the tiny CPU engine dressed up: never started, only the fake NVML sampler runs)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=256,
                                    cache=CacheConfig(num_gpu_blocks=64)))
    engine.config = replace(engine.config, engine="vllm", tensor_parallel_size=2)
    engine.engine_name = "vLLM 0.24.0"
    engine.tensor_parallel_size = 2
    engine.device = torch.device("cuda", 0)
    wcfg = WorkloadConfig(dataset="azure-conv", vocab_size=engine.model_config.vocab_size,
                          max_model_len=engine.max_model_len)
    session = LiveSession(engine, wcfg, nvml=FakeNvml(2), host_probe=False, sample_hz=10)
    assert (session.info.engine, session.info.tensor_parallel_size, session.info.gpus) == \
        ("vLLM 0.24.0", 2, ("0", "1"))
    session.nvml.start()
    try:
        text = header_of(session)
    finally:
        session.nvml.stop()
    assert "vLLM 0.24.0 TP 2" in text and "GPUs 0,1" in text


def test_closing_the_session_closes_an_engine_that_can_close():
    """`gpuchef top --engine vllm` must stop vLLM (its engine core and TP worker processes) on
    quit: LiveSession.close calls the engine's close() once (every engine has one: contract.Engine)."""
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", max_model_len=256,
                                    cache=CacheConfig(num_gpu_blocks=64)))
    calls = []
    engine.close = lambda: calls.append(1)
    wcfg = WorkloadConfig(dataset="azure-conv", vocab_size=engine.model_config.vocab_size,
                          max_model_len=engine.max_model_len)
    session = LiveSession(engine, wcfg, nvml=FakeNvml(1), host_probe=False, sample_hz=10)
    session.close()
    session.close()
    assert calls == [1]
