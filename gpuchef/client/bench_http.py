"""`gpuchef bench --base-url URL`: the load sent over HTTP to a server gpuchef does not host.

No engine is built and no weights are loaded; a tokenizer is read only when text prompts are
needed (``--tokenizer``, required for the chat endpoint). The results block and ``--result-json``
are ``vllm bench serve``'s (see :mod:`gpuchef.client.http_load`), computed by
``probes.metrics.summarize``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

import click

from ..engine_host.vocab.errors import ConfigError
from ..commands.options import flag_given as _given, flag_name as _flag

#: bench options that configure the hosted engine, its probes or its trace: they cannot apply to
#: a server gpuchef does not host (set them on that server).
ENGINE_ONLY = ("engine", "tensor_parallel_size", "device", "dtype", "attention_backend",
               "decode_attention",
               "enforce_eager", "cudagraph_mode", "cudagraph_capture_sizes",
               "async_scheduling", "block_size", "num_gpu_blocks",
               "kv_cache_memory_gb", "gpu_memory_utilization", "mode", "max_num_batched_tokens",
               "max_num_seqs", "long_prefill_token_threshold", "max_num_partial_prefills",
               "trace_path", "trace_prompts", "sample_hz", "gpus")
#: the options that only mean something with --base-url
HTTP_ONLY = ("endpoint", "max_concurrency", "ramp_up_strategy", "ramp_up_start_rps",
             "ramp_up_end_rps", "api_key", "tokenizer", "vocab_size", "request_timeout",
             "temperature", "top_p", "top_k")


def check_http_flags(o: dict[str, Any], *, via: str = "--base-url",
                     servers: list[str] | None = None) -> None:
    """Refuse engine-only options with ``--base-url`` and HTTP-only options without it, naming
    every such flag given. ``via``: the flag(s) that named the server(s) (``ab``'s two servers:
    ``--a url=/--b url=``); ``servers``: their URLs (default: ``o["base_url"]``). Raises
    ConfigError."""
    if o.get("base_url"):
        bad = [_flag(k) for k in ENGINE_ONLY if k in o and _given(k)]
        if bad:
            verb = "does" if len(bad) == 1 else "do"
            urls = servers or [o["base_url"]]
            where = (f"the server at {urls[0]} runs its own engine (set such options on that "
                     "server)" if len(urls) == 1 else
                     f"the servers at {' and '.join(urls)} run their own engines (set such "
                     "options on those servers)")
            raise ConfigError(f"{', '.join(bad)} {verb} not apply with {via}: {where}")
    else:
        bad = [_flag(k) for k in HTTP_ONLY if k in o and _given(k)]
        if bad:
            verb = "needs" if len(bad) == 1 else "need"
            raise ConfigError(f"{', '.join(bad)} {verb} --base-url URL "
                              "(an OpenAI-compatible server to send the load to)")


@dataclass
class PreparedLoad:
    """The HTTP load ready to send: ``cfg`` (the server and client settings, ``model`` filled
    in), ``wcfg`` the workload, ``specs`` its requests, ``body(spec)`` a request's JSON bytes,
    ``ramp`` (strategy, start, end) or None, ``tok`` the local tokenizer or None, ``desc`` one
    line about the load, ``info`` what the server's ``/v1/models`` said (``http_load.ServerInfo``,
    for the trace meta)."""

    cfg: Any
    wcfg: Any
    specs: list
    body: Callable[[Any], bytes]
    ramp: tuple[str, int, int] | None
    tok: Any
    desc: str
    info: Any = None


#: ``prepare_http_load``'s ``tok`` when the load flags are still to be checked
UNCHECKED: Any = object()


def http_config(o: dict[str, Any], base_url: str | None = None, model: str = "") -> Any:
    """The client settings of ``o`` for one server (``http_load.HttpLoadConfig``; ``base_url``
    default ``o["base_url"]``). Raises ConfigError for a bad endpoint, concurrency or timeout."""
    from .http_load import HttpLoadConfig

    return HttpLoadConfig(base_url=base_url or o["base_url"], endpoint=o["endpoint"],
                          model=model, api_key=o.get("api_key"),
                          max_concurrency=o.get("max_concurrency"),
                          request_timeout_s=o["request_timeout"],
                          temperature=0.0 if o.get("temperature") is None else o["temperature"],
                          top_p=o.get("top_p"), top_k=o.get("top_k"))


def check_load_flags(o: dict[str, Any], cfg: Any) -> Any:
    """The load flags of ``o`` and its ``--result-json`` path, checked before any server is
    asked (two-server ``ab`` checks them once, for both sides), and the warning for random-load
    flags a trace ignores. ``cfg``: ``http_config``'s. Returns the local tokenizer
    (``--tokenizer``) or None. Raises ConfigError naming the flag."""
    from ..commands.options import print_warning, trace_flags_warning, workload_config
    from .http_load import check_ramp_up, load_tokenizer

    try:
        rate = float(o["request_rate"])
    except ValueError:
        raise ConfigError(f"--request-rate {o['request_rate']!r} must be a number > 0 "
                          "or inf") from None
    check_ramp_up(o.get("ramp_up_strategy"), o.get("ramp_up_start_rps"), o.get("ramp_up_end_rps"),
                  request_rate=rate, dataset=o["dataset"], probe_interval_s=o["probe_interval_s"])
    if o.get("vocab_size") is not None and o["vocab_size"] < 11:
        raise ConfigError(f"--vocab-size {o['vocab_size']} is out of range: allowed >= 11")
    tok = load_tokenizer(o["tokenizer"]) if o.get("tokenizer") else None
    if cfg.is_chat and tok is None:
        raise ConfigError("--endpoint /v1/chat/completions sends text: give --tokenizer PATH "
                          "(a local tokenizer.json or model folder) to make the prompts")
    # the load flags and the trace file, checked before anything is sent
    workload_config(o, vocab_size=1 << 20, max_model_len=None, warn=lambda m: None)
    if (w := trace_flags_warning(o)):
        print_warning(w)
    return tok


def prepare_http_load(o: dict[str, Any], *, base_url: str | None = None,
                      model: str = "", tok: Any = UNCHECKED) -> PreparedLoad:
    """Parse the load flags of ``o`` (as `bench --base-url` and `top --attach` take them),
    ask the server for its models once, and build the requests. ``base_url``: the server
    (default ``o["base_url"]``); ``model``: the name to send ("" = the server's first model);
    ``tok``: ``check_load_flags``' answer when the flags were checked already.
    Raises ConfigError for bad input or an unreachable server, before any request is sent."""
    from ..engine_host.vocab.workload import generate
    from ..commands.options import workload_config
    from ..sessions.headless import load_desc
    from .http_load import apply_ramp_up, fetch_server_info, request_body, tokenizer_vocab_size

    cfg = http_config(o, base_url, model)
    if tok is UNCHECKED:
        tok = check_load_flags(o, cfg)

    info = fetch_server_info(cfg)  # ConfigError when nothing answers
    if info.models:
        if not cfg.model:
            cfg.model = info.models[0]
        elif cfg.model not in info.models:
            raise ConfigError(f"--model {cfg.model!r} is not served at {cfg.base_url} "
                              f"(it serves: {', '.join(info.models)})")
    if not cfg.model:
        why = info.note or "GET /v1/models"
        raise ConfigError(f"{cfg.base_url} did not list its models ({why}): give --model NAME, "
                          "the server's --served-model-name")
    # vocabulary for the random prompt ids: the flag, else the tokenizer's, else the server's
    vocab = o.get("vocab_size") or (tokenizer_vocab_size(tok) if tok is not None else None) or \
        info.vocab_size
    if vocab is None:
        raise ConfigError(f"token-id prompts need the model's vocabulary size and {cfg.base_url} "
                          "does not say it: give --vocab-size N (e.g. 128256 for Llama 3) or "
                          "--tokenizer PATH")
    max_len = o["max_model_len"] or info.max_model_len
    wcfg = workload_config(o, vocab_size=vocab, max_model_len=max_len,
                           limit_from="the server's, from GET /v1/models")
    specs = generate(wcfg)
    if not specs:
        raise ConfigError("the workload is empty: raise --num-prompts or --duration")
    ramp = None
    if o.get("ramp_up_strategy"):
        ramp = (o["ramp_up_strategy"], o["ramp_up_start_rps"], o["ramp_up_end_rps"])
        specs = apply_ramp_up(specs, *ramp, burstiness=wcfg.burstiness, arrival=wcfg.arrival,
                              seed=wcfg.seed)
    if ramp:
        desc = (f"random, ramp-up {ramp[0]} {ramp[1]}→{ramp[2]} req/s, "
                f"burstiness {wcfg.burstiness}")
    else:
        desc = load_desc(wcfg)

    def body(spec):
        return request_body(spec, cfg, tok)

    return PreparedLoad(cfg, wcfg, specs, body, ramp, tok, desc, info)


def bench_http(o: dict[str, Any], err) -> None:
    """Run `gpuchef bench --base-url`: options ``o`` as bench parsed them, ``err`` a rich Console
    on stderr. Prints the results block (stdout), one line per kind of failed request (stderr),
    and writes ``--result-json``. Raises ConfigError for bad input, before any request is sent;
    exits 1 when no request succeeded."""
    from rich.markup import escape

    from ..commands.options import check_output_files, write_json
    from ..probes.metrics import (format_results_block, is_probe_id, parse_goodput,
                                   parse_percentiles, summarize)
    from .http_load import (error_counts, error_lines, lateness_stats, peak_stats, result_arrays,
                            run_http_load, to_request_records)

    check_http_flags(o)
    check_output_files(o)
    goodput = parse_goodput(" ".join(o["goodput"])) if o["goodput"] else None
    pcts = parse_percentiles(o["metric_percentiles"])
    pl = prepare_http_load(o, model=o["model"] if _given("model") else "")
    from ..commands.options import print_warning, probe_warning

    if (w := probe_warning(o, pl.specs)):
        print_warning(w)
    cfg, wcfg, specs, body, ramp, tok, load = (pl.cfg, pl.wcfg, pl.specs, pl.body, pl.ramp,
                                               pl.tok, pl.desc)
    err.print(f"[dim]{len(specs)} requests to {escape(cfg.api_url)} (model {escape(cfg.model)}, "
              f"{'text' if tok is not None else 'token-id'} prompts, {escape(load)}, "
              f"max concurrency {cfg.max_concurrency or 'unbounded'})[/dim]")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        # the hosted bench's bar (session.run_load): on a terminal only, gone when done
        with Progress(TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=True,
                      disable=not err.is_terminal) as progress:
            # the load's requests only, as the results block counts them (not the probes)
            bar = progress.add_task("requests", total=sum(
                1 for s in specs if not is_probe_id(s.request_id)))
            run = run_http_load(specs, cfg, body, ramp=ramp, on_result=lambda r: None
                                if is_probe_id(r.request_id) else progress.advance(bar))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/] the run was stopped; no results (requests in flight "
                  "were cancelled)")
        sys.exit(130)
    records = to_request_records(run.results)
    m = summarize(records, run.duration_s, percentiles=pcts, goodput=goodput)
    late = lateness_stats(run.results)
    peak_tok, peak_conc = peak_stats([r for r in run.results if not r.is_probe])
    extra: dict[str, str] = {}
    if cfg.max_concurrency is not None:
        extra["Maximum request concurrency:"] = str(cfg.max_concurrency)
    if not ramp and wcfg.is_random and not math.isinf(wcfg.request_rate):
        extra["Request rate configured (RPS):"] = f"{wcfg.request_rate:.2f}"
    extra.update({
        "Server:": cfg.api_url,
        "Model:": cfg.model,
        "Prompts:": "text (local tokenizer)" if tok is not None else "token ids",
        "Load:": load,
        "Peak output token throughput (tok/s):": f"{peak_tok:.2f}",
        "Peak concurrent requests:": str(peak_conc),
        "Client lateness p50/p99/max (ms):":
            f"{late['p50']:.2f} / {late['p99']:.2f} / {late['max']:.2f}",
    })
    click.echo(format_results_block(m, extra=extra))  # no steps: no Engine Steps section
    for line in error_lines(run.results):
        err.print(f"[yellow]failed:[/] {escape(line)}")
    if o["result_json"]:
        d = result_json(m, run, cfg, wcfg, o, tok is not None, ramp, late, peak_tok, peak_conc,
                        error_counts(run.results), result_arrays(run.results))
        write_json(o["result_json"], d, "--result-json")
    if m.completed == 0:
        err.print("[bold red]error:[/] no request succeeded (see the lines above)")
        sys.exit(1)


#: BenchMetrics.to_dict keys about engine steps: nothing measured them here.
_STEP_KEYS = ("num_steps", "steps_span_s", "steps_per_s", "mean_step_ms", "mean_gpu_ms",
              "mean_prefill_tokens_per_step", "mean_decode_tokens_per_step",
              "mean_tokens_per_step", "num_mixed_steps", "num_preemptions", "busy_fraction")


def result_json(m, run, cfg, wcfg, o, text_prompts: bool, ramp, late, peak_tok, peak_conc,
                errors: dict[str, int], arrays: dict[str, list]) -> dict[str, Any]:
    """``--result-json`` with ``vllm bench serve``'s keys and order (vllm/benchmarks/serve.py
    ``main_async``: setup, traffic, then ``benchmark``'s result and the metric keys), followed by
    gpuchef's (``lateness_*_ms``, ``error_counts``, the probe and load description)."""
    d: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if cfg.is_chat else "openai",
        "backend": "openai-chat" if cfg.is_chat else "openai",
        "label": None,
        "model_id": cfg.model,
        "tokenizer_id": o.get("tokenizer"),
        "num_prompts": sum(1 for r in run.results if not r.is_probe),
        "request_rate": ("inf" if math.isinf(wcfg.request_rate) else wcfg.request_rate)
        if wcfg.is_random else None,
        "burstiness": wcfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
    }
    if ramp:
        d.update(ramp_up_strategy=ramp[0], ramp_up_start_rps=ramp[1], ramp_up_end_rps=ramp[2])
    md = m.to_dict(empty_as_zero=True)  # vllm: np.mean(x or 0)
    for k in _STEP_KEYS:
        md.pop(k, None)
    d.update({k: md.pop(k) for k in ("duration", "completed", "failed", "total_input_tokens",
                                    "total_output_tokens", "request_throughput",
                                    "request_goodput", "output_throughput",
                                    "total_token_throughput") if k in md})
    d.update(arrays)
    d["max_output_tokens_per_s"] = peak_tok
    d["max_concurrent_requests"] = peak_conc
    if m.probe_completed or m.probe_failed:
        d.update(probe_completed=m.probe_completed, probe_failed=m.probe_failed,
                 probe_median_e2el_ms=md.get("median_probe_e2el_ms"),
                 probe_p99_e2el_ms=md.get("p99_probe_e2el_ms"),
                 probe_max_e2el_ms=md.get("max_probe_e2el_ms"))
    if run.rps_change_events:
        d["rps_change_events"] = run.rps_change_events
    d.update(md)  # mean_/median_/std_/pNN_ ttft, tpot, itl, e2el; percentiles; goodput SLOs
    d.update({
        "base_url": cfg.base_url, "endpoint": cfg.endpoint,
        "prompts": "text" if text_prompts else "token_ids",
        "load": wcfg.dataset if not wcfg.is_random else "random",
        "trace_speed": wcfg.trace_speed if not wcfg.is_random else None,
        "request_timeout_s": cfg.request_timeout_s,
        "lateness_p50_ms": late["p50"], "lateness_p99_ms": late["p99"],
        "lateness_max_ms": late["max"],
        "error_counts": errors,
    })
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
