"""What device tests do with the compiled test fleet (the ``fleet_store`` fixture in
tests/conftest.py): copy it, publish it to S3, republish a variant, sync a device from it
and check the package the device made."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import boto3
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_bytes

DEVICE = "test-device"


def publish_to_s3(store: Path, bucket: str, prefix: str = "fleet") -> str:
    """Copy a local store into S3 as is (its keys are relative paths)."""
    s3 = boto3.client("s3", region_name="us-east-1")
    for path in sorted(store.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(store).as_posix()}")
    return f"s3://{bucket}/{prefix}"


def run_sync(store: str, cache: Path, **policy: object) -> DeviceReport:
    return sync(store, cache, SyncPolicy(**policy), device=DEVICE)  # type: ignore[arg-type]


def assert_package_runs(cache: Path, expected: dict[str, str]) -> None:
    """The cache opens as an ORT model package with no epfleet code, selects the variant
    epfleet activated for each model, and runs it."""
    context = ort.ModelPackageContext(str(cache))
    assert sorted(context.get_component_names()) == sorted(expected)
    for model, variant in expected.items():
        chosen = context.select_component(model, ort.ModelPackageOptions(ort.SessionOptions()))
        assert chosen.get_selected_variant_name() == variant
        session = chosen.create_session()
        feeds = {
            i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
            for i in session.get_inputs()
        }
        outputs = session.run(None, feeds)
        assert outputs and all(np.isfinite(o).all() for o in outputs)


def read_manifest(store: Path) -> Manifest:
    return Manifest.from_json((store / "manifest.json").read_bytes())


def copy_store(source: Path, dest: Path) -> Path:
    """A copy of a local store without its signed metadata: the tests edit its manifest
    as an unsigned store's (a device syncs it with EPFLEET_ALLOW_UNSIGNED), and a later
    compile into it creates development keys of its own."""
    import shutil

    shutil.copytree(
        source, dest, ignore=lambda directory, names: ["trust"] * (directory == str(source))
    )
    return dest


def republish_cpu_variant(store: Path, model: str, data: bytes, claimed_sha256: str) -> None:
    """Point the model's CPU variant at new bytes in the store, claiming ``claimed_sha256``."""
    manifest = read_manifest(store)
    variant = manifest.models[model].variants["x86-cpu"]
    key = f"variants/{model}/x86-cpu/{claimed_sha256}.onnx"
    (store / key).write_bytes(data)
    assert variant.artifact is not None
    variant.artifact = variant.artifact.model_copy(
        update={"uri": key, "sha256": claimed_sha256, "size": len(data)}
    )
    manifest.generation += 1
    (store / "manifest.json").write_bytes(manifest.to_json())


def republish_edited_cpu_variant(store: Path, edit: Callable[[onnx.ModelProto], None]) -> bytes:
    """Publish a new build of tiny-cls's CPU variant: the current one edited, with its true
    sha256 and size in the manifest. Returns its bytes."""
    original = read_manifest(store).models["tiny-cls"].variants["x86-cpu"]
    assert original.artifact is not None
    model = onnx.load_from_string((store / original.artifact.uri).read_bytes())
    edit(model)
    data = model.SerializeToString()
    republish_cpu_variant(store, "tiny-cls", data, sha256_bytes(data))
    return data


def make_unreadable(store: Path) -> Path:
    """A local store whose manifest cannot be read: a stand-in for a store gone offline."""
    manifest = store / "manifest.json"
    held = manifest.rename(store / "manifest.held")
    manifest.mkdir()
    return held


def make_readable(store: Path, held: Path) -> None:
    (store / "manifest.json").rmdir()
    held.rename(store / "manifest.json")


def scale_largest_weight(model: onnx.ModelProto) -> None:
    """A deliberately wrong build: it loads and runs, but one weight is tripled."""
    weights = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    tripled = numpy_helper.to_array(weights) * 3
    weights.CopyFrom(numpy_helper.from_array(tripled.astype(np.float32), weights.name))


MODEL = "tiny-cls"


def rebuilt(model: onnx.ModelProto) -> None:
    """A new build that runs like the old one: only its doc string differs."""
    model.doc_string = f"rebuilt {time.time_ns()}"


def runaway(model: onnx.ModelProto) -> None:
    """Add a Loop of 1e15 iterations on the input's sum, as an extra output: the variant
    loads, and its run never ends."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
        ],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, []),
        ],
        initializer=[numpy_helper.from_array(np.array(1, np.float32), "one")],
    )
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(10**15, np.int64), "trip"),
            numpy_helper.from_array(np.array(True), "keep_going"),
        ]
    )
    model.graph.node.extend(
        [
            helper.make_node("ReduceSum", [model.graph.input[0].name], ["start"], keepdims=0),
            helper.make_node("Loop", ["trip", "keep_going", "start"], ["spun"], body=body),
        ]
    )
    model.graph.output.append(helper.make_tensor_value_info("spun", TensorProto.FLOAT, []))


def republished_to_s3(fleet_store: Path, tmp_path: Path, bucket: str) -> tuple[str, str]:
    """A new build of tiny-cls's CPU variant published to S3 (after the device synced the
    old one): the store's URI and the proxy path of the new artifact."""
    store = copy_store(fleet_store, tmp_path / "store")
    republish_edited_cpu_variant(store, rebuilt)
    uri = publish_to_s3(store, bucket)
    artifact = read_manifest(store).models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    return uri, f"/{bucket}/fleet/{artifact.uri}"
