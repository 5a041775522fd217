"""A pool decides its own pairs: fingerprints from the pool's ORT and EP packages."""

from __future__ import annotations

from pathlib import Path

import eps
from epfleet import ort_version
from epfleet.manifest import ArtifactRef, VariantEntry, utcnow
from epfleet.plan import CompileRequest, rebased
from epfleet.stores import open_store
from tasks.dispatch import PoolPair, plan_on_pool

SHA = "a" * 64
CPU = "CPUExecutionProvider"


def request(fingerprint: str = "planned-elsewhere") -> CompileRequest:
    return CompileRequest(
        model="det",
        target="pool-cpu",
        ep=CPU,
        device="cpu",
        provider_options={},
        input_shapes={"x": [1, 3, 8, 8]},
        source_key=f"sources/{SHA}.onnx",
        source_sha256=SHA,
        source_size=10,
        fingerprint=fingerprint,
    )


def built(fingerprint: str) -> VariantEntry:
    return VariantEntry(
        ep=CPU,
        device="cpu",
        compatibility_string="s",
        artifact=ArtifactRef(uri=f"variants/det/pool-cpu/{SHA}.onnx", sha256=SHA, size=3),
        ort_version=ort_version(),
        ep_version="x",
        compiled_at=utcnow(),
        status="ok",
        source_sha256=SHA,
        fingerprint=fingerprint,
    )


def test_the_pool_skips_what_it_built_and_rebuilds_after_its_own_upgrade(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    store.write(f"variants/det/pool-cpu/{SHA}.onnx", b"abc")
    here = rebased(request(), ort_version(), eps.load(CPU).build_identity()).fingerprint
    assert here != "planned-elsewhere"

    todo, skipped = plan_on_pool(
        [PoolPair(request=request(), previous=built(here))], store.uri, False
    )
    assert (todo, skipped) == ([], [("det", "pool-cpu")])

    older = rebased(request(), ort_version(), {"package": "onnxruntime", "version": "1.31.0"})
    todo, skipped = plan_on_pool(
        [PoolPair(request=request(), previous=built(older.fingerprint))], store.uri, False
    )
    assert [r.fingerprint for r in todo] == [here] and skipped == []

    todo, _ = plan_on_pool([PoolPair(request=request(), previous=built(here))], store.uri, True)
    assert [r.fingerprint for r in todo] == [here]

    store.delete(f"variants/det/pool-cpu/{SHA}.onnx")  # artifact gone from the store
    todo, _ = plan_on_pool([PoolPair(request=request(), previous=built(here))], store.uri, False)
    assert len(todo) == 1
