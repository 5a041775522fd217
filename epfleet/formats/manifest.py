"""The fleet manifest: what has been compiled, for which EP, with which compatibility string.

Pure logic: the pydantic model, its JSON Schema, and how a compile run's results
merge into a manifest. Field names follow ORT's model package manifest where
they overlap (``ep``, ``device``, ``compatibility_string``, ``variants``).
All URIs are keys relative to the store root.

``schema_version`` is "MAJOR.MINOR" (``SCHEMA_VERSION``): a minor bump adds fields an older
reader may safely ignore, anything an older device must not ignore bumps the major.
Readers (``from_json(newer_minor="ignore")``) drop the unknown keys of a newer minor and
refuse a newer major; at their own minor an unknown key stays an error. Writers refuse
anything newer. See ``epfleet.formats.schema_version``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from epfleet.formats import schema_version as compat
from epfleet.formats.rollout import Rollout, is_member
from epfleet.formats.variant_checks import (
    Coverage,
    FailedBuild,
    FoldedIo,
    PrecisionTried,
    Quantization,
    Verification,
)
from epfleet.hashing import sha256_bytes
from epfleet.stores.base import check_key
from eps.base import Precision

# Bump whenever validation changes: a device then re-fetches, and so re-validates, the
# manifest it cached under the older rules instead of trusting it, and fetches again one it
# rejected under them. 6: verification tolerances bounded by eps.base.LOOSEST_TOLERANCE.
# 7: a newer minor schema's unknown keys ignored (epfleet.formats.schema_version).
# 8: a rollout policy bounded as a spec's, canary ids device ids, a rollout's stage one of its
# policy's, folded_io lists and a file set's files bounded (epfleet.formats.rollout,
# epfleet.formats.variant_checks, MAX_FILES).
VALIDATION_RULES = "8"

SHA256_PATTERN = r"^[0-9a-f]{64}$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
NAME_MAX_LENGTH = 100
"""Model and target names become directory names (a variant's is the target's plus 13
characters): well under the 255 bytes a file name may take."""
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH)]
LARGEST_INT = 2**63 - 1
"""Sizes and generations fit a signed 64-bit integer (what file offsets and S3 take)."""
"""Model and target names: safe as file and directory names on every device."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArtifactRef(_Strict):
    uri: str = Field(description="Key of the file, relative to the store root")
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0, le=LARGEST_INT)

    @field_validator("uri")
    @classmethod
    def _inside_the_store(cls, uri: str) -> str:
        return check_key(uri)


MODEL_FILE = "model.onnx"
"""The main ONNX file's name in a single-file source's or variant's directory."""
FILE_PATH_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*$"
"""A file's path inside a variant directory: relative POSIX, no empty, hidden, ``.`` or
``..`` component (a device creates these names)."""
FILE_PATH_MAX_LENGTH = 200
MAX_FILES = 10_000
"""The most files beside a main ONNX file (a GenAI model folder has tens)."""


class PackageFile(ArtifactRef):
    """One file beside the main ONNX file of a multi-file source or variant."""

    path: str = Field(
        pattern=FILE_PATH_PATTERN,
        max_length=FILE_PATH_MAX_LENGTH,
        description="Path relative to the main ONNX file's directory, e.g. model.onnx.data",
    )


class FileSet(_Strict):
    """A main ONNX file (``model_file``) and the files that must sit beside it. Both are
    left out of the JSON when they are the single-file defaults, so single-file entries
    (and their signed bytes) stay as they were."""

    model_file: str = Field(
        default=MODEL_FILE,
        exclude_if=lambda path: path == MODEL_FILE,
        pattern=FILE_PATH_PATTERN,
        max_length=FILE_PATH_MAX_LENGTH,
        description="The main ONNX file's path in the directory (a GenAI config names it)",
    )
    files: list[PackageFile] = Field(
        default_factory=list,
        exclude_if=lambda files: not files,
        max_length=MAX_FILES,
        description="Files beside the main one: external data, EP contexts, sidecars",
    )

    @model_validator(mode="after")
    def _distinct_paths(self) -> FileSet:
        if not self.files:  # one path alone: nothing to clash with (most entries)
            return self
        paths = [self.model_file] + [f.path for f in self.files]
        folded = [path.lower() for path in paths]
        if len(set(folded)) != len(folded):
            raise ValueError(f"file paths must be distinct (ignoring case): {paths}")
        dirs = {path[:i] for path in folded for i, char in enumerate(path) if char == "/"}
        if clash := sorted(dirs & set(folded)):
            raise ValueError(f"{clash[0]!r} is both a file and a directory")
        return self


