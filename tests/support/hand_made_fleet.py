"""A signed store made by hand for device tests at fleet scale: one small CPU model (or
a few), its variant stamped with this host's CPU string, signed with ``epfleet trust
init``'s code (tests/device/test_scale.py, test_fresh_processes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import eps
from epfleet import ort_version
from epfleet.formats.keys import source_key, variant_key
from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.hashing import sha256_file
from epfleet.stores import MANIFEST_KEY, Store, open_store
from tests.support.trust_helpers import make_trusted_store

CPU = "CPUExecutionProvider"
MODEL, TARGET, DEVICE = "m", "cpu", "dev-1"


def write_model(path: Path, *, label: str, stamp: bool) -> None:
    """Y = X @ W; with ``stamp``, the CPU EP's compatibility string for this host."""
    weights = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version, model.doc_string = 8, label
    onnx.save_model(model, str(path))
    if stamp:
        string = eps.load(CPU).generate_compatibility_string(path)
        assert string is not None
        helper.set_model_props(model, {f"ep_compatibility_info.{CPU}": string})
        onnx.save_model(model, str(path))


def upload(store: Store, path: Path, key: str) -> ArtifactRef:
    sha, size = sha256_file(path)
    store.upload(key.format(sha=sha), path, sha)
    return ArtifactRef(uri=key.format(sha=sha), sha256=sha, size=size)


@dataclass
class Fleet:
    uri: str
    keys: Path
    root: Path


def make_fleet(uri: str, tmp_path: Path, models: int = 1) -> Fleet:
    """Model ``m`` (and ``m1``, ``m2``, ... up to ``models``) and its CPU variant in the
    store at ``uri``, signed (16 bins)."""
    work = tmp_path / "work"
    work.mkdir()
    store = open_store(uri)
    entries = {}
    for name in [MODEL] + [f"{MODEL}{i}" for i in range(1, models)]:
        write_model(work / "source.onnx", label=f"{name} source", stamp=False)
        source = upload(store, work / "source.onnx", source_key("{sha}"))
        write_model(work / "variant.onnx", label=f"{name} variant", stamp=True)
        artifact = upload(store, work / "variant.onnx", variant_key(name, TARGET, "{sha}"))
        variant = VariantEntry(
            ep=CPU,
            device="cpu",
            compatibility_string=eps.load(CPU).generate_compatibility_string(work / "variant.onnx"),
            artifact=artifact,
            ort_version=ort_version(),
            compiled_at=datetime.now(timezone.utc),
            status="ok",
            source_sha256=source.sha256,
            fingerprint=f"by-hand-{name}",
        )
        entries[name] = ModelEntry(
            source=SourceEntry(uri=source.uri, sha256=source.sha256, size=source.size),
            variants={TARGET: variant},
        )
    store.write(MANIFEST_KEY, Manifest(generation=1, models=entries).to_json())
    root = make_trusted_store(store, tmp_path / "keys")
    return Fleet(store.uri, tmp_path / "keys", root)
