"""Signed stores for tests: ``make_trusted_store`` runs ``epfleet trust init`` on a store
with key files in a directory, as an operator would in development."""

from __future__ import annotations

from pathlib import Path

from securesystemslib.signer import Signer

from epfleet.stores import Store, open_store
from epfleet.trust.keys import ONLINE_KEY, file_uri, online_signer, public_key_of
from epfleet.trust.repository import init_with_key_files, publish_trust


def _store(store: Store | Path | str) -> Store:
    return open_store(str(store)) if isinstance(store, (Path, str)) else store


def make_trusted_store(store: Store | Path | str, keys_dir: Path, bins: int = 16) -> Path:
    """Create the signed metadata of ``store`` (root 2 of 3 offline keys, targets key and
    online key as files in ``keys_dir``) and sign its manifest.json, if any. Returns the
    root file devices are provisioned with (``keys_dir/root.json``). Sign later changes
    of manifest.json with ``sign_manifest(store, keys_dir)``."""
    root, _ = init_with_key_files(_store(store), keys_dir, bins=bins)
    return root


def online_key(keys_dir: Path) -> Signer:
    """The online signer ``make_trusted_store`` created in ``keys_dir``."""
    uri = file_uri(keys_dir / ONLINE_KEY)
    return online_signer(uri, public_key_of(uri))


def sign_manifest(store: Store | Path | str, keys_dir: Path) -> int:
    """Sign the store's current manifest.json (what every publish does); returns the new
    timestamp version."""
    return publish_trust(_store(store), online_key(keys_dir)).version
