"""The design's one rule of imports: engine_host ← probes ← tui ← gpuchef (DESIGN.md). Every
module of the three rooms is parsed (ast, not imported) and each import it makes — absolute
``gpuchef.<room>`` or relative — must land in its own room or one to its left."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["engine_host", "probes", "tui", "gpuchef"]  # each may import those before it


def _rooms_imported(path: Path, room: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, room) of each gpuchef import in ``path`` (a module of ``room`` under ``root``)."""
    rel = path.relative_to(root / room).with_suffix("")
    pkg = ["gpuchef", room, *rel.parts[:-1]]  # the module's package as installed
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                names = [".".join(base + ([node.module] if node.module else []))]
            elif node.module:
                names = [node.module]
        for n in names:
            parts = n.split(".")
            if parts[0] != "gpuchef":
                continue
            target = parts[1] if len(parts) > 1 and parts[1] in ORDER[:3] else "gpuchef"
            out.append((node.lineno, target))
    return out


@pytest.mark.parametrize("room", ORDER[:3])
def test_imports_point_one_way(room):
    allowed = set(ORDER[: ORDER.index(room) + 1])
    bad = []
    for path in sorted((ROOT / room).rglob("*.py")):
        for line, target in _rooms_imported(path, room):
            if target not in allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_wrong_import(tmp_path):
    """The parser itself: a relative import two levels up from tui/ is gpuchef's top room."""
    fake = tmp_path / "tui" / "screens"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text("from ...ab import run_sequential\nfrom ..model import Session\n"
                               "import gpuchef.probes.scrape\nfrom gpuchef.cli import main\n")
    got = _rooms_imported(fake / "x.py", "tui", tmp_path)
    assert [t for _, t in got] == ["gpuchef", "tui", "probes", "gpuchef"]
