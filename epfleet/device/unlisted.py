"""Dropping the models the manifest in force no longer lists, when a device is told to.

Off by default (``SyncPolicy.drop_unlisted``, ``--drop-unlisted``,
``EPFLEET_DROP_UNLISTED``): a model retired from the fleet's manifest otherwise stays
active on the device, as it was. When on, a model that the cache's state holds and the
manifest does not list loses its component in the package manifest, its state, and its
directory under ``models/`` (in that order: the package never lists a variant whose
directory is gone), and the device report says so. Never when the manifest in force
could not be fetched or validated (offline, rejected: the list may be stale), nor for a
sync of some models only (``--model``: the others are not this sync's to judge).
"""

from __future__ import annotations

import logging

from epfleet.device.cache import CacheState, DeviceCache
from epfleet.formats.device_report import ManifestStatus

logger = logging.getLogger(__name__)


def unlisted(
    state: CacheState, listed: set[str], status: ManifestStatus | None, subset: bool
) -> list[str]:
    """The models to drop: in the state, not in ``listed`` (the manifest in force's models),
    and only when the manifest was fetched or confirmed unchanged for every model."""
    if subset or status is None or status.status not in ("fetched", "unchanged"):
        return []
    return sorted(model for model in state.models if model not in listed)


def drop_models(cache: DeviceCache, state: CacheState, models: list[str]) -> None:
    """Remove ``models`` from the state and the package, then their directories; a note
    for the report names each with the variants it ran."""
    if not models:
        return
    ran = {}
    for model in models:
        mstate = state.models.pop(model)
        names = [v.name for v in (mstate.active, mstate.previous) if v is not None]
        ran[model] = ", ".join(names) or "no variant"
    cache.save_state(state)
    cache.write_package(state)
    for model in models:
        cache.drop_model(model)
        cache.note(
            f"dropped model {model} ({ran[model]}): the manifest no longer lists it "
            "(drop_unlisted); its variants were removed from the cache"
        )
