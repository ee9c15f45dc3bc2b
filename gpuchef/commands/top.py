"""`gpuchef top`: the live dashboard — engine, load, probes and waveforms in one process."""

from __future__ import annotations

import sys
from typing import Any
from dataclasses import replace

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape  # messages may hold brackets, e.g. gpuchef[vllm]

from ..engine_host.vocab.errors import ConfigError
from .options import (print_warning, check_output_files, check_screenshot_dir, engine_config,
                      engine_options, http_client_options, scheduler_options, trace_flags_warning,
                      workload_config, workload_options, parse_window, serve_options)
from ..sessions.serve import prepare_serving

# A bare `gpuchef top` on a CPU (the `tiny` model, reference attention) replays the bundled
# Azure conversation trace slowed down and clipped so that the engine is busy but keeps up:
# the reference attention is quadratic, and a 1k-token prompt already costs ~0.25 s on 2 cores.
CPU_TRACE_SPEED = 0.5
CPU_MAX_INPUT_LEN = 1024
CPU_MAX_OUTPUT_LEN = 128
CPU_BUDGET = 512
CPU_RANDOM_RATE = 2.0
GPU_RANDOM_RATE = 10.0
DEFAULT_SLOS_CPU = {"ttft": 3000.0, "tpot": 250.0}
DEFAULT_SLOS_GPU = {"ttft": 500.0, "tpot": 50.0}
WINDOW_CHOICES = {"10s": 10.0, "60s": 60.0, "1m": 60.0, "10m": 600.0}


#: `top` with stdout redirected: no terminal to draw on, and the dashboard kept a core busy
#: (~100 % CPU against 2.6 % in a terminal)
NOT_A_TERMINAL = ("gpuchef top draws a live dashboard and needs a terminal, but its standard "
                  "output is not one (redirected to a file or a pipe): run it in a terminal; "
                  "for a headless run use `gpuchef bench` (one load, a results block) or "
                  "`gpuchef serve` (the engine over HTTP, as `top --serve` without the dashboard)")


def stdout_is_terminal() -> bool:
    """Whether this process's standard output is a terminal."""
    out = sys.stdout
    return out is not None and out.isatty()


def check_terminal() -> None:
    """Refuse (ConfigError: :data:`NOT_A_TERMINAL`) when stdout is not a terminal."""
    if not stdout_is_terminal():
        raise ConfigError(NOT_A_TERMINAL)


@click.command("top")
@engine_options
@scheduler_options
@workload_options
@click.option("--sample-hz", default=10.0, show_default=True, type=float,
              help="NVML/GPM sampling rate (Hz, 1–100).")
@click.option("--gpus", default=None, help="GPUs to sample (NVML indices): 0,1 or 0-3 or all.")
@click.option("--window", default="60s", show_default=True,
              help="Waveform time window at start: 10s, 60s or 10m (keys 1/2/3 switch it).")
@click.option("--stats-window", default=30.0, show_default=True, type=float,
              help="Seconds of finished requests the rolling numbers summarise.")
@click.option("--fps", default=10.0, show_default=True, type=float,
              help="Dashboard refresh rate (Hz, 1–30).")
@click.option("--trace", "trace_path", default=None, type=click.Path(),
              help="Write the session trace (JSON Lines) here from the start; `e` rotates it. "
                   "Without it, `e` writes what the dashboard holds and records from then on.")
@click.option("--trace-prompts", is_flag=True,
              help="Also store each request's generated (output) token ids in the trace; "
                   "without it the trace holds no token ids (prompt token ids are never stored).")
@click.option("--ab-window", default=10.0, show_default=True, type=float,
              help="Live A/B window length (s): the engine alternates settings every N s.")
@click.option("--goodput", multiple=True,
              help="SLOs for goodput, KEY:MS pairs (ttft, tpot, e2el). Default: ttft:3000 "
                   "tpot:250 on CPU, ttft:500 tpot:50 on GPU.")
