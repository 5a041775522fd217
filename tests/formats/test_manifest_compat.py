"""The manifest's forward-compatibility policy (epfleet/formats/schema_version.py): a reader
ignores the unknown keys of a newer minor and refuses a newer major; at its own minor an
unknown key stays an error; a writer refuses anything newer. Also the signed per-model
targets: the schema version beside the entry, left out for 1.0 so bins signed before it
are signed again by nothing."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from typing import Any

import pytest
from pydantic import ValidationError
from tuf.api.metadata import SuccinctRoles, TargetFile, Targets

from epfleet.errors import BadInputError
from epfleet.formats.manifest import Manifest, ModelEntry
from epfleet.formats.rollout import is_member
from epfleet.formats.schema_version import (
    SCHEMA_VERSION,
    check_declared,
    check_writable,
    validate_json,
    validate_python,
)
from epfleet.trust.targets import canonical, model_targets, plan_bins

pytestmark = pytest.mark.fast

SHA = "a" * 64


def variant() -> dict[str, Any]:
    return {
        "ep": "CPUExecutionProvider",
        "device": "cpu",
        "compatibility_string": "cpu:x86_64",
        "artifact": {"uri": "variants/m/x86-cpu/b.onnx", "sha256": "b" * 64, "size": 2},
        "ort_version": "1.32.0",
        "compiled_at": "2026-11-30T00:00:00Z",
        "status": "ok",
        "source_sha256": SHA,
        "fingerprint": "f" * 64,
        "verification": {"status": "passed", "samples": 1, "tolerance": 0.05},
    }


def document(version: str = SCHEMA_VERSION) -> dict[str, Any]:
    return {
        "schema_version": version,
        "generation": 3,
        "models": {
            "m": {
                "source": {"uri": "sources/a.onnx", "sha256": SHA, "size": 1},
                "variants": {"x86-cpu": variant()},
            }
        },
    }


def with_future_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as a newer publisher writes it: a new key at every level a device reads."""
    future = copy.deepcopy(doc)
    future["signed_by"] = "ci-7"
    entry = future["models"]["m"]
    entry["licence"] = {"spdx": "MIT"}
    entry["source"]["mirror"] = "https://example.invalid/a.onnx"
    entry["variants"]["x86-cpu"]["power_profile"] = "eco"
    entry["variants"]["x86-cpu"]["verification"]["energy_joules"] = 0.4
    entry["variants"]["x86-cpu"]["artifact"]["compression"] = None
    return future