def set_digest(main: ArtifactRef, model_file: str, files: list[PackageFile]) -> str:
    """One sha256 for a main file and the files beside it: the main file's own sha256 when
    it stands alone (so single-file digests are unchanged), else a hash of the sorted
    listing of (path, sha256, size)."""
    if not files:
        return main.sha256
    listing = sorted([[f.path, f.sha256, f.size] for f in files])
    listing.insert(0, [model_file, main.sha256, main.size])
    return sha256_bytes(json.dumps(listing, separators=(",", ":")).encode())


class SourceEntry(FileSet, ArtifactRef):
    """A model's source: ``uri``/``sha256``/``size`` are its main ONNX file's."""

    input_shapes: dict[str, list[int]] = Field(default_factory=dict)

    @property
    def digest(self) -> str:
        """The whole source's identity (what fingerprints and device builds key on)."""
        return set_digest(self, self.model_file, self.files)

    @property
    def total_size(self) -> int:
        return self.size + sum(f.size for f in self.files)


class SamplesRef(ArtifactRef):
    """A model's golden samples: inputs and the source's outputs on the CPU EP (``.npz``)."""

    count: int = Field(ge=1, description="How many samples it holds")
    basis: str = Field(
        description="Hash of what made it (source, input shapes, the spec's samples file)"
    )
    metric_inputs: ArtifactRef | None = Field(
        default=None,
        exclude_if=lambda ref: ref is None,
        description="The calibration and verification inputs a named task metric, or the "
        "default for class scores, is also judged on, with the source's outputs for them "
        "(schema 1.7)",
    )


class DeltaRef(ArtifactRef):
    """A binary delta (``epfleet.deltas``, zstd patch-from) that turns a variant file a
    device may hold, ``base_sha256``, into this variant's main file: a device holding that
    file downloads this instead and checks what it makes against the variant's artifact."""

    base_sha256: str = Field(pattern=SHA256_PATTERN, description="The file it applies to")


MAX_DELTA_SIZE = 256 << 20
"""The largest file a delta is made for or applied to: making one holds the base, the file
and zstd's window over both in memory, and a device applying one holds the base and the
result (larger variants are downloaded whole)."""
MAX_DELTAS = 16
"""The most deltas one variant lists (the bases a publisher makes them from are a few)."""


class VariantRuntime(BaseModel):
    """The runtime environment a variant was built and verified under (the spec's
    ``runtimes``): the onnxruntime and EP package a device must run for it to be this
    variant's first choice."""

    name: Name
    onnxruntime: str = Field(max_length=64)
    ep_package: str = Field(max_length=100)
    ep_version: str = Field(max_length=64)
    sdk_version: str | None = Field(
        default=None,
        max_length=64,
        exclude_if=lambda sdk: sdk is None,
        description="The vendor SDK release the EP built it with, where its compatibility "
        "string names one (QNN: the QAIRT version, e.g. 2.51.0); None: the EP names none "
        "(schema 1.8)",
    )


