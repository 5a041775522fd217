"""Whether a store is there at all: a local directory that exists, a bucket that exists at
an endpoint that answers. Asked when something else went wrong (a device sync refused
for want of a trusted root), so that the message names the real cause first: a
mistyped path or bucket is not fixed by turning signature checks off."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from epfleet.errors import BadInputError, EpfleetError, StoreError
from epfleet.stores.base import Store

if TYPE_CHECKING:
    from epfleet.stores.s3 import S3Store


@contextmanager
def store_named_first(store_uri: str) -> Iterator[None]:
    """Run the block; when it refuses the user's input (no trusted root, say) and the store
    is not there at all, say that instead: it is the cause to fix first."""
    try:
        yield
    except BadInputError:
        from epfleet.stores import open_store

        absent = store_absence(open_store(store_uri))
        if absent is None:
            raise
        raise absent from None


def store_absence(store: Store) -> EpfleetError | None:
    """Why ``store`` cannot be used at all, naming the fix: a BadInputError for a directory
    or bucket that does not exist, a StoreError for an endpoint that does not answer; None
    when it is there (or this cannot tell: a bucket that refuses the question may still
    serve its objects)."""
    from epfleet.stores.local import LocalStore

    if isinstance(store, LocalStore) and not store.root.is_dir():
        return BadInputError(
            f"store {store.uri} does not exist (no directory {store.root}): check --store; "
            "a fleet publishes there with epfleet compile"
        )
    # An open S3 store has loaded its module; boto3 is an extra: never imported for this.
    s3 = sys.modules.get("epfleet.stores.s3")
    if s3 is not None and isinstance(store, s3.S3Store):
        return _bucket_absence(store)
    return None


def _bucket_absence(store: S3Store) -> EpfleetError | None:
    import botocore.exceptions as bce

    from epfleet.stores.s3 import missing_bucket, status_of

    try:
        store.client.head_bucket(Bucket=store.bucket)
    except bce.ClientError as exc:
        if status_of(exc) == 404:
            return missing_bucket(store.uri, store.bucket, store.client.meta.endpoint_url)
    except (bce.ConnectionError, bce.HTTPClientError) as exc:
        return StoreError(
            f"store {store.uri}: cannot reach the S3 endpoint ({exc}); check the network "
            "and AWS_ENDPOINT_URL"
        )
    except bce.BotoCoreError:
        pass
    return None
