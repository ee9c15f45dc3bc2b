"""`gpuchef serve`: the engine behind an OpenAI-compatible HTTP API, Prometheus /metrics and a
knob endpoint, headless (like `vllm serve`). `gpuchef top --serve` takes the same flags."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from ..engine_host.vocab.errors import ConfigError
from .options import (check_output_files, check_sampling, engine_config, engine_options,
                      scheduler_options, serve_options)
from ..sessions.serve import build_serve_session, prepare_serving

#: after the engine thread died: /health says 503 this long before the process exits (1)
DEATH_GRACE_S = 2.0

@click.command("serve")
@engine_options
@scheduler_options
@serve_options
@click.option("--trace", "trace_path", default=None, type=click.Path(),
              help="Write the session trace (JSON Lines) here: every step, request (ids "
                   "http-N), knob change (source http) and GPU sample.")
@click.option("--trace-prompts", is_flag=True,
              help="Also store each request's generated (output) token ids in the trace.")
@click.option("--profile-dir", default=None, type=click.Path(file_okay=False),
              help="Where POST /start_profile writes its trace (gpuchef-profile-TIME.jsonl, "
                   "until POST /stop_profile). Default: the current folder.")
@click.option("--sample-hz", default=10.0, show_default=True, type=float,
              help="NVML/GPM sampling rate (0 = off, or 1..100 Hz); GPM gauges on /metrics.")
@click.option("--gpus", default=None, help="GPUs to sample, e.g. 0 or 0,1 (default: all).")
def serve(**o) -> None:
    """Serve the engine over HTTP with OpenAI's API, so that your own load tool (vllm bench
    serve, guidellm, AIPerf, locust, k6, the openai client) drives it.

    \b
    Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models[/{id}], /health,
    /version, /metrics (vLLM's names + gpuchef: series), GET/PATCH /gpuchef/v1/scheduler (the
    knobs, live); vLLM's /tokenize, /detokenize, /ping, /load, /reset_prefix_cache,
    /start_profile and /stop_profile (a trace of the window in between). Ctrl-C stops it. See
    docs/serve.md.

    \b
    Example (CPU):
      gpuchef serve --device cpu --model tiny --port 8000
    """
    err = Console(stderr=True, soft_wrap=True)
    try:
        session = _build(o, err)
    except ConfigError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(2)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    died = False
    try:
        session.start()
        url = session.url
        name = session.server.args.served_model_name or session.server.args.model
        click.echo(f"gpuchef serve: {name} on {url} (OpenAI API {url}/v1, "
                   f"metrics {url}/metrics, knobs {url}/gpuchef/v1/scheduler); Ctrl-C stops",
                   err=True)
        sys.stderr.flush()
        while not stop.wait(0.5):
            gone = session.server.failure()
            if gone:  # the mirror of the engine's death below: a supervisor restarts us
                died = True
                err.print(f"[bold red]error:[/] {escape(gone)}; stopping the engine, the "
                          "server exits with status 1")
                break
            e = session.host.error
            if e is not None:
                died = True
                err.print(f"[bold red]error:[/] the engine stopped ({type(e).__name__}: "
                          f"{escape(str(e))}); /health answers 503 for {DEATH_GRACE_S:g} s, "
                          "then the server exits with status 1")
                stop.wait(DEATH_GRACE_S)
                break
    finally:
        session.close()
    if o["trace_path"]:
        err.print(f"[dim]trace: {o['trace_path']}[/dim]")
    if died:  # a supervisor restarts on failure
        sys.exit(1)


def _build(o: dict, err: Console):
    check_output_files(o)
    profile_dir = Path(o["profile_dir"] or ".").expanduser()
    if profile_dir.exists() and not profile_dir.is_dir():
        raise ConfigError(f"--profile-dir {o['profile_dir']!r} is a file, not a folder")
    sample_hz, gpus = check_sampling(o["sample_hz"], o["gpus"])
    ecfg = engine_config(o)
    server = prepare_serving(o)
    return build_serve_session(ecfg, server, err, trace_path=o["trace_path"],
                               trace_prompts=o["trace_prompts"], profile_dir=profile_dir,
                               sample_hz=sample_hz, gpus=gpus)
