"""`gpuchef ab`: two scheduler settings against the same seeded load, side by side; or the
capacity of each under latency SLOs (``--capacity``); over HTTP, two settings of one server or two
servers. The runs are ``experiments``' (``hosted``, ``http``, ``capacity``); this module is the
command: its flags, checks and printed results."""

from __future__ import annotations

import math
import sys
from typing import Any

import click
from rich.console import Console
from rich.markup import escape  # messages may hold brackets, e.g. gpuchef[vllm]

from ..experiments.capacity import SATURATION_TOLERANCE
from ..engine_host.vocab.errors import ConfigError
from ..probes.ab import MIN_REPETITIONS
from .options import (check_output_files, check_sampling, engine_config, engine_load,
                      engine_options, flag_given, http_load_options, print_warning, run_config,
                      scheduler_options, scheduling_desc, trace_flags_warning, workload_config,
                      workload_options, write_json)


@click.command("ab")
@engine_options
@scheduler_options
@workload_options
@http_load_options
@click.option("--ab-load", type=click.Choice(["mirrored", "sequential"]), default=None,
              help="Two servers (--a url=URL1 --b url=URL2): mirrored (default) sends every "
                   "request to both at the same arrival time (fair only when they do not share "
                   "a GPU); sequential sends the whole load to A, then B, repetitions "
                   "alternating. docs/http-load.md.")
@click.option("--a", "spec_a", default="mode=continuous", show_default=True,
              help="Setting A: KNOB=VALUE pairs over the base settings (the scheduler flags), "
                   "e.g. mode=continuous or mode=chunked,max_num_batched_tokens=512. Knobs: "
                   "mode, max_num_batched_tokens (budget), max_num_seqs (seqs), "
                   "long_prefill_token_threshold (chunk), max_num_partial_prefills (partial): "
                   "the short names are the dashboard palette's. Over HTTP: url=URL names "
                   "the server of this side (two servers), knobs after it PATCHed through its "
                   "gpuchef knob endpoint; with --base-url URL the knobs alone.")
@click.option("--b", "spec_b", default="mode=chunked", show_default=True,
              help="Setting B, as --a.")
@click.option("--repetitions", default=1, show_default=True, type=int,
              help="Runs of each setting (1–100): A B, then B A, … so that drift cancels; "
                   "the deltas' spread and verdict come from them. The default 1 is a quick "
                   "look: both results blocks and B − A, but no noise estimate, so no "
                   f"better/worse verdict (it needs {MIN_REPETITIONS}; use 3 or more for it to "
                   "mean something).")
@click.option("--interleave", is_flag=True,
              help="One load; the engine alternates A and B every --window seconds on the same "
                   "arrival stream (each window is a run for the spread).")
@click.option("--window", "window_s", default=10.0, show_default=True, type=float,
              help="--interleave window length (s, 0.5–3600). Make it long against the "
                   "requests' end-to-end latency.")
@click.option("--goodput", multiple=True,
              help="SLOs for goodput, KEY:MS pairs (ttft, tpot, e2el), as in `gpuchef bench`.")
@click.option("--metric-percentiles", default="50,99", show_default=True,
              help="Comma-separated percentiles to report.")
@click.option("--capacity", is_flag=True,
              help="Instead of one rate: for each setting, bisect over the request rate for the "
                   "highest rate that meets every --slo and is not saturated (achieved < "
                   f"{1 - SATURATION_TOLERANCE:.0%} of offered, or a growing queue, fails a "
                   "probe; one whose SLO is broken beyond doubt stops early), then B/A. "
                   "docs/capacity.md.")
@click.option("--slo", "slo_spec", default=None,
              help="--capacity SLOs: METRIC_STAT:LIMIT pairs, metric ttft/tpot/itl/e2el, stat "
                   "mean/median/p50/p90/p99/…, limit in ms or s, e.g. itl_p99:100ms,ttft_p99:2s.")
@click.option("--rate-lo", default=0.5, show_default=True, type=float,
              help="--capacity: lowest rate tried (req/s). A trace dataset is replayed at the "
                   "speed at which the probe's own arrivals offer the rate (count over their "
                   "span); every probe's offered and achieved req/s are shown.")
@click.option("--rate-hi", default=32.0, show_default=True, type=float,
              help="--capacity: highest rate tried (req/s).")
@click.option("--tolerance", default="5%", show_default=True,
              help="--capacity: stop when the bracket is this narrow: a percentage of the rate "
                   "(5%) or req/s (0.5).")
