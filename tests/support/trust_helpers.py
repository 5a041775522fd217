"""Signed stores for tests: ``make_trusted_store`` runs ``epfleet trust init`` on a store
with key files in a directory, as an operator would in development."""

from __future__ import annotations

import time
from pathlib import Path

import onnx
from securesystemslib.signer import Signer

from epfleet.formats.manifest import ArtifactRef, Manifest
from epfleet.hashing import sha256_bytes
from epfleet.stores import Store, open_store
from epfleet.trust.keys import ONLINE_KEY, file_uri, online_signer, public_key_of
from epfleet.trust.repository import init_with_key_files, publish_trust


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
