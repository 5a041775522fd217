"""The attack suite's header trickle (tests/trust/test_attacks.py): a store, or anything in
its path, that sends the status line and headers of ``timestamp.json`` or of an artifact
one byte a second, each byte inside the socket's read timeout, used to keep ``epfleet
sync`` reading them past 300 s while it held the device cache's lock, so that every
scheduled sync failed as busy. Now the sync ends within the stall timeout per attempt
(or its deadline), exits 1 naming the object, keeps the active variant and frees the
lock; on the compile host, reading manifest.json ends with a one-line error. The local
store's counterpart, a FIFO planted in place of ``timestamp.json``, held the sync the
same way until someone wrote to it; it is refused at once.

Real syncs of the attack suite's signed fleet on S3 (moto over HTTP, behind the fault
proxy, tests/support/s3proxy.py, trickling a byte a second: minutes per answer). Limits are set
small through the environment; the bounds asserted are generous beside them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.device.cache import DeviceCache
from epfleet.device.manifest_cache import lock_held
from epfleet.formats.device_report import DeviceReport
from tests.support.s3proxy import FaultProxy
from tests.support.signed_fleet import DEVICE, MODEL, Fleet, assert_refused, first_sync, only
from tests.support.synced_fleet import assert_package_runs, read_manifest

pytestmark = [pytest.mark.slow]

BOUND = 60.0
"""Seconds a trickled sync may take here: the limits' own total is ~5-10 s; each trickled
head alone would take 3-4 minutes."""


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "2")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")


def proxy_path(fleet: Fleet, key: str) -> str:
    bucket = fleet.site.uri.removeprefix("s3://").split("/")[0]
    return f"/{bucket}/fleet/{key}"


def timed_sync(fleet: Fleet) -> tuple[DeviceReport, float]:
    started = time.monotonic()
    report = fleet.sync()
    return report, time.monotonic() - started


def assert_lock_free_and_synced(fleet: Fleet, proxy: FaultProxy) -> None:
    """The lock is free: a sync right after (the store healed) is not busy, and takes the
    new build."""
    assert not lock_held(DeviceCache(fleet.cache))
    proxy.heal()
    again = fleet.sync()
    assert again.exit_code == 0, again.manifest.reason
    assert only(again).action == "downloaded", only(again).reason


@pytest.mark.usefixtures("small_limits")
def test_timestamp_headers_that_trickle_end_the_sync_within_the_stall_timeouts(
    fleet_on_s3: Fleet, s3_proxy: FaultProxy
) -> None:
    fleet = fleet_on_s3
    good = first_sync(fleet)
    fleet.republish()
    timestamp = proxy_path(fleet, "trust/metadata/timestamp.json")
    s3_proxy.trickle_next_response_heads(timestamp, interval=1.0, n=10)  # every attempt

    report, seconds = timed_sync(fleet)

    assert seconds < BOUND
    assert_refused(
        report,
        good,
        "metadata retrieval too slow",
        f"s3:/{timestamp}: no complete answer within 2 s (EPFLEET_STALL_TIMEOUT; 2 attempts)",
    )
    assert_lock_free_and_synced(fleet, s3_proxy)


def test_a_fifo_in_place_of_the_local_timestamp_is_refused_without_waiting(
    local_fleet: Fleet,
) -> None:
    fleet = local_fleet
    good = first_sync(fleet)
    timestamp = fleet.site.directory / "trust" / "metadata" / "timestamp.json"
    genuine = timestamp.read_bytes()
    timestamp.unlink()
    os.mkfifo(timestamp)  # nobody ever writes to it

    report, seconds = timed_sync(fleet)

    assert seconds < BOUND
    assert_refused(report, good, "timestamp.json is not a regular file; not read")
    assert not lock_held(DeviceCache(fleet.cache))
    timestamp.unlink()
    timestamp.write_bytes(genuine)
    again = fleet.sync()
    assert again.exit_code == 0 and only(again).action == "kept", again.manifest.reason


@pytest.mark.usefixtures("small_limits")
def test_artifact_headers_that_trickle_fail_the_model_within_the_stall_timeouts(
    fleet_on_s3: Fleet, s3_proxy: FaultProxy
) -> None:
    fleet = fleet_on_s3
    good = first_sync(fleet)
    fleet.republish()
    artifact = read_manifest(fleet.site.directory).models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    s3_proxy.trickle_next_response_heads(proxy_path(fleet, artifact.uri), interval=1.0, n=10)

    report, seconds = timed_sync(fleet)

    assert seconds < BOUND
    result = only(report)
    assert report.exit_code == 1 and result.action == "failed", result.reason
    assert (
        f"{fleet.site.uri}/{artifact.uri}: no complete answer within 2 s "
        "(EPFLEET_STALL_TIMEOUT; 2 attempts)" in result.reason
    ), result.reason
    assert result.variant == good.variant  # the previous variant stays active
    assert_package_runs(fleet.cache, {MODEL: good.variant or ""})
    assert report.report_uploaded, report.report_error
    assert_lock_free_and_synced(fleet, s3_proxy)


def test_the_sync_deadline_cuts_a_trickled_timestamp_short(
    fleet_on_s3: Fleet, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the stall timeout at its default (30 s a byte, 5 attempts), only the sync's
    deadline can end the wait: the metadata refresh is stopped there, and the model the
    sync had no time for keeps its variant."""
    fleet = fleet_on_s3
    good = first_sync(fleet)
    fleet.republish()
    monkeypatch.setenv("EPFLEET_SYNC_DEADLINE", "4")
    timestamp = proxy_path(fleet, "trust/metadata/timestamp.json")
    s3_proxy.trickle_next_response_heads(timestamp, interval=1.0, n=10)

    report, seconds = timed_sync(fleet)

    assert seconds < BOUND  # the stall timeout alone would come after 30 s
    deadline = "the sync ran past its deadline of 4 s (EPFLEET_SYNC_DEADLINE)"
    reason = report.manifest.reason or ""
    assert f"{deadline}: reading (from byte 0) s3:/{timestamp} stopped" in reason, reason
    result = only(report)
    assert report.exit_code == 1 and result.action == "failed"
    assert result.reason.startswith(f"not synced: {deadline} (still running"), result.reason
    assert result.variant == good.variant
    assert_package_runs(fleet.cache, {MODEL: good.variant or ""})
    monkeypatch.delenv("EPFLEET_SYNC_DEADLINE")
    assert_lock_free_and_synced(fleet, s3_proxy)


