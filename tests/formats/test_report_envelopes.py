"""Signed device reports, pure: a DSSE envelope made by ``encode_report`` with a device's
key, read back by ``decode_report``, judged by ``signed_by`` and by the gate's
``counts_for`` under a policy that requires authenticated reports; each way of forging
one (a forged signature under the right key id, another device's key, a payload changed
or swapped under a genuine signature, a revoked key, another payload type)."""

from __future__ import annotations

import base64
import gzip
import json
from datetime import datetime, timedelta, timezone

import pytest
from securesystemslib.signer import CryptoSigner

from epfleet.fleet.evidence.enrolment import key_entry
from epfleet.fleet.rollout.rules import counts_for
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
    decode_report,
    encode_report,
    signed_by,
    signed_envelope,
)
from epfleet.formats.manifest import DeviceKey
from epfleet.formats.rollout import Rollout, RolloutPolicy

pytestmark = pytest.mark.fast

LIMIT = 1 << 20
KEY_A, KEY_B = CryptoSigner.generate_ecdsa(), CryptoSigner.generate_ecdsa()
ENROLLED = {"dev-a": key_entry(KEY_A.public_key), "dev-b": key_entry(KEY_B.public_key)}
STARTED = datetime.now(timezone.utc) - timedelta(hours=1)
ROLLOUT = Rollout(
    id="2" * 16,
    salt="5a17" * 8,
    policy=RolloutPolicy(stages=[100], authenticated_reports=True),
    stage=0,
    started_at=STARTED,
    stage_started_at=STARTED,
)


def report(device: str, action: str = "kept") -> DeviceReport:
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
                model="m",
                action=action,  # type: ignore[arg-type]
                variant="cpu-x",
                target="cpu",
                ep="CPUExecutionProvider",
                verdict=None,
                bytes_downloaded=0,
                reason="",
                considered=[],
                seconds=0.1,
                profile=Profile(session_ms=1, first_run_ms=2, p50_ms=10, p95_ms=10, runs=5),
                rollout=RolloutSeen(id=ROLLOUT.id, member=True, stage=0, state="active"),
            )
        ],
        seconds=1.0,
    )


def envelope_of(data: bytes) -> dict[str, object]:
    return json.loads(gzip.decompress(data))


def stored(envelope: dict[str, object]) -> bytes:
    return gzip.compress(json.dumps(envelope).encode())


def verdict(data: bytes, enrolled: dict[str, DeviceKey] = ENROLLED) -> object:
    read = decode_report(data, LIMIT)
    side = counts_for(ROLLOUT, "m", read, enrolled)
    return side if isinstance(side, str) else "counted"


def test_a_report_signed_by_its_enrolled_device_counts() -> None:
    data = encode_report(report("dev-a"), KEY_A)
    read = decode_report(data, LIMIT)
    assert signed_envelope(read) is not None and signed_by(read, ENROLLED["dev-a"])
    assert read.device_id == "dev-a" and verdict(data) == "counted"
    assert encode_report(report("dev-a")) != data  # signed and unsigned differ


def test_an_unsigned_report_does_not_count() -> None:
    data = encode_report(report("dev-a"))
    assert signed_envelope(decode_report(data, LIMIT)) is None
    assert verdict(data) == "unsigned"


def test_a_forged_signature_under_the_right_key_id_does_not_count() -> None:
    envelope = envelope_of(encode_report(report("dev-a"), KEY_A))
    signature = envelope["signatures"][0]  # type: ignore[index]
    signature["sig"] = base64.b64encode(b"\x30" + bytes(70)).decode()
    assert verdict(stored(envelope)) == "bad signature"


def test_another_devices_key_does_not_count() -> None:
    assert verdict(encode_report(report("dev-a"), KEY_B)) == "bad signature"
    stranger = CryptoSigner.generate_ecdsa()
    assert verdict(encode_report(report("dev-a"), stranger)) == "bad signature"
    assert verdict(encode_report(report("dev-x"), stranger)) == "not enrolled"


def test_a_genuine_signature_over_other_bytes_does_not_count() -> None:
    """The payload changed after signing, or another of the device's signed payloads
    swapped in under this signature."""
    envelope = envelope_of(encode_report(report("dev-a", "failed"), KEY_A))
    payload = base64.b64decode(envelope["payload"])  # type: ignore[arg-type]
    envelope["payload"] = base64.b64encode(payload.replace(b'"failed"', b'"kept"')).decode()
    assert verdict(stored(envelope)) == "bad signature"
    other = envelope_of(encode_report(report("dev-a", "kept"), KEY_A))
    other["signatures"] = envelope_of(encode_report(report("dev-a", "failed"), KEY_A))["signatures"]
    assert verdict(stored(other)) == "bad signature"


def test_a_revoked_device_no_longer_counts() -> None:
    data = encode_report(report("dev-a"), KEY_A)
    revoked = {d: k for d, k in ENROLLED.items() if d != "dev-a"}
    assert verdict(data, revoked) == "not enrolled"


def test_an_envelope_of_another_payload_type_is_unreadable() -> None:
    envelope = envelope_of(encode_report(report("dev-a"), KEY_A))
    envelope["payloadType"] = "application/vnd.in-toto+json"
    with pytest.raises(ValueError, match="not a device report"):
        decode_report(stored(envelope), LIMIT)


def test_a_policy_that_does_not_ask_for_signed_reports_keeps_its_signed_bytes() -> None:
    """Left out when off, as every field added under a minor version: an entry that does
    not use it is what devices that predate it read (at their own minor an unknown key is
    an error)."""
    assert "authenticated_reports" not in RolloutPolicy().model_dump_json()
    assert (
        "authenticated_reports"
        not in ROLLOUT.model_copy(update={"policy": RolloutPolicy()}).model_dump_json()
    )
    dumped = json.loads(ROLLOUT.model_dump_json())
    assert dumped["policy"]["authenticated_reports"] is True
    assert Rollout.model_validate(dumped).policy.authenticated_reports
