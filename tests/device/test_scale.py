"""A device poll at fleet scale: what an unchanged sync costs.

A signed store made by hand (one small CPU model, its variant stamped with this host's CPU
string, signed with ``epfleet trust init``'s code) that a device syncs once; then:

- a no-op ``epfleet sync`` loads neither ``onnx`` nor the compile side nor Prefect (in a
  fresh interpreter: tests/device/test_fresh_processes.py, slow tier);
- the report goes up when it says something new, gzip-compressed and compact, and
  otherwise once per heartbeat: an unchanged poll of an S3 store through the counting
  proxy is two GETs (the next root's probe and timestamp.json), no HEAD, no PUT.
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest

from epfleet.device.cache import DeviceCache
from epfleet.device.jitter import EPOCH, jitter_seconds, next_sync, sync_anchor
from epfleet.device.policy import SyncPolicy
from epfleet.device.prefetch import Prefetch
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport, decode_report, report_key
from epfleet.formats.manifest import Manifest
from epfleet.limits import Deadline
from epfleet.stores import MANIFEST_KEY, open_store
from epfleet.text import format_bytes
from tests.support.hand_made_fleet import DEVICE, MODEL, TARGET, Fleet, make_fleet
from tests.support.s3proxy import FaultProxy
from tests.support.trust_helpers import online_key, publish_new_build

pytestmark = pytest.mark.fast


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return make_fleet(str(tmp_path / "store"), tmp_path)


def run_sync(store: str, cache: Path, root: Path) -> DeviceReport:
    return sync(store, cache, SyncPolicy(), DEVICE, trust_root=root)


def requests_since(proxy: FaultProxy, start: int) -> list[tuple[str, str, int]]:
    """(method, key name, status) of each request the proxy saw after ``start``."""
    return [(s.method, s.path.rsplit("/", 1)[-1], s.status) for s in proxy.log[start:]]


def test_an_unchanged_signed_poll_is_two_gets_and_a_changed_one_uploads_a_gzipped_report(
    s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    fleet = make_fleet(f"s3://{s3_bucket}/fleet", tmp_path)
    cache, s3 = tmp_path / "cache", boto3.client("s3")
    key = f"fleet/{report_key(DEVICE)}"
    first = run_sync(fleet.uri, cache, fleet.root)
    assert first.report_uploaded and [m.action for m in first.models] == ["downloaded"]
    stored = s3.get_object(Bucket=s3_bucket, Key=key)
    assert (stored["ContentEncoding"], stored["ContentType"]) == ("gzip", "application/json")
    body = stored["Body"].read()
    assert decode_report(body, 1 << 20).models[0].action == "downloaded"
    assert json.loads(gzip.decompress(body))["device_id"] == DEVICE

    start = len(s3_proxy.log)
    again = run_sync(fleet.uri, cache, fleet.root)
    assert [m.action for m in again.models] == ["kept"] and again.exit_code == 0
    # the probe for the next root (missing: its GET's 404 says so) and the timestamp
    assert requests_since(s3_proxy, start) == [
        ("GET", "2.root.json", 404),
        ("GET", "timestamp.json", 200),
    ]
    assert again.report_uploaded is False and again.report_error is None
    assert (again.report_skipped or "").startswith("the store has the same report, uploaded ")

    # the heartbeat comes due: the unchanged report goes up again
    sent_file = cache / ".epfleet" / "report-sent.json"
    sent = json.loads(sent_file.read_text())
    sent["at"] = (datetime.now(timezone.utc) - timedelta(days=1, minutes=1)).isoformat()
    sent_file.write_text(json.dumps(sent))
    start = len(s3_proxy.log)
    due = run_sync(fleet.uri, cache, fleet.root)
    assert due.report_uploaded is True
    # the report, then its notice in the inbox (an empty object)
    assert [r for r in requests_since(s3_proxy, start) if r[0] != "GET"] == [
        ("PUT", f"{DEVICE}.json", 200),
        ("PUT", f"{DEVICE}.json", 200),
    ]
    notices = open_store(fleet.uri).list_objects("reports/inbox/")
    assert {(o.key.rsplit("/", 1)[1], o.size) for o in notices} == {(f"{DEVICE}.json", 0)}

    # a new build: downloaded, and the report that says so goes up gzipped
    publish_new_build(open_store(fleet.uri), online_key(fleet.keys), MODEL, TARGET)
    changed = run_sync(fleet.uri, cache, fleet.root)
    assert [m.action for m in changed.models] == ["downloaded"] and changed.report_uploaded
    stored = s3.get_object(Bucket=s3_bucket, Key=key)
    assert stored["ContentEncoding"] == "gzip"
    assert decode_report(stored["Body"].read(), 1 << 20).models[0].variant == (
        changed.models[0].variant
    )
    start = len(s3_proxy.log)
    assert run_sync(fleet.uri, cache, fleet.root).report_uploaded is False  # kept: no news
    assert not [r for r in requests_since(s3_proxy, start) if r[0] in ("PUT", "HEAD")]


def test_news_whose_upload_failed_goes_up_with_the_next_sync(fleet: Fleet, tmp_path: Path) -> None:
    cache, reports = tmp_path / "cache", tmp_path / "store" / "reports" / "devices"
    assert run_sync(fleet.uri, cache, fleet.root).report_uploaded
    publish_new_build(open_store(fleet.uri), online_key(fleet.keys), MODEL, TARGET)
    stored = reports / f"{DEVICE}.json"
    stored.unlink()
    (stored / "in-the-way").mkdir(parents=True)  # the store refuses the upload of the news
    refused = run_sync(fleet.uri, cache, fleet.root)
    shutil.rmtree(stored)
    assert [m.action for m in refused.models] == ["downloaded"]
    assert refused.report_uploaded is False and refused.report_error
    retried = run_sync(fleet.uri, cache, fleet.root)  # kept: the news is still news
    assert [m.action for m in retried.models] == ["kept"] and retried.report_uploaded is True
    news = decode_report(stored.read_bytes(), 1 << 20)
    assert news.models[0].variant == refused.models[0].variant


# --- polls spread over the interval, and S3's SlowDown ------------------------------------------


def test_each_device_polls_at_its_own_offset_spread_over_the_interval() -> None:
    offsets = [jitter_seconds(f"device-{i:06d}", 3600) for i in range(36_000)]
    assert all(0 <= o < 3600 for o in offsets)
    per_minute = Counter(o // 60 for o in offsets)
    assert len(per_minute) == 60 and max(per_minute.values()) < 2 * min(per_minute.values())
    assert jitter_seconds("dev-1", 900) == jitter_seconds("dev-1", 900)  # stable
    assert jitter_seconds("dev-1", 0.5) == 0
    anchor = sync_anchor("dev-1", 900)
    assert anchor == EPOCH + timedelta(seconds=jitter_seconds("dev-1", 900))
    after = datetime(2026, 12, 1, 12, 0, 5, tzinfo=timezone.utc)
    upcoming = next_sync("dev-1", 900, after)
    assert after < upcoming <= after + timedelta(seconds=900)
    assert (upcoming - anchor).total_seconds() % 900 == 0


def test_serve_schedules_the_device_sync_at_the_devices_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from deployments.serve import device_sync_schedule

    monkeypatch.setenv("EPFLEET_DEVICE_ID", "line-3.cam-1")
    schedule = device_sync_schedule(600, None)
    assert schedule.interval == timedelta(seconds=600)  # type: ignore[attr-defined]
    assert schedule.anchor_date == sync_anchor("line-3.cam-1", 600)  # type: ignore[attr-defined]
    other = device_sync_schedule(600, "line-3.cam-2")
    assert other.anchor_date == sync_anchor("line-3.cam-2", 600)  # type: ignore[attr-defined]


def test_s3_slow_down_is_retried_with_backoff_and_a_storm_leaves_the_device_as_it_was(
    s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = make_fleet(f"s3://{s3_bucket}/fleet", tmp_path)
    cache = tmp_path / "cache"
    first = run_sync(fleet.uri, cache, fleet.root)
    store = open_store(fleet.uri)
    config = store.client.meta.config  # type: ignore[attr-defined]
    assert config.retries == {"mode": "standard", "total_max_attempts": 5}  # SlowDown: backoff
    timestamp = f"/{s3_bucket}/fleet/trust/metadata/timestamp.json"

    s3_proxy.slow_down_next(timestamp, n=2)
    start = len(s3_proxy.log)
    polled = run_sync(fleet.uri, cache, fleet.root)
    assert polled.manifest.status == "unchanged" and polled.exit_code == 0
    assert [s.status for s in s3_proxy.log[start:] if s.path == timestamp] == [503, 503, 200]

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    s3_proxy.slow_down_next(timestamp, n=10)
    start = len(s3_proxy.log)
    storm = run_sync(fleet.uri, cache, fleet.root)
    assert [s.status for s in s3_proxy.log[start:] if s.path == timestamp] == [503, 503]
    assert storm.manifest.status == "offline", storm.manifest
    assert "S3 answered 503 SlowDown" in (storm.manifest.reason or "")
    assert [m.action for m in storm.models] == ["kept"]
    assert storm.models[0].variant == first.models[0].variant
    assert not [s for s in s3_proxy.log[start:] if s.method == "PUT"]  # offline: no report


# --- loading signed metadata: the canonical JSON made once --------------------------------------


# --- a first sync: the next model's download runs ahead ------------------------------------------


def test_the_next_models_download_runs_ahead_once_and_counts_in_its_report(
    s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = make_fleet(f"s3://{s3_bucket}/fleet", tmp_path, models=3)
    manifest = Manifest.from_json(getattr(open_store(fleet.uri).read(MANIFEST_KEY), "data", b""))
    start = len(s3_proxy.log)
    caplog.set_level(logging.INFO, logger="epfleet.device.session")
    with caplog.at_level(logging.DEBUG, logger="epfleet.device.prefetch"):
        first = run_sync(fleet.uri, tmp_path / "cache", fleet.root)
    assert [(m.model, m.action) for m in first.models] == [
        ("m", "downloaded"),
        ("m1", "downloaded"),
        ("m2", "downloaded"),
    ]
    ahead = [r.getMessage() for r in caplog.records if r.getMessage().endswith("fetched ahead")]
    for report in first.models:
        artifact = manifest.models[report.model].variants[TARGET].artifact
        assert artifact is not None
        gets = [s for s in s3_proxy.log[start:] if s.path.endswith(artifact.uri)]
        assert [s.method for s in gets] == ["GET"]  # downloaded once, ahead or not
        assert report.bytes_downloaded == artifact.size  # counted for its model
        if report.model != "m":  # the first model has no model before it
            assert ahead.count(f"{artifact.uri}: fetched ahead") == 1, ahead
        # one line says so, with the bytes fetched ahead counted (not "0 bytes", not twice)
        said = [m for m in caplog.messages if m.startswith(f"{report.model}: downloaded")]
        assert said == [
            f"{report.model}: downloaded {report.variant} ({format_bytes(artifact.size)}): "
            f"{report.reason}"
        ]


def test_a_failure_ahead_is_met_and_reported_by_the_models_own_sync(
    fleet: Fleet, tmp_path: Path
) -> None:
    store = open_store(fleet.uri)
    manifest = Manifest.from_json(getattr(store.read(MANIFEST_KEY), "data", b""))
    artifact = manifest.models[MODEL].variants[TARGET].artifact
    assert artifact is not None
    store.write(artifact.uri, b"not the bytes the manifest names")
    cache = tmp_path / "cache"
    prefetch = Prefetch(store, DeviceCache(cache), Deadline.after(60))
    prefetch.start(MODEL, artifact)
    assert prefetch.wait("another model") == 0  # nothing ahead for it
    assert prefetch.wait(MODEL) == 0  # failed ahead: nothing counted, nothing raised
    prefetch.close()
    report = run_sync(fleet.uri, cache, fleet.root)
    [model] = report.models  # the step met the bad bytes itself, and built the model here
    assert model.action == "recompiled", model.reason
    assert model.reason.startswith(f"download cpu: {fleet.uri}/{artifact.uri} has sha256")
