"""OpenSSF model signatures (the ``model-signing`` format) beside the TUF metadata, for
verifiers outside epfleet: a Sigstore bundle per published variant, signed with the
store's model-signing key, whose public key the store publishes as PEM.

Layout in the store:

- ``<artifact key>.sig``: the bundle of the variant whose main file is at the artifact
  key. For a single-file variant it covers that file alone (``model_signing verify key
  FILE``). For a multi-file variant it covers the variant's directory as a device lays
  it out: the main file at its ``model_file`` path and every ``files[].path`` beside it
  (``model_signing verify key DIRECTORY``).
- ``trust/model-signing.pub``: the public key (PEM, SubjectPublicKeyInfo).

The key is its own, not one of TUF's: ``EPFLEET_MODEL_SIGNER``, a securesystemslib
signer URI like ``EPFLEET_TRUST_SIGNER`` (``file2:`` or a KMS); a local store's
development keys get ``model-signing.pem`` beside the TUF ones. A bundle is made from the
sha256 the publisher verified and signs into the TUF metadata, so signing reads no model
bytes. The ``model-signing`` package (the ``oms`` extra) is imported only to sign and
verify.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import pathlib
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from securesystemslib.signer import CryptoSigner, Key, Signer, SSlibKey

from epfleet.errors import BadInputError, MissingExtraError
from epfleet.formats.keys import MODEL_SIGNING_PUBLIC_KEY, signature_key
from epfleet.formats.manifest import Manifest, VariantEntry
from epfleet.settings import settings
from epfleet.stores import Store
from epfleet.stores.local import LocalStore
from epfleet.trust.keys import check_signer_uri, read_private_key, write_private_key
from epfleet.trust.layout import development_keys_dir
from epfleet.trust.signers import DEVELOPMENT_LOCK

DEVELOPMENT_KEY = "model-signing.pem"
"""A local store's development model-signing key, beside its TUF development keys."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSigner:
    """The signer of a store's model signatures and its public key as PEM."""

    signer: Signer
    public_pem: bytes


def model_signer_for(store: Store) -> ModelSigner | None:
    """The key to sign ``store``'s new variants with: ``EPFLEET_MODEL_SIGNER``, or a local
    store's development key (made beside its TUF development keys, when those exist); None
    when neither is there and the store publishes no model-signing key. BadInputError when
    the store publishes one and nothing here can sign for it, or another key is set."""
    published = published_public_key(store)
    if settings().model_signer is None and published is None and not _installed():
        if _development_keys(store) is not None:
            logger.warning(
                "%s: publishing without OpenSSF model signatures (the model-signing package "
                "is not installed: python -m pip install 'epfleet[oms]')",
                store.uri,
            )
        return None
    uri = model_signer_uri(store)
    if uri is None:
        if published is not None:
            raise BadInputError(
                f"{store.uri} publishes model signatures ({MODEL_SIGNING_PUBLIC_KEY}) and "
                "EPFLEET_MODEL_SIGNER is not set: set it to the model-signing key's signer "
                "URI (e.g. EPFLEET_MODEL_SIGNER=file2:/path/to/model-signing.pem)"
            )
        return None
    if check_signer_uri(uri) != CryptoSigner.SCHEME and published is None:
        raise BadInputError(
            f"EPFLEET_MODEL_SIGNER={uri!r}: {store.uri} publishes no model-signing public "
            f"key yet; publish it and the first signatures with: epfleet trust sign-models "
            f"--store {store.uri} --public-key PEM"
        )
    signer = load_model_signer(uri, published)
    if published is not None and _pem_of(_load_pem(published)) != signer.public_pem:
        given = (
            f"EPFLEET_MODEL_SIGNER={uri!r}"
            if settings().model_signer is not None
            else f"EPFLEET_MODEL_SIGNER is not set and the development key {uri[6:]}"
        )
        raise BadInputError(
            f"{given} is not the key {store.uri}/{MODEL_SIGNING_PUBLIC_KEY} holds: set "
            "EPFLEET_MODEL_SIGNER to that key's signer URI; to rotate the model-signing key, "
            f"run epfleet trust sign-models --store {store.uri} with the new key set"
        )
    return signer


def model_signer_uri(store: Store) -> str | None:
    """``EPFLEET_MODEL_SIGNER``, else a local store's development key when it has
    development keys beside it (the key is made the first time), else None."""
    uri = settings().model_signer
    keys_dir = _development_keys(store)
    if uri is None and keys_dir is not None:
        uri = f"file2:{_development_key(keys_dir)}"
    return uri


def _development_keys(store: Store) -> Path | None:
    """The development keys beside a local store, when it has them."""
    if isinstance(store, LocalStore) and development_keys_dir(store.root).is_dir():
        return development_keys_dir(store.root)
    return None


