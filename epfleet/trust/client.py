"""The device side of signed distribution: verify a store's metadata with python-tuf's ngclient.

``verify`` refreshes the signed metadata into the store's trust directory of the device
cache (``epfleet.trust.directory``), fetching through ``StoreFetcher``
(``epfleet.trust.fetcher``), and returns the wanted models' entries from the signed custom
field ``epfleet`` of their targets (``models/<name>``), loading only the bins responsible
for them, or, for every model, the signed ``manifest.json`` target. Trust starts from a
root file the device is provisioned with (``--trust-root``), or the newest root the
cache verified (``epfleet.trust.roots``).

Every refresh is also held to the device's high-water mark of the repository, kept in
the cache's state (``epfleet.trust.updater``, ``epfleet.trust.highwater``): a root,
timestamp or snapshot older than what the device accepted before is refused before it is
written to the trust directory, so that a lost or emptied trust directory does not open
the way to a rollback.

Errors: ``MetadataRefused`` when the metadata does not verify (bad or missing
signatures, rollback, expired, mix-and-match, longer than signed, trickled, absent),
``StoreUnreachable`` when the store cannot be reached at all; a trust directory that
cannot be written raises the cache's ``CacheNotWritable`` or ``DiskFull``.

The device engine's names from the fetcher and the trust directory are gathered here
too (``__all__``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError
from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, SuccinctRoles, Targets
from tuf.ngclient import Updater

from epfleet.disk import cannot_write
from epfleet.errors import (
    BadInputError,
    MetadataRefused,
    StoreUnreachable,
)
from epfleet.formats.field_ranking import RANKED_MODELS, ModelRanking
from epfleet.formats.manifest import Manifest, ModelEntry
from epfleet.formats.schema_version import check_declared, validate_json, validate_python
from epfleet.fsutil import read_nofollow
from epfleet.settings import settings
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.stores.probe import store_absence
from epfleet.trust.directory import (
    ROOT_HISTORY,
    TARGETS_DIR,
    cached_expiry,
    cached_version,
    read_file,
    signed_version,
    trust_dir,
    trust_parts,
)
from epfleet.trust.fetcher import StoreFetcher, Unreachable
from epfleet.trust.highwater import Lineage, TrustMark, advanced
from epfleet.trust.layout import CUSTOM_FIELD, FOLDED_FIELD, METADATA_KEYS, SCHEMA_FIELD
from epfleet.trust.targets import joined_folded, ranking_target
from epfleet.trust.updater import (
    BelowHighWater,
    ForkedRoot,
    Judged,
    judge,
    open_updater,
    promote,
    staged,
)

__all__ = [
    "ROOT_HISTORY",
    "TARGETS_DIR",
    "BelowHighWater",
    "MetadataRefused",
    "StoreFetcher",
    "StoreUnreachable",
    "Verified",
    "cached_expiry",
    "cached_version",
    "describe",
    "model_target",
    "open_updater",
    "signed_entry",
    "trust_dir",
    "trust_parts",
    "verify",
]


def model_target(model: str) -> str:
    """The TUF target path of a model's entry."""
    return f"models/{model}"


@dataclass(frozen=True)
class Verified:
    """What a refresh verified: the manifest in force and how the refresh went."""

    document: bytes
    """The manifest in force, as JSON: the wanted models' signed entries (validated), or
    the signed manifest.json as it is (not validated yet)."""
    every_model: bool
    changed: bool
    """Anything but an unchanged timestamp was downloaded."""
    metadata_bytes: int
    version: int
    """The signed timestamp's version."""
    fetched: list[str]
    mark: TrustMark
    """The high-water mark once this refresh is accepted (without the manifest's
    generation, which the caller adds once it has validated the manifest)."""
    lineage: Lineage
    """How this refresh's root chain relates to the mark it was held to: ``new`` when
    the device was provisioned for another repository (the mark started again)."""
    rankings: dict[str, ModelRanking | str] = field(default_factory=dict)
    """Model -> its signed field ranking (``signed_ranking``), or why the one signed for
    it was refused; models with none are left out."""


