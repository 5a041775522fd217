"""What a device sync is asked to do: which models, whether to recompile, which devices first,
whether to re-hash, whether to drop models the manifest no longer lists."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from epfleet.device.selection import DEFAULT_PREFERENCE
from eps.base import DeviceType


class SyncPolicy(BaseModel):
    models: list[str] = Field(
        default_factory=list, description="Only these models (empty: every model)"
    )
    recompile: bool = Field(
        default=True,
        description="Recompile locally when nothing published is optimal here and no "
        "published variant this device can run works",
    )
    recompile_suboptimal: bool = Field(
        default=False,
        description="Recompile locally before taking a published variant judged "
        "prefer_recompilation here (default: the fleet's verified variant first)",
    )
    prefer: list[DeviceType] = Field(
        default=list(DEFAULT_PREFERENCE), description="Device types, most preferred first"
    )
    verify: bool = Field(
        default=False,
        description="Re-hash active files (default: trust size and mtime as activated)",
    )

    drop_unlisted: bool = Field(
        default=False,
        description="Remove models the manifest no longer lists from the cache (default: keep "
        "them, or EPFLEET_DROP_UNLISTED); never when the manifest could not be fetched",
    )

    @field_validator("models", mode="before")
    @classmethod
    def _none_is_every_model(cls, value: object) -> object:
        """None, as deployments and callers made before models was a plain list, is every
        model too."""
        return [] if value is None else value
