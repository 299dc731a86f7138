"""iobench's own modules import one another one way: no import circles (a workflow that
needs another's helper gets it from a lower module instead)."""

from __future__ import annotations

import ast
from pathlib import Path

import iobench

PACKAGE = Path(iobench.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the iobench modules it imports, at any depth of its code."""
    files = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module)
                out.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {m for m in out if m in files and m != name}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module: modules that reach each
    other."""
    reach = {v: reachable(graph, v) for v in graph}
    found: list[frozenset[str]] = []
    for v in sorted(graph):
        comp = frozenset({v} | {w for w in reach[v] if v in reach[w]})
        if len(comp) > 1 and comp not in found:
            found.append(comp)
    return found


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        frozenset({"a", "b", "c"})]


def test_no_import_circles_among_iobench_modules():
    found = [sorted(c) for c in circles(import_graph())]
    assert not found, f"import circles: {found}"
