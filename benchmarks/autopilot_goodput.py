"""The autopilot against every static token budget: goodput per workload (issue 30 item 3).

Collects the runs of a job list (``benchmarks/device/jobs/autopilot_goodput_*.txt``: one
``gpuchef bench`` per workload and arm, each with ``--result-json DIR/WORKLOAD__ARM.json`` and
``--trace DIR/WORKLOAD__ARM.jsonl[.gz]``) into the floors file::

    python benchmarks/autopilot_goodput.py DIR [DIR ...] --gpu "NVIDIA H100 80GB HBM3" \\
        [--json benchmarks/results/peer/autopilot.json]

ARM is ``static_256`` … ``static_4096`` or ``autopilot``. Goodput is vLLM's: completed
requests per second that meet every SLO given to ``--goodput`` (``request_goodput`` of the
result JSON: ``vllm bench serve``'s definition, TTFT and TPOT per request). For the autopilot
the trace gives what its promise is about (``probes.metrics.autopilot_totals``): the ITL target,
the P99 ITL of its steered steps, whether it was ever ``infeasible``, its steps per state, and
the model's predicted vs measured step time (mean |predicted − wall| / wall over steered steps),
which the write-up needs where it falls short.

Writes ``{"gpu", "date", WORKLOAD: {"static_256": {"goodput", "p99_itl_ms"}, …, "autopilot":
{"goodput", "p99_itl_ms", "itl_target_ms", "infeasible", "steered_p99_itl_ms", "states",
"model_error"}}}`` and prints, per workload, the autopilot's goodput over the best static
budget's against the floors (≥ 1.2× on at least one shifting workload, ≥ 0.97× on every one).
Exit status 1 when a run is missing or unreadable (named on stderr).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from gpuchef.engine_host.autopilot import INFEASIBLE, STEERING
from gpuchef.engine_host.vocab.config import parse_auto_budget
from gpuchef.probes.metrics import autopilot_totals
from gpuchef.probes.recorder import read_trace

STATIC = (256, 512, 1024, 2048, 4096)
ARMS = tuple(f"static_{b}" for b in STATIC) + ("autopilot",)
#: the floors (issue 30): on at least one shifting workload, and on every workload
FLOOR_WIN, FLOOR_ALL = 1.2, 0.97


def _trace(result: Path) -> Path | None:
    for ext in (".jsonl.gz", ".jsonl"):
        p = result.with_name(result.name[: -len(".json")] + ext)
        if p.exists():
            return p
    return None


def autopilot_fields(trace: Path) -> dict:
    """What the autopilot's trace says of its promise (see the module docstring)."""
    steps = read_trace(trace).steps
    tot = autopilot_totals(steps)
    if tot is None:
        raise ValueError(f"{trace}: no step ran with the autopilot choosing an allowance")
    steered = [s for s in steps if s.autopilot_state == STEERING and s.predicted_ms > 0
               and s.wall_ms > 0]
    err = (sum(abs(s.predicted_ms - s.wall_ms) / s.wall_ms for s in steered) / len(steered)
           if steered else float("nan"))
    return {"itl_target_ms": parse_auto_budget(tot.last.auto_budget).itl_ms,
            "infeasible": INFEASIBLE in tot.states,
            "steered_p99_itl_ms": tot.itl_ms, "states": tot.states,
            "model_error": err}


def collect(dirs: list[Path]) -> tuple[dict, list[str]]:
    """``{WORKLOAD: {ARM: fields}}`` from the result files in ``dirs``, and the problems."""
    out: dict[str, dict] = {}
    problems: list[str] = []
    for d in dirs:
        for res in sorted(d.glob("*__*.json")):
            workload, arm = res.name[: -len(".json")].split("__", 1)
            if arm not in ARMS:
                continue
            try:
                r = json.loads(res.read_text())
                row = {"goodput": r["request_goodput"], "p99_itl_ms": r["p99_itl_ms"]}
                if arm == "autopilot":
                    tr = _trace(res)
                    if tr is None:
                        raise ValueError("no trace beside it")
                    row.update(autopilot_fields(tr))
            except (OSError, ValueError, KeyError) as e:
                problems.append(f"{res}: {e}")
                continue
            out.setdefault(workload, {})[arm] = row
    for w, arms in out.items():
        missing = [a for a in ARMS if a not in arms]
        if missing:
            problems.append(f"{w}: no run for {', '.join(missing)}")
    return out, problems


def verdict(table: dict) -> list[str]:
    """One line per workload: the autopilot's goodput over the best static budget's, its P99
    ITL against its target, and the floors."""
    lines = []
    for w, arms in sorted(table.items()):
        statics = {a: v["goodput"] for a, v in arms.items() if a.startswith("static_")}
        ap = arms.get("autopilot")
        if not statics or ap is None:
            continue
        best = max(statics, key=statics.get)
        ratio = ap["goodput"] / statics[best] if statics[best] > 0 else float("inf")
        kept = ap["steered_p99_itl_ms"] <= 1.05 * ap["itl_target_ms"]
        lines.append(f"{w:28s} autopilot {ap['goodput']:7.2f} req/s vs {best} "
                     f"{statics[best]:7.2f}: {ratio:5.2f}× "
                     f"({'≥' if ratio >= FLOOR_ALL else '<'} {FLOOR_ALL}); steered P99 ITL "
                     f"{ap['steered_p99_itl_ms']:.1f} ms vs target {ap['itl_target_ms']:g} "
                     f"({'kept' if kept else 'MISSED'}){', infeasible at times' if ap['infeasible'] else ''}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", type=Path, help="folders holding WORKLOAD__ARM.json runs")
    ap.add_argument("--gpu", required=True, help="the GPU the runs used (nvidia-smi's name)")
    ap.add_argument("--date", default=dt.date.today().isoformat(), help="YYYY-MM-DD of the runs")
    ap.add_argument("--json", type=Path, help="write the floors file here")
    a = ap.parse_args(argv)
    table, problems = collect(a.dirs)
    for p in problems:
        print(f"autopilot_goodput: {p}", file=sys.stderr)
    for line in verdict(table):
        print(line)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"gpu": a.gpu, "date": a.date, **table}, indent=1) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
