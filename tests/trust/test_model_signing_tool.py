"""The OpenSSF model-signing package's own command, ``model_signing verify key``, offline with
the store's public key, as a third party runs it (docs/how-to/verify-a-variant.md): it
accepts every variant the compile published and refuses one with a changed byte or an
extra file. A subprocess per check: the slow tier (tests/trust/test_model_signatures.py
checks the same in-process)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from epfleet.fleet.publishing.publish import read_in_force
from epfleet.formats.keys import MODEL_SIGNING_PUBLIC_KEY, signature_key
from epfleet.stores import open_store
from epfleet.stores.local import LocalStore
from epfleet.trust.keys import generate_online_file
from epfleet.trust.model_signatures import load_model_signer, sign_variant, signed_variants
from tests.support import multifile_store

pytestmark = pytest.mark.slow

TOOL = Path(sys.executable).with_name("model_signing")
"""The command the model-signing package installs beside this interpreter."""


def verify(model: Path, signature: Path, public_key: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TOOL, "verify", "key", model, "--signature", signature, "--public_key", public_key],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_model_signing_verify_accepts_every_published_variant_and_refuses_a_changed_byte(
    fleet_store: Path, tmp_path: Path
) -> None:
    manifest = read_in_force(open_store(str(fleet_store))).manifest
    variants = list(signed_variants(manifest))
    assert len(variants) >= 4
    public_key = fleet_store / MODEL_SIGNING_PUBLIC_KEY
    for _, _, variant in variants:
        assert variant.artifact is not None
        model = fleet_store / variant.artifact.uri
        done = verify(model, fleet_store / signature_key(variant.artifact.uri), public_key)
        assert done.returncode == 0, (model, done.stdout, done.stderr)
        assert "Verification succeeded" in done.stdout

    _, _, variant = variants[0]
    assert variant.artifact is not None
    changed = tmp_path / "model.onnx"
    shutil.copy(fleet_store / variant.artifact.uri, changed)
    data = bytearray(changed.read_bytes())
    data[100] ^= 0x01
    changed.write_bytes(bytes(data))
    done = verify(changed, fleet_store / signature_key(variant.artifact.uri), public_key)
    assert done.returncode != 0
    assert "Hash mismatch" in done.stdout + done.stderr


def test_model_signing_verify_refuses_an_extra_file_in_a_multi_file_variant(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "store")
    variant = multifile_store.publish(store, tmp_path, "gen").variants[multifile_store.TARGET]
    assert variant.artifact is not None
    signer = load_model_signer(generate_online_file(tmp_path / "signing.pem"), None)
    signature = tmp_path / "store" / sign_variant(store, signer, "gen", variant)
    public_key = tmp_path / "model-signing.pub"
    public_key.write_bytes(signer.public_pem)
    laid_out = tmp_path / "gen"
    wanted = [(variant.model_file, variant.artifact.uri)] + [(f.path, f.uri) for f in variant.files]
    for path, uri in wanted:
        (laid_out / path).parent.mkdir(parents=True, exist_ok=True)
        store.download(uri, laid_out / path)
    done = verify(laid_out, signature, public_key)
    assert done.returncode == 0, done.stdout + done.stderr

    (laid_out / "extra.onnx").write_bytes(b"not published")
    done = verify(laid_out, signature, public_key)
    assert done.returncode != 0
    assert "Extra files found" in done.stdout + done.stderr
