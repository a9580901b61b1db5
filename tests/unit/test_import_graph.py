"""The rig package has no import cycles: every import (top-level, inside functions, under TYPE_CHECKING) counts."""

from __future__ import annotations

import ast
from pathlib import Path

import rig

RIG_ROOT = Path(rig.__file__).parent


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package rooted at ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name imported from a package counts as the package unless it
    is a submodule)."""
    modules = _modules(root)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                found = known(t)
                if found and found != mod:
                    graph[mod].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_of_every_kind():
    graph = import_graph(RIG_ROOT)
    assert "rig.config" in graph["rig.cli"]  # top level
    assert "rig.sim.args" in graph["rig.config"]  # inside a function
    assert "rig.sim.openai_api" in graph["rig.sim.app"]  # `from package import submodule`


def test_a_cycle_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_rig_has_no_import_cycles():
    found = cycles(import_graph(RIG_ROOT))
    assert found == [], "import cycles (break each so the flow stays one-directional): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_contracts_and_server_import_nothing_from_loadgen():
    """The flow runs spec -> placement -> server -> load: the shared bottom (rig.contracts) and the server package
    import nothing of the load generators, directly or through another module (issue 31)."""
    graph = import_graph(RIG_ROOT)
    upward = {
        m: sorted(w for w in _reaches(graph, m) if w == "rig.loadgen" or w.startswith("rig.loadgen."))
        for m in graph
        if m.split(".")[:2] in (["rig", "contracts"], ["rig", "server"])
    }
    assert {m: ws for m, ws in upward.items() if ws} == {}


def test_the_cli_starts_without_the_heavy_stack():
    """`rig --version`, `--help` and a bad flag answer without importing Ray, pyarrow or the analysis stack (they
    cost ~1.5 s of start-up): subcommands and the record schema are loaded when used."""
    import subprocess
    import sys

    probe = (
        "import sys, rig.cli\n"
        "heavy = sorted(m for m in ('ray', 'pyarrow', 'pandas', 'matplotlib', 'scipy', 'rig.analysis.report')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