@click.option("--metric-percentiles", default="50,99", show_default=True,
              help="Percentiles of the numbers panel (first and last are shown).")
@click.option("--screenshot-dir", default=".", show_default=True,
              help="Where `s` saves SVG screenshots (created if missing).")
@click.option("--serve", is_flag=True,
              help="Also serve the engine over HTTP (OpenAI API, /metrics, knob endpoint; the "
                   "flags below, as `gpuchef serve`) so that your own load tool drives it. The "
                   "internal load starts paused (p starts it) unless --dataset or "
                   "--request-rate is given; HTTP requests are the ids http-N.")
@serve_options
@click.option("--attach", "attach", multiple=True, metavar="URL",
              help="Watch a server gpuchef does not host (vLLM, SGLang, gpuchef serve): scrape "
                   "URL/metrics, no engine here; give it more than once for several servers. "
                   "With --dataset/--request-rate gpuchef also sends its load to the first one "
                   "(the flags of `bench --base-url`). docs/attach.md.")
@click.option("--prometheus", default=None, metavar="URL",
              help="Watch the vLLM, SGLang and gpuchef servers a Prometheus server scrapes, "
                   "through its HTTP API (one column per target; per engine label where a "
                   "server has several), with or without --attach. docs/attach.md.")
@click.option("--plugin", "plugin", multiple=True, metavar="HOST:PORT",
              help="With --attach: where gpuchef's vLLM plugin in that server publishes (the "
                   "GPUCHEF_PUBLISH=HOST:PORT vllm serve was started with); paired with "
                   "--attach in order, - for a server without it. The step waveform, batch "
                   "composition and queue/KV panels then draw its records: every output batch, "
                   "a band per engine. docs/attach.md.")
@click.option("--scrape-hz", default=4.0, show_default=True, type=float,
              help="With --attach: scrapes of /metrics per second (0.1–50); with "
                   "--prometheus, its queries per second.")
@click.option("--ab-load", type=click.Choice(["mirrored", "sequential"]), default=None,
              help="With two --attach and a load: `a` runs an A/B of the first two servers on "
                   "the same arrivals, as `gpuchef ab --a url=U1 --b url=U2` — mirrored "
                   "(default: every request to both at once) or sequential (the whole load to "
                   "one, then the other). Given, the load is kept for the A/B (not sent at "
                   "start).")
@click.option("--ab-repetitions", default=2, show_default=True, type=int,
              help="With --attach: repetitions of each side in the A/B (1–100; the verdict "
                   "needs 2).")
@http_client_options
@click.pass_context
def top(ctx: click.Context, **o) -> None:
    """Open the live dashboard: host the engine, drive it with load, sample the GPU, and watch
    continuous batching vs chunked prefill while you change the knobs.

    With no --dataset on a CPU it replays the bundled Azure conversation trace at 0.5× with
    prompts clipped to 1024 and outputs to 128 tokens, and a 512-token budget, so that load shows
    within seconds (the header says so). Keys: m mode, +/- budget, [/] chunk, </> rate,
    p pause load, a live A/B, e trace, s screenshot, ? help, q quit.

    It draws on a terminal: with stdout redirected to a file or a pipe it stops with an error
    (exit 2) before it starts anything; headless runs are `gpuchef bench` and `gpuchef serve`.

    \b
    Examples:
      gpuchef top                                   # CPU: tiny model, bundled trace
      gpuchef top --model llama-3-8b --dataset azure-conv   # H200
    """
    err = Console(stderr=True, soft_wrap=True)
    try:
        app = _build(ctx, o, err, need_terminal=True)
    except ConfigError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(2)
    try:
        app.run()
    finally:
        app.session.close()
    if app.session.trace_path:
        err.print(f"[dim]trace: {app.session.trace_path}[/dim]")


def _is_default(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) in (ParameterSource.DEFAULT, None)


