"""Which release of an EP a published variant was built with, as a device ranks it
(``epfleet.device.model_sync.runtime_ranks`` and ``declared_ranks``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from epfleet.device.local_eps import LocalEps
from epfleet.device.model_sync import declared_ranks, runtime_ranks
from epfleet.formats.manifest import (
    ArtifactRef,
    ModelEntry,
    SourceEntry,
    VariantEntry,
    VariantRuntime,
)

pytestmark = pytest.mark.fast

SHA = "a" * 64
QNN = "QNNExecutionProvider"


def entry(runtimes: dict[str, str | None], preference: list[str]) -> ModelEntry:
    """Variants by target name, each built under a runtime with that onnxruntime-qnn
    release (None: with the compile host's packages)."""
    variants = {
        target: VariantEntry(
            ep=QNN,
            device="npu",
            ort_version="1.32.0",
            ep_version=release or "2.7.0",
            compatibility_string="v2:6:2.51.0:5.51.0:73:60:8:0",
            artifact=ArtifactRef(uri=f"variants/m/{target}/{SHA}.onnx", sha256=SHA, size=1),
            compiled_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
            status="ok",
            source_sha256=SHA,
            fingerprint="f",
            runtime=VariantRuntime(
                name=target.split(".", 1)[1],
                onnxruntime="1.32.0",
                ep_package="onnxruntime-qnn",
                ep_version=release,
            )
            if release
            else None,
        )
        for target, release in runtimes.items()
    }
    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=1)
    return ModelEntry(source=source, variants=variants, preference=preference)


def device_on(release: str) -> LocalEps:
    local = LocalEps({}, {})
    local.releases = {QNN: release}
    return local


def test_the_devices_own_release_first_then_the_newest() -> None:
    built = entry(
        {"htp.qnn-2.5": "2.5.0", "htp.qnn-2.10": "2.10.0", "htp.qnn-2.7": "2.7.0", "old": None},
        [],
    )
    assert runtime_ranks(device_on("2.7.0"), built) == {
        "htp.qnn-2.7": 0,
        "old": 0,  # built with the compile host's packages: not ranked
        "htp.qnn-2.10": 1,  # 2.10 is newer than 2.5 (numbers, not text)
        "htp.qnn-2.5": 2,
    }
    assert runtime_ranks(device_on("2.4.0"), built)["htp.qnn-2.10"] == 1


def test_a_targets_runtime_variants_share_its_declared_place() -> None:
    built = entry(
        {"w8a8.qnn-2.7": "2.7.0", "w8a8.qnn-2.5": "2.5.0", "fp16.qnn-2.7": "2.7.0", "cpu": None},
        ["w8a8.qnn-2.7", "w8a8.qnn-2.5", "fp16.qnn-2.7", "cpu"],
    )
    assert declared_ranks(built) == {
        "w8a8.qnn-2.7": 0,
        "w8a8.qnn-2.5": 0,
        "fp16.qnn-2.7": 1,
        "cpu": 2,
    }
