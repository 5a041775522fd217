"""Names chosen by whoever can write reports, as the evidence index, the rollout gate, the
field view and runtime-watch meet them: report keys and inbox notices named with terminal
escapes, control characters, a bidi override, look-alikes of another device's id (upper
case, a full-width digit), names of hundreds of bytes; notices in malformed or far-off
partitions, dozens for one device, one carrying a report. No escape reaches a terminal or a
log, nothing counts twice, an inbox pass reads at most one report per well-named device it
was told of, and the index answers as a full recount does. On S3 (end to end) also keys only
S3 takes (``..``, ``.``, an empty segment, 1,000 bytes), written past the store's checks."""

from __future__ import annotations

import gzip
import logging
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest

from epfleet.cli.app import main
from epfleet.fleet.rollout.rollouts import read_evidence
from epfleet.formats.device_report import encode_report, inbox_key, inbox_partition, report_key
from epfleet.stores import Store, open_store
from tests.support.evidence_passes import same_as_recount
from tests.support.specs import write_spec
from tests.support.staged_rollout import (
    MEMBERS,
    OUTSIDE,
    put,
    real_fleet,
    report,
    settled,
    settled_at_once,  # noqa: F401 (autouse)
    staged_store,  # noqa: F401 (the fixture store)
)
from tests.support.watch_fleet import CPU, watch_report

pytestmark = pytest.mark.fast

EVERY = 4
TERMINAL_ACTS_ON = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
"""What a terminal acts on (line breaks and tabs aside): escapes, carriage returns, bells,
bidi controls."""
FORGED_NAMES = [
    "dev-\x1b[31mred\x1b[0m",
    "dev-\x1b]0;owned\x07",
    "dev-\rcr\nnl",
    "dev-\u202eevil",
    "DEV-001",
    "dev-00\uff11",
    "x" * 200,  # a well-formed id: its notice is followed
]


@pytest.fixture(autouse=True)
def _between_full_listings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPFLEET_EVIDENCE_FULL_LISTING_EVERY", str(EVERY))


