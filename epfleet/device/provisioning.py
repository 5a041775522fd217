"""Which root a device sync trusts: the cache's, a given one, a development root, or none.

A sync trusts the newest root its cache verified for the store (``epfleet.trust.roots``:
an older intact one when that is damaged), or the ``--trust-root`` it is given. A cache
that never trusted anything, for a local store that ``epfleet compile`` made development
keys for, trusts the root written beside them (``<store>.dev-keys/root.json``), with a
warning: for the README's first commands on one machine. A cache that trusted a root once
never falls back to that development root, nor to the unsigned manifest.json: anyone
who can write beside or into the store could plant them.

When the trust cannot be established (the newest cached root is damaged and nothing
heals it, or the trust directory lost every root of a store the device trusted before,
as its high-water mark in the state shows), the sync still runs: the signed manifest
last verified stays in force, the report says why and how to fix it, and the sync fails
(exit 1).
"""

from __future__ import annotations

import os
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from epfleet.device.cache import STATE_DIR, STATE_FILE, CacheState, DeviceCache
from epfleet.errors import BadInputError
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.stores.local import LocalStore
from epfleet.trust.directory import ROOT_HISTORY, ever_trusted, trust_dir, trust_parts
from epfleet.trust.layout import FIRST_ROOT_KEY, ROOT_COPY, development_keys_dir
from epfleet.trust.roots import provisioned_root


@dataclass(frozen=True)
class Trust:
    """What a sync trusts."""

    root: bytes | None
    """The root metadata a refresh starts from (None: unsigned, as allowed, or ``problem``)."""
    problem: str | None = None
    """Why the device, which trusts signed metadata only, has no root to start from now."""
    warning: str | None = None
    """Why the sync trusts less than a provisioned root (a development root)."""

    @property
    def signed(self) -> bool:
        """The sync trusts only signed metadata."""
        return self.root is not None or self.problem is not None


def trusted_root(
    cache: DeviceCache,
    state: CacheState,
    store: Store,
    given: Path | None,
    allow_unsigned: bool,
) -> Trust:
    """What the sync of ``store`` into ``cache`` trusts (the caller holds the cache's lock).
    BadInputError when ``given`` is refused, or when the device never trusted the store,
    is given no root and unsigned syncs are not allowed."""
    parts = (STATE_DIR, *trust_parts(store.uri))
    for depth in range(2, len(parts) + 2):
        with suppress(FileNotFoundError):  # a link on the way is removed, not followed
            os.close(cache.open_dir((*parts, ROOT_HISTORY)[:depth], create=False))
    directory = trust_dir(cache.meta, store.uri)
    mark = state.trust.get(parts[-1])
    start = provisioned_root(directory, given, mark)
    if start.note:
        cache.note(start.note)
    if start.damaged:
        return Trust(None, problem=start.damaged)
    if start.root is not None:
        return Trust(start.root)
    if mark is not None:
        return Trust(
            None,
            problem=f"this device trusted {store.uri} before (its high-water mark is in "
            f"{cache.meta / STATE_FILE}) but {directory / ROOT_HISTORY} holds no root: its "
            "trust cache was lost; provision it again with --trust-root (the root.json it "
            "was provisioned with)",
        )
    development = _development_root(store)
    if development is not None and not (state.trust or ever_trusted(cache.meta)):
        start = provisioned_root(directory, development, None)
        return Trust(
            start.root,
            warning=f"trusting the development root {development} that epfleet compile "
            "created beside this local store: for development only; provision devices with "
            "--trust-root",
        )
    if not allow_unsigned:
        if store.size(MANIFEST_KEY) is None and store.size(FIRST_ROOT_KEY) is None:
            # A mistyped path or prefix is not fixed by turning signature checks off.
            raise BadInputError(
                f"store {store.uri} has nothing published (no {MANIFEST_KEY}, no "
                f"{FIRST_ROOT_KEY}): check --store; a fleet publishes there with epfleet "
                "compile"
            )
        raise BadInputError(
            f"no trusted root to verify {store.uri} with: pass --trust-root PATH (the "
            "root.json of the store's signed metadata, from epfleet trust init; or "
            "EPFLEET_TRUST_ROOT), or --allow-unsigned (EPFLEET_ALLOW_UNSIGNED) to sync "
            "from the unsigned manifest.json"
        )
    return Trust(None)


def _development_root(store: Store) -> Path | None:
    """The root ``epfleet compile`` wrote beside a local store it made development keys
    for (``<store>.dev-keys/root.json``)."""
    if not isinstance(store, LocalStore):
        return None
    path = development_keys_dir(store.root) / ROOT_COPY
    return path if path.is_file() else None
