"""The device cache under faults a sync meets in-process: links planted in it, damaged
state, an odd lock file, no room for a download, provider options the EP does not take,
the umask. Those that need a process of their own or a mount (a dead or killed sync, a
file size limit, a full or read-only file system, another user) are in
test_faults_e2e.py (slow tier).

Real syncs against a local store compiled in-process as `epfleet compile` compiles it
(``fleet_store``, tests/conftest.py). Each case ends with nothing outside the cache
written or deleted, the active variant (or the one before it) still selected and
running, and a warning in the device report naming the path that was repaired.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import onnx
import pytest

from epfleet.device.cache import DISK_MARGIN
from epfleet.device.cache.repair import model_metadata
from epfleet.errors import CacheDamaged, StoreError
from epfleet.formats.device_report import DeviceReport
from epfleet.stores.local import LocalStore
from epfleet.text import MB
from tests.support.cache_faults import (
    MODEL,
    active,
    package_variants,
    rebuilt,
    snapshot,
    warned,
)
from tests.support.disks import fill
from tests.support.synced_fleet import (
    assert_package_runs,
    copy_store,
    edit_manifest,
    make_unreadable,
    read_manifest,
    republish_edited_cpu_variant,
    run_sync,
    unsigned_copy,
)

pytestmark = pytest.mark.fast


# --- links planted in the cache are never followed ----------------------------------------


def test_a_link_planted_at_the_partial_file_is_not_written_through(
    synced: tuple[Path, Path, DeviceReport], tmp_path: Path
) -> None:
    """The resume path used to pwrite the model's bytes into the link's target."""
    store, cache, first = synced
    republish_edited_cpu_variant(store, rebuilt)
    artifact = read_manifest(store).models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious")  # smaller than the artifact: it looks like a prefix
    part = cache / ".epfleet" / "partial" / f"{artifact.sha256}.part"
    part.symlink_to(outside)

    report = run_sync(str(store), cache, models=[MODEL])

    assert outside.read_bytes() == b"precious"
    [result] = report.models
    assert result.action == "downloaded", result.reason
    assert warned(report, str(part), "symbolic link", "its target untouched")
    assert package_variants(cache) == [result.variant, active(first)]
    assert_package_runs(cache, {MODEL: active(report), "tiny-det": active(first, "tiny-det")})


def test_a_linked_model_directory_is_not_pruned_or_written_through(
    synced: tuple[Path, Path, DeviceReport], tmp_path: Path
) -> None:
    """prune() used to delete the variant directories in the link's target, and the new
    variant was installed there."""
    store, cache, first = synced
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(cache / "models" / MODEL, elsewhere)
    (elsewhere / "x86-cpu-000000000000").mkdir()
    (elsewhere / "x86-cpu-000000000000" / "model.onnx").write_bytes(b"not epfleet's")
    (elsewhere / "notes.txt").write_text("mine")
    before = snapshot(elsewhere)
    shutil.rmtree(cache / "models" / MODEL)
    (cache / "models" / MODEL).symlink_to(elsewhere)
    republish_edited_cpu_variant(store, rebuilt)

    report = run_sync(str(store), cache)

    assert snapshot(elsewhere) == before
    assert not (cache / "models" / MODEL).is_symlink()
    assert warned(report, str(cache / "models" / MODEL), "symbolic link")
    assert [m.action for m in report.models] == ["downloaded", "kept"]
    assert_package_runs(cache, {MODEL: active(report), "tiny-det": active(first, "tiny-det")})


def test_a_linked_partial_directory_is_not_tidied_through(
    synced: tuple[Path, Path, DeviceReport], tmp_path: Path
) -> None:
    """tidy() used to delete the old files in the link's target."""
    store, cache, first = synced
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    old = time.time() - 30 * 24 * 3600
    for name in ("0" * 64 + ".part", "notes.txt", ".state.json.abcdefgh.tmp"):
        (elsewhere / name).write_text("mine")
        os.utime(elsewhere / name, (old, old))
    before = snapshot(elsewhere)
    partial = cache / ".epfleet" / "partial"
    partial.rmdir()
    partial.symlink_to(elsewhere)

    report = run_sync(str(store), cache)

    assert snapshot(elsewhere) == before
    assert not partial.is_symlink()
    assert warned(report, str(partial), "symbolic link")
    assert [m.action for m in report.models] == ["kept", "kept"]
    assert_package_runs(cache, {m.model: m.variant or "" for m in first.models})