def load_model_signer(uri: str, public_pem: bytes | None) -> ModelSigner:
    """The signer at ``uri``: a ``file2:`` key file brings its public key; any other signer
    (a KMS) needs ``public_pem``."""
    _check_installed()
    public: Key
    if check_signer_uri(uri) == CryptoSigner.SCHEME:
        try:
            public = read_private_key(Path(uri.partition(":")[2])).public_key
        except BadInputError as exc:
            raise BadInputError(f"EPFLEET_MODEL_SIGNER={uri!r}: {exc}") from None
    elif public_pem is None:
        raise BadInputError(f"EPFLEET_MODEL_SIGNER={uri!r}: give its public key (PEM)")
    else:
        public = _load_pem(public_pem)
    try:
        signer = Signer.from_priv_key_uri(uri, public)
    except Exception as exc:  # every signer backend raises its own errors
        raise BadInputError(f"EPFLEET_MODEL_SIGNER={uri!r} cannot sign: {exc}") from None
    return ModelSigner(signer, _pem_of(public))


def published_public_key(store: Store) -> bytes | None:
    found = store.read(MODEL_SIGNING_PUBLIC_KEY)
    return None if found is None else found.data


def publish_public_key(store: Store, signer: ModelSigner) -> None:
    """Write the public key into the store, unless it holds it already."""
    if published_public_key(store) != signer.public_pem:
        store.write(MODEL_SIGNING_PUBLIC_KEY, signer.public_pem)


def signed_variants(manifest: Manifest | None) -> Iterator[tuple[str, str, VariantEntry]]:
    """Every variant a signature is kept for: each ok one with an artifact, and a
    rollout's way back."""
    for name, entry in (manifest.models if manifest else {}).items():
        kept = {f"{t} (previous)": v for t, v in entry.previous.items() if v is not None}
        for target, variant in {**entry.variants, **kept}.items():
            if variant.status == "ok" and variant.artifact is not None:
                yield name, target, variant


def sign_variant(store: Store, signer: ModelSigner, model: str, variant: VariantEntry) -> str:
    """Write the bundle of ``variant`` at ``<artifact key>.sig``; its key."""
    assert variant.artifact is not None
    key = signature_key(variant.artifact.uri)
    store.write(key, bundle_for(signer, model, variant))
    return key


def signing_new_variants(
    store: Store, signer: ModelSigner, change: Callable[[Manifest | None], Manifest | None]
) -> Callable[[Manifest | None], Manifest | None]:
    """``change``, and then a signature for every variant it adds (by artifact key), written
    before the manifest that publishes them."""

    def signed(current: Manifest | None) -> Manifest | None:
        changed = change(current)
        if changed is None:
            return None
        before = {v.artifact.uri for _, _, v in signed_variants(current) if v.artifact}
        for model, _, variant in signed_variants(changed):
            if variant.artifact is not None and variant.artifact.uri not in before:
                sign_variant(store, signer, model, variant)
        publish_public_key(store, signer)
        return changed

    return signed


def bundle_for(signer: ModelSigner, model: str, variant: VariantEntry) -> bytes:
    """The Sigstore bundle (JSON) of ``variant``, as ``model_signing sign key`` makes it for
    the variant's file or directory, from the sha256 digests the manifest holds."""
    from google.protobuf import json_format
    from model_signing import manifest as ms_manifest
    from model_signing._hashing.hashing import Digest
    from model_signing._signing import sign_sigstore_pb, signing
    from sigstore_models import intoto as intoto_pb
    from sigstore_models.bundle import v1 as bundle_pb
    from sigstore_models.common import v1 as common_pb

    assert variant.artifact is not None
    if variant.files:
        listed = [(variant.model_file, variant.artifact.sha256)]
        listed += [(f.path, f.sha256) for f in variant.files]
    else:
        listed = [(".", variant.artifact.sha256)]  # a file is "." relative to itself
    items = [
        ms_manifest.FileManifestItem(
            path=pathlib.PurePosixPath(path), digest=Digest("sha256", bytes.fromhex(sha256))
        )
        for path, sha256 in listed
    ]
    serialization = ms_manifest._FileSerialization("sha256")
    statement = signing.Payload(ms_manifest.Manifest(model, items, serialization)).statement
    raw_payload = json_format.MessageToJson(statement.pb).encode()
    signature = signer.signer.sign(sign_sigstore_pb.pae(raw_payload))
    envelope = intoto_pb.Envelope(
        payload=base64.b64encode(raw_payload),
        payload_type=signing._IN_TOTO_JSON_PAYLOAD_TYPE,
        signatures=[
            intoto_pb.Signature(sig=base64.b64encode(bytes.fromhex(signature.signature)), keyid="")
        ],
    )
    hint = hashlib.sha256(signer.public_pem).hexdigest()
    bundle = bundle_pb.Bundle(
        media_type=sign_sigstore_pb._BUNDLE_MEDIA_TYPE,  # type: ignore[arg-type]
        verification_material=bundle_pb.VerificationMaterial(
            public_key=common_pb.PublicKeyIdentifier(hint=hint), tlog_entries=[]
        ),
        dsse_envelope=envelope,
    )
    return bundle.to_json().encode()


