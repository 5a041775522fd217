"""Forged device reports against the rollout gate, through a real store: a local
directory and S3 over HTTP (moto). Whoever can write the reports prefix writes reports
under any key, in any device's name, with any numbers. What they must not be able to do
is move the gate: each kind of forgery (one id under forty keys, reports under another
device's key, ids the signed salt puts outside the stage claiming to be in it, reports of
another rollout, of another stage or older than it, numbers not finite or out of range)
is written against a gate that advances, one that halts and one that waits, pushing the
other way; the decision and both sides' counts stand, and the forgeries are counted by
reason. The bound is checked too: unusable reports under member devices' keys hold an
advance, and nothing unattributed halts one.

The reports are written as devices write them (``encode_report``, gzip), the decision is
``epfleet rollout status``'s (``read_evidence``, the rollout-gate flow's ``run_gate``
reads the same), and the CLI's table escapes what the reports' names carry.

The stage started two hours ago on the real clock (``min_hours`` 1), so the gate advances:
the gate's ``min_hours`` end to end on the real clock. tests/fleet/test_rollout_gate_clock.py
tests the same rule on a fake clock (a stage waits until it has lasted ``min_hours``).

Each case runs on the in-memory store in the fast tier, and on a local directory and on S3
(moto over HTTP) in the slow tier (``tests.support.tiers.END_TO_END``)."""

from __future__ import annotations

