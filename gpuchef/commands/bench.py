"""`gpuchef bench`: one mode, one load, headless; a results block like `vllm bench serve`."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.markup import escape  # messages may hold brackets, e.g. gpuchef[vllm]

from ..engine_host.vocab.errors import ConfigError
from .options import (check_output_files, check_sampling, engine_config, engine_load,
                      engine_options, run_config, scheduler_options, scheduling_desc,
                      workload_config, workload_options, write_json, http_load_options,
                      print_warning, trace_flags_warning)


@click.command("bench")
@engine_options
@scheduler_options
@workload_options
@http_load_options
@click.option("--goodput", multiple=True,
              help="SLOs for goodput, KEY:MS pairs (ttft, tpot, e2el), e.g. "
                   "--goodput ttft:500 --goodput tpot:50 or --goodput 'ttft:500 tpot:50'.")
@click.option("--metric-percentiles", default="50,99", show_default=True,
              help="Comma-separated percentiles to report.")
@click.option("--trace", "trace_path", default=None, type=click.Path(),
              help="Write the session trace (JSON Lines; gzip when the name ends in .gz) to this file.")
@click.option("--trace-prompts", is_flag=True,
              help="Also store each request's generated (output) token ids in the trace; "
                   "without it the trace holds no token ids (prompt token ids are never stored).")
@click.option("--result-json", default=None, type=click.Path(),
              help="Also write the results as JSON to this file.")
@click.option("--sample-hz", default=10.0, show_default=True, type=float,
              help="NVML/GPM sampling rate (0 = sampler off, or 1..100 Hz); samples go to the "
                   "trace and the GPU lines of the results block.")
@click.option("--gpus", default=None,
              help="GPUs to sample, e.g. 0 or 0,1 or 0-3 (default: all).")
def bench(**o) -> None:
    """Run one scheduler mode against one load, headless, and print the results block.

    Latency metrics use `vllm bench serve`'s definitions: TTFT (arrival → first token), TPOT
    ((E2EL − TTFT)/(output tokens − 1)), ITL (the gap before each output chunk after the first,
    pooled), E2EL. Below them gpuchef's own: engine steps, mean prefill and decode tokens per
    step, preemptions, and the busy fraction (forward time / wall time of the steps).

    Example (CPU, under a minute):

      gpuchef bench --device cpu --model tiny --dataset azure-conv --num-prompts 50

    The same load against a running OpenAI-compatible server (vLLM, SGLang, gpuchef serve),
    no engine here; see docs/http-load.md:

    \b
      gpuchef bench --base-url http://127.0.0.1:8000 --dataset azure-conv \\
        --num-prompts 600 --trace-speed 3 --vocab-size 128256
    """
    from ..engine_host.core import EngineProcessError

    err = Console(stderr=True, soft_wrap=True)
    try:
        _bench(o, err)
    except ConfigError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(2)
    except EngineProcessError as e:  # the engine died mid-run: one line, not a traceback
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(1)


def _bench(o: dict, err: Console) -> None:
    from ..client.bench_http import bench_http, check_http_flags
    if o["base_url"]:  # the load over HTTP to a server gpuchef does not host: no engine here
        return bench_http(o, err)
    check_http_flags(o)
    from ..probes.metrics import benchmark_duration_s, parse_goodput, parse_percentiles, summarize
    from ..sessions.headless import build_engine, run_load

    # everything that can be refused is refused before the model loads
    check_output_files(o)
    goodput = parse_goodput(" ".join(o["goodput"])) if o["goodput"] else None
    pcts = parse_percentiles(o["metric_percentiles"])
    sample_hz, gpus = check_sampling(o["sample_hz"], o["gpus"])
    ecfg = engine_config(o)
    workload_config(o, vocab_size=1 << 20, max_model_len=None)  # load flags and trace file
    if (w := trace_flags_warning(o)):
        print_warning(w)
    engine = build_engine(ecfg, err)
    wcfg, specs = engine_load(o, engine)
    from ..sessions.headless import Samplers, phase_marks

    recorder, sinks, started = _open_trace(o, engine, ecfg, wcfg)
    samplers = Samplers(gpus, sample_hz, sink=recorder.record if recorder else None)
    sc = ecfg.scheduler
    err.print(f"[dim]{len(specs)} requests, mode {sc.mode}, max_num_batched_tokens "
              f"{sc.max_num_batched_tokens}, max_num_seqs {sc.max_num_seqs}[/dim]")
    samplers.start()
    try:
        res = run_load(engine, specs, sinks=sinks, console=err, on_start=started.append,
                       marks=phase_marks(wcfg))
    finally:
        samplers.stop()
        if recorder is not None:
            recorder.close()
        engine.close()  # vLLM: shut its engine core (and TP workers) down
    if recorder is not None and (recorder.error or recorder.dropped):  # e.g. the disk filled up
        why = (f"{recorder.error}; the trace stops where that happened" if recorder.error else
               f"{recorder.dropped} record(s) dropped (the writer fell behind)")
        err.print(f"[yellow]warning:[/] --trace {escape(repr(o['trace_path']))}: {escape(why)}")
    # vllm bench serve's duration (probes.metrics owns it; gpuchef report reads the same)
    duration_s = benchmark_duration_s(res.t0_ns, res.requests,
                                      end_ns=res.t0_ns + int(res.duration_s * 1e9))
    m = summarize(res.requests, duration_s, percentiles=pcts, goodput=goodput, steps=res.steps)
    extra = _extra_rows(engine, ecfg, wcfg, res)
    extra.update(samplers.gpu_lines(res.t0_ns, res.t0_ns + int(duration_s * 1e9)))
    if res.interrupted:
        from ..probes.metrics import SESSION_END_REASON

        left = sum(1 for r in res.requests if r.finish_reason == SESSION_END_REASON)
        err.print(f"[yellow]interrupted:[/] the run was stopped; the results of what finished "
                  f"so far follow ({left} request(s) in flight recorded as withdrawn, "
                  f"'{SESSION_END_REASON}'; {len(specs) - len(res.requests)} never sent)")
    from ..probes.metrics import format_results_block

    click.echo(format_results_block(m, extra=extra))
    if o["result_json"]:
        _result_json(o, m, res, engine, ecfg, wcfg, samplers)
    if res.interrupted:
        sys.exit(130)  # the shell's code for a run stopped by SIGINT


def _open_trace(o: dict, engine, ecfg, wcfg):
    """``--trace``: (the recorder or None, run_load's sinks, the list the run's host goes
    into at its start). The load's start event is the trace's first record after the meta:
    the report's duration counts from it."""
    from ..probes.metrics import load_start_event
    from ..sessions.headless import open_trace, trace_meta

    sinks: list = []
    started: list = []  # the host, until its load-start event is in the trace
    if not o["trace_path"]:
        return None, sinks, started
    recorder = open_trace(o["trace_path"], trace_meta(engine, ecfg, wcfg, "bench"),
                          trace_prompts=o["trace_prompts"])

    class Trace:  # the host's sink, on the delivering thread after host.start()
        def record(self, batch: object) -> None:
            if started:  # first: the load's start, that the report's duration counts from
                recorder.record(load_start_event(started.pop().t0_ns))
            recorder.record(batch)
    sinks.append(Trace())
    return recorder, sinks, started


