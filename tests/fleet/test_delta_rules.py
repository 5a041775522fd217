"""Which deltas a publish makes (``epfleet.fleet.publishing.delta_rules``, pure): from every file a
new variant replaces that a device may hold (the previous build, a rollout's way back, the
same target under another runtime), never for a file set or an unchanged file; listed on
the published variant without changing the manifest given; an older device's view of an
entry without deltas unchanged."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from epfleet.fleet.publishing.delta_rules import delta_jobs, with_deltas
from epfleet.formats.manifest import (
    MAX_DELTA_SIZE,
    ArtifactRef,
    DeltaRef,
    Manifest,
    ModelEntry,
    PackageFile,
    SourceEntry,
    VariantEntry,
    VariantRuntime,
)

pytestmark = pytest.mark.fast

AT = datetime(2026, 12, 1, tzinfo=timezone.utc)
SOURCE = SourceEntry(uri="sources/" + "5" * 64 + ".onnx", sha256="5" * 64, size=10)


def ref(digit: str, size: int = 1000) -> ArtifactRef:
    return ArtifactRef(uri=f"variants/m/t/{digit * 64}.onnx", sha256=digit * 64, size=size)


def variant(
    digit: str, runtime: str | None = None, size: int = 1000, files: bool = False
) -> VariantEntry:
    built = (
        VariantRuntime(
            name=runtime, onnxruntime="1.32.0", ep_package="onnxruntime-qnn", ep_version="2.7.0"
        )
        if runtime
        else None
    )
    extra = [PackageFile(path="model.onnx.data", **ref("e").model_dump())] if files else []
    return VariantEntry(
        ep="QNNExecutionProvider",
        device="npu",
        compatibility_string="v2:6",
        artifact=ref(digit, size),
        ort_version="1.32.0",
        compiled_at=AT,
        status="ok",
        source_sha256="5" * 64,
        fingerprint=digit,
        runtime=built,
        files=extra,
    )


def manifest(variants: dict[str, VariantEntry], **entry: object) -> Manifest:
    return Manifest(models={"m": ModelEntry(source=SOURCE, variants=variants, **entry)})  # type: ignore[arg-type]


def bases(jobs: list) -> dict[str, list[str]]:  # type: ignore[type-arg]
    found: dict[str, list[str]] = {}
    for job in jobs:
        found.setdefault(job.target, []).append(job.base.sha256[0])
    return found


def test_a_new_build_gets_a_delta_from_the_build_it_replaces() -> None:
    jobs = delta_jobs(manifest({"t": variant("a")}), {("m", "t"): variant("b")})
    assert bases(jobs) == {"t": ["a"]}
    assert jobs[0].artifact.sha256 == "b" * 64


def test_an_unchanged_file_a_file_set_or_a_large_file_gets_none() -> None:
    current = manifest({"t": variant("a")})
    assert delta_jobs(current, {("m", "t"): variant("a")}) == []
    assert delta_jobs(current, {("m", "t"): variant("b", files=True)}) == []
    assert delta_jobs(current, {("m", "t"): variant("b", size=MAX_DELTA_SIZE + 1)}) == []
    assert delta_jobs(None, {("m", "t"): variant("b")}) == []


def test_a_rollouts_way_back_is_a_base_too() -> None:
    during = manifest({"t": variant("b")}, previous={"t": variant("a")})
    assert bases(delta_jobs(during, {("m", "t"): variant("c")})) == {"t": ["b", "a"]}


def test_the_same_target_under_another_runtime_is_a_base_published_or_in_the_run() -> None:
    current = manifest({"t.qnn-2.5": variant("a", "qnn-2.5"), "u": variant("f")})
    new = {("m", "t.qnn-2.7"): variant("b", "qnn-2.7")}
    assert bases(delta_jobs(current, new)) == {"t.qnn-2.7": ["a"]}
    both = {
        ("m", "t.qnn-2.5"): variant("a", "qnn-2.5"),
        ("m", "t.qnn-2.7"): variant("b", "qnn-2.7"),
    }
    assert bases(delta_jobs(None, both)) == {"t.qnn-2.5": ["b"], "t.qnn-2.7": ["a"]}
    # the target before it had runtimes, built with the compile host's packages
    assert bases(delta_jobs(manifest({"t": variant("a")}), new)) == {"t.qnn-2.7": ["a"]}


def test_deltas_are_listed_on_the_variant_that_they_make_and_the_manifest_given_is_kept() -> None:
    published = manifest({"t": variant("b"), "u": variant("c")})
    delta = DeltaRef(uri="deltas/m/t/x.zst", sha256="d" * 64, size=10, base_sha256="a" * 64)
    other = delta.model_copy(update={"base_sha256": "9" * 64})
    made = {"b" * 64: [delta], "c" * 64: [other]}
    listed = with_deltas(published, made, {("m", "t")})
    assert listed.models["m"].variants["t"].deltas == [delta]
    assert listed.models["m"].variants["u"].deltas == []  # not this run's
    assert published.models["m"].variants["t"].deltas == []
    assert with_deltas(listed, made, {("m", "t")}) == listed  # listed once


def test_an_entry_without_deltas_is_written_as_before() -> None:
    """An older device reads the same bytes for every variant without deltas, and a newer
    minor's ``deltas`` key it drops (``epfleet.formats.schema_version``)."""
    entry = variant("b")
    assert "deltas" not in entry.model_dump_json()
    delta = DeltaRef(uri="deltas/m/t/x.zst", sha256="d" * 64, size=10, base_sha256="a" * 64)
    with_delta = entry.model_copy(update={"deltas": [delta]})
    assert '"deltas"' in with_delta.model_dump_json()
    assert with_delta.same_build(entry)  # a delta more is no new build
