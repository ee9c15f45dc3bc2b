"""The design's one rule of imports: engine_host ← probes ← tui ← gpuchef (docs/architecture.md).
Every module of the three rooms is parsed (ast, not imported) and each import it makes — absolute
``gpuchef.<room>`` or relative — must land in its own room or one to its left. Inside gpuchef/:
a click command (commands/) imports no other command but the shared flag module, and no gpuchef/
module takes part in an import cycle. The shared vocabulary (``engine_host/vocab/``: errors, knob
table, records, workloads, tokenizer) is the bottom: it imports nothing of ours outside itself."""

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


def _module_name(path: Path, root: Path = GPUCHEF, prefix: str = "gpuchef") -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [*prefix.split("."), *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (annotations only: no
    import happens when the program runs, so no cycle either)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _imports(path: Path, modules: set[str], root: Path = GPUCHEF,
             prefix: str = "gpuchef") -> set[str]:
    """The modules of ``modules`` that ``path`` imports when it runs (absolute or relative, at
    module level or inside a function: a lazy import is an edge too; ``if TYPE_CHECKING:``
    imports are not). ``from pkg import name`` counts ``pkg.name`` when that is a module, else
    ``pkg``."""
    name = _module_name(path, root, prefix)
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
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
    return _graph_of({root: "gpuchef"})


#: every product folder and the package it installs as (pyproject's package-dir mapping)
PACKAGES = {ROOT / "engine_host": "gpuchef.engine_host", ROOT / "probes": "gpuchef.probes",
            ROOT / "tui": "gpuchef.tui", GPUCHEF: "gpuchef"}


def _graph_of(roots: dict[Path, str]) -> dict[str, set[str]]:
    files = [(p, root, prefix) for root, prefix in roots.items()
             for p in sorted(root.rglob("*.py"))]
    modules = {_module_name(p, root, prefix) for p, root, prefix in files}
    return {_module_name(p, root, prefix): _imports(p, modules, root, prefix)
            for p, root, prefix in files}


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


def test_no_import_cycles_in_any_product_folder():
    """engine_host/, probes/, tui/ and gpuchef/ together, as installed: no module takes part in
    an import cycle when the program runs."""
    graph = _graph_of(PACKAGES)
    assert "gpuchef.engine_host.scheduler" in graph["gpuchef.engine_host.engine"]  # it sees them
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


#: the bottom package: every room imports it, it imports nothing of ours outside itself
VOCAB = "gpuchef.engine_host.vocab"


def _in_vocab(module: str) -> bool:
    return module == VOCAB or module.startswith(VOCAB + ".")


def _outside_vocab(graph: dict[str, set[str]]) -> list[str]:
    """``"<vocab module> imports <module>"`` for each import of a vocab module that lands outside
    the vocab package (lazy imports inside functions included)."""
    return [f"{m} imports {t}" for m, ts in sorted(graph.items()) if _in_vocab(m)
            for t in sorted(ts) if not _in_vocab(t)]


def test_vocab_imports_nothing_of_ours_outside_itself():
    """The vocabulary everyone shares (errors, knob table and labels, records, workloads,
    tokenizer) sits below the engine: probes, tui and gpuchef read it without importing the
    engine, and it never reaches back up."""
    graph = _graph_of(PACKAGES)
    assert f"{VOCAB}.errors" in graph and graph[f"{VOCAB}.errors"] == set()  # it sees them
    assert f"{VOCAB}.errors" in graph["gpuchef.engine_host.engine"]
    bad = _outside_vocab(graph)
    assert not bad, "\n".join(bad)


def test_the_vocab_check_sees_a_wrong_import(tmp_path):
    """A vocab module's lazy import of an engine module is found; imports inside vocab, and the
    engine's imports of vocab, are fine."""
    eh = tmp_path / "engine_host"
    (eh / "vocab").mkdir(parents=True)
    (eh / "__init__.py").write_text("")
    (eh / "engine.py").write_text("from .vocab.errors import E\n")
    (eh / "vocab" / "__init__.py").write_text("")
    (eh / "vocab" / "errors.py").write_text("class E(Exception):\n    pass\n")
    (eh / "vocab" / "records.py").write_text("from .errors import E\ndef f():\n"
                                             "    from ..engine import x\n")
    graph = _graph_of({eh: "gpuchef.engine_host"})
    assert _outside_vocab(graph) == [f"{VOCAB}.records imports gpuchef.engine_host.engine"]


def test_type_checking_imports_are_no_edge(tmp_path):
    pkg = tmp_path / "gpuchef"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from . import b\nelse:\n    from . import c\n")
    (pkg / "b.py").write_text("")
    (pkg / "c.py").write_text("")
    assert _graph(pkg)["gpuchef.a"] == {"gpuchef.c"}


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
