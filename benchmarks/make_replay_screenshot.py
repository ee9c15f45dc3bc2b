"""Record a short CPU trace with `gpuchef bench` and save an SVG of `gpuchef replay` on it.

    python benchmarks/make_replay_screenshot.py                     # → screenshots/cpu-replay.svg
    python benchmarks/make_replay_screenshot.py --trace run.jsonl --at 42 --out x.svg
    # records of gpuchef's vLLM plugin (a file of them, one JSON object a line) as an attach trace:
    python benchmarks/make_replay_screenshot.py \
        --plugin-records tests/data/vllm024_plugin_h100.jsonl.gz --at 25 \
        --server http://vllm-0.24.0-h100 --model "llama-3-8b shapes, dummy weights" \
        --load-desc "bench --base-url: random 1024/256, 10 req/s, 400 prompts" \
        --out screenshots/h100-attach-plugin-vllm.svg

Without --trace it runs the tiny model on the CPU (random prompts, 4 req/s, ~15 s, continuous
batching with a 512-token budget) and writes the trace to a temporary folder. The app is driven
with Textual's Pilot: seek to ``--at`` seconds, paused, then the screenshot.

``--plugin-records``: each line is a ``PluginRecord`` as ``msgspec.to_builtins`` gives it plus
the reader's ``server`` (the publisher's URL), ``recv_ns`` (Unix ns at receipt), ``gap`` and
``dropped``. They are written as the ``plugin`` records of an attach trace (the format `top
--attach --trace` writes: a meta naming ``--server`` as the attached server and the publisher as
its plugin endpoint, then the records in the order they arrived) and that trace is replayed.
The trace holds no /metrics scrape: the /metrics panels say so; the plugin's panels draw the
records.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import msgspec
from click.testing import CliRunner

from gpuchef.commands.cli import _register, cli
from gpuchef.commands.replay import build_app
from gpuchef.probes.plugin_reader import Received, SeqAccounts
from gpuchef.probes.plugin_wire import PluginRecord
from gpuchef.probes.recorder import TraceRecorder

SIZE = (170, 50)
#: the reader's fields on a line of a records file; the rest is the PluginRecord
READER_FIELDS = ("server", "recv_ns", "gap", "dropped")


def record(path: Path) -> None:
    r = CliRunner().invoke(cli, ["bench", "--device", "cpu", "--model", "tiny", "--dataset",
                                 "random", "--num-prompts", "60", "--input-len", "256",
                                 "--output-len", "64", "--request-rate", "4", "--mode",
                                 "continuous", "--max-num-batched-tokens", "512",
                                 "--trace", str(path)], catch_exceptions=False)
    if r.exit_code != 0:
        raise SystemExit(r.output)


def read_plugin_records(path: str) -> list[Received]:
    """A records file as the reader's Received, in the order they arrived. The reader's
    accounting (gap, gap_dropped, restarted) is made again by its own SeqAccounts; the arrival
    on the monotonic axis is the record's ``mono_ns`` plus its transport delay (``recv_ns −
    t_ns``): reader and vLLM ran on one host, so both clocks are the same ones."""
    opener = gzip.open if path.endswith(".gz") else open
    acc, out = SeqAccounts(), []
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(ln) for ln in f if ln.strip()]
    for d in sorted(lines, key=lambda d: d["recv_ns"]):
        rec = msgspec.convert({k: v for k, v in d.items() if k not in READER_FIELDS},
                              PluginRecord)
        got = acc.ingest(d["server"], d["dropped"], rec, d["recv_ns"],
                         rec.mono_ns + d["recv_ns"] - rec.t_ns)
        if got.gap != d["gap"]:
            raise SystemExit(f"{path}: seq {rec.seq}: the file says gap {d['gap']}, the "
                             f"records give {got.gap} (a record missing from the file?)")
        out.append(got)
    if not out:
        raise SystemExit(f"{path}: no record")
    return out


def plugin_trace(records: list[Received], path: Path, server: str, model: str,
                 load_desc: str, source: str) -> None:
    """``records`` as an attach trace at ``path`` (meta, a ``plugin`` record each, end)."""
    eps = {g.server for g in records}
    if len(eps) != 1:
        raise SystemExit(f"the records come from {len(eps)} publishers; one --server names one")
    first = records[0]
    meta = {
        "command": "plugin records",  # the replay's title: not a trace `top` wrote
        "created": datetime.fromtimestamp(first.recv_ns / 1e9, timezone.utc).isoformat(
            timespec="milliseconds"),
        "clock": {"monotonic_ns": first.recv_mono_ns, "time_ns": first.recv_ns},
        "model": {"name": model, "random_weights": None, "source": server},
        "device": "remote",
        "source": {"kind": "attached", "urls": [server], "plugin": {server: first.server}},
        "load": {"desc": load_desc},
        "converted_from": source,
    }
    with TraceRecorder(path, meta=meta) as rec:
        for g in records:
            rec.record(g)


async def shoot(trace: str, at: float, out: Path, window: str) -> None:
    app = build_app(trace, paused=True, window=window)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.3)
        app.seek_to(str(at))
        await pilot.pause(0.5)
        app.save_screenshot(out.name, path=str(out.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="an existing trace (default: record one)")
    ap.add_argument("--plugin-records", default=None, metavar="PATH",
                    help="a file of gpuchef vLLM plugin records (.jsonl or .jsonl.gz): "
                         "replayed as an attach trace of them")
    ap.add_argument("--server", default="http://vllm-server",
                    help="--plugin-records: the attached server's name in the trace")
    ap.add_argument("--model", default="(vLLM's model)", help="--plugin-records: model name")
    ap.add_argument("--load-desc", default="the server's own clients",
                    help="--plugin-records: what sent the load")
    ap.add_argument("--at", type=float, default=12.0, help="position (s from the start)")
    ap.add_argument("--window", default="10s", help="waveform window")
    ap.add_argument("--out", default="screenshots/cpu-replay.svg")
    a = ap.parse_args()
    if a.trace and a.plugin_records:
        ap.error("--trace or --plugin-records, not both")
    _register()
    out = Path(a.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        trace = a.trace
        if a.plugin_records:
            src = Path(a.plugin_records)
            name = src.name.removesuffix(".gz").removesuffix(".jsonl") + ".attach.jsonl"
            plugin_trace(read_plugin_records(str(src)), Path(d) / name, a.server, a.model,
                         a.load_desc, src.name)
            trace = name
        elif trace is None:
            trace = str(Path(d) / "cpu.jsonl")
            record(Path(trace))
        here = os.getcwd()
        if a.plugin_records:
            os.chdir(d)  # the replay bar shows the trace's path: its name, not a temp folder
        try:
            asyncio.run(shoot(trace, a.at, out, a.window))
        finally:
            os.chdir(here)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
