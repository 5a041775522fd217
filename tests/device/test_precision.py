"""Precisions on the device, for real: of published variants it can run
equally well, a device takes the one the fleet's declared preference lists first, and
its report names the precision each model runs.

One small model (Y = X @ W) is published by hand through the store API in a local store,
as two CPU targets whose artifacts differ in bytes only (each stamped with this host's
CPU compatibility string, so both judge optimal here), with the model entry's
``preference`` naming the order; a real sync (real ORT, health check in a worker) then
downloads, checks and activates one of them, and ORT's model package selects it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import eps
from epfleet import ort_version
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport, ModelReport
from epfleet.formats.keys import source_key, variant_key
from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.hashing import sha256_file
from epfleet.stores import Store, open_store
from eps.base import Precision
from tests.support.trust_helpers import publish_signed

pytestmark = pytest.mark.slow

CPU = "CPUExecutionProvider"
MODEL = "m"
W = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)


def write_model(path: Path, *, label: str, stamp: bool) -> None:
    """Y = X @ W; ``label`` (in its doc string) makes builds of the same graph differ in
    bytes; with ``stamp``, the CPU EP's compatibility string for this host (a variant)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, W.shape[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, W.shape[1]])],
        initializer=[numpy_helper.from_array(W, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.doc_string = label
    onnx.save_model(model, str(path))
    if stamp:
        string = eps.load(CPU).generate_compatibility_string(path)
        assert string is not None
        helper.set_model_props(model, {f"ep_compatibility_info.{CPU}": string})
        onnx.save_model(model, str(path))


def upload(store: Store, path: Path, key_of: Callable[[str], str]) -> ArtifactRef:
    sha, size = sha256_file(path)
    key = key_of(sha)
    store.upload(key, path, sha)
    return ArtifactRef(uri=key, sha256=sha, size=size)


def publish(
    store: Store,
    work: Path,
    targets: dict[str, Precision | None],
    preference: list[str],
    *,
    variants: bool = True,
) -> ModelEntry:
    """The model's source and, with ``variants``, one CPU variant per target (in the
    manifest in ``targets``' order, recording its precision), uploaded."""
    work.mkdir(parents=True, exist_ok=True)
    write_model(work / "source.onnx", label="source", stamp=False)
    ref = upload(store, work / "source.onnx", source_key)
    entry = ModelEntry(
        source=SourceEntry(uri=ref.uri, sha256=ref.sha256, size=ref.size),
        preference=preference,
    )
    for target, precision in targets.items() if variants else ():
        path = work / f"{target}.onnx"
        write_model(path, label=target, stamp=True)
        artifact = upload(store, path, lambda sha, t=target: variant_key(MODEL, t, sha))
        entry.variants[target] = VariantEntry(
            ep=CPU,
            device="cpu",
            compatibility_string=eps.load(CPU).generate_compatibility_string(path),
            artifact=artifact,
            ort_version=ort_version(),
            compiled_at=datetime.now(timezone.utc),
            status="ok",
            source_sha256=ref.sha256,
            fingerprint=f"by-hand-{target}",
            precision=precision,
        )
    return entry


def put_manifest(store: Store, entry: ModelEntry, generation: int) -> None:
    publish_signed(store, Manifest(generation=generation, models={MODEL: entry}))


def run_sync(store: Path, cache: Path, **policy: object) -> ModelReport:
    report: DeviceReport = sync(str(store), cache, SyncPolicy(**policy), device="test-device")  # type: ignore[arg-type]
    [result] = report.models
    return result


def assert_selected(cache: Path, variant: str | None) -> None:
    """ORT's model package, with no epfleet code, selects ``variant`` and runs it."""
    context = ort.ModelPackageContext(str(cache))
    chosen = context.select_component(MODEL, ort.ModelPackageOptions(ort.SessionOptions()))
    assert chosen.get_selected_variant_name() == variant
    x = np.linspace(-1, 1, W.shape[0], dtype=np.float32)[None, :]
    [y] = chosen.create_session().run(None, {"X": x})
    np.testing.assert_allclose(y, x @ W, rtol=1e-5, atol=1e-5)


def test_the_declared_preference_picks_among_equal_variants_and_a_new_order_switches(
    tmp_path: Path,
) -> None:
    store_dir, cache = tmp_path / "store", tmp_path / "device"
    store = open_store(str(store_dir))
    targets: dict[str, Precision | None] = {"cpu-a": "fp32", "cpu-b": "fp32"}
    entry = publish(store, tmp_path / "work", targets, preference=["cpu-b", "cpu-a"])
    put_manifest(store, entry, 1)

    first = run_sync(store_dir, cache)
    # Both optimal, both cpu: cpu-b is declared first, though listed second in the manifest.
    assert (first.action, first.target) == ("downloaded", "cpu-b"), first.reason
    assert first.precision == "fp32"
    assert_selected(cache, first.variant)

    again = run_sync(store_dir, cache)
    assert (again.action, again.target, again.bytes_downloaded) == ("kept", "cpu-b", 0)
    assert again.precision == "fp32"

    # A new publish lists cpu-a first: the next sync switches to it.
    put_manifest(store, entry.model_copy(update={"preference": ["cpu-a", "cpu-b"]}), 2)
    switched = run_sync(store_dir, cache)
    assert (switched.action, switched.target) == ("downloaded", "cpu-a"), switched.reason
    assert_selected(cache, switched.variant)

    # No declared preference: manifest order, so the active cpu-a (listed first) stays.
    put_manifest(store, entry.model_copy(update={"preference": []}), 3)
    unlisted = run_sync(store_dir, cache)
    assert (unlisted.action, unlisted.target) == ("kept", "cpu-a"), unlisted.reason


def test_the_report_names_the_precision_of_a_local_build_and_of_the_fallback(
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    put_manifest(store, publish(store, tmp_path / "work", {}, [], variants=False), 1)

    built = run_sync(store_dir, tmp_path / "built")
    assert (built.action, built.ep) == ("recompiled", CPU), built.reason
    assert built.precision == eps.load(CPU).precisions({})[0] == "fp32"

    fallback = run_sync(store_dir, tmp_path / "fallback", recompile=False)
    assert (fallback.action, fallback.precision) == ("fallback", "fp32")


def test_a_variant_published_without_a_precision_reports_none(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    entry = publish(store, tmp_path / "work", {"cpu-old": None}, [])
    put_manifest(store, entry, 1)
    result = run_sync(store_dir, tmp_path / "device")
    assert (result.action, result.target, result.precision) == ("downloaded", "cpu-old", None)
    assert "precision" not in result.model_dump_json()
