"""The size limit of the documents a store reads whole, and the error past it."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

from epfleet.errors import DocumentTooLarge
from epfleet.limits import format_size
from epfleet.stores.base import MANIFEST_KEY


def document_limit(key: str) -> tuple[int, str]:
    """The largest object ``read`` returns whole for ``key``, and the variable that sets
    it: ``EPFLEET_MAX_MANIFEST_BYTES`` for a manifest, ``EPFLEET_MAX_DOCUMENT_BYTES`` for
    anything else (device reports, hand-over files)."""
    manifest, document = _limits(
        os.environ.get("EPFLEET_MAX_MANIFEST_BYTES"), os.environ.get("EPFLEET_MAX_DOCUMENT_BYTES")
    )
    if key.rsplit("/", 1)[-1] == MANIFEST_KEY:
        return manifest, "EPFLEET_MAX_MANIFEST_BYTES"
    return document, "EPFLEET_MAX_DOCUMENT_BYTES"


@functools.lru_cache(maxsize=8)
def _limits(manifest: str | None, document: str | None) -> tuple[int, int]:
    """The two limits for these values of their variables: building the settings takes
    milliseconds, and a publish of signed metadata reads hundreds of documents."""
    from epfleet.settings import settings  # not at import: settings imports this package

    s = settings()
    return int(s.max_manifest_bytes), int(s.max_document_bytes)


def too_large(where: str, key: str, size: int | None, etag: str | None) -> DocumentTooLarge:
    """The error for ``key`` (at ``where``) over its limit: ``size`` when known (a
    Content-Length, a file's size), else it was found streaming past the limit."""
    limit, variable = document_limit(key)
    kind = "a manifest" if key.rsplit("/", 1)[-1] == MANIFEST_KEY else "a store document"
    held = f"is {format_size(size)}, over" if size is not None else "goes on past"
    return DocumentTooLarge(
        f"{where} {held} the limit of {format_size(limit)} for {kind} ({variable}); not read",
        key=key,
        limit=limit,
        etag=etag,
    )


class OverLimit(Exception):
    """``read_bounded`` found more than its limit (the caller says which document)."""


def read_bounded(chunks: Iterator[bytes], limit: int) -> bytes:
    """The bytes of ``chunks`` when they total at most ``limit``; else ``OverLimit`` as
    soon as they pass it, having held no more than ``limit`` bytes."""
    held: list[bytes] = []
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise OverLimit
        held.append(chunk)
    return b"".join(held)