class VariantEntry(FileSet):
    """One compiled variant. ``artifact`` is its main ONNX file (it carries the
    compatibility string); ``files`` sit beside it in the variant's directory."""

    ep: str
    device: Literal["cpu", "gpu", "npu"]
    compatibility_string: str | None = None
    provider_options: dict[str, str] = Field(default_factory=dict)
    artifact: ArtifactRef | None = None
    ort_version: str
    ep_version: str | None = None
    compiled_at: datetime
    status: Literal["ok", "failed"]
    error: str | None = None
    source_sha256: str = Field(pattern=SHA256_PATTERN, description="Source this was built from")
    fingerprint: str = Field(
        description="Hash of everything that decides the artifact; unchanged means up to date"
    )
    coverage: Coverage | None = None
    verification: Verification | None = None
    failed_build: FailedBuild | None = Field(
        default=None,
        exclude_if=lambda build: build is None,
        description="The newest compile for other inputs, which failed (this build stays)",
    )
    precision: Precision | None = Field(
        default=None,
        exclude_if=lambda precision: precision is None,
        description="What the variant computes in (None: recorded before precisions were)",
    )
    precision_tried: list[PrecisionTried] = Field(
        default_factory=list,
        exclude_if=lambda tried: not tried,
        description="Precisions of the target's ladder tried first, and why each lost",
    )
    runtime: VariantRuntime | None = Field(
        default=None,
        exclude_if=lambda runtime: runtime is None,
        description="The spec's runtime it was built under; None: the compile host's own "
        "onnxruntime and EP package (ort_version, ep_version)",
    )
    quantization: Quantization | None = Field(
        default=None,
        exclude_if=lambda quantization: quantization is None,
        description="How an integer variant's QDQ model was made",
    )
    folded_io: FoldedIo | None = Field(
        default=None,
        exclude_if=lambda folded: folded is None,
        description="The integer inputs and outputs of a variant compiled with its boundary "
        "Quantize/Dequantize folded away (the target's fold_io): feed it quantised inputs "
        "and dequantise its outputs with these scales and zero points (schema 1.4; a 1.3 "
        "device never sees such a variant in the signed metadata)",
    )

    deltas: list[DeltaRef] = Field(
        default_factory=list,
        exclude_if=lambda deltas: not deltas,
        max_length=MAX_DELTAS,
        description="Binary deltas to the main file from files devices may hold (the "
        "previous build, the version a rollout replaces, the target under another runtime), "
        "each under half the file's size (schema 1.8; an older device ignores them and "
        "downloads the whole file)",
    )

    @model_validator(mode="after")
    def _status_fields(self) -> VariantEntry:
        if self.status == "ok" and (self.artifact is None or not self.compatibility_string):
            raise ValueError("an ok variant needs an artifact and a compatibility_string")
        if self.status == "failed" and not self.error:
            raise ValueError("a failed variant needs an error")
        return self

    @property
    def digest(self) -> str | None:
        """The variant's identity: its artifact's sha256, or its file set's digest."""
        if self.artifact is None:
            return None
        return set_digest(self.artifact, self.model_file, self.files)

    @property
    def total_size(self) -> int:
        return (self.artifact.size if self.artifact else 0) + sum(f.size for f in self.files)

    def same_build(self, other: VariantEntry) -> bool:
        """Equal but for when it was compiled and how long its checks took (or whether they
        were reused): publishing it again would change nothing."""
        ignore: dict[str, object] = {
            "compiled_at": True,
            "verification": {"seconds", "reused"},
            "deltas": True,
        }
        return self.model_dump(exclude=ignore) == other.model_dump(exclude=ignore)  # type: ignore[arg-type]

    def delta_from(self, base_sha256: str) -> DeltaRef | None:
        """The delta to this variant's main file from the file ``base_sha256``, if any."""
        return next((d for d in self.deltas if d.base_sha256 == base_sha256), None)

    def failure_for(self, fingerprint: str) -> VariantEntry | None:
        """The failed compile this entry records for the inputs ``fingerprint`` hashes (the
        entry itself, or its ``failed_build``), as a failed entry; None when it has none:
        such a pair is up to date, failed, until its inputs change."""
        if self.status == "failed":
            return self if self.fingerprint == fingerprint else None
        failed = self.failed_build
        if failed is None or failed.fingerprint != fingerprint:
            return None
        fields = {name: getattr(failed, name) for name in FailedBuild.model_fields}
        gone: dict[str, object] = {"artifact": None, "files": [], "compatibility_string": None}
        return self.model_copy(update={"status": "failed", "failed_build": None, **gone, **fields})

    def rebuilt_alike(self, other: VariantEntry) -> bool:
        """Whether ``other``, a fresh build of this published one, is the same build with
        other bytes: same fingerprint (every input, recipe and package version), same
        compatibility string, and both verified alike. EPs such as QNN are not
        byte-stable, and a device must not download a variant again for that."""
        return (
            self.status == other.status == "ok"
            and self.fingerprint == other.fingerprint
            and self.compatibility_string == other.compatibility_string
            and _verified(self) == _verified(other)
        )