def data(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def first_error(exc: pytest.ExceptionInfo[ValidationError]) -> tuple[tuple[Any, ...], str]:
    error = exc.value.errors()[0]
    return tuple(error["loc"]), error["msg"]


def test_a_reader_takes_a_newer_minor_without_the_keys_it_does_not_know() -> None:
    read = Manifest.from_json(data(with_future_fields(document("1.9"))), newer_minor="ignore")
    known = Manifest.from_json(data(document()))
    assert read.schema_version == "1.9"
    assert read.models == known.models and read.generation == known.generation
    assert read.models["m"].variants["x86-cpu"].verification == (
        known.models["m"].variants["x86-cpu"].verification
    )


def test_a_writer_refuses_a_newer_minor_naming_both_versions() -> None:
    for doc in (document("1.9"), with_future_fields(document("1.9"))):
        with pytest.raises(ValidationError) as refused:
            Manifest.from_json(data(doc))
        loc, msg = first_error(refused)
        assert loc == ("schema_version",)
        assert f"schema 1.9, newer than this epfleet writes ({SCHEMA_VERSION})" in msg
        assert "upgrade epfleet on the compile host" in msg


@pytest.mark.parametrize("newer_minor", ["ignore", "refuse"])
def test_a_newer_major_is_refused(newer_minor: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Manifest.from_json(data(document("2.0")), newer_minor=newer_minor)  # type: ignore[arg-type]
    loc, msg = first_error(refused)
    assert loc == ("schema_version",)
    if newer_minor == "ignore":
        assert msg == (
            "the manifest declares schema 2.0, newer than this epfleet reads (1.x): "
            "update epfleet on this device; the manifest in force stays"
        )
    else:
        assert f"newer than this epfleet writes ({SCHEMA_VERSION})" in msg


@pytest.mark.parametrize("version", [SCHEMA_VERSION, "1"])
def test_an_unknown_key_at_the_readers_own_minor_stays_an_error(version: str) -> None:
    doc = document()
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"]["tolerence"] = 0.5  # a typo
    if version != SCHEMA_VERSION:
        doc["schema_version"] = version  # not MAJOR.MINOR: nothing to be lenient about
    with pytest.raises(ValidationError) as refused:
        Manifest.from_json(data(doc), newer_minor="ignore")
    loc, msg = first_error(refused)
    if version == SCHEMA_VERSION:
        assert loc == ("models", "m", "variants", "x86-cpu", "verification", "tolerence")
        assert msg == "Extra inputs are not permitted"
    else:
        assert loc == ("schema_version",)


def test_a_newer_minor_is_still_validated_in_every_field_it_knows() -> None:
    doc = with_future_fields(document("1.9"))
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"]["tolerance"] = 9.0  # too loose
    with pytest.raises(ValidationError) as refused:
        Manifest.from_json(data(doc), newer_minor="ignore")
    loc, _ = first_error(refused)
    assert loc == ("models", "m", "variants", "x86-cpu", "verification", "tolerance")


def test_a_signed_entry_follows_the_version_it_comes_with() -> None:
    entry = with_future_fields(document())["models"]["m"]
    text = canonical(entry).decode()
    taken = validate_json(ModelEntry, text, "ignore", "1.9")
    assert taken == ModelEntry.model_validate(document()["models"]["m"])
    assert validate_python(ModelEntry, entry, "ignore", "1.9") == taken
    assert "licence" in entry  # the caller's value is left as it was
    with pytest.raises(ValidationError):
        validate_json(ModelEntry, text, "ignore", "1.0")  # absent means 1.0: strict
    with pytest.raises(ValidationError) as refused:
        check_declared(ModelEntry, "2.1", "ignore")
    assert "schema 2.1, newer than this epfleet reads (1.x)" in first_error(refused)[1]
    check_declared(ModelEntry, "1.9", "ignore")  # a newer minor passes


def test_writers_refuse_a_document_a_reader_took() -> None:
    check_writable(None, "store")
    check_writable(SCHEMA_VERSION, "store")
    with pytest.raises(BadInputError, match=r"^/s: the manifest declares schema 1.9, newer"):
        check_writable("1.9", "/s")


def test_the_signed_targets_of_a_1_0_manifest_are_what_they_were() -> None:
    """Bins signed before the schema field existed compare equal to the targets wanted now:
    the next publish signs no bin again for it."""
    manifest_json = Manifest.from_json(data(document("1.0"))).to_json()
    wanted = model_targets(manifest_json)
    entry = json.loads(manifest_json)["models"]["m"]
    before = TargetFile.from_data("models/m", canonical(entry), ["sha256"])
    before.unrecognized_fields["custom"] = {"epfleet": canonical(entry).decode()}
    assert wanted["models/m"].info == before
    succinct = SuccinctRoles(["k"], 1, 4, "bin")
    now = datetime.now(timezone.utc)
    signed: dict[str, Targets] = {}
    for path, target in [("models/m", before), ("manifest.json", wanted["manifest.json"].info)]:
        signed.setdefault(
            succinct.get_role_for_target(path), Targets(expires=now.replace(year=now.year + 1))
        )
        signed[succinct.get_role_for_target(path)].targets[path] = target
    for name in succinct.get_roles():
        signed.setdefault(name, Targets(expires=now.replace(year=now.year + 1)))
    assert plan_bins(succinct, signed, wanted, now) == {}


def test_the_signed_target_of_a_newer_manifest_carries_its_schema() -> None:
    future = data(with_future_fields(document("1.9")))
    custom = model_targets(future)["models/m"].info.unrecognized_fields["custom"]
    assert custom["epfleet_schema"] == "1.9"
    assert json.loads(custom["epfleet"])["licence"] == {"spdx": "MIT"}


def test_a_signed_entry_of_schema_1_1_carries_the_previous_version_whole() -> None:
    """A model's signed target during a rollout of a new source: a device that reads its
    entry from its bin alone gets the previous version's source, samples and variants."""
    doc = document("1.1")
    entry = doc["models"]["m"]
    entry["rollout"] = {
        "id": "0" * 16,
        "salt": "5a17" * 8,
        "policy": {"stages": [10, 100]},
        "stage": 0,
        "started_at": "2026-11-30T00:00:00Z",
        "stage_started_at": "2026-11-30T00:00:00Z",
    }
    old = "c" * 64
    entry["previous_version"] = {
        "source": {"uri": f"sources/{old}.onnx", "sha256": old, "size": 1},
        "samples": {
            "uri": f"samples/{old}.npz",
            "sha256": old,
            "size": 2,
            "count": 1,
            "basis": "x",
        },
    }
    entry["previous"] = {"x86-cpu": variant() | {"source_sha256": old}}
    manifest = Manifest.from_json(data(doc))
    custom = model_targets(manifest.to_json())["models/m"].info.unrecognized_fields["custom"]
    assert custom["epfleet_schema"] == "1.1"
    signed = validate_json(ModelEntry, custom["epfleet"], "ignore", custom["epfleet_schema"])
    assert signed == manifest.models["m"] and signed.previous_version is not None
    assert signed.rollout is not None
    outside = next(f"d{i}" for i in range(100) if not is_member(signed.rollout, f"d{i}"))
    mine = signed.for_device(outside)
    assert mine.source.sha256 == old and mine.samples == signed.previous_version.samples
    assert mine.variants["x86-cpu"].source_sha256 == old
    assert "previous_version" not in Manifest.from_json(data(document())).to_json().decode()


def test_schema_1_2_records_the_task_metric_and_the_error_measure_inputs() -> None:
    """1.2 added a verification's task metric and what its relative error divided by; a
    reader of 1.1 (a device shipped before) drops them and installs as before."""
    doc = document("1.2")
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"] |= {
        "metric": {"kind": "topk_agreement", "output": "logits", "value": 1.0, "min": 0.99, "k": 5},
        "worst_output": "logits",
        "error_range": 12.5,
        "error_floor": 1.49e-6,
        "tail_abs_error": 0.002,
    }
    manifest = Manifest.from_json(data(doc))
    check = manifest.models["m"].variants["x86-cpu"].verification
    assert check is not None and check.metric is not None and check.metric.passed
    assert check.metric.describe() == "topk_agreement@5 1 (min 0.99)"
    assert json.loads(manifest.to_json())["models"]["m"]["variants"]["x86-cpu"]["verification"][
        "metric"
    ] == {"kind": "topk_agreement", "output": "logits", "value": 1.0, "min": 0.99, "k": 5}
    as_1_1 = validate_json(ModelEntry, json.dumps(doc["models"]["m"]), "ignore", "1.2")
    assert as_1_1.variants["x86-cpu"].verification == check
    without = document("1.2")
    assert (
        "metric"
        not in json.loads(Manifest.from_json(data(without)).to_json())["models"]["m"]["variants"][
            "x86-cpu"
        ]["verification"]
    )


def test_schema_1_3_records_how_each_lost_rung_lost_and_its_seconds() -> None:
    """1.3 added ``precision_tried[].outcome`` and ``.seconds``: written when known, read
    back as written; an entry without them keeps its bytes (no keys added)."""
    doc = document()
    entry = doc["models"]["m"]["variants"]["x86-cpu"]
    plain = Manifest.from_json(data(doc)).to_json()
    entry["precision"] = "w16a16"
    entry["precision_tried"] = [
        {"precision": "w8a8", "reason": "off", "outcome": "verification failed", "seconds": 1.17}
    ]
    read = Manifest.from_json(data(doc))
    [lost] = read.models["m"].variants["x86-cpu"].precision_tried
    assert (lost.outcome, lost.seconds) == ("verification failed", 1.17)
    written = json.loads(read.to_json())["models"]["m"]["variants"]["x86-cpu"]
    assert written["precision_tried"] == [entry["precision_tried"][0] | {"max_rel_error": None}]
    entry["precision_tried"] = [{"precision": "w8a8", "reason": "off"}]  # written before 1.3
    assert b"outcome" not in Manifest.from_json(data(doc)).to_json()
    assert b"precision_tried" not in plain


FOLDED_IO = {
    "inputs": [{"name": "x", "dtype": "uint8", "scale": 0.0039, "zero_point": 0}],
    "outputs": [{"name": "y", "dtype": "uint8", "scale": 0.021, "zero_point": 128}],
}


def test_schema_1_4_records_folded_io_and_a_1_3_device_never_sees_a_folded_variant() -> None:
    """1.4 added a variant's folded_io: how to feed a variant that takes and gives integers.
    A 1.3 reader would drop that key as a newer minor's and feed the variant floats, so the
    signed target keeps folded variants apart (custom.epfleet_folded): the entry a 1.3
    device reads (custom.epfleet) has no folded variant, and a folded previous variant is
    None there (a device outside the rollout then drops the target's variant)."""
    from epfleet.trust.targets import joined_folded

    doc = document("1.4")
    variants = doc["models"]["m"]["variants"]
    variants["htp-folded"] = variant() | {
        "ep": "QNNExecutionProvider",
        "device": "npu",
        "precision": "w8a8",
        "folded_io": FOLDED_IO,
    }
    doc["models"]["m"]["previous"] = {"htp-folded": variants["htp-folded"], "x86-cpu": None}
    manifest = Manifest.from_json(data(doc))
    folded = manifest.models["m"].variants["htp-folded"].folded_io
    assert folded is not None and folded.inputs[0].scale == 0.0039
    assert "folded_io" not in json.loads(manifest.to_json())["models"]["m"]["variants"]["x86-cpu"]
    custom = model_targets(manifest.to_json())["models/m"].info.unrecognized_fields["custom"]
    assert custom["epfleet_schema"] == "1.4"
    seen = json.loads(custom["epfleet"])
    assert list(seen["variants"]) == ["x86-cpu"] and "folded_io" not in custom["epfleet"]
    assert seen["previous"] == {"htp-folded": None, "x86-cpu": None}
    # as a 1.3 device reads it (any 1.x reader validates custom.epfleet alone)
    as_1_3 = validate_json(ModelEntry, custom["epfleet"], "ignore", "1.4")
    assert set(as_1_3.variants) == {"x86-cpu"}
    # as this epfleet reads it: whole again
    whole = joined_folded(seen, json.loads(custom["epfleet_folded"]))
    assert validate_python(ModelEntry, whole, "ignore", "1.4") == manifest.models["m"]
    # a model without folded variants is signed as before
    plain = model_targets(Manifest.from_json(data(document())).to_json())["models/m"]
    assert set(plain.info.unrecognized_fields["custom"]) == {"epfleet", "epfleet_schema"}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"scale": 0}, "greater than 0"),
        ({"scale": "NaN"}, "finite number"),
        ({"scale": -0.01}, "greater than 0"),
        ({"dtype": "float"}, "Input should be 'uint8', 'int8', 'uint16' or 'int16'"),
        ({"zero_point": -1}, "zero_point -1 is outside uint8's range [0, 255]"),
    ],
)
def test_a_folded_io_no_model_could_have_fails_the_entry(
    change: dict[str, Any], expected: str
) -> None:
    doc = document("1.4")
    bad = copy.deepcopy(FOLDED_IO)
    bad["inputs"][0] |= change
    doc["models"]["m"]["variants"]["x86-cpu"]["folded_io"] = bad
    with pytest.raises(ValidationError) as refused:
        validate_json(ModelEntry, json.dumps(doc["models"]["m"]), "ignore", "1.4")
    where, message = first_error(refused)
    assert where[:4] == ("variants", "x86-cpu", "folded_io", "inputs") and expected in message


