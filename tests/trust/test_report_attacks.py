"""Forged device reports against the rollout gate (issue 27), through a real store: a local
directory and S3 over HTTP (moto). Whoever can write the reports prefix writes reports
under any key, in any device's name, with any numbers. What they must not be able to do
is move the gate: reports under a key of another device, from devices the signed salt
puts outside the stage, of another rollout, older than the stage, or with numbers that are
not finite, are not counted (and are counted as such); the gate's decision on the real
reports stands, and it says how many reports it could not attribute.

The reports are written as devices write them (``encode_report``, gzip), the decision is
``epfleet rollout status``'s (``read_evidence``), and the CLI's table escapes what the
reports' names carry."""

from __future__ import annotations

import base64
import gzip
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.device.reporting import upload_report
from epfleet.fleet.publishing import update_manifest
from epfleet.fleet.rollouts import read_evidence
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
    encode_report,
    report_key,
)
from epfleet.formats.manifest import Manifest
from epfleet.formats.rollout import Rollout, RolloutPolicy, is_member
from epfleet.stores import Store, open_store
from epfleet.trust.keys import new_key, read_private_key
from epfleet.trust.repository import init_with_key_files
from epfleet.trust.state import has_trust
from tests.support.publish_helpers import publish_new

pytestmark = pytest.mark.fast

MODEL = "model-0"
ROLLOUT_ID = "0" * 16
STARTED = datetime.now(timezone.utc) - timedelta(hours=2)
POLICY = RolloutPolicy(stages=[10, 100], canary=["dev-000"], min_reports=2, min_hours=1)
ROLLOUT = Rollout(
    id=ROLLOUT_ID,
    salt="5a17" * 8,
    policy=POLICY,
    stage=0,
    started_at=STARTED,
    stage_started_at=STARTED,
)
IDS = [f"dev-{i:03d}" for i in range(1, 300)]
MEMBERS = [d for d in IDS if is_member(ROLLOUT, d)]
OUTSIDE = [d for d in IDS if not is_member(ROLLOUT, d)]


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    uri = (
        str(tmp_path / "store")
        if request.param == "local"
        else request.getfixturevalue("s3_store_uri")
    )
    opened = open_store(uri)
    publish_new(opened, 0)

    def stage(current: Manifest | None) -> Manifest | None:
        assert current is not None
        entry = current.models[MODEL]
        staged = entry.model_copy(
            update={"rollout": ROLLOUT, "previous": {"cpu": entry.variants["cpu"]}}
        )
        models = current.models | {MODEL: staged}
        return Manifest(generation=current.generation + 1, published_at=STARTED, models=models)

    update_manifest(opened, stage)
    return opened


def report(
    device: str,
    member: bool,
    action: str = "kept",
    p50: float = 10.0,
    *,
    made: datetime | None = None,
    rollout_id: str = ROLLOUT_ID,
    model: str = MODEL,
) -> DeviceReport:
    served = action != "failed"
    return DeviceReport(
        device_id=device,
        generated_at=(made or datetime.now(timezone.utc)).isoformat(),
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store="s",
        cache="c",
        manifest=ManifestStatus(status="unchanged", generation=2, body_bytes=0),
        models=[
            ModelReport(
                model=model,
                action=action,  # type: ignore[arg-type]
                variant="cpu-x",
                target="cpu",
                ep="CPUExecutionProvider",
                verdict=None,
                bytes_downloaded=0,
                reason="",
                considered=[],
                seconds=0.1,
                profile=Profile(session_ms=1, first_run_ms=2, p50_ms=p50, p95_ms=p50, runs=5)
                if served
                else None,
                rollout=RolloutSeen(id=rollout_id, member=member, stage=0, state="active"),
            )
        ],
        seconds=1.0,
    )


def put(store: Store, found: DeviceReport, key: str | None = None) -> None:
    store.write(key or report_key(found.device_id), encode_report(found))


def decision(store: Store) -> tuple[str, str]:
    [status] = read_evidence(store).statuses
    return status.verdict.decision, status.verdict.reason


def real_fleet(store: Store, failing: bool) -> None:
    """The canary and a member on the new variants (one failing, or not), and outside
    devices on the previous ones."""
    put(store, report("dev-000", True, "downloaded"))
    put(store, report(MEMBERS[0], True, "failed" if failing else "kept", 11.0))
    for device in OUTSIDE[:5]:
        put(store, report(device, False, "kept", 10.0))


