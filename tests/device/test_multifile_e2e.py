"""Multi-file models end to end: the real ``epfleet compile`` (a
subprocess, with its Prefect API) publishes into S3 (moto over HTTP), then the real device
sync downloads each file, verifies it, health-checks the variant and activates its
directory as the ORT model package's variant directory.

- a model with external data, compiled for QNN HTP with its context binary beside the
  model (``embed_context: false``) and for the CPU EP;
- a GenAI-style folder (config and tokenizer files beside ``model.onnx`` and its data);
- a compile run again unchanged publishes nothing and a device re-sync moves 0 bytes.

One thing cannot run on this x86 host: QNN's compatibility validator (it raises without an
NPU, so a device judges every HTP variant unsupported). Where a test needs the device to
take the HTP variant, that verdict alone is a test double (``judge_qnn_optimal``); the
download, per-file checks, string check, health check (QNN's HTP backend runs context
binaries on this CPU) and activation are real. ORT's own package selection does not pick
an HTP variant on this host either (measured, even with QNN in the session options:
"No suitable model variant found for the configured execution providers"; the variant is
for an NPU, and QNN's device here is CPU-typed), so for it the test reads the package
manifest epfleet wrote instead of asking ``ModelPackageContext``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import boto3
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.device import local_eps
from epfleet.device.cache import DeviceCache
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport, ModelReport
from epfleet.formats.manifest import Manifest, PackageFile, VariantEntry
from epfleet.hashing import sha256_bytes
from epfleet.text import format_bytes
from eps.base import Judgement, Verdict
from tests.support.specs import write_spec
from tests.support.trust_helpers import init_trust, provisioned_root

pytestmark = pytest.mark.slow

QNN = "QNNExecutionProvider"
HTP = {
    "name": "htp",
    "ep": QNN,
    "provider_options": {
        "backend_type": "htp",
        "htp_arch": "75",
        "soc_model": "57",
        "enable_htp_fp16_precision": "1",
    },
    "embed_context": False,
}
CPU = {"name": "cpu", "ep": "CPUExecutionProvider"}
SIDECARS = {
    "genai_config.json": b'{"model": {"decoder": {"filename": "model.onnx"}}}\n',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
    "tokenizer/vocab.txt": b"hello\nworld\n",
}
DEVICE = "e2e-device"


# --- models ----------------------------------------------------------------------------------


def save_with_external_data(path: Path, seed: int = 0) -> None:
    """x[1, 64] -> relu(x @ W + B) at ``path``, W (16 KiB) in ``<name>.data`` beside it."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.uniform(-1, 1, (64, 64)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.uniform(-1, 1, 64).astype(np.float32), "B")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["y"]),
            helper.make_node("Add", ["y", "B"], ["z"]),
            helper.make_node("Relu", ["z"], ["out"]),
        ],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 64])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{path.name}.data",
        size_threshold=1024,
    )


def genai_folder(root: Path) -> Path:
    for name, data in SIDECARS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    save_with_external_data(root / "model.onnx")
    return root


X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)


