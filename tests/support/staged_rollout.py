"""A model staged in a rollout, in memory, on a local store or S3, and device reports about
it as devices upload them: the forged-report tests' fleet and the evidence index's."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.fleet.publishing.publish import update_manifest
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
from epfleet.stores.memory import forget
from tests.support.publish_helpers import publish_new

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


def staged_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """The store of ``request.param`` ("memory", "local" or "s3": the ``s3_store_uri``
    fixture's) with model-0 published and staged in ``ROLLOUT``."""
    if request.param == "memory":
        uri = f"memory://{tmp_path.name}"
        request.addfinalizer(lambda: forget(tmp_path.name))
    elif request.param == "local":
        uri = str(tmp_path / "store")
    else:
        uri = request.getfixturevalue("s3_store_uri")
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
    stage: int = 0,
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
                rollout=RolloutSeen(id=rollout_id, member=member, stage=stage, state="active"),
            )
        ],
        seconds=1.0,
    )


def put(store: Store, found: DeviceReport, key: str | None = None) -> None:
    store.write(key or report_key(found.device_id), encode_report(found))


def settled(store: Store) -> None:
    """S3 lists whole seconds: a pass one second after the last write finds it settled."""
    if store.uri.startswith("s3://"):
        time.sleep(1.05)


def real_fleet(store: Store, baseline: str) -> None:
    """The canary and (unless the gate is to wait for it) a member on the new variants,
    failing when the gate is to halt, and outside devices on the previous ones."""
    put(store, report("dev-000", True, "downloaded"))
    if baseline != "wait":
        put(store, report(MEMBERS[0], True, "failed" if baseline == "halt" else "kept", 11.0))
    for device in OUTSIDE[:5]:
        put(store, report(device, False, "kept", 10.0))
