"""sha256 helpers: epfleet carries its own digests because S3 ETags are not content hashes."""

import hashlib
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> tuple[str, int]:
    """Return (hex digest, size) of a file, reading it in chunks."""
    with open(path, "rb") as f:
        return sha256_stream(f)


def sha256_stream(file: BinaryIO) -> tuple[str, int]:
    """Return (hex digest, size) of an open file from its position on, reading it in chunks."""
    digest = hashlib.sha256()
    size = 0
    while chunk := file.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def store_dir_name(store_uri: str) -> str:
    """The name of a directory of this machine's state about one store (its kept runs, its
    verification results): a digest of the store's canonical URI (``Store.uri``), so that
    what is kept for one store is never taken for another's."""
    return sha256_bytes(store_uri.encode())[:16]
