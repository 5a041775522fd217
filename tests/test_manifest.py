"""Manifest model and merge rules (pure)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from epfleet.manifest import ArtifactRef, Manifest, SourceEntry, VariantEntry, json_schema, merge

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def source(sha: str = SHA_A) -> SourceEntry:
    return SourceEntry(uri=f"sources/{sha}.onnx", sha256=sha, size=10)


def variant(status: str = "ok", fingerprint: str = "f1", src: str = SHA_A, **extra) -> VariantEntry:
    fields = dict(
        ep="QNNExecutionProvider",
        device="npu",
        ort_version="1.32.0",
        ep_version="2.7.0",
        compiled_at=datetime(2026, 11, 1, tzinfo=timezone.utc),
        status=status,
        source_sha256=src,
        fingerprint=fingerprint,
    )
    if status == "ok":
        fields |= dict(
            compatibility_string="v2:6:2.51.0:5.51.0:75:57:0:0",
            artifact=ArtifactRef(uri=f"variants/m/t/{SHA_C}.onnx", sha256=SHA_C, size=5),
        )
    else:
        fields["error"] = "boom"
    return VariantEntry(**(fields | extra))


def test_first_publish_creates_generation_one() -> None:
    manifest = merge(None, {"m": source()}, {("m", "t"): variant()})
    assert manifest is not None
    assert manifest.generation == 1 and manifest.published_at is not None
    assert manifest.models["m"].variants["t"].compatibility_string.startswith("v2:6")


def test_unchanged_results_publish_nothing() -> None:
    first = merge(None, {"m": source()}, {("m", "t"): variant()})
    recompiled_later = variant(compiled_at=datetime(2026, 11, 2, tzinfo=timezone.utc))
    assert merge(first, {"m": source()}, {("m", "t"): recompiled_later}) is None


def test_entries_of_other_publishers_are_kept() -> None:
    first = merge(None, {"m": source()}, {("m", "t"): variant()})
    second = merge(first, {"n": source(SHA_B)}, {("n", "t"): variant(src=SHA_B)})
    assert second is not None and second.generation == 2
    assert set(second.models) == {"m", "n"}


def test_failure_never_replaces_a_working_build() -> None:
    first = merge(None, {"m": source()}, {("m", "t"): variant()})
    second = merge(first, {"m": source()}, {("m", "t"): variant("failed", fingerprint="f2")})
    assert second is not None
    kept = second.models["m"].variants["t"]
    assert kept.status == "ok" and kept.fingerprint == "f1"
    assert "newer compile failed: boom" in (kept.error or "")


def test_new_source_drops_variants_built_from_the_old_one() -> None:
    first = merge(None, {"m": source()}, {("m", "t"): variant(), ("m", "u"): variant()})
    second = merge(first, {"m": source(SHA_B)}, {("m", "t"): variant(src=SHA_B, fingerprint="f9")})
    assert second is not None
    assert list(second.models["m"].variants) == ["t"]
    assert second.models["m"].variants["t"].source_sha256 == SHA_B


def test_status_fields_are_enforced() -> None:
    with pytest.raises(ValidationError, match="ok variant needs an artifact"):
        variant(artifact=None)
    with pytest.raises(ValidationError, match="failed variant needs an error"):
        variant("failed", error=None)
    with pytest.raises(ValidationError):
        Manifest.from_json(b'{"schema_version": "9.9", "generation": 1, "models": {}}')


def test_published_schema_matches_the_model() -> None:
    shipped = Path(__file__).parents[1] / "epfleet" / "schema" / "manifest.schema.json"
    assert json.loads(shipped.read_text()) == json.loads(json_schema()), (
        "regenerate with: epfleet manifest schema > epfleet/schema/manifest.schema.json"
    )
