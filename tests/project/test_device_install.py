"""The device install (``pip install epfleet``, no extra) runs ``epfleet sync``: read from
the import graph (grimp, every import a module makes, inside functions too) and from
``pyproject.toml``.

- What ``epfleet sync`` imports reaches no extra's package (Prefect, boto3, PyYAML, ...)
  nor the fleet side, but through the few imports that run only when asked for (``--flow``
  or ``--serve``; an ``s3://`` store), each inside a function.
- The core dependencies hold none of the extras' packages, and ``epfleet.extras`` names
  only extras that ``pyproject.toml`` declares, each with that package.

A fresh venv with the device install, syncing for real: tests/project/test_device_venv.py.
"""

from __future__ import annotations

import ast
import functools
from collections import deque

import grimp
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from epfleet.extras import EXTRA_OF
from tests.support.paths import REPO

pytestmark = pytest.mark.fast

PACKAGES = ("epfleet", "eps", "tasks", "flows", "deployments")
SYNC_COMMAND = ("epfleet.__main__", "epfleet.cli.app", "epfleet.cli.sync")
NOT_ON_A_DEVICE = ("flows", "tasks", "deployments", "epfleet.fleet", "epfleet.lifecycle")
ONLY_WHEN_ASKED = {
    ("epfleet.cli.sync", "epfleet.cli.prefect_api"): "sync --flow or --serve",
    ("epfleet.cli.sync", "flows.device_sync"): "sync --flow or --serve",
    ("epfleet.stores.probe", "epfleet.stores.s3"): "an s3:// store that is not there",
    ("epfleet.stores.probe", "botocore"): "an s3:// store that is not there",
}
"""Imports on the sync command's path that run only for what needs an extra."""
PIP_PACKAGE = {
    "yaml": "pyyaml",
    "botocore": "boto3",
    "dask": "prefect-dask",
    "distributed": "prefect-dask",
    "model_signing": "model-signing",
    "OpenSSL": "pyopenssl",
}
"""The package an extra declares that brings a module, where its name is not the module's."""


@functools.cache
def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph(
        *PACKAGES,
        include_external_packages=True,
        exclude_type_checking_imports=True,
        cache_dir=None,
    )


def within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def chain_to(graph: grimp.ImportGraph, starts: tuple[str, ...], goal: tuple[str, ...]) -> str:
    """The first import chain from ``starts`` to a module within ``goal``, leaving out the
    imports in ``ONLY_WHEN_ASKED``; empty when there is none."""
    came_from: dict[str, str | None] = dict.fromkeys(starts)
    queue = deque(starts)
    while queue:
        module = queue.popleft()
        if within(module, *goal):
            chain = [module]
            while (back := came_from[chain[-1]]) is not None:
                chain.append(back)
            return " -> ".join(reversed(chain))
        if module.split(".")[0] not in PACKAGES:
            continue  # a third-party package: its own imports are not epfleet's to choose
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if (module, imported) not in ONLY_WHEN_ASKED and imported not in came_from:
                came_from[imported] = module
                queue.append(imported)
    return ""


def test_the_sync_command_imports_no_extra_and_no_fleet_code() -> None:
    graph = import_graph()
    assert chain_to(graph, SYNC_COMMAND, ("epfleet.device.session",))  # the walk finds it
    assert chain_to(graph, SYNC_COMMAND, tuple(EXTRA_OF)) == ""
    assert chain_to(graph, SYNC_COMMAND, NOT_ON_A_DEVICE) == ""


def test_the_walk_finds_an_extra_through_an_import_not_left_out() -> None:
    graph = import_graph()
    assert chain_to(graph, ("epfleet.cli.compile",), ("prefect",)) != ""
    assert "flows.device_sync" in chain_to(graph, ("flows.device_sync",), ("prefect",))


def enclosing_function(tree: ast.Module, line: int) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            if node.lineno < line <= end:
                return node.name
    return None


@pytest.mark.parametrize(("importer", "imported"), sorted(ONLY_WHEN_ASKED))
def test_each_import_left_out_runs_inside_a_function(importer: str, imported: str) -> None:
    graph = import_graph()
    details = graph.get_import_details(importer=importer, imported=imported)
    assert details, f"{importer} no longer imports {imported}: take it out of ONLY_WHEN_ASKED"
    source = (REPO / (importer.replace(".", "/") + ".py")).read_text()
    tree = ast.parse(source)
    for detail in details:
        where = enclosing_function(tree, detail["line_number"])
        assert where, f"{importer} line {detail['line_number']} imports {imported} at its top"


def pyproject() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project


def names(requirements: object) -> set[str]:
    assert isinstance(requirements, list)
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_the_core_dependencies_hold_no_extra_and_each_extra_is_declared() -> None:
    project = pyproject()
    core = names(project["dependencies"])
    optional = project["optional-dependencies"]
    assert isinstance(optional, dict)
    for module, extra in EXTRA_OF.items():
        package = canonicalize_name(PIP_PACKAGE.get(module, module))
        assert package not in core, f"{package} is the {extra!r} extra's, not the device's"
        assert extra in optional, f"epfleet.extras names {extra!r}; pyproject.toml has none"
        assert package in names(optional[extra]), f"the {extra!r} extra lacks {package}"
    assert {"onnxruntime", "tuf", "cryptography", "urllib3", "zstandard"} <= core
