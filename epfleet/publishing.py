"""Publishing to the store's manifest: read it, and merge a run into it with compare-and-swap.

Retry layer of this module (see ``epfleet.retries`` for the others): ``publish`` re-reads,
re-merges and re-writes when its conditional write loses a race to another publisher
(``PreconditionFailed``), up to ``PUBLISH_ATTEMPTS`` times with jittered backoff. That is
the only fault it retries; a store that cannot be reached raises through (the store's
client and the Prefect task above it handle those).
"""

from __future__ import annotations

import random
import time

from pydantic import BaseModel, Field, ValidationError

from epfleet.errors import PreconditionFailed, StoreError
from epfleet.manifest import Manifest, SamplesRef, SourceEntry, VariantEntry, merge
from epfleet.stores import MANIFEST_KEY, Store

PUBLISH_ATTEMPTS = 20


def read_manifest(store: Store) -> tuple[Manifest | None, str | None]:
    """The store's manifest and its etag; (None, None) when it has none. StoreError when
    the manifest there fails validation."""
    found = store.read(MANIFEST_KEY)
    if found is None:
        return None, None
    try:
        return Manifest.from_json(found.data), found.etag
    except ValidationError as exc:
        raise StoreError(
            f"{store.uri}/{MANIFEST_KEY} fails validation, refusing to publish over it: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


class Published(BaseModel):
    manifest: Manifest | None = Field(description="The manifest now in the store")
    published: bool = Field(description="Whether this call changed it")
    conflicts: list[str] = Field(
        default_factory=list, description="Models left alone: their source changed meanwhile"
    )


def publish(
    store: Store,
    sources: dict[str, SourceEntry],
    planned_on: dict[str, SourceEntry | None],
    variants: dict[tuple[str, str], VariantEntry],
    samples: dict[str, SamplesRef | None] | None = None,
) -> Published:
    """Read-modify-write the manifest with compare-and-swap, retrying lost races
    (see ``merge`` for what a run may change)."""
    for attempt in range(PUBLISH_ATTEMPTS):
        current, etag = read_manifest(store)
        merged = merge(
            current,
            sources,
            planned_on,
            variants,
            samples,
            present=lambda ref: store.size(ref.uri) == ref.size,
        )
        if merged.manifest is None:
            return Published(manifest=current, published=False, conflicts=merged.conflicts)
        data = merged.manifest.to_json()
        try:
            if etag is None:
                store.write(MANIFEST_KEY, data, if_none_match=True)
            else:
                store.write(MANIFEST_KEY, data, if_match=etag)
            return Published(manifest=merged.manifest, published=True, conflicts=merged.conflicts)
        except PreconditionFailed:
            time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
    raise StoreError(
        f"could not publish {store.uri}/{MANIFEST_KEY}: lost the race {PUBLISH_ATTEMPTS} times"
    )
