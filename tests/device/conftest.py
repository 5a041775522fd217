"""Fixtures of the device tests: a small tmpfs to fill (``small_disk``), a store that
publishes HTP variants only (``htp_only_store``) and a cache synced from the fleet's store
once (``synced``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from epfleet.formats.device_report import DeviceReport
from tests.support.built_once import built_once, copy_with_keys
from tests.support.plain_fleet import compile_fleet
from tests.support.specs import HTP_TARGETS
from tests.support.synced_fleet import copy_store, run_sync


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MiB tmpfs (skipped where this process may not mount one)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="module")
def htp_only_store(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """tiny-cls and tiny-det × the two HTP targets: a copy of one in-process compile per
    test run (``tests.support.plain_fleet``, which stands for ``epfleet compile``)."""
    compiled = built_once(
        tmp_path_factory,
        "htp-only",
        lambda directory: compile_fleet(directory, model_dir, HTP_TARGETS),
    )
    return copy_with_keys(compiled, tmp_path_factory.mktemp("htp-only"))


@pytest.fixture
def synced(fleet_store: Path, tmp_path: Path) -> tuple[Path, Path, DeviceReport]:
    """A copy of the fleet's store and a cache synced from it once."""
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    first = run_sync(str(store), cache)
    assert first.exit_code == 0 and first.warnings == []
    return store, cache, first