@click.option("--max-probes", default=16, show_default=True, type=int,
              help="--capacity: most runs per setting.")
@click.option("--trace", "trace_path", default=None, type=click.Path(),
              help="Write one session trace (JSON Lines; gzip when the name ends in .gz) with a mark "
                   "event at each run or window.")
@click.option("--trace-prompts", is_flag=True,
              help="Also store each request's generated (output) token ids in the trace; "
                   "without it the trace holds no token ids (prompt token ids are never stored).")
@click.option("--result-json", default=None, type=click.Path(),
              help="Also write every run, the pooled results and the deltas as JSON.")
@click.option("--sample-hz", default=10.0, show_default=True, type=float,
              help="NVML/GPM sampling rate (0 = sampler off, or 1..100 Hz).")
@click.option("--gpus", default=None, help="GPUs to sample, e.g. 0 or 0,1 or 0-3 (default: all).")
def ab(**o) -> None:
    """Run two scheduler settings against the same seeded load on one engine (loaded once) and
    print both results blocks side by side, then B − A with its spread over the repetitions and
    whether it exceeds that spread.

    Both settings get identical arrivals, lengths and token ids; each run starts with an empty
    KV cache. With --interleave one load is served while the engine alternates the settings
    in windows. With --capacity each setting's highest rate under --slo is searched instead.

    Examples (CPU; the first takes about half a minute, the second a few minutes; give
    --capacity probes a --duration of tens of seconds so that a queue can build):

    \b
      gpuchef ab --device cpu --model tiny --num-prompts 20 --input-len 256
          --output-len 32 --request-rate 4 --repetitions 3
      gpuchef ab --device cpu --model tiny --duration 20 --input-len 256
          --output-len 32 --capacity --slo itl_p99:200ms,ttft_p99:2s
          --rate-lo 1 --rate-hi 32 --tolerance 20%

    Against servers gpuchef does not host (docs/http-load.md, "A/B over HTTP"): two knob
    settings of one `gpuchef serve`, PATCHed before each run; or two servers on the same
    arrivals:

    \b
      gpuchef ab --base-url http://127.0.0.1:8000 --a budget=512 --b budget=2048
          --num-prompts 50 --request-rate 4 --repetitions 2
      gpuchef ab --a url=http://node1:8000 --b url=http://node2:8000 --dataset azure-conv
          --num-prompts 600 --trace-speed 3 --vocab-size 128256
    """
    from ..engine_host.core import EngineProcessError

    err = Console(stderr=True, soft_wrap=True)
    try:
        from ..experiments.http import is_http
        if is_http(o):  # servers gpuchef does not host: no engine here
            return _ab_http(o, err)
        from ..client.bench_http import check_http_flags
        check_http_flags(o)
        if o["ab_load"]:
            raise ConfigError("--ab-load is for two servers: give --a url=URL1 --b url=URL2")
        _ab(o, err)
    except ConfigError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(2)
    except EngineProcessError as e:  # the engine died mid-run: one line, not a traceback
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)


def _check(o: dict) -> dict[str, Any]:
    """Everything that can be refused before the model loads."""
    from ..experiments.ab import check_repetitions, check_window, parse_setting
    from ..experiments.capacity import check_rates, parse_slos, parse_tolerance
    from ..probes.metrics import parse_goodput, parse_percentiles

    c: dict[str, Any] = {}
    c["goodput"] = parse_goodput(" ".join(o["goodput"])) if o["goodput"] else {}
    c["pcts"] = parse_percentiles(o["metric_percentiles"])
    c["ecfg"] = ecfg = engine_config(o)
    c["settings"] = {"A": parse_setting(o["spec_a"], ecfg.scheduler, "A"),
                     "B": parse_setting(o["spec_b"], ecfg.scheduler, "B")}
    c["reps"] = check_repetitions(o["repetitions"])
    c["window"] = check_window(o["window_s"])
    if o["capacity"]:
        if o["interleave"]:
            raise ConfigError("--capacity runs each setting on its own load: drop --interleave")
        if not o["slo_spec"]:
            raise ConfigError("--capacity needs --slo, e.g. --slo itl_p99:100ms,ttft_p99:2000ms")
        c["slos"] = parse_slos(o["slo_spec"])
        c["rates"] = check_rates(o["rate_lo"], o["rate_hi"])
        c["tol"] = parse_tolerance(o["tolerance"])
        if not 2 <= o["max_probes"] <= 100:
            raise ConfigError(f"--max-probes {o['max_probes']} is out of range: allowed [2, 100]")
        # the search sets the rate; the load flags are checked (and later built) at --rate-lo
        o["request_rate"] = str(c["rates"][0])
    elif o["slo_spec"]:
        raise ConfigError("--slo is for --capacity; for goodput under SLOs use --goodput ttft:MS")
    workload_config(o, vocab_size=1 << 20, max_model_len=None)  # load flags and trace file
    if (w := trace_flags_warning(o)):
        print_warning(w)
    c["sample_hz"], c["gpus"] = check_sampling(o["sample_hz"], o["gpus"])
    check_output_files(o)  # ~, a folder-style path, one file named twice
    return c


