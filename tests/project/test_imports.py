"""The import graph of epfleet, eps, tasks, flows and deployments (built with grimp), counting
every import a module makes: at module level, inside functions and in ``__main__``
blocks (only ``if TYPE_CHECKING:`` imports, which never run, are left out). No cycle
between modules, none between the top-level packages, and the layers:

- only ``epfleet.cli`` imports ``flows`` and ``deployments``, and nothing outside it
  imports ``epfleet.cli``;
- the fleet side (``epfleet.fleet``, ``epfleet.lifecycle``, fleet flows and tasks) and the
  device side (``epfleet.device``, the device-sync flow and task) never import each
  other: they meet in ``formats``, ``runtime``, ``stores`` and ``trust``;
- ``formats``, ``runtime``, ``stores`` and ``trust`` import neither side.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque

import grimp
import pytest

pytestmark = pytest.mark.fast

PACKAGES = ("epfleet", "eps", "tasks", "flows", "deployments")
DEVICE_SIDE = {"flows.device_sync", "tasks.sync"}
"""Flows and tasks that run the device engine; every other flow and task is fleet side."""
SHARED = ("epfleet.formats", "epfleet.runtime", "epfleet.stores", "epfleet.trust")


@functools.cache
def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True, cache_dir=None)


def within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def side(module: str) -> str | None:
    """``fleet``, ``device`` or None (shared, or the CLI that drives both)."""
    if within(module, "epfleet.device") or module in DEVICE_SIDE:
        return "device"
    if within(module, "epfleet.fleet", "epfleet.lifecycle") or (
        within(module, "flows", "tasks") and "." in module
    ):
        return "fleet"
    return None


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
    graph = import_graph()
    nodes = edges(graph)
    cycles = []
    for component in strongly_connected(nodes):
        first = component[0]
        within = {m: nodes[m] & set(component) for m in component}
        chain = shortest_path(within, first, {first})
        assert chain is not None
        cycles.append(f"{len(component)} modules {component}; e.g. {describe_chain(graph, chain)}")
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def unit(module: str) -> str:
    """The top-level package, the CLI counting as its own (the layer above the others)."""
    if within(module, "epfleet.cli", "epfleet.__main__"):
        return "epfleet.cli"
    return module.split(".")[0]


def test_no_cycle_between_top_level_packages() -> None:
    graph = import_graph()
    between: dict[str, set[str]] = {p: set() for p in (*PACKAGES, "epfleet.cli")}
    example: dict[tuple[str, str], str] = {}
    for importer, imported_set in edges(graph).items():
        for imported in imported_set:
            a, b = unit(importer), unit(imported)
            if a != b:
                between[a].add(b)
                example.setdefault((a, b), f"{importer} -> {imported}")
    cycles = []
    for component in strongly_connected(between):
        pairs = [(a, b) for a in component for b in component if (a, b) in example]
        cycles.append(f"{' <-> '.join(component)}: " + "; ".join(example[p] for p in pairs))
    assert not cycles, "cycles between packages:\n" + "\n".join(cycles)


def layer_slips(graph: grimp.ImportGraph) -> list[str]:
    slips = []
    for importer, imported_set in edges(graph).items():
        for imported in sorted(imported_set):
            edge = f"{importer} -> {imported}"
            if within(imported, "flows", "deployments") and not within(
                importer, "epfleet.cli", "flows", "deployments"
            ):
                slips.append(f"{edge}: only epfleet.cli imports flows and deployments")
            if within(imported, "epfleet.cli") and not within(
                importer, "epfleet.cli", "epfleet.__main__"
            ):
                slips.append(f"{edge}: nothing imports the CLI, the top layer")
            if {side(importer), side(imported)} == {"fleet", "device"}:
                slips.append(f"{edge}: the fleet and device sides meet only in shared packages")
            if within(importer, *SHARED) and side(imported) is not None:
                slips.append(f"{edge}: {', '.join(SHARED)} import neither side")
    return slips


def test_the_layers_hold() -> None:
    slips = layer_slips(import_graph())
    assert not slips, "imports across layers:\n" + "\n".join(slips)


def test_the_checks_find_cycles_and_chains() -> None:
    nodes = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert strongly_connected(nodes) == [["a", "b", "c"], ["e"]]
    assert shortest_path(nodes, "a", {"a"}) == ["a", "b", "c", "a"]
    assert shortest_path(nodes, "b", {"d"}) == ["b", "c", "d"]
    assert shortest_path(nodes, "d", {"a"}) is None
