"""The one module of flag helpers the commands share: the click options of `bench`, `top`, `ab`,
`serve` and `replay` with vLLM's flag spellings, and the functions that check them and turn them
into engine and workload configs. Commands import this module and no other command."""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import click

from ..engine_host.attention import DECODE_ATTENTION
from ..engine_host.vocab.config import (AUTO_BUDGET, CUDAGRAPH_MODES, KNOBS, MODES,
                                        PIECEWISE_CAPTURE_SIZES, SETTINGS, CacheConfig,
                                        parse_capture_sizes, EngineConfig, SchedulerConfig,
                                        parse_auto_budget)
from ..engine_host.vocab.errors import ConfigError
from ..serve.server import DEFAULT_MAX_BODY_MB, DEFAULT_MAX_CONCURRENT


def _opts(*decorators: Callable) -> Callable:
    def apply(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


class _CudagraphMode(click.Choice):
    """click.Choice, with vLLM's ``NONE`` pointed at ``--enforce-eager`` (the native engine's
    spelling of no graphs at all) when refused."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.upper() == "NONE":
            self.fail(f"{value!r} is not one of {', '.join(map(repr, self.choices))} (vLLM's "
                      "NONE, no graphs at all, is --enforce-eager here)", param, ctx)
        return super().convert(value, param, ctx)


engine_options = _opts(
    click.option("--engine", default="native", show_default=True,
                 type=click.Choice(["native", "vllm"]),
                 help="native: gpuchef's own engine. vllm: vLLM's V1 engine core hosted in this "
                      "process (pip install 'gpuchef[vllm]'; CUDA only), same records, knobs "
                      "and modes."),
    click.option("--tensor-parallel-size", default=1, show_default=True, type=int,
                 help="GPUs for --engine vllm (tensor parallelism); the native engine uses one."),
    click.option("--model", default="tiny", show_default=True,
                 help="A preset (tiny, llama-3-8b, llama-3.1-8b, qwen2.5-7b, mistral-7b: random "
                      "weights of the real shapes) or a local Hugging Face folder "
                      "(config.json + *.safetensors)."),
    click.option("--device", default="auto", show_default=True,
                 help="auto (cuda if available, else cpu), cpu, cuda or cuda:N."),
    click.option("--dtype", default="auto", show_default=True,
                 help="auto (bfloat16 on CUDA, float32 on CPU), float32, float64, bfloat16, float16."),
    click.option("--seed", default=0, show_default=True, type=int,
                 help="Seed for random weights, prompt token ids, arrivals and sampling."),
    click.option("--max-model-len", default=None, type=int,
                 help="Context length (prompt + output, tokens). Default: the model's, capped at "
                      "8192. Longer requests are clipped to fit (prompt first, then output; a "
                      "warning says how many)."),
    click.option("--attention-backend", default="auto", show_default=True,
                 type=click.Choice(["auto", "reference", "flashinfer"]),
                 help="auto = flashinfer on CUDA when it imports, else the PyTorch reference."),
    click.option("--decode-attention", default="auto", show_default=True,
                 type=click.Choice(list(DECODE_ATTENTION)),
                 help="Native engine on FlashInfer: the kernel for decode rows. auto = "
                      "FlashInfer's decode wrapper; xqa = TensorRT-LLM's XQA decode kernel as "
                      "FlashInfer ships it (SM90+, block size 16/32/64/128)."),
    click.option("--enforce-eager", is_flag=True,
                 help="No CUDA graphs (CUDA only; elsewhere a warning says it has no effect)."),
    click.option("--cudagraph-mode", default=CUDAGRAPH_MODES[0], show_default=True,
                 type=_CudagraphMode(list(CUDAGRAPH_MODES)),
                 help="Native engine on CUDA (vLLM's compilation-config cudagraph_mode): "
                      "FULL_AND_PIECEWISE also runs steps with prefill tokens through CUDA "
                      "graphs split at attention (docs/engine-graphs.md); FULL_DECODE_ONLY "
                      "graphs decode-only steps only."),
    click.option("--cudagraph-capture-sizes", default=None, metavar="N,N,...",
                 help="Native engine: the padded token counts of the piecewise graphs (vLLM's "
                      "cudagraph_capture_sizes); steps above the largest run eagerly. Default: "
                      f"{','.join(map(str, PIECEWISE_CAPTURE_SIZES))}."),
    click.option("--async-scheduling/--no-async-scheduling", "async_scheduling", default=None,
                 help="Schedule and launch step N+1 while step N runs on the GPU, hiding the "
                      "host's per-step work (vLLM's --async-scheduling); same tokens. Default: "
                      "on for CUDA, off for CPU (nothing to overlap); vLLM: its own default."),
    click.option("--block-size", default=16, show_default=True, type=int,
                 help="KV cache page size in tokens (start-up only)."),
    click.option("--num-gpu-blocks", "--num-gpu-blocks-override", "num_gpu_blocks",
                 default=None, type=int,
                 help="KV cache size in blocks (overrides the memory-based sizing; "
                      "--num-gpu-blocks-override is vLLM's spelling)."),
    click.option("--kv-cache-memory", "kv_cache_memory_gb", default=None, type=float,
                 help="KV cache size in GiB. Default: from --gpu-memory-utilization on CUDA, "
                      "4096 blocks on CPU."),
    click.option("--gpu-memory-utilization", default=0.9, show_default=True, type=float,
                 help="Fraction of GPU memory the engine may use (weights + KV cache)."),
)

scheduler_options = _opts(
    click.option(SETTINGS["mode"].flag, default=SchedulerConfig().mode, show_default=True,
                 type=click.Choice(list(MODES)),
                 help="continuous: prefill-first, whole prompts, no decodes in a step that "
                      "prefills (vLLM V0 default). chunked: stall-free, every decode first, then "
                      "prefill chunks within the token budget (Sarathi-Serve, vLLM V1)."),
    *(click.option(spec.flag, default=getattr(SchedulerConfig(), name), show_default=True,
                   type=int, help=f"{spec.help[:1].upper()}{spec.help[1:]}.")
      for name, spec in KNOBS.items()),
    click.option(SETTINGS[AUTO_BUDGET].flag, AUTO_BUDGET, default=None, metavar="TARGETS",
                 help="The autopilot (chunked mode): pick each step's prefill tokens within "
                      "--max-num-batched-tokens to keep the step time under an ITL target, "
                      "more when a TTFT target is at risk, e.g. itl_p99:50ms,ttft_p99:2s "
                      "(docs/autopilot.md). Default: off."),
)

workload_options = _opts(
    click.option("--dataset", default="random", show_default=True,
                 help="random, azure-conv (the bundled Azure LLM inference trace 2023, "
                      "conversation), a path to a CSV with TIMESTAMP,ContextTokens,GeneratedTokens, "
                      "or a workload that shifts: a phase list in a .yaml file or a bundled one "
                      "(conv_long_burst, diurnal, long_mix; docs/workloads.md), time-scaled by "
                      "--trace-speed."),
    click.option("--request-rate", default="inf",
                 help="Requests per second for random arrivals (inf = all at once). Ignored "
                      "when replaying a trace: use --trace-speed. Default: inf (bench, ab); "
                      "top sends its load live and refuses inf: there the default is 2 req/s "
                      "on a CPU, 10 on a GPU or with --attach."),
    click.option("--burstiness", default=1.0, show_default=True, type=float,
                 help="Gamma shape of inter-arrival times (1 = Poisson; lower = burstier)."),
    click.option("--arrival", default="poisson", show_default=True,
                 type=click.Choice(["poisson", "constant"]),
                 help="Random arrivals: gamma/Poisson or constant spacing 1/rate."),
    click.option("--input-len", default=1024, show_default=True, type=int,
                 help="Random dataset: prompt length (tokens)."),
    click.option("--output-len", default=128, show_default=True, type=int,
                 help="Random dataset: forced output length (tokens)."),
    click.option("--range-ratio", default=0.0, show_default=True, type=float,
                 help="Random dataset: lengths uniform in [len·(1−r), len·(1+r)]."),
    click.option("--num-prompts", default=None, type=int,
                 help="Number of requests (random default: 100; trace default: the whole file "
                      "unless --duration)."),
    click.option("--duration", "duration_s", default=None, type=float,
                 help="Send requests for this many seconds of the arrival schedule."),
    click.option("--trace-speed", default=1.0, show_default=True, type=float,
                 help="Trace replay time scale: 2 = twice as fast, inf = all at once (offline)."),
    click.option("--max-input-len", default=None, type=int,
                 help="Clip trace prompt lengths to this many tokens (small machines)."),
    click.option("--max-output-len", default=None, type=int,
                 help="Clip forced output lengths to this many tokens."),
    click.option("--probe-interval", "probe_interval_s", default=None, type=float,
                 help="Send a probe request (short prompt, one output token) every N s; its "
                      "latency is the stall a new request sees. Probes run up to the load's "
                      "last arrival (or --duration): --request-rate inf sends none."),
)

# `vllm bench serve`'s spellings; docs/http-load.md; gpuchef/client/http_load.py
_HTTP_BASE = (
    click.option("--base-url", default=None, metavar="URL",
                 help="Send the load as streaming HTTP requests to this OpenAI-compatible server "
                      "(vLLM, SGLang, gpuchef serve) instead of a hosted engine; --model is the "
                      "name sent (default: the server's first model)."),
)
def _http_client(via: str) -> tuple:
    """The HTTP load client's flags; ``via`` says what turns them on in the command (bench and
    ab: --base-url, ab's url= settings too; top: --attach), so that --help names a flag the
    command has."""
    return (
        click.option("--endpoint", default="/v1/completions", show_default=True,
                     type=click.Choice(["/v1/completions", "/v1/chat/completions"]),
                     help=f"With {via}: the API; chat needs --tokenizer (it sends text)."),
        click.option("--max-concurrency", default=None, type=int,
                     help=f"With {via}: at most this many requests in flight (later arrivals "
                          "wait in the client; probes bypass it)."),
        click.option("--ramp-up-strategy", default=None,
                     type=click.Choice(["linear", "exponential"]),
                     help=f"With {via}, random dataset: ramp the request rate from "
                          "--ramp-up-start-rps to --ramp-up-end-rps over the requests."),
        click.option("--ramp-up-start-rps", default=None, type=int,
                     help="Ramp-up start rate (req/s)."),
        click.option("--ramp-up-end-rps", default=None, type=int, help="Ramp-up end rate (req/s)."),
        click.option("--vocab-size", default=None, type=int,
                     help=f"With {via}: vocabulary size for token-id prompts (default: the "
                          "tokenizer's, else the server's /v1/models when it says)."),
        click.option("--request-timeout", default=600.0, show_default=True, type=float,
                     help=f"With {via}: seconds a request may take, end to end."),
        click.option("--temperature", default=None, type=float,
                     help=f"With {via}: sent with every request (default 0: greedy, as vllm "
                          "bench serve sends it; a server's own default is 1)."),
        click.option("--top-p", default=None, type=float,
                     help=f"With {via}: top_p sent with every request (default: not sent)."),
        click.option("--top-k", default=None, type=int,
                     help=f"With {via}: top_k sent with every request (default: not sent)."),
    )


_HTTP_AUTH = (
    click.option("--api-key", default=None,
                 help="With --base-url: Bearer token (default: $OPENAI_API_KEY)."),
    click.option("--tokenizer", default=None, type=click.Path(),
                 help="With --base-url: a local tokenizer.json (or a model folder holding one); "
                      "prompts are then sent as text of the load's lengths."),
)
http_load_options = _opts(*_HTTP_BASE, *_http_client("--base-url (ab: or --a/--b url=URL)"),
                          *_HTTP_AUTH)
#: `top --attach`'s load flags: --api-key and --tokenizer come with top's --serve options
http_client_options = _opts(*_http_client("--attach"))


def _auto_budget(o: dict[str, Any]) -> str:
    """``--auto-budget`` in its canonical form ("" = off), parsed here so that a bad value's
    message names the flag (SchedulerConfig would name the knob, auto_budget)."""
    v = o.get(AUTO_BUDGET)
    spec = parse_auto_budget(v) if v else None
    return "" if spec is None else spec.canonical


def flag_given(name: str) -> bool:
    """Whether option ``name`` (click's parameter name) was set on the current command line or
    from the environment; False outside a click command."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or name not in ctx.params:
        return False
    src = ctx.get_parameter_source(name)
    return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")


def flag_name(name: str) -> str:
    """The flag spelling of option ``name`` in the current click command (its longest
    opt), else ``--`` + the name with dashes."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        for p in ctx.command.params:
            if p.name == name and getattr(p, "opts", None):
                return max(p.opts, key=len)
    return "--" + name.replace("_", "-")


#: the graph flags and their defaults (a value other than the default counts as given when no
#: click command is running, e.g. a benchmark script calling engine_config)
_GRAPH_FLAGS = {"enforce_eager": False, "cudagraph_mode": CUDAGRAPH_MODES[0],
                "cudagraph_capture_sizes": None}


def graph_flags_warning(o: dict[str, Any], cfg: EngineConfig) -> str | None:
    """One line naming the graph flags given (``--enforce-eager``, ``--cudagraph-mode``,
    ``--cudagraph-capture-sizes``) that cannot change this run, and why, or None. The native
    engine captures CUDA graphs only on CUDA with FlashInfer attention and without
    ``--enforce-eager`` (``LLMEngine._warm_up``): on the CPU all three do nothing, with
    ``--attention-backend reference`` too, and with ``--enforce-eager`` the other two. A warning,
    not an error: scripts share flags between machines. Raises ConfigError for a bad
    ``--device`` (``engine.resolve_device``)."""
    from ..engine_host.engine import resolve_device

    if cfg.engine != "native":
        return None  # vLLM: --enforce-eager is its own; the other two are refused by EngineConfig
    given = [k for k, default in _GRAPH_FLAGS.items()
             if flag_given(k) or (click.get_current_context(silent=True) is None
                                  and o.get(k) not in (None, default))]
    if not given:
        return None
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        return (f"{_flags_have(given)} no effect on {device.type}: CUDA graphs are CUDA "
                "only (every step runs eagerly)")
    if cfg.attention_backend == "reference":
        return (f"{_flags_have(given)} no effect with --attention-backend reference: "
                "the native engine's CUDA graphs need FlashInfer attention (every step runs "
                "eagerly)")
    rest = [k for k in given if k != "enforce_eager"]
    if cfg.enforce_eager and rest:
        return (f"{_flags_have(rest)} no effect with --enforce-eager: no CUDA graphs "
                "are captured")
    return None


def decode_attention_warning(cfg: EngineConfig) -> str | None:
    """One line when ``--decode-attention`` names a kernel this run cannot use (the CPU, or
    ``--attention-backend reference``: decode rows run on the PyTorch reference), else None.
    Raises ConfigError for a bad ``--device``."""
    from ..engine_host.engine import resolve_device

    if cfg.engine != "native" or cfg.decode_attention == "auto":
        return None
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        where = f"on {device.type}"
    elif cfg.attention_backend == "reference":
        where = "with --attention-backend reference"
    else:
        return None
    return (f"--decode-attention {cfg.decode_attention} has no effect {where}: decode rows run "
            "on the PyTorch reference attention")


def _flags_have(names: list[str]) -> str:
    return ", ".join(flag_name(k) for k in names) + (" has" if len(names) == 1 else " have")


def engine_config(o: dict[str, Any], warn: Callable[[str], None] | None = None) -> EngineConfig:
    """EngineConfig from the parsed options. Raises ConfigError for a value out of range.
    Graph flags and a decode kernel that cannot change this run (``graph_flags_warning``,
    ``decode_attention_warning``) get one line each to ``warn``
    (default: ``warning: ...`` on stderr); the run goes on."""
    cfg = _engine_config(o)
    for msg in (graph_flags_warning(o, cfg), decode_attention_warning(cfg)):
        if msg:
            (warn or print_warning)(msg)
    return cfg


def _engine_config(o: dict[str, Any]) -> EngineConfig:
    return EngineConfig(
        model=o["model"], device=o["device"], dtype=o["dtype"], seed=o["seed"],
        max_model_len=o["max_model_len"], attention_backend=o["attention_backend"],
        enforce_eager=o["enforce_eager"],
        decode_attention=o.get("decode_attention") or "auto",
        async_scheduling=o.get("async_scheduling"),
        cudagraph_mode=o.get("cudagraph_mode") or CUDAGRAPH_MODES[0],
        cudagraph_capture_sizes=parse_capture_sizes(o.get("cudagraph_capture_sizes")),
        cache=CacheConfig(block_size=o["block_size"], num_gpu_blocks=o["num_gpu_blocks"],
                          kv_cache_memory_gb=o["kv_cache_memory_gb"],
                          gpu_memory_utilization=o["gpu_memory_utilization"]),
        scheduler=SchedulerConfig(
            mode=o["mode"], **{k: o[k] for k in KNOBS if o.get(k) is not None},
            auto_budget=_auto_budget(o)),
        engine=o.get("engine", "native"),
        tensor_parallel_size=o.get("tensor_parallel_size", 1),
    )


def workload_config(o: dict[str, Any], *, vocab_size: int, max_model_len: int | None,
                    warn: Callable[[str], None] | None = None, limit_from: str = "the model's"):
    """WorkloadConfig from the parsed options, sized to the model. Raises ConfigError, also for
    a trace file that cannot be read or parsed (so that calling it with ``max_model_len=None``
    before the model loads refuses a bad load early).

    When ``max_model_len`` shortens requests, one line says how many, to ``warn`` (default:
    ``warning: ...`` on stderr); ``limit_from`` names whose limit it is when ``--max-model-len``
    was not given (the hosted model's; over HTTP the server's)."""
    from ..engine_host.vocab.workload import WorkloadConfig, clip_stats

    try:
        rate = float(o["request_rate"])
    except ValueError:
        raise ConfigError(f"--request-rate {o['request_rate']!r} must be a number > 0 or inf") from None
    num_prompts = o["num_prompts"]
    if num_prompts is None and o["duration_s"] is None and o["dataset"] == "random":
        num_prompts = 100
    wcfg = WorkloadConfig(
        dataset=o["dataset"], request_rate=rate if not math.isnan(rate) else rate,
        burstiness=o["burstiness"], arrival=o["arrival"], input_len=o["input_len"],
        output_len=o["output_len"], range_ratio=o["range_ratio"], num_prompts=num_prompts,
        duration_s=o["duration_s"], trace_speed=o["trace_speed"],
        max_input_len=o["max_input_len"], max_output_len=o["max_output_len"],
        max_model_len=max_model_len, vocab_size=vocab_size, seed=o["seed"],
        probe_interval_s=o["probe_interval_s"])
    stats = clip_stats(wcfg)  # reads a trace file through: a bad one fails here
    if stats.any:
        (warn or print_warning)(clip_warning(stats, given=o.get("max_model_len") is not None,
                                             limit_from=limit_from))
    return wcfg


#: random-load flags a trace replay does not read (``workload.generate``: a trace brings its
#: own arrival times and lengths)
_RANDOM_ONLY_FLAGS = ("request_rate", "burstiness", "arrival", "input_len", "output_len",
                      "range_ratio")


def trace_flags_warning(o: dict[str, Any]) -> str | None:
    """One line naming the random-load flags given on the command line (``--request-rate``,
    ``--burstiness``, ``--arrival``, ``--input-len``, ``--output-len``, ``--range-ratio``) that a
    trace replay (``--dataset`` other than random) ignores, or None. A warning, not an error:
    vLLM's own bench ignores them the same way."""
    if o.get("dataset", "random") == "random":
        return None
    given = [k for k in _RANDOM_ONLY_FLAGS if flag_given(k)]
    if not given:
        return None
    from ..engine_host.vocab.phases import is_workload

    what = "its phases bring their" if is_workload(o["dataset"]) else "a trace brings its"
    return (f"{_flags_have(given)} no effect with --dataset {o['dataset']}: {what} "
            "own arrival times and lengths (--trace-speed scales the times)")


def engine_load(o: dict[str, Any], engine: Any) -> tuple[Any, list]:
    """The load for a hosted ``engine``: its ``WorkloadConfig`` (the engine's vocabulary and
    context length) and the generated RequestSpecs, with :func:`probe_warning`'s line printed.
    Raises ConfigError for an empty load."""
    from ..engine_host.vocab.workload import generate

    wcfg = workload_config(o, vocab_size=engine.model_config.vocab_size,
                           max_model_len=engine.max_model_len)
    specs = generate(wcfg)
    if not specs:
        raise ConfigError("the workload is empty: raise --num-prompts or --duration")
    if (w := probe_warning(o, specs)):
        print_warning(w)
    return wcfg, specs


def probe_warning(o: dict[str, Any], specs: Any) -> str | None:
    """One line when ``--probe-interval`` was given but the load ``specs`` (workload
    RequestSpecs) hold no probe request, or None: probes arrive every interval up to the load's
    last arrival (``engine_host.vocab.workload.generate``), which ``--request-rate inf`` puts at 0 s.
    A warning: the run goes on without probes."""
    iv = o.get("probe_interval_s")
    if iv is None or any(getattr(s, "is_probe", False) for s in specs):
        return None
    last = max((s.arrival_s for s in specs), default=0.0)
    try:
        burst = o.get("dataset", "random") == "random" and math.isinf(float(o["request_rate"]))
    except (KeyError, TypeError, ValueError):
        burst = False
    why = ("--request-rate inf sends every request at 0 s" if last == 0 and burst
           else f"the last arrival is at {last:.3g} s")
    return (f"--probe-interval {iv:g} sends no probe: probes arrive every {iv:g} s up to the "
            f"load's last arrival ({why}); give --duration, a finite --request-rate or a "
            "shorter --probe-interval")


def print_warning(msg: str) -> None:
    """``warning: MSG`` on stderr (the run goes on)."""
    click.echo(f"warning: {msg}", err=True)


def clip_warning(stats: Any, *, given: bool, limit_from: str = "the model's") -> str:
    """One line saying what ``max_model_len`` cut from the load (``workload.ClipStats``);
    ``limit_from``: whose limit it is when not ``given`` as ``--max-model-len``."""
    name = f"--max-model-len {stats.max_model_len}" if given else \
        f"max_model_len {stats.max_model_len} ({limit_from})"
    parts = []
    if stats.prompts:
        parts.append(f"{stats.prompts} of {stats.requests} prompts (to <= {stats.prompt_max} "
                     f"token{'s' if stats.prompt_max != 1 else ''})")
    if stats.outputs:
        parts.append(f"{stats.outputs} of {stats.requests} outputs (to <= {stats.output_max} "
                     f"token{'s' if stats.output_max != 1 else ''})")
    return (f"{name} clipped {' and '.join(parts)} so that prompt + output fits; raise it "
            "or shorten the load (--max-input-len, --max-output-len)")


def check_output_path(path: str | None, flag: str) -> None:
    """The one check of every output-path flag (``--trace``, ``--result-json``, ``--json``,
    ``report -o``), before any work: a missing parent folder is created (as ``vllm bench
    serve --result-dir`` does); a path that is a folder, whose parent is a file, or where no
    file can be created (tried: the file is opened for append, and removed again if it was not
    there) is refused. Raises ConfigError naming the flag and the path."""
    import os
    from pathlib import Path

    if not path:
        return
    p = Path(path).expanduser()
    if p.is_dir():
        raise ConfigError(f"{flag} {path!r} is a folder: give a file path")
    _make_folder(p.parent, path, flag)
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {path!r}: cannot write a file there "
                          f"({e.strerror or e})") from None
    if not existed:
        try:
            os.unlink(p)
        except OSError:
            pass


def _make_folder(folder, path: str, flag: str) -> None:
    """Create ``folder`` (a Path) and its missing parents for the output ``path`` of ``flag``;
    refuse one under a file. Raises ConfigError naming the flag and the path."""
    up = folder
    while not up.exists() and up != up.parent:  # the nearest folder that exists, or a file
        up = up.parent
    if up.exists() and not up.is_dir():
        raise ConfigError(f"{flag} {path!r}: {str(up)!r} is a file, not a folder")
    if not folder.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{flag} {path!r}: cannot create folder {str(folder)!r} "
                              f"({e.strerror or e})") from None


