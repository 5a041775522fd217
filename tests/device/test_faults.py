"""The device cache under faults: links planted in it, damaged state, a dead sync's lock and
temporary files, a full disk, another user reading the package.

Real syncs against a local store made by a real `epfleet compile` (``fleet_store``,
tests/conftest.py). Each case ends with nothing outside the cache written or deleted,
the active variant (or the one before it) still selected and running, and a warning in
the device report naming the path that was repaired.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx
import pytest

from epfleet.cli.app import main
from epfleet.device.cache import DISK_MARGIN, CacheBusy, CacheDamaged
from epfleet.device.cache.repair import model_metadata
from epfleet.errors import StoreError
from epfleet.formats.device_report import DeviceReport
from epfleet.stores.local import LocalStore
from epfleet.text import MB
from tests.support.disks import fill
from tests.support.synced_fleet import (
    DEVICE,
    assert_package_runs,
    copy_store,
    make_unreadable,
    read_manifest,
    republish_edited_cpu_variant,
    run_sync,
)

pytestmark = pytest.mark.slow

MODEL = "tiny-cls"


def rebuilt(model: onnx.ModelProto) -> None:
    """A new build that runs like the old one: only its doc string differs."""
    model.doc_string = f"rebuilt {time.time_ns()}"


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every entry under ``directory`` and the bytes of its files."""
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
        for p in sorted(directory.rglob("*"))
    }


def active(report: DeviceReport, model: str = MODEL) -> str:
    [found] = [m for m in report.models if m.model == model]
    assert found.variant
    return found.variant


def package_variants(cache: Path, model: str = MODEL) -> list[str]:
    package = json.loads((cache / "manifest.json").read_text())
    return list(package["components"][model]["variants"])


def warned(report: DeviceReport, *words: str) -> bool:
    return any(all(w in warning for w in words) for warning in report.warnings)


@pytest.fixture
def synced(fleet_store: Path, tmp_path: Path) -> tuple[Path, Path, DeviceReport]:
    """A copy of the fleet's store and a cache synced from it once."""
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    first = run_sync(str(store), cache)
    assert first.exit_code == 0 and first.warnings == []
    return store, cache, first


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


def test_the_active_variant_stays_while_the_state_is_rebuilt_offline(
    fleet_store: Path,
    tmp_path: Path,
) -> None:
    """Damaged state and an unreachable store: the sync cannot go on (no manifest it may
    trust), but the package still selects and runs what it ran."""
    store = copy_store(fleet_store, tmp_path / "store")
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
    document = json.loads((store / "manifest.json").read_text())
    del document["models"][MODEL]["variants"]["x86-cpu"]  # only HTP: built here for the CPU
    document["generation"] += 1
    (store / "manifest.json").write_text(json.dumps(document))
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


def test_the_lock_of_a_dead_sync_is_taken_over(
    synced: tuple[Path, Path, DeviceReport],
) -> None:
    """The lock is an flock: the kernel drops it when its holder dies, whatever it left in
    the lock file; while the holder lives, a sync is refused with the holder's pid."""
    store, cache, _ = synced
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from epfleet.device.cache import DeviceCache\n"
            "held = DeviceCache(Path(sys.argv[1])).locked()\n"
            "held.__enter__()\n"
            "print('held', flush=True); time.sleep(600)",
            str(cache),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(CacheBusy, match=f"pid {holder.pid} on "):
            run_sync(str(store), cache)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    report = run_sync(str(store), cache)
    assert report.exit_code == 0 and [m.action for m in report.models] == ["kept", "kept"]


