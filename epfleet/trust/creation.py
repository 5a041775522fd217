"""Creating a store's TUF repository: root, targets and its first signed state, from key files.

``init_repository`` signs with keys it is given; ``init_with_key_files`` makes them (the
offline directory, and an online key file unless a signer URI is given) and copies the
first root beside them (``ROOT_COPY``) for provisioning devices. A local store's
development keys live beside it (``development_keys_dir``), never inside it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError
from securesystemslib.signer import Signer
from tuf.api.metadata import Root

from epfleet.errors import BadInputError, PreconditionFailed, StoreError
from epfleet.formats.manifest import Manifest, referenced_keys
from epfleet.fsutil import atomic_write_bytes, fsync_dir
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.stores.local import local_path
from epfleet.trust.keys import (
    ONLINE_KEY,
    OfflineKeys,
    check_holds_no_keys,
    file_uri,
    generate_offline,
    generate_online_file,
    online_signer,
    public_key_of,
)
from epfleet.trust.layout import (
    DEFAULT_BINS,
    FIRST_ROOT_KEY,
    LIFETIME,
    ROOT_COPY,
    development_keys_dir,
    metadata_key,
    utcnow,
)
from epfleet.trust.pins import describe_pins, record_new_repository
from epfleet.trust.signing import publish_trust, sign_metadata
from epfleet.trust.state import has_trust
from epfleet.trust.targets import bin_bits, delegating_targets


def init_repository(
    store: Store,
    offline: OfflineKeys,
    online: Signer,
    *,
    root_threshold: int = 2,
    bins: int = DEFAULT_BINS,
    now: datetime | None = None,
    adopt: bool = False,
) -> bytes:
    """Create the signed metadata of ``store`` and sign its manifest.json, if any, only
    with ``adopt`` (an unsigned store's manifest becomes the first signed document: see
    ``check_initable``). Returns the root metadata (``1.root.json``) devices are
    provisioned with, recorded in the worker cache as the store's pinned root."""
    now = now or utcnow()
    bits = bin_bits(bins)
    if not 1 <= root_threshold <= len(offline.root):
        raise BadInputError(
            f"--root-threshold {root_threshold}: must be from 1 to the number of root keys "
            f"({len(offline.root)})"
        )
    adopted = check_initable(store, adopt=adopt)  # refused before anything is written
    root = Root(expires=now + LIFETIME["root"], consistent_snapshot=True)
    for signer in offline.root:
        root.add_key(signer.public_key, "root")
    root.roles["root"].threshold = root_threshold
    root.add_key(offline.targets.public_key, "targets")
    for role in ("snapshot", "timestamp"):
        root.add_key(online.public_key, role)
    targets = delegating_targets(1, online.public_key, bits, now)
    try:
        store.write(
            metadata_key("targets", 1),
            sign_metadata(targets, [offline.targets]),
            if_none_match=True,
        )
    except PreconditionFailed:
        raise BadInputError(
            f"{store.uri}/{metadata_key('targets', 1)} already exists: a trust init ran "
            "there before (and stopped); remove the store's trust/ folder to start again"
        ) from None
    raw_root = sign_metadata(root, offline.root)
    store.write(FIRST_ROOT_KEY, raw_root, if_none_match=True)
    record_new_repository(store, raw_root)  # before the first signed publish reads it
    publish_trust(store, online, (lambda _: adopted) if adopted else None, now=now)
    return raw_root


def check_initable(store: Store, *, adopt: bool) -> Manifest | None:
    """Refuse to create the signed metadata of a store that has it, or had it (a root is
    pinned for it: its trust metadata was removed, and what it holds now is signed by no
    one), or that holds an unsigned manifest unless ``adopt``; returns that manifest (to
    be signed as it is)."""
    if has_trust(store):
        raise BadInputError(
            f"{store.uri} already has trust metadata ({FIRST_ROOT_KEY}); rotate its keys "
            "with epfleet trust rotate instead"
        )
    pinned = describe_pins(store)
    if pinned is not None:
        raise BadInputError(
            f"{store.uri} was signed before ({pinned}) and its trust metadata "
            f"({FIRST_ROOT_KEY}) is gone: refusing to sign what it holds now; restore its "
            "trust/ from a backup (to give up that trust for good and start again, remove "
            "what pins it)"
        )
    adopted = _unsigned_manifest(store)
    if adopted is not None and not adopt:
        raise BadInputError(
            f"{store.uri}/{MANIFEST_KEY} is unsigned and trust init would sign it as it is: "
            f"{manifest_summary(adopted)}; check that this is what you published (epfleet "
            "manifest show), then run again with --adopt"
        )
    return adopted