def test_a_linked_variant_directory_gets_no_model_written_into_its_target(
    synced: tuple[Path, Path, DeviceReport], tmp_path: Path
) -> None:
    store, cache, first = synced
    republish_edited_cpu_variant(store, rebuilt)
    artifact = read_manifest(store).models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    variant_dir = cache / "models" / MODEL / f"x86-cpu-{artifact.sha256[:12]}"
    variant_dir.symlink_to(elsewhere)

    report = run_sync(str(store), cache, models=[MODEL])

    assert list(elsewhere.iterdir()) == []
    assert not variant_dir.is_symlink() and (variant_dir / "model.onnx").is_file()
    assert warned(report, str(variant_dir), "symbolic link")
    assert active(report) == variant_dir.name
    assert package_variants(cache) == [variant_dir.name, active(first)]  # rollback kept
    assert_package_runs(cache, {MODEL: variant_dir.name, "tiny-det": active(first, "tiny-det")})


# --- damaged state heals ---------------------------------------------------------------------


def two_variants(store: Path, cache: Path) -> tuple[str, str]:
    """Make tiny-cls hold a new build (active) and the first one (previous); their names."""
    first = active(run_sync(str(store), cache, models=[MODEL]))
    republish_edited_cpu_variant(store, rebuilt)
    second = active(run_sync(str(store), cache, models=[MODEL]))
    assert package_variants(cache) == [second, first]
    return second, first


