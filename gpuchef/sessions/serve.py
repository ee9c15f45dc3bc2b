"""The session side of `gpuchef serve` (and `top --serve`): the front door's process started
before the model loads (:func:`prepare_serving`), and the headless serve session built around
the engine (:func:`build_serve_session`: ``serve.session.ServeSession`` with its trace, profile
switch and samplers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engine_host.vocab.errors import ConfigError


def model_vocab_size(model: str) -> int:
    """The vocabulary size of ``model`` (a preset, or a folder's config.json) without loading
    weights. Raises ConfigError as the loader does for a bad folder."""
    from ..engine_host.loader import model_folder, read_config_json
    from ..engine_host.vocab.presets import PRESETS

    if model in PRESETS:
        return int(PRESETS[model]["vocab_size"])
    cfg = read_config_json(model_folder(model))
    v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(v, int) or v < 1:
        raise ConfigError(f"config.json of {model!r} has no vocab_size")
    return v


def prepare_serving(o: dict[str, Any]):
    """Start the front door's process before the model loads: it binds the port (a port in
    use, a bad host) and reads the tokenizer, and refuses the limits. Returns the started
    ``ServeProcess`` (``attach`` it to the host once the engine is built); raises ConfigError
    with the one line it printed."""
    from ..serve.process import ChildArgs, ServeProcess
    from ..serve.session import gpuchef_version

    cap = o["max_concurrent_requests"]
    if cap is not None and not cap >= 1:
        raise ConfigError(f"--max-concurrent-requests {cap} must be >= 1")
    mb = o["max_request_body_mb"]
    if not (mb > 0 and mb == mb and mb < 1 << 20):
        raise ConfigError(f"--max-request-body-mb {mb:g} must be > 0 (MiB)")
    port = o["port"]
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port {port!r} is out of range: allowed [0, 65535] (0 = any free port)")
    args = ChildArgs(http_host=o["http_host"], port=port, model=o["model"],
                     model_vocab_size=model_vocab_size(o["model"]),
                     tokenizer_path=o["tokenizer"], served_model_name=o["served_model_name"],
                     api_key=o["api_key"], max_concurrent=o["max_concurrent_requests"],
                     max_body_bytes=int(mb * 2**20), version=gpuchef_version())
    return ServeProcess(args).start()


def build_serve_session(ecfg: Any, server: Any, err: Any, *, trace_path: str | None,
                        trace_prompts: bool, profile_dir: Path, sample_hz: float,
                        gpus: list[int] | None) -> Any:
    """The engine built (``headless.build_engine``) behind the started front door ``server``
    (``prepare_serving``): a ``ServeSession`` with its trace (``trace_path``), profile switch
    (``POST /start_profile`` writes under ``profile_dir``) and samplers, not yet started. Stops
    ``server`` and raises when anything fails (ConfigError: a tokenizer built for another
    vocabulary)."""
    import click

    from ..serve.profile import ProfileSwitch
    from ..serve.session import ServeSession
    from .headless import Samplers, build_engine, open_trace, trace_meta

    try:
        engine = build_engine(ecfg, err)
        if server.args.model_vocab_size != engine.model_config.vocab_size:
            raise ConfigError(f"the tokenizer was built for a vocabulary of "
                              f"{server.args.model_vocab_size}, the model has "
                              f"{engine.model_config.vocab_size}")
        recorder = None
        meta = trace_meta(engine, ecfg, None, "serve")
        meta["source"] = {"kind": "hosted", "serve": server.url}
        if trace_path:
            recorder = open_trace(trace_path, meta, trace_prompts=trace_prompts)
        profile = ProfileSwitch(meta, profile_dir, trace_prompts=trace_prompts,
                                note=lambda line: click.echo(line, err=True))
        session = ServeSession(engine, server, recorder=recorder, profile=profile)
        session.samplers = Samplers(gpus, sample_hz, sink=session.sample_sink)
        return session
    except BaseException:
        server.stop()
        raise
