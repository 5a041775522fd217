"""Device reports at fleet scale (pure and local-store tests): gzip-compressed compact JSON
read beside the plain JSON of older devices, a bomb refused; what counts as news (the
content digest) and when an unchanged report goes up again (the heartbeat); readers that
stream a fleet's reports in bounded memory; windows no shorter than the heartbeat."""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.device.reporting import SentReport, unchanged_since
from epfleet.errors import BadInputError
from epfleet.fleet.evidence.reading import (
    MAX_LISTED_PROBLEMS,
    Problems,
    check_report_window,
    stream_reports,
)
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.watch.inputs import read_reports
from epfleet.formats.device_report import (
    DeviceInfo,
    DeviceReport,
    ManifestStatus,
    ModelReport,
    VariantVerdict,
    content_digest,
    decode_report,
    encode_report,
    report_key,
)
from epfleet.formats.manifest import Manifest
from epfleet.lifecycle.gc import collect
from epfleet.stores import MANIFEST_KEY, open_store
from eps.base import Verdict

pytestmark = pytest.mark.fast

NOW = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
SHA = "ab" * 32
DAY = timedelta(days=1)


def model(action: str = "kept", variant: str = f"cpu-{SHA[:12]}", **fields: object) -> ModelReport:
    base: dict[str, object] = {
        "model": "m",
        "action": action,
        "variant": variant,
        "target": "cpu",
        "artifact_sha256": SHA,
        "ep": "CPUExecutionProvider",
        "verdict": "optimal",
        "bytes_downloaded": 0,
        "reason": "cpu-abababababab is still the best choice here (ok)",
        "considered": [
            VariantVerdict(
                target="cpu",
                ep="CPUExecutionProvider",
                device="cpu",
                verdict=Verdict.OPTIMAL,
                reason="ok",
            )
        ],
        "seconds": 0.01,
    }
    return ModelReport.model_validate(base | fields)


def report(device: str = "dev-1", *models: ModelReport, **fields: object) -> DeviceReport:
    base: dict[str, object] = {
        "device_id": device,
        "generated_at": NOW.isoformat(),
        "ort_version": "1.32.0",
        "ep_packages": {"onnxruntime": "1.32.0"},
        "devices": [
            DeviceInfo(
                ep="CPUExecutionProvider",
                type="cpu",
                vendor="v",
                vendor_id=1,
                device_id=2,
                ep_vendor="Microsoft",
            )
        ],
        "store": "s3://b/fleet",
        "cache": "/var/lib/epfleet",
        "manifest": ManifestStatus(
            status="unchanged", generation=3, body_bytes=471, signed=True, signed_version=9
        ),
        "models": list(models) or [model()],
        "seconds": 0.4,
    }
    return DeviceReport.model_validate(base | fields)


# --- the stored form --------------------------------------------------------------------------


def test_a_report_goes_up_compact_and_gzipped_and_both_forms_read_back() -> None:
    sent = report(report_uploaded=True, report_skipped="x")
    data = encode_report(sent)
    assert data[:2] == b"\x1f\x8b" and encode_report(sent) == data  # no time in the header
    inflated = gzip.decompress(data)
    assert b"\n" not in inflated and b": " not in inflated  # compact
    assert b"report_uploaded" not in inflated and b"report_skipped" not in inflated
    assert decode_report(data, 1 << 20) == sent.model_copy(
        update={"report_uploaded": None, "report_skipped": None}
    )
    older = sent.model_dump_json(indent=2, exclude={"report_uploaded", "report_skipped"})
    assert decode_report(older.encode(), 1 << 20).device_id == "dev-1"


def test_a_report_that_inflates_past_the_limit_or_is_cut_short_is_refused() -> None:
    bomb = gzip.compress(b" " * (4 << 20))  # 4 MiB of spaces in about 4 KB
    assert len(bomb) < 8 << 10
    with pytest.raises(ValueError, match="inflates past the limit of 65536 bytes"):
        decode_report(bomb, 64 << 10)
    with pytest.raises(ValueError, match="cut short"):
        decode_report(encode_report(report())[:-12], 1 << 20)
    with pytest.raises(ValueError, match="not a valid gzip stream"):
        decode_report(b"\x1f\x8b" + b"\x00" * 20, 1 << 20)


# --- what is news -----------------------------------------------------------------------------


def test_two_syncs_that_changed_nothing_say_the_same() -> None:
    first = report("dev-1", model("downloaded", reason="the best here", bytes_downloaded=9))
    later = report(
        "dev-1",
        model(seconds=0.2),
        generated_at=(NOW + DAY).isoformat(),
        seconds=0.9,
        manifest=ManifestStatus(status="fetched", generation=4, body_bytes=9000, signed=True),
    )
    assert content_digest(first) == content_digest(later)


@pytest.mark.parametrize(
    "changed",
    [
        report("dev-1", model(variant="cpu-cdcdcdcdcdcd", artifact_sha256="cd" * 32)),
        report("dev-1", model("failed", reason="download failed: 503")),
        report("dev-1", model("fallback", reason="nothing runs here")),
        report("dev-1", model(considered=[])),
        report("dev-1", model(precision="fp16")),
        report("dev-1", ep_packages={"onnxruntime": "1.33.0"}),
        report("dev-1", devices=[]),
        report("dev-1", warnings=["rebuilt the state"]),
        report(
            "dev-1",
            manifest=ManifestStatus(status="rejected", generation=3, body_bytes=0, reason="bad"),
        ),
        report("dev-2"),
    ],
)
def test_what_the_fleet_side_reads_changes_the_digest(changed: DeviceReport) -> None:
    assert content_digest(changed) != content_digest(report())