#: top options that configure a hosted engine or its front door: meaningless with --attach
#: (the server runs its own engine; its knobs are PATCHed live when it has gpuchef's endpoint)
ATTACH_REFUSES = ("engine", "tensor_parallel_size", "model", "device", "dtype",
                  "attention_backend", "decode_attention", "enforce_eager", "cudagraph_mode",
                  "cudagraph_capture_sizes", "async_scheduling", "block_size",
                  "num_gpu_blocks", "kv_cache_memory_gb", "gpu_memory_utilization", "mode",
                  "max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
                  "max_num_partial_prefills", "max_long_partial_prefills", "auto_budget",
                  "serve", "http_host", "port", "served_model_name", "max_concurrent_requests",
                  "max_request_body_mb", "trace_prompts", "ab_window")
#: the options only --attach gives a meaning to
ATTACH_ONLY = ("scrape_hz", "endpoint", "max_concurrency", "ramp_up_strategy",
               "ramp_up_start_rps", "ramp_up_end_rps", "vocab_size", "request_timeout",
               "temperature", "top_p", "top_k", "ab_load", "ab_repetitions", "plugin")


def _flag(ctx: click.Context, name: str) -> str:
    for p in ctx.command.params:
        if p.name == name and getattr(p, "opts", None):
            return max(p.opts, key=len)
    return "--" + name.replace("_", "-")


def check_attach_flags(ctx: click.Context, o: dict) -> None:
    """Refuse, naming them all, the flags that make no sense with ``--attach`` (a hosted
    engine's), and the attach-only flags without it. Raises ConfigError."""
    given = [k for k in o if ctx.get_parameter_source(k) in (ParameterSource.COMMANDLINE,
                                                             ParameterSource.ENVIRONMENT)]
    if o["attach"] or o["prometheus"]:
        bad = [_flag(ctx, k) for k in ATTACH_REFUSES if k in given]
        if bad:
            verb = "does" if len(bad) == 1 else "do"
            flag, where = (("--attach", f"the server at {o['attach'][0]}") if o["attach"] else
                           ("--prometheus", f"each server {o['prometheus']} scrapes"))
            raise ConfigError(f"{', '.join(bad)} {verb} not apply with {flag}: {where} "
                              f"runs its own engine (set such options on that "
                              "server; its knobs change live when it answers gpuchef's knob "
                              "endpoint)")
    else:
        bad = [_flag(ctx, k) for k in ATTACH_ONLY if k in given]
        if bad:
            verb = "needs" if len(bad) == 1 else "need"
            raise ConfigError(f"{', '.join(bad)} {verb} --attach URL (a server to watch)")


def _load_defaults(ctx: click.Context, o: dict, on_cpu: bool) -> list[str]:
    """The load `top` runs when none is given (the bundled trace; on a CPU slowed down and
    clipped, with a smaller budget), written into ``o``. Returns the header's notes."""
    note = []
    if _is_default(ctx, "dataset") and on_cpu:
        o["dataset"] = "azure-conv"
        if _is_default(ctx, "trace_speed"):
            o["trace_speed"] = CPU_TRACE_SPEED
        if _is_default(ctx, "max_input_len"):
            o["max_input_len"] = CPU_MAX_INPUT_LEN
        if _is_default(ctx, "max_output_len"):
            o["max_output_len"] = CPU_MAX_OUTPUT_LEN
        note.append(f"CPU defaults: prompt≤{o['max_input_len']} output≤{o['max_output_len']}")
    elif _is_default(ctx, "dataset"):
        o["dataset"] = "azure-conv"
    if on_cpu and _is_default(ctx, "max_num_batched_tokens"):
        o["max_num_batched_tokens"] = CPU_BUDGET
        # no number: the budget in force is the first line's "budget", and it changes live
        note.append("CPU default budget")
    if o["dataset"] == "random" and _is_default(ctx, "request_rate"):
        o["request_rate"] = str(CPU_RANDOM_RATE if on_cpu else GPU_RANDOM_RATE)
    return note