def test_forged_successes_do_not_turn_a_halt_into_an_advance(store: Store) -> None:
    real_fleet(store, failing=True)
    before = decision(store)
    assert before[0] == "halt" and "1 of 2 member devices failed" in before[1]
    canary = report("dev-000", True, "downloaded")
    for i in range(40):  # one canary id, forty keys
        put(store, canary, f"reports/devices/canary-{i}.json")
    for device in OUTSIDE[5:65]:  # sixty ids outside the 10 % stage, claiming to be in it
        put(store, report(device, True, "downloaded"))
    for device in MEMBERS[1:4]:  # member ids, another rollout's reports
        put(store, report(device, True, "downloaded", rollout_id="f" * 16))
    for device in MEMBERS[4:8]:  # member ids, reports made before the stage started
        put(store, report(device, True, "downloaded", made=STARTED - timedelta(minutes=1)))
    [status] = read_evidence(store).statuses
    assert status.verdict.decision == "halt"
    assert (status.evidence.new.devices, status.evidence.new.failed) == (2, 1)
    assert status.evidence.not_attributed == {"key": 40, "membership": 60, "stale": 4}
    assert status.evidence.other_rollouts == 3


def test_forged_failures_do_not_halt_a_good_rollout_and_a_flood_only_holds_it(
    store: Store,
) -> None:
    real_fleet(store, failing=False)
    assert decision(store)[0] == "advance"
    for device in OUTSIDE[5:8]:  # three forged failures, in names outside the stage
        put(store, report(device, True, "failed"))
    held = decision(store)
    assert held[0] == "wait" and "may be forged" in held[1], held
    assert "3 claims a side of the rollout the signed salt does not give its device" in held[1]


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-5.0", b"1e300"])
def test_a_report_with_a_number_out_of_range_is_unreadable_and_turns_no_gate_off(
    store: Store, number: bytes
) -> None:
    put(store, report("dev-000", True, "downloaded", 74.1))  # 641 % slower than the others
    put(store, report(MEMBERS[0], True, "kept", 74.1))
    for device in OUTSIDE[:5]:
        put(store, report(device, False, "kept", 10.0))
    assert decision(store)[0] == "halt"
    raw = report(OUTSIDE[5], False, "kept", 10.0).model_dump_json().encode()
    forged = raw.replace(b'"p50_ms":10.0', b'"p50_ms":' + number)
    assert forged != raw
    store.write(report_key(OUTSIDE[5]), gzip.compress(forged))
    reading = read_evidence(store)
    assert reading.unreadable == 1 and reading.statuses[0].evidence.unreadable == 1
    assert reading.statuses[0].verdict.decision == "halt"  # the latency gate still on


def test_report_names_are_escaped_on_the_terminal(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    real_fleet(store, failing=False)
    hostile = "m\x1b[2J\x1b[31m|x\n../../evil\u202e"
    put(store, report("dev-000", True, "downloaded", model=hostile), "reports/devices/dev-999.json")
    capsys.readouterr()
    assert main(["manifest", "show", "--store", store.uri, "--field"]) == 0
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\u202e" not in shown
    assert "m\\x1b[2J\\x1b[31m|x\\x0a../../evil\\u202e" in shown
    assert main(["rollout", "status", "--store", store.uri]) == 0
    status = capsys.readouterr().out
    assert "\x1b" not in status and "1 its object key names another device" not in status


# --- authenticated reports -------------------------------------------------------------------

SIGNED_POLICY = POLICY.model_copy(update={"authenticated_reports": True, "min_reports": 1})


@pytest.fixture
def signed_store(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Store, Path]:
    """The staged store, signed (trust init adopts its manifest), its rollout asking for
    authenticated reports; EPFLEET_TRUST_SIGNER set for the publishes."""
    if not has_trust(store):  # a local store is signed already, with development keys
        _, uri = init_with_key_files(store, tmp_path / "fleet-keys", bins=16)
        monkeypatch.setenv("EPFLEET_TRUST_SIGNER", uri)

    def ask(current: Manifest | None) -> Manifest | None:
        assert current is not None
        entry = current.models[MODEL]
        assert entry.rollout is not None
        rollout = entry.rollout.model_copy(update={"policy": SIGNED_POLICY})
        models = current.models | {MODEL: entry.model_copy(update={"rollout": rollout})}
        return current.succeeded_by(models)

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
    [status] = read_evidence(store).statuses
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