def test_a_failure_is_news_when_its_reason_changes() -> None:
    failed = [report("d", model("failed", reason=f"download failed: {c}")) for c in (503, 503, 404)]
    assert content_digest(failed[0]) == content_digest(failed[1]) != content_digest(failed[2])


def test_an_unchanged_report_waits_for_the_heartbeat() -> None:
    sent = SentReport(store="s3://b/fleet", key=report_key("d"), digest="x", at=NOW)

    def since(at: datetime, **other: str) -> datetime | None:
        fields = {"store": "s3://b/fleet", "key": report_key("d"), "digest": "x"} | other
        return unchanged_since(sent, fields["store"], fields["key"], fields["digest"], at, DAY)

    assert since(NOW + timedelta(hours=23)) == NOW  # not due: skipped
    assert since(NOW + DAY) is None  # the heartbeat is due
    assert since(NOW - timedelta(minutes=1)) is None  # the clock went back: stale
    assert since(NOW, digest="y") is None  # it says something new
    assert since(NOW, store="s3://other") is None  # another store has nothing yet
    assert since(NOW, key=report_key("e")) is None  # renamed device
    assert unchanged_since(None, "s", "k", "x", NOW, DAY) is None  # never uploaded


# --- readers ----------------------------------------------------------------------------------


def test_readers_take_both_forms_and_name_what_they_cannot_read(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    store.write(report_key("new"), encode_report(report("new")), content_encoding="gzip")
    store.write(report_key("old"), report("old").model_dump_json(indent=2).encode())
    store.write(report_key("bomb"), gzip.compress(b"{" * (20 << 20)))
    reports, skipped = read_reports(store)
    assert sorted(r.device_id for r in reports) == ["new", "old"]
    assert skipped == [
        f"{report_key('bomb')}: inflates past the limit of {16 << 20} bytes",
    ]


def test_gc_pins_the_variants_of_gzipped_and_plain_reports_alike(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    variant = f"variants/m/cpu/{SHA}.onnx"
    other = f"variants/m/gpu/{'cd' * 32}.onnx"
    long_ago = (datetime.now(timezone.utc) - timedelta(days=10)).timestamp()
    for key, data in ((variant, b"a build"), (other, b"a build"), (MANIFEST_KEY, b"")):
        store.write(key, data or Manifest(generation=1, models={}).to_json())
        os.utime(tmp_path / "store" / key, (long_ago, long_ago))
    store.write(report_key("new"), encode_report(report("new")), content_encoding="gzip")
    gpu = model(target="gpu", variant=f"gpu-{'cd' * 6}", artifact_sha256="cd" * 32)
    store.write(report_key("old"), report("old", gpu).model_dump_json().encode())
    later = datetime.now(timezone.utc) + timedelta(days=2)
    result = collect(store, now=later, retention_days=3)
    kept = {k.key: k.reason for k in result.plan.kept}
    assert "device new reported it active" in kept[variant]
    assert "device old reported it active" in kept[other]
    assert result.plan.protected == 3  # manifest.json and the reports: never collected
    with pytest.raises(BadInputError, match="shorter than the devices' report heartbeat"):
        collect(store, now=later, retention_days=0.5)


def test_a_window_shorter_than_the_heartbeat_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    check_report_window(DAY, "x")  # the default heartbeat: a day
    with pytest.raises(BadInputError) as refused:
        check_report_window(timedelta(hours=12), "runtime-watch's report_max_age_days")
    assert str(refused.value).startswith(
        "runtime-watch's report_max_age_days (0.5 days) is shorter than the devices' report "
        "heartbeat EPFLEET_REPORT_HEARTBEAT (1 days)"
    )
    monkeypatch.setenv("EPFLEET_REPORT_HEARTBEAT", str(7 * 86400))
    with pytest.raises(BadInputError, match=r"\(7 days\)"):
        check_report_window(3 * DAY, "x")


def test_reports_stream_with_a_bounded_number_in_flight(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    for i in range(40):
        store.write(report_key(f"d{i:02d}"), encode_report(report(f"d{i:02d}")))
    taken = [0]
    lock = threading.Lock()

    def keys() -> Iterator[str]:
        for obj in store.iter_objects("reports/devices/"):
            with lock:
                taken[0] += 1
            yield obj.key

    stream = stream_reports(store, keys(), threads=2)
    first = next(stream)
    assert isinstance(first, DeviceReport)
    assert taken[0] <= 2 * 2 + 1  # the window, not the fleet
    rest = list(stream)
    assert len(rest) == 39 and taken[0] == 40


def test_problems_are_counted_all_and_named_up_to_a_limit() -> None:
    problems = Problems()
    for i in range(MAX_LISTED_PROBLEMS + 5):
        problems.add(Unattributed(f"k{i}", "unreadable", "bad"))
    assert problems.count == MAX_LISTED_PROBLEMS + 5
    summary = problems.summary()
    assert len(summary) == MAX_LISTED_PROBLEMS + 1 and summary[-1].endswith(
        "5 more unreadable reports"
    )
