"""Signing keys of signed distribution: the offline directory and the online signer.

The offline directory holds the private keys an operator keeps off the publishing hosts:
``root-1.pem`` .. ``root-N.pem`` (root, a threshold of them signs) and ``targets.pem``
(targets, which delegates the bins to the online key). Each is a PEM PKCS#8 ECDSA P-256
private key, mode 0600. Root keys replaced by ``rotate_root_keys`` move to
``retired/<root version>/``.

The online key (bins, snapshot, timestamp) is a securesystemslib signer URI
(``EPFLEET_TRUST_SIGNER``): ``file2:<path>`` in development, ``awskms:``, ``gcpkms:``,
``azurekms:`` or ``hv:`` in production. Its public key is the one the root delegates
``timestamp`` to, so the URI alone is enough to load it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import SIGNER_FOR_URI_SCHEME, CryptoSigner, Key, Signer, SSlibKey

from epfleet.errors import BadInputError
from epfleet.fsutil import fsync_dir

TARGETS_KEY_FILE = "targets.pem"
ONLINE_KEY = "online.pem"
RETIRED_DIR = "retired"
_ROOT_FILE = re.compile(r"^root-(\d+)\.pem$")


@dataclass(frozen=True)
class OfflineKeys:
    """The private keys of the offline directory."""

    directory: Path
    root: list[CryptoSigner]
    targets: CryptoSigner


def new_key() -> CryptoSigner:
    """A fresh ECDSA P-256 key (the scheme every cloud KMS signer supports)."""
    return CryptoSigner.generate_ecdsa()


def write_private_key(path: Path, signer: CryptoSigner) -> None:
    """``signer``'s private key as PEM at ``path``, created 0600 (never over a file)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(signer.private_bytes)
            f.flush()
            os.fsync(f.fileno())
        os.link(temp, path)  # fails when ``path`` exists: a key is never overwritten
    except FileExistsError:
        raise BadInputError(f"{path} already exists; not overwriting a private key") from None
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def read_private_key(path: Path) -> CryptoSigner:
    """The signer of a PEM private key file; BadInputError naming the file otherwise."""
    try:
        private = load_pem_private_key(path.read_bytes(), None)
        return CryptoSigner(private)
    except OSError as exc:
        raise BadInputError(f"cannot read private key {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise BadInputError(f"{path} is not a PEM PKCS#8 private key: {exc}") from None


def generate_offline(directory: Path, root_keys: int = 3) -> OfflineKeys:
    """Create ``root_keys`` root keys and a targets key in ``directory`` (which must not
    hold keys already)."""
    if root_keys < 1:
        raise BadInputError(f"--root-keys must be at least 1, not {root_keys}")
    check_holds_no_keys(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    root = [new_key() for _ in range(root_keys)]
    for number, signer in enumerate(root, start=1):
        write_private_key(directory / f"root-{number}.pem", signer)
    targets = new_key()
    write_private_key(directory / TARGETS_KEY_FILE, targets)
    return OfflineKeys(directory, root, targets)


def check_holds_no_keys(directory: Path) -> None:
    """BadInputError when ``directory`` holds keys already (a key is never overwritten)."""
    if _root_files(directory) or any(
        (directory / name).exists() for name in (TARGETS_KEY_FILE, ONLINE_KEY)
    ):
        raise BadInputError(
            f"--keys {directory} already holds keys; give an empty or new directory"
        )


def load_offline(directory: Path) -> OfflineKeys:
    """The root and targets keys of ``directory``; BadInputError when they are missing."""
    files = _root_files(directory)
    if not files:
        raise BadInputError(
            f"--keys {directory} holds no root keys (root-1.pem ...); it must be the "
            "directory epfleet trust init wrote"
        )
    root = [read_private_key(path) for path in files]
    return OfflineKeys(directory, root, read_private_key(directory / TARGETS_KEY_FILE))


def _root_files(directory: Path) -> list[Path]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    numbered = [(int(m.group(1)), name) for name in names if (m := _ROOT_FILE.match(name))]
    return [directory / name for _, name in sorted(numbered)]


def replace_root_keys(keys: OfflineKeys, new_root: list[CryptoSigner], version: int) -> None:
    """Move the directory's root key files to ``retired/<version>/`` and write ``new_root``
    as root-1.pem .. root-N.pem. The new keys are written to the retired folder's sibling
    first, so a crash leaves every key on disk."""
    incoming = keys.directory / f".incoming-{version}"
    for number, signer in enumerate(new_root, start=1):
        write_private_key(incoming / f"root-{number}.pem", signer)
    retired = keys.directory / RETIRED_DIR / str(version)
    retired.mkdir(parents=True, exist_ok=True, mode=0o700)
    for path in _root_files(keys.directory):
        os.replace(path, retired / path.name)
    for path in _root_files(incoming):
        os.replace(path, keys.directory / path.name)
    incoming.rmdir()
    fsync_dir(retired)
    fsync_dir(keys.directory)


def restore_root_keys(directory: Path, version: int) -> None:
    """Undo ``replace_root_keys`` when the root naming the new keys was not written: the
    new key files move to ``retired/<version>-unused/``, the old ones back in place."""
    unused = directory / RETIRED_DIR / f"{version}-unused"
    unused.mkdir(parents=True, exist_ok=True, mode=0o700)
    for path in _root_files(directory):
        os.replace(path, unused / path.name)
    for path in _root_files(directory / RETIRED_DIR / str(version)):
        os.replace(path, directory / path.name)
    fsync_dir(unused)
    fsync_dir(directory)


def generate_online_file(path: Path) -> str:
    """A new online key written to ``path`` (0600); its signer URI (``file2:<path>``)."""
    write_private_key(path, new_key())
    return file_uri(path)


def file_uri(path: Path) -> str:
    return f"file2:{path.resolve()}"


def check_signer_uri(uri: str) -> str:
    """The scheme of signer URI ``uri``; BadInputError with the fix when it has none
    securesystemslib knows (a bare key path: ``file2:`` + its path)."""
    scheme, colon, _ = uri.partition(":")
    if colon and scheme in SIGNER_FOR_URI_SCHEME:
        return scheme
    hint = (
        f"write a key file as file2:{Path(uri).resolve()}"
        if Path(uri).is_file()
        else f"known schemes: {', '.join(s + ':' for s in SIGNER_FOR_URI_SCHEME)}"
    )
    raise BadInputError(
        f"{uri!r} is not a signer URI (EPFLEET_TRUST_SIGNER, --online-signer): {hint}"
    )


def public_key_of(uri: str, public_key_pem: Path | None = None) -> Key:
    """The public key of the signer at ``uri``: read from the private key for ``file2:``,
    else from ``public_key_pem`` (a KMS gives its public key out of band)."""
    scheme = check_signer_uri(uri)
    if scheme == CryptoSigner.SCHEME:
        return read_private_key(Path(uri.partition(":")[2])).public_key
    if public_key_pem is None:
        raise BadInputError(
            f"signer {uri!r}: its public key is needed; give it as a PEM file (--online-public-key)"
        )
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        public = load_pem_public_key(public_key_pem.read_bytes())
    except (OSError, ValueError) as exc:
        raise BadInputError(f"--online-public-key {public_key_pem}: {exc}") from None
    return SSlibKey.from_crypto(public)


def online_signer(uri: str, public_key: Key, store_uri: str | None = None) -> Signer:
    """The signer at ``uri`` for ``public_key`` (the online key ``store_uri``'s root
    names); BadInputError with the fix otherwise: a bare key path gets ``file2:``, a key
    file of another key is said to be one."""
    where = f"{store_uri}'s online key" if store_uri else "the repository's online key"
    if check_signer_uri(uri) == CryptoSigner.SCHEME:
        try:
            given = read_private_key(Path(uri.partition(":")[2])).public_key
        except BadInputError as exc:
            raise BadInputError(f"EPFLEET_TRUST_SIGNER={uri!r}: {exc}") from None
        if given.keyid != public_key.keyid:
            raise BadInputError(
                f"EPFLEET_TRUST_SIGNER={uri!r} holds key {given.keyid[:12]}, not {where} "
                f"{public_key.keyid[:12]} (a root or targets key, or an online key since "
                "rotated?): set it to the online key's signer URI that epfleet trust init "
                "or rotate printed"
            )
    try:
        return Signer.from_priv_key_uri(uri, public_key)
    except Exception as exc:  # every signer backend raises its own errors
        raise BadInputError(
            f"EPFLEET_TRUST_SIGNER={uri!r} cannot sign for {where} {public_key.keyid[:12]}: {exc}"
        ) from None
