"""A device's report of one model on a rollout, as a device on the CPU variant uploads it:
the one builder of the rollout, evidence and report-signing tests."""

from __future__ import annotations

from datetime import datetime

from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
    VariantVerdict,
)


def rollout_report(
    device: str,
    member: bool = True,
    action: str = "kept",
    p50: float | None = 10.0,
    *,
    made: datetime,
    rollout_id: str = "0" * 16,
    model: str = "m",
    stage: int = 0,
    reason: str = "",
    considered: list[VariantVerdict] | None = None,
) -> DeviceReport:
    """``device``'s report, made at ``made``, that it runs ``model``'s CPU variant (``action``)
    on stage ``stage`` of rollout ``rollout_id``, inside it or not (``member``): with a
    profile of ``p50`` ms (p50 and p95) unless ``p50`` is None or the action "failed"."""
    profile = None
    if p50 is not None and action != "failed":
        profile = Profile(session_ms=1, first_run_ms=2, p50_ms=p50, p95_ms=p50, runs=5)
    return DeviceReport(
        device_id=device,
        generated_at=made.isoformat(),
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
                reason=reason,
                considered=considered or [],
                seconds=0.1,
                profile=profile,
                rollout=RolloutSeen(id=rollout_id, member=member, stage=stage, state="active"),
            )
        ],
        seconds=1.0,
    )
