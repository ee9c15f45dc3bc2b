"""Session 12's choices for the floor runs, from the lease's own measurements (prints shell
assignments for the worker to eval): the RoPE + K/V append mode (ops.ROPE_APPEND) and the BLAS
library (TORCH_BLAS_PREFER_CUBLASLT) that made the steady decode step and the piecewise mixed
steps fastest. A missing or failed measurement leaves the default (fused, torch's BLAS choice).

Usage: python3 benchmarks/device/pick_s12.py RESULTS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def steady(path: Path) -> float | None:
    """Mean async ms/step over the steady decode batches of one bench_engine_step --json."""
    try:
        rows = [r for r in json.loads(path.read_text())["rows"] if r.get("kind") == "steady"]
    except (OSError, ValueError, KeyError):
        return None
    return sum(r["async_ms"] for r in rows) / len(rows) if rows else None


def mixed(path: Path) -> float | None:
    """Sum of the piecewise mixed steps' wall ms of one profile_decode --json."""
    try:
        ms = [m["piecewise"]["wall_ms"] for m in json.loads(path.read_text())["mixed"]
              if m.get("piecewise")]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sum(ms) if ms else None


def main(res: str) -> int:
    r = Path(res)
    st = {k: steady(r / f"steady_{k}.json") for k in ("separate", "fused", "cublaslt")}
    mx = {k: mixed(r / f"mixed_{k}.json") for k in ("fused", "fused-except-piecewise",
                                                      "separate")}
    print(f"# steady async ms (mean over batches): {st}", file=sys.stderr)
    print(f"# piecewise mixed ms (sum): {mx}", file=sys.stderr)
    mode = "fused"
    if st["separate"] is not None and st["fused"] is not None and st["separate"] < st["fused"]:
        mode = "separate"
    elif mx["fused"] is not None and mx["fused-except-piecewise"] is not None \
            and mx["fused-except-piecewise"] < mx["fused"]:
        mode = "fused-except-piecewise"
    lt = st["cublaslt"] is not None and st["fused"] is not None and st["cublaslt"] < st["fused"]
    print(f"export GPUCHEF_ROPE_APPEND={mode}")
    print(f"export TORCH_BLAS_PREFER_CUBLASLT={1 if lt else 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
