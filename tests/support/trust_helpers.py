"""Signed stores for tests: ``make_trusted_store`` runs ``epfleet trust init`` on a store
with key files in a directory, as an operator would in development; ``publish_signed``
publishes a manifest made by hand, signed, and ``provisioned_root`` is the root a device
trusts such a store (or a copy on S3: ``tests.support.synced_fleet.publish_to_s3``) with."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import onnx
from securesystemslib.signer import Signer

from epfleet.fleet.publishing.publish import write_copy
from epfleet.formats.manifest import ArtifactRef, Manifest
from epfleet.hashing import sha256_bytes
from epfleet.stores import Store, open_store
from epfleet.stores.local import LocalStore
from epfleet.trust.keys import ONLINE_KEY, file_uri, online_signer, public_key_of
from epfleet.trust.repository import (
    development_keys_dir,
    has_trust,
    init_with_key_files,
    publish_trust,
)

PROVISIONED: dict[str, Path] = {}
"""The root file a device is provisioned with for a store a test signed (by store URI)."""


def _store(store: Store | Path | str) -> Store:
    return open_store(str(store)) if isinstance(store, (Path, str)) else store


def make_trusted_store(store: Store | Path | str, keys_dir: Path, bins: int = 16) -> Path:
    """Create the signed metadata of ``store`` (root 2 of 3 offline keys, targets key and
    online key as files in ``keys_dir``) and sign its manifest.json, if any. Returns the
    root file devices are provisioned with (``keys_dir/root.json``). Sign later changes
    builds with ``publish_new_build``. The test vouches for that manifest (``--adopt``)."""
    root, _ = init_with_key_files(_store(store), keys_dir, bins=bins, adopt=True)
    return root


def online_key(keys_dir: Path) -> Signer:
    """The online signer ``make_trusted_store`` created in ``keys_dir``."""
    uri = file_uri(keys_dir / ONLINE_KEY)
    return online_signer(uri, public_key_of(uri))


def publish_new_build(store: Store, signer: Signer, model: str, target: str) -> bytes:
    """What a compile's publish of a new build of ``model`` × ``target`` does to a signed
    store: the new bytes stored (the signed build's, with another doc string), and the
    signed manifest's entry pointed at them. Returns the new bytes."""

    def change(current: Manifest | None) -> Manifest:
        assert current is not None
        manifest = current.model_copy(deep=True)
        variant = manifest.models[model].variants[target]
        assert variant.artifact is not None
        found = store.read(variant.artifact.uri)
        assert found is not None
        built = onnx.load_from_string(found.data)
        built.doc_string = f"rebuilt {time.time_ns()}"
        data[:] = [built.SerializeToString()]
        digest = sha256_bytes(data[0])
        key = f"variants/{model}/{target}/{digest}.onnx"
        store.write(key, data[0])
        variant.artifact = ArtifactRef(uri=key, sha256=digest, size=len(data[0]))
        manifest.generation += 1
        return manifest

    data: list[bytes] = []
    publish_trust(store, signer, change)
    return data[0]


def provisioned_root(store_uri: str) -> Path | None:
    """The root a device trusts the store at ``store_uri`` with, when a test signed it
    (``publish_signed``) or published a signed copy to it; None: the development root of
    a local store, as ``epfleet sync`` finds it."""
    return PROVISIONED.get(store_uri)


def publish_signed(store: Store, manifest: Manifest) -> None:
    """Publish ``manifest`` (made by hand) to ``store``, signed, with ``manifest.json`` its
    copy. The first publish creates the store's trust metadata: with development keys
    beside a local store, as its first ``epfleet compile`` would, else with keys in a
    directory of their own; devices trust it with ``provisioned_root``."""
    if not has_trust(store):
        if isinstance(store, LocalStore):
            keys = development_keys_dir(store.root)
        else:
            keys = Path(tempfile.mkdtemp(prefix="epfleet-test-keys-")) / "keys"
        root, _ = init_with_key_files(store, keys, bins=16)
        PROVISIONED[store.uri] = root
    publish_trust(store, _online(store), lambda _: manifest)
    write_copy(store)


def _online(store: Store) -> Signer:
    """The online signer of a store ``publish_signed`` created the metadata of."""
    root = PROVISIONED[store.uri]
    return online_key(root.parent)


def init_trust(store_uri: str, keys_dir: Path, env: dict[str, str]) -> Path:
    """``epfleet trust init`` on the store at ``store_uri`` (key files in ``keys_dir``), as
    an operator runs it before the first compile into a store on S3: the publishers that
    ``env`` runs sign with its online key (EPFLEET_TRUST_SIGNER), devices trust its root
    (``provisioned_root``), which is returned."""
    root, signer = init_with_key_files(open_store(store_uri), keys_dir, bins=16)
    env["EPFLEET_TRUST_SIGNER"] = signer
    PROVISIONED[store_uri] = root
    return root
