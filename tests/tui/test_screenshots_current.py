"""The committed CPU screenshots (screenshots/cpu-*.svg) show what the code draws today.

The screenshots are made by benchmarks/make_screenshots.py over the real engine; its ``--check``
draws the scenes again in a temporary folder and compares their structure (panel titles and
legends, side panels, key bar, header words — not the live numbers) with the committed files.
The script runs as a child process, as a user or CI would run it (tests import nothing from
benchmarks/). docs/benchmarks.md, "Screenshots and sample reports", lists how each file is made.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "screenshots"


@pytest.mark.slow
def test_cpu_main_and_help_screenshots_are_current():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "make_screenshots.py"), "--check",
         "--device", "cpu", "--scenes", "main-chunked,help", "--warmup-s", "3",
         "--phase-s", "8", "--out", str(SHOTS)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (
        "a committed screenshot no longer matches what the dashboard draws; redraw it with "
        "`python benchmarks/make_screenshots.py --scenes main-chunked,help` (or all scenes) "
        f"and look at it:\n{r.stdout}{r.stderr}")
    assert "current" in r.stderr and "stale" not in r.stderr


def test_the_8_gpu_screenshot_is_its_snapshot():
    snapshot = ROOT / "tests/tui/__snapshots__/test_multi_gpu/test_8_gpus_120x40.svg"
    assert (SHOTS / "cpu-8gpu-fake.svg").read_bytes() == snapshot.read_bytes(), (
        "screenshots/cpu-8gpu-fake.svg is a copy of the 8-GPU snapshot: copy it again "
        f"(cp {snapshot.relative_to(ROOT)} screenshots/cpu-8gpu-fake.svg)")
