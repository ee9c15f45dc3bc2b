"""`gpuchef bench-attention`: FlashInfer (paged) vs PyTorch SDPA vs naive attention, timed alone.
The cases, the work counted and the timing are ``experiments.attention``'s (its docstring says
how); this module is the command: its flags, the CPU-sized defaults, the table and ``--json``."""

from __future__ import annotations

import math
import platform
import sys
import time
from dataclasses import asdict

import click

from ..engine_host.vocab.errors import ConfigError
from ..experiments import attention as att
from .options import check_output_path, write_json


def _csv(choices):
    def cb(ctx, param, value):
        items = [x.strip() for x in value.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise click.BadParameter(f"{','.join(bad) or 'nothing'}: pick from {','.join(choices)}")
        return items
    return cb


@click.command("bench-attention")
@click.option("--batch-size", type=click.IntRange(1), default=16, show_default=True,
              help="Requests per batch.")
@click.option("--seq-len", type=click.IntRange(1), default=2048, show_default=True,
              help="KV tokens per request (prefill: new tokens too).")
@click.option("--num-heads", type=click.IntRange(1), default=32, show_default=True,
              help="Query heads.")
@click.option("--num-kv-heads", type=click.IntRange(1), default=32, show_default=True,
              help="KV heads (GQA when fewer than --num-heads).")
@click.option("--head-dim", type=click.IntRange(1), default=128, show_default=True)
@click.option("--dtype", type=click.Choice(list(att.DTYPES)), default="bf16", show_default=True)
@click.option("--chunk-len", type=click.IntRange(1), default=None,
              help="Mixed case: new tokens per prefill chunk (on seq-len − chunk-len cached). "
                   "Default: min(512, --seq-len).")
@click.option("--page-size", type=click.IntRange(1), default=16, show_default=True,
              help="FlashInfer page size, tokens.")
@click.option("--cases", default="prefill,decode,mixed", show_default=True,
              callback=_csv(att.CASES), help="Comma-separated subset of prefill,decode,mixed.")
@click.option("--backends", default="flashinfer,sdpa,naive", show_default=True,
              callback=_csv(att.BACKENDS), help="Comma-separated subset of flashinfer,sdpa,naive.")
@click.option("--iters", type=click.IntRange(1), default=50, show_default=True,
              help="Timed runs per measurement (median reported).")
@click.option("--device", default="auto", show_default=True,
              help="auto (cuda if available, else cpu), cpu, cuda or cuda:N (cpu: SDPA and "
                   "naive only, CPU-sized defaults).")
@click.option("--peak-tbps", type=float, default=4.3, show_default=True,
              help="Memory ceiling, TB/s. Default measured on an H200: 4.3 TB/s device copy, "
                   "790 TFLOP/s bf16 matmul (docs/benchmarks.md).")
@click.option("--peak-tflops", type=float, default=790.0, show_default=True,
              help="Compute ceiling, TFLOP/s. Default measured on an H200: 4.3 TB/s device "
                   "copy, 790 TFLOP/s bf16 matmul (docs/benchmarks.md).")
@click.option("--json", "json_path", type=click.Path(), default=None,
              help="Also write the results as JSON here.")
def bench_attention(batch_size, seq_len, num_heads, num_kv_heads, head_dim, dtype, chunk_len,
                    page_size, cases, backends, iters, device, peak_tbps, peak_tflops,
                    json_path):
    """Time attention alone: FlashInfer (paged) vs PyTorch SDPA vs naive, per case.

    Prints ms (median), speed-up against naive, achieved TB/s and TFLOP/s and their fraction of
    the ceilings. On a CPU, --batch-size, --seq-len, --chunk-len and --iters that are not given
    default to 4, 512, 128 and 5 (the defaults listed below are GPU-sized), and a run that would
    not fit in free memory is skipped with its estimate. Exits with status 2 (one `error:` line)
    for a bad flag or when the device cannot run (e.g. --device cuda and no CUDA).
    """
    from click.core import ParameterSource

    ctx = click.get_current_context()
    unset = frozenset(n for n in att.CPU_DEFAULTS
                      if ctx.get_parameter_source(n) in (None, ParameterSource.DEFAULT))
    try:
        _bench_attention(batch_size, seq_len, num_heads, num_kv_heads, head_dim, dtype, chunk_len,
                         page_size, cases, backends, iters, device, peak_tbps, peak_tflops,
                         json_path, cpu_sized=unset)
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


def _bench_attention(batch_size, seq_len, num_heads, num_kv_heads, head_dim, dtype, chunk_len,
                     page_size, cases, backends, iters, device, peak_tbps, peak_tflops,
                     json_path, cpu_sized=frozenset()):
    """The command's body. ``cpu_sized``: names of CPU_DEFAULTS flags that were not given; on
    a CPU they take the CPU_DEFAULTS values."""
    from rich.console import Console

    console = Console()
    err = Console(stderr=True, soft_wrap=True)
    _check_flags(num_heads, num_kv_heads, peak_tbps, peak_tflops, json_path)

    import torch

    from ..engine_host.engine import resolve_device

    dev = resolve_device(device)  # ConfigError: not a device, or CUDA asked for where there is none
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    notes: list[str] = []
    batch_size, seq_len, iters, chunk_cap = _cpu_sized(dev, cpu_sized, batch_size, seq_len,
                                                       iters, notes)
    if chunk_len is None:
        chunk_len = min(chunk_cap, seq_len)
    elif "mixed" in cases and chunk_len > seq_len:
        raise ConfigError(f"--chunk-len {chunk_len} must not exceed --seq-len {seq_len}")
    backends, fi_version = _flashinfer(dev, backends, notes)
    if notes and notes[0].startswith("CPU run: GPU-sized"):
        err.print(f"[dim]{notes[0]}[/dim]")  # after the checks: an error line stands alone

    tdtype = getattr(torch, att.DTYPES[dtype])
    elt = torch.empty((), dtype=tdtype).element_size()
    if dev.type == "cuda":
        dev_name = torch.cuda.get_device_name(dev)
    else:
        dev_name = f"CPU ({platform.processor() or platform.machine()})"
        notes.append("CPU run: the ceilings are the H200's, so no fraction is shown.")
    results = att.run_cases(
        torch, att.build_cases(cases, batch_size, seq_len, chunk_len), backends,
        (num_heads, num_kv_heads, head_dim, tdtype, elt), dev, page_size,
        att._timer(torch, dev, iters), peak_tbps, peak_tflops, notes,
        lambda line: err.print(f"[dim]{line}[/dim]"),
        free=att._free_bytes() if dev.type == "cpu" else None)
    cfg = dict(batch_size=batch_size, seq_len=seq_len, num_heads=num_heads,
               num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, chunk_len=chunk_len,
               page_size=page_size, iters=iters, cases=cases, backends=backends)
    _print_table(console, results, dev_name, torch.__version__, fi_version, cfg, notes,
                 peak_tbps, peak_tflops)
    if json_path:
        _write_json(json_path, results, cfg, dev_name, torch.__version__, fi_version, notes,
                    peak_tbps, peak_tflops)
        err.print(f"[dim]wrote {json_path}[/dim]")


def _check_flags(num_heads, num_kv_heads, peak_tbps, peak_tflops, json_path) -> None:
    """What can be refused before torch is imported. Raises ConfigError."""
    if num_heads % num_kv_heads:
        raise ConfigError(f"--num-heads {num_heads} must be a multiple of --num-kv-heads "
                          f"{num_kv_heads}")
    for flag, v in (("--peak-tbps", peak_tbps), ("--peak-tflops", peak_tflops)):
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"{flag} {v:g} must be a finite number > 0")
    check_output_path(json_path, "--json")