def _build(ctx: click.Context, o: dict, err: Console, need_terminal: bool = False):
    """The app `top` runs, its session started. Every flag is checked first (ConfigError names
    a bad one, whatever stdout is); then ``need_terminal`` (the command's own call) refuses a
    stdout that is not a terminal, before a port is bound, an engine built or a load announced.
    Tests and screenshot scripts that drive the app with Textual's Pilot leave it off."""
    check_attach_flags(ctx, o)
    if o["attach"] or o["prometheus"]:
        return _build_attach(ctx, o, err, need_terminal)
    from ..engine_host.engine import resolve_device
    from ..probes.metrics import parse_goodput, parse_percentiles
    from ..probes.nvml import parse_gpus

    from ..probes.sampler import check_sample_hz
    from ..probes.nvml import SAMPLE_HZ_RANGE

    window_s = parse_window(o["window"])
    check_sample_hz(o["sample_hz"], *SAMPLE_HZ_RANGE, flag="--sample-hz")
    pcts = parse_percentiles(o["metric_percentiles"])
    gpus = parse_gpus(o["gpus"])
    on_cpu = resolve_device(o["device"]).type == "cpu"
    load_given = not (_is_default(ctx, "dataset") and _is_default(ctx, "request_rate"))
    note = _load_defaults(ctx, o, on_cpu)
    slos = parse_goodput(" ".join(o["goodput"])) if o["goodput"] else \
        dict(DEFAULT_SLOS_CPU if on_cpu else DEFAULT_SLOS_GPU)
    def warn(msg: str) -> None:  # stderr is hidden under the dashboard: the header says it too
        print_warning(msg)
        note.append(msg.split(":")[0])

    ecfg = engine_config(o, warn=warn)
    num_prompts, duration_s = o["num_prompts"], o["duration_s"]
    wcheck = workload_config(o, vocab_size=1 << 20, max_model_len=None)
    if (w := trace_flags_warning(o)):
        warn(w)
    if wcheck.is_random and wcheck.request_rate == float("inf"):
        raise ConfigError("gpuchef top sends load live: --request-rate must be a finite number "
                          "of req/s (inf = all at once only suits `bench`)")
    if not 1 <= o["fps"] <= 30:
        raise ConfigError(f"--fps {o['fps']:g} is out of range: allowed [1, 30]")
    if not 1 <= o["stats_window"] <= 3600:
        raise ConfigError(f"--stats-window {o['stats_window']:g} is out of range: allowed "
                          "[1, 3600] s")
    if not 0.5 <= o["ab_window"] <= 3600:
        raise ConfigError(f"--ab-window {o['ab_window']:g} is out of range: allowed [0.5, 3600] s")
    # before the trace's check: a refused --screenshot-dir leaves no trace folder made
    o["screenshot_dir"] = check_screenshot_dir(o["screenshot_dir"])
    check_output_files(o)  # ~, a folder-style path, one file named twice
    serve_only = {"http_host": "--host", "port": "--port", "api_key": "--api-key",
                  "served_model_name": "--served-model-name", "tokenizer": "--tokenizer",
                  "max_concurrent_requests": "--max-concurrent-requests",
                  "max_request_body_mb": "--max-request-body-mb"}
    given = [f for k, f in serve_only.items()
             if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE]
    if given and not o["serve"]:
        raise ConfigError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --serve "
                          "(the dashboard serves over HTTP only when asked)")
    if need_terminal:
        check_terminal()
    server = None
    if o["serve"]:  # a port in use or a bad tokenizer is refused before the model loads
        server = prepare_serving(o)
    try:
        return _start(o, ecfg, err, server, note, slos, pcts, gpus, window_s, num_prompts,
                      duration_s, load_given)
    except BaseException:
        if server is not None:
            server.stop()
        raise


