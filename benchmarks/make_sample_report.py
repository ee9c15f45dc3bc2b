"""Make a sample `gpuchef report`: two CPU runs on one load, or an H200 trace from git history.

    python benchmarks/make_sample_report.py              # → out/sample-report.html (CPU, ~3 min)
    python benchmarks/make_sample_report.py --duration 20 --out /tmp/s.html
    python benchmarks/make_sample_report.py --h200       # → out/sample-report-h200.html

Default (any machine): `gpuchef bench` twice on the CPU — the `tiny` model, the bundled Azure
conversation trace at `gpuchef top`'s CPU defaults (0.5×, prompts ≤ 1024, outputs ≤ 128 tokens,
budget 512) for ``--duration`` seconds of arrivals — once with ``--mode continuous`` and once with
``--mode chunked``, each writing its trace; then `gpuchef report` of both traces into one HTML
file. The same seeded load in both, so the report compares the two modes step by step.

``--h200``: no engine runs. The trace of an H200 capacity search (continuous vs chunked, llama-3-8b,
2026-12-02; docs/benchmarks.md, "Capacity") is read from git history (commit ``H200_COMMIT``:
raw results left the working tree then) and rendered — a report with GPM panels and the capacity
probes, which a CPU cannot record. Needs a clone with that history (not a shallow one).

Nothing is committed: the reports are 1 MB each and go stale as the report changes; docs link
to this script instead (docs/reports.md). ``out/`` is git-ignored.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H200_COMMIT = "85f43a1"
H200_TRACE = "benchmarks/results/2026-12-02-h200-s7/cap_cont_chunked.jsonl.gz"
CPU_LOAD = ["--device", "cpu", "--model", "tiny", "--dataset", "azure-conv", "--trace-speed", "0.5",
            "--max-input-len", "1024", "--max-output-len", "128",
            "--max-num-batched-tokens", "512", "--sample-hz", "0"]


def gpuchef(*args: str) -> None:
    """Run a gpuchef command in a child process (as a user would); exit with its output if it
    fails."""
    r = subprocess.run([sys.executable, "-m", "gpuchef", *args], cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gpuchef {' '.join(args)} failed ({r.returncode}):\n"
                         f"{r.stdout}{r.stderr}")


def cpu_report(out: Path, duration: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        traces = []
        for mode in ("continuous", "chunked"):
            t = Path(d) / f"cpu_{mode}.jsonl"
            print(f"gpuchef bench --mode {mode} ({duration:g} s of arrivals) …", flush=True)
            gpuchef("bench", *CPU_LOAD, "--duration", f"{duration:g}", "--mode", mode,
                    "--trace", str(t))
            traces.append(str(t))
        gpuchef("report", *traces, "-o", str(out), "--title",
                "gpuchef sample report: continuous batching vs chunked prefill, tiny model on "
                "a CPU")


def h200_report(out: Path) -> None:
    r = subprocess.run(["git", "show", f"{H200_COMMIT}:{H200_TRACE}"], cwd=ROOT,
                       capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"git show {H200_COMMIT}:{H200_TRACE} failed (a shallow clone? "
                         f"`git fetch --unshallow`): {r.stderr.decode(errors='replace')}")
    with tempfile.TemporaryDirectory() as d:
        t = Path(d) / Path(H200_TRACE).name
        t.write_bytes(r.stdout)
        gpuchef("report", str(t), "-o", str(out), "--title",
                "gpuchef sample report: capacity search, continuous vs chunked prefill, "
                "llama-3-8b on an H200")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--h200", action="store_true",
                    help=f"render the H200 trace kept in git history ({H200_COMMIT}) instead "
                         "of running the CPU engine")
    ap.add_argument("--duration", type=float, default=60.0,
                    help="seconds of the trace's arrivals per CPU run (default %(default)s)")
    ap.add_argument("--out", default=None,
                    help="the HTML file (default out/sample-report.html, "
                         "out/sample-report-h200.html with --h200)")
    a = ap.parse_args(argv)
    if a.duration <= 0:
        ap.error(f"--duration {a.duration:g}: must be > 0")
    out = Path(a.out or ("out/sample-report-h200.html" if a.h200 else "out/sample-report.html"))
    if not out.is_absolute():
        out = Path.cwd() / out
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.h200:
        h200_report(out)
    else:
        cpu_report(out, a.duration)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
