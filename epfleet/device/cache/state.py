"""The device cache's state, its record of truth: what is installed and active per model."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from epfleet.device.cache.layout import MODEL_FILE
from epfleet.formats.device_report import Profile, ShadowRun
from epfleet.formats.manifest import FoldedIo, Name
from epfleet.hashing import sha256_bytes
from epfleet.trust.highwater import TrustMark
from eps.base import DeviceType, Precision

Origin = Literal["published", "local", "fallback"]


class InstalledFile(BaseModel):
    """A file of a multi-file variant, beside its main file."""

    path: str = Field(description="Relative POSIX path in the variant's directory")
    sha256: str
    size: int
    mtime_ns: int = Field(default=0, description="Its mtime when activated")


class Installed(BaseModel):
    """A variant present in the cache (made by ``epfleet.device.activation``): the main
    file ``model_file`` (``sha256``, ``size``) and the ``files`` beside it."""

    name: str = Field(description="Variant name in the package, and its directory")
    origin: Origin
    target: str | None = Field(description="The fleet target it was published for")
    ep: str
    device: DeviceType
    compatibility_string: str | None
    provider_options: dict[str, str] = Field(default_factory=dict)
    sha256: str
    size: int
    source_sha256: str
    activated_at: datetime
    mtime_ns: int = Field(description="The file's mtime when activated: a cheap tamper check")
    model_file: str = Field(default=MODEL_FILE, description="The main file's path in the directory")
    files: list[InstalledFile] = Field(default_factory=list, description="The other files")
    precision: Precision | None = Field(
        default=None, description="What it computes in; None: unknown (an older epfleet's)"
    )
    profile: Profile | None = Field(
        default=None, description="How it ran when activated here (its health check, timed)"
    )
    folded_io: FoldedIo | None = Field(
        default=None,
        exclude_if=lambda folded: folded is None,
        description="A folded variant's integer inputs and outputs, as its manifest entry "
        "records them: an app quantises its inputs and dequantises its outputs with them",
    )

    @property
    def digest(self) -> str:
        """The variant's identity, as ``epfleet.formats.manifest.set_digest`` gives it for the
        manifest's file set: the main file's sha256 when it stands alone."""
        return set_digest(self.sha256, self.size, self.model_file, self.files)

    @property
    def total_size(self) -> int:
        return self.size + sum(f.size for f in self.files)


def set_digest(sha256: str, size: int, model_file: str, files: list[InstalledFile]) -> str:
    """``epfleet.formats.manifest.set_digest`` of a main file and the files beside it."""
    if not files:
        return sha256
    listing = sorted([[f.path, f.sha256, f.size] for f in files])
    listing.insert(0, [model_file, sha256, size])
    return sha256_bytes(json.dumps(listing, separators=(",", ":")).encode())


class ShadowRecord(BaseModel):
    """The last shadow run of a rollout's candidate here (``epfleet.device.shadow``)."""

    rollout: str = Field(description="The rollout's id")
    candidate: str = Field(description="The candidate's digest")
    active: str = Field(description="The digest of the variant it ran beside")
    run: ShadowRun


class ModelState(BaseModel):
    active: Installed | None = None
    previous: Installed | None = Field(default=None, description="Kept for rollback")
    recompile_failed: dict[str, str] = Field(
        default_factory=dict, description="Local build key -> why it failed; not retried"
    )
    shadow: ShadowRecord | None = Field(
        default=None,
        exclude_if=lambda shadow: shadow is None,
        description="The last shadow run: reported while its rollout lasts; a candidate "
        "it found outside the bounds is not downloaded again beside the same active variant",
    )


class CacheState(BaseModel):
    schema_version: Literal["1"] = "1"
    store: str | None = None
    manifest_etag: str | None = None
    manifest_generation: int | None = None
    manifest_sha256: str | None = Field(
        default=None, description="Of the cached manifest, as validated when it was fetched"
    )
    manifest_rules: str | None = Field(
        default=None, description="epfleet's validation rules it was validated under"
    )
    package_checked_with: str | None = Field(
        default=None, description="ORT and EP versions the package's selection was checked with"
    )
    manifest_rejected: dict[str, str] | None = None  # see epfleet.device.manifest_cache
    trust: dict[str, TrustMark] = Field(
        default_factory=dict,
        description="Per trust directory (trust/<id>): the high-water mark of the signed "
        "metadata accepted from its store, kept here so that losing the trust directory "
        "does not lose it (epfleet.trust.highwater)",
    )
    models: dict[Name, ModelState] = Field(default_factory=dict)
