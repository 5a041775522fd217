"""Verified variants end to end through the CLI: coverage, verification and golden
samples published by `epfleet compile`, a forced rebuild that is the same build, and a
partial compile published or refused by min_coverage (pure parts: tests/fleet/test_verify.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epfleet.formats.manifest import Manifest
from tests.support.cli_runs import epfleet
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec

pytestmark = pytest.mark.slow


def test_compile_publishes_coverage_verification_and_golden_samples(
    tmp_path: Path, model_dir: Path, cli_env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [HTP_TARGETS[0], CPU_TARGET])
    store = tmp_path / "store"
    result = epfleet("compile", str(spec), "--store", str(store), "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    manifest = Manifest.from_json((store / "manifest.json").read_bytes())
    for name, model in manifest.models.items():
        assert model.samples is not None
        assert (store / model.samples.uri).stat().st_size == model.samples.size
        for target, variant in model.variants.items():
            assert variant.coverage is not None and variant.coverage.fraction == 1.0, (name, target)
            check = variant.verification
            assert check is not None and check.status == "passed", (name, target, check)
            assert check.samples == 1 and check.tolerance == (
                0.05 if target == "sd8g3-htp" else 1e-3
            )
    report = json.loads(result.stdout)
    assert {v["verification"] for v in report["variants"]} == {"passed"}
    shown = epfleet("manifest", "show", "--store", str(store), env=cli_env)
    assert "coverage" in shown.stdout and "passed" in shown.stdout

    # A forced rebuild is the same build (fingerprint, string, verification): QNN's bytes may
    # differ, but the published artifacts stay and no device downloads again.
    again = epfleet("compile", str(spec), "--store", str(store), "--force", "--json", env=cli_env)
    assert again.returncode == 0, again.stderr
    rebuilt = Manifest.from_json((store / "manifest.json").read_bytes())
    for name, model in rebuilt.models.items():
        for target, variant in model.variants.items():
            before = manifest.models[name].variants[target].artifact
            assert variant.artifact == before, (name, target)
    reported = {
        (v["model"], v["target"]): v["artifact_uri"] for v in json.loads(again.stdout)["variants"]
    }
    assert reported == {
        (name, target): variant.artifact.uri
        for name, model in rebuilt.models.items()
        for target, variant in model.variants.items()
        if variant.artifact is not None
    }


def test_a_partial_compile_is_published_verified_or_refused_by_min_coverage(
    tmp_path: Path, model_dir: Path, cli_env: dict[str, str]
) -> None:
    model = {
        "name": "partial",
        "source": str(model_dir / "partial.onnx"),
        "input_shapes": {"x": [1, 3, 8, 8]},
    }
    strict = HTP_TARGETS[1] | {"min_coverage": 1.0}
    spec = write_spec(tmp_path, [model], [HTP_TARGETS[0], strict])
    store = tmp_path / "store"
    result = epfleet("compile", str(spec), "--store", str(store), "--json", env=cli_env)
    assert result.returncode == 1, result.stderr
    by_target = {v["target"]: v for v in json.loads(result.stdout)["variants"]}

    # QNN takes the Conv, Sigmoid and Add; the NonZero runs on ORT's CPU EP. The partial
    # variant is run whole (HTP backend + CPU EP) and matches its source.
    published = Manifest.from_json((store / "manifest.json").read_bytes()).models["partial"]
    lenient = published.variants["sd8g3-htp"]
    assert lenient.status == "ok" and lenient.coverage is not None
    assert (lenient.coverage.ep_nodes, lenient.coverage.other_nodes) == (3, 1)
    assert lenient.coverage.fraction == 0.75
    assert lenient.coverage.other_op_types == ["NonZero"]
    assert lenient.verification is not None and lenient.verification.status == "passed"
    assert by_target["sd8g3-htp"]["coverage"] == 0.75

    refused = by_target["sd8g2-htp"]
    assert refused["status"] == "failed"
    assert refused["error"] == (
        "QNNExecutionProvider took 75% of 'partial' (3 of 4 nodes), below the target's "
        "min_coverage 1; left out: NonZero"
    )
    # The refused build keeps what was measured, in --json and in the manifest.
    assert refused["coverage"] == 0.75 and refused["seconds"] is not None
    failed = published.variants["sd8g2-htp"]
    assert failed.status == "failed" and failed.coverage is not None
    assert failed.coverage.fraction == 0.75 and failed.coverage.other_op_types == ["NonZero"]
    assert by_target["sd8g3-htp"]["samples_origin"] == "generated"

    # Up to date, failed: the next run compiles nothing and reports the same failure.
    again = epfleet("compile", str(spec), "--store", str(store), "--json", env=cli_env)
    assert again.returncode == 1, again.stderr
    report = json.loads(again.stdout)
    assert (report["compiled"], report["skipped"], report["failed"]) == (0, 1, 1)
    settled = {v["target"]: v for v in report["variants"]}["sd8g2-htp"]
    assert settled["error"].startswith(refused["error"] + " [up to date, not compiled again")
    assert settled["coverage"] == 0.75
    assert Manifest.from_json((store / "manifest.json").read_bytes()).models["partial"] == (
        published
    )
    shown = epfleet("manifest", "show", "--store", str(store), env=cli_env).stdout
    assert "passed" in shown and "†" in shown  # HTP verified on generated inputs only