def _ab(o: dict, err: Console) -> None:
    from ..sessions.headless import Samplers, build_engine, open_trace, trace_meta

    c = _check(o)
    settings = c["settings"]
    if settings["A"].config == settings["B"].config:  # allowed on purpose: a noise baseline
        err.print("[yellow]note:[/] A and B are the same setting: an A/A run, whose deltas "
                  "show the run-to-run noise")
    engine = build_engine(c["ecfg"], err)
    wcfg, specs = engine_load(o, engine)
    recorder = None
    sinks = []
    if o["trace_path"]:
        meta = trace_meta(engine, c["ecfg"], wcfg, "ab")
        meta["ab"] = {
            "run": 1,
            "settings": {k: {"spec": s.spec, "describe": s.describe(), "changes": s.changes,
                             "scheduler": s.config.as_dict()} for k, s in settings.items()},
            "interleave": bool(o["interleave"]), "window_s": c["window"],
            "repetitions": c["reps"], "capacity": bool(o["capacity"]),
        }
        if o["capacity"]:
            meta["ab"]["slos"] = [str(s) for s in c["slos"]]
            meta["ab"]["slo_spec"] = o["slo_spec"]
            from ..experiments.capacity import judging_rules
            meta["ab"]["rules"] = judging_rules()
        recorder = open_trace(o["trace_path"], meta, trace_prompts=o["trace_prompts"])
        sinks.append(recorder)
    samplers = Samplers(c["gpus"], c["sample_hz"], sink=recorder.record if recorder else None)
    samplers.start()
    try:
        if o["capacity"]:
            result = _capacity(o, c, engine, wcfg, sinks, samplers, err)
        else:
            result = _compare(o, c, engine, wcfg, specs, sinks, samplers, err)
    finally:
        samplers.stop()
        if recorder is not None:
            recorder.close()
            err.print(f"[dim]trace: {o['trace_path']}[/dim]")
    if o["result_json"]:
        result["config"] = run_config(c["ecfg"], engine)
        write_json(o["result_json"], result, "--result-json")


def _header(engine, wcfg, settings, specs_n: int | str, load: str | None = None) -> list[str]:
    """The run's header lines; ``specs_n``: the request count, or a phrase when it varies."""
    from ..sessions.headless import load_desc

    lm = engine.loaded
    n = f"{specs_n} requests" if isinstance(specs_n, int) else specs_n
    return [f"Model: {lm.name}{' (random weights)' if lm.random_weights else ''} on "
            f"{engine.device} / {engine.attn.name}",
            f"Scheduling: {scheduling_desc(engine)}",
            f"Load: {load or load_desc(wcfg)}; {n}, seed {wcfg.seed}",
            f"A: {settings['A'].describe()}",
            f"B: {settings['B'].describe()}",
            *(f"note: {n}" for k in ("A", "B") for n in settings[k].notes)]


