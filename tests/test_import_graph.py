"""The recipe's modules import each other without a circle (lazy imports inside functions included: a circle that
only works because an import is deferred is still a knot a reader has to untie)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("recipe/rolloutpipe", "rolloutpipe_workers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(f): f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file)."""
    def resolve(name: str) -> str | None:  # the deepest project module a dotted name points into
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" for a in node.names]  # a name may be a submodule
            else:
                continue
            edges.update(t for t in map(resolve, targets) if t and t != mod)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_recipe_has_no_import_cycle():
    graph = import_graph(project_modules())
    assert "recipe.rolloutpipe.trainer" in graph and "recipe.rolloutpipe.pipeline" in graph
    assert "recipe.rolloutpipe.trainer" in graph["recipe.rolloutpipe.runner"]  # the graph sees lazy imports
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_simulator_needs_nothing_from_the_bench():
    """What both need (mode strings, workloads) lives below both."""
    graph = import_graph(project_modules())
    sim_to_bench = {(m, t) for m, ts in graph.items() if m.startswith("recipe.rolloutpipe.sim")
                    for t in ts if t.startswith("recipe.rolloutpipe.bench")}
    assert sim_to_bench == set()


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
