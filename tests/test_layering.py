"""The design's one rule of imports: engine_host ← probes ← tui ← gpuchef (docs/architecture.md).
Every module of the three rooms is parsed (ast, not imported) and each import it makes — absolute
``gpuchef.<room>`` or relative — must land in its own room or one to its left. Inside gpuchef/:
a click command (commands/) imports no other command but the shared flag module, and no gpuchef/
module takes part in an import cycle."""

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
                               "import gpuchef.probes.scrape\nfrom gpuchef.commands.cli import main\n")
    got = _rooms_imported(fake / "x.py", "tui", tmp_path)
    assert [t for _, t in got] == ["gpuchef", "tui", "probes", "gpuchef"]


# ---- inside gpuchef/: commands import no command; no import cycles -----------------------------

GPUCHEF = ROOT / "gpuchef"
SHARED_OPTIONS = "gpuchef.commands.options"
#: the click group: it registers every command, so it alone imports them
GROUP = "gpuchef.commands.cli"


def _module_name(path: Path, root: Path = GPUCHEF) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = ["gpuchef", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str], root: Path = GPUCHEF) -> set[str]:
    """The gpuchef/ modules ``path`` imports (absolute or relative, at module level or inside a
    function: a lazy import is an edge too). ``from pkg import name`` counts ``pkg.name`` when
    that is a module, else ``pkg``."""
    name = _module_name(path, root)
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            cands = [[a.name] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                    if node.level else (node.module or ""))
            cands = [[f"{base}.{a.name}", base] for a in node.names]
        else:
            continue
        for options in cands:
            for c in options:
                if c in modules:
                    out.add(c)
                    break
    out.discard(name)
    return out


def _graph(root: Path = GPUCHEF) -> dict[str, set[str]]:
    files = sorted(root.rglob("*.py"))
    modules = {_module_name(p, root) for p in files}
    return {_module_name(p, root): _imports(p, modules, root) for p in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_commands_import_no_other_command():
    """A click command imports the shared flag module and no other command (the group, which
    registers them, aside): what two commands share lives in sessions/, experiments/ or
    commands/options.py."""
    graph = _graph()
    assert graph[GROUP] >= {"gpuchef.commands.bench", "gpuchef.commands.top"}  # it sees them
    bad = [f"{m} imports {t}" for m, ts in sorted(graph.items())
           if m.startswith("gpuchef.commands.") and m != GROUP for t in sorted(ts)
           if t.startswith("gpuchef.commands.") and t != SHARED_OPTIONS]
    assert not bad, "\n".join(bad)


def test_no_import_cycles_in_gpuchef():
    cycles = _cycles(_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_cycle(tmp_path):
    """The graph itself: a relative, a lazy and a ``from pkg import module`` import each make
    an edge, and a cycle through them is found."""
    pkg = tmp_path / "gpuchef"
    (pkg / "rooma").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rooma" / "__init__.py").write_text("")
    (pkg / "rooma" / "x.py").write_text("from .y import f\n")
    (pkg / "rooma" / "y.py").write_text("def f():\n    from gpuchef import z\n")
    (pkg / "z.py").write_text("from .rooma import x\n")
    graph = _graph(pkg)
    assert graph["gpuchef.rooma.x"] == {"gpuchef.rooma.y"}
    assert graph["gpuchef.rooma.y"] == {"gpuchef.z"}
    assert graph["gpuchef.z"] == {"gpuchef.rooma.x"}
    assert _cycles(graph) == [["gpuchef.rooma.x", "gpuchef.rooma.y", "gpuchef.z"]]
