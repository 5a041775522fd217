"""Configuration flows as values: no module of the package writes the process's
environment, and the pure rule modules (``tests.support.rule_modules``) read no setting
at all."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.rule_modules import is_rule_module

pytestmark = pytest.mark.fast

PACKAGES = ("epfleet", "eps", "tasks", "flows", "deployments")
WRITERS = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
"""The methods of ``os.environ`` that change it."""


def modules(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (REPO / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ`` (``from os import environ``)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _writes(func: ast.expr) -> bool:
    """Whether a call of ``func`` changes the environment."""
    if isinstance(func, ast.Attribute):
        if func.attr in WRITERS and _is_environ(func.value):
            return True
        return func.attr in {"putenv", "unsetenv"}
    return isinstance(func, ast.Name) and func.id in {"putenv", "unsetenv"}


def environment_writes(source: str) -> list[int]:
    """The lines of ``source`` that change the process environment: an assignment to or
    deletion of ``os.environ[...]``, one of its writing methods, ``os.putenv`` or
    ``os.unsetenv``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and _writes(node.func):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_every_kind_of_write() -> None:
    source = (
        "import os\nfrom os import environ\n"
        "os.environ['A'] = '1'\n"
        "os.environ.setdefault('B', '2')\n"
        "os.environ.update(C='3')\n"
        "os.environ.pop('D', None)\n"
        "os.putenv('E', '5')\n"
        "del os.environ['F']\n"
        "environ['G'] = '7'\n"
        "value = os.environ.get('H')\n"  # reading is fine
        "env = {**os.environ, 'I': '9'}\n"  # so is a copy for a child process
    )
    assert environment_writes(source) == [3, 4, 5, 6, 7, 8, 9]


def test_no_module_writes_the_environment() -> None:
    """Settings reach what needs them as values (parameters, Prefect's scoped settings,
    Dask's config, a child's ``env=``): a write to ``os.environ`` outlives the call that
    made it, leaking into the rest of the process (and, in the tests, into other tests)."""
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in modules(*PACKAGES)
        for line in environment_writes(path.read_text())
    ]
    assert not found, f"writes to the process environment: {found}"


def _getenv(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "getenv") or (
        isinstance(node, ast.Name) and node.id == "getenv"
    )


def _imports_settings(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.startswith("epfleet.settings") for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.module == "epfleet.settings" or (
            node.module == "epfleet" and any(a.name == "settings" for a in node.names)
        )
    return False


def reads_of_settings(source: str) -> list[str]:
    """What in ``source`` reads configuration: ``os.environ``, ``os.getenv`` or an
    import of ``epfleet.settings``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if _is_environ(node) or _getenv(node):
            found.append(f"line {node.lineno}: the environment")
        elif _imports_settings(node):
            found.append(f"line {node.lineno}: epfleet.settings")
    return found


def test_rule_modules_take_values_not_settings() -> None:
    """A rule module is pure: what it decides with is passed by its caller."""
    rules = [p for p in modules(*PACKAGES) if is_rule_module(module_name(p))]
    assert rules, "no rule modules found"
    found = {
        str(path.relative_to(REPO)): reads
        for path in rules
        if (reads := reads_of_settings(path.read_text()))
    }
    assert not found, f"rule modules that read configuration: {found}"


def test_the_rules_scan_finds_reads() -> None:
    source = (
        "import os\n"
        "def f():\n"
        "    from epfleet.settings import settings\n"
        "    return os.environ.get('X'), os.getenv('Y')\n"
    )
    assert len(reads_of_settings(source)) == 3
