"""An S3 object's age for the collector: refresh it (touch), delete only what is older.

A publish that reuses an object already stored (a rebuild with the same bytes, a
sidecar shared by builds) touches it, so that ``epfleet gc``, which deletes with
``delete_if_older`` against its grace cutoff, leaves it alone. On S3 the check and the
removal are a HEAD and a DELETE: a touch landing between the two is not seen.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import botocore.exceptions as bce

from epfleet.stores.caching import cache_control
from epfleet.stores.s3.errors import is_missing

if TYPE_CHECKING:
    from epfleet.stores.s3.store import S3Store


def touch(store: S3Store, key: str, min_age: float) -> bool:
    """A server-side copy of the object onto itself with its metadata (no bytes move
    through this machine; multipart above the store's threshold): a new LastModified.
    Skipped when the object is younger than ``min_age`` seconds; False when missing."""
    try:
        head = store.client.head_object(Bucket=store.bucket, Key=store.object_key(key))
        if (datetime.now(timezone.utc) - head["LastModified"]).total_seconds() < min_age:
            return True
        store.uploader.copy(
            {"Bucket": store.bucket, "Key": store.object_key(key)},
            store.bucket,
            store.object_key(key),
            ExtraArgs={
                "MetadataDirective": "REPLACE",
                "Metadata": head.get("Metadata", {}),
                "CacheControl": cache_control(key),
            },
            Config=store.transfer_config,
        )
        return True
    except bce.ClientError as exc:
        if is_missing(exc):
            return False
        store.raise_error(exc, key, "touching")
    except bce.BotoCoreError as exc:
        store.raise_error(exc, key, "touching")


def delete_if_older(store: S3Store, key: str, cutoff: datetime) -> bool:
    """Delete the object if it was last modified before ``cutoff``; True when it is gone."""
    try:
        head = store.client.head_object(Bucket=store.bucket, Key=store.object_key(key))
    except bce.ClientError as exc:
        if is_missing(exc):
            return True
        store.raise_error(exc, key, "checking")
    except bce.BotoCoreError as exc:
        store.raise_error(exc, key, "checking")
    if head["LastModified"] >= cutoff:
        return False
    store.delete(key)
    return True
