"""The stores' tests: their end-to-end variants (``tests.support.tiers.END_TO_END``) run in
the slow tier only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiers import move_end_to_end_to_slow


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    move_end_to_end_to_slow(items, Path(__file__).parent)