def verify(
    store: Store,
    directory: Path,
    root: bytes,
    models: list[str] | None,
    mark: TrustMark | None = None,
) -> Verified:
    """Refresh the store's signed metadata into ``directory`` (a real directory of the
    device cache) from ``root``, held to the high-water ``mark``, then the entries of
    ``models`` (their bins only), or the signed manifest.json when ``models`` is None or
    empty.

    MetadataRefused when anything fails verification (BelowHighWater's message when it is
    older than the mark), StoreUnreachable when the store cannot be reached, BadInputError
    for a wanted model the signed metadata lacks, CacheNotWritable or DiskFull when the
    trust directory cannot be written."""
    before = read_file(directory / "timestamp.json")
    where = f"{store.uri}/{METADATA_KEYS}"
    fetcher = StoreFetcher(store)
    state_file = directory.parent.parent / "state.json"

    def refreshed(stage: Path) -> tuple[bytes, dict[str, ModelRanking | str], Judged]:
        started_from = signed_version(root) or 0
        try:
            updater = open_updater(fetcher, stage, root)
            updater.refresh()
            if models:
                wanted = list(dict.fromkeys(models))
                entries = {m: signed_entry(updater, store, m) for m in wanted}
                document = Manifest.model_construct(models=entries).to_json()
            else:
                document = _signed_manifest(updater, store, stage)
            rankings = {}
            succinct = _succinct(stage)
            for model in models or _ranked_models(updater, document):
                found = signed_ranking(updater, store, model, succinct)
                if found is not None:
                    rankings[model] = found
        except tuf_errors.RepositoryError:
            judge(stage, started_from, mark, state_file, roots_only=True)  # a fork first
            raise
        return document, rankings, judge(stage, started_from, mark, state_file)

    try:
        try:
            with staged(directory) as stage:
                document, rankings, judged = refreshed(stage)
                promote(stage, directory)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or _promoting(exc, directory):
                raise
            # the staging copy beside a full cache: refresh again staged elsewhere, so
            # that a refresh changing nothing still verifies (promote writes nothing)
            with staged(directory, elsewhere=True) as stage:
                document, rankings, judged = refreshed(stage)
                promote(stage, directory)
    except Unreachable as exc:
        raise StoreUnreachable(f"cannot refresh the signed metadata at {where}: {exc}") from None
    except tuf_errors.DownloadHTTPError as exc:
        absent = store_absence(store)  # a mistyped or removed store, named as such first
        raise MetadataRefused(
            str(absent)
            if absent is not None
            else f"{exc}: the store has no trust metadata there, or not all of it; refused "
            "(check --store, or publish with trust metadata: epfleet trust init)"
        ) from None
    except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
        raise MetadataRefused(f"{where}: {describe(exc)}") from None
    except OSError as exc:  # ngclient's own writes in the staging copy: a full disk, say
        raise cannot_write(Path(exc.filename or directory), exc) from None
    floor = mark if judged.lineage == "same" else None
    accepted = advanced(floor, judged.chain, judged.timestamp, judged.snapshot)
    after = read_file(directory / "timestamp.json")
    version = signed_version(after)
    others = [k for k in fetcher.fetched if not k.endswith("/timestamp.json")]
    return Verified(
        document=document,
        every_model=not models,
        changed=before != after or bool(others),
        metadata_bytes=fetcher.bytes,
        version=version if version is not None else 0,
        fetched=list(fetcher.fetched),
        mark=accepted,
        lineage=judged.lineage,
        rankings=rankings,
    )


def _promoting(exc: OSError, directory: Path) -> bool:
    """Whether ``exc`` came from writing the trust directory itself (not its staging copy)."""
    return exc.filename is not None and Path(exc.filename).parent.is_relative_to(directory)


def describe(exc: Exception) -> str:
    """What a TUF failure means for the device, with python-tuf's own words."""
    if isinstance(exc, BelowHighWater):
        kind = "a rollback"
    elif isinstance(exc, ForkedRoot):
        kind = "a root that is not the one this device verified before"
    elif isinstance(exc, tuf_errors.ExpiredMetadataError):
        kind = "expired signed metadata (a frozen or unrefreshed repository)"
    elif isinstance(exc, tuf_errors.BadVersionNumberError):
        kind = "signed metadata older than what this device trusts (rollback or mix-and-match)"
    elif isinstance(exc, tuf_errors.UnsignedMetadataError):
        kind = "metadata not signed by the trusted keys"
    elif isinstance(exc, tuf_errors.LengthOrHashMismatchError):
        kind = "metadata that is not the one its signed parent names (mix-and-match or tampered)"
    elif isinstance(exc, tuf_errors.DownloadLengthMismatchError):
        kind = "metadata longer than its signed or allowed length (endless data)"
    elif isinstance(exc, tuf_errors.SlowRetrievalError):
        kind = "metadata retrieval too slow (slow retrieval)"
    elif isinstance(exc, tuf_errors.RepositoryError):
        kind = "metadata that does not verify"
    else:
        kind = "metadata that could not be read"
    cause = exc.__cause__
    detail = f"{exc}: {cause}" if cause is not None and str(cause) not in str(exc) else str(exc)
    return f"{kind}: {detail or type(exc).__name__}; refused"


