"""The laundering attack, end to end: someone who can write to a signed store but holds no
key rewrites ``manifest.json`` to point a model at their own artifact (with the loosest
tolerance the manifest's rules allow) and uploads it; then the routine operations run as an operator runs
them: ``epfleet trust refresh``, ``epfleet compile`` of another model, and the
trust-refresh flow (the deployment's work) on a Prefect API. A device that trusts the
store's root syncs before and after: it keeps the genuine variant, and the attacker's is
never signed. On a local store and on S3 (moto over HTTP).

The store-level cases (every publishing entry point, forged bins, timestamp and signed
document) are in tests/trust/test_laundering.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport, ModelReport
from epfleet.formats.manifest import Manifest, Verification
from epfleet.hashing import sha256_bytes
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.trust.client import verify
from epfleet.trust.state import clear_cache
from flows.trust_refresh import trust_refresh
from tests.support.specs import CPU_TARGET, tiny_models, write_spec
from tests.support.synced_fleet import assert_package_runs, publish_to_s3, unsigned_copy
from tests.support.trust_helpers import make_trusted_store

pytestmark = pytest.mark.slow

MODEL, TARGET, DEVICE = "tiny-cls", "x86-cpu", "laundering-victim"


@pytest.fixture(params=["local", "s3"])
def signed_fleet(
    request: pytest.FixtureRequest,
    fleet_store: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, Path]:
    """The compiled fleet in a store signed by epfleet's publisher (trust init adopts its
    manifest), locally or on S3; EPFLEET_TRUST_SIGNER is its online key. Returns the
    store's URI and the root devices trust."""
    directory = unsigned_copy(fleet_store, tmp_path / "store")
    uri = str(directory)
    if request.param == "s3":
        uri = publish_to_s3(directory, request.getfixturevalue("s3_bucket"))
    keys = tmp_path / "keys"
    root = make_trusted_store(uri, keys)
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", f"file2:{keys / 'online.pem'}")
    return uri, root


def device_sync(uri: str, cache: Path, root: Path) -> ModelReport:
    report: DeviceReport = sync(uri, cache, SyncPolicy(models=[MODEL]), DEVICE, trust_root=root)
    assert report.exit_code == 0 and report.manifest.signed, report.manifest
    [result] = report.models
    return result


def plant_evil_variant(store: Store) -> str:
    """The attack: an artifact of the attacker's in the store, and manifest.json pointing
    MODEL's CPU variant at it with the loosest tolerances the rules allow. Returns its sha256."""
    found = store.read(MANIFEST_KEY)
    assert found is not None
    manifest = Manifest.from_json(found.data)
    variant = manifest.models[MODEL].variants[TARGET]
    assert variant.artifact is not None
    genuine = store.read(variant.artifact.uri)
    assert genuine is not None
    evil = onnx.load_from_string(genuine.data)
    evil.doc_string = "the attacker's build"
    data = evil.SerializeToString()
    digest = sha256_bytes(data)
    key = f"variants/{MODEL}/{TARGET}/{digest}.onnx"
    store.write(key, data)
    variant.artifact = variant.artifact.model_copy(
        update={"uri": key, "sha256": digest, "size": len(data)}
    )
    variant.verification = Verification(status="passed", tolerance=0.25, abs_tolerance=0.05)
    manifest.generation += 1
    store.write(MANIFEST_KEY, manifest.to_json())
    return digest


def run_cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epfleet", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("routine", ["trust-refresh", "compile-another-model", "refresh-flow"])
def test_routine_operations_never_sign_a_tampered_manifest_json(
    signed_fleet: tuple[str, Path],
    routine: str,
    tmp_path: Path,
    model_dir: Path,
    prefect_api: str,
) -> None:
    uri, root = signed_fleet
    cache = tmp_path / "device"
    genuine = device_sync(uri, cache, root)
    assert genuine.action == "downloaded", genuine.reason
    store = open_store(uri)
    evil = plant_evil_variant(store)
    env = dict(os.environ, PREFECT_API_URL=prefect_api, EPFLEET_CACHE=str(tmp_path / "cache"))

    if routine == "trust-refresh":
        done = run_cli(["trust", "refresh", "--store", uri], env)
        assert done.returncode == 0, done.stderr
        assert MODEL in done.stderr and "without the keys" in done.stderr, done.stderr
    elif routine == "compile-another-model":
        spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
        argv = ["compile", str(spec), "--store", uri, "--model", "tiny-det", "--force"]
        done = run_cli([*argv, "--json"], env)
        assert done.returncode == 0, done.stderr
        assert MODEL in done.stderr and "without the keys" in done.stderr, done.stderr
    else:
        assert trust_refresh(store=uri) is not None

    clear_cache()  # what follows reads the store as a new process would
    signed = verify(store, tmp_path / "check", root.read_bytes(), [MODEL]).document
    entry = Manifest.from_json(signed).models[MODEL].variants[TARGET]
    assert entry.artifact is not None and entry.artifact.sha256 != evil
    copy = store.read(MANIFEST_KEY)
    assert copy is not None and evil.encode() not in copy.data  # put right

    after = device_sync(uri, cache, root)
    assert after.action == "kept" and after.variant == genuine.variant, after.reason
    assert_package_runs(cache, {MODEL: genuine.variant or ""})
