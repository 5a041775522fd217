"""The whole path of signed distribution: ``epfleet compile`` publishes to a store with
trust metadata (development keys made for a local store, or ``trust init`` on S3, moto
over HTTP), and a device that trusts only that root syncs and activates the variants."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.manifest import Manifest
from epfleet.stores import open_store
from epfleet.trust.client import verify
from tests.support.specs import CPU_TARGET, tiny_models, write_spec
from tests.support.trust_helpers import make_trusted_store

pytestmark = pytest.mark.slow


def compile_to(store: str, spec: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", store, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr


def served(report: DeviceReport) -> dict[str, str]:
    return {m.model: m.action for m in report.models if m.served}


def test_compile_on_a_local_store_makes_development_keys_a_device_trusts(
    tmp_path: Path, model_dir: Path, prefect_api: str
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store = tmp_path / "store"
    env = dict(os.environ, PREFECT_API_URL=prefect_api, EPFLEET_CACHE=str(tmp_path / "cache"))
    env.pop("EPFLEET_TRUST_SIGNER", None)

    compile_to(str(store), spec, env)

    root = tmp_path / "store.dev-keys" / "root.json"
    assert root.is_file() and not (store / "root.json").exists()
    report = sync(
        str(store),
        tmp_path / "device",
        SyncPolicy(),
        "trusting",
        trust_root=root,
        allow_unsigned=False,
    )
    assert report.exit_code == 0, report
    assert report.manifest.signed is True
    assert served(report) == {"tiny-cls": "downloaded", "tiny-det": "downloaded"}


def test_compile_on_a_trusted_s3_store_is_signed_for_devices(
    tmp_path: Path, model_dir: Path, prefect_api: str, s3_store_uri: str
) -> None:
    root = make_trusted_store(open_store(s3_store_uri), tmp_path / "keys", bins=16)
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    env = dict(
        os.environ,
        PREFECT_API_URL=prefect_api,
        EPFLEET_CACHE=str(tmp_path / "cache"),
        EPFLEET_TRUST_SIGNER=f"file2:{tmp_path / 'keys' / 'online.pem'}",
    )

    compile_to(s3_store_uri, spec, env)

    store = open_store(s3_store_uri)
    signed = verify(store, tmp_path / "check", root.read_bytes(), None)
    assert sorted(Manifest.from_json(signed.document).models) == ["tiny-cls", "tiny-det"]
    report = sync(
        s3_store_uri,
        tmp_path / "device",
        SyncPolicy(models=["tiny-cls"]),
        "trusting",
        trust_root=root,
        allow_unsigned=False,
    )
    assert report.exit_code == 0, report
    assert report.manifest.signed is True
    assert served(report) == {"tiny-cls": "downloaded"}
