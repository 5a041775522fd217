"""The import graph of epfleet, eps, tasks, flows and deployments (built with grimp), counting
every import a module makes: at module level, inside functions and in ``__main__``
blocks (only ``if TYPE_CHECKING:`` imports, which never run, are left out). No cycle
between modules, none between the top-level packages, and the layers:

- only ``epfleet.cli`` imports ``flows`` and ``deployments``, and nothing outside it
  imports ``epfleet.cli``;
- the fleet side (``epfleet.fleet``, ``epfleet.lifecycle``, fleet flows and tasks) and the
  device side (``epfleet.device``, the device-sync flow and task) never import each
  other: they meet in ``formats``, ``runtime``, ``stores`` and ``trust``;
- ``formats``, ``runtime``, ``stores`` and ``trust`` import neither side;
- rule modules (``tests.support.rule_modules``: each feature's ``rules``/``*_rules`` and
  ``models``, the device's pure modules) are pure by construction: of epfleet they
  import, directly or through others, only ``formats``, other rule modules and a few
  shared pure modules (``PURE_SHARED``); of the rest, the standard library (no clock,
  randomness, environment, process or file system module), pydantic, packaging and
  securesystemslib; and they call no clock (``now``, ``utcnow``, ``today``), no
  ``open``, ``print`` or ``input``, and load no EP module (``eps.load``: its caller
  passes it in) (``impurities``, an AST scan of their source).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import sys
from collections import deque

import grimp
import pytest

from tests.support.rule_modules import is_rule_module

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


PURE_SHARED = {
    "epfleet": "version constants",
    "epfleet.errors": "exception classes",
    "epfleet.hashing": "digests of bytes (its file readers are its callers' I/O)",
    "epfleet.stores.base": "the store interface's data types and key syntax, no backend",
    "epfleet.runtime.requests": "the compile request's data model",
    "eps": "the EP modules' declared facts, looked up by name",
    "eps.base": "the EP modules' shared types",
    "epfleet.text": "text formatting",
    "epfleet.device.cache.layout": "the device cache's file names",
    "epfleet.device.cache.state": "the device cache state's data model",
    "epfleet.trust.highwater": "the trust high-water mark's data model",
}
"""What of epfleet, besides ``formats`` and other rule modules, a rule module may import,
and why it is pure."""
FORMATS_IO = {"epfleet.formats.spec_file"}
"""``formats`` modules that read files (the spec's YAML): not for rule modules."""


def allowed_in_rules(module: str) -> bool:
    return (
        is_rule_module(module)
        or module in PURE_SHARED
        or (within(module, "epfleet.formats") and module not in FORMATS_IO)
    )


def rule_slips(graph: grimp.ImportGraph) -> list[str]:
    """Each rule module's import, direct or through other modules, of an epfleet module
    that is not a rule module, ``formats`` or ``PURE_SHARED``: a store, the settings, a
    clock, a feature's I/O side. Named with the chain that reaches it."""
    nodes = edges(graph)
    slips = []
    for rule in sorted(m for m in graph.modules if is_rule_module(m)):
        reached = {m for m in graph.find_upstream_modules(rule) if not allowed_in_rules(m)}
        direct = sorted(reached & nodes[rule])
        for bad in direct or sorted(reached)[:1]:
            chain = shortest_path(nodes, rule, {bad})
            assert chain is not None
            slips.append(f"{describe_chain(graph, chain)}: rules import only pure modules")
    return slips


def test_rule_modules_import_only_pure_modules() -> None:
    graph = import_graph()
    assert sum(is_rule_module(m) for m in graph.modules) >= 15, "rule modules not found"
    slips = rule_slips(graph)
    assert not slips, "rule modules that reach I/O:\n" + "\n".join(slips)


STDLIB_IMPURE = {
    "time": "a clock",
    "secrets": "randomness",
    "random": "randomness",
    "uuid": "randomness",
    "os": "the environment and the file system",
    "pathlib": "the file system",
    "io": "I/O",
    "shutil": "the file system",
    "tempfile": "the file system",
    "glob": "the file system",
    "subprocess": "processes",
    "multiprocessing": "processes",
    "threading": "threads",
    "concurrent": "threads",
    "asyncio": "an event loop",
    "socket": "the network",
    "ssl": "the network",
    "http": "the network",
    "urllib": "the network",
    "logging": "logs",
    "importlib": "modules loaded at run time",
}
"""Standard library modules a rule module does not import, and what each reaches."""
THIRD_PARTY_PURE = {"pydantic", "pydantic_core", "packaging", "securesystemslib"}
CLOCK_CALLS = {"now", "utcnow", "today"}
IO_BUILTINS = {"open", "print", "input", "breakpoint"}
LOADERS = {("eps", "load"): "loads an EP module: take it as an argument"}
"""Calls (``module.function``) that import code at run time, and why a rule makes none."""


def impurities(source: str) -> list[str]:
    """What in a rule module's ``source`` reaches a clock, randomness, the environment or
    I/O: an import of such a module (or of an unknown third-party one), a clock call
    (``datetime.now()``, ``utcnow()``, ``date.today()``) or a name imported for one,
    ``os.environ`` or ``getenv``, the I/O builtins, and ``eps.load`` (``LOADERS``)."""
    found = []

    def imported(name: str, line: int) -> None:
        top = name.split(".")[0]
        if top in STDLIB_IMPURE:
            found.append(f"line {line}: imports {name} ({STDLIB_IMPURE[top]})")
        elif top not in sys.stdlib_module_names and top not in THIRD_PARTY_PURE | {
            "epfleet",
            "eps",
            "__future__",
        }:
            found.append(f"line {line}: imports {name} (not the standard library or pydantic)")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported(node.module, node.lineno)
            for alias in node.names:
                if alias.name in CLOCK_CALLS | {"environ", "getenv"} or (
                    (node.module, alias.name) in LOADERS
                ):
                    found.append(f"line {node.lineno}: imports {alias.name} from {node.module}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in CLOCK_CALLS:
                found.append(f"line {node.lineno}: calls {name}() (a clock: take now)")
            elif isinstance(func, ast.Name) and name in IO_BUILTINS:
                found.append(f"line {node.lineno}: calls {name}() (I/O)")
            elif name == "getenv":
                found.append(f"line {node.lineno}: calls getenv() (the environment)")
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                why = LOADERS.get((func.value.id, func.attr))
                if why is not None:
                    found.append(f"line {node.lineno}: calls {func.value.id}.{func.attr}() ({why})")
        elif isinstance(node, ast.Attribute) and node.attr == "environ":
            found.append(f"line {node.lineno}: reads environ (the environment)")
    return sorted(set(found), key=lambda text: int(text.split()[1].rstrip(":")))


def module_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    with open(spec.origin, encoding="utf-8") as file:
        return file.read()


def test_rule_modules_reach_no_clock_randomness_environment_or_io() -> None:
    rules = sorted(m for m in import_graph().modules if is_rule_module(m))
    found = {m: problems for m in rules if (problems := impurities(module_source(m)))}
    assert not found, "impure rule modules:\n" + "\n".join(
        f"{m}: {'; '.join(problems)}" for m, problems in found.items()
    )


def test_the_purity_checks_find_planted_violations() -> None:
    planted = (
        "import secrets\n"
        "import time as clock\n"
        "import os\n"
        "from datetime import datetime, timezone\n"
        "from epfleet.formats.manifest import utcnow\n"
        "import boto3\n"
        "import json, statistics\n"  # the pure standard library is fine
        "from pydantic import BaseModel\n"
        "def decide(now: datetime) -> object:\n"
        "    stamp = datetime.now(timezone.utc)\n"
        "    other = utcnow()\n"
        "    token = secrets.token_hex(8)\n"
        "    region = os.environ.get('AWS_REGION')\n"
        "    fallback = os.getenv('X')\n"
        "    print(token)\n"
        "    return now - stamp, other, region, fallback, clock.time()\n"
        "import eps, importlib\n"  # the EP modules' facts are fine; loading one is not
        "def ladder(target: object) -> object:\n"
        "    return eps.load(target.ep).with_precision\n"
        "from eps import load\n"
    )
    assert impurities(planted) == [
        "line 1: imports secrets (randomness)",
        "line 2: imports time (a clock)",
        "line 3: imports os (the environment and the file system)",
        "line 5: imports utcnow from epfleet.formats.manifest",
        "line 6: imports boto3 (not the standard library or pydantic)",
        "line 10: calls now() (a clock: take now)",
        "line 11: calls utcnow() (a clock: take now)",
        "line 13: reads environ (the environment)",
        "line 14: calls getenv() (the environment)",
        "line 15: calls print() (I/O)",
        "line 17: imports importlib (modules loaded at run time)",
        "line 19: calls eps.load() (loads an EP module: take it as an argument)",
        "line 20: imports load from eps",
    ]
    assert impurities("import json\ndef f(now):\n    return json.dumps(str(now))\n") == []

    graph = grimp.ImportGraph()
    for module in (
        "epfleet.fleet.rollout.rules",
        "epfleet.fleet.rollout.rollouts",
        "epfleet.fleet.evidence.rules",
        "epfleet.formats.manifest",
        "epfleet.stores",
        "epfleet.stores.local",
        "epfleet.settings",
    ):
        graph.add_module(module)
    graph.add_import(importer="epfleet.fleet.rollout.rules", imported="epfleet.formats.manifest")
    graph.add_import(importer="epfleet.fleet.rollout.rollouts", imported="epfleet.stores")
    assert rule_slips(graph) == []  # an I/O module may import stores; formats is pure
    graph.add_import(
        importer="epfleet.fleet.rollout.rules", imported="epfleet.fleet.evidence.rules"
    )
    graph.add_import(importer="epfleet.fleet.evidence.rules", imported="epfleet.stores")
    graph.add_import(importer="epfleet.stores", imported="epfleet.stores.local")
    graph.add_import(importer="epfleet.formats.manifest", imported="epfleet.settings")
    assert rule_slips(graph) == [
        "epfleet.fleet.evidence.rules -> epfleet.stores: rules import only pure modules",
        "epfleet.fleet.rollout.rules -> epfleet.formats.manifest -> epfleet.settings: "
        "rules import only pure modules",
    ]