def _cpu_sized(dev, cpu_sized, batch_size, seq_len, iters, notes) -> tuple[int, int, int, int]:
    """On a CPU, the flags not given (``cpu_sized``) take ``CPU_DEFAULTS`` (a note says so).
    Returns (batch size, seq len, iters, the default chunk length's cap)."""
    chunk_cap = 512
    cpu = att.CPU_DEFAULTS
    if dev.type == "cpu" and cpu_sized:
        batch_size = cpu["batch_size"] if "batch_size" in cpu_sized else batch_size
        seq_len = cpu["seq_len"] if "seq_len" in cpu_sized else seq_len
        iters = cpu["iters"] if "iters" in cpu_sized else iters
        chunk_cap = cpu["chunk_len"] if "chunk_len" in cpu_sized else chunk_cap
        notes.append("CPU run: GPU-sized defaults replaced by " + ", ".join(
            f"--{n.replace('_', '-')} {cpu[n]}" for n in cpu if n in cpu_sized)
            + " (give a flag to choose it).")
    return batch_size, seq_len, iters, chunk_cap


def _flashinfer(dev, backends, notes) -> tuple[list[str], str | None]:
    """The backends that can run here: FlashInfer dropped with a note when there is no CUDA
    device or it does not import. Returns (backends, FlashInfer's version or None); raises
    ConfigError when nothing is left."""
    fi_version = None
    fi_why = None
    if "flashinfer" in backends:
        if dev.type != "cuda":
            fi_why = f"FlashInfer needs a CUDA device and this run is on {dev.type}"
        else:
            try:
                import flashinfer
                fi_version = getattr(flashinfer, "__version__", "?")
            except Exception as e:  # missing or broken install: still time the others
                fi_why = f"FlashInfer does not import ({type(e).__name__}: {e})"
        if fi_why:
            backends = [b for b in backends if b != "flashinfer"]
            notes.append(f"FlashInfer skipped: {fi_why}.")
    if not backends:
        raise ConfigError(f"--backends flashinfer cannot run here: {fi_why}; add sdpa,naive "
                          "(e.g. --backends sdpa,naive) or run on a CUDA machine")
    return backends, fi_version