def test_schema_1_5_records_a_sequence_metric_time_axis() -> None:
    """1.5 added a ``sequence_match`` metric's ``time_axis``: read back as written and
    carried into the spec a device measures again; a metric without it keeps its bytes."""
    doc = document()
    metric = {"kind": "sequence_match", "output": "387", "value": 1.0, "min": 0.99, "blank": 0}
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"]["metric"] = dict(metric)
    plain = Manifest.from_json(data(doc)).to_json()
    assert b"time_axis" not in plain
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"]["metric"]["time_axis"] = 0
    read = Manifest.from_json(data(doc))
    check = read.models["m"].variants["x86-cpu"].verification
    assert check is not None and check.metric is not None
    assert check.metric.time_axis == 0 and check.metric.spec().time_axis == 0
    written = json.loads(read.to_json())["models"]["m"]["variants"]["x86-cpu"]["verification"]
    assert written["metric"] == metric | {"time_axis": 0}


def test_schema_1_6_records_revoked_device_keys() -> None:
    """1.6 added ``revoked_device_keys``: read back as written, keyed by key id, left out
    when empty (a manifest without revocations keeps its bytes)."""
    doc = document()
    assert b"revoked_device_keys" not in Manifest.from_json(data(doc)).to_json()
    revoked = {"c" * 64: {"device": "dev-1", "revoked_at": "2026-12-07T10:00:00Z"}}
    doc["revoked_device_keys"] = revoked
    read = Manifest.from_json(data(doc))
    assert read.revoked_device_keys["c" * 64].device == "dev-1"
    assert json.loads(read.to_json())["revoked_device_keys"] == revoked
    doc["revoked_device_keys"] = {"not-a-key-id": revoked["c" * 64]}
    with pytest.raises(ValidationError):
        Manifest.from_json(data(doc))