import base64
import gzip
import json
from datetime import timedelta
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.device.reporting import upload_report
from epfleet.fleet.publishing.publish import update_manifest
from epfleet.fleet.rollout.rollouts import GateReading, read_evidence
from epfleet.formats.device_report import (
    encode_report,
    report_key,
)
from epfleet.formats.manifest import Manifest, utcnow
from epfleet.stores import Store, open_store
from epfleet.trust.keys import new_key, read_private_key
from epfleet.trust.repository import init_with_key_files
from epfleet.trust.state import has_trust
from tests.support.publish_helpers import publish_new
from tests.support.staged_rollout import (
    MEMBERS,
    MODEL,
    OUTSIDE,
    POLICY,
    STARTED,
    put,
    real_fleet,
    report,
    settled,
    staged_store,
)
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def settled_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A report written before a pass started is settled at once (the stores here give
    modification times finer than S3's seconds): a second pass reads only what changed."""
    monkeypatch.setattr("epfleet.fleet.evidence.index_rules.SETTLE_SECONDS", 0.0)


@pytest.fixture(params=on_stores("memory", "local", "s3", in_tier=("memory",)))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """The staged store: in memory (the fast tier), and end to end a local directory
    (signed on its first publish with development keys, 256 bins: 3-4 s) and S3."""
    return staged_store(request, tmp_path)


def decision(store: Store) -> tuple[str, str]:
    [status] = read_evidence(store).statuses
    return status.verdict.decision, status.verdict.reason


def indexed(store: Store) -> GateReading:
    """The gate's reading through the evidence index, checked against a full recount of
    the reports: the forgeries are replayed on the index path, folded into a warm index."""
    reading = read_evidence(store)
    assert reading.index is not None and not reading.index.rebuilt
    assert reading.model_dump(exclude={"index"}) == read_evidence(store, full=True).model_dump(
        exclude={"index"}
    )
    return reading


Baseline = str
"""The gate's decision on the real reports: "advance", "halt" or "wait"."""


def bad_number(device: str, number: bytes, action: str) -> bytes:
    raw = report(device, True, action, 10.0).model_dump_json().encode()
    forged = raw.replace(b'"seconds":0.1', b'"seconds":' + number)  # the model's sync time
    assert forged != raw
    return gzip.compress(forged)


def forge(store: Store, attack: str, action: str) -> dict[str, object]:
    """Write the forged reports of ``attack``, each pushing the way the real reports do not
    (``action``); what the gate must count them as."""
    if attack == "duplicate ids":  # one canary id, forty keys (of devices outside the stage)
        canary = report("dev-000", True, action)
        for device in OUTSIDE[10:50]:
            put(store, canary, report_key(device))
        return {"not_attributed": {"key": 40}}
    if attack == "key mismatch":  # member devices' reports under outside devices' keys
        for member, key in zip(MEMBERS[1:11], OUTSIDE[50:60], strict=True):
            put(store, report(member, True, action), report_key(key))
        return {"not_attributed": {"key": 10}}
    if attack == "non-member ids":  # sixty ids outside the 10 % stage, claiming to be in it
        for device in OUTSIDE[60:120]:
            put(store, report(device, True, action))
        return {"not_attributed": {"membership": 60}}
    if attack == "other rollout ids":  # member ids, another rollout's reports
        for device in MEMBERS[1:4]:
            put(store, report(device, True, action, rollout_id="f" * 16))
        return {"other_rollouts": 3}
    if attack == "stale reports":  # member ids, made before the stage started or for another
        for device in MEMBERS[4:8]:
            put(store, report(device, True, action, made=STARTED - timedelta(minutes=1)))
        for device in MEMBERS[8:10]:
            put(store, report(device, True, action, stage=1))
        return {"not_attributed": {"stale": 6}}
    assert attack == "bad numbers"  # NaN, inf, negative, absurd: unreadable
    for device, number in zip(
        OUTSIDE[120:124], [b"NaN", b"Infinity", b"-5.0", b"1e300"], strict=True
    ):
        store.write(report_key(device), bad_number(device, number, action))
    return {"unreadable": 4}


ATTACKS = [
    "duplicate ids",
    "key mismatch",
    "non-member ids",
    "other rollout ids",
    "stale reports",
    "bad numbers",
]


@pytest.mark.parametrize("baseline", ["advance", "halt", "wait"])
@pytest.mark.parametrize("attack", ATTACKS)
def test_a_forged_report_moves_no_gate_decision(store: Store, attack: str, baseline: str) -> None:
    real_fleet(store, baseline)
    settled(store)
    before = read_evidence(store).statuses[0]
    assert before.verdict.decision == baseline, before.verdict
    action = "failed" if baseline == "advance" else "downloaded"
    expected = {"not_attributed": {}, "other_rollouts": 0, "unreadable": 0} | forge(
        store, attack, action
    )
    reading = indexed(store)
    assert reading.index is not None and reading.index.reports_read < reading.index.listed
    [after] = reading.statuses
    assert after.verdict.decision == baseline, after.verdict
    assert after.evidence.new == before.evidence.new
    assert after.evidence.previous == before.evidence.previous
    found = after.evidence
    assert {
        "not_attributed": found.not_attributed,
        "other_rollouts": found.other_rollouts,
        "unreadable": found.unreadable,
    } == expected
    assert found.unheard_members == 0
    assert reading.unreadable == expected["unreadable"]
    refused = found.unattributed + found.unreadable
    if refused:  # the verdict says what it did not count, by reason
        assert "not counted: " in after.verdict.reason, after.verdict.reason


def test_three_forged_failures_do_not_halt_a_good_rollout(store: Store) -> None:
    """A halt needs failures of devices the signed salt puts in the stage, heard under
    their own keys: failures in names outside the stage count for nothing."""
    real_fleet(store, "advance")
    for device in OUTSIDE[5:8]:
        put(store, report(device, True, "failed"))
    [status] = read_evidence(store).statuses
    assert status.verdict.decision == "advance", status.verdict
    assert "3 claims a side of the rollout the signed salt does not give its device" in (
        status.verdict.reason
    )


def test_unusable_reports_under_member_keys_hold_a_stage_but_never_halt_it(store: Store) -> None:
    """The bound: reports the gate cannot use under the keys of devices in the stage (a
    member it cannot hear) hold an advance while they are as many as the members heard,
    and never halt or advance anything."""
    real_fleet(store, "advance")
    for device in MEMBERS[1:3]:
        store.write(report_key(device), b"not a report")
    [held] = read_evidence(store).statuses
    assert held.verdict.decision == "wait", held.verdict
    assert "2 member devices' reports could not be used" in held.verdict.reason
    assert held.evidence.unheard_members == 2 and held.evidence.unreadable == 2


def test_a_nan_latency_does_not_turn_the_latency_gate_off(store: Store) -> None:
    put(store, report("dev-000", True, "downloaded", 74.1))  # 641 % slower than the others
    put(store, report(MEMBERS[0], True, "kept", 74.1))
    for device in OUTSIDE[:5]:
        put(store, report(device, False, "kept", 10.0))
    assert decision(store)[0] == "halt"
    raw = report(OUTSIDE[5], False, "kept", 10.0).model_dump_json().encode()
    store.write(report_key(OUTSIDE[5]), gzip.compress(raw.replace(b"10.0", b"NaN", 1)))
    reading = read_evidence(store)
    assert reading.unreadable == 1 and reading.statuses[0].evidence.unreadable == 1
    assert reading.statuses[0].verdict.decision == "halt"  # the latency gate still on


def test_report_names_are_escaped_on_the_terminal(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    real_fleet(store, "advance")
    hostile = "m\x1b[2J\x1b[31m|x\n../../evil\u202e"
    put(store, report("dev-999", True, "downloaded", model=hostile))
    capsys.readouterr()
    assert main(["manifest", "show", "--store", store.uri, "--field"]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\u202e" not in shown
    assert "m\\x1b[2J\\x1b[31m|x\\x0a../../evil\\u202e" in shown
    assert main(["rollout", "status", "--store", store.uri]) == 0
    status = capsys.readouterr().out
    assert "\x1b" not in status


def test_rollout_status_shows_both_sides_and_what_it_did_not_count(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    real_fleet(store, "advance")
    put(store, report(MEMBERS[1], True, "failed"), report_key(OUTSIDE[9]))
    capsys.readouterr()
    assert main(["rollout", "status", "--store", store.uri, "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    new, previous = shown["evidence"]["new"], shown["evidence"]["previous"]
    assert (new["devices"], new["failed"], new["failure_rate"]) == (2, 0, 0.0)
    assert (new["median_p50_ms"], previous["median_p50_ms"]) == (10.5, 10.0)
    assert (previous["devices"], previous["other_eps_share"]) == (5, 0.0)
    assert shown["evidence"]["not_attributed"] == {"key": 1}
    assert "p50_ms" not in new  # a median, not every device's number
    assert main(["rollout", "status", "--store", store.uri]) == 0
    table = capsys.readouterr().out
    assert "2 devices, 0 failed (0%), p50 10.5 ms" in table
    assert "1 its object key names another device" in table and "1 under another" in table


# --- authenticated reports -------------------------------------------------------------------

SIGNED_POLICY = POLICY.model_copy(update={"authenticated_reports": True, "min_reports": 1})


@pytest.fixture
def signed_store(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Store, Path]:
    """The staged store, signed (trust init adopts its manifest), its rollout asking for
    authenticated reports; EPFLEET_TRUST_SIGNER set for the publishes."""
    if not has_trust(store):  # a local store is signed already, with development keys
        _, uri = init_with_key_files(store, tmp_path / "fleet-keys", bins=16, adopt=True)
        monkeypatch.setenv("EPFLEET_TRUST_SIGNER", uri)

    def ask(current: Manifest | None) -> Manifest | None:
        assert current is not None
        entry = current.models[MODEL]
        assert entry.rollout is not None
        rollout = entry.rollout.model_copy(update={"policy": SIGNED_POLICY})
        models = current.models | {MODEL: entry.model_copy(update={"rollout": rollout})}
        return current.succeeded_by(models, utcnow())

    update_manifest(store, ask)
    return store, tmp_path / "device-keys"


def enrol(capsys: pytest.CaptureFixture[str], store: Store, keys: Path, device: str) -> Path:
    code = main(["device", "enroll", device, "--store", store.uri, "--keys", str(keys)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"EPFLEET_DEVICE_KEY={keys / (device + '.pem')}" in out
    return keys / f"{device}.pem"


def test_with_authenticated_reports_only_reports_signed_by_enrolled_devices_count(
    signed_store: tuple[Store, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    store, keys = signed_store
    canary = read_private_key(enrol(capsys, store, keys, "dev-000"))
    member = read_private_key(enrol(capsys, store, keys, MEMBERS[0]))
    stranger = new_key()  # a key nobody enrolled
    good = report("dev-000", True, "downloaded")
    store.write(report_key("dev-000"), encode_report(good, canary))
    # a member's name, signed with the canary's key
    store.write(report_key(MEMBERS[0]), encode_report(report(MEMBERS[0], True, "failed"), canary))
    # enrolled names, unsigned
    for device in OUTSIDE[:3]:
        put(store, report(device, False, "failed"))
    # a name nobody enrolled, signed by a key nobody enrolled
    store.write(report_key(MEMBERS[1]), encode_report(report(MEMBERS[1], True), stranger))
    # the member's own report, signed, then its payload changed (failed -> kept)
    signed = gzip.decompress(encode_report(report(MEMBERS[2], True, "failed"), member))
    envelope = json.loads(signed)
    payload = base64.b64decode(envelope["payload"]).replace(b'"failed"', b'"kept"')
    envelope["payload"] = base64.b64encode(payload).decode()
    store.write(report_key(MEMBERS[2]), gzip.compress(json.dumps(envelope).encode()))

    [status] = read_evidence(store).statuses
    assert (status.evidence.new.devices, status.evidence.new.failed) == (1, 0)
    assert status.evidence.not_attributed == {
        "bad signature": 1,  # the canary's key in a member's name
        "unsigned": 3,
        "not enrolled": 2,  # the stranger's, and the tampered one (MEMBERS[2] not enrolled)
    }
    listed = main(["device", "list", "--store", store.uri])
    out = capsys.readouterr().out
    assert listed == 0 and "dev-000" in out and MEMBERS[0] in out

    # the member's real report, signed with its own key, counts; once revoked, it does not
    store.write(report_key(MEMBERS[0]), encode_report(report(MEMBERS[0], True, "failed"), member))
    [status] = read_evidence(store).statuses
    assert (status.evidence.new.devices, status.evidence.new.failed) == (2, 1)
    assert status.verdict.decision == "halt"
    assert main(["device", "revoke", MEMBERS[0], "--store", store.uri]) == 0
    [status] = indexed(store).statuses
    assert (status.evidence.new.devices, status.evidence.new.failed) == (1, 0)
    assert status.evidence.not_attributed.get("not enrolled") == 3


def test_a_tampered_payload_of_an_enrolled_device_is_refused(
    signed_store: tuple[Store, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    store, keys = signed_store
    member = read_private_key(enrol(capsys, store, keys, MEMBERS[0]))
    signed = gzip.decompress(encode_report(report(MEMBERS[0], True, "failed"), member))
    envelope = json.loads(signed)
    payload = base64.b64decode(envelope["payload"]).replace(b'"failed"', b'"kept"')
    envelope["payload"] = base64.b64encode(payload).decode()
    store.write(report_key(MEMBERS[0]), gzip.compress(json.dumps(envelope).encode()))
    [status] = read_evidence(store).statuses
    assert status.evidence.new.devices == 0
    assert status.evidence.not_attributed == {"bad signature": 1}


def test_enrolment_needs_a_signed_store(
    s3_store_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    publish_new(open_store(s3_store_uri), 0)  # an S3 store without trust metadata
    keys = tmp_path / "device-keys"
    code = main(["device", "enroll", "dev-000", "--store", s3_store_uri, "--keys", str(keys)])
    assert code == 2 and "authenticated reports need a signed store" in capsys.readouterr().err
    assert not keys.exists()  # nothing written


def test_enrolling_twice_is_refused_and_leaves_no_second_key(
    signed_store: tuple[Store, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    store, keys = signed_store
    enrol(capsys, store, keys, "dev-000")
    other = keys.parent / "other-keys"
    code = main(["device", "enroll", "dev-000", "--store", store.uri, "--keys", str(other)])
    assert code == 2 and "enrolled already" in capsys.readouterr().err
    assert not (other / "dev-000.pem").exists()


def test_a_device_with_a_key_uploads_its_report_signed(
    signed_store: tuple[Store, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, keys = signed_store
    path = enrol(capsys, store, keys, "dev-000")
    monkeypatch.setenv("EPFLEET_DEVICE_KEY", str(path))
    sent = upload_report(store, report("dev-000", True, "downloaded"))
    assert sent.report_uploaded, sent.report_error
    [status] = read_evidence(store).statuses
    assert status.evidence.new.devices == 1 and status.evidence.unattributed == 0
    monkeypatch.setenv("EPFLEET_DEVICE_KEY", str(keys / "missing.pem"))
    failed = upload_report(store, report("dev-000", True, "downloaded"))
    assert not failed.report_uploaded
    assert "EPFLEET_DEVICE_KEY: cannot read private key" in (failed.report_error or "")
