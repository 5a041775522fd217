"""Publishes for tests: ``one_model`` (a model's source and cpu variant, named by an index),
``publish_new`` (publish it as a run that found no entry for it) and ``race`` (publishers
in threads, each publishing models of its own at the same time)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

from epfleet.fleet.publishing.publish import Published, publish
from epfleet.formats.manifest import ArtifactRef, SourceEntry, VariantEntry
from epfleet.stores import Store, open_store


def one_model(index: int) -> tuple[dict[str, SourceEntry], dict[tuple[str, str], VariantEntry]]:
    """Model ``model-<index>``: its source and its ok cpu variant, each with a sha256 of its
    own (derived from the index)."""
    sha = f"{index:064x}"
    name = f"model-{index}"
    source = SourceEntry(uri=f"sources/{sha}.onnx", sha256=sha, size=index + 1)
    variant = VariantEntry(
        ep="CPUExecutionProvider",
        device="cpu",
        compatibility_string="epfleet-cpu/1;ort=1.32.0;arch=x86_64;isa=avx2;nchwc=0",
        artifact=ArtifactRef(uri=f"variants/{name}/cpu/{sha}.onnx", sha256=sha, size=1),
        ort_version="1.32.0",
        ep_version="1.32.0",
        compiled_at=datetime.now(timezone.utc),
        status="ok",
        source_sha256=sha,
        fingerprint=f"fp-{index}",
    )
    return {name: source}, {(name, "cpu"): variant}


def publish_new(store: Store, index: int) -> Published:
    """Publish model ``index`` as a run that found no entry for it."""
    sources, variants = one_model(index)
    for ref in [*sources.values(), *(v.artifact for v in variants.values() if v.artifact)]:
        store.write(ref.uri, bytes(ref.size))  # a publish names only objects the store has
    return publish(store, sources, dict.fromkeys(sources), variants)


def race(store_uri: str, publishers: int = 2, each: int = 8) -> None:
    """``publishers`` threads, started together, each publishing ``each`` models of its own
    (``model-0`` .. ``model-<publishers * each - 1>`` in all); fails on any error."""
    barrier = threading.Barrier(publishers)
    errors: list[BaseException] = []

    def publisher(offset: int) -> None:
        store = open_store(store_uri)
        barrier.wait()
        try:
            for i in range(each):
                publish_new(store, offset * each + i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publisher, args=(p,)) for p in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
