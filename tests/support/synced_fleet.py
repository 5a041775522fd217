"""What device tests do with the compiled test fleet (the ``fleet_store`` fixture in
tests/conftest.py): copy it, publish it to S3, republish a variant, sync a device from it
and check the package the device made.

The fleet is signed (the development keys its compile made beside it) and stays signed:
copies take the keys along, changes are signed publishes (``edit_manifest``), and a device
trusts the development root of a local store, as ``epfleet sync`` does on one machine, or
the root it was provisioned with for the store's copy on S3 (``publish_to_s3``)."""

from __future__ import annotations

import json
import shutil
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
from epfleet.fleet.publishing.publish import update_manifest
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_bytes
from epfleet.stores import open_store
from epfleet.trust.repository import ROOT_COPY, development_keys_dir
from tests.support.trust_helpers import PROVISIONED, provisioned_root

DEVICE = "test-device"


def publish_to_s3(store: Path, bucket: str, prefix: str = "fleet") -> str:
    """Copy a local store into S3 as is (its keys are relative paths), signed metadata
    included: a device trusts it with the local store's development root
    (``provisioned_root``)."""
    s3 = boto3.client("s3", region_name="us-east-1")
    for path in sorted(store.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(store).as_posix()}")
    uri = f"s3://{bucket}/{prefix}"
    root = development_keys_dir(store) / ROOT_COPY
    if root.is_file():
        PROVISIONED[uri] = root
    return uri


def run_sync(store: str, cache: Path, **policy: object) -> DeviceReport:
    """A sync of ``store`` into ``cache``; the device trusts the root a copy on S3 was
    published with (``publish_to_s3``), a local store's development root otherwise."""
    return sync(
        store,
        cache,
        SyncPolicy(**policy),  # type: ignore[arg-type]
        device=DEVICE,
        trust_root=provisioned_root(store),
    )


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
    """A copy of a signed local store with the development keys beside it: a device trusts
    the copy's development root, later publishes (``edit_manifest``, a compile into it)
    sign with its keys. Its files are new (their times now)."""
    shutil.copytree(source, dest, copy_function=shutil.copy)
    shutil.copytree(
        development_keys_dir(source),
        development_keys_dir(dest),
        copy_function=shutil.copy,
        dirs_exist_ok=True,  # the same keys, when the copy is made again
    )
    return dest


def unsigned_copy(source: Path, dest: Path) -> Path:
    """A copy of a local store without its signed metadata and development keys: a store
    that publishes manifest.json alone, as one that never ran ``epfleet trust init``."""
    shutil.copytree(
        source, dest, ignore=lambda directory, names: ["trust"] * (directory == str(source))
    )
    return dest


def edit_manifest(store: Path, edit: Callable[[dict], None]) -> Manifest:
    """Publish the store's manifest as ``edit`` changes its JSON document (the generation
    one higher): signed, as a publisher holding the store's development keys would; on a
    store without them (``unsigned_copy``) as its manifest.json alone, which a test that
    signs it by hand then signs (``tests.support.signed_fleet.Repo``)."""

    def change(current: Manifest | None) -> Manifest:
        assert current is not None
        document = json.loads(current.to_json())
        edit(document)
        document["generation"] = current.generation + 1
        return Manifest.model_validate(document)

    if not development_keys_dir(store).is_dir():  # unsigned, or signed after by a test's Repo
        changed = change(read_manifest(store))
        (store / "manifest.json").write_bytes(changed.to_json())
        return changed
    published = update_manifest(open_store(str(store)), change)
    assert published.manifest is not None
    return published.manifest


def republish_cpu_variant(store: Path, model: str, data: bytes, claimed_sha256: str) -> None:
    """Point the model's CPU variant at new bytes in the store, claiming ``claimed_sha256``
    (a signed publish: the publisher vouches for what it claims)."""
    key = f"variants/{model}/x86-cpu/{claimed_sha256}.onnx"
    (store / key).write_bytes(data)

    def point(document: dict) -> None:
        artifact = document["models"][model]["variants"]["x86-cpu"]["artifact"]
        artifact.update(uri=key, sha256=claimed_sha256, size=len(data))

    edit_manifest(store, point)


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
    """A local store whose manifest cannot be read: a stand-in for a store gone offline, on
    the unsigned path (a local store's signed metadata is never unreachable: a directory
    at its timestamp is a rejected refresh)."""
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
