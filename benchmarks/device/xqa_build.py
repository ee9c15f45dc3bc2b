"""Build (JIT) or load FlashInfer's XQA decode modules for the given shapes, in parallel, and say
how long each took: run once at the start of a device session so that the engine's warm-up and
the GPU tests do not each wait for nvcc (then ``aot_pack.sh pack`` keeps them).

Shapes as ``HEAD_DIM:GROUP[:PAGE]`` (GROUP = query heads per KV head; PAGE default 16), dtype
bf16. Example: python benchmarks/device/xqa_build.py 128:4 128:1 64:2
"""
from __future__ import annotations

import subprocess
import sys
import time

CHILD = ("import sys, time, torch; from flashinfer.xqa import get_xqa_module; t = time.time(); "
         "d, g, p = map(int, sys.argv[1:4]); "
         "get_xqa_module(torch.bfloat16, torch.bfloat16, p, d, g, False, torch.bfloat16, 1); "
         "print(f'xqa head_dim {d} group {g} page {p}: {time.time() - t:.1f} s', flush=True)")


def main(argv: list[str]) -> int:
    shapes = []
    for s in argv or ["128:4"]:
        parts = s.split(":")
        try:
            d, g, p = int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 16
        except (IndexError, ValueError):
            print(f"shape {s!r}: expected HEAD_DIM:GROUP[:PAGE], e.g. 128:4", file=sys.stderr)
            return 2
        shapes.append((d, g, p))
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, *map(str, s)]) for s in shapes]
    rcs = [p.wait() for p in procs]
    print(f"{len(shapes)} XQA modules in {time.time() - t0:.1f} s; return codes {rcs}")
    return max(rcs)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