def _extra_rows(engine, ecfg, wcfg, res) -> dict[str, str]:
    """gpuchef's rows of the results block: model, engine, device, scheduling, mode, budget,
    load, and the autopilot's line when it was on for any part of the run."""
    from ..probes.metrics import autopilot_totals
    from ..sessions.headless import attention_label, load_desc

    lm = engine.loaded
    sc = ecfg.scheduler
    extra = {
        "Model:": f"{lm.name}{' (random weights)' if lm.random_weights else ''}",
        "Engine:": (ecfg.engine if ecfg.engine == "native" else
                    f"{engine.engine_name} "
                    f"(tensor parallel {ecfg.tensor_parallel_size})"),
        "Device / attention:": f"{engine.device} / {attention_label(engine)}",
        "Scheduling:": scheduling_desc(engine),
        "Mode:": sc.mode,
        "max_num_batched_tokens:": str(sc.max_num_batched_tokens),
        "Load:": load_desc(wcfg),
    }
    ap = autopilot_totals(res.steps)
    if sc.auto_budget or ap is not None:  # on at the end, or on for part of the run
        extra["Autopilot:"] = ap.line() if ap is not None else (
            f"{sc.auto_budget}; idle: no chunked step asked it"
            + (" (continuous mode)" if sc.mode == "continuous" else ""))
    return extra


def _result_json(o: dict, m, res, engine, ecfg, wcfg, samplers) -> None:
    """``--result-json``: the results as `vllm bench serve` writes them, plus gpuchef's."""
    from ..sessions.headless import load_desc

    sc = ecfg.scheduler
    d = m.to_dict(empty_as_zero=True)  # vllm: np.mean(x or 0)
    d["partial"] = res.interrupted  # Ctrl-C: the results of what finished before it
    d.update(mode=sc.mode, model=engine.loaded.name, scheduler=sc.as_dict(), load=load_desc(wcfg),
             engine=ecfg.engine, tensor_parallel_size=ecfg.tensor_parallel_size,
             config=run_config(ecfg, engine), nvml_sampler=samplers.sampler_cost())
    write_json(o["result_json"], d, "--result-json")