def _compare(o, c, engine, wcfg, specs, sinks, samplers, err) -> dict[str, Any]:
    from ..experiments.ab import STRADDLE_WARN_SHARE, compare, knob_text, run_orders
    from ..experiments.ab_text import format_deltas, side_by_side
    from ..experiments.hosted import run_interleaved, run_sequential
    from ..probes.metrics import autopilot_totals, format_results_block, is_probe_id
    from ..probes.summaries import gpu_result_rows

    settings, pcts, goodput = c["settings"], c["pcts"], c["goodput"]

    def on_run(i: int, total: int, run) -> None:
        n = sum(1 for r in run.requests if not is_probe_id(r.request_id))  # the results' count
        of = f"/{total}" if total else ""
        kind = "window" if o["interleave"] else "repetition"
        err.print(f"[dim]run {i}{of}: {run.label} ({settings[run.label].describe()}) {kind} "
                  f"{run.rep}: {n} requests in {run.duration_s:.1f} s[/dim]", highlight=False)

    from ..sessions.headless import phase_marks

    kw = dict(sinks=sinks, console=err, percentiles=pcts, goodput=goodput,
              samplers=samplers, on_run=on_run, marks=phase_marks(wcfg))
    straddle = None
    if o["interleave"]:
        runs, straddle = run_interleaved(engine, specs, settings, c["window"], c["reps"], **kw)
        if straddle > STRADDLE_WARN_SHARE:
            err.print(f"[yellow]note:[/] {straddle:.0%} of requests finished after their window "
                      "ended (their latency mixes both settings): lengthen --window")
    else:
        runs = run_sequential(engine, specs, settings, c["reps"], **kw)
    cmp = compare(runs, pcts, goodput, interleaved=bool(o["interleave"]))
    lines = _header(engine, wcfg, settings, len(specs))
    if o["interleave"]:
        lines.append(f"Runs: one load per repetition, settings alternating every "
                     f"{c['window']:g} s ({cmp.count('A')} windows of A and {cmp.count('B')} "
                     f"of B counted, {len(cmp.skipped)} not)")
    else:
        order = " | ".join(" ".join(p) for p in run_orders(c["reps"]))
        lines.append(f"Runs: {c['reps']} repetition{'s' if c['reps'] > 1 else ''} of each "
                     f"setting, order {order}")
    blocks = {}
    # every knob either setting names gets a row in both columns
    named = [kn for kn in dict.fromkeys([*settings["A"].changes, *settings["B"].changes])
             if kn not in ("mode", "max_num_batched_tokens")]
    for k in ("A", "B"):
        st = settings[k]
        n = cmp.count(k)
        extra = {"Mode:": st.config.mode,
                 "max_num_batched_tokens:": str(st.config.max_num_batched_tokens)}
        for knob in named:
            extra[f"{knob}:"] = knob_text(knob, getattr(st.config, knob))
        if any(settings[x].config.auto_budget for x in ("A", "B")):
            ap = autopilot_totals(s for r in cmp.runs if r.label == k for s in r.steps)
            extra["Autopilot steps:"] = ap.short() if ap is not None else (
                "idle" if st.config.auto_budget else "off")
        extra["Runs pooled:"] = str(n)
        g = cmp.pooled_gpu[k]
        if any(math.isfinite(v) for v in g.values()):
            extra.update(gpu_result_rows(g))
        blocks[k] = format_results_block(cmp.pooled[k], extra=extra)
    click.echo("\n".join(lines))
    click.echo(side_by_side(blocks["A"], blocks["B"], "A/B Serving Benchmark Result"))
    click.echo(format_deltas(cmp, "window" if o["interleave"] else "repetition"))
    return {
        "command": "ab",
        "settings": {k: {"spec": s.spec, "changes": s.changes, "scheduler": s.config.as_dict()}
                     for k, s in settings.items()},
        "interleave": bool(o["interleave"]), "window_s": c["window"] if o["interleave"] else None,
        "repetitions": c["reps"], "straddle_share": straddle,
        "runs": [{"label": r.label, "rep": r.rep, "duration_s": r.duration_s,
                  "counted": r.counted, "not_counted_why": r.why or None,
                  "metrics": r.metrics.to_dict(empty_as_zero=True),
                  "gpu": {k: (v if math.isfinite(v) else None) for k, v in r.gpu.items()}}
                 for r in runs],
        "pooled": {k: cmp.pooled[k].to_dict(empty_as_zero=True) for k in ("A", "B")},
        "min_pairs": cmp.min_pairs,
        "deltas": [r.as_dict() for r in cmp.rows],
        "requests": cmp.requests_dict(),
    }


