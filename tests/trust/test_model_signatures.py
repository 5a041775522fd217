"""OpenSSF model signatures beside the TUF metadata: every published variant gets a Sigstore
bundle at ``<artifact key>.sig`` over its file (or its directory, for a multi-file
variant), checked in-process here as ``model_signing verify key`` checks it (the tool itself,
in a subprocess: tests/trust/test_model_signing_tool.py); gc keeps a signature with its
variant. S3 runs are end-to-end (slow tier)."""

from __future__ import annotations

import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.errors import BadInputError, MissingExtraError
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.formats.keys import MODEL_SIGNING_PUBLIC_KEY, signature_key
from epfleet.formats.manifest import Manifest
from epfleet.lifecycle.gc_rules import kind_of, plan_collection
from epfleet.stores import open_store
from epfleet.stores.base import StoredObject
from epfleet.stores.local import LocalStore
from epfleet.trust.keys import generate_online_file
from epfleet.trust.layout import development_keys_dir
from epfleet.trust.model_signatures import (
    DEVELOPMENT_KEY,
    load_model_signer,
    model_signer_for,
    sign_variant,
    signed_variants,
    verify_model,
    verify_published,
)
from tests.support import multifile_store
from tests.support.publish_helpers import publish_new
from tests.support.signed_fleet import Site, s3_site
from tests.support.synced_fleet import unsigned_copy
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast


def _manifest(store: str) -> Manifest:
    manifest = read_in_force(open_store(store)).manifest
    assert manifest is not None
    return manifest


def test_a_compile_signs_every_variant_it_publishes_with_the_development_key(
    fleet_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(str(fleet_store))
    manifest = _manifest(str(fleet_store))
    variants = list(signed_variants(manifest))
    assert len(variants) >= 4  # two models, HTP and CPU targets
    for _, _, variant in variants:
        assert variant.artifact is not None
        assert store.size(signature_key(variant.artifact.uri)), variant.artifact.uri
    keys_dir = fleet_store.with_name(fleet_store.name + ".dev-keys")
    signer = load_model_signer(f"file2:{keys_dir / DEVELOPMENT_KEY}", None)
    published = store.read(MODEL_SIGNING_PUBLIC_KEY)
    assert published is not None and published.data == signer.public_pem
    assert published.data.startswith(b"-----BEGIN PUBLIC KEY-----")

    checks = verify_published(store, manifest, published.data)
    assert [c.problem for c in checks] == [None] * len(variants)
    assert main(["verify-model", "--store", str(fleet_store)]) == 0
    out = capsys.readouterr().out
    assert out.count(": verified") == len(variants), out


def test_a_changed_byte_is_refused_and_another_key_does_not_verify(
    fleet_store: Path, tmp_path: Path
) -> None:
    store = open_store(str(fleet_store))
    _, _, variant = next(signed_variants(_manifest(str(fleet_store))))
    assert variant.artifact is not None
    bundle = store.read(signature_key(variant.artifact.uri))
    public = store.read(MODEL_SIGNING_PUBLIC_KEY)
    assert bundle is not None and public is not None
    copy = tmp_path / "model.onnx"
    store.download(variant.artifact.uri, copy)
    verify_model(copy, bundle.data, public.data)

    other = load_model_signer(generate_online_file(tmp_path / "other.pem"), None)
    with pytest.raises(BadInputError, match="Key mismatch"):
        verify_model(copy, bundle.data, other.public_pem)

    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))
    with pytest.raises(BadInputError, match=r"bytes differ from the signed sha256: the file$"):
        verify_model(copy, bundle.data, public.data)


