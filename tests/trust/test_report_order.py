"""A device's reports in order (epfleet/fleet/evidence/rules.py ``newest``): an enrolled device
numbers its signed reports, the rollout gate and the field view remember the newest one
they heard from it, and an older signed report put back under its key by whoever can
write the store changes nothing: a member's signed failure stays a failure (before, putting
back its earlier signed success turned the gate's halt into an advance). The field view
counts as the gate does: a report under another device's key is not counted. On a local
store and on S3 over HTTP (moto)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.device.cache import DeviceCache
from epfleet.device.reporting import upload_report
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
    VariantVerdict,
    decode_report,
    encode_report,
    report_key,
)
from epfleet.formats.rollout import Rollout, RolloutPolicy
from epfleet.stores import Store
from eps.base import Verdict
from tests.support.signed_store import signed_store, stage
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast

MODEL = "model-0"
CANARY = "dev-000"
STARTED = datetime.now(timezone.utc) - timedelta(hours=2)
ROLLOUT = Rollout(
    id="0" * 16,
    salt="5a17" * 8,
    policy=RolloutPolicy(
        stages=[10, 100], canary=[CANARY], min_reports=1, min_hours=1, authenticated_reports=True
    ),
    stage=0,
    started_at=STARTED,
    stage_started_at=STARTED,
)


@pytest.fixture(params=on_stores("local", "s3"))
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A signed store whose model-0 is under a rollout counting signed reports only, with
    its canary enrolled and signing its reports (EPFLEET_DEVICE_KEY)."""
    opened = signed_store(request, tmp_path, monkeypatch)
    stage(opened, ROLLOUT)
    keys = tmp_path / "device-keys"
    assert main(["device", "enroll", CANARY, "--store", opened.uri, "--keys", str(keys)]) == 0
    monkeypatch.setenv("EPFLEET_DEVICE_KEY", str(keys / f"{CANARY}.pem"))
    return opened


def report(action: str, device: str = CANARY) -> DeviceReport:
    served = action != "failed"
    return DeviceReport(
        device_id=device,
        generated_at=datetime.now(timezone.utc).isoformat(),
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store="s",
        cache="c",
        manifest=ManifestStatus(status="unchanged", generation=2, body_bytes=0),
        models=[
            ModelReport(
                model=MODEL,
                action=action,  # type: ignore[arg-type]
                variant="cpu-x",
                target="cpu",
                ep="CPUExecutionProvider",
                verdict=None,
                bytes_downloaded=0,
                reason="crashed" if not served else "",
                considered=[
                    VariantVerdict(
                        target="cpu",
                        ep="CPUExecutionProvider",
                        device="cpu",
                        verdict=Verdict.OPTIMAL,
                        reason="",
                    )
                ],
                seconds=0.1,
                profile=Profile(session_ms=1, first_run_ms=2, p50_ms=10, p95_ms=10, runs=5)
                if served
                else None,
                rollout=RolloutSeen(id=ROLLOUT.id, member=True, stage=0, state="active"),
            )
        ],
        seconds=1.0,
    )


def gate(capsys: pytest.CaptureFixture[str], store: Store) -> str:
    capsys.readouterr()
    assert main(["rollout", "status", "--store", store.uri, "--json"]) == 0
    [status] = json.loads(capsys.readouterr().out)
    return f"{status['verdict']['decision']}: {status['verdict']['reason']}"


def field(capsys: pytest.CaptureFixture[str], store: Store) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(["manifest", "show", "--store", store.uri, "--field", "--json"]) == 0
    out, err = capsys.readouterr()
    [row] = [r for r in json.loads(out) if r["model"] == MODEL]
    return row, err


def test_an_older_signed_report_put_back_does_not_erase_a_members_failure(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    device = DeviceCache(tmp_path / "device-cache")
    success = upload_report(store, report("kept"), device)
    assert success.report_uploaded, success.report_error
    success_bytes = store.read(report_key(CANARY))
    assert success_bytes is not None
    assert gate(capsys, store).startswith("advance: 1 member devices on the new variants")

    failure = upload_report(store, report("failed"), device)
    assert failure.report_uploaded, failure.report_error
    assert success.sequence is not None and failure.sequence is not None
    assert failure.sequence > success.sequence  # the device's counter, in its cache
    assert json.loads(device.report_sent() or b"{}")["sequence"] == failure.sequence
    stored = decode_report(store.read(report_key(CANARY)).data, 1 << 20)  # type: ignore[union-attr]
    assert stored.sequence == failure.sequence  # inside the signed payload
    halted = gate(capsys, store)
    assert halted.startswith("halt: 1 of 1 member devices failed the new variants")
    assert field(capsys, store)[0] | {"p50_ms": None, "p95_ms": None} == {
        "model": MODEL,
        "target": "cpu",
        "published": True,
        "running": 0,
        "failed": 1,
        "p50_ms": None,
        "p95_ms": None,
        "partly_on_other_eps": 0,
    }

    # whoever can write the store puts the earlier signed success back
    store.write(report_key(CANARY), success_bytes.data)
    assert gate(capsys, store) == halted
    row, _ = field(capsys, store)
    assert (row["running"], row["failed"]) == (0, 1)

    # the device's next report counts again
    recovered = upload_report(store, report("kept"), device)
    assert recovered.report_uploaded and recovered.sequence > failure.sequence  # type: ignore[operator]
    assert gate(capsys, store).startswith("advance: 1 member devices")
    row, _ = field(capsys, store)
    assert (row["running"], row["failed"]) == (1, 0)


def test_the_field_view_counts_no_report_under_another_devices_key(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    sent = upload_report(store, report("kept"))
    assert sent.report_uploaded, sent.report_error
    copy = store.read(report_key(CANARY))
    assert copy is not None
    for i in range(1, 4):  # the canary's report copied under three other devices' keys
        store.write(report_key(f"dev-{i:03d}"), copy.data)
    store.write(report_key("dev-100"), encode_report(report("failed", "dev-200")))
    row, err = field(capsys, store)
    assert (row["running"], row["failed"]) == (1, 0)
    assert "epfleet: 4 device reports under another device's key not counted" in err
    capsys.readouterr()
    assert main(["manifest", "show", "--store", store.uri, "--field"]) == 0
    assert "from 1 device report;" in capsys.readouterr().out