def _capacity(o, c, engine, wcfg, sinks, samplers, err) -> dict[str, Any]:
    """`ab --capacity`: each setting's capacity search (``experiments.capacity``), printed probe
    by probe, then B/A. Returns the --result-json record."""
    from ..experiments.capacity import capacity_ratio, slo_percentiles, trace_rate

    slos = c["slos"]
    pcts = tuple(sorted(set(c["pcts"]) | set(slo_percentiles(slos))))
    native = None if wcfg.is_random else trace_rate(wcfg)
    _capacity_header(c, engine, wcfg, native, err)
    results = {}
    out: dict[str, Any] = {"command": "ab --capacity", "slos": [str(s) for s in slos],
                           "settings": {}, "capacity": {}}
    for k in ("A", "B"):
        st = c["settings"][k]
        results[k] = res = _capacity_side(o, c, engine, wcfg, native, k, pcts, sinks, err)
        out["settings"][k] = {"spec": st.spec, "scheduler": st.config.as_dict()}
        out["capacity"][k] = res.as_dict()
        for p, d in zip(res.probes, out["capacity"][k]["probes"]):
            d["metrics"] = p.metrics.to_dict()
    ratio, text, bound = capacity_ratio(results["A"], results["B"])
    click.echo(f"\nCapacity ratio B/A: {text}")
    out["capacity_ratio"] = None if ratio is None or not math.isfinite(ratio) else ratio
    out["capacity_ratio_bound"] = bound  # "upper"/"lower": capacity_ratio is only a bound
    out["capacity_ratio_text"] = text
    return out


def _capacity_header(c, engine, wcfg, native, err) -> None:
    """The lines above a capacity search: the run's header, the SLOs and the method."""
    from ..engine_host.vocab.workload import generate

    slos = c["slos"]
    load = (f"random, rate searched, burstiness {wcfg.burstiness}" if native is None else
            f"{wcfg.dataset} replayed at the speed whose probe offers each rate (offered = "
            "its requests' count over their arrival span)")
    # a probe's request count follows its rate (× --duration): each probe's row gives its own
    per_probe = ("requests per probe: its rate × --duration (each row's count)"
                 if wcfg.duration_s is not None
                 else f"{len(generate(wcfg))} requests per probe")
    click.echo("\n".join(_header(engine, wcfg, c["settings"], per_probe, load)))
    click.echo(f"SLOs: {', '.join(str(s) for s in slos)}; bisection over the request rate in "
               f"[{c['rates'][0]:g}, {c['rates'][1]:g}] req/s to {c['tol']} (Sarathi-Serve's "
               f"capacity); a probe also fails when saturated (achieved < "
               f"{1 - SATURATION_TOLERANCE:.0%} of offered, or the waiting queue growing) and "
               "stops early once an SLO is broken beyond doubt (docs/capacity.md)")
    if not any(s.metric in ("ttft", "e2el") for s in slos):
        err.print("[yellow]note:[/] no ttft or e2el SLO: queueing delay is not bounded, so a "
                  "token-latency SLO alone can hold far past the rate the engine keeps up with "
                  "(Sarathi-Serve also bounds the median scheduling delay; add e.g. ttft_p50:2s)")


def _capacity_side(o, c, engine, wcfg, native, k, pcts, sinks, err):
    """Setting ``k``'s search: its probes' table as they run, then its capacity."""
    from ..experiments.capacity import WARMUP_SHARE, capacity_search, measure_on_engine

    st, slos = c["settings"][k], c["slos"]

    def measure(rate: float):
        return measure_on_engine(engine, wcfg, native, st, k, rate, slos, percentiles=pcts,
                                 goodput=c["goodput"], sinks=sinks, console=err)

    click.echo(f"\n{k}: {st.describe()}")
    # achieved is held against the arrival rate of the same requests (after the warm-up): a
    # replayed trace gets denser, so "6.97 achieved" beside "6.05 offered" read as a gain
    heads = ["offered req/s", "requests", *[f"{s.key} ms" for s in slos],
             "achieved/offered*", "meets SLOs"]
    widths = [max(15, len(h) + 2) for h in heads]
    click.echo("  " + "".join(f"{h:>{w}}" for h, w in zip(heads, widths))
               + "  why not / notes")

    def show(p) -> None:
        click.echo(_probe_row(p, slos, widths))

    res = capacity_search(measure, slos, *c["rates"], c["tol"], o["max_probes"], on_probe=show)
    click.echo(f"  * the finish rate / the arrival rate of the requests after the first "
               f"{WARMUP_SHARE:.0%} of the arrivals (saturation rule 1, docs/capacity.md)")
    click.echo(f"  Capacity {k}: {res.describe()}")
    return res


