"""A published variant made from a binary delta to a file the device already holds.

A variant's manifest entry may list deltas (``VariantEntry.deltas``, schema 1.8), each
from a file a device may hold (``base_sha256``). When the model's active variant, or the
one kept for rollback, is that file, the sync downloads the delta instead of the whole
file: through the same resumable, verified download (``epfleet.device.fetching``, the
delta's own signed sha256 and size, the same rate limits and deadline), then applies it
(``epfleet.deltas.apply_delta``: streamed, never past the signed size) after asking the
cache for room for the whole file, and checks what it made against the variant's signed
sha256 and size before writing it, atomically, where the full download would have gone.
From there the variant goes through the same checks as a full download (its
compatibility string, its health check) before anything is activated.

Anything that goes wrong (a delta missing from the store, corrupted, truncated or forged,
a base that is not the file it should be, no room, the deadline) is logged and the file
is downloaded whole instead; the active variant is untouched throughout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from epfleet.deltas import apply_delta
from epfleet.device.cache import MODEL_FILE, Installed, ModelState
from epfleet.device.fetching import Fetcher
from epfleet.device.variant_sets import Fetched
from epfleet.errors import EpfleetError
from epfleet.formats.manifest import MAX_DELTA_SIZE, DeltaRef, VariantEntry
from epfleet.fsutil import atomic_write_bytes, read_nofollow
from epfleet.limits import current_deadline

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FromDelta:
    """A variant's file made from a delta: the fetched file, the delta and its base."""

    fetched: Fetched
    delta: DeltaRef
    base: Installed


def delta_base(variant: VariantEntry, state: ModelState) -> tuple[Installed, DeltaRef] | None:
    """The variant the cache holds (the active one first, then the rollback one) that one
    of ``variant``'s deltas applies to, with that delta; None when none does."""
    if variant.files or variant.model_file != MODEL_FILE or not variant.deltas:
        return None
    if variant.artifact is None or variant.artifact.size > MAX_DELTA_SIZE:
        return None
    for held in (state.active, state.previous):
        if held is None or held.origin != "published" or held.files:
            continue
        if held.model_file != MODEL_FILE:
            continue
        delta = variant.delta_from(held.sha256)
        if delta is not None:
            return held, delta
    return None


def fetch_by_delta(
    fetcher: Fetcher, model: str, variant: VariantEntry, state: ModelState
) -> FromDelta | str | None:
    """``variant``'s file made from a delta to a file the cache holds; None when no delta
    applies here (or a download of the whole file is already under way, which resumes),
    and why not when one applied but failed (the caller downloads the whole file)."""
    found = delta_base(variant, state)
    artifact = variant.artifact
    if found is None or artifact is None:
        return None
    base, delta = found
    cache = fetcher.cache
    part = cache.partial(artifact.sha256)
    if cache.held(part) > 0:
        return None
    delta_part, moved = cache.partial(delta.sha256), 0
    try:
        if not cache.intact(model, base):
            raise EpfleetError(f"{base.name} changed in the cache")
        delta_part, moved = fetcher.to_partial(delta.uri, delta.sha256, delta.size)
        with cache.room_lock:
            cache.make_room(artifact.size, part.parent, artifact.uri)
            cache.in_use.add(part)
        held = read_nofollow(cache.model_file(model, base))
        data = apply_delta(held, read_nofollow(delta_part), artifact.sha256, artifact.size)
        deadline = current_deadline()
        if deadline is not None and deadline.passed():
            raise deadline.exceeded(f"applying {delta.uri}")
        atomic_write_bytes(part, data)
    except (EpfleetError, OSError) as exc:
        cache.drop_partial(part)
        why = f"delta {delta.uri} from {base.name} not used ({exc}); downloading the whole file"
        logger.warning("%s: %s", model, why)
        return why
    finally:
        cache.drop_partial(delta_part)  # small: a later sync fetches it again
    logger.info(
        "%s: made %s from a %d-byte delta to %s (the file is %d bytes)",
        model,
        artifact.uri,
        delta.size,
        base.name,
        artifact.size,
    )
    fetched = Fetched(cache=cache, main=part, parts=[part], moved=moved)
    return FromDelta(fetched=fetched, delta=delta, base=base)