def source_output(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


# --- the command line, the store, the device -------------------------------------------------


def compile_cli(spec: Path, store: str, env: dict[str, str]) -> dict:
    """``epfleet compile SPEC --store STORE --json``, as users run it; its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", store, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class Bucket:
    """The fleet's objects in the moto bucket, read and written with plain boto3."""

    def __init__(self, name: str) -> None:
        self.name, self.s3 = name, boto3.client("s3")

    def read(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=self.name, Key=f"fleet/{key}")["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.name, Key=f"fleet/{key}", Body=data)

    def objects(self) -> dict[str, str]:
        """Every key under the fleet prefix -> its ETag (changes when its bytes do)."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix="fleet/")
        return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}

    def manifest(self) -> Manifest:
        return Manifest.from_json(self.read("manifest.json"))


def run_sync(store: str, cache: Path) -> DeviceReport:
    root = provisioned_root(store)
    return sync(store, cache, SyncPolicy(recompile=False), device=DEVICE, trust_root=root)


def only(report: DeviceReport) -> ModelReport:
    (model,) = report.models
    return model


def installed_files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def stored_files(bucket: Bucket, variant: VariantEntry) -> dict[str, bytes]:
    """The variant's files as the store holds them, at their paths in its directory."""
    assert variant.artifact is not None
    files = {variant.model_file: bucket.read(variant.artifact.uri)}
    files.update({f.path: bucket.read(f.uri) for f in variant.files})
    return files


def package_variants(cache: Path, model: str) -> dict[str, dict]:
    """The variants the device's ORT model package manifest lists for ``model``, the
    active one first."""
    package = json.loads((cache / "manifest.json").read_bytes())
    return package["components"][model]["variants"]


def no_leftovers(cache: Path) -> None:
    for leftover in ("scratch", "partial"):
        directory = cache / ".epfleet" / leftover
        assert not directory.exists() or not any(directory.iterdir()), leftover


def judge_qnn_optimal(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Test double for the one thing that cannot run here: QNN's compatibility validator.

    This x86 host has no NPU, so ORT's ``get_model_compatibility_for_ep_devices`` raises
    for QNN's devices and the device would judge every HTP variant unsupported (never
    downloading it). With this double the device judges QNN strings "optimal"; every
    other EP, and everything after the judgement (download, per-file verification,
    string check, health check on QNN's HTP backend, activation), is real. Returns the
    QNN strings the device asked about."""
    asked: list[str] = []
    real = local_eps.ort_judgement

    def judge(devices: list[ort.OrtEpDevice], ep: str, string: str) -> Judgement:
        if ep != QNN:
            return real(devices, ep, string)
        asked.append(string)
        return Judgement(Verdict.OPTIMAL, "test double: QNN's validator judged optimal")

    monkeypatch.setattr(local_eps, "ort_judgement", judge)
    return asked


# --- 1. external data, QNN HTP with its context beside the model, and CPU ---------------------


@dataclass
class HtpFleet:
    """``dense`` (external data) compiled by ``epfleet compile`` for QNN HTP (its context
    beside the model) and for CPU into S3, and a device cache that ran the first sync."""

    uri: str
    bucket: Bucket
    htp: VariantEntry
    context: PackageFile
    htp_name: str
    cpu_name: str
    cache: Path
    good: bytes
    """The context binary's stored bytes, as compiled."""
    bad: bytes
    """The same with one byte flipped."""

    def tamper(self) -> None:
        self.bucket.write(self.context.uri, self.bad)

    def mend(self) -> None:
        self.bucket.write(self.context.uri, self.good)

    def variant_dirs(self) -> list[str]:
        return sorted(p.name for p in (self.cache / "models" / "dense").iterdir())


def htp_fleet(tmp_path: Path, s3_bucket: str, cli_env: dict[str, str]) -> HtpFleet:
    """Compile, then sync once with the device's real verdicts: QNN's validator raises on
    this host, so HTP is unsupported and the CPU variant is activated."""
    save_with_external_data(tmp_path / "src" / "dense.onnx")
    spec = write_spec(tmp_path, [{"name": "dense", "source": "src/dense.onnx"}], [HTP, CPU])
    uri = f"s3://{s3_bucket}/fleet"
    init_trust(uri, tmp_path / "keys", cli_env)
    report = compile_cli(spec, uri, cli_env)
    assert (report["compiled"], report["failed"]) == (2, 0), report
    bucket = Bucket(s3_bucket)
    manifest = bucket.manifest()
    htp, cpu = (manifest.models["dense"].variants[t] for t in ("htp", "cpu"))
    assert htp.artifact is not None and htp.digest is not None and cpu.digest is not None
    (context,) = [f for f in htp.files if f.path.endswith(".bin")]  # beside, not embedded
    assert context.size > 0
    good = bucket.read(context.uri)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size, other bytes
    fleet = HtpFleet(
        uri=uri,
        bucket=bucket,
        htp=htp,
        context=context,
        htp_name=f"htp-{htp.digest[:12]}",
        cpu_name=f"cpu-{cpu.digest[:12]}",
        cache=tmp_path / "device",
        good=good,
        bad=bytes(bad),
    )
    first = only(run_sync(uri, fleet.cache))
    assert (first.action, first.variant) == ("downloaded", fleet.cpu_name), first.reason
    assert {v.target: v.verdict for v in first.considered}["htp"] == Verdict.UNSUPPORTED
    return fleet


def test_a_qnn_context_beside_the_model_is_verified_per_file_and_activated(
    tmp_path: Path,
    s3_bucket: str,
    cli_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The device's verdict on the QNN string is a test double (``judge_qnn_optimal``,
    from the second sync on): QNN's validator raises on this x86 host. The health
    check is real: QNN's HTP backend runs the context binary on this CPU (eps/qnn.py,
    ``session_devices``), on the golden samples the compile published."""
    fleet = htp_fleet(tmp_path, s3_bucket, cli_env)
    uri, cache, htp, context = fleet.uri, fleet.cache, fleet.htp, fleet.context
    htp_name, cpu_name = fleet.htp_name, fleet.cpu_name

    # From here QNN strings judge optimal (the test double): HTP ranks first. Its context
    # binary in the store is tampered with (same key, same size, other bytes).
    asked = judge_qnn_optimal(monkeypatch)
    fleet.tamper()
    refused = only(run_sync(uri, cache))
    assert asked == [htp.compatibility_string]
    assert (refused.action, refused.variant) == ("kept", cpu_name), refused.reason
    assert f"download htp: {uri}/{context.uri} has sha256 {sha256_bytes(fleet.bad)}" in (
        refused.reason
    ), refused.reason
    assert "not activated" in refused.reason
    assert fleet.variant_dirs() == [cpu_name]
    assert list(package_variants(cache, "dense")) == [cpu_name]
    no_leftovers(cache)

    # The stored bytes mended: the HTP variant is downloaded, verified, checked, activated.
    fleet.mend()
    caplog.clear()  # the lines of the syncs before
    with caplog.at_level(logging.INFO, logger="epfleet.device.session"):
        done = only(run_sync(uri, cache))
    assert (done.action, done.variant, done.verdict) == ("downloaded", htp_name, "optimal"), (
        done.reason
    )
    assert done.bytes_downloaded == htp.total_size
    said = [r.getMessage() for r in caplog.records if "dense: downloaded" in r.getMessage()]
    assert said == [f"dense: downloaded {htp_name} ({format_bytes(htp.total_size)}): {done.reason}"]
    assert done.profile is not None  # QNN's HTP backend ran it on the golden sample
    directory = cache / "models" / "dense" / htp_name
    got = installed_files(directory)
    assert sorted(got) == sorted([htp.model_file, *(f.path for f in htp.files)])
    assert context.path in got and htp.model_file in got  # the context beside the model
    assert got == stored_files(fleet.bucket, htp)  # each equal to the store's bytes
    # The package lists it first (ORT's own selection picks no HTP variant on this host,
    # see the module's docstring; write_package then lists the active variant alone).
    listed = package_variants(cache, "dense")
    assert next(iter(listed)) == htp_name
    assert listed[htp_name]["variant_directory"] == f"models/dense/{htp_name}"
    assert listed[htp_name]["executor_info"] == {"ort": {"model_file": htp.model_file}}
    assert listed[htp_name]["ep"] == QNN
    state = DeviceCache(cache).load_state().models["dense"]
    assert state.active is not None and state.active.name == htp_name
    assert state.previous is not None and state.previous.name == cpu_name
    no_leftovers(cache)

    # Tampered again, and the device's copy of the context removed to force a download:
    # the changed variant is rolled back to the previous one, the download is refused.
    fleet.tamper()
    (directory / context.path).unlink()
    again = only(run_sync(uri, cache))
    assert (again.action, again.variant) == ("kept", cpu_name), again.reason
    rolled_back = f"active variant {htp_name} changed on disk; rolled back to {cpu_name}"
    assert rolled_back in again.reason, again.reason
    assert f"{uri}/{context.uri} has sha256" in again.reason
    assert list(package_variants(cache, "dense")) == [cpu_name]
    state = DeviceCache(cache).load_state().models["dense"]
    assert state.active is not None and state.active.name == cpu_name
    no_leftovers(cache)

    # Mended once more: the variant is fetched again whole, over what was left of it.
    fleet.mend()
    back = only(run_sync(uri, cache))
    assert (back.action, back.variant) == ("downloaded", htp_name), back.reason
    assert installed_files(directory) == got
    assert fleet.variant_dirs() == sorted([htp_name, cpu_name])


def test_a_damaged_variant_rolled_back_from_leaves_no_directory_behind(
    tmp_path: Path, s3_bucket: str, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same test double as above (QNN's verdict, from the second sync on)."""
    fleet = htp_fleet(tmp_path, s3_bucket, cli_env)
    judge_qnn_optimal(monkeypatch)
    assert only(run_sync(fleet.uri, fleet.cache)).variant == fleet.htp_name
    fleet.tamper()
    (fleet.cache / "models" / "dense" / fleet.htp_name / fleet.context.path).unlink()
    again = only(run_sync(fleet.uri, fleet.cache))
    assert (again.action, again.variant) == ("kept", fleet.cpu_name), again.reason
    state = DeviceCache(fleet.cache).load_state().models["dense"]
    assert state.active is not None and state.previous is None
    assert fleet.variant_dirs() == [fleet.cpu_name]  # the damaged htp-… directory is gone


# --- 2. a GenAI-style folder, and 3. the same compile and sync again ---------------------------


def cli_sync(store: str, cache: Path, env: dict[str, str]) -> dict:
    """``epfleet sync --store STORE --cache CACHE --json``; its device report."""
    command = ["sync", "--store", store, "--cache", str(cache), "--json", "--no-recompile"]
    command += ["--trust-root", str(provisioned_root(store))]
    done = subprocess.run(
        [sys.executable, "-m", "epfleet", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_genai_folder_arrives_whole_runs_and_a_second_run_moves_nothing(
    tmp_path: Path, s3_bucket: str, cli_env: dict[str, str]
) -> None:
    folder = genai_folder(tmp_path / "phi")
    spec = write_spec(tmp_path, [{"name": "phi", "source": "phi"}], [CPU])
    uri = f"s3://{s3_bucket}/fleet"
    init_trust(uri, tmp_path / "keys", cli_env)
    report = compile_cli(spec, uri, cli_env)
    assert (report["compiled"], report["failed"], report["generation"]) == (1, 0, 1), report
    bucket = Bucket(s3_bucket)
    manifest = bucket.manifest()
    source, variant = manifest.models["phi"].source, manifest.models["phi"].variants["cpu"]
    assert variant.digest is not None
    name = f"cpu-{variant.digest[:12]}"
    cache = tmp_path / "device"

    synced = cli_sync(uri, cache, cli_env)
    (model,) = synced["models"]
    assert (model["action"], model["variant"]) == ("downloaded", name), model["reason"]
    directory = cache / "models" / "phi" / name
    got = installed_files(directory)
    assert got == stored_files(bucket, variant)
    for path, data in SIDECARS.items():
        assert got[path] == data  # byte for byte
    assert got["model.onnx.data"] == (folder / "model.onnx.data").read_bytes()
    no_leftovers(cache)

    # An application with no epfleet code opens the package and gets the source's outputs.
    context = ort.ModelPackageContext(str(cache))
    chosen = context.select_component("phi", ort.ModelPackageOptions(ort.SessionOptions()))
    assert chosen.get_selected_variant_name() == name
    [y] = chosen.create_session().run(None, {"x": X})
    np.testing.assert_allclose(y, source_output(folder / "model.onnx"), rtol=1e-5, atol=1e-6)

    # Each sidecar is one object in the store, which the source and the variant both list.
    objects = {key: bucket.read(key.removeprefix("fleet/")) for key in bucket.objects()}
    for path, data in SIDECARS.items():
        (source_file,) = [f for f in source.files if f.path == path]
        (variant_file,) = [f for f in variant.files if f.path == path]
        assert source_file.uri == variant_file.uri
        assert [k for k, stored in objects.items() if stored == data] == [
            f"fleet/{source_file.uri}"
        ]

    # 3. The same compile again publishes nothing; the device's next sync moves 0 bytes.
    before = bucket.objects()
    again = compile_cli(spec, uri, cli_env)
    assert (again["compiled"], again["skipped"], again["generation"]) == (0, 1, 1), again
    assert bucket.objects() == before  # no object written, none replaced
    resynced = cli_sync(uri, cache, cli_env)
    (kept,) = resynced["models"]
    assert (kept["action"], kept["variant"], kept["bytes_downloaded"]) == ("kept", name, 0)
    timestamp = bucket.read("trust/metadata/timestamp.json")  # all a signed sync reads
    assert (resynced["manifest"]["status"], resynced["manifest"]["body_bytes"]) == (
        "unchanged",
        len(timestamp),
    )
    assert installed_files(directory) == got