def _verified(entry: VariantEntry) -> str | None:
    return entry.verification.status if entry.verification else None


class PreviousVersion(_Strict):
    """During a rollout of a new source (a new model version), the version it replaces:
    its source, golden samples, calibration inputs and target order. Its variants are the
    entry's ``previous``. A device outside the rollout runs and health-checks this."""

    source: SourceEntry
    samples: SamplesRef | None = None
    calibration: ArtifactRef | None = Field(
        default=None, exclude_if=lambda calibration: calibration is None
    )
    preference: list[Name] = Field(
        default_factory=list, exclude_if=lambda preference: not preference
    )


class ModelEntry(_Strict):
    source: SourceEntry
    samples: SamplesRef | None = Field(
        default=None, description="Golden samples a device checks a new variant against"
    )
    calibration: ArtifactRef | None = Field(
        default=None,
        exclude_if=lambda calibration: calibration is None,
        description="The inputs integer variants were calibrated on (.npz; never the "
        "golden samples' inputs)",
    )
    preference: list[Name] = Field(
        default_factory=list,
        exclude_if=lambda preference: not preference,
        description="The spec's targets in its order: of variants a device can run "
        "equally well, it takes the one listed first",
    )
    variants: dict[Name, VariantEntry] = Field(
        default_factory=dict, description="Keyed by target name"
    )
    rollout: Rollout | None = Field(
        default=None,
        exclude_if=lambda rollout: rollout is None,
        description="The staged rollout of the variants a publish replaced (see previous)",
    )
    previous: dict[Name, VariantEntry | None] = Field(
        default_factory=dict,
        exclude_if=lambda previous: not previous,
        description="During a rollout, what each target's variant replaced (None: the "
        "target had none): what devices outside the rollout run",
    )
    previous_version: PreviousVersion | None = Field(
        default=None,
        exclude_if=lambda version: version is None,
        description="During a rollout of a new source, the version it replaces (its "
        "variants are previous): what devices outside the rollout run and check",
    )

    def for_device(self, device_id: str) -> ModelEntry:
        """The entry as the device ``device_id`` runs it: the new variants when the rollout
        reaches it (or there is none), else the ones they replaced; during a rollout of a
        new source, the whole previous version (source, samples, variants)."""
        if self.rollout is None or is_member(self.rollout, device_id):
            return self
        if self.previous_version is not None:
            old = self.previous_version
            variants = {t: v for t, v in self.previous.items() if v is not None}
            return self.model_copy(
                update={
                    "source": old.source,
                    "samples": old.samples,
                    "calibration": old.calibration,
                    "preference": old.preference,
                    "variants": variants,
                }
            )
        return self.model_copy(update={"variants": self.variants_before()})

    def variants_before(self) -> dict[str, VariantEntry]:
        """The variants as they were before the rollout's new ones: each target's variant
        put back from ``previous``, a target the rollout added (None there) left out."""
        variants = dict(self.variants)
        for target, before in self.previous.items():
            if before is None:
                variants.pop(target, None)
            else:
                variants[target] = before
        return variants


class DeviceKey(_Strict):
    """An enrolled device's public key (``epfleet device enroll``): the rollout gate counts
    a report of that device only when it is signed with this key, where the rollout's
    policy asks for authenticated reports."""

    keyid: str = Field(pattern=SHA256_PATTERN)
    keytype: str
    scheme: str
    public: str = Field(description="The public key, PEM")
    enrolled_at: datetime


KeyId = Annotated[str, StringConstraints(pattern=SHA256_PATTERN)]


class RevokedKey(_Strict):
    """A device key that was revoked (``epfleet device revoke``): it is enrolled again only
    with ``--force``, for the device it was revoked from, since the reports it signed
    before would count again."""

    device: Name = Field(description="The device it was enrolled for")
    revoked_at: datetime