def check_output_dir(path: str, flag: str) -> str:
    """The output-folder twin of :func:`check_output_path` (``--screenshot-dir``), before any
    work: ``~`` expanded, a missing folder created with its parents; a path that is a file, one
    under a file, or a folder where no file can be created (tried with a temporary file) is
    refused. Returns the expanded path. Raises ConfigError naming the flag and the path."""
    import tempfile
    from pathlib import Path

    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {path!r} is a file: give a folder")
    _make_folder(p, path, flag)
    try:
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {path!r}: cannot write a file there "
                          f"({e.strerror or e})") from None
    return str(p)


def check_output_files(o: dict) -> None:
    """For any command's options ``o`` (keys ``trace_path``, ``result_json``, ``dataset``, each
    optional): expand ``~`` in ``--trace`` / ``--result-json`` (the shell leaves
    ``--trace=~/t.jsonl`` alone; the check and the writer must see the same file) and refuse a
    folder-style path, one file named twice (the results would overwrite the trace) or an output
    that is the ``--dataset`` CSV (it would be overwritten after it was read); then each goes
    through :func:`check_output_path`. Raises ConfigError."""
    import os

    outs = []
    for key, flag in (("trace_path", "--trace"), ("result_json", "--result-json")):
        v = o.get(key)
        if not v:
            continue
        if v.endswith(("/", os.sep)):
            raise ConfigError(f"{flag} {v!r} ends in '/': give a file path, e.g. "
                              f"{os.path.join(v, 'run.jsonl' if key == 'trace_path' else 'r.json')!r}")
        o[key] = os.path.expanduser(v)
        outs.append((flag, o[key]))
    ds = os.path.expanduser(o.get("dataset") or "")
    ins = [("--dataset", ds)] if os.path.isfile(ds) else []

    def same(a: str, b: str) -> bool:
        return os.path.abspath(a) == os.path.abspath(b) or (
            os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))

    for i, (fa, a) in enumerate(outs):
        for fb, b in outs[i + 1:] + ins:
            if same(a, b):
                what = ("the results would overwrite the trace" if fb == "--result-json" else
                        f"{fa} would overwrite the dataset it reads")
                raise ConfigError(f"{fa} {a!r} and {fb} {b!r} are the same file: {what}; "
                                  "give another path")
    for flag, path in outs:  # missing folders made, a folder or unwritable place refused
        check_output_path(path, flag)