def test_schema_1_7_records_what_a_metric_rests_on() -> None:
    """1.7 added a metric's inputs by set, a rate's count and bounds and what they show:
    read back as written; a metric without them keeps its bytes; a count whose hits exceed
    its trials is refused."""
    doc = document()
    metric = {"kind": "sequence_match", "output": "387", "value": 0.5, "min": 0.99}
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"]["metric"] = dict(metric)
    plain = Manifest.from_json(data(doc)).to_json()
    assert b"trials" not in plain and b"evidence" not in plain
    weighed = {
        "inputs": {"samples": 12, "calibration": 96},
        "hits": 54,
        "trials": 108,
        "low": 0.418,
        "high": 0.582,
        "evidence": "misses",
    }
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"]["metric"] = metric | weighed
    read = Manifest.from_json(data(doc))
    check = read.models["m"].variants["x86-cpu"].verification
    assert check is not None and check.metric is not None
    assert check.metric.input_count == 108 and check.metric.evidence == "misses"
    assert check.metric.shown() == (
        "sequence_match 54/108 = 0.5 [0.418, 0.582] (min 0.99) on 108 inputs"
    )
    written = json.loads(read.to_json())["models"]["m"]["variants"]["x86-cpu"]["verification"]
    assert written["metric"] == metric | weighed
    doc["models"]["m"]["variants"]["x86-cpu"]["verification"]["metric"]["hits"] = 109
    with pytest.raises(ValidationError):
        Manifest.from_json(data(doc))


def test_schema_1_7_names_a_metric_s_input_sets_file_and_keeps_it_from_gc() -> None:
    """The golden samples' ``metric_inputs`` (1.7): read back as written, left out when
    absent, and among the store keys the manifest names (gc keeps it)."""
    from epfleet.formats.manifest import referenced_keys

    doc = document()
    golden, sets = "a" * 64, "b" * 64
    doc["models"]["m"]["samples"] = {
        "uri": f"samples/{golden}.npz",
        "sha256": golden,
        "size": 2,
        "count": 1,
        "basis": "x",
    }
    assert b"metric_inputs" not in Manifest.from_json(data(doc)).to_json()
    doc["models"]["m"]["samples"]["metric_inputs"] = {
        "uri": f"samples/{sets}.npz",
        "sha256": sets,
        "size": 3,
    }
    read = Manifest.from_json(data(doc))
    samples = read.models["m"].samples
    assert samples is not None and samples.metric_inputs is not None
    assert json.loads(read.to_json())["models"]["m"]["samples"]["metric_inputs"]["size"] == 3
    assert {f"samples/{golden}.npz", f"samples/{sets}.npz"} <= referenced_keys(read)
