"""The fleet manifest: what has been compiled, for which EP, with which compatibility string.

Pure logic: the pydantic model, its JSON Schema, and how a compile run's results
merge into a manifest. Field names follow ORT's model package manifest where
they overlap (``ep``, ``device``, ``compatibility_string``, ``variants``).
All URIs are keys relative to the store root.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SHA256_PATTERN = r"^[0-9a-f]{64}$"


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArtifactRef(_Strict):
    uri: str = Field(description="Key of the file, relative to the store root")
    sha256: str = Field(pattern=SHA256_PATTERN)
    size: int = Field(ge=0)


class SourceEntry(ArtifactRef):
    input_shapes: dict[str, list[int]] = Field(default_factory=dict)


class VariantEntry(_Strict):
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

    @model_validator(mode="after")
    def _status_fields(self) -> VariantEntry:
        if self.status == "ok" and (self.artifact is None or not self.compatibility_string):
            raise ValueError("an ok variant needs an artifact and a compatibility_string")
        if self.status == "failed" and not self.error:
            raise ValueError("a failed variant needs an error")
        return self

    def same_build(self, other: VariantEntry) -> bool:
        """Equal but for when it was compiled: publishing it again would change nothing."""
        ignore = {"compiled_at"}
        return self.model_dump(exclude=ignore) == other.model_dump(exclude=ignore)


class ModelEntry(_Strict):
    source: SourceEntry
    variants: dict[str, VariantEntry] = Field(
        default_factory=dict, description="Keyed by target name"
    )


class Manifest(_Strict):
    schema_version: Literal["1.0"] = "1.0"
    generation: int = Field(default=0, ge=0, description="+1 on every publish")
    published_at: datetime | None = None
    models: dict[str, ModelEntry] = Field(default_factory=dict)

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        return cls.model_validate_json(data)


def json_schema() -> str:
    return json.dumps(Manifest.model_json_schema(), indent=2, sort_keys=True) + "\n"


def merge(
    current: Manifest | None,
    sources: dict[str, SourceEntry],
    variants: dict[tuple[str, str], VariantEntry],
) -> Manifest | None:
    """Apply one run's sources and (model, target) results to ``current``.

    Returns the next manifest (generation + 1), or None when nothing would change.
    Entries this run did not touch are kept, so concurrent runs on different
    models never drop each other's work, and a failed compile never replaces a
    working build. When a model's source changes, variants
    built from the old source are dropped: a device must never pair a source with
    a variant compiled from something else.
    """
    base = current or Manifest()
    models = {name: entry.model_copy(deep=True) for name, entry in base.models.items()}
    changed = False
    for name, source in sources.items():
        entry = models.get(name)
        if entry is None:
            models[name] = ModelEntry(source=source)
            changed = True
        elif entry.source != source:
            kept = {
                target: variant
                for target, variant in entry.variants.items()
                if variant.source_sha256 == source.sha256
            }
            models[name] = ModelEntry(source=source, variants=kept)
            changed = True
    for (model_name, target), variant in variants.items():
        entry = models.get(model_name)
        if entry is None:
            raise ValueError(f"variant for {model_name!r} without a source entry")
        if variant.source_sha256 != entry.source.sha256:
            continue  # compiled from a source another publisher has since replaced
        previous = entry.variants.get(target)
        if previous is not None and previous.status == "ok" and variant.status == "failed":
            # Never replace a working build with a failure: devices keep their variant, and
            # the entry records why it could not be refreshed.
            variant = previous.model_copy(
                update={"error": f"kept this build; a newer compile failed: {variant.error}"}
            )
        if previous is not None and previous.same_build(variant):
            continue
        entry.variants[target] = variant
        changed = True
    if not changed:
        return None
    return Manifest(generation=base.generation + 1, published_at=utcnow(), models=models)
