"""iobench's layers, as the tree shows them, and the one way its imports point.

    cli/        parses, calls one workflow, prints
    workflows/  one module per command (generate, train, stage, bench-read, probe, ...)
    generators/ loaders/ pfs/   the format writers, the readers, the emulated filesystem
    core/       contracts and shared machinery

A module may import its own layer or any layer below it, never one above; generators and
loaders never import each other; no import circles anywhere. No exceptions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import iobench

PACKAGE = Path(iobench.__file__).parent
# layer of a module: the first matching prefix; a higher number may import a lower one
LAYERS = (("iobench.cli", 3), ("iobench.workflows", 2), ("iobench.generators", 1),
          ("iobench.loaders", 1), ("iobench.pfs", 1), ("iobench.core", 0))
SIBLINGS_APART = (("iobench.generators", "iobench.loaders"),)


def _files() -> dict[str, Path]:
    """Every module of the installed package, generators and loaders included (they are
    installed under iobench/ from top-level folders)."""
    import iobench.generators
    import iobench.loaders

    roots = [(PACKAGE, "iobench"),
             (Path(iobench.generators.__file__).parent, "iobench.generators"),
             (Path(iobench.loaders.__file__).parent, "iobench.loaders")]
    files: dict[str, Path] = {}
    for root, prefix in roots:
        for p in root.rglob("*.py"):
            parts = p.relative_to(root).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            files[".".join((prefix, *parts)) if parts else prefix] = p
    return files


def import_graph() -> dict[str, set[str]]:
    """module -> the iobench modules it imports, at any depth of its code."""
    files = _files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names}
                # `from pkg import submodule` needs the submodule; names need the module
                out.update(subs if subs <= files.keys() else {node.module, *subs})
        graph[name] = {m for m in out if m in files and m != name}
    return graph


def layer(module: str) -> tuple[str, int] | None:
    for prefix, level in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, level
    return None


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up a layer, or between generators and loaders."""
    bad = []
    for src, dsts in sorted(graph.items()):
        ls = layer(src)
        for dst in sorted(dsts):
            ld = layer(dst)
            if ls is None or ld is None:
                continue  # the package face (iobench/__init__, __main__)
            if ld[1] > ls[1] or any({ls[0], ld[0]} == set(pair) for pair in SIBLINGS_APART):
                bad.append(f"{src} -> {dst}")
    return bad


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]


def test_the_check_finds_an_import_that_points_up():
    graph = {"iobench.core.x": {"iobench.workflows.y"}, "iobench.workflows.y": set(),
             "iobench.loaders.a": {"iobench.generators.b"}, "iobench.generators.b": set(),
             "iobench.cli.c": {"iobench.core.x"}}
    assert wrong_way(graph) == ["iobench.core.x -> iobench.workflows.y",
                                "iobench.loaders.a -> iobench.generators.b"]


def test_every_module_sits_in_a_layer():
    loose = [m for m in _files() if layer(m) is None
             and m not in ("iobench", "iobench.__main__")]
    assert not loose, f"modules outside core/workflows/cli/generators/loaders/pfs: {loose}"


def test_imports_point_down_the_layers():
    bad = wrong_way(import_graph())
    assert not bad, f"imports that point the wrong way: {bad}"


def test_no_import_circles():
    found = [sorted(c) for c in circles(import_graph())]
    assert not found, f"import circles: {found}"