@pytest.mark.parametrize("report_trickles", [False, True], ids=["report", "trickled-report"])
def test_past_the_deadline_the_report_still_goes_up_within_a_stall_timeout(
    fleet_on_s3: Fleet,
    s3_proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
    report_trickles: bool,
) -> None:
    """A sync that ran out of time has the most to report: its upload gets a stall timeout
    past the deadline, and no more."""
    fleet = fleet_on_s3
    good = first_sync(fleet)
    fleet.republish()
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "3")
    monkeypatch.setenv("EPFLEET_SYNC_DEADLINE", "4")
    artifact = read_manifest(fleet.site.directory).models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    s3_proxy.trickle_next_response_heads(proxy_path(fleet, artifact.uri), interval=1.0, n=10)
    report_key = f"reports/devices/{DEVICE}.json"
    if report_trickles:
        s3_proxy.trickle_next_response_heads(
            proxy_path(fleet, report_key), method="PUT", interval=1.0, n=10
        )

    report, seconds = timed_sync(fleet)

    assert seconds < BOUND
    deadline = "the sync ran past its deadline of 4 s (EPFLEET_SYNC_DEADLINE)"
    result = only(report)
    assert result.action == "failed" and deadline in result.reason, result.reason
    assert result.variant == good.variant
    if report_trickles:
        assert not report.report_uploaded
        assert report.report_error == (
            f"{deadline}: writing {fleet.site.uri}/{report_key} stopped"
        ), report.report_error
    else:
        assert report.report_uploaded, report.report_error
    monkeypatch.delenv("EPFLEET_SYNC_DEADLINE")
    assert_lock_free_and_synced(fleet, s3_proxy)


@pytest.mark.usefixtures("small_limits")
def test_the_cli_sync_and_manifest_show_end_with_the_reason_when_answers_trickle(
    fleet_on_s3: Fleet, s3_proxy: FaultProxy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The commands' output and exit codes (run in-process: the bounds are the store's)."""
    fleet = fleet_on_s3
    good = first_sync(fleet)
    timestamp = proxy_path(fleet, "trust/metadata/timestamp.json")
    s3_proxy.trickle_next_response_heads(timestamp, interval=1.0, n=10)
    sync = ["sync", "--store", fleet.site.uri]
    sync += ["--cache", str(fleet.cache), "--model", MODEL, "--device-id", DEVICE]
    capsys.readouterr()

    started = time.monotonic()
    code = main(sync)
    seconds = time.monotonic() - started
    out, err = capsys.readouterr()

    assert seconds < BOUND, seconds
    assert code == 1, err
    assert f"s3:/{timestamp}: no complete answer within 2 s" in out, out
    s3_proxy.heal()
    again = main(sync)
    out, err = capsys.readouterr()
    assert again == 0, out + err  # not busy
    assert good.variant and good.variant in out

    # manifest show reads the manifest in force: on a signed store, its signed metadata
    s3_proxy.trickle_next_response_heads(timestamp, interval=1.0, n=10)
    started = time.monotonic()
    shown = main(["manifest", "show", "--store", fleet.site.uri])
    seconds = time.monotonic() - started
    err = capsys.readouterr().err

    assert seconds < BOUND, seconds
    assert shown == 1
    assert err.strip() == (
        f"epfleet: reading s3:/{timestamp}: no complete answer within 2 s "
        "(EPFLEET_STALL_TIMEOUT; 2 attempts)"
    ), err