def write_json(path: str, data: Any, flag: str) -> None:
    """Write ``data`` as indented JSON to ``path``. Raises ConfigError naming ``flag`` when
    it cannot (``check_output_path`` refuses most such paths before the run)."""
    import json

    from pathlib import Path

    try:
        with open(Path(path).expanduser(), "w") as f:  # ~ as check_output_path reads it
            json.dump(data, f, indent=2)
    except OSError as e:
        raise ConfigError(f"{flag} {path!r}: cannot write ({e.strerror or e})") from None


def check_sampling(sample_hz: float, gpus: str | None, *, allow_off: bool = True):
    """``(sample_hz, gpu indices or None)`` from ``--sample-hz`` and ``--gpus``, checked with the
    functions `gpuchef top` uses. ``allow_off``: 0 turns the NVML sampler off (bench, ab).
    Raises ConfigError naming the value and what is allowed."""
    from ..probes.sampler import check_sample_hz
    from ..probes.nvml import SAMPLE_HZ_RANGE, parse_gpus

    if not (allow_off and sample_hz == 0):
        try:
            sample_hz = check_sample_hz(sample_hz, *SAMPLE_HZ_RANGE, flag="--sample-hz")
        except ConfigError:
            if not allow_off:
                raise
            lo, hi = SAMPLE_HZ_RANGE
            raise ConfigError(f"--sample-hz {sample_hz:g} is out of range: allowed 0 (off) or "
                              f"[{lo:g}, {hi:g}] Hz") from None
    return sample_hz, (parse_gpus(gpus) if gpus else None)


