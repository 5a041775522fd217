"""Every test module is in one tier, declared at its top: ``pytestmark`` with
``pytest.mark.fast`` (pure, store, device-sync and attack tests: ``pytest -m fast``) or
``pytest.mark.slow`` (a Prefect API or server, the CLI in subprocesses, Dask clusters).
A fast module asks for no fixture that starts a Prefect API, and starts no subprocess
(it imports no ``subprocess``, nor a tests/support module that does): a command's
output and exit code are tested in-process (``epfleet.cli.app.main``), and what a
fresh interpreter imports in a slow module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import TESTS

pytestmark = pytest.mark.fast


def fixtures_used(tree: ast.AST) -> set[str]:
    """Fixture names the functions under ``tree`` take, name in ``usefixtures`` or ask for
    with ``request.getfixturevalue``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names |= {arg.arg for arg in node.args.args + node.args.kwonlyargs}
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
            ("usefixtures", "getfixturevalue")
        ):
            names |= {str(a.value) for a in node.args if isinstance(a, ast.Constant)}
    return names


def prefect_fixtures() -> set[str]:
    """``prefect_api`` and the shared fixtures (those of every conftest.py) that ask for it,
    directly or through another: the fixtures that start a Prefect API."""
    needs: dict[str, set[str]] = {}
    for conftest in TESTS.rglob("conftest.py"):
        for node in ast.walk(ast.parse(conftest.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                "fixture" in ast.unparse(d) for d in node.decorator_list
            ):
                needs.setdefault(node.name, set()).update(fixtures_used(node))
    found = {"prefect_api"}
    while grown := {name for name, used in needs.items() if used & found} - found:
        found |= grown
    return found


PREFECT_FIXTURES = prefect_fixtures()


def test_the_prefect_fixtures_are_found_and_the_compiled_fleet_is_not_one() -> None:
    """``cli_env`` passes the API to subprocesses; the compiled fleet is made in-process
    without Prefect (tests/support/plain_fleet.py)."""
    assert {"prefect_api", "cli_env"} <= PREFECT_FIXTURES
    assert not {"compiled_fleet", "fleet_store"} & PREFECT_FIXTURES


def tier(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            text = ast.unparse(node.value)
            return {name for name in ("fast", "slow") if f"pytest.mark.{name}" in text}
    return set()


def imported_modules(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def starts_subprocesses(tree: ast.Module) -> list[str]:
    """``subprocess``, or the tests/support modules that import it, if the module imports
    them."""
    found = []
    for name in sorted(imported_modules(tree)):
        if name == "subprocess":
            found.append(name)
        elif name.startswith("tests.support."):
            helper = TESTS / "support" / f"{name.rsplit('.', 1)[1]}.py"
            if "subprocess" in imported_modules(ast.parse(helper.read_text())):
                found.append(name)
    return found


def every_test_module() -> list[Path]:
    """Every test module, in every area directory (tests/<area>/test_*.py)."""
    return sorted(TESTS.rglob("test_*.py"))


@pytest.mark.parametrize("path", every_test_module(), ids=lambda p: str(p.relative_to(TESTS)))
def test_each_module_declares_one_tier(path: Path) -> None:
    name = path.relative_to(TESTS)
    tree = ast.parse(path.read_text())
    tiers = tier(tree)
    assert len(tiers) == 1, f"{name}: pytestmark must name one of fast, slow; got {tiers}"
    if tiers == {"fast"}:
        used = sorted(fixtures_used(tree) & PREFECT_FIXTURES)
        assert not used, f"{name} is fast but uses {used}: move those tests to a slow file"
        spawning = starts_subprocesses(tree)
        assert not spawning, (
            f"{name} is fast but imports {spawning}: move those tests to a slow file"
        )


def test_end_to_end_variants_are_moved_to_the_slow_tier_where_they_are_used() -> None:
    """A module that marks parameters ``END_TO_END`` (``tests.support.tiers``) is in a
    directory whose conftest moves them to the slow tier; elsewhere they would run in a
    fast module's tier too."""
    unmoved = []
    for path in every_test_module():
        tree = ast.parse(path.read_text())
        if "tests.support.tiers" not in imported_modules(tree):
            continue
        conftest = path.parent / "conftest.py"
        if not conftest.exists() or "move_end_to_end_to_slow" not in conftest.read_text():
            unmoved.append(str(path.relative_to(TESTS)))
    assert not unmoved, f"END_TO_END used where no conftest moves it to the slow tier: {unmoved}"