def manifest_summary(manifest: Manifest) -> str:
    """What signing ``manifest`` vouches for, in one line: its models, variants, the store
    objects it names, its rollouts and enrolled device keys."""
    variants = [v for entry in manifest.models.values() for v in entry.variants.values()]
    ok = sum(1 for v in variants if v.status == "ok")
    rollouts = sorted(name for name, entry in manifest.models.items() if entry.rollout)
    return (
        f"{_counted(sorted(manifest.models), 'model')}, {len(variants)} variants ({ok} ok), "
        f"{len(referenced_keys(manifest))} store objects, {_counted(rollouts, 'rollout')}, "
        f"{_counted(sorted(manifest.device_keys), 'device key')}"
    )


def _counted(names: list[str], what: str, shown: int = 10) -> str:
    plural = what if len(names) == 1 else what + "s"
    if not names:
        return f"0 {plural}"
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} {plural} ({', '.join(names[:shown])}{more})"


def _unsigned_manifest(store: Store) -> Manifest | None:
    """The manifest an unsigned store published before ``trust init``: the operator who
    runs init vouches for it (``--adopt``), the only time a document read from the store is
    signed."""
    found = store.read(MANIFEST_KEY)
    if found is None:
        return None
    try:
        return Manifest.from_json(found.data)
    except ValidationError as exc:
        raise StoreError(
            f"{store.uri}/{MANIFEST_KEY} fails validation, refusing to publish over it or sign it: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


# --- development keys ------------------------------------------------------------------------


def development_root(store_uri: str) -> Path | None:
    """The root file a device trusts a local store's development keys with
    (``<store>.dev-keys/root.json``), when ``store_uri`` is a local store that has one."""
    if "://" in store_uri and not store_uri.startswith("file://"):
        return None
    root = development_keys_dir(Path(os.path.abspath(local_path(store_uri)))) / ROOT_COPY
    return root if root.is_file() else None


def init_with_key_files(
    store: Store,
    keys_dir: Path,
    *,
    online_uri: str | None = None,
    online_public_key: Path | None = None,
    root_keys: int = 3,
    root_threshold: int = 2,
    bins: int = DEFAULT_BINS,
    adopt: bool = False,
) -> tuple[Path, str]:
    """``init_repository`` with new offline keys written to ``keys_dir``, and a new online
    key file there too unless ``online_uri`` names one. Returns the root file for
    devices (``<keys_dir>/root.json``) and the online signer's URI.

    All or nothing: the keys are made in a staging directory beside ``keys_dir`` and moved
    into it only once the store's metadata is written; a failure before that (a missing
    bucket, a refused signer, Ctrl-C) removes them, so that the same command can be run
    again as it was."""
    check_initable(store, adopt=adopt)  # before any key is made
    bin_bits(bins)
    check_holds_no_keys(keys_dir)
    keys_dir = keys_dir.absolute()
    keys_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{keys_dir.name}.partial-", dir=keys_dir.parent))
    try:
        offline = generate_offline(staging, root_keys)
        if online_uri is None:
            staged_uri = generate_online_file(staging / ONLINE_KEY)
            signer = online_signer(staged_uri, public_key_of(staged_uri))
            online_uri = file_uri(keys_dir / ONLINE_KEY)
        else:
            signer = online_signer(online_uri, public_key_of(online_uri, online_public_key))
        raw_root = init_repository(
            store, offline, signer, root_threshold=root_threshold, bins=bins, adopt=adopt
        )
        atomic_write_bytes(staging / ROOT_COPY, raw_root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _move_keys(staging, keys_dir)
    return keys_dir / ROOT_COPY, online_uri


def _move_keys(staging: Path, keys_dir: Path) -> None:
    """The staged key files into ``keys_dir`` (renamed whole when it does not exist), each
    linked before it is unlinked: no file of ``keys_dir`` is overwritten."""
    if not keys_dir.exists():
        os.rename(staging, keys_dir)
        fsync_dir(keys_dir.parent)
        return
    for staged in staging.iterdir():
        os.link(staged, keys_dir / staged.name)
    fsync_dir(keys_dir)
    shutil.rmtree(staging)
