"""The field ranking's rules (pure): one vote a device, only reports the gate could count,
enough devices, fastest median first, accelerators slower than the CPU named."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from epfleet.fleet.evidence.ranking_rules import LatencyTally, rank, why_lines
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.formats.device_report import DeviceInfo, DeviceReport, RolloutSeen
from epfleet.formats.field_ranking import ModelRanking, hardware_profile
from epfleet.formats.manifest import Manifest
from epfleet.formats.rollout import Rollout, RolloutPolicy, is_member
from tests.support.signed_records import entry, variant

pytestmark = pytest.mark.fast

NOW = datetime(2026, 12, 7, 12, tzinfo=timezone.utc)
AGE = timedelta(days=7)
NPU = DeviceInfo(ep="QNNExecutionProvider", type="npu", vendor="Q", vendor_id=0x5143,
                 device_id=1, ep_vendor="Q")  # fmt: skip
CPU = DeviceInfo(ep="CPUExecutionProvider", type="cpu", vendor="A", vendor_id=0x1022,
                 device_id=0, ep_vendor="Microsoft")  # fmt: skip
OTHER_CPU = CPU.model_copy(update={"device_id": 7})


def manifest() -> Manifest:
    model = entry("m")
    npu = variant(fingerprint="m-npu", ep="QNNExecutionProvider").model_copy(
        update={"device": "npu"}
    )
    return Manifest(
        models={
            "m": model.model_copy(update={"variants": {"cpu": model.variants["cpu"], "npu": npu}})
        }
    )


def report(device: str, target: str, p50: float, hardware: list[DeviceInfo] | None = None,
           **changes: object) -> DeviceReport:  # fmt: skip
    sha = manifest().models["m"].variants[target].artifact.sha256  # type: ignore[union-attr]
    model = {
        "model": "m", "action": "kept", "variant": target, "target": target,
        "artifact_sha256": sha, "ep": "CPUExecutionProvider", "verdict": "optimal",
        "bytes_downloaded": 0, "reason": "", "considered": [], "seconds": 0.0,
        "profile": {"session_ms": 1, "first_run_ms": 1, "p50_ms": p50, "p95_ms": p50, "runs": 5},
    }  # fmt: skip
    body = {
        "device_id": device, "generated_at": (NOW - timedelta(hours=1)).isoformat(),
        "ort_version": "1.32.0", "ep_packages": {"onnxruntime": "1.32.0"},
        "devices": [d.model_dump() for d in (hardware or [NPU, CPU])], "store": "s",
        "cache": "c", "manifest": {"status": "unchanged", "generation": 1, "body_bytes": 0},
        "models": [model], "seconds": 0.1,
    }  # fmt: skip
    body.update(changes)
    return DeviceReport.model_validate(body)


def tallied(*reports: DeviceReport | Unattributed, authenticated: bool = False) -> LatencyTally:
    tally = LatencyTally()
    for one in reports:
        tally.add(one, manifest(), {}, NOW, AGE, authenticated=authenticated)
    return tally


def ranked(*reports: DeviceReport | Unattributed, min_devices: int = 2) -> ModelRanking | None:
    return rank(tallied(*reports), manifest(), min_devices).get("m")


def test_each_profile_is_ranked_by_its_own_devices_fastest_median_first() -> None:
    found = ranked(
        report("d1", "npu", 4.0), report("d2", "npu", 6.0), report("d3", "npu", 5.0),
        report("d4", "cpu", 9.0), report("d5", "cpu", 8.0),
        report("e1", "npu", 30.0, [NPU, OTHER_CPU]), report("e2", "npu", 31.0, [NPU, OTHER_CPU]),
        report("e3", "cpu", 12.0, [NPU, OTHER_CPU]), report("e4", "cpu", 11.0, [NPU, OTHER_CPU]),
    )  # fmt: skip
    assert found is not None
    by_hardware = {p.profile: p for p in found.profiles}
    mine = by_hardware[hardware_profile([NPU, CPU])[0]]
    assert [(m.target, m.devices, m.p50_ms) for m in mine.order] == [
        ("npu", 3, 5.0),
        ("cpu", 2, 8.5),
    ]
    assert mine.slower_than_cpu == []
    other = by_hardware[hardware_profile([NPU, OTHER_CPU])[0]]
    assert other.targets == ["cpu", "npu"]
    assert other.slower_than_cpu == ["npu"]
    assert why_lines(other)[1].endswith("slower than the CPU variant: not preferred")
    assert found.for_device(other.profile, "ORT 1.32.0") == other
    assert found.for_device(other.profile, "ORT 1.33.0") is None  # another runtime


def test_too_few_devices_or_one_variant_measured_gives_no_ranking() -> None:
    assert ranked(report("d1", "npu", 4.0), report("d2", "cpu", 9.0)) is None
    assert ranked(report("d1", "npu", 4.0), report("d2", "npu", 9.0)) is None
    assert ranked(report("d1", "npu", 4.0), report("d2", "cpu", 9.0), min_devices=1) is not None


def test_a_device_votes_once_and_only_as_the_gate_would_count_it() -> None:
    one = report("d1", "cpu", 1.0)
    repeated = one.model_copy(update={"models": one.models * 3})
    tally = tallied(
        repeated,
        Unattributed("reports/devices/d9.json", "key", "names d1", one),
        report("d2", "cpu", 1.0, generated_at=(NOW - timedelta(days=8)).isoformat()),
        report("d3", "cpu", 1.0, generated_at="2026-12-07T11:00:00"),
        report("d4", "cpu", 1.0, generated_at=(NOW + timedelta(hours=1)).isoformat()),
        report("d5", "cpu", 1.0, artifact_sha256=None).model_copy(
            update={"models": [report("d5", "cpu", 1.0).models[0].model_copy(
                update={"artifact_sha256": "f" * 64})]}
        ),
        report("d6", "cpu", 1.0).model_copy(
            update={"models": [report("d6", "cpu", 1.0).models[0].model_copy(
                update={"target": "gone"})]}
        ),
    )  # fmt: skip
    assert [len(devices) for devices in tally.latencies.values()] == [1]
    assert tally.refused == {
        "repeated": 2, "key": 1, "old": 1, "time": 2, "another build": 1, "not published": 1,
    }  # fmt: skip
    signed_only = tallied(report("d1", "cpu", 1.0), authenticated=True)
    assert signed_only.latencies == {} and signed_only.refused == {"unsigned": 1}


def test_a_device_claiming_the_wrong_side_of_a_rollout_does_not_vote() -> None:
    policy = RolloutPolicy(stages=[50, 100])
    started = NOW - timedelta(days=1)
    rollout = Rollout(id="a" * 16, salt="b" * 32, policy=policy, stage=0, started_at=started,
                      stage_started_at=started)  # fmt: skip
    staged = manifest()
    staged.models["m"] = staged.models["m"].model_copy(update={"rollout": rollout})
    devices = [f"d{i}" for i in range(40)]
    member = next(d for d in devices if is_member(rollout, d))
    outside = next(d for d in devices if not is_member(rollout, d))
    tally = LatencyTally()
    for device in (member, outside):
        seen = RolloutSeen(id=rollout.id, member=True, stage=0, state="active")
        found = report(device, "cpu", 1.0)
        claim = found.models[0].model_copy(update={"rollout": seen})
        tally.add(found.model_copy(update={"models": [claim]}), staged, {}, NOW, AGE,
                  authenticated=False)  # fmt: skip
    assert list(next(iter(tally.latencies.values()))) == [member]
    assert tally.refused == {"membership": 1}


def test_a_hardware_list_longer_than_a_ranking_carries_votes_for_nothing() -> None:
    many = [CPU.model_copy(update={"device_id": i}) for i in range(400)]
    tally = tallied(report("d1", "cpu", 1.0, many), report("d2", "npu", 1.0, many))
    assert tally.latencies == {} and tally.refused == {"too long": 2}
    assert rank(tally, manifest(), 1) == {}