def _write_json(json_path, results, cfg, dev_name, torch_version, fi_version, notes,
                peak_tbps, peak_tflops) -> None:
    """``--json``: the run's command line, machine, versions, configuration and results."""
    command = ("gpuchef bench-attention " + " ".join(
        f"--{k.replace('_', '-')} {','.join(v) if isinstance(v, list) else v}"
        for k, v in cfg.items() if k != "backends" or len(v) < len(att.BACKENDS)))
    payload = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": dev_name,
        "versions": {"torch": torch_version, "flashinfer": fi_version,
                     "python": platform.python_version()},
        "config": cfg,
        "ceilings": {"tbps": peak_tbps, "tflops": peak_tflops},
        "formulas": {
            "bytes": "elt*(2*sum(qo)*Hq*D + 2*sum(kv)*Hkv*D)",
            "flops": "4*D*Hq*sum(visible pairs); causal chunk: qo*(kv-qo)+qo*(qo+1)/2",
        },
        "results": [asdict(r) for r in results],
        "notes": notes,
    }
    write_json(json_path, payload, "--json")


def _fmt(x, spec):
    return "—" if x is None else format(x, spec)


def _print_table(console, results, dev_name, torch_version, fi_version, cfg, notes,
                 peak_tbps, peak_tflops):
    from rich.table import Table

    c = cfg
    title = (f"Attention on {dev_name}: batch {c['batch_size']}, seq {c['seq_len']}, "
             f"{c['num_heads']}/{c['num_kv_heads']} heads, head_dim {c['head_dim']}, {c['dtype']}, "
             f"chunk {c['chunk_len']}, page {c['page_size']}")
    table = Table(title=title, title_justify="left")
    for col, just in [("case", "left"), ("backend", "left"), ("ms", "right"),
                      ("vs naive", "right"), ("TB/s", "right"), (f"% of {peak_tbps:g}", "right"),
                      ("TFLOP/s", "right"), (f"% of {peak_tflops:g}", "right")]:
        table.add_column(col, justify=just)
    last_case = None
    for r in results:
        if last_case is not None and r.case != last_case:
            table.add_section()
        last_case = r.case
        if r.error:
            table.add_row(r.case, r.backend, r.error, "", "", "", "", "")
            continue
        table.add_row(r.case, r.backend, _fmt(r.ms, ".3f"),
                      "—" if r.speedup_vs_naive is None else f"{r.speedup_vs_naive:.1f}×",
                      _fmt(r.tbps, ".2f"),
                      "—" if r.frac_bw is None else f"{100 * r.frac_bw:.0f} %",
                      _fmt(r.tflops, ".1f"),
                      "—" if r.frac_flops is None else f"{100 * r.frac_flops:.0f} %")
    console.print(table)
    how = "CUDA events, L2 flushed" if dev_name[:3] != "CPU" else "wall clock"
    console.print(f"torch {torch_version}, flashinfer {fi_version or '—'}; medians of "
                  f"{c['iters']} runs ({how}). Bytes = Q,K,V read + O written; "
                  "FLOPs = 4·D·Hq·visible query-key pairs (causal prefill ≈ half of qo·kv).")
    for r in results:
        if r.rel_err_vs_sdpa is not None:
            notes.append(f"{r.case}: FlashInfer vs SDPA relative error {r.rel_err_vs_sdpa:.1e}.")
    for n in notes:
        console.print(f"· {n}")


if __name__ == "__main__":
    bench_attention()
