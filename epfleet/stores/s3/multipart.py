"""Incomplete multipart uploads of an S3 store: list them with their bytes, abort old ones.

A killed upload leaves its parts stored, and billed, until someone aborts it. The gc
lists them (``incomplete_uploads``); each compile run aborts those older than
``EPFLEET_MULTIPART_GRACE`` (``clean_up_incomplete``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import botocore.exceptions as bce

from epfleet.stores.base import StoredObject
from epfleet.stores.s3.errors import code_of

UNUSABLE_STORE_CODES = frozenset({"NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch"})
"""Answers that make the whole store unusable, not just this listing: raised as store
errors (with no bucket or no endpoint, nothing else would work either)."""

if TYPE_CHECKING:
    from epfleet.stores.s3.store import S3Store

logger = logging.getLogger("epfleet.stores.s3")  # the S3 store's logger, as before the split


def incomplete_uploads(store: S3Store) -> list[StoredObject]:
    """Each with the bytes of its parts so far (one ListParts per upload)."""
    root = store.root
    found: list[StoredObject] = []
    try:
        pages = store.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=store.bucket, Prefix=root
        )
        uploads = [upload for page in pages for upload in page.get("Uploads", [])]
    except (bce.BotoCoreError, bce.ClientError) as exc:
        store.raise_error(exc, "", "listing the incomplete multipart uploads of")
    for upload in uploads:
        key = upload["Key"][len(root) :]
        try:
            parts = store.client.get_paginator("list_parts").paginate(
                Bucket=store.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            size = sum(int(p["Size"]) for page in parts for p in page.get("Parts", []))
        except (bce.BotoCoreError, bce.ClientError) as exc:
            if isinstance(exc, bce.ClientError) and code_of(exc) == "NoSuchUpload":
                continue  # completed or aborted since it was listed
            store.raise_error(exc, key, "listing the parts of the multipart upload of")
        found.append(StoredObject(key, size, upload["Initiated"]))
    return sorted(found, key=lambda o: (o.key, o.modified))


def clean_up_incomplete(store: S3Store, older_than: float | None = None) -> list[str]:
    """Abort the incomplete multipart uploads under the store's prefix started more than
    ``older_than`` seconds ago (default ``EPFLEET_MULTIPART_GRACE``, a day): a killed
    upload leaves its parts stored, and billed, until someone does. Younger ones may
    be a concurrent run's, still going. The bucket's ``AbortIncompleteMultipartUpload``
    lifecycle rule is the operator's backstop (README)."""
    if older_than is None:
        from epfleet.settings import settings

        older_than = settings().multipart_grace
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than)
    root = store.root
    aborted: list[str] = []
    try:
        pages = store.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=store.bucket, Prefix=root
        )
        stale = [
            upload
            for page in pages
            for upload in page.get("Uploads", [])
            if upload["Initiated"] <= cutoff
        ]
    except (bce.BotoCoreError, bce.ClientError) as exc:
        if isinstance(exc, bce.ClientError) and code_of(exc) not in UNUSABLE_STORE_CODES:
            # Listing uploads may be all a publisher is not allowed: say so, go on.
            logger.warning(
                "%s: cannot list incomplete multipart uploads (S3 answered %s); they are "
                "left to the bucket's lifecycle rule",
                store.uri,
                code_of(exc),
            )
            return aborted
        store.raise_error(exc, "", "listing incomplete uploads of")  # no bucket, no endpoint
    for upload in stale:
        try:
            store.client.abort_multipart_upload(
                Bucket=store.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        except (bce.BotoCoreError, bce.ClientError) as exc:
            if not isinstance(exc, bce.ClientError) or code_of(exc) != "NoSuchUpload":
                logger.warning(
                    "%s: cannot abort the multipart upload of %s: %s",
                    store.uri,
                    upload["Key"],
                    exc,
                )
            continue
        aborted.append(upload["Key"][len(root) :])
    if aborted:
        logger.info(
            "%s: aborted %d incomplete multipart upload(s) older than %g s: %s",
            store.uri,
            len(aborted),
            older_than,
            ", ".join(aborted),
        )
    return aborted
