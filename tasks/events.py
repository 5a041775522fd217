"""Prefect events epfleet emits, for automations built in the UI.

- ``epfleet.variant.published``: a freshly compiled variant is in the published manifest.
- ``epfleet.variant.failed``: a pair failed to compile (or to be published).
- ``epfleet.device.unserved``: devices of one hardware profile run a model on no
  variant the fleet published for them (runtime-watch, from the device reports).
- ``epfleet.formats.manifest.tampered``: a publish or refresh found ``manifest.json`` changed, in
  the entries named, by someone without the signing keys (and put it right).

Resources are ``epfleet.variant.<model>.<target>`` and
``epfleet.device-profile.<profile>``, with the names as labels to match on.
"""

from __future__ import annotations

from prefect.events import emit_event

from epfleet.fleet.runs.models import PairResult
from epfleet.fleet.watch.rules import UnservedProfile


def variant_resource(result: PairResult, store: str) -> dict[str, str]:
    return {
        "prefect.resource.id": f"epfleet.variant.{result.model}.{result.target}",
        "prefect.resource.name": f"{result.model} × {result.target}",
        "epfleet.model": result.model,
        "epfleet.target": result.target,
        "epfleet.ep": result.ep,
        "epfleet.store": store,
    }


def emit_variant_events(results: list[PairResult], store: str, generation: int) -> int:
    """One event per ok or failed result (others emit nothing); returns how many."""
    emitted = 0
    for result in results:
        if result.status == "ok":
            emit_event(
                event="epfleet.variant.published",
                resource=variant_resource(result, store),
                payload={
                    "generation": generation,
                    "artifact_uri": result.artifact_uri,
                    "size": result.size,
                    "compatibility_string": result.compatibility_string,
                    "seconds": result.seconds,
                },
            )
        elif result.status == "failed":
            emit_event(
                event="epfleet.variant.failed",
                resource=variant_resource(result, store),
                payload={"error": result.error},
            )
        else:
            continue
        emitted += 1
    return emitted


MAX_UNSERVED_EVENTS = 100
"""Unserved profiles one watch pass emits an event for, the most devices first: device
reports choose the hardware and releases a profile is made of, so forged reports could
otherwise make a pass emit one event per forged profile."""


def emit_unserved_events(profiles: list[UnservedProfile], store: str) -> int:
    """One event per unserved profile, for the ``MAX_UNSERVED_EVENTS`` profiles with the
    most devices; returns how many profiles were left without one."""
    ranked = sorted(profiles, key=lambda p: (-p.device_count, p.profile_id))
    for profile in ranked[:MAX_UNSERVED_EVENTS]:
        emit_event(
            event="epfleet.device.unserved",
            resource={
                "prefect.resource.id": f"epfleet.device-profile.{profile.profile_id}",
                "prefect.resource.name": profile.label,
                "epfleet.eps": ",".join(profile.eps),
                "epfleet.store": store,
            },
            payload=profile.model_dump(mode="json"),
        )
    return max(0, len(ranked) - MAX_UNSERVED_EVENTS)


def emit_tampered_event(models: list[str], store: str) -> None:
    """Say that ``manifest.json`` of ``store`` differed from the signed manifest in the
    entries of ``models`` (nothing is emitted for none)."""
    if not models:
        return
    emit_event(
        event="epfleet.formats.manifest.tampered",
        resource={
            "prefect.resource.id": f"epfleet.store.{store}",
            "prefect.resource.name": store,
            "epfleet.store": store,
        },
        payload={"models": models},
    )