def printed(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 0
    out = capsys.readouterr()
    return out.out + out.err


def forge(store: Store) -> None:
    """Reports under forged names (one claiming its own name, one another device's) and
    their notices, notices in partitions no clock files under, many notices for one device,
    a notice carrying a failed report of another."""
    now = datetime.now(timezone.utc)
    for n, name in enumerate(FORGED_NAMES):
        claims = name if n % 2 else MEMBERS[1]
        store.write(
            report_key(name),
            encode_report(
                report(MEMBERS[1], True, "failed").model_copy(update={"device_id": claims})
            ),
        )
        store.write(report_key(name + "-junk"), b"\x1b[2J\x1b[H not a report \x07")
        store.write(inbox_key(name, now), b"\x1b[2J")
    failed = gzip.compress(report(MEMBERS[2], True, "failed").model_dump_json().encode())
    store.write(inbox_key(MEMBERS[2], now), failed)  # read as a notice: its body is not
    for partition in ("99999999T9999", "00000000T0000", f"{now:%Y%m%dT%H}59", "notapartition"):
        store.write(f"reports/inbox/{partition}/{MEMBERS[3]}.json", b"")
    for minutes in range(0, 600, 10):
        store.write(inbox_key(MEMBERS[3], now - timedelta(minutes=minutes)), b"")
    store.write(inbox_key(MEMBERS[3], now + timedelta(days=3650)), b"")


def clean(text: str) -> str:
    assert not TERMINAL_ACTS_ON.search(text), TERMINAL_ACTS_ON.findall(text)
    return text


@pytest.mark.parametrize("store", ["memory", "local"], indirect=True)  # S3: below
def test_forged_names_reach_no_terminal_count_once_and_keep_the_pass_bounded(
    store: Store, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    real_fleet(store, "advance")
    for device in OUTSIDE[5:10]:
        put(store, report(device, False, "kept"))
    first = same_as_recount(store)
    forge(store)
    settled(store)
    noticed = read_evidence(store)
    assert noticed.index is not None and noticed.index.listing == "inbox"
    # three well-named devices were noticed: the long name, MEMBERS[2] and MEMBERS[3]
    assert noticed.index.reports_read <= 3
    before, after = first.statuses[0], noticed.statuses[0]
    assert after.evidence.new == before.evidence.new  # a notice's body is never read
    assert after.evidence.previous == before.evidence.previous
    assert after.verdict.decision == before.verdict.decision == "advance"
    while noticed.index is not None and noticed.index.listing != "full":
        noticed = read_evidence(store)
    full = same_as_recount(store)
    evidence = full.statuses[0].evidence
    assert evidence.new.devices == first.statuses[0].evidence.new.devices
    assert evidence.new.failed == 0  # no forged report counts as MEMBERS[1]
    # each forged report is heard once: attributed to its own name or refused, never both
    heard = full.read + full.unattributed - first.read - first.unattributed
    assert heard == len(FORGED_NAMES)
    assert full.unreadable == first.unreadable + len(FORGED_NAMES)
    uri = store.uri
    shown = printed(["rollout", "status", "--store", uri], capsys)
    shown += printed(["rollout", "status", "--store", uri, "--json"], capsys)
    shown += printed(["manifest", "show", "--store", uri, "--field"], capsys)
    check = printed(["rollout", "reindex", "--check", "--store", uri], capsys)
    assert "answers as a full recount does" in check
    clean(shown + check)
    clean("\n".join(r.getMessage() for r in caplog.records))


def test_runtime_watch_names_forged_devices_without_their_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = str(tmp_path / "store")
    spec = write_spec(
        tmp_path,
        [{"name": "det", "source": "det.onnx"}],
        [{"name": "x86-cpu", "ep": CPU}],
    )
    npu = [("OpenVINOExecutionProvider", "npu\x1b[5m", 0x8086), (CPU, "cpu", 0x8086)]
    opened = open_store(store)
    for name in [*FORGED_NAMES, "dev-plain"]:
        found = watch_report(name, npu, {"det\x1b[2J": "fallback"}, timedelta(minutes=5))
        found = found.model_copy(update={"generated_at": datetime.now(timezone.utc).isoformat()})
        opened.write(report_key(name), encode_report(found))
    opened.write(report_key("dev-\x1b[2Jjunk"), b"\x1b[2J not a report")
    shown = printed(["watch", str(spec), "--store", store, "--dry-run"], capsys)
    assert "unserved" in shown and "dev-plain" in shown
    clean(shown)
    clean("\n".join(r.getMessage() for r in caplog.records))


@pytest.mark.parametrize("store", ["s3"], indirect=True)
def test_keys_only_s3_takes_are_refused_or_counted_once_and_shown_escaped(
    store: Store,
    s3_bucket: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPFLEET_EVIDENCE_FULL_LISTING_EVERY", "1")  # reports/devices/ listed
    real_fleet(store, "advance")
    first = same_as_recount(store)
    partition = inbox_partition(datetime.now(timezone.utc))
    forged = [
        "reports/devices/../devices/dev-zz1.json",
        "reports/devices/./dev-zz2.json",
        "reports/devices//dev-zz3.json",
        f"reports/devices/{'y' * 1000}.json",
        "reports/devices/dev-\x1b[31m.json",
        f"reports/inbox/{partition}/../../devices/{MEMBERS[1]}.json",
        f"reports/inbox/{partition}/..",
        f"reports/inbox/{partition}/{'z' * 1000}.json",
        f"reports/inbox/{partition}/a/../{MEMBERS[1]}.json",
    ]
    s3 = boto3.client("s3")
    body = encode_report(report(MEMBERS[1], True, "failed"))
    for key in forged:
        s3.put_object(Bucket=s3_bucket, Key=f"fleet/{key}", Body=body)
    later = same_as_recount(store)
    # listed, read, and refused (their key names no device, or another one); keys with
    # ./ and ../ segments are never listed by a store, nor notices under them followed
    assert later.read == first.read and later.unattributed == first.unattributed + 3
    assert later.statuses[0].evidence.new == first.statuses[0].evidence.new
    uri = store.uri
    shown = printed(["rollout", "status", "--store", uri], capsys)
    check = printed(["rollout", "reindex", "--check", "--store", uri], capsys)
    assert "answers as a full recount does" in check
    clean(shown + check)
