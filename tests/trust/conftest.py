"""Fixtures of the attack suites (tests/trust/test_*attacks*.py, test_tolerance_attack.py): a
device that trusts a signed copy of the compiled fleet, on each kind of store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.signed_fleet import (
    Fleet,
    Site,
    mirror_site,
    s3_site,
    trusted,
    unsigned_copy,
)


@pytest.fixture(params=["local", "s3", "https-mirror"])
def site(request: pytest.FixtureRequest, fleet_store: Path, tmp_path: Path) -> Site:
    directory = unsigned_copy(fleet_store, tmp_path / "store")
    if request.param == "local":
        return Site(directory, str(directory), lambda: None)
    if request.param == "https-mirror":
        return mirror_site(request, directory)
    return s3_site(request, directory)


@pytest.fixture
def signed_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices trust signed metadata only, whatever tests/conftest.py allows (the attack
    suites use it for every test: ``pytest.mark.usefixtures("signed_only")``)."""
    monkeypatch.delenv("EPFLEET_ALLOW_UNSIGNED", raising=False)
    monkeypatch.delenv("EPFLEET_TRUST_ROOT", raising=False)


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