def runs_async(engine: Any) -> bool:
    """Whether ``engine`` schedules step N+1 while step N runs: ``--async-scheduling``, or for
    vLLM its own default (the engine's ``async_scheduling`` attribute)."""
    return bool(engine.async_scheduling)


def scheduling_desc(engine: Any) -> str:
    """The results-block ``Scheduling:`` value."""
    if not runs_async(engine):
        return "sync"
    if engine.device.type == "cpu":
        return "async (step N+1 launched while N runs; no overlap to gain on CPU: it runs the work in launch)"
    return "async (step N+1 launched while N runs)"



def run_config(ecfg: EngineConfig, engine: Any) -> dict[str, Any]:
    """The ``config`` section of a headless command's ``--result-json``: what the engine ran
    with, beyond the scheduler knobs."""
    return {"engine": ecfg.engine, "device": str(engine.device),
            "attention_backend": engine.attn.name, "dtype": str(engine.dtype).replace("torch.", ""),
            "decode_attention": getattr(engine, "decode_attention", None),
            "kernels": getattr(engine, "kernels", None),
            "max_model_len": engine.max_model_len, "enforce_eager": ecfg.enforce_eager,
            "cudagraph_mode": ecfg.cudagraph_mode,
            "async_scheduling": runs_async(engine),
            "scheduling": "async" if runs_async(engine) else "sync",
            "kv_blocks": engine.num_blocks, "block_size": engine.kv.block_size}


