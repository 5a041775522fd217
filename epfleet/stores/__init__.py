"""Stores: where sources, variants and the manifest live.

``open_store`` maps a URI's scheme to a backend module (its ``from_uri``) through the explicit
table below, importing only the one asked for: a device install without the ``s3`` extra
opens local and ``https://`` stores, and an ``s3://`` URI there names the extra to install
(``epfleet.extras``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from urllib.parse import urlparse

from epfleet.errors import BadInputError, DocumentTooLarge
from epfleet.extras import missing_extra
from epfleet.stores.base import (
    DEFAULT_STORE,
    MANIFEST_KEY,
    UNCHANGED,
    Store,
    Versioned,
    bulk_reader,
    check_key,
)
from epfleet.stores.documents import document_limit

__all__ = [
    "DEFAULT_STORE",
    "MANIFEST_KEY",
    "UNCHANGED",
    "DocumentTooLarge",
    "Store",
    "Versioned",
    "bulk_reader",
    "check_key",
    "document_limit",
    "open_store",
    "reports_store",
    "split_uri",
]

BACKENDS: dict[str, str] = {
    "file": "epfleet.stores.local",
    "s3": "epfleet.stores.s3",  # boto3: the s3 extra
    "https": "epfleet.stores.https",
    "http": "epfleet.stores.https",  # a mirror on loopback (tests, a local cache)
    "memory": "epfleet.stores.memory",  # this process only (unit tests)
}


def open_store(uri: str) -> Store:
    """A store for ``file:///abs/dir``, a plain path, ``s3://bucket/prefix``, or a read-only
    mirror ``https://host/path``."""
    scheme = urlparse(uri).scheme if "://" in uri else "file"
    if scheme not in BACKENDS:
        raise BadInputError(
            f"store URI {uri!r} has unknown scheme {scheme!r}; known: "
            f"{', '.join(f'{s}://' for s in BACKENDS)} or a plain path"
        )
    try:
        module = importlib.import_module(BACKENDS[scheme])
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc, f"store {uri} ({scheme}://)")
        if missing is None:
            raise
        raise missing from None
    store: Store = module.from_uri(uri)
    return store


def reports_store(store: Store, report_to: str | None) -> Store:
    """Where a fleet's device reports are (``EPFLEET_REPORT_TO``: the store devices behind a
    read-only mirror upload them to, and the fleet side reads them from), else ``store``."""
    if not report_to:
        return store
    try:
        return open_store(report_to)
    except BadInputError as exc:
        raise BadInputError(f"EPFLEET_REPORT_TO: {exc}") from exc


def split_uri(uri: str) -> tuple[str, str]:
    """Split a file's URI into (parent store URI, key): s3://b/p/x.onnx -> (s3://b/p, x.onnx)."""
    if "://" not in uri:
        path = Path(uri).resolve()
        return str(path.parent), path.name
    parent, _, name = uri.rstrip("/").rpartition("/")
    if not name or parent.endswith(":/"):
        raise BadInputError(f"{uri!r} does not name a file")
    return parent, name
