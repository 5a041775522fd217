"""Deadlines on a device: nothing a sync waits on is unbounded, so every sync ends with a
clear reason, the previous variants kept and the cache's lock released.

Real syncs (``fleet_store``, tests/conftest.py: a fleet compiled by `epfleet compile`),
S3 on loopback through the fault proxy (tests/support/s3proxy.py) where the store misbehaves:
a store that trickles or stalls, a sync past its deadline, a health check that never
ends, a manifest too large (or endless) to read. The limits are set through the
``EPFLEET_*`` settings, small enough that each case takes seconds.

The transfer and deadline tests here are the end-to-end ones on the real clock, one per
mechanism (a minimum rate, a stall, the sync's deadline): the rules themselves are tested
on a fake clock, without waiting, in tests/device/test_download.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import boto3
import pytest

from epfleet.device.cache import DeviceCache
from epfleet.errors import TimeLimitExceeded, WorkerCrashed
from epfleet.fleet.watch.inputs import read_reports
from epfleet.formats.device_report import DeviceReport, ModelReport
from epfleet.runtime.compile_pool import CompilePool
from epfleet.stores.local import LocalStore
from tests.support.native_writers import kill_self, sleep
from tests.support.s3proxy import FaultProxy
from tests.support.synced_fleet import (
    MODEL,
    assert_package_runs,
    copy_store,
    publish_to_s3,
    republish_edited_cpu_variant,
    republished_to_s3,
    run_sync,
    runaway,
    unsigned_copy,
)

pytestmark = pytest.mark.slow


def only(report: DeviceReport, model: str = MODEL) -> ModelReport:
    [found] = [m for m in report.models if m.model == model]
    return found


def timed_sync(uri: str, cache: Path, **policy: object) -> tuple[DeviceReport, float]:
    started = time.monotonic()
    report = run_sync(uri, cache, **policy)
    return report, time.monotonic() - started


# --- transfers ------------------------------------------------------------------------------


def test_a_store_that_trickles_fails_the_model_within_the_rate_window(
    fleet_store: Path,
    s3_bucket: str,
    s3_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "device"
    good = only(run_sync(publish_to_s3(fleet_store, s3_bucket), cache, models=[MODEL]))
    uri, path = republished_to_s3(fleet_store, tmp_path, s3_bucket)
    monkeypatch.setenv("EPFLEET_MIN_RATE", "1KiB")
    monkeypatch.setenv("EPFLEET_RATE_WINDOW", "2")
    s3_proxy.trickle_next_get_responses(path, interval=0.5, after=1000)  # then 2 B/s

    report, seconds = timed_sync(uri, cache, models=[MODEL])

    result = only(report)
    assert report.exit_code == 1 and result.action == "failed"
    assert "in 2 s, below the minimum rate of 1 KiB/s" in result.reason, result.reason
    assert f"download of {path.split('/fleet/')[1]} aborted" in result.reason
    assert result.variant == good.variant  # the previous variant stays active
    assert_package_runs(cache, {MODEL: good.variant or ""})
    assert seconds < 10  # the window and the sync's own work; the body would take 3 hours

    again = only(run_sync(uri, cache, models=[MODEL]))  # the lock was released ...
    assert again.action == "downloaded", again.reason
    [_, resumed] = s3_proxy.seen(path)
    assert resumed.range and int(resumed.range.split("=")[1].split("-")[0]) >= 1000  # resumed


def test_a_store_that_stalls_fails_the_model_after_the_stall_timeout(
    fleet_store: Path,
    s3_bucket: str,
    s3_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "device"
    good = only(run_sync(publish_to_s3(fleet_store, s3_bucket), cache, models=[MODEL]))
    uri, path = republished_to_s3(fleet_store, tmp_path, s3_bucket)
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "1")
    s3_proxy.stall_next_get_responses(path, after=100)

    report, seconds = timed_sync(uri, cache, models=[MODEL])

    result = only(report)
    assert result.action == "failed" and result.variant == good.variant
    assert "moved nothing for 1 s (EPFLEET_STALL_TIMEOUT)" in result.reason, result.reason
    assert seconds < 8


# --- the sync's deadline ----------------------------------------------------------------------


def test_the_sync_deadline_fails_what_is_left_keeps_the_previous_variants_and_frees_the_lock(
    fleet_store: Path,
    s3_bucket: str,
    s3_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = tmp_path / "device"
    first = run_sync(publish_to_s3(fleet_store, s3_bucket), cache)
    assert [m.action for m in first.models] == ["downloaded", "downloaded"]
    uri, path = republished_to_s3(fleet_store, tmp_path, s3_bucket)
    monkeypatch.setenv("EPFLEET_MIN_RATE", "0")  # a slow but steady store: only the deadline
    monkeypatch.setenv("EPFLEET_SYNC_DEADLINE", "3")
    s3_proxy.trickle_next_get_responses(path, interval=0.05)

    report, seconds = timed_sync(uri, cache)

    assert report.exit_code == 1
    by_model = {m.model: m for m in report.models}
    assert list(by_model) == ["tiny-cls", "tiny-det"]
    stopped, skipped = by_model["tiny-cls"], by_model["tiny-det"]
    deadline = "the sync ran past its deadline of 3 s (EPFLEET_SYNC_DEADLINE)"
    assert stopped.action == "failed" and deadline in stopped.reason, stopped.reason
    assert skipped.action == "failed"
    assert skipped.reason.startswith(f"not synced: {deadline} (still running")
    for model in first.models:
        assert by_model[model.model].variant == model.variant
    assert_package_runs(cache, {m.model: m.variant or "" for m in first.models})
    assert seconds < 8  # the deadline plus writing the report; the body would take 20 min

    monkeypatch.delenv("EPFLEET_SYNC_DEADLINE")
    after = run_sync(uri, cache)  # the lock was released, and the partial file resumes
    assert [m.action for m in after.models] == ["downloaded", "kept"]


# --- worker calls ----------------------------------------------------------------------------


@pytest.mark.health_in_worker  # a check past its time limit: its worker is killed
def test_a_runaway_health_check_is_killed_and_the_previous_variant_kept(
    fleet_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    good = only(run_sync(str(store), cache, models=[MODEL]))
    assert good.action == "downloaded"
    republish_edited_cpu_variant(store, runaway)  # true sha256 and string; never finishes
    monkeypatch.setenv("EPFLEET_HEALTH_TIMEOUT", "4")

    report, seconds = timed_sync(str(store), cache, models=[MODEL], recompile=False)

    result = only(report)
    assert report.exit_code == 1 and result.action == "failed"
    assert (
        "ran past its time limit of 4 s (EPFLEET_HEALTH_TIMEOUT); its worker was killed; "
        "not activated" in result.reason
    ), result.reason
    assert result.variant == good.variant
    assert_package_runs(cache, {MODEL: good.variant or ""})
    assert seconds < 15
    assert list((cache / ".epfleet" / "partial").iterdir()) == []  # the variant is gone


def test_a_worker_call_past_its_limit_is_killed_and_the_worker_replaced() -> None:
    pool = CompilePool(1)
    try:
        started = time.monotonic()
        with pytest.raises(TimeLimitExceeded, match="sleeping ran past its time limit of 2 s"):
            pool.call(sleep, 60, "sleeping", timeout=2)
        assert time.monotonic() - started < 10
        assert pool.call(sleep, 0, "sleeping briefly", timeout=30) == 0  # a new worker
        with pytest.raises(WorkerCrashed, match="crashed while dying"):
            pool.call(kill_self, None, "dying", timeout=30)
        assert pool.call(sleep, 0, "sleeping again", timeout=30) == 0
    finally:
        pool.shutdown()


# --- the manifest ----------------------------------------------------------------------------


# The limits on an unsigned manifest.json as a device reads it: stores that publish it alone
# (those on the signed metadata: tests/trust/test_attacks*.py).


def padded(manifest: bytes, size: int) -> bytes:
    """The same manifest, valid, padded with whitespace to ``size`` bytes."""
    document = json.loads(manifest)
    text = json.dumps(document).encode()
    return text[:-1] + b" " * (size - len(text)) + b"}"


@pytest.mark.usefixtures("unsigned_allowed")
def test_an_oversized_manifest_fails_the_sync_and_is_not_downloaded_again(
    fleet_store: Path,
    s3_bucket: str,
    s3_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unsigned = unsigned_copy(fleet_store, tmp_path / "store")
    uri = publish_to_s3(unsigned, s3_bucket)
    cache = tmp_path / "device"
    first = run_sync(uri, cache)
    original = (unsigned / "manifest.json").read_bytes()
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.put_object(Bucket=s3_bucket, Key="fleet/manifest.json", Body=padded(original, 100 << 10))
    monkeypatch.setenv("EPFLEET_MAX_MANIFEST_BYTES", "64KiB")

    rejected = run_sync(uri, cache)

    assert rejected.exit_code == 1
    assert rejected.manifest.status == "rejected"
    assert rejected.manifest.reason == (
        f"{uri}/manifest.json is 100 KiB, over the limit of 64 KiB for a manifest "
        "(EPFLEET_MAX_MANIFEST_BYTES); not read; the cached manifest (generation "
        f"{first.manifest.generation}) stays in force"
    )
    assert [m.action for m in rejected.models] == ["kept", "kept"]
    assert [g.status for g in s3_proxy.seen("fleet/manifest.json")] == [200, 200]

    again = run_sync(uri, cache)

    assert again.exit_code == 1 and again.manifest.status == "rejected"
    assert "(unchanged since it was rejected at " in (again.manifest.reason or "")
    assert again.manifest.body_bytes == 0
    gets = s3_proxy.seen("fleet/manifest.json")
    assert [g.status for g in gets] == [200, 200, 304]  # asked only whether it changed

    s3.put_object(Bucket=s3_bucket, Key="fleet/manifest.json", Body=original)
    healed = run_sync(uri, cache)
    assert healed.exit_code == 0 and healed.manifest.status == "fetched"


@pytest.mark.usefixtures("unsigned_allowed")
def test_an_invalid_manifest_fails_the_sync_and_is_not_read_again(
    fleet_store: Path, tmp_path: Path
) -> None:
    store = unsigned_copy(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    run_sync(str(store), cache)
    document = json.loads((store / "manifest.json").read_text())
    document["generation"] = "ten"
    (store / "manifest.json").write_text(json.dumps(document))

    first = run_sync(str(store), cache)
    again = run_sync(str(store), cache)

    assert first.exit_code == again.exit_code == 1
    assert "fails validation at generation" in (first.manifest.reason or "")
    assert first.manifest.body_bytes > 0 and again.manifest.body_bytes == 0
    assert "not downloaded again" in (again.manifest.reason or "")
    state = json.loads((cache / ".epfleet" / "state.json").read_text())
    assert state["manifest_rejected"]["reason"].startswith(f"{store.as_uri()}/manifest.json")


@pytest.mark.usefixtures("unsigned_allowed")
def test_an_endless_manifest_is_rejected_quickly(
    fleet_store: Path,
    s3_bucket: str,
    s3_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unsigned = unsigned_copy(fleet_store, tmp_path / "store")
    uri = publish_to_s3(unsigned, s3_bucket)
    cache = tmp_path / "device"
    run_sync(uri, cache)
    monkeypatch.setenv("EPFLEET_MAX_MANIFEST_BYTES", "1MiB")
    s3_proxy.serve_endless(f"/{s3_bucket}/fleet/manifest.json")

    report, seconds = timed_sync(uri, cache)

    assert report.exit_code == 1 and report.manifest.status == "rejected"
    assert "manifest.json goes on past the limit of 1 MiB for a manifest" in (
        report.manifest.reason or ""
    )
    assert [m.action for m in report.models] == ["kept", "kept"]
    assert seconds < 10
    assert DeviceCache(cache).cached_manifest() == (unsigned / "manifest.json").read_bytes()


def test_an_oversized_device_report_is_one_unreadable_report_for_the_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_MAX_DOCUMENT_BYTES", "1KiB")
    store = LocalStore(tmp_path / "store")
    store.write("reports/devices/huge.json", b" " * 5000)
    reports, unreadable = read_reports(store)
    assert reports == []
    assert unreadable == [
        f"reports/devices/huge.json: {store.uri}/reports/devices/huge.json is 4.9 KiB, over "
        "the limit of 1 KiB for a store document (EPFLEET_MAX_DOCUMENT_BYTES); not read"
    ]