def _probe_row(p, slos, widths) -> str:
    """One probe's row of the capacity table."""
    vals = [p.value_text(s.key) for s in slos]  # "> 200": an early stop's bound
    ach = (f"{p.achieved:.3g}/{p.judged_offered:.3g}" if math.isfinite(p.achieved)
           and math.isfinite(p.judged_offered) else
           f"{p.achieved:.3g}" if math.isfinite(p.achieved) else "n/a")
    why = "; ".join([*p.fails, *p.notes])
    m = p.metrics  # the probe's requests: an early stop withdraws the rest (notes)
    n = (f"{m.completed + m.failed + m.withdrawn}" if hasattr(m, "completed")
         else "n/a")
    cells = [f"{p.rate:.3g}", n, *vals, ach, "yes" if p.met else "no"]
    return ("  " + "".join(f"{x:>{w}}" for x, w in zip(cells, widths))
            + (f"  {why}" if why else ""))


# ---- over HTTP (experiments.http): servers gpuchef does not host --------------------------------

#: Hosted-only `ab` options: refused over HTTP, with the reason.
HOSTED_ONLY = {"interleave": "--interleave switches the hosted engine's settings between steps; "
                             "over HTTP each run is a whole load (drop --interleave)",
               "capacity": "--capacity searches the hosted engine's rate; it is not offered "
                           "over HTTP yet (drop --capacity)"}


def _check_http_options(o: dict[str, Any]) -> None:
    """Refuse hosted-only options with the HTTP branch (engine flags, --interleave,
    --capacity, --sample-hz), each by name. Raises ConfigError."""
    from ..client.bench_http import check_http_flags
    from ..experiments.http import split_url

    for k, why in HOSTED_ONLY.items():
        if o.get(k):
            raise ConfigError(why)
    for k in ("window_s", "slo_spec", "rate_lo", "rate_hi", "tolerance", "max_probes"):
        if flag_given(k):
            flag = {"window_s": "--window", "slo_spec": "--slo"}.get(k, "--" + k.replace("_", "-"))
            raise ConfigError(f"{flag} does not apply over HTTP (it is for the hosted engine's "
                              "A/B)")
    # --trace is ours here (the client's requests); the rest of bench's rule holds
    ua, ub = split_url(o["spec_a"], "--a")[0], split_url(o["spec_b"], "--b")[0]
    urls = list(dict.fromkeys(u for u in (o.get("base_url"), ua, ub) if u))
    via = " and ".join(f for f, u in (("--base-url", o.get("base_url")),
                                      ("--a url=/--b url=", ua or ub)) if u)
    check_http_flags({**{k: v for k, v in o.items() if k != "trace_path"},
                      "base_url": ", ".join(urls)}, via=via or "--base-url", servers=urls)


def _http_header(arms, loads, load: str, reps: int) -> list[str]:
    """The lines above the results: the model (one server: one ``Model:`` line; two: each
    side's own, on its ``A:``/``B:`` line with its URL and settings), the load, the A/B load."""
    from ..experiments.ab import run_orders

    pa = loads["A"]
    two = arms["A"].url != arms["B"].url
    desc = (f"Load: {pa.desc}; {len(pa.specs)} requests, seed {pa.wcfg.seed}; prompts as "
            f"{'text' if pa.tok is not None else 'token ids'}")
    sides = [f"{k}: {arms[k].url} — " + (f"model {loads[k].cfg.model} — " if two else "")
             + arms[k].describe() for k in ("A", "B")]
    lines = ([] if two else [f"Model: {pa.cfg.model} (the server's)"]) + [desc, *sides]
    if load == "mirrored":
        lines.append(f"A/B load: mirrored — every request sent to both servers at the same "
                     f"arrival time, {reps} repetition{'s' if reps > 1 else ''}; fair only when "
                     "the servers do not share a GPU (or CPU cores)")
    else:
        order = " | ".join(" ".join(p) for p in run_orders(reps))
        lines.append(f"A/B load: sequential — the whole load to one setting at a time, {reps} "
                     f"repetition{'s' if reps > 1 else ''} of each, order {order}")
    return lines


