"""The publishing side of signed distribution in one place: its modules' entry points.

Layout, roles and expiries are described in ``epfleet.trust``. The parts:
``epfleet.trust.layout`` (where the metadata lives), ``epfleet.trust.targets`` (pure:
what the metadata says for a manifest), ``epfleet.trust.state`` (reading it),
``epfleet.trust.signing`` (``publish_trust`` and ``refresh``, by compare-and-swap),
``epfleet.trust.rotation`` (key rotation) and ``epfleet.trust.creation`` (``trust init``
and development keys).
"""

from __future__ import annotations

from epfleet.trust.creation import development_root, init_repository, init_with_key_files
from epfleet.trust.layout import (
    DEFAULT_BINS,
    ROOT_COPY,
    TIMESTAMP_KEY,
    development_keys_dir,
    utcnow,
)
from epfleet.trust.rotation import check_offline_keys, rotate_online_key, rotate_root_keys
from epfleet.trust.signing import TrustPublished, publish_trust, refresh
from epfleet.trust.state import (
    RepositoryState,
    RoleStatus,
    has_trust,
    latest_root,
    read_state,
    status,
)

__all__ = [
    "DEFAULT_BINS",
    "ROOT_COPY",
    "TIMESTAMP_KEY",
    "RepositoryState",
    "RoleStatus",
    "TrustPublished",
    "check_offline_keys",
    "development_keys_dir",
    "development_root",
    "has_trust",
    "init_repository",
    "init_with_key_files",
    "latest_root",
    "publish_trust",
    "read_state",
    "refresh",
    "rotate_online_key",
    "rotate_root_keys",
    "status",
    "utcnow",
]
