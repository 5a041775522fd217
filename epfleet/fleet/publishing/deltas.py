"""Binary deltas made at publish time and uploaded under ``deltas/`` (``delta_rules`` says
which). Each is an optimisation: one that cannot be made (a base gone from the store, a
delta not under the bound) is logged and left out, never a failed publish."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from epfleet.deltas import make_delta
from epfleet.errors import EpfleetError, StoreError
from epfleet.fleet.build.staging import fetch_verified
from epfleet.fleet.publishing.delta_rules import DeltaJob, delta_jobs
from epfleet.formats.keys import delta_key
from epfleet.formats.manifest import DeltaRef, Manifest, VariantEntry
from epfleet.hashing import sha256_bytes
from epfleet.stores import Store

logger = logging.getLogger(__name__)


def make_deltas(store: Store, jobs: Iterable[DeltaJob]) -> dict[str, list[DeltaRef]]:
    """Make and upload the deltas of ``jobs``; those made, by the sha256 of the file each
    makes. Both files come from the store, each checked by sha256 and size."""
    made: dict[str, list[DeltaRef]] = {}
    for job in jobs:
        key = delta_key(job.model, job.target, job.artifact.sha256, job.base.sha256)
        try:
            base = fetch_verified(store, job.base.uri, job.base.sha256, job.base.size)
            new = fetch_verified(store, job.artifact.uri, job.artifact.sha256, job.artifact.size)
            delta = make_delta(base.read_bytes(), new.read_bytes())
            if delta is None:
                logger.info("%s: no delta from %s (not under half the file)", key, job.base.uri)
                continue
            store.write(key, delta)
        except (StoreError, OSError) as exc:
            logger.warning("%s: no delta from %s: %s", key, job.base.uri, exc)
            continue
        ref = DeltaRef(
            uri=key, sha256=sha256_bytes(delta), size=len(delta), base_sha256=job.base.sha256
        )
        made.setdefault(job.artifact.sha256, []).append(ref)
        logger.info(
            "%s: %d-byte delta from %s (the file is %d bytes)",
            job.artifact.uri,
            len(delta),
            job.base.uri,
            job.artifact.size,
        )
    return made


def deltas_for_run(
    store: Store,
    in_force: Callable[[], Manifest | None],
    variants: dict[tuple[str, str], VariantEntry],
) -> dict[str, list[DeltaRef]]:
    """The deltas a run publishing ``variants`` makes over the manifest ``in_force`` returns
    (``delta_rules.delta_jobs``); none, with a warning, when that cannot be read."""
    if not any(v.status == "ok" for v in variants.values()):
        return {}
    try:
        current = in_force()
    except EpfleetError as exc:
        logger.warning("%s: no deltas made (%s)", store.uri, exc)
        return {}
    return make_deltas(store, delta_jobs(current, variants))
