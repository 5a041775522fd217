"""The roots a device cache holds for a store, and the one a refresh starts from.

Every root version the device verified is kept in its trust directory's
``root_history/<version>.root.json``. A cached root is intact when it is root metadata of
the version its name says, signed by a threshold of its own root keys; anything else is
damaged (a truncated file, corrupted signatures) and is never started from.

A refresh starts from the newest cached root; when that one is damaged, from an older
intact one (ngclient then verifies the newer roots again from the store, and the device's
record of their sha256 catches a forged one: ``epfleet.trust.highwater``), or from a
``--trust-root`` that can be shown to be the same trust: a root whose signed part has the
sha256 the device recorded for its version, or one signed by the intact cached root
before it. Anything else is refused, naming the damaged file and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import Metadata, Root

from epfleet.errors import BadInputError
from epfleet.fsutil import read_nofollow
from epfleet.hashing import sha256_bytes
from epfleet.trust.directory import ROOT_HISTORY, is_root_name
from epfleet.trust.highwater import TrustMark


@dataclass(frozen=True)
class CachedRoot:
    """A root file of the trust directory's ``root_history``."""

    version: int
    path: Path
    data: bytes
    problem: str | None
    """Why it is damaged; None when it is intact."""


@dataclass(frozen=True)
class Start:
    """The root a refresh starts from, and what the device should be told about it."""

    root: bytes | None
    """None: the trust directory has no root to start from."""
    damaged: str | None = None
    """The newest cached root is damaged and nothing here heals it: why, with the fix."""
    note: str | None = None
    """A repair made on the way (started from an older root, or from ``--trust-root``)."""


def examine(data: bytes, version: int | None = None) -> str | None:
    """Why ``data`` is not an intact root (of ``version``, when given); None when it is."""
    try:
        metadata = Metadata[Root].from_bytes(data)
    except Exception as exc:  # python-tuf raises DeserializationError, or a TypeError within
        return f"not root metadata: {exc}"
    if not isinstance(metadata.signed, Root):
        return f"{metadata.signed.type} metadata, not root"
    if version is not None and metadata.signed.version != version:
        return f"holds root version {metadata.signed.version}, not {version}"
    try:
        metadata.signed.verify_delegate(Root.type, metadata.signed_bytes, metadata.signatures)
    except UnsignedMetadataError as exc:
        return f"its signatures do not verify: {exc}"
    except Exception as exc:  # a malformed key or signature
        return f"its signatures cannot be checked: {exc}"
    return None


def signed_sha256(data: bytes) -> str | None:
    """The sha256 of a root's signed part as canonical JSON (what its keys sign), the same
    for every copy of that root; None when ``data`` is not root metadata."""
    try:
        return sha256_bytes(Metadata[Root].from_bytes(data).signed_bytes)
    except Exception:
        return None


def root_version(data: bytes) -> int | None:
    try:
        return Metadata[Root].from_bytes(data).signed.version
    except Exception:
        return None


def cached_roots(directory: Path) -> list[CachedRoot]:
    """Every ``<version>.root.json`` of the trust directory's root history, oldest first
    (a link or a file that cannot be read counts as damaged)."""
    history = directory / ROOT_HISTORY
    try:
        names = [entry.name for entry in os.scandir(history)]
    except OSError:
        return []
    roots = []
    for name in names:
        if not is_root_name(name):
            continue
        number = name.removesuffix(".root.json")
        path = history / name
        try:
            data = read_nofollow(path)
        except OSError as exc:
            roots.append(CachedRoot(int(number), path, b"", f"cannot be read ({exc.strerror})"))
            continue
        roots.append(CachedRoot(int(number), path, data, examine(data, int(number))))
    return sorted(roots, key=lambda root: root.version)