def _ab_http(o: dict[str, Any], err: Console) -> None:
    """`gpuchef ab` against servers (``experiments.http``): options ``o`` as `ab` parsed them,
    ``err`` a rich Console on stderr. Prints both results blocks side by side, B − A and the
    verdict (stdout), one line per kind of failed request per side (stderr); writes
    ``--result-json`` and ``--trace``. Raises ConfigError for bad input, before any request is
    sent (a refused PATCH later); exits 1 when no request succeeded on a side."""
    from ..experiments.ab import check_repetitions
    from ..experiments.http import comparison, knob_state, parse_arms, prepare_loads
    from ..probes.metrics import parse_goodput, parse_percentiles

    _check_http_options(o)
    arms, load = parse_arms(o)
    check_output_files(o)
    goodput = parse_goodput(" ".join(o["goodput"])) if o["goodput"] else {}
    pcts = parse_percentiles(o["metric_percentiles"])
    reps = check_repetitions(o["repetitions"])
    loads = prepare_loads(o, arms, o["model"] if flag_given("model") else "")
    for arm in arms.values():
        knob_state(arm, o.get("api_key"))
    if arms["A"].setting is not None and arms["B"].setting is not None and \
            arms["A"].url == arms["B"].url and arms["A"].setting.config == arms["B"].setting.config:
        err.print("[yellow]note:[/] A and B are the same setting: an A/A run, whose deltas "
                  "show the run-to-run noise")
    lines = _http_header(arms, loads, load, reps)
    err.print(f"[dim]{len(loads['A'].specs)} requests per run to {escape(arms['A'].url)}"
              f"{'' if arms['A'].url == arms['B'].url else ' and ' + escape(arms['B'].url)} "
              f"({load})[/dim]")
    runs = _http_runs(arms, loads, load, reps, err)
    results, cmp, why = comparison(runs, load, pcts, goodput)
    if o["trace_path"]:
        _http_trace(o["trace_path"], arms, loads, load, reps, pcts, runs, err)
    side = _http_sides(runs, cmp)
    _http_print(lines, arms, cmp, why, side, err)
    if o["result_json"]:
        _http_result_json(o, arms, loads, load, reps, side, results, runs, cmp, why)
    for k in ("A", "B"):
        if not any(x.success for x in side[k]["results"]):
            err.print(f"[bold red]error:[/] no request to {escape(arms[k].url)} ({k}) succeeded "
                      "(see the lines above)")
            sys.exit(1)


def _http_runs(arms, loads, load: str, reps: int, err: Console) -> list:
    """The runs (``experiments.http.run_ab``), a line on stderr as each ends; each side's
    setting PATCHed first (a refused value: before any request), the servers' knobs put back as
    they were found at the end. Ctrl-C: no results, exit 130."""
    from ..experiments.http import apply, patch_body, run_ab
    from ..probes.metrics import is_probe_id

    def done(r) -> str:
        # the load's requests only, as the results block counts them (probes named apart)
        mine = [x for x in r.run.results if not is_probe_id(x.request_id)]
        bad = sum(1 for x in mine if not x.success)
        probes = len(r.run.results) - len(mine)
        return (f"{len(mine)} requests in {r.run.duration_s:.1f} s"
                f"{f', {bad} failed' if bad else ''}{f' (+{probes} probes)' if probes else ''}")

    pending: list = []

    def on_run(i: int, total: int, r) -> None:
        if load != "mirrored":
            err.print(f"[dim]run {i}/{total}: {r.label} ({escape(arms[r.label].describe())}) "
                      f"repetition {r.rep}: {done(r)}[/dim]", highlight=False)
            return
        # one run per repetition, both servers at once: one line when both sides are in
        pending.append(r)
        if len(pending) == 2:
            sides = "; ".join(f"{x.label} {done(x)}" for x in pending)
            err.print(f"[dim]repetition {r.rep}/{reps}: A and B at once (mirrored): "
                      f"{sides}[/dim]", highlight=False)
            pending.clear()

    try:
        for arm in arms.values():  # a value the server refuses: refused before any request
            apply(arm)
        return run_ab(load, arms, loads, reps, on_run)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/] the A/B was stopped; no results")
        sys.exit(130)
    finally:
        for arm in arms.values():  # the server as it was found
            if arm.initial is not None and arm.server is not None:
                try:
                    arm.server.patch(patch_body(arm.initial))
                except ConfigError as e:
                    err.print(f"[yellow]note:[/] {escape(arm.url)}'s knobs not restored: "
                              f"{escape(str(e))}")


def _http_trace(path: str, arms, loads, load: str, reps: int, pcts, runs, err: Console) -> None:
    """``--trace``: the runs' marks and each side's requests as the client saw them."""
    from ..experiments.http import marks, trace_meta
    from ..probes.recorder import TraceRecorder

    rec = TraceRecorder(path, meta=trace_meta(arms, loads, load, reps, pcts))
    for ev in marks(runs, load):
        rec.record(ev)
    for r in runs:
        for q in r.records:
            rec.record(q)
    rec.close()
    err.print(f"[dim]trace: {escape(path)} (request ids "
              f"{'A/…#n and B/…#n' if load == 'mirrored' else '…#n'}: repetition n)[/dim]")