def test_a_sync_killed_mid_way_leaves_nothing_the_next_one_does_not_tidy(
    fleet_store: Path,
    tmp_path: Path,
) -> None:
    """SIGKILL a real sync once it holds the lock, then plant the temporary files a sync
    killed during its writes leaves: the next sync takes the lock and removes them."""
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    sync = subprocess.Popen(
        [sys.executable, "-m", "epfleet", "sync", "--store", str(store), "--cache", str(cache)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lock = cache / ".epfleet" / "lock"
    deadline = time.monotonic() + 60
    while sync.poll() is None and time.monotonic() < deadline:
        if lock.exists() and str(sync.pid) in lock.read_text():
            break
        time.sleep(0.005)
    sync.send_signal(signal.SIGKILL)
    sync.wait()
    meta = cache / ".epfleet"
    (meta / "partial").mkdir(exist_ok=True)
    leftovers = [
        cache / ".manifest.json.abcd1234.tmp",
        meta / ".state.json.zz_z9999.tmp",
        meta / ".fleet-manifest.json.q1w2e3r4.tmp",
        meta / ".last-report.json.00000000.tmp",
        meta / "partial" / f".{'a' * 64}.part.progress.abcdefgh.tmp",
    ]
    strangers = [cache / "notes.txt", meta / "keep.tmp", cache / ".other.json.abcd1234.tmp"]
    for path in leftovers + strangers:
        path.write_text("x")

    report = run_sync(str(store), cache)

    assert {m.action for m in report.models} <= {"kept", "downloaded"}
    assert [p for p in leftovers if p.exists()] == []
    assert all(p.exists() for p in strangers)
    assert_package_runs(cache, {m.model: m.variant or "" for m in report.models})


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


def test_the_report_is_printed_when_the_disk_is_full(
    fleet_store: Path,
    tmp_path: Path,
    small_disk: Path,
) -> None:
    """It used to die in save_last_report with a traceback, exit 1, nothing on stdout."""
    store = copy_store(fleet_store, tmp_path / "store")
    cache = small_disk / "device"
    first = run_sync(str(store), cache)
    fill(small_disk, 0)
    command = ["sync", "--store", str(store), "--cache", str(cache), "--device-id", DEVICE]

    done = cli(*command, "--json")

    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = DeviceReport.model_validate_json(done.stdout)
    assert [m.action for m in report.models] == ["kept", "kept"]
    assert warned(report, "last-report.json", "no disk space")
    text = cli(*command)
    assert text.returncode == 0 and "warning: could not save" in text.stdout
    assert_package_runs(cache, {m.model: m.variant or "" for m in first.models})


def test_running_out_of_space_mid_download_leaves_no_partial_file(
    fleet_store: Path,
    tmp_path: Path,
) -> None:
    """A file size limit (``ulimit -f``) stops the download's writes part-way."""
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    artifact = read_manifest(store).models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    # Past every document a sync writes before it downloads (the manifest it keeps, the
    # trust metadata), short of the artifact: the limit stops the download's writes.
    documents = max(path.stat().st_size for path in store.rglob("*.json"))
    limit = max(artifact.size // 2, documents + 4096)
    assert limit < artifact.size, (limit, artifact.size)

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [
            *(sys.executable, "-m", "epfleet", "sync", "--store", str(store)),
            *("--cache", str(cache), "--model", MODEL, "--json", "--no-recompile"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_files,
    )

    assert done.returncode == 1, done.stderr
    report = DeviceReport.model_validate_json(done.stdout)
    [result] = report.models
    assert result.action == "failed"
    assert "ran out of disk space downloading" in result.reason
    assert "partial download was removed" in result.reason
    assert [p for p in (cache / ".epfleet" / "partial").iterdir() if p.suffix == ".part"] == []


def unsigned_copy(fleet_store: Path, dest: Path) -> Path:
    """A copy of the store without its development keys: the device syncs from the
    unsigned manifest.json (EPFLEET_ALLOW_UNSIGNED), which these tests edit in place."""
    store = copy_store(fleet_store, dest)
    shutil.rmtree(store.with_name(f"{store.name}.dev-keys"), ignore_errors=True)
    return store


# --- provider options the device's EP does not take -------------------------------------------


def test_a_variant_with_provider_options_the_ep_does_not_take_is_skipped(
    fleet_store: Path, tmp_path: Path
) -> None:
    """A published variant whose provider_options hold a key this device's EP does not
    accept is never handed to the EP: it is judged unsupported with the key named, and the
    sync goes on with what else there is (here the source on the CPU, no recompile)."""
    store = unsigned_copy(fleet_store, tmp_path / "store")
    document = json.loads((store / "manifest.json").read_text())
    document["models"][MODEL]["variants"]["x86-cpu"]["provider_options"] = {"isa_levl": "avx2"}
    (store / "manifest.json").write_text(json.dumps(document))

    report = run_sync(str(store), tmp_path / "device", models=[MODEL], recompile=False)

    [result] = report.models
    assert result.action == "fallback", result.reason
    [cpu] = [c for c in result.considered if c.target == "x86-cpu"]
    assert cpu.verdict == "unsupported"
    assert "provider_options are not accepted by CPUExecutionProvider" in cpu.reason
    assert "isa_levl" in cpu.reason, cpu.reason


# --- a read-only cache -----------------------------------------------------------------------


def remount(path: Path, *options: str) -> None:
    done = subprocess.run(["mount", *options, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``epfleet ARGV`` run in-process, its exit code and printed output: the report and
    messages are what the tests that use it check (killed, limited or other users'
    processes are tested in processes of their own)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(["epfleet", *argv], code, out.getvalue(), err.getvalue())


def cli_sync(store: Path, cache: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return cli(
        *("sync", "--store", str(store), "--cache", str(cache)),
        *("--device-id", DEVICE, "--no-recompile", *options),
    )


def test_a_read_only_cache_reports_what_runs_and_names_what_it_cannot_write(
    fleet_store: Path, tmp_path: Path, small_disk: Path
) -> None:
    """The whole cache on a file system remounted read-only: a sync with nothing to change
    prints its report (exit 0, a warning); one with a new manifest to keep prints its report
    too and says which file it cannot write (exit 1). No traceback, the package untouched and still running."""
    store = unsigned_copy(fleet_store, tmp_path / "store")
    cache = small_disk / "device"
    first = run_sync(str(store), cache)
    expected = {m.model: m.variant or "" for m in first.models}
    before = snapshot(cache)
    remount(small_disk, "-o", "remount,ro")
    try:
        done = cli_sync(store, cache, "--json")
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        report = DeviceReport.model_validate_json(done.stdout)
        assert [m.action for m in report.models] == ["kept", "kept"]
        assert warned(report, str(cache), "is not writable", "Read-only file system")

        republish_edited_cpu_variant(store, rebuilt)
        changed = cli_sync(store, cache)
        assert changed.returncode == 1, changed.stderr
        assert "Traceback" not in changed.stderr
        kept = cache / ".epfleet" / "fleet-manifest.json"
        assert f"cannot write {kept}: Read-only file system" in changed.stderr
        assert "manifest: rejected" in changed.stdout  # the report is printed all the same
    finally:
        remount(small_disk, "-o", "remount,rw")
    assert snapshot(cache) == before
    assert_package_runs(cache, expected)


def test_a_read_only_cache_verifies_a_signed_store_without_writing(
    fleet_store: Path, tmp_path: Path, small_disk: Path
) -> None:
    """The signed path on a read-only cache: the trusted root ngclient saves on every start
    is not written again when it is unchanged, so an unchanged signed store syncs (exit 0,
    the manifest signed), with no traceback and nothing in the cache changed."""
    store = copy_store(fleet_store, tmp_path / "store")
    cache = small_disk / "device"
    (tmp_path / "store.dev-keys").mkdir()
    publish_signed = subprocess.run(  # the copy signed with development keys of its own
        [
            sys.executable,
            "-c",
            "import sys; from epfleet.fleet.publishing import update_manifest; "
            "from epfleet.stores import open_store; update_manifest(open_store(sys.argv[1]), lambda m: None)",
            str(store),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert publish_signed.returncode == 0, publish_signed.stderr
    first = run_sync(str(store), cache)
    assert first.manifest.signed, first.manifest
    expected = {m.model: m.variant or "" for m in first.models}
    before = snapshot(cache)
    remount(small_disk, "-o", "remount,ro")
    try:
        done = cli_sync(store, cache, "--json")
    finally:
        remount(small_disk, "-o", "remount,rw")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = DeviceReport.model_validate_json(done.stdout)
    assert report.manifest.signed and [m.action for m in report.models] == ["kept", "kept"]
    assert snapshot(cache) == before
    assert_package_runs(cache, expected)


def test_a_read_only_models_directory_fails_each_model_by_path_and_keeps_it(
    fleet_store: Path, tmp_path: Path, small_disk: Path
) -> None:
    """Only models/ is read-only (a read-only bind mount): the new build is downloaded and
    verified but cannot be installed; the model fails naming the directory, the report is
    printed and the previous variant stays active and running."""
    store = unsigned_copy(fleet_store, tmp_path / "store")
    cache = small_disk / "device"
    before = active(run_sync(str(store), cache, models=[MODEL]))
    republish_edited_cpu_variant(store, rebuilt)
    models = cache / "models"
    remount(models, "--bind", str(models))
    try:
        remount(models, "-o", "remount,bind,ro")
        done = cli_sync(store, cache, "--model", MODEL, "--json")
    finally:
        subprocess.run(["umount", str(models)], check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [result] = DeviceReport.model_validate_json(done.stdout).models
    assert result.action == "failed" and result.variant == before
    assert f"cannot write {models / MODEL}" in result.reason, result.reason
    assert "Read-only file system" in result.reason and f"still running {before}" in result.reason
    assert_package_runs(cache, {MODEL: before})


# --- permissions -----------------------------------------------------------------------------


def modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*")}


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


READ_AS_NOBODY = """
import os, sys
import numpy as np
import onnxruntime as ort

os.setgroups([]); os.setgid(65534); os.setuid(65534)
root = sys.argv[1]
for directory, _, files in os.walk(root):
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            f.read()
context = ort.ModelPackageContext(root)
for model in context.get_component_names():
    chosen = context.select_component(model, ort.ModelPackageOptions(ort.SessionOptions()))
    session = chosen.create_session()
    feeds = {
        i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
        for i in session.get_inputs()
    }
    session.run(None, feeds)
    print(model, chosen.get_selected_variant_name())
"""


def test_another_user_runs_the_package(fleet_store: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("switching to another uid needs root")
    top = Path(tempfile.mkdtemp(prefix="epfleet-other-uid-"))
    try:
        top.chmod(0o755)  # pytest's own temporary directories are 0700
        cache = top / "device"
        report = run_sync(str(fleet_store), cache)
        assert report.exit_code == 0
        done = subprocess.run(
            [sys.executable, "-c", READ_AS_NOBODY, str(cache)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split("\n")[:-1]) == sorted(
            f"{m.model} {m.variant}" for m in report.models
        )
    finally:
        shutil.rmtree(top)
