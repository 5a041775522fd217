"""The rollout gate's ``min_hours`` through a real (local) store, on a fake clock
(tests/support/fake_clock.py): a stage whose evidence is good waits until it has lasted
``min_hours`` on the gate's clock, then advances, and the next stage starts at that
clock's time. The same rule on the real clock: tests/trust/test_report_attacks.py, whose
stage started two real hours ago (``min_hours`` 1) and advances."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from epfleet.fleet.publishing.publish import read_in_force, update_manifest
from epfleet.fleet.rollout.rollouts import read_evidence, run_gate
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
    encode_report,
    report_key,
)
from epfleet.formats.manifest import Manifest, utcnow
from epfleet.formats.rollout import Rollout, RolloutPolicy, is_member
from epfleet.stores import Store, open_store
from tests.support.fake_clock import FakeClock
from tests.support.publish_helpers import publish_new

pytestmark = pytest.mark.fast

MODEL = "model-0"
POLICY = RolloutPolicy(stages=[10, 100], canary=["dev-000"], min_reports=2, min_hours=1)


def staged(store: Store, clock: FakeClock) -> Rollout:
    publish_new(store, 0)
    rollout = Rollout(
        id="0" * 16,
        salt="5a17" * 8,
        policy=POLICY,
        stage=0,
        started_at=clock.now(),
        stage_started_at=clock.now(),
    )

    def stage(current: Manifest | None) -> Manifest | None:
        assert current is not None
        entry = current.models[MODEL]
        moved = entry.model_copy(
            update={"rollout": rollout, "previous": {"cpu": entry.variants["cpu"]}}
        )
        return current.succeeded_by(current.models | {MODEL: moved}, utcnow())

    update_manifest(store, stage)
    return rollout


def kept(device: str, rollout: Rollout, clock: FakeClock) -> DeviceReport:
    """A device that runs the stage's new variants without a failure, reporting now."""
    return DeviceReport(
        device_id=device,
        generated_at=clock.now().isoformat(),
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store="s",
        cache="c",
        manifest=ManifestStatus(status="unchanged", generation=2, body_bytes=0),
        models=[
            ModelReport(
                model=MODEL,
                action="kept",
                variant="cpu-x",
                target="cpu",
                ep="CPUExecutionProvider",
                verdict=None,
                bytes_downloaded=0,
                reason="",
                considered=[],
                seconds=0.1,
                profile=Profile(session_ms=1, first_run_ms=2, p50_ms=10, p95_ms=10, runs=5),
                rollout=RolloutSeen(id=rollout.id, member=True, stage=0, state="active"),
            )
        ],
        seconds=1.0,
    )


def test_a_stage_advances_once_it_has_lasted_min_hours_on_the_gates_clock(
    tmp_path: Path,
) -> None:
    store, clock = open_store(str(tmp_path / "store")), FakeClock()
    rollout = staged(store, clock)
    member = next(d for d in (f"dev-{i:03d}" for i in range(1, 300)) if is_member(rollout, d))
    clock.advance(10 * 60)
    for device in ("dev-000", member):
        store.write(report_key(device), encode_report(kept(device, rollout, clock)))

    reading, moved = run_gate(store, clock=clock)
    [status] = reading.statuses
    assert moved == [] and status.verdict.decision == "wait"
    assert status.verdict.reason == "stage 1 has lasted 0.2 of its 1 hours"

    clock.advance(50 * 60)
    [status] = read_evidence(store, clock=clock).statuses
    assert status.verdict.decision == "advance", status.verdict.reason
    _, [advanced] = run_gate(store, clock=clock)
    assert (advanced.move, advanced.stage, advanced.published) == ("advance", 1, True)
    manifest = read_in_force(store).manifest
    assert manifest is not None
    after = manifest.models[MODEL].rollout
    assert after is not None and after.percent == 100
    assert after.stage_started_at == clock.now() == rollout.stage_started_at + timedelta(hours=1)
