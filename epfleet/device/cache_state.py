"""The device cache's state, its record of truth: what is installed and active per model."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from epfleet.manifest import Name
from eps.base import DeviceType

Origin = Literal["published", "local", "fallback"]


class Installed(BaseModel):
    """A variant present in the cache (made by ``epfleet.device.activation``)."""

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


class ModelState(BaseModel):
    active: Installed | None = None
    previous: Installed | None = Field(default=None, description="Kept for rollback")
    recompile_failed: dict[str, str] = Field(
        default_factory=dict, description="Local build key -> why it failed; not retried"
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
    models: dict[Name, ModelState] = Field(default_factory=dict)
