"""A device poll at fleet scale: what an unchanged sync costs.

A signed store made by hand (one small CPU model, its variant stamped with this host's CPU
string, signed with ``epfleet trust init``'s code) that a device syncs once; then:

- a no-op ``epfleet sync``, in a fresh interpreter, loads neither ``onnx`` nor the compile
  side nor Prefect;
- the report goes up when it says something new, gzip-compressed and compact, and
  otherwise once per heartbeat: an unchanged poll of an S3 store through the counting
  proxy is two GETs (the next root's probe and timestamp.json), no HEAD, no PUT.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trust_helpers import make_trusted_store

import eps
from epfleet import ort_version
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.keys import source_key, variant_key
from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.hashing import sha256_file
from epfleet.stores import MANIFEST_KEY, Store, open_store

pytestmark = pytest.mark.fast

CPU = "CPUExecutionProvider"
MODEL, TARGET, DEVICE = "m", "cpu", "dev-1"
ROOT = Path(__file__).resolve().parents[1]
NOT_ON_A_NO_OP = (
    "onnx",
    "ml_dtypes",
    "prefect",
    "dask",
    "flows",
    "tasks",
    "epfleet.fleet",
    "epfleet.lifecycle",
    "epfleet.runtime.compiler",
    "epfleet.runtime.compile_pool",
    "epfleet.runtime.quantize",
    "epfleet.runtime.shapes",
    "epfleet.device.health",
    "epfleet.trust.signing",
    "epfleet.trust.creation",
)
"""What a sync that keeps every model never loads: the compile side, Prefect, publishing."""


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
    store: Path
    keys: Path
    root: Path


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    """A local store with model ``m`` and its CPU variant, signed (16 bins)."""
    store_dir, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    store = open_store(str(store_dir))
    write_model(work / "source.onnx", label="source", stamp=False)
    source = upload(store, work / "source.onnx", source_key("{sha}"))
    write_model(work / "variant.onnx", label="variant", stamp=True)
    artifact = upload(store, work / "variant.onnx", variant_key(MODEL, TARGET, "{sha}"))
    variant = VariantEntry(
        ep=CPU,
        device="cpu",
        compatibility_string=eps.load(CPU).generate_compatibility_string(work / "variant.onnx"),
        artifact=artifact,
        ort_version=ort_version(),
        compiled_at=datetime.now(timezone.utc),
        status="ok",
        source_sha256=source.sha256,
        fingerprint="by-hand",
    )
    entry = ModelEntry(
        source=SourceEntry(uri=source.uri, sha256=source.sha256, size=source.size),
        variants={TARGET: variant},
    )
    store.write(MANIFEST_KEY, Manifest(generation=1, models={MODEL: entry}).to_json())
    root = make_trusted_store(store, tmp_path / "keys")
    return Fleet(store_dir, tmp_path / "keys", root)


def run_sync(store: str, cache: Path, root: Path) -> DeviceReport:
    return sync(store, cache, SyncPolicy(), DEVICE, trust_root=root)


def test_a_no_op_sync_loads_no_compile_side_and_no_prefect(fleet: Fleet, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run_sync(str(fleet.store), cache, fleet.root)
    assert [m.action for m in first.models] == ["downloaded"], first.models
    loaded = tmp_path / "loaded.json"
    probe = (
        "import json, sys\n"
        "from epfleet.cli.app import main\n"
        "code = main(sys.argv[1:])\n"
        f"open({str(loaded)!r}, 'w').write(json.dumps([code, sorted(sys.modules)]))\n"
    )
    command = ["sync", "--store", str(fleet.store), "--cache", str(cache), "--json"]
    done = subprocess.run(
        [sys.executable, "-c", probe, *command, "--device-id", DEVICE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    code, modules = json.loads(loaded.read_text())
    report = DeviceReport.model_validate_json(done.stdout)
    assert code == 0 and [m.action for m in report.models] == ["kept"]
    heavy = sorted(
        m for m in modules if any(m == name or m.startswith(f"{name}.") for name in NOT_ON_A_NO_OP)
    )
    assert heavy == [], f"a no-op sync loaded {heavy}"
    assert "onnxruntime" in modules  # it did judge the kept variant with ORT