def _start(o, ecfg, err, server, note, slos, pcts, gpus, window_s, num_prompts, duration_s,
           load_given):
    from ..sessions.live import LiveSession
    from ..sessions.headless import build_engine
    from ..tui.app import GpuchefApp

    engine = build_engine(ecfg, err)
    wcfg = workload_config(o, vocab_size=engine.model_config.vocab_size,
                           max_model_len=engine.max_model_len)
    wcfg = replace(wcfg, num_prompts=wcfg.num_prompts if num_prompts is None else num_prompts)
    meta_extra = {"window_s": window_s}
    if server is not None:
        if not load_given:
            # not "paused": that stops being true at `p`; the load line says PAUSED while it is
            note.append("internal load started paused (p toggles it)")
        meta_extra["source"] = {"kind": "hosted", "serve": server.url}
    session = LiveSession(
        engine, wcfg, sample_hz=o["sample_hz"], gpus=gpus, trace_path=o["trace_path"],
        trace_prompts=o["trace_prompts"], slos=slos, percentiles=pcts,
        stats_window_s=o["stats_window"], note="; ".join(note), num_prompts=num_prompts,
        duration_s=duration_s, meta_extra=meta_extra,
        taps=(server,) if server is not None else ())
    if server is not None:  # the header's "serving URL", dropped when that process dies
        session.info = replace(session.info, serving=server.url)
    app = GpuchefApp(session, window_s=window_s, fps=o["fps"], ab_window_s=o["ab_window"],
                     screenshot_dir=o["screenshot_dir"], front_door=server)
    session.start(load_paused=server is not None and not load_given)
    if server is not None:
        server.attach(session.host, engine)
        session.closers.append(server.stop)
    return app


def _prometheus_columns(url: str, hz: float, err: Console) -> tuple[Any, list[str]]:
    """The poller of the Prometheus server at ``url`` and the columns (servers' base URLs,
    per engine where a server has several) of the vLLM, SGLang and gpuchef targets it scrapes,
    each announced on ``err``. Raises ConfigError, one line: not reachable, not the Prometheus
    API, or no such target (its active targets listed)."""
    from ..probes.prometheus import FleetPoller, PrometheusFleet

    try:
        fleet = PrometheusFleet(url)
        targets = fleet.targets()
        cols = fleet.sample(only_new=False)
    except ValueError as e:  # the URL itself: its message names the flag
        raise ConfigError(str(e)) from None
    except ConnectionError as e:
        raise ConfigError(f"--prometheus: {e}") from None
    served = {k: s for k, s in cols.items() if s.server in ("vllm", "sglang", "gpuchef")}
    if not served:
        have = ", ".join(f"{t.job}/{t.instance} ({t.health})" for t in targets) or "none"
        raise ConfigError(f"--prometheus {url} scrapes no vLLM, SGLang or gpuchef server "
                          f"(its active targets: {have})")
    for k in sorted(served):
        err.print(f"[dim]{escape(k)}: {served[k].server}, read through {escape(url)}[/dim]")
    poller = FleetPoller(fleet, hz)
    poller.keys = set(served)
    return poller, sorted(served)


