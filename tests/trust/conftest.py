"""Fixtures of the attack suites (tests/trust/test_*attacks*.py, test_tolerance_attack.py): a
device that trusts a signed copy of the compiled fleet, on each kind of store.

Each attack's logic runs once in its module's tier, on the local store; its runs on S3
(moto over HTTP) and on the hostile HTTPS mirror are end-to-end (``END_TO_END``
parameters): they run in the slow tier only, even where the module is fast (the hook
below), so the fast tier checks every attack once and the slow tier every store's
wiring, and no assertion is dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.signed_fleet import (
    Fleet,
    Site,
    mirror_site,
    s3_site,
    trusted,
)
from tests.support.synced_fleet import unsigned_copy
from tests.support.tiers import move_end_to_end_to_slow, on_stores


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    move_end_to_end_to_slow(items, Path(__file__).parent)


@pytest.fixture(params=on_stores("local", "s3", "https-mirror"))
def site(request: pytest.FixtureRequest, fleet_store: Path, tmp_path: Path) -> Site:
    directory = unsigned_copy(fleet_store, tmp_path / "store")
    if request.param == "local":
        return Site(directory, str(directory), lambda: None)
    if request.param == "https-mirror":
        return mirror_site(request, directory)
    return s3_site(request, directory)


@pytest.fixture
def fleet(site: Site, tmp_path: Path) -> Fleet:
    return trusted(site, tmp_path)


@pytest.fixture
def fleet_on_s3(request: pytest.FixtureRequest, fleet_store: Path, tmp_path: Path) -> Fleet:
    return trusted(s3_site(request, unsigned_copy(fleet_store, tmp_path / "store")), tmp_path)


@pytest.fixture
def local_fleet(fleet_store: Path, tmp_path: Path) -> Fleet:
    directory = unsigned_copy(fleet_store, tmp_path / "store")
    return trusted(Site(directory, str(directory), lambda: None), tmp_path)


@pytest.fixture
def mirror_fleet(request: pytest.FixtureRequest, fleet_store: Path, tmp_path: Path) -> Fleet:
    return trusted(mirror_site(request, unsigned_copy(fleet_store, tmp_path / "store")), tmp_path)