def test_a_multi_file_variant_is_signed_as_its_directory(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    entry = multifile_store.publish(store, tmp_path, "gen")
    variant = entry.variants[multifile_store.TARGET]
    assert variant.files and variant.artifact is not None
    signer = load_model_signer(generate_online_file(tmp_path / "signing.pem"), None)
    key = sign_variant(store, signer, "gen", variant)
    assert key == variant.artifact.uri + ".sig"
    bundle = store.read(key)
    assert bundle is not None
    laid_out = tmp_path / "variant"
    for path, uri in [(variant.model_file, variant.artifact.uri)] + [
        (f.path, f.uri) for f in variant.files
    ]:
        (laid_out / path).parent.mkdir(parents=True, exist_ok=True)
        store.download(uri, laid_out / path)
    verify_model(laid_out, bundle.data, signer.public_pem)

    (laid_out / "extra.txt").write_text("not published\n")
    with pytest.raises(BadInputError, match=r"signature mismatch: extra files: extra.txt$"):
        verify_model(laid_out, bundle.data, signer.public_pem)
    (laid_out / "extra.txt").unlink()
    sidecar = laid_out / "tokenizer" / "vocab.txt"
    sidecar.write_text("hello\nw0rld\n")
    with pytest.raises(BadInputError, match=r"differ from the signed sha256: tokenizer/vocab.txt$"):
        verify_model(laid_out, bundle.data, signer.public_pem)
    sidecar.unlink()
    with pytest.raises(
        BadInputError, match=r"signature mismatch: missing files: tokenizer/vocab.txt$"
    ):
        verify_model(laid_out, bundle.data, signer.public_pem)


def test_gc_keeps_a_signature_while_its_variant_is_kept(fleet_store: Path) -> None:
    manifest = _manifest(str(fleet_store))
    _, _, variant = next(signed_variants(manifest))
    assert variant.artifact is not None
    kept = signature_key(variant.artifact.uri)
    gone = f"variants/tiny-cls/x86-cpu/{'0' * 64}.onnx.sig"  # of a variant no longer published
    assert kind_of(kept) == kind_of(gone) == "variant"
    now = datetime.now(timezone.utc)
    old = now - timedelta(days=10)
    manifest = manifest.model_copy(update={"published_at": old})
    objects = [StoredObject(kept, 100, old), StoredObject(gone, 100, old)]
    plan = plan_collection(objects, [], manifest, {}, now, timedelta(hours=1))
    assert [c.key for c in plan.candidates] == [gone]
    pinned = {gone.removesuffix("onnx.sig"): "device-1"}  # a device still runs that variant
    plan = plan_collection(objects, [], manifest, pinned, now, timedelta(hours=1))
    assert plan.candidates == [] and [k.key for k in plan.kept] == [gone]


@pytest.fixture(params=on_stores("local", "s3"))
def site(request: pytest.FixtureRequest, fleet_store: Path, tmp_path: Path) -> Site:
    """An unsigned copy of the compiled fleet without its model signatures: it gets them
    from ``epfleet trust sign-models``."""
    directory = unsigned_copy(fleet_store, tmp_path / "store")
    for signature in directory.glob("variants/**/*.sig"):
        signature.unlink()
    if request.param == "local":
        return Site(directory, str(directory), lambda: None)
    return s3_site(request, directory)


def test_sign_models_signs_a_store_and_rotates_its_key(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    site.push()
    store = open_store(site.uri)
    assert model_signer_for(store) is None  # no key set, none published: nothing to sign
    assert main(["verify-model", "--store", site.uri]) == 2
    assert "publishes no trust/model-signing.pub" in capsys.readouterr().err

    first = generate_online_file(tmp_path / "model-signing-1.pem")
    monkeypatch.setenv("EPFLEET_MODEL_SIGNER", first)
    assert main(["trust", "sign-models", "--store", site.uri]) == 0
    count = len(list(signed_variants(_manifest(site.uri))))
    assert f"signed {count} variants" in capsys.readouterr().out
    assert main(["verify-model", "--store", site.uri]) == 0
    old_public = tmp_path / "old.pub"
    old_public.write_bytes(load_model_signer(first, None).public_pem)

    second = generate_online_file(tmp_path / "model-signing-2.pem")
    monkeypatch.setenv("EPFLEET_MODEL_SIGNER", second)
    with pytest.raises(BadInputError, match="to rotate the model-signing key, run epfleet trust"):
        model_signer_for(store)  # a publish with another key is refused before it writes
    assert main(["trust", "sign-models", "--store", site.uri]) == 0
    assert model_signer_for(store) is not None
    assert main(["verify-model", "--store", site.uri]) == 0
    assert main(["verify-model", "--store", site.uri, "--public-key", str(old_public)]) == 1
    assert f"{count} of {count} variants do not match" in capsys.readouterr().err

    monkeypatch.delenv("EPFLEET_MODEL_SIGNER")
    with pytest.raises(BadInputError, match="EPFLEET_MODEL_SIGNER is not set"):
        model_signer_for(store)


def test_verify_model_refuses_a_variant_changed_in_the_store(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    site.push()
    monkeypatch.setenv("EPFLEET_MODEL_SIGNER", generate_online_file(tmp_path / "signing.pem"))
    assert main(["trust", "sign-models", "--store", site.uri]) == 0
    model, target, variant = next(signed_variants(_manifest(site.uri)))
    assert variant.artifact is not None
    changed = tmp_path / "changed.onnx"
    shutil.copy(site.directory / variant.artifact.uri, changed)
    data = bytearray(changed.read_bytes())
    data[-1] ^= 0x01
    open_store(site.uri).write(variant.artifact.uri, bytes(data))
    capsys.readouterr()
    assert main(["verify-model", "--store", site.uri, "--model", model, "--json"]) == 1
    out = capsys.readouterr().out
    assert f'"target": "{target}"' in out and "bytes differ from the signed sha256: the file" in out


def test_without_the_oms_extra_a_development_store_publishes_unsigned_models_and_says_so(
    fleet_store: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "model_signing", None)  # as if not installed
    store = open_store(str(fleet_store))
    with pytest.raises(MissingExtraError, match=r"pip install 'epfleet\[oms\]'"):
        model_signer_for(store)  # it publishes a model-signing key: refused, not skipped
    unsigned = LocalStore(fleet_store.parent / "unsigned-copy")
    unsigned_copy(fleet_store, unsigned.root)
    development_keys_dir(unsigned.root).mkdir()
    assert model_signer_for(unsigned) is None
    assert "publishing without OpenSSF model signatures" in caplog.text
    assert not (development_keys_dir(unsigned.root) / DEVELOPMENT_KEY).exists()


@pytest.fixture(params=on_stores("local", "s3"))
def empty_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return f"s3://{request.getfixturevalue('s3_bucket')}/fleet"


def test_each_publish_signs_the_variants_it_adds_and_one_without_the_key_publishes_nothing(
    empty_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_MODEL_SIGNER", generate_online_file(tmp_path / "signing.pem"))
    store = open_store(empty_store)
    publish_new(store, 0)
    first = store.read(signature_key(f"variants/model-0/cpu/{0:064x}.onnx"))
    assert first is not None and store.read(MODEL_SIGNING_PUBLIC_KEY) is not None
    publish_new(store, 1)
    assert store.read(signature_key(f"variants/model-1/cpu/{1:064x}.onnx")) is not None
    again = store.read(signature_key(f"variants/model-0/cpu/{0:064x}.onnx"))
    assert again is not None and again.data == first.data  # signed once, when it was added

    monkeypatch.delenv("EPFLEET_MODEL_SIGNER")  # (a local store's development key is another)
    with pytest.raises(BadInputError, match="EPFLEET_MODEL_SIGNER is not set"):
        publish_new(store, 2)
    assert sorted(_manifest(empty_store).models) == ["model-0", "model-1"]
    assert store.read(signature_key(f"variants/model-2/cpu/{2:064x}.onnx")) is None
