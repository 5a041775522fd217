"""The order of a device's reports (pure): ``evidence_rules.newest`` chooses between what a
device's report key holds and the newest signed report remembered from it; a device numbers
its reports (``reporting.next_sequence``), and the number changes neither what a report
says (``content_digest``) nor what an older reader takes."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from epfleet.device.reporting import next_sequence
from epfleet.fleet.evidence.enrolment import key_entry
from epfleet.fleet.evidence.rules import Unattributed, attribute, newest
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    content_digest,
    encode_report,
    report_key,
)
from epfleet.trust.keys import new_key

pytestmark = pytest.mark.fast

DEVICE = "dev-001"
KEY = new_key()
ENROLLED = key_entry(KEY.public_key)  # type: ignore[arg-type]
LIMIT = 1 << 20


def heard(sequence: int | None, signed: bool = True, note: str = "") -> DeviceReport | Unattributed:
    """A report of DEVICE numbered ``sequence``, as the gate hears it under DEVICE's key."""
    report = DeviceReport(
        device_id=DEVICE,
        generated_at=datetime(2026, 12, 7, tzinfo=timezone.utc).isoformat(),
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store=note or "s",
        cache="c",
        manifest=ManifestStatus(status="unchanged", generation=2, body_bytes=0),
        models=[],
        seconds=1.0,
        sequence=sequence,
    )
    return attribute(report_key(DEVICE), encode_report(report, KEY if signed else None), LIMIT)


def test_an_older_signed_report_put_back_yields_to_the_one_remembered() -> None:
    older, newer = heard(5), heard(6)
    assert newest(older, newer, ENROLLED) == (newer, False)


def test_a_newer_signed_report_counts_and_is_remembered() -> None:
    older, newer = heard(5), heard(6)
    assert newest(newer, older, ENROLLED) == (newer, True)
    assert newest(newer, None, ENROLLED) == (newer, True)
    same = heard(6, note="other")
    assert newest(same, newer, ENROLLED) == (same, False)  # a tie: what the key holds


def test_what_a_writer_without_the_key_puts_in_its_place_ranks_below_a_signed_number() -> None:
    remembered = heard(6)
    for in_place in (
        heard(10**15, signed=False),  # any number, unsigned
        heard(None),  # signed, without a number
        Unattributed(report_key(DEVICE), "unreadable", "not a valid gzip stream"),
    ):
        assert newest(in_place, remembered, ENROLLED) == (remembered, False)


def test_reports_without_a_number_count_as_before_where_nothing_is_remembered() -> None:
    old_device = heard(None)
    assert newest(old_device, None, ENROLLED) == (old_device, False)
    unsigned = heard(3, signed=False)
    assert newest(unsigned, None, ENROLLED) == (unsigned, False)  # not remembered


def test_a_report_remembered_under_a_key_no_longer_enrolled_ranks_nothing() -> None:
    remembered = heard(9)
    other = new_key()
    now = heard(2)
    assert newest(now, remembered, key_entry(other.public_key)) == (now, False)  # type: ignore[arg-type]


def test_a_device_numbers_its_reports_upwards_and_never_below_the_time() -> None:
    now = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
    millis = int(now.timestamp() * 1000)
    assert next_sequence(0, now) == millis  # a cache without a record
    assert next_sequence(millis, now) == millis + 1  # two in the same millisecond
    assert next_sequence(millis + 50, now) == millis + 51  # the clock set back


def test_the_number_changes_neither_what_a_report_says_nor_what_an_older_reader_takes() -> None:
    numbered = heard(7)
    unnumbered = heard(None)
    assert isinstance(numbered, DeviceReport) and isinstance(unnumbered, DeviceReport)
    assert content_digest(numbered) == content_digest(unnumbered)
    assert "sequence" not in unnumbered.model_dump_json()  # older devices' bytes
    # a reader of an older epfleet ignores a key it does not know, as it ignores this one
    with_unknown = numbered.model_dump_json().replace('"sequence":7', '"sequence":7,"later":1')
    assert DeviceReport.model_validate_json(with_unknown).sequence == 7