def _build_attach(ctx: click.Context, o: dict, err: Console, need_terminal: bool = False):
    """`top --attach URL...`: the session on servers gpuchef does not host (gpuchef/sessions/attach.py).
    ``need_terminal``: as :func:`_build`'s."""
    from ..experiments.ab import check_repetitions
    from ..sessions.attach import AttachSession, base_of
    from ..sessions.attach_plugin import pair_plugins
    from ..probes.sampler import check_sample_hz
    from ..probes.metrics import parse_goodput, parse_percentiles
    from ..probes.nvml import SAMPLE_HZ_RANGE, parse_gpus
    from ..tui.app import GpuchefApp

    window_s = parse_window(o["window"])
    urls = [base_of(u) for u in o["attach"]]
    plugins = pair_plugins(urls, o["plugin"])  # before the Prometheus columns join the URLs
    if not 0.1 <= o["scrape_hz"] <= 50:
        raise ConfigError(f"--scrape-hz {o['scrape_hz']:g} is out of range: allowed [0.1, 50]")
    poller = None
    if o["prometheus"]:
        poller, cols = _prometheus_columns(o["prometheus"], o["scrape_hz"], err)
        urls += [c for c in cols if c not in urls]
    gpus = parse_gpus(o["gpus"]) if o["gpus"] is not None else None
    if gpus is not None:
        check_sample_hz(o["sample_hz"], *SAMPLE_HZ_RANGE, flag="--sample-hz")
    pcts = parse_percentiles(o["metric_percentiles"])
    slos = parse_goodput(" ".join(o["goodput"])) if o["goodput"] else dict(DEFAULT_SLOS_GPU)
    if not 1 <= o["fps"] <= 30:
        raise ConfigError(f"--fps {o['fps']:g} is out of range: allowed [1, 30]")
    if not 1 <= o["stats_window"] <= 3600:
        raise ConfigError(f"--stats-window {o['stats_window']:g} is out of range: allowed "
                          "[1, 3600] s")
    check_output_files(o)
    try:
        reps = check_repetitions(o["ab_repetitions"])
    except ConfigError as e:
        raise ConfigError(str(e).replace("--repetitions", "--ab-repetitions")) from None
    load = None
    load_given = not (_is_default(ctx, "dataset") and _is_default(ctx, "request_rate"))
    if load_given:  # the load of `bench --base-url`, refused before anything is sent
        from ..client.bench_http import prepare_http_load

        if o["dataset"] == "random" and _is_default(ctx, "request_rate"):
            o["request_rate"] = str(GPU_RANDOM_RATE)  # not inf: a live load, not all at once
        o.setdefault("result_json", None)
        try:
            load = prepare_http_load(o, base_url=urls[0])
        except ConfigError as e:  # bench's words name its flag: here the URL is --attach's
            raise ConfigError(str(e).replace("--base-url ", "--attach ")) from None
    ab_loads, ab_why = None, ""
    if o["ab_load"] and (len(urls) < 2 or load is None):
        raise ConfigError("--ab-load runs an A/B of two attached servers on gpuchef's load: "
                          "give --attach twice and --dataset or --request-rate")
    if len(urls) >= 2 and load is not None:  # `a`: the same load to both (gpuchef ab's)
        from ..experiments.http import Arm, prepare_loads

        arms = {"A": Arm("A", urls[0], ""), "B": Arm("B", urls[1], "")}
        try:
            ab_loads = prepare_loads(o, arms, "")
            load = ab_loads["A"]
        except ConfigError as e:  # the second server: the session goes on, `a` says why
            why = (str(e).replace("--b url=", "--attach (B) ")  # the flags the user gave
                   .replace("--a url=", "--attach (A) "))
            if o["ab_load"]:  # an A/B asked for at start: refused before it, as other bad input
                raise ConfigError(f"--ab-load: {why}") from None
            ab_why = f"no A/B: {why}"
    if need_terminal:
        check_terminal()
    # every check passed: only now a folder is made and the load announced
    o["screenshot_dir"] = check_screenshot_dir(o["screenshot_dir"])
    if load is not None:
        err.print(f"[dim]{len(load.specs)} requests to {escape(load.cfg.api_url)} "
                  f"({escape(load.desc)})[/dim]")
    session = AttachSession(urls, scrape_hz=o["scrape_hz"], gpus=gpus,
                            sample_hz=o["sample_hz"], load=load, api_key=o.get("api_key"),
                            trace_path=o["trace_path"], slos=slos, percentiles=pcts,
                            stats_window_s=o["stats_window"], ab_loads=ab_loads,
                            ab_load=o["ab_load"] or "mirrored", ab_repetitions=reps,
                            load_for_ab=bool(o["ab_load"]), ab_why=ab_why, prometheus=poller,
                            plugins=plugins)
    app = GpuchefApp(session, window_s=window_s, fps=o["fps"],
                     screenshot_dir=o["screenshot_dir"])
    session.start()
    return app
