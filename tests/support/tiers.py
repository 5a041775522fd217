"""The end-to-end variant of a test: ``END_TO_END`` marks a parameter (a store over HTTP: S3
on moto, the hostile HTTPS mirror) whose tests run in the slow tier only, even in a fast
module, and ``on_stores`` gives a store parameter list with it. A directory whose tests
use it calls ``move_end_to_end_to_slow`` from its conftest's
``pytest_collection_modifyitems`` (tests/trust/, tests/stores/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

END_TO_END = pytest.mark.slow

LOCAL_STORES = ("local", "memory")
"""In-process stores: a test on them stays in its module's tier."""


def on_stores(*names: str, in_tier: tuple[str, ...] = LOCAL_STORES) -> list[Any]:
    """``names`` as a fixture's params, those not in ``in_tier`` (by default the in-process
    stores) marked ``END_TO_END``."""
    return [name if name in in_tier else pytest.param(name, marks=END_TO_END) for name in names]


def is_end_to_end(item: pytest.Item) -> bool:
    """Whether ``item`` is a test's end-to-end variant (its parameter is marked so)."""
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(m.name == END_TO_END.name for m in callspec.marks)


def move_end_to_end_to_slow(items: list[pytest.Item], directory: Path) -> None:
    """In each fast module under ``directory`` with end-to-end tests, move the module's
    ``fast`` mark onto its other tests, so that ``-m fast`` leaves the end-to-end ones out
    (``-m slow`` takes them by their parameter's mark). Call it before ``-m`` deselects
    (``pytest.hookimpl(tryfirst=True)``)."""
    mine = [item for item in items if directory in item.path.parents]
    modules = {item.getparent(pytest.Module) for item in mine if is_end_to_end(item)}
    for module in modules:
        if module is None or not any(m.name == "fast" for m in module.own_markers):
            continue
        module.own_markers[:] = [m for m in module.own_markers if m.name != "fast"]
        for item in mine:
            if item.getparent(pytest.Module) is module and not is_end_to_end(item):
                item.add_marker(pytest.mark.fast)
