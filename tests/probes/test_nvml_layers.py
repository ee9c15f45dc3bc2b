"""The NVML layers (binding, sampler, test double) as nvitop's api keeps them: gpuchef's commands,
session, TUI and report use only what ``probes.nvml`` exports, and never the test double."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuchef.probes.nvml as nvml

ROOT = Path(__file__).resolve().parents[2]
INNER = {"gpuchef.probes.nvml.library", "gpuchef.probes.nvml.sampler", "gpuchef.probes.nvml.fake"}


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules a source file imports (relative imports resolved)."""
    pkg_parts = {"gpuchef": ["gpuchef"], "tui": ["gpuchef", "tui"], "probes": ["gpuchef", "probes"],
                 "engine_host": ["gpuchef", "engine_host"]}
    rel = path.relative_to(ROOT).with_suffix("").parts
    here = pkg_parts[rel[0]] + list(rel[1:-1]) + ([] if rel[-1] == "__init__" else [])
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_outside_probes_only_the_package_surface_is_imported():
    files = [p for room in ("gpuchef", "tui") for p in (ROOT / room).rglob("*.py")]
    assert len(files) > 20
    bad = {str(p.relative_to(ROOT)): sorted(_imported_modules(p) & INNER) for p in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_package_exports_the_binding_and_the_sampler_but_not_the_fake():
    from gpuchef.probes.nvml import fields, library, sampler

    for name in nvml.__all__:
        obj = getattr(nvml, name)
        assert any(obj is getattr(m, name, None) for m in (library, sampler, fields)), name
    assert "FakeNvml" not in nvml.__all__ and not hasattr(nvml, "FakeNvml")
    assert {"NvmlSampler", "GpuSample", "parse_gpus", "nvml_library", "NA"} <= set(nvml.__all__)


def test_the_binding_imports_neither_the_sampler_nor_the_fake():
    mods = _imported_modules(ROOT / "probes" / "nvml" / "library.py")
    assert not mods & INNER and not any(m.startswith("gpuchef.probes.sampler") for m in mods)
