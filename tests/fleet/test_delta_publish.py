"""A publish makes, uploads and lists the deltas to its new variants (local store and S3
over HTTP): from the build a variant replaces, only under half the file, a delta that
makes the new file byte for byte; one that cannot be made leaves the publish as it was."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from epfleet.deltas import apply_delta
from epfleet.fleet.publishing.publish import publish, read_in_force
from epfleet.formats.manifest import ArtifactRef, SourceEntry, VariantEntry
from epfleet.stores import Store, open_store
from tests.support.publish_helpers import one_model

pytestmark = pytest.mark.fast

MODEL, TARGET = "model-1", "cpu"


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(request.getfixturevalue("s3_store_uri"))


def publish_build(store: Store, data: bytes) -> VariantEntry:
    """``data`` published as the model's cpu variant (its source unchanged)."""
    sources, variants = one_model(1)
    sha256 = hashlib.sha256(data).hexdigest()
    artifact = ArtifactRef(
        uri=f"variants/{MODEL}/{TARGET}/{sha256}.onnx", sha256=sha256, size=len(data)
    )
    variant = variants[(MODEL, TARGET)].model_copy(
        update={"artifact": artifact, "fingerprint": sha256}
    )
    source: SourceEntry = sources[MODEL]
    store.write(source.uri, bytes(source.size))
    store.write(artifact.uri, data)
    current = read_in_force(store).manifest
    planned = {MODEL: current.models[MODEL].source if current else None}
    publish(store, sources, planned, {(MODEL, TARGET): variant})
    manifest = read_in_force(store).manifest
    assert manifest is not None
    return manifest.models[MODEL].variants[TARGET]


def test_a_new_build_is_published_with_a_delta_from_the_one_it_replaces(store: Store) -> None:
    first = os.urandom(200_000)
    assert publish_build(store, first).deltas == []
    second = bytearray(first)
    second[1000:1100] = os.urandom(100)  # a layer retrained
    published = publish_build(store, bytes(second))
    [delta] = published.deltas
    assert delta.base_sha256 == hashlib.sha256(first).hexdigest()
    assert delta.uri.startswith(f"deltas/{MODEL}/{TARGET}/{published.artifact.sha256}.from-")  # type: ignore[union-attr]
    found = store.read(delta.uri)
    assert found is not None and len(found.data) == delta.size < len(second) / 2
    assert hashlib.sha256(found.data).hexdigest() == delta.sha256
    assert apply_delta(first, found.data, hashlib.sha256(second).hexdigest(), len(second)) == second

    unrelated = publish_build(store, os.urandom(200_000))
    assert unrelated.deltas == []  # not under half the file: none made, none listed
    assert [k for k in store.list_keys("deltas/") if unrelated.artifact.sha256 in k] == []  # type: ignore[union-attr]


def test_a_base_gone_from_the_store_leaves_the_publish_without_a_delta(store: Store) -> None:
    data = os.urandom(100_000)
    first = publish_build(store, data)
    assert first.artifact is not None
    store.delete(first.artifact.uri)
    second = publish_build(store, data[:-100] + os.urandom(100))  # would make a small delta
    assert second.deltas == [] and second.artifact is not None
    assert store.list_keys("deltas/") == []