DAMAGE = {
    "truncated": lambda path, outside: path.write_bytes(path.read_bytes()[:100]),
    "empty": lambda path, outside: path.write_bytes(b""),
    "wrong schema": lambda path, outside: path.write_text('{"schema_version": "9", "x": 1}'),
    "a directory": lambda path, outside: (path.unlink(), path.mkdir()),
    "a link": lambda path, outside: (path.rename(outside), path.symlink_to(outside)),
    "missing": lambda path, outside: path.unlink(),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_state_is_rebuilt_from_the_cache(
    damage: str,
    fleet_store: Path,
    tmp_path: Path,
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    second, first = two_variants(store, cache)
    state = cache / ".epfleet" / "state.json"
    outside = tmp_path / "outside-state.json"
    DAMAGE[damage](state, outside)
    outside_before = outside.read_bytes() if outside.exists() else None

    report = run_sync(str(store), cache, models=[MODEL])

    [result] = report.models
    assert (result.action, result.variant, result.bytes_downloaded) == ("kept", second, 0)
    assert warned(report, str(state), "rebuilt", f"{MODEL}: {second}")
    assert package_variants(cache) == [second, first]  # the rollback variant is kept too
    assert_package_runs(cache, {MODEL: second})
    assert json.loads(state.read_text())["models"][MODEL]["active"]["name"] == second
    assert (outside.read_bytes() if outside.exists() else None) == outside_before
    again = run_sync(str(store), cache, models=[MODEL])
    assert again.warnings == [] and [m.action for m in again.models] == ["kept"]


@pytest.mark.usefixtures("unsigned_allowed")  # offline: see make_unreadable
def test_the_active_variant_stays_while_the_state_is_rebuilt_offline(
    fleet_store: Path,
    tmp_path: Path,
) -> None:
    """Damaged state and an unreachable store: the sync cannot go on (no manifest it may
    trust), but the package still selects and runs what it ran."""
    store = unsigned_copy(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    second, first = two_variants(store, cache)
    (cache / ".epfleet" / "state.json").write_bytes(b"{")
    make_unreadable(store)
    with pytest.raises(StoreError, match="no usable manifest"):
        run_sync(str(store), cache, models=[MODEL])
    assert package_variants(cache) == [second, first]
    assert_package_runs(cache, {MODEL: second})


def test_a_local_build_is_kept_when_the_state_is_rebuilt(
    fleet_store: Path,
    tmp_path: Path,
) -> None:
    """A variant built on the device is in no manifest: its model file's metadata (read
    without loading the graph) and the package's entry say what it is."""
    store = copy_store(fleet_store, tmp_path / "store")
    # Only HTP variants published: built here for the CPU.
    edit_manifest(store, lambda document: document["models"][MODEL]["variants"].pop("x86-cpu"))
    cache = tmp_path / "device"
    [built] = run_sync(str(store), cache, models=[MODEL]).models
    assert built.action == "recompiled" and built.variant
    model_file = cache / "models" / MODEL / built.variant / "model.onnx"
    expected = {p.key: p.value for p in onnx.load(str(model_file)).metadata_props}
    assert model_metadata(model_file) == expected
    (cache / ".epfleet" / "state.json").write_text("[]")

    report = run_sync(str(store), cache, models=[MODEL])

    [result] = report.models
    assert (result.action, result.variant) == ("kept", built.variant), result.reason
    assert warned(report, "state.json", "rebuilt")
    assert_package_runs(cache, {MODEL: built.variant})


def test_a_model_directory_replaced_by_a_file_is_repaired(
    synced: tuple[Path, Path, DeviceReport],
) -> None:
    store, cache, first = synced
    shutil.rmtree(cache / "models" / MODEL)
    (cache / "models" / MODEL).write_text("not a directory")

    report = run_sync(str(store), cache)

    assert [m.action for m in report.models] == ["downloaded", "kept"], report.models[0].reason
    assert warned(report, str(cache / "models" / MODEL), "was a file")
    assert_package_runs(cache, {m.model: m.variant or "" for m in first.models})


@pytest.mark.parametrize("place", ["manifest.json", ".epfleet/state.json", ".epfleet/lock"])
def test_a_full_directory_where_a_file_belongs_is_refused_by_name(
    place: str, synced: tuple[Path, Path, DeviceReport]
) -> None:
    """epfleet removes only what it created: someone's directory is not deleted."""
    store, cache, first = synced
    path = cache / place
    path.unlink()
    (path / "someone's").mkdir(parents=True)
    with pytest.raises(CacheDamaged, match=f"{path} is a directory that is not empty"):
        run_sync(str(store), cache)
    assert (path / "someone's").is_dir()
    shutil.rmtree(path)
    report = run_sync(str(store), cache)  # moved away: the next sync repairs the rest
    assert report.exit_code == 0
    assert_package_runs(cache, {m.model: m.variant or "" for m in first.models})


# --- the lock --------------------------------------------------------------------------------


def test_an_odd_lock_file_is_replaced(
    synced: tuple[Path, Path, DeviceReport], tmp_path: Path
) -> None:
    store, cache, _ = synced
    lock = cache / ".epfleet" / "lock"
    lock.unlink()
    lock.mkdir()  # used to fail every sync with a raw IsADirectoryError
    report = run_sync(str(store), cache)
    assert report.exit_code == 0 and lock.is_file()
    assert warned(report, str(lock), "was a directory")

    outside = tmp_path / "not-created"
    lock.unlink()
    lock.symlink_to(outside)  # opening it for append used to create the target
    report = run_sync(str(store), cache)
    assert report.exit_code == 0 and not outside.exists() and not lock.is_symlink()
    assert warned(report, str(lock), "symbolic link")


# --- disk space ------------------------------------------------------------------------------


def test_a_download_without_room_fails_and_keeps_the_previous_variant(
    fleet_store: Path,
    tmp_path: Path,
    small_disk: Path,
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    cache = small_disk / "device"
    before = active(run_sync(str(store), cache, models=[MODEL]))
    republish_edited_cpu_variant(store, rebuilt)
    stale = cache / ".epfleet" / "partial" / f"{'b' * 64}.part"
    stale.write_bytes(b"\0" * (3 * MB))
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    fill(small_disk, DISK_MARGIN // 2)

    report = run_sync(str(store), cache, models=[MODEL])

    [result] = report.models
    assert result.action == "failed" and result.variant == before
    assert "not enough disk space" in result.reason and "MB free in" in result.reason
    assert "needs 16.0 MB" in result.reason, result.reason
    assert warned(report, "dropped the partial download", stale.name)  # oldest first
    assert [p.name for p in (cache / ".epfleet" / "partial").iterdir()] == []
    assert_package_runs(cache, {MODEL: before})

    (small_disk / "filler").unlink()  # room again: the next sync gets it
    again = run_sync(str(store), cache, models=[MODEL])
    assert [m.action for m in again.models] == ["downloaded"]


def test_old_partial_downloads_make_room(
    fleet_store: Path,
    tmp_path: Path,
    small_disk: Path,
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    cache = small_disk / "device"
    run_sync(str(store), cache, models=[MODEL])
    republish_edited_cpu_variant(store, rebuilt)
    partial = cache / ".epfleet" / "partial"
    stale = [partial / f"{c * 64}.part" for c in "cde"]
    for age, path in enumerate(stale):
        path.write_bytes(b"\0" * (3 * MB))
        os.utime(path, (time.time() - 3600 * (3 - age), time.time() - 3600 * (3 - age)))
    fill(small_disk, DISK_MARGIN - 4 * MB)  # dropping two of the three is enough

    report = run_sync(str(store), cache, models=[MODEL])

    assert [m.action for m in report.models] == ["downloaded"], report.models[0].reason
    assert [p.exists() for p in stale] == [False, False, True]  # the oldest went first
    assert_package_runs(cache, {MODEL: active(report)})


# --- provider options the device's EP does not take -------------------------------------------


def test_a_variant_with_provider_options_the_ep_does_not_take_is_skipped(
    fleet_store: Path, tmp_path: Path
) -> None:
    """A published variant whose provider_options hold a key this device's EP does not
    accept is never handed to the EP: it is judged unsupported with the key named, and the
    sync goes on with what else there is (here the source on the CPU, no recompile)."""
    store = copy_store(fleet_store, tmp_path / "store")

    def misspell(document: dict) -> None:
        document["models"][MODEL]["variants"]["x86-cpu"]["provider_options"] = {"isa_levl": "avx2"}

    edit_manifest(store, misspell)

    report = run_sync(str(store), tmp_path / "device", models=[MODEL], recompile=False)

    [result] = report.models
    assert result.action == "fallback", result.reason
    [cpu] = [c for c in result.considered if c.target == "x86-cpu"]
    assert cpu.verdict == "unsupported"
    assert "provider_options are not accepted by CPUExecutionProvider" in cpu.reason
    assert "isa_levl" in cpu.reason, cpu.reason


# --- permissions -----------------------------------------------------------------------------


def modes(root: Path) -> dict[str, int]:
    """The modes of the files and directories under ``root`` (a link has none of its own)."""
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode)
        for p in root.rglob("*")
        if not p.is_symlink()
    }


def test_files_follow_the_umask(fleet_store: Path, tmp_path: Path) -> None:
    """Store objects and the package's manifest.json used to be 0600 (mkstemp)."""
    umask = os.umask(0o022)
    os.umask(umask)
    assert umask == 0o022, "the test suite runs under the usual umask"
    store_files = {k: m for k, m in modes(fleet_store).items() if (fleet_store / k).is_file()}
    assert store_files and set(store_files.values()) == {0o644}, store_files

    store = copy_store(fleet_store, tmp_path / "store")
    previous = os.umask(0o027)
    try:
        LocalStore(store).write("reports/x.json", b"{}")
        report = run_sync(str(store), tmp_path / "device")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((store / "reports" / "x.json").stat().st_mode) == 0o640
    assert report.exit_code == 0
    cache = modes(tmp_path / "device")
    files = {k for k in cache if (tmp_path / "device" / k).is_file()}
    assert {cache[k] for k in files} == {0o640}, cache
    assert {m for k, m in cache.items() if k not in files} == {0o750}