def verify_model(model_path: Path, bundle: bytes, public_pem: bytes) -> None:
    """Check ``model_path`` (a variant's file or directory) against its bundle with the
    public key, as ``model_signing verify key`` does; BadInputError saying why not."""
    _check_installed()
    from model_signing import verifying

    with tempfile.TemporaryDirectory(prefix="epfleet-oms-") as scratch:
        bundle_path = Path(scratch, "bundle.sig")
        key_path = Path(scratch, "model-signing.pub")
        bundle_path.write_bytes(bundle)
        key_path.write_bytes(public_pem)
        try:
            verifying.Config().use_elliptic_key_verifier(public_key=key_path).verify(
                model_path, bundle_path
            )
        except Exception as exc:  # model_signing raises ValueError and crypto errors alike
            raise BadInputError(f"{model_path}: {_reason(exc)}") from None


@dataclass(frozen=True)
class VariantCheck:
    """One published variant's model signature, checked: ``problem`` None when it verified."""

    model: str
    target: str
    signature: str
    problem: str | None


def verify_published(
    store: Store,
    manifest: Manifest,
    public_pem: bytes,
    models: list[str] | None = None,
) -> list[VariantCheck]:
    """Download each published variant of ``models`` (every model when None) laid out as a
    device lays it out, with its ``.sig``, and verify it with ``public_pem`` as
    ``model_signing verify key`` does."""
    checks = []
    for model, target, variant in signed_variants(manifest):
        if models is not None and model not in models:
            continue
        assert variant.artifact is not None
        key = signature_key(variant.artifact.uri)
        bundle = store.read(key)
        problem = None
        if bundle is None:
            problem = f"{key} is missing"
        else:
            with tempfile.TemporaryDirectory(prefix="epfleet-oms-") as scratch:
                try:
                    local = _download_variant(store, variant, Path(scratch))
                    verify_model(local, bundle.data, public_pem)
                except BadInputError as exc:
                    problem = str(exc).partition(": ")[2] or str(exc)
        checks.append(VariantCheck(model, target, key, problem))
    return checks


def sign_all(store: Store, signer: ModelSigner, manifest: Manifest | None) -> list[str]:
    """Sign every variant ``manifest`` keeps, then publish the public key: how a store
    gets its first model signatures, and how a new key replaces the old one. Returns the
    signature keys written."""
    written = [sign_variant(store, signer, model, v) for model, _, v in signed_variants(manifest)]
    store.write(MODEL_SIGNING_PUBLIC_KEY, signer.public_pem)
    return written


def _download_variant(store: Store, variant: VariantEntry, scratch: Path) -> Path:
    """The variant's file (single-file) or directory (multi-file) under ``scratch``."""
    from epfleet.formats.keys import files_key

    assert variant.artifact is not None
    if not variant.files:
        path = scratch / "model.onnx"
        store.download(variant.artifact.uri, path)
        return path
    directory = scratch / "variant"
    wanted = [(variant.model_file, variant.artifact.uri)]
    wanted += [(f.path, files_key(f.sha256)) for f in variant.files]
    for relative, key in wanted:
        dest = directory / relative
        dest.parent.mkdir(parents=True, exist_ok=True)
        store.download(key, dest)
    return directory


def _reason(exc: Exception) -> str:
    """Why model_signing refused, in a line: the files that differ from the signed ones,
    the extra and the missing (its own message quotes digests as Python bytes)."""
    text = str(exc) or type(exc).__name__
    if type(exc).__name__ == "InvalidSignature":
        return "the signature does not verify with this public key"
    if not text.startswith("Signature mismatch"):
        return text
    found = []
    changed = re.findall(r"Hash mismatch for \\?'([^'\\]*)\\?'", text)
    if changed:
        names = ", ".join("the file" if name == "." else name for name in changed)
        found.append(f"bytes differ from the signed sha256: {names}")
    for what in ("Extra files", "Missing files"):
        listed = re.search(what + r" (?:found )?in model [^:]*: ([^\]\"]*?)\\?['\"]", text)
        if listed:
            found.append(f"{what.lower()}: {listed.group(1)}")
    return "signature mismatch: " + "; ".join(found) if found else text


def _development_key(keys_dir: Path) -> Path:
    """The development model-signing key in ``keys_dir``, made by the first publisher that
    needs it (under the development keys' lock: concurrent publishers wait for it)."""
    path = keys_dir / DEVELOPMENT_KEY
    if path.is_file():
        return path
    with open(keys_dir / DEVELOPMENT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            write_private_key(path, CryptoSigner.generate_ecdsa())
    return path


def _load_pem(data: bytes) -> Key:
    try:
        return SSlibKey.from_crypto(load_pem_public_key(data))
    except (ValueError, TypeError) as exc:
        raise BadInputError(f"not a PEM public key ({MODEL_SIGNING_PUBLIC_KEY}): {exc}") from None


def _pem_of(key: Key) -> bytes:
    assert isinstance(key, SSlibKey)
    public = load_pem_public_key(key.keyval["public"].encode())
    return public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


def _installed() -> bool:
    try:
        import model_signing  # noqa: F401
    except ImportError:
        return False
    return True


def _check_installed() -> None:
    if not _installed():
        raise MissingExtraError(
            "model signatures need the model-signing package: python -m pip install 'epfleet[oms]'"
        ) from None
