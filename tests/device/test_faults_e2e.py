"""The device cache under faults that need a process of its own or a mount: a dead sync's
lock taken over, a sync killed mid-way, a file size limit mid-download, a full or
read-only file system (a tmpfs, mounted as root), another user reading the package.
The faults a sync meets in-process are in test_faults.py (fast tier)."""

from __future__ import annotations

import contextlib
import io
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.errors import CacheBusy
from epfleet.formats.device_report import DeviceReport
from tests.support.cache_faults import (
    MODEL,
    active,
    rebuilt,
    snapshot,
    warned,
)
from tests.support.disks import fill
from tests.support.synced_fleet import (
    DEVICE,
    assert_package_runs,
    copy_store,
    read_manifest,
    republish_edited_cpu_variant,
    run_sync,
)

pytestmark = pytest.mark.slow


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
    """The whole cache on a file system remounted read-only: a sync of the unchanged signed
    store verifies it without writing (the trusted root ngclient saves on every start is not
    written again when it is unchanged) and prints its report (exit 0, a warning); one with
    a new manifest to keep prints its report too and says which file it cannot write (exit
    1). No traceback, the package untouched and still running."""
    store = copy_store(fleet_store, tmp_path / "store")
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
        assert report.manifest.signed and [m.action for m in report.models] == ["kept", "kept"]
        assert warned(report, str(cache), "is not writable", "Read-only file system")

        republish_edited_cpu_variant(store, rebuilt)
        changed = cli_sync(store, cache)
        assert changed.returncode == 1, changed.stderr
        assert "Traceback" not in changed.stderr
        kept = cache / ".epfleet" / "trust"  # where the new signed metadata goes
        assert f"cannot write {kept}" in changed.stderr
        assert "Read-only file system" in changed.stderr
        assert "manifest: rejected" in changed.stdout  # the report is printed all the same
    finally:
        remount(small_disk, "-o", "remount,rw")
    assert snapshot(cache) == before
    assert_package_runs(cache, expected)


def test_a_read_only_models_directory_fails_each_model_by_path_and_keeps_it(
    fleet_store: Path, tmp_path: Path, small_disk: Path
) -> None:
    """Only models/ is read-only (a read-only bind mount): the new build is downloaded and
    verified but cannot be installed; the model fails naming the directory, the report is
    printed and the previous variant stays active and running."""
    store = copy_store(fleet_store, tmp_path / "store")
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