# ---- the dashboards' flags (top, replay) and the front door's (serve, top --serve) ----------

def check_screenshot_dir(path: str) -> str:
    """``--screenshot-dir``, before any work: a missing folder is created, as the output-file
    flags' parents are (:func:`check_output_dir`); a file, or a folder this process cannot
    write into, is refused (``s`` would fail later, mid-session). Returns the path with ``~``
    expanded. Raises ConfigError naming the path."""
    return check_output_dir(path, "--screenshot-dir")


def parse_duration(text: str, flag: str, lo_s: float, hi_s: float) -> float:
    """"10s", "10m", "2h", or seconds ("90") → seconds in [``lo_s``, ``hi_s``]. Raises
    ConfigError naming ``flag``, the value and what is allowed."""
    s = str(text).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(s|m|min|h)?", s)
    if not m:
        raise ConfigError(f"{flag} {text!r} is not a duration: use e.g. 10s, 10m, 2h or "
                          "seconds")
    v = float(m.group(1)) * {"m": 60, "min": 60, "h": 3600}.get(m.group(2) or "s", 1)
    if not lo_s <= v <= hi_s:
        raise ConfigError(f"{flag} {text!r} is out of range: allowed [{_dur(lo_s)}, "
                          f"{_dur(hi_s)}]")
    return v


