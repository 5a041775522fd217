"""What the commands a device runs load, each in a fresh interpreter (issue 21.3).

- ``epfleet --version`` loads no command's module, no pydantic, no device engine, neither
  onnx, ORT, Prefect nor boto3; ``epfleet --help`` in the same interpreter still lists
  every command with the first line of its help (the commands are registered by name and
  imported when they run, ``epfleet.cli.app``).
- ``epfleet sync`` of a signed S3 store, as a device runs it: securesystemslib's signers
  are loaded with boto3 hidden from them (``epfleet.cli.sync``), and the S3 store then
  loads boto3 as usual and the no-op sync keeps the model, loading neither onnx, Prefect
  nor the compile command.

A no-op sync of a local store (no boto3 either): ``tests/test_device_scale.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import eps
from epfleet import ort_version
from epfleet.cli.app import COMMANDS
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.keys import source_key, variant_key
from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.hashing import sha256_file
from epfleet.stores import MANIFEST_KEY, open_store
from epfleet.trust.repository import init_with_key_files
from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # fresh interpreters: what a process imports

ROOT = REPO
CPU = "CPUExecutionProvider"
PROBE = """
import contextlib, io, json, sys
from epfleet.cli.app import main
runs = []
for argv in json.loads(sys.argv[-1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    runs.append({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)})
print(json.dumps(runs))
"""
"""Runs ``main`` on each command line of the JSON list last on its own command line (whose
first arguments are the first command line's, as a process started with it has them), and
prints each one's exit code, output and the modules loaded by then."""


def probe(*argvs: list[str], cwd: Path) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPFLEET_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argvs[0], json.dumps(argvs)],
        cwd=cwd, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs: list[dict[str, object]] = json.loads(done.stdout.splitlines()[-1])
    return runs


def loaded(modules: object, *packages: str) -> list[str]:
    """The modules of ``packages`` (each a package or module name) among ``modules``."""
    assert isinstance(modules, list)
    return [m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages)]


def test_version_loads_no_command_and_help_still_lists_them_all(tmp_path: Path) -> None:
    version, help_ = probe(["--version"], ["--help"], cwd=tmp_path)
    assert version["code"] == 0 and str(version["out"]).startswith("epfleet ")
    heavy = ("onnx", "onnxruntime", "prefect", "boto3", "botocore", "pydantic", "numpy")
    engine = ("epfleet.device", "epfleet.fleet", "epfleet.runtime", "epfleet.trust")
    commands = [f"epfleet.cli.{m}" for m in ("compile", "sync", "serve", "store", "trust")]
    commands += ["epfleet.cli.rollout", "epfleet.cli.manifest", "epfleet.cli.prefect_api"]
    assert loaded(version["modules"], *heavy, *engine, *commands) == []
    assert help_["code"] == 0
    rows = [re.match(r"│ (\S+) +(\S.*?) *│$", line) for line in str(help_["out"]).splitlines()]
    listing = {row[1]: row[2] for row in rows if row and not row[1].startswith("-")}
    assert sorted(listing) == sorted(COMMANDS)
    assert all(description for description in listing.values()), listing


def write_model(path: Path, label: str, stamp: bool) -> None:
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


def signed_s3_fleet(uri: str, work: Path) -> Path:
    """Model ``m`` and its CPU variant for this host in the store at ``uri``, signed; the
    root file a device trusts."""
    store = open_store(uri)
    refs = []
    for name, stamp in (("source", False), ("variant", True)):
        path = work / f"{name}.onnx"
        write_model(path, f"m {name}", stamp)
        sha, size = sha256_file(path)
        key = variant_key("m", "cpu", sha) if stamp else source_key(sha)
        store.upload(key, path, sha)
        refs.append(ArtifactRef(uri=key, sha256=sha, size=size))
    source, artifact = refs
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
        variants={"cpu": variant},
    )
    store.write(MANIFEST_KEY, Manifest(generation=1, models={"m": entry}).to_json())
    root, _ = init_with_key_files(store, work / "keys", bins=16)
    return root


def test_a_sync_command_hides_boto3_from_the_signers_and_still_reads_s3(
    s3_bucket: str, tmp_path: Path
) -> None:
    uri, cache = f"s3://{s3_bucket}/fleet", tmp_path / "cache"
    (tmp_path / "work").mkdir()
    root = signed_s3_fleet(uri, tmp_path / "work")
    first = sync(uri, cache, SyncPolicy(), "dev-1", trust_root=root)  # in this process
    assert [m.action for m in first.models] == ["downloaded"], first.models
    (run,) = probe(
        ["sync", "--store", uri, "--cache", str(cache), "--device-id", "dev-1", "--json"],
        cwd=tmp_path,
    )
    report = json.loads(str(run["out"]))
    assert run["code"] == 0 and [m["action"] for m in report["models"]] == ["kept"], report
    assert loaded(run["modules"], "boto3", "securesystemslib.signer") != []
    assert loaded(run["modules"], "onnx", "prefect", "epfleet.cli.compile") == []
