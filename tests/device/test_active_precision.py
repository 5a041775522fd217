"""The precision a device reports for what it runs (pure): as recorded when the variant was
installed, and for a variant an older epfleet installed (no precision in its state), what
the manifest, the EP module or the fallback rule says."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from epfleet.device.activation import fallback_variant, local_variant, published_variant
from epfleet.device.model_sync import precision_of
from epfleet.formats.manifest import ArtifactRef, ModelEntry, SourceEntry, VariantEntry
from eps.base import LocalTarget

pytestmark = pytest.mark.fast

SHA = "a" * 64
SOURCE = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=10)
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def htp_variant(sha256: str, precision: str | None) -> VariantEntry:
    return VariantEntry.model_validate(
        {
            "ep": "QNNExecutionProvider",
            "device": "npu",
            "compatibility_string": "v2:6:2.51.0:5.51.0:68:35:0:0",
            "provider_options": {"backend_type": "htp", "htp_arch": "68"},
            "artifact": ArtifactRef(uri=f"variants/m/v68/{sha256}.onnx", sha256=sha256, size=5),
            "ort_version": "1.32.0",
            "compiled_at": datetime(2026, 12, 1, tzinfo=timezone.utc),
            "status": "ok",
            "source_sha256": SHA,
            "fingerprint": "f",
            "precision": precision,
        }
    )


def test_a_published_variant_records_its_entrys_precision() -> None:
    entry = ModelEntry(source=SOURCE, variants={"v68": htp_variant("b" * 64, "w8a8")})
    installed = published_variant("v68", entry.variants["v68"], NOW)
    assert installed.precision == "w8a8"
    # The manifest moves on to another build at another precision: the installed one's stays.
    moved = ModelEntry(source=SOURCE, variants={"v68": htp_variant("c" * 64, "w8a16")})
    assert precision_of(installed, moved) == "w8a8"


def test_a_variant_an_older_epfleet_installed_takes_the_manifests_of_the_same_build() -> None:
    entry = ModelEntry(source=SOURCE, variants={"v68": htp_variant("b" * 64, "w8a8")})
    older = published_variant("v68", entry.variants["v68"], NOW).model_copy(
        update={"precision": None}
    )
    assert precision_of(older, entry) == "w8a8"
    rebuilt = ModelEntry(source=SOURCE, variants={"v68": htp_variant("c" * 64, "w8a8")})
    assert precision_of(older, rebuilt) is None  # another build: not known
    assert precision_of(older, None) is None
    unrecorded = ModelEntry(source=SOURCE, variants={"v68": htp_variant("b" * 64, None)})
    assert precision_of(older, unrecorded) is None


def test_a_local_build_and_the_fallback() -> None:
    htp = LocalTarget(device="npu", provider_options={"backend_type": "htp", "htp_arch": "68"})
    built = local_variant(
        "QNNExecutionProvider", htp, "s", "d" * 64, 5, SHA, now=NOW, precision="w8a8"
    )
    assert precision_of(built, None) == "w8a8"
    older = built.model_copy(update={"precision": None})  # what its EP module says
    assert precision_of(older, None) == "w8a8"
    cpu = LocalTarget(device="cpu", provider_options={})
    older_cpu = local_variant("CPUExecutionProvider", cpu, "s", "e" * 64, 5, SHA, now=NOW)
    assert precision_of(older_cpu, None) == "fp32"
    fallback = fallback_variant(SOURCE, NOW)
    assert fallback.precision == "fp32"
    assert precision_of(fallback.model_copy(update={"precision": None}), None) == "fp32"
    unknown = older.model_copy(update={"ep": "NoSuchExecutionProvider"})
    assert precision_of(unknown, None) is None
