"""The package's shape: small modules, each opening with a line that says what it is for."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.fast

PACKAGES = ("epfleet", "eps", "tasks", "flows", "deployments")
MAX_LINES = 400


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {p.relative_to(REPO): len(p.read_text().splitlines()) for p in modules()}
    assert len(sizes) > 50
    over = {str(path): lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"


def test_every_module_states_its_concern() -> None:
    missing = []
    for path in modules():
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        if not docstring or len(docstring.splitlines()[0]) < 15:
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"modules without a docstring stating their one concern: {missing}"
