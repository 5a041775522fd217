"""A completely full disk, for real: a small tmpfs filled to its last byte under the device
cache, the worker cache (EPFLEET_CACHE) or a local store.

Every write then fails with ENOSPC where it happens (a temporary file's first byte, a
directory entry, ngclient's metadata), not where a test double says. The device's sync
ends in one line per failure with its report still printed (``--json`` a valid object),
exit 1, nothing half-written and the active variant intact; a compile ends with one line
naming the full disk, exit 1, nothing half-published. Once there is room again, the next
run does what the full disk stopped.

Mounting a tmpfs needs root (CAP_SYS_ADMIN): where that is missing these tests are
skipped, saying so, and tests/trust/test_marks.py still checks how an ENOSPC injected at
the trust directory's write primitive is reported.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport
from epfleet.fsutil import free_bytes, is_temp_name
from tests.support.signed_fleet import DEVICE, MODEL, Repo, rebuilt
from tests.support.specs import CPU_TARGET, write_spec
from tests.support.synced_fleet import (
    assert_package_runs,
    read_manifest,
    republish_edited_cpu_variant,
    unsigned_copy,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs mounted at ``tmp_path/disk`` for this test (unmounted after it)."""
    where = tmp_path / "disk"
    where.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", str(where)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Fill the filesystem of ``disk`` to its last byte; returns the file that does."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 1 << 12, 1):
            chunk = bytes(size)
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    assert free_bytes(disk) == 0
    return filler


def files_of(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory`` but the lock, by relative path."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != "lock"
    }


def epfleet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epfleet", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_a_full_disk_fails_the_device_sync_in_one_line_and_keeps_what_runs(
    fleet_store: Path, small_disk: Path, tmp_path: Path
) -> None:
    store = unsigned_copy(fleet_store, tmp_path / "store")
    repo = Repo(store)
    cache, policy = small_disk / "device", SyncPolicy(models=[MODEL])
    first = sync(str(store), cache, policy, DEVICE, trust_root=repo.root_file)
    [good] = first.models
    assert first.exit_code == 0 and good.action == "downloaded", good.reason
    republish_edited_cpu_variant(store, rebuilt)  # a new build, signed: the sync wants it
    repo.publish()
    before = files_of(cache)
    filler = fill(small_disk)

    done = epfleet("sync", "--store", str(store), "--cache", str(cache), "--model", MODEL)
    done_json = epfleet(
        "sync", "--store", str(store), "--cache", str(cache), "--model", MODEL, "--json"
    )

    for run in (done, done_json):
        assert run.returncode == 1, run.stderr
        assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "manifest: rejected" in done.stdout and f"{MODEL}  " in done.stdout, done.stdout
    report = DeviceReport.model_validate_json(done_json.stdout)
    reason = report.manifest.reason or ""
    assert report.manifest.status == "rejected" and report.manifest.signed, report.manifest
    assert "no disk space to write" in reason and str(cache) in reason, reason
    [model] = report.models
    assert model.action == "kept" and model.variant == good.variant, model.reason
    assert any("last-report.json" in w for w in report.warnings), report.warnings
    assert files_of(cache) == before  # nothing half-written, nothing lost
    assert not [p for p in cache.rglob("*") if is_temp_name(p.name)]
    assert_package_runs(cache, {MODEL: good.variant or ""})

    filler.unlink()  # room again: the next sync takes the new build
    again = sync(str(store), cache, policy, DEVICE)
    [model] = again.models
    assert again.exit_code == 0 and model.action == "downloaded", model.reason
    assert model.variant != good.variant


def edited_spec(directory: Path, model_dir: Path) -> Path:
    """A spec of tiny-cls for the CPU target whose source changed since ``fleet_store``."""
    source = onnx.load(model_dir / "tiny-cls.onnx")
    source.doc_string = "a new revision"
    onnx.save(source, directory / "tiny-cls.onnx")
    entry = {"name": MODEL, "source": str(directory / "tiny-cls.onnx")}
    return write_spec(directory, [entry | {"input_shapes": {"x": [1, 3, 48, 192]}}], [CPU_TARGET])


def signed_copy(source: Path, dest: Path) -> Path:
    """A copy of a compiled store with its signed metadata and development keys."""
    shutil.copytree(source, dest)
    keys = source.with_name(f"{source.name}.dev-keys")
    shutil.copytree(keys, dest.with_name(f"{dest.name}.dev-keys"))
    return dest


def published(store: Path) -> tuple[bytes, bytes]:
    return (store / "manifest.json").read_bytes(), (
        store / "trust" / "metadata" / "timestamp.json"
    ).read_bytes()


@pytest.mark.parametrize("full", ["worker cache", "store"])
def test_a_full_disk_fails_the_compile_in_one_line_naming_it_and_publishes_nothing(
    full: str,
    fleet_store: Path,
    small_disk: Path,
    tmp_path: Path,
    model_dir: Path,
    prefect_api: str,
) -> None:
    spec = edited_spec(tmp_path, model_dir)
    on_disk = full == "store"
    store = signed_copy(fleet_store, (small_disk if on_disk else tmp_path) / "store")
    worker_cache = (tmp_path if on_disk else small_disk) / "cache"
    env = dict(os.environ, PREFECT_API_URL=prefect_api, EPFLEET_CACHE=str(worker_cache))
    before = published(store)
    generation = read_manifest(store).generation
    filler = fill(small_disk)

    done = epfleet("compile", str(spec), "--store", str(store), env=env)

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "no disk space left" in last, last
    assert str(store if on_disk else worker_cache) in last, last
    assert ("EPFLEET_CACHE" in last) != on_disk, last
    assert published(store) == before  # nothing half-published

    filler.unlink()
    again = epfleet("compile", str(spec), "--store", str(store), env=env)
    assert again.returncode == 0, again.stderr
    assert read_manifest(store).generation == generation + 1
    device = sync(str(store), tmp_path / "device", SyncPolicy(models=[MODEL]), DEVICE)
    assert device.exit_code == 0 and device.manifest.signed, device.manifest