def signed_entry(updater: Updater, store: Store, model: str) -> ModelEntry:
    """The model's entry from its target's signed custom field (only its bin is loaded),
    validated; BadInputError when the signed metadata has no such model."""
    info = updater.get_targetinfo(model_target(model))
    if info is None:
        raise BadInputError(
            f"model {model!r} is not in the manifest: the signed metadata of {store.uri} "
            f"has no target {model_target(model)}"
        )
    custom = info.custom if isinstance(info.custom, dict) else {}
    value, version = custom.get(CUSTOM_FIELD), str(custom.get(SCHEMA_FIELD, "1.0"))
    try:
        # The entry follows the manifest's schema policy: a newer minor's unknown keys are
        # ignored, a newer major refused (see epfleet.formats.schema_version).
        check_declared(ModelEntry, version, "ignore")
        if FOLDED_FIELD in custom:
            value = _with_folded(model, store, value, custom[FOLDED_FIELD])
        # Canonical JSON, which TUF signs, has no floats (coverage, errors, tolerances): the
        # entry may come as its JSON text, or with its floats as strings (pydantic reads both).
        if isinstance(value, str):
            return validate_json(ModelEntry, value, "ignore", version)
        return validate_python(ModelEntry, value, "ignore", version)
    except ValidationError as exc:
        error = exc.errors()[0]
        at = ".".join(map(str, error["loc"])) or "custom." + CUSTOM_FIELD
        if error["type"] == "schema_version_newer":
            at = "custom." + SCHEMA_FIELD
        raise MetadataRefused(
            f"the signed entry of {model!r} at {store.uri} fails validation at {at}: {error['msg']}"
        ) from None


def _with_folded(model: str, store: Store, value: object, folded: object) -> object:
    """The signed entry with its folded variants (``FOLDED_FIELD``) back in it."""
    try:
        entry = json.loads(value) if isinstance(value, str) else value
        parts = json.loads(folded) if isinstance(folded, str) else folded
        if not isinstance(entry, dict):
            raise ValueError("the entry is not an object")
        return joined_folded(entry, parts)
    except ValueError as exc:
        raise MetadataRefused(
            f"the signed entry of {model!r} at {store.uri} has folded variants "
            f"(custom.{FOLDED_FIELD}) that cannot be read: {exc}"
        ) from None


def _succinct(directory: Path) -> SuccinctRoles | None:
    """The hashed bins the targets role just verified into ``directory`` delegates to."""
    raw = read_file(directory / "targets.json")
    if raw is None:
        return None
    targets = Metadata[Targets].from_bytes(raw)
    delegations = targets.signed.delegations
    return delegations.succinct_roles if delegations is not None else None


def signed_ranking(
    updater: Updater, store: Store, model: str, succinct: SuccinctRoles | None
) -> ModelRanking | str | None:
    """The model's field ranking from its signed target (``ranking_target``: in the bin of
    its entry, loaded and verified as every bin), validated; why it is refused when its
    content does not read; None when none is signed (or the repository has no bins). A
    refusal refuses the ranking only: the device orders its variants as it does with no
    evidence."""
    if succinct is None:
        return None
    where = f"{store.uri}: the signed field ranking of {model!r}"
    try:
        info = updater.get_targetinfo(ranking_target(model, succinct))
    except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
        return f"{where}: {describe(exc)}"
    if info is None:
        return None
    custom = info.custom if isinstance(info.custom, dict) else {}
    value = custom.get(CUSTOM_FIELD)
    try:
        if not isinstance(value, str):
            raise ValueError("it carries no ranking")
        ranking = ModelRanking.model_validate_json(value)
        if ranking.model != model:
            raise ValueError(f"it ranks model {ranking.model!r}")
    except (ValidationError, ValueError) as exc:
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        return f"{where} cannot be read: {detail}; refused"
    return ranking


def _ranked_models(updater: Updater, document: bytes) -> list[str]:
    """The models of the signed manifest.json (validated later, by the caller) that the
    signed list ``RANKED_MODELS`` says have a ranking: a device wanting every model loads
    that list's bin, then the bins of the ranked models only."""
    try:
        info = updater.get_targetinfo(RANKED_MODELS)
        value = info.custom.get(CUSTOM_FIELD) if info and isinstance(info.custom, dict) else None
        ranked = json.loads(value) if isinstance(value, str) else []
        models = json.loads(document).get("models")
    except (ValueError, AttributeError, tuf_errors.RepositoryError, tuf_errors.DownloadError):
        return []  # no list to trust: no ranking (the order without evidence)
    if not isinstance(models, dict) or not isinstance(ranked, list):
        return []
    return [m for m in ranked if isinstance(m, str) and m in models]


def _signed_manifest(updater: Updater, store: Store, directory: Path) -> bytes:
    info = updater.get_targetinfo(MANIFEST_KEY)
    if info is None:
        raise MetadataRefused(f"the signed metadata of {store.uri} has no {MANIFEST_KEY} target")
    limit = int(settings().max_manifest_bytes)
    if info.length > limit:
        raise MetadataRefused(
            f"the signed {MANIFEST_KEY} of {store.uri} is {info.length} bytes, over the limit "
            f"of {limit} (EPFLEET_MAX_MANIFEST_BYTES); not read"
        )
    path = directory / TARGETS_DIR / MANIFEST_KEY
    _no_link(path)  # ngclient writes the target with open(): never through a link
    found = updater.find_cached_target(info, str(path))
    if found is None:
        updater.download_target(info, str(path))
    return read_nofollow(path)


def _no_link(path: Path) -> None:
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(found.st_mode):
        if stat.S_ISDIR(found.st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)
