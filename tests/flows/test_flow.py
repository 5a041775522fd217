"""The fleet-compile flow under a real (isolated) Prefect API, on the local store."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from prefect.artifacts import Artifact

from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_file
from flows.fleet_compile import fleet_compile
from tests.support.specs import (
    CPU_TARGET,
    HTP_TARGETS,
    assert_variants_match_store,
    with_npu_unfriendly_model,
    write_spec,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def read_manifest(store: Path) -> Manifest:
    return Manifest.from_json((store / "manifest.json").read_bytes())


def test_compile_publish_and_incremental_rerun(fleet_spec: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    report = fleet_compile(spec=str(fleet_spec), store=str(store), workers=2)
    assert (report.compiled, report.skipped, report.failed) == (6, 0, 0)
    assert report.generation == 1 and report.published

    manifest = read_manifest(store)
    assert list(manifest.models) == ["tiny-cls", "tiny-det"]
    assert list(manifest.models["tiny-cls"].variants) == ["sd8g3-htp", "sd8g2-htp", "x86-cpu"]
    for model in manifest.models.values():
        assert sha256_file(store / model.source.uri) == (model.source.sha256, model.source.size)
    assert assert_variants_match_store(manifest, lambda key: (store / key).read_bytes()) == 6
    assert manifest.models["tiny-det"].source.input_shapes == {"image": [1, 3, 64, 64]}

    table = Artifact.get("fleet-compile-matrix")
    assert table is not None
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert {row["model"] for row in rows} == {"tiny-cls", "tiny-det"}
    assert rows[0]["sd8g3-htp"].startswith("ok fp16 ")  # the precision it computes in
    assert rows[0]["x86-cpu"].startswith("ok fp32 ")
    details = Artifact.get("fleet-compile-details")
    assert details is not None
    lines = json.loads(details.data) if isinstance(details.data, str) else details.data
    assert len(lines) == 6

    again = fleet_compile(spec=str(fleet_spec), store=str(store), workers=2)
    assert (again.compiled, again.skipped, again.failed) == (0, 6, 0)
    assert again.generation == 1 and not again.published
    assert read_manifest(store) == manifest


def test_failing_pair_does_not_block_the_others(tmp_path: Path, model_dir: Path) -> None:
    spec = with_npu_unfriendly_model(tmp_path, model_dir, [HTP_TARGETS[0], CPU_TARGET])
    store = tmp_path / "store"
    report = fleet_compile(spec=str(spec), store=str(store), workers=2)
    by_pair = {(v.model, v.target): v for v in report.variants}
    assert by_pair[("nonzero", "sd8g3-htp")].status == "failed"
    assert "Unable to compile any nodes" in (by_pair[("nonzero", "sd8g3-htp")].error or "")
    assert [
        by_pair[p].status
        for p in [("tiny-cls", "sd8g3-htp"), ("tiny-cls", "x86-cpu"), ("nonzero", "x86-cpu")]
    ] == ["ok"] * 3
    assert (report.compiled, report.failed) == (3, 1)

    manifest = read_manifest(store)
    failed = manifest.models["nonzero"].variants["sd8g3-htp"]
    assert (
        failed.status == "failed"
        and failed.artifact is None
        and "Unable to compile" in (failed.error or "")
    )
    assert manifest.models["nonzero"].variants["x86-cpu"].status == "ok"

    # A failed pair is retried on the next run; the ok ones are not recompiled.
    again = fleet_compile(spec=str(spec), store=str(store), workers=2)
    assert (again.compiled, again.skipped, again.failed) == (0, 3, 1)
    assert again.generation == report.generation  # the same failure changes nothing


def test_changed_target_recompiles_only_its_pairs(fleet_spec: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    fleet_compile(spec=str(fleet_spec), store=str(store), workers=2)
    before = read_manifest(store)
    text = fleet_spec.read_text().replace("soc_model: 43", "soc_model: 53")
    fleet_spec.write_text(text)
    report = fleet_compile(spec=str(fleet_spec), store=str(store), workers=2)
    compiled = sorted((v.model, v.target) for v in report.variants if v.status == "ok")
    assert compiled == [("tiny-cls", "sd8g2-htp"), ("tiny-det", "sd8g2-htp")]
    after = read_manifest(store)
    assert after.generation == before.generation + 1
    assert (
        after.models["tiny-cls"].variants["sd8g2-htp"].compatibility_string.endswith(":73:53:8:0")
    )
    assert (
        after.models["tiny-cls"].variants["sd8g3-htp"]
        == before.models["tiny-cls"].variants["sd8g3-htp"]
    )


def test_force_and_subsets(fleet_spec: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    fleet_compile(spec=str(fleet_spec), store=str(store), workers=2, targets=["x86-cpu"])
    assert set(read_manifest(store).models["tiny-cls"].variants) == {"x86-cpu"}
    report = fleet_compile(
        spec=str(fleet_spec),
        store=str(store),
        workers=1,
        models=["tiny-det"],
        targets=["x86-cpu"],
        force=True,
    )
    assert [(v.model, v.target, v.status) for v in report.variants] == [
        ("tiny-det", "x86-cpu", "ok")
    ]
    stored = onnx.load(
        str(store / read_manifest(store).models["tiny-det"].variants["x86-cpu"].artifact.uri)
    )
    assert any(p.key == "ep_compatibility_info.CPUExecutionProvider" for p in stored.metadata_props)


def test_pairs_with_identical_inputs_keep_their_own_artifacts(
    tmp_path: Path, model_dir: Path
) -> None:
    """Two models from one source × two identical targets: four distinct artifacts, each
    stored under its own sha256 and naming its own pair."""
    source = str(model_dir / "tiny-det.onnx")
    spec = write_spec(
        tmp_path,
        [{"name": "det-a", "source": source}, {"name": "det-b", "source": source}],
        [
            {"name": "cpu-a", "ep": "CPUExecutionProvider"},
            {"name": "cpu-b", "ep": "CPUExecutionProvider"},
        ],
    )
    store = tmp_path / "store"
    report = fleet_compile(spec=str(spec), store=str(store), workers=4)
    assert (report.compiled, report.failed) == (4, 0)
    manifest = read_manifest(store)
    assert assert_variants_match_store(manifest, lambda key: (store / key).read_bytes()) == 4
    for model_name, model in manifest.models.items():
        for target, variant in model.variants.items():
            stored = onnx.load(str(store / variant.artifact.uri))
            props = {p.key: p.value for p in stored.metadata_props}
            assert (props["epfleet.model"], props["epfleet.target"]) == (model_name, target)