class Manifest(_Strict):
    schema_version: str = Field(
        default=compat.SCHEMA_VERSION,
        pattern=compat.VERSION_PATTERN,
        description="MAJOR.MINOR: a newer minor only adds fields an older reader may ignore",
    )
    generation: int = Field(default=0, ge=0, le=LARGEST_INT, description="+1 on every publish")
    published_at: datetime | None = None
    models: dict[Name, ModelEntry] = Field(default_factory=dict)
    device_keys: dict[Name, DeviceKey] = Field(
        default_factory=dict,
        exclude_if=lambda keys: not keys,
        description="Enrolled devices' public keys, by device id, where an older epfleet "
        "signed them; epfleet now keeps them in signed key bins of their own and moves these "
        "there (epfleet device migrate-keys, or the next enrol or revoke)",
    )
    revoked_device_keys: dict[KeyId, RevokedKey] = Field(
        default_factory=dict,
        exclude_if=lambda keys: not keys,
        description="Revoked device keys, by key id, where an older epfleet signed them "
        "(added in schema 1.6; devices ignore it); moved into the key bins as device_keys",
    )

    def succeeded_by(self, models: dict[str, ModelEntry], now: datetime) -> Manifest:
        """The next generation of this manifest with ``models``, published at ``now``,
        everything else kept (the enrolled and revoked device keys), stamped with the schema
        version this epfleet writes."""
        return self.model_copy(
            update={
                "schema_version": compat.SCHEMA_VERSION,
                "generation": self.generation + 1,
                "published_at": now.replace(microsecond=0),
                "models": models,
            }
        )

    @field_validator("schema_version")
    @classmethod
    def _readable(cls, version: str, info: ValidationInfo) -> str:
        error = compat.version_error(version, compat.mode(info.context))
        if error is not None:
            raise error
        return version

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, *, newer_minor: compat.NewerMinor = "refuse") -> Manifest:
        """The manifest in ``data``; ValidationError when it fails validation. A reader
        passes ``newer_minor="ignore"`` (see ``epfleet.formats.schema_version``)."""
        return compat.validate_json(cls, data, newer_minor)


def json_schema() -> str:
    return json.dumps(Manifest.model_json_schema(), indent=2, sort_keys=True) + "\n"


def delta_keys(manifest: Manifest | None) -> set[str]:
    """The deltas the manifest's variants list. Not in ``referenced_keys``: ``epfleet gc``
    keeps a delta only while both its base and its variant are kept."""
    keys: set[str] = set()
    for entry in (manifest.models if manifest else {}).values():
        kept = [v for v in entry.previous.values() if v is not None]
        for variant in [*entry.variants.values(), *kept]:
            keys.update(d.uri for d in variant.deltas)
    return keys


def referenced_keys(manifest: Manifest | None) -> set[str]:
    """Every store key the manifest names: sources, samples, variant artifacts and the
    files beside sources and variants (those a rollout can still send devices back to
    included)."""
    keys: set[str] = set()
    for entry in (manifest.models if manifest else {}).values():
        keys.add(entry.source.uri)
        keys.update(f.uri for f in entry.source.files)
        if entry.samples is not None:
            keys.add(entry.samples.uri)
            if entry.samples.metric_inputs is not None:
                keys.add(entry.samples.metric_inputs.uri)
        if entry.calibration is not None:
            keys.add(entry.calibration.uri)
        old = entry.previous_version  # what a rollout of a new source may send devices back to
        if old is not None:
            keys.add(old.source.uri)
            keys.update(f.uri for f in old.source.files)
            keys.update(ref.uri for ref in (old.samples, old.calibration) if ref is not None)
            if old.samples is not None and old.samples.metric_inputs is not None:
                keys.add(old.samples.metric_inputs.uri)
        kept = [v for v in entry.previous.values() if v is not None]
        for variant in [*entry.variants.values(), *kept]:
            if variant.quantization is not None and variant.quantization.qdq_uri is not None:
                keys.add(variant.quantization.qdq_uri)
            if variant.artifact is not None:
                keys.add(variant.artifact.uri)
            keys.update(f.uri for f in variant.files)
    return keys
