"""The import graph of epfleet, eps, tasks, flows and deployments (built with grimp): no
cycle between modules, none between the top-level packages, and the fleet side never
imports the device engine (``epfleet.device``).

Only imports that run when a module is imported count: those at module level, outside
``if TYPE_CHECKING:`` and ``if __name__ == "__main__":``. An import inside a function
runs when the function is called, after every module involved has loaded, so it cannot
take part in an import cycle: the CLI's commands import the flows that way, and the
flow files' ``__main__`` blocks import the CLI.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import grimp
import pytest

pytestmark = pytest.mark.fast

PACKAGES = ("epfleet", "eps", "tasks", "flows", "deployments")
DEVICE_ENGINE = "epfleet.device"
DEVICE_SIDE = {"flows.device_sync", "tasks.sync"}
"""Flows and tasks that run the device engine; every other flow and task is fleet side."""


def module_path(module: str) -> Path:
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.submodule_search_locations, top
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _is_guard(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if __name__ == "__main__":``."""
    if isinstance(test, ast.Name | ast.Attribute):
        return ast.unparse(test).endswith("TYPE_CHECKING")
    return isinstance(test, ast.Compare) and ast.unparse(test).startswith("__name__ ==")


def _statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported (not function bodies)."""
    for node in body:
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If) and _is_guard(node.test):
            yield from _statements(node.orelse)
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _statements(getattr(node, field, []))


def import_time_lines(module: str) -> set[int]:
    tree = ast.parse(module_path(module).read_text())
    lines: set[int] = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import | ast.ImportFrom):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


@functools.cache
def import_time_graph() -> grimp.ImportGraph:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)
    for importer in sorted(graph.modules):
        lines = import_time_lines(importer)
        for imported in graph.find_modules_directly_imported_by(importer):
            details = graph.get_import_details(importer=importer, imported=imported)
            if not any(d["line_number"] in lines for d in details):
                graph.remove_import(importer=importer, imported=imported)
    return graph


def edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def strongly_connected(nodes: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node, or of one that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(nodes.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in nodes.get(node, ()):
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def shortest_path(nodes: dict[str, set[str]], start: str, goals: set[str]) -> list[str] | None:
    """The shortest import chain from ``start`` to one of ``goals``, by breadth first."""
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(nodes.get(node, ())):
            if nxt in goals:
                path, back = [nxt, node], came_from[node]
                while back is not None:
                    path.append(back)
                    back = came_from[back]
                return path[::-1]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    return None


def describe_chain(graph: grimp.ImportGraph, chain: list[str]) -> str:
    steps = [chain[0]]
    for importer, imported in itertools.pairwise(chain):
        lines = sorted(
            d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)
        )
        steps.append(f"-> {imported} (line {lines[0]})" if lines else f"-> {imported}")
    return " ".join(steps)


def test_no_cycle_between_modules() -> None:
    graph = import_time_graph()
    nodes = edges(graph)
    cycles = []
    for component in strongly_connected(nodes):
        first = component[0]
        within = {m: nodes[m] & set(component) for m in component}
        chain = shortest_path(within, first, {first})
        assert chain is not None
        cycles.append(f"{len(component)} modules {component}; e.g. {describe_chain(graph, chain)}")
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_cycle_between_top_level_packages() -> None:
    graph = import_time_graph()
    between: dict[str, set[str]] = {p: set() for p in PACKAGES}
    example: dict[tuple[str, str], str] = {}
    for importer, imported_set in edges(graph).items():
        for imported in imported_set:
            a, b = importer.split(".")[0], imported.split(".")[0]
            if a != b:
                between[a].add(b)
                example.setdefault((a, b), f"{importer} -> {imported}")
    cycles = []
    for component in strongly_connected(between):
        pairs = [(a, b) for a in component for b in component if (a, b) in example]
        cycles.append(f"{' <-> '.join(component)}: " + "; ".join(example[p] for p in pairs))
    assert not cycles, "cycles between packages:\n" + "\n".join(cycles)


def test_the_fleet_side_never_imports_the_device_engine() -> None:
    graph = import_time_graph()
    device = {m for m in graph.modules if m == DEVICE_ENGINE or m.startswith(DEVICE_ENGINE + ".")}
    assert device, f"no {DEVICE_ENGINE} package: nothing to check"
    fleet = sorted(
        m
        for m in graph.modules
        if m.split(".")[0] in ("flows", "tasks") and "." in m and m not in DEVICE_SIDE
    )
    nodes = edges(graph)
    slips = [
        describe_chain(graph, chain)
        for module in fleet
        if (chain := shortest_path(nodes, module, device)) is not None
    ]
    assert not slips, "fleet-side modules import the device engine:\n" + "\n".join(slips)


def test_function_level_and_guarded_imports_do_not_count(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import json\n"
        "try:\n"
        "    import tomllib\n"
        "except ImportError:\n"
        "    tomllib = None\n"
        "def f():\n"
        "    import csv\n"
        "class C:\n"
        "    import abc\n"
        "if __name__ == '__main__':\n"
        "    import sys\n"
    )
    tree = ast.parse(source.read_text())
    found = {
        node.lineno
        for node in _statements(tree.body)
        if isinstance(node, ast.Import | ast.ImportFrom)
    }
    assert found == {1, 2, 6, 12}


def test_the_checks_find_cycles_and_chains() -> None:
    nodes = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert strongly_connected(nodes) == [["a", "b", "c"], ["e"]]
    assert shortest_path(nodes, "a", {"a"}) == ["a", "b", "c", "a"]
    assert shortest_path(nodes, "b", {"d"}) == ["b", "c", "d"]
    assert shortest_path(nodes, "d", {"a"}) is None
