"""The ``Cache-Control`` of each object a store holds, for a CDN or mirror in front of it.

Every object but two is written once under a name it never changes: content-addressed
files (``sources/``, ``samples/``, ``files/``, variants and their listings, the signed
targets) and versioned signed metadata (``trust/metadata/<version>.<role>.json``). Those
may be cached for good. ``trust/metadata/timestamp.json`` and ``manifest.json`` are
replaced in place by every publish, so a cache must ask the origin each time (ETags make
that a 304 when nothing changed); what devices write (``reports/``) and the hand-over
files of work pools (``runs/``) are nobody's to cache.
"""

from __future__ import annotations

import re

IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
PRIVATE = "private, no-store"

_WRITTEN_ONCE = re.compile(
    r"^(sources/|samples/|files/|variants/|trust/targets/|trust/metadata/\d+\.[^/]+\.json$)"
)


def cache_control(key: str) -> str:
    """The ``Cache-Control`` header the object at ``key`` is stored with."""
    if key.startswith(("reports/", "runs/")):
        return PRIVATE
    if _WRITTEN_ONCE.match(key):
        return IMMUTABLE
    return REVALIDATE