def provisioned_root(directory: Path, given: Path | None, mark: TrustMark | None) -> Start:
    """The root a refresh of the trust directory starts from: the newest cached root, or
    ``given`` (``--trust-root``) when the cache has none yet or ``given`` is newer (a device
    provisioned again). When the newest cached root is damaged: an older intact one, or
    ``given`` if it is a root the device trusted (``mark``'s record) or chains to one.

    BadInputError when ``given`` cannot be read or is no valid root, is another root of a
    version the cache holds, or cannot be shown to be the trust a damaged cache held."""
    roots = cached_roots(directory)
    newest = roots[-1] if roots else None
    data = _read_given(given) if given is not None else None
    if newest is None:
        return Start(data)
    if newest.problem is None:
        return Start(_intact_or_given(directory, roots, given, data))
    damaged = f"the cached root {newest.path} is damaged ({newest.problem})"
    if given is None or data is None:
        older = [r for r in roots if r.problem is None and _as_recorded(r, mark)]
        if older:
            return Start(
                older[-1].data,
                note=f"{damaged}: started from the intact root version {older[-1].version} "
                "and verified the newer ones again from the store",
            )
        return Start(
            None,
            damaged=f"{damaged}: provision the device again with --trust-root (the root.json "
            "it was provisioned with; it is checked against the record in "
            f"{directory.parent.parent / 'state.json'})",
        )
    return Start(data, note=_heals(directory, roots, newest, damaged, given, data, mark))


def _read_given(given: Path) -> bytes:
    try:
        data = given.read_bytes()
    except OSError as exc:
        raise BadInputError(
            f"--trust-root {given}: cannot read it ({exc.strerror or exc})"
        ) from None
    problem = examine(data)
    if problem is not None:
        raise BadInputError(
            f"--trust-root {given} is not valid TUF root metadata ({problem}); pass the "
            "root.json written by epfleet trust init"
        )
    return data


def _intact_or_given(
    directory: Path, roots: list[CachedRoot], given: Path | None, data: bytes | None
) -> bytes:
    newest = roots[-1]
    if given is None or data is None:
        return newest.data
    version = root_version(data) or 0
    if version > newest.version:
        return data
    same = next((r for r in roots if r.version == version and r.problem is None), None)
    if same is not None and signed_sha256(same.data) != signed_sha256(data):
        raise BadInputError(
            f"--trust-root {given} (root version {version}) is not the root this device "
            f"already trusts ({directory / ROOT_HISTORY}); to trust another repository, "
            f"remove {directory} and sync again"
        )
    return newest.data


def _as_recorded(root: CachedRoot, mark: TrustMark | None) -> bool:
    """The root is what the device recorded for its version (or it recorded none)."""
    recorded = mark.roots.get(root.version) if mark is not None else None
    return recorded is None or recorded == signed_sha256(root.data)


def _heals(
    directory: Path,
    roots: list[CachedRoot],
    newest: CachedRoot,
    damaged: str,
    given: Path,
    data: bytes,
    mark: TrustMark | None,
) -> str:
    """What to report when ``given`` replaces a damaged cached root; BadInputError when it
    cannot be shown to be the same trust."""
    version = root_version(data) or 0
    if mark is not None and mark.roots.get(version) == signed_sha256(data):
        return (
            f"{damaged}: replaced from --trust-root {given}, root version {version}, whose "
            "sha256 is the one this device recorded when it verified it"
        )
    before = next((r for r in roots if r.version == version - 1 and r.problem is None), None)
    if before is not None and _as_recorded(before, mark) and signed_by(before.data, data):
        return (
            f"{damaged}: replaced from --trust-root {given}, root version {version}, signed "
            f"by the intact cached root version {before.version}"
        )
    raise BadInputError(
        f"{damaged}, and --trust-root {given} (root version {version}) cannot be shown to "
        "be the root this device trusted: neither the sha256 this device recorded for that "
        f"version nor signed by an intact cached root before it; to trust another "
        f"repository, remove {directory} and sync again"
    )


def signed_by(trusted: bytes, newer: bytes) -> bool:
    """``newer`` is the next root version after ``trusted`` and signed as TUF requires: by a
    threshold of ``trusted``'s root keys and of its own."""
    old = Metadata[Root].from_bytes(trusted)
    new = Metadata[Root].from_bytes(newer)
    if new.signed.version != old.signed.version + 1:
        return False
    try:
        old.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
        new.signed.verify_delegate(Root.type, new.signed_bytes, new.signatures)
    except Exception:  # UnsignedMetadataError, or a malformed key or signature
        return False
    return True