def _http_sides(runs, cmp) -> dict[str, Any]:
    """Each side's results: its ClientResults, lateness, peaks, pooled metrics and runs."""
    from ..client.http_load import lateness_stats, peak_stats

    side: dict[str, Any] = {}
    for k in ("A", "B"):
        mine = [r for r in runs if r.label == k]
        allres = [x for r in mine for x in r.run.results]
        peak_tok, peak_conc = peak_stats([x for x in allres if not x.is_probe])
        side[k] = dict(results=allres, late=lateness_stats(allres), peak=(peak_tok, peak_conc),
                       metrics=cmp.pooled[k] if cmp is not None else None, runs=mine)
    return side


def _http_print(lines: list[str], arms, cmp, why: str, side, err: Console) -> None:
    """The header, both results blocks side by side and B − A (or why there is no
    comparison) on stdout; each side's failed requests, one line per kind, on stderr."""
    from ..client.http_load import error_lines
    from ..experiments.ab_text import format_deltas, side_by_side
    from ..probes.metrics import format_results_block

    click.echo("\n".join(lines))
    if cmp is not None:
        blocks = {}
        for k in ("A", "B"):
            s, arm = side[k], arms[k]
            extra = {"Runs pooled:": str(cmp.count(k)),
                     "Client lateness p99 (ms):": f"{s['late']['p99']:.2f}"}
            if arm.setting is not None:
                extra["max_num_batched_tokens:"] = str(arm.setting.config.max_num_batched_tokens)
                extra["Mode:"] = arm.setting.config.mode
            blocks[k] = format_results_block(s["metrics"], extra=extra)
        click.echo(side_by_side(blocks["A"], blocks["B"], "A/B Serving Benchmark Result"))
        click.echo(format_deltas(cmp, "repetition"))
    else:
        click.echo(why)
    for k in ("A", "B"):
        for line in error_lines(side[k]["results"]):
            err.print(f"[yellow]failed ({k}, {escape(arms[k].url)}):[/] {escape(line)}")


def _http_result_json(o, arms, loads, load: str, reps: int, side, results, runs, cmp,
                      why: str) -> None:
    """``--result-json`` of an A/B over HTTP: each side's results as `bench --base-url` writes
    them, every run, and the comparison."""
    from ..client.bench_http import result_json
    from ..client.http_load import HttpLoadRun, error_counts, result_arrays

    out: dict[str, Any] = {
        "command": "ab", "ab_load": load, "repetitions": reps,
        "servers": {k: a.url for k, a in arms.items()},
        "settings": {k: {"spec": a.spec, "url": a.url,
                         "changes": a.setting.changes if a.setting else {},
                         "scheduler": a.setting.config.as_dict() if a.setting else None}
                     for k, a in arms.items()},
        "results": {}, "runs": [], "comparison": None, "no_comparison_why": why or None,
    }
    for k in ("A", "B"):
        s = side[k]
        if s["metrics"] is None:
            continue
        t0 = min(r.run.t0_ns for r in s["runs"])
        hr = HttpLoadRun(s["results"], t0, s["metrics"].duration_s,
                         [e for r in s["runs"] for e in r.run.rps_change_events])
        out["results"][k] = result_json(
            s["metrics"], hr, loads[k].cfg, loads[k].wcfg, o, loads[k].tok is not None,
            loads[k].ramp, s["late"], *s["peak"], error_counts(s["results"]),
            result_arrays(s["results"]))
    for w in results:
        out["runs"].append({"label": w.label, "rep": w.rep, "duration_s": w.duration_s,
                            "counted": w.counted, "not_counted_why": w.why or None,
                            "metrics": w.metrics.to_dict(empty_as_zero=True)
                            if w.metrics else None,
                            "error_counts": error_counts(next(
                                (r.run.results for r in runs
                                 if r.label == w.label and r.rep == w.rep), []))})
    if cmp is not None:
        out["comparison"] = {"min_pairs": cmp.min_pairs,
                             "deltas": [r.as_dict() for r in cmp.rows],
                             "requests": cmp.requests_dict()}
    write_json(o["result_json"], out, "--result-json")
