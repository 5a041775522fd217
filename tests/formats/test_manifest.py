"""Manifest model and merge rules (pure)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from epfleet.fleet.publishing.merge_rules import ModelFacts, merge
from epfleet.formats.manifest import (
    ArtifactRef,
    Coverage,
    FileSet,
    Manifest,
    SamplesRef,
    SourceEntry,
    VariantEntry,
    Verification,
    json_schema,
)
from epfleet.formats.variant_checks import MAX_FOLDED_TENSORS, FoldedIo
from tests.support.paths import REPO

pytestmark = pytest.mark.fast

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SEED = "5eed" * 8

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


def run(current: Manifest | None, sources: dict, variants: dict, planned_on: dict | None = None):
    """Merge as a run that planned on ``current`` (unless told otherwise) would."""
    if planned_on is None:
        published = current.models if current else {}
        planned_on = {
            name: published[name].source if name in published else None for name in sources
        }
    return merge(current, sources, planned_on, variants, now=NOW, seed=SEED)


def test_first_publish_creates_generation_one() -> None:
    manifest = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    assert manifest is not None
    assert manifest.generation == 1 and manifest.published_at is not None
    assert manifest.models["m"].variants["t"].compatibility_string.startswith("v2:6")


def test_unchanged_results_publish_nothing() -> None:
    first = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    recompiled_later = variant(compiled_at=datetime(2026, 11, 2, tzinfo=timezone.utc))
    assert run(first, {"m": source()}, {("m", "t"): recompiled_later}).manifest is None


def test_entries_of_other_publishers_are_kept() -> None:
    first = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    second = run(first, {"n": source(SHA_B)}, {("n", "t"): variant(src=SHA_B)}).manifest
    assert second is not None and second.generation == 2
    assert set(second.models) == {"m", "n"}


def test_failure_never_replaces_a_working_build() -> None:
    first = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    second = run(first, {"m": source()}, {("m", "t"): variant("failed", fingerprint="f2")}).manifest
    assert second is not None
    kept = second.models["m"].variants["t"]
    assert kept.status == "ok" and kept.fingerprint == "f1"
    assert "newer compile failed: boom" in (kept.error or "")
    # The same build failing again on some worker changes nothing at all.
    assert run(first, {"m": source()}, {("m", "t"): variant("failed")}).manifest is None


def test_a_failure_keeps_its_measurements_and_settles_its_inputs() -> None:
    checked = Coverage(ep_nodes=3, other_nodes=0, fraction=1.0)
    failed_check = Verification(status="failed", max_rel_error=0.37, tolerance=0.05, seconds=2.5)
    rejected = variant(
        "failed", fingerprint="f2", coverage=checked, verification=failed_check, error="wrong"
    )
    # A new pair: the failed entry itself, with what was measured.
    alone = run(None, {"m": source()}, {("m", "t"): rejected}).manifest
    assert alone is not None
    entry = alone.models["m"].variants["t"]
    assert (entry.coverage, entry.verification) == (checked, failed_check)
    assert entry.failure_for("f2") == entry and entry.failure_for("f3") is None
    # Beside a working build: the build stays, the failure and its measurements beside it.
    first = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    second = run(first, {"m": source()}, {("m", "t"): rejected}).manifest
    assert second is not None
    kept = second.models["m"].variants["t"]
    assert kept.status == "ok" and kept.fingerprint == "f1" and kept.artifact is not None
    assert kept.failed_build is not None and kept.failed_build.verification == failed_check
    assert kept.failure_for("f1") is None  # its own inputs built fine
    as_failed = kept.failure_for("f2")
    assert as_failed is not None and as_failed.status == "failed"
    assert (as_failed.error, as_failed.fingerprint, as_failed.artifact) == ("wrong", "f2", None)
    assert (as_failed.coverage, as_failed.verification) == (checked, failed_check)
    assert Manifest.from_json(second.to_json()) == second  # round-trips as published
    # The failure's record is left out of entries without one: their bytes are unchanged.
    assert b"failed_build" not in first.to_json() and b"samples_origin" not in first.to_json()


@pytest.mark.parametrize(
    "loosened",
    [{"tolerance": 1e9}, {"tolerance": 0.26}, {"abs_tolerance": 0.5}, {"tolerance": -1.0}],
)
def test_an_entry_loosening_a_devices_check_past_the_bound_is_refused(loosened: dict) -> None:
    check = {"status": "passed", "tolerance": 0.05, "abs_tolerance": 1e-3} | loosened
    entry = variant().model_dump(mode="json") | {"verification": check}
    document = {"generation": 1, "models": {"m": {"source": source().model_dump(mode="json")}}}
    document["models"]["m"]["variants"] = {"t": entry}
    with pytest.raises(ValidationError, match="verification"):
        Manifest.from_json(json.dumps(document).encode())
    nan = json.dumps(document).replace(json.dumps(check), '{"status": "passed", "tolerance": NaN}')
    assert "NaN" in nan
    with pytest.raises(ValidationError):
        Manifest.from_json(nan.encode())
    bounded = check | {"tolerance": 0.25, "abs_tolerance": 0.05}
    document["models"]["m"]["variants"]["t"]["verification"] = bounded
    assert Manifest.from_json(json.dumps(document).encode()).generation == 1


def test_new_source_drops_variants_built_from_the_old_one() -> None:
    first = run(None, {"m": source()}, {("m", "t"): variant(), ("m", "u"): variant()}).manifest
    second = run(
        first, {"m": source(SHA_B)}, {("m", "t"): variant(src=SHA_B, fingerprint="f9")}
    ).manifest
    assert second is not None
    assert list(second.models["m"].variants) == ["t"]
    assert second.models["m"].variants["t"].source_sha256 == SHA_B


def test_new_input_shapes_drop_variants_built_with_the_old_ones() -> None:
    first = run(None, {"m": source()}, {("m", "t"): variant(), ("m", "u"): variant()}).manifest
    reshaped = source().model_copy(update={"input_shapes": {"x": [1, 3, 64, 64]}})
    second = run(first, {"m": reshaped}, {("m", "t"): variant(fingerprint="f5")}).manifest
    assert second is not None
    assert second.models["m"].source.input_shapes == {"x": [1, 3, 64, 64]}
    assert list(second.models["m"].variants) == ["t"]


def test_a_stale_run_never_reverts_a_newer_source() -> None:
    v1 = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    v2 = run(v1, {"m": source(SHA_B)}, {("m", "t"): variant(src=SHA_B, fingerprint="f2")}).manifest
    # A run that planned on v1 (source A) publishes after v2 landed:
    stale = run(
        v2,
        {"m": source(), "n": source(SHA_C)},
        {("m", "u"): variant(), ("n", "t"): variant(src=SHA_C)},
        planned_on={"m": source(), "n": None},
    )
    assert stale.conflicts == ["m"]
    assert stale.manifest is not None
    assert stale.manifest.models["m"] == v2.models["m"]  # v2's source and variants stand
    assert "n" in stale.manifest.models  # the rest of the run still lands


def test_status_fields_are_enforced() -> None:
    with pytest.raises(ValidationError, match="ok variant needs an artifact"):
        variant(artifact=None)
    with pytest.raises(ValidationError, match="failed variant needs an error"):
        variant("failed", error=None)
    with pytest.raises(ValidationError):
        Manifest.from_json(b'{"schema_version": "9.9", "generation": 1, "models": {}}')


def test_published_schema_matches_the_model() -> None:
    shipped = REPO / "epfleet" / "formats" / "schema" / "manifest.schema.json"
    assert json.loads(shipped.read_text()) == json.loads(json_schema()), (
        "regenerate with: epfleet manifest schema > epfleet/formats/schema/manifest.schema.json"
    )


def _passed(seconds: float = 1.0) -> Verification:
    return Verification(
        status="passed", samples=1, max_rel_error=0.008, tolerance=0.05, seconds=seconds
    )


def test_a_rebuild_with_other_bytes_keeps_the_published_artifact() -> None:
    """QNN is not byte-stable: the same fingerprint, string and verification is the same
    build, and devices must not download again for it."""
    first = run(None, {"m": source()}, {("m", "t"): variant(verification=_passed())}).manifest
    assert first is not None
    other_bytes = ArtifactRef(uri=f"variants/m/t/{SHA_B}.onnx", sha256=SHA_B, size=6)
    rebuilt = variant(artifact=other_bytes, verification=_passed(seconds=2.0))
    planned_on = {"m": source()}
    kept = merge(
        first,
        {"m": source()},
        planned_on,
        {("m", "t"): rebuilt},
        present=lambda ref: True,
        now=NOW,
        seed=SEED,
    )
    assert kept.manifest is None  # nothing to publish: the same build

    gone = merge(
        first,
        {"m": source()},
        planned_on,
        {("m", "t"): rebuilt},
        present=lambda ref: False,
        now=NOW,
        seed=SEED,
    )
    assert gone.manifest is not None
    assert gone.manifest.models["m"].variants["t"].artifact == other_bytes

    new_string = rebuilt.model_copy(update={"compatibility_string": "v2:6:2.52.0:5.52.0:75:57:0:0"})
    changed = merge(
        first,
        {"m": source()},
        planned_on,
        {("m", "t"): new_string},
        present=lambda ref: True,
        now=NOW,
        seed=SEED,
    )
    assert changed.manifest is not None
    assert changed.manifest.models["m"].variants["t"].artifact == other_bytes


def test_golden_samples_are_set_per_model_and_kept_with_their_source() -> None:
    golden = SamplesRef(uri=f"samples/{SHA_B}.npz", sha256=SHA_B, size=9, count=1, basis="x")
    first = merge(
        None,
        {"m": source()},
        {"m": None},
        {("m", "t"): variant()},
        ModelFacts(samples={"m": golden}),
        now=NOW,
        seed=SEED,
    ).manifest
    assert first is not None and first.models["m"].samples == golden
    again = merge(
        first,
        {"m": source()},
        {"m": source()},
        {},
        ModelFacts(samples={"m": golden}),
        now=NOW,
        seed=SEED,
    )
    assert again.manifest is None


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda doc: doc.update(generation=10**400), "generation"),
        (lambda doc: doc["models"]["m"]["source"].update(size=10**30), "size"),
        (lambda doc: doc["models"].update({"m" * 101: doc["models"]["m"]}), "models"),
    ],
    ids=["400-digit generation", "size 1e30", "101-character name"],
)
def test_numbers_and_names_a_device_cannot_use_are_refused(edit, field: str) -> None:
    manifest = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    assert manifest is not None
    document = json.loads(manifest.to_json())
    edit(document)
    with pytest.raises(ValidationError) as raised:
        Manifest.model_validate(document)
    assert field in str(raised.value)


def test_merge_never_changes_the_manifest_it_is_given() -> None:
    """Publishers merge into the signed manifest that readers of the same process share
    (a cached, verified document): it must come out as it went in."""
    first = run(None, {"m": source(), "n": source(SHA_B)}, {("m", "t"): variant()}).manifest
    assert first is not None
    before = first.model_dump_json()
    golden = SamplesRef(uri=f"samples/{SHA_B}.npz", sha256=SHA_B, size=3, count=1, basis="b")
    second = merge(
        first,
        {"m": source()},
        {"m": source()},
        {("m", "t"): variant(fingerprint="f2"), ("m", "u"): variant()},
        ModelFacts(samples={"m": golden}),
        now=NOW,
        seed=SEED,
    ).manifest
    assert second is not None and set(second.models["m"].variants) == {"t", "u"}
    assert first.model_dump_json() == before
    assert second.models["n"] is first.models["n"]  # an entry it left alone is not copied


def with_rollout(policy: dict, stage: int = 0) -> dict:
    """A manifest document whose model is in a rollout with ``policy`` (the JSON a store
    holds), at ``stage``."""
    manifest = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    assert manifest is not None
    document = json.loads(manifest.to_json())
    document["models"]["m"]["rollout"] = {
        "id": "0" * 16,
        "salt": "1" * 32,
        "policy": {"stages": [10, 100]} | policy,
        "stage": stage,
        "started_at": "2026-12-01T00:00:00Z",
        "stage_started_at": "2026-12-01T00:00:00Z",
    }
    document["models"]["m"]["previous"] = {"t": None}
    return document


def test_a_rollout_within_the_spec_bounds_is_read() -> None:
    document = with_rollout({"canary": ["lab-phone-1"], "min_hours": 8760}, stage=1)
    rollout = Manifest.from_json(json.dumps(document).encode()).models["m"].rollout
    assert rollout is not None and rollout.policy.canary == ["lab-phone-1"]


@pytest.mark.parametrize(
    ("policy", "stage", "expected"),
    [
        ({"min_hours": float("inf")}, 0, "min_hours\n  Input should be a finite number"),
        ({"min_hours": 1e12}, 0, "min_hours\n  Input should be less than or equal to 8760"),
        ({"min_reports": 10**9}, 0, "min_reports\n  Input should be less than or equal to"),
        ({"max_latency_regression": 1e9}, 0, "max_latency_regression\n  Input should be less"),
        ({"canary": ["../../x"]}, 0, "canary.0\n  String should match pattern"),
        ({"canary": ["dev-1\x1b[2J"]}, 0, "canary.0\n  String should match pattern"),
        ({"canary": ["d" * 101]}, 0, "canary.0\n  String should have at most 100 characters"),
        ({"canary": ["d"] * 10_001}, 0, "canary\n  List should have at most 10000 items"),
        ({}, 2, "stage 2 is past the policy's 2 stages"),
    ],
    ids=[
        "min_hours inf",
        "min_hours 1e12",
        "min_reports 1e9",
        "latency 1e9",
        "canary ../../x",
        "canary escape",
        "canary 101 characters",
        "10,001 canaries",
        "stage past the last",
    ],
)
def test_a_rollout_a_spec_could_not_give_is_refused_when_a_manifest_is_read(
    policy: dict, stage: int, expected: str
) -> None:
    data = json.dumps(with_rollout(policy, stage)).replace("Infinity", "1e999").encode()
    with pytest.raises(ValidationError) as raised:
        Manifest.from_json(data)
    assert expected in str(raised.value), str(raised.value)


def folded(inputs: list[str]) -> dict:
    return {
        "inputs": [{"name": n, "dtype": "uint8", "scale": 0.5, "zero_point": 0} for n in inputs]
    }


def test_a_folded_io_longer_than_any_model_is_refused_when_a_manifest_is_read() -> None:
    manifest = run(None, {"m": source()}, {("m", "t"): variant()}).manifest
    assert manifest is not None
    document = json.loads(manifest.to_json())
    names = [f"input-{i}" for i in range(MAX_FOLDED_TENSORS + 1)]
    document["models"]["m"]["variants"]["t"]["folded_io"] = folded(names)
    with pytest.raises(ValidationError, match="List should have at most 10000 items"):
        Manifest.from_json(json.dumps(document).encode())
    document["models"]["m"]["variants"]["t"]["folded_io"] = folded(names[:MAX_FOLDED_TENSORS])
    assert Manifest.from_json(json.dumps(document).encode()).models["m"].variants["t"].folded_io


def test_a_name_folded_twice_is_found_in_a_long_list() -> None:
    names = [f"input-{i}" for i in range(MAX_FOLDED_TENSORS - 1)] + ["input-5"]
    with pytest.raises(ValidationError, match="inputs name 'input-5' twice"):
        FoldedIo.model_validate(folded(names))


def package_files(paths: list[str]) -> list[dict]:
    return [{"path": p, "uri": f"files/{SHA_B}", "sha256": SHA_B, "size": 1} for p in paths]


def test_a_file_set_of_more_files_than_any_model_folder_is_refused() -> None:
    deep = "/".join(["d"] * 90)
    assert FileSet.model_validate({"files": package_files([f"{deep}/{i}" for i in range(10_000)])})
    with pytest.raises(ValidationError, match="List should have at most 10000 items"):
        FileSet.model_validate({"files": package_files([f"f{i}" for i in range(10_001)])})
    with pytest.raises(ValidationError, match="'d/d' is both a file and a directory"):
        FileSet.model_validate({"files": package_files([f"{deep}/0", "d/d"])})
