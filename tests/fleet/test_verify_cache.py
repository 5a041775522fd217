"""A variant this machine verified before for the same store (same artifact bytes, golden
samples, EP and ORT builds, tolerances and time limit) is not run again: its record is the
earlier one, marked reused, and its manifest entry is then the same build as before. Real CPU
compiles and verifications, run as the CLI runs them without Prefect."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.cli.compile import _run_without_prefect
from epfleet.fleet.build.staging import cache_dir
from epfleet.fleet.build.verify_cache import (
    VerifyKey,
    recalled,
    remember,
    verification_key,
    verified_dir,
)
from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.publishing.publish import read_manifest
from epfleet.fleet.runs.models import RunReport
from epfleet.formats.manifest import Manifest, Verification
from epfleet.stores import open_store
from tests.support.specs import tiny_models, write_spec

pytestmark = pytest.mark.fast

CPU = "CPUExecutionProvider"
KEY = VerifyKey(
    artifact=[("model.onnx", "a" * 64, 10), ("model.onnx.data", "b" * 64, 20)],
    samples_sha256="c" * 64,
    ep=CPU,
    ep_build={"package": "onnxruntime", "version": "1.32.0"},
    ort_version="1.32.0",
    device="cpu",
    provider_options={},
    tolerance=0.01,
    abs_tolerance=0.0,
    verify_timeout=600.0,
)


def compile_once(spec: Path, store: str, force: bool = False) -> tuple[RunReport, Manifest]:
    plan = plan_run(spec, store, force=force)
    report = _run_without_prefect(plan, store, 1)
    manifest, _ = read_manifest(open_store(store))
    assert manifest is not None
    return report, manifest


def test_every_input_of_a_verification_changes_its_key_and_file_order_does_not() -> None:
    base = verification_key(KEY)
    assert base == verification_key(KEY.model_copy(update={"artifact": KEY.artifact[::-1]}))
    changes = {
        "artifact": [("model.onnx", "d" * 64, 10)],
        "samples_sha256": "e" * 64,
        "ep_build": {"package": "onnxruntime", "version": "1.33.0"},
        "ort_version": "1.33.0",
        "device": "npu",
        "provider_options": {"htp_arch": "75"},
        "tolerance": 0.02,
        "abs_tolerance": 0.001,
        "verify_timeout": 5.0,
        "metric_inputs_sha256": "f" * 64,
        "decision_default": False,  # metric: {kind: none}
    }
    keys = {
        field: verification_key(KEY.model_copy(update={field: v})) for field, v in changes.items()
    }
    assert base not in keys.values() and len(set(keys.values())) == len(changes)
    # Fields left unset stay out of the key: records from before them are still found.
    assert base == verification_key(KEY.model_copy(update={"decision_default": None}))


def test_only_passed_results_are_kept_and_a_damaged_file_is_a_miss(tmp_path: Path) -> None:
    passed = Verification(status="passed", samples=1, max_rel_error=0.001, seconds=2.5)
    failed = Verification(status="failed", reason="ran past its time limit", seconds=9.0)
    remember(tmp_path, "k1", passed)
    remember(tmp_path, "k2", failed)
    assert recalled(tmp_path, "k1") == passed
    assert recalled(tmp_path, "k2") is None and recalled(tmp_path, "k3") is None
    (tmp_path / "k1.json").write_text("{not json")
    assert recalled(tmp_path, "k1") is None


def test_a_rebuild_of_the_same_artifact_reuses_its_verification(
    tmp_path: Path, model_dir: Path
) -> None:
    models = tiny_models(model_dir)[:1]
    target = {"name": "x86-cpu", "ep": CPU}
    spec = write_spec(tmp_path, models, [target])
    store = str(tmp_path / "store")

    _, manifest = compile_once(spec, store)
    first = manifest.models["tiny-cls"].variants["x86-cpu"]
    assert first.verification is not None and first.verification.status == "passed"
    assert not first.verification.reused and first.verification.seconds
    assert list(verified_dir(cache_dir(), open_store(store).uri).glob("*.json"))

    # Compiled again (--force), same bytes: not run again (no seconds spent), and the
    # entry is the same build, so the published one stays as it was.
    report, again = compile_once(spec, store, force=True)
    [pair] = report.variants
    assert pair.verification == "passed" and pair.verification_seconds == 0.0
    assert again.models["tiny-cls"].variants["x86-cpu"] == first
    assert again.generation == manifest.generation

    # The same build published to another store on this machine is verified for that
    # store: what was verified for one store is never another's record.
    _, other = compile_once(spec, str(tmp_path / "other-store"))
    theirs = other.models["tiny-cls"].variants["x86-cpu"]
    assert theirs.digest == first.digest and theirs.verification is not None
    assert not theirs.verification.reused and theirs.verification.seconds
    assert theirs.verification.max_rel_error == first.verification.max_rel_error

    # A tolerance is part of the key: a looser one verifies again.
    spec = write_spec(tmp_path, models, [target | {"tolerance": 0.05}])
    _, looser = compile_once(spec, store)
    verified = looser.models["tiny-cls"].variants["x86-cpu"].verification
    assert verified is not None and not verified.reused and verified.seconds
