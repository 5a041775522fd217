"""The package's shape: each module opens with a line that says its one concern. (Size is
left to review, not to a line cap: a 400-line cap once split one S3 store
over four files that reach into each other's private members.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.fast

PACKAGES = ("epfleet", "eps", "tasks", "flows", "deployments")


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def test_every_module_states_its_concern() -> None:
    missing = []
    for path in modules():
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        if not docstring or len(docstring.splitlines()[0]) < 15:
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"modules without a docstring stating their one concern: {missing}"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any level (``from . import x`` left out)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_tests_mirror_the_package_and_share_only_through_support_and_conftest() -> None:
    """Test files live in tests/<area>/ (one per package concern), and none imports another
    test module or a conftest: what tests share is a fixture in a conftest.py or a helper
    in tests/support, imported one way (``tests.support.<module>``)."""
    tests = REPO / "tests"
    assert not list(tests.glob("test_*.py")), "test files belong in tests/<area>/"
    areas = {p.parent.name for p in tests.rglob("test_*.py")}
    assert {"device", "fleet", "formats", "stores", "trust", "cli"} <= areas, areas
    local = {p.stem for p in tests.rglob("*.py")}
    wrong = {}
    for path in sorted(tests.rglob("*.py")):
        for name in imported_modules(path):
            last = name.rsplit(".", 1)[-1]
            test_module = last.startswith("test_") or last == "conftest"
            bare_local = "." not in name and name in local
            if (name.startswith("tests.") and test_module) or bare_local:
                wrong.setdefault(str(path.relative_to(REPO)), []).append(name)
    assert not wrong, f"imports of test modules, conftest or helpers by a bare name: {wrong}"