def _dur(v: float) -> str:
    return f"{v / 3600:g} h" if v >= 7200 else f"{v / 60:g} min" if v >= 120 else f"{v:g} s"


def parse_window(text: str) -> float:
    """"10s", "60s", "10m", or seconds ("90") → seconds in [1, 3600]. Raises ConfigError."""
    return parse_duration(text, "--window", 1, 3600)


serve_options = _opts(
    click.option("--host", "http_host", default="127.0.0.1", show_default=True,
                 help="Address to listen on. The default is loopback only: give 0.0.0.0 (or an "
                      "address of this machine) to accept other machines."),
    click.option("--port", default=8000, show_default=True, type=int,
                 help="TCP port (0 = any free port; the URL is printed)."),
    click.option("--api-key", default=None, envvar="GPUCHEF_API_KEY", show_envvar=True,
                 help="Require 'Authorization: Bearer KEY' on /v1 and /gpuchef routes."),
    click.option("--served-model-name", default=None,
                 help="The model name clients send and /v1/models lists (default: --model)."),
    click.option("--tokenizer", default=None,
                 help="A local tokenizer (folder with tokenizer.json, or the file) for text "
                      "prompts and response text. Default: the model folder's own; presets get "
                      "gpuchef's bundled byte-level tokenizer."),
    click.option("--max-concurrent-requests", default=DEFAULT_MAX_CONCURRENT, type=int,
                 help="Requests in flight over HTTP beyond which the server answers 503 with "
                      "Retry-After. Default: no limit (requests beyond max_num_seqs wait in the "
                      "engine's queue, as in vLLM)."),
    click.option("--max-request-body-mb", default=DEFAULT_MAX_BODY_MB, show_default=True,
                 type=float, help="Largest request body accepted (MiB); larger gets 413."),
)
