"""Nothing unchecked is published ok, and a failed pair is a settled fact: a verification
past its time limit, or with no golden to compare against, fails the pair with its
reason; the failure keeps what was measured (coverage, seconds, verification) in the
report and the manifest, and the pair is not compiled again until its inputs change (the
verification settings are inputs) or --force. Real CPU compiles and verifications, run
as the CLI runs them without Prefect (``epfleet.cli.compile._run_without_prefect``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.cli.compile import _run_without_prefect
from epfleet.errors import BadInputError, CompileError, RejectedBuild, StoreError
from epfleet.fleet.build.input_memory import check_input_memory
from epfleet.fleet.build.variant import failure_text
from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.publishing.publish import read_manifest
from epfleet.fleet.runs.models import SETTLED, RunReport
from epfleet.fleet.runs.outcomes import failed_entry, outcome_of_failure
from epfleet.formats.manifest import Coverage, Manifest, SamplesRef, Verification
from epfleet.runtime.requests import CompileRequest, fingerprinted
from epfleet.stores import open_store
from tests.support.specs import tiny_models, write_spec

pytestmark = pytest.mark.fast

CPU = "CPUExecutionProvider"


def run(spec: Path, store: str, force: bool = False) -> tuple[RunReport, Manifest, int]:
    """One `epfleet compile` without Prefect: the report, the manifest, pairs compiled."""
    plan = plan_run(spec, store, force=force)
    if plan.is_noop:
        report = plan.report({}, plan.generation, published=False)
    else:
        report = _run_without_prefect(plan, store, 1)
    manifest, _ = read_manifest(open_store(store))
    assert manifest is not None
    return report, manifest, len(plan.to_compile)


def _slow_loop(path: Path, trips: int = 500_000) -> Path:
    """y = x + ``trips`` iterations of +1: about 0.6 s on the CPU EP here, so far past a
    0.05 s verify_timeout on any machine (the worker opens a session first)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)],
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [
            numpy_helper.from_array(np.array(trips, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_verification_past_its_time_limit_fails_the_pair_until_its_inputs_change(
    tmp_path: Path,
) -> None:
    source = _slow_loop(tmp_path / "slow.onnx")
    models = [{"name": "slow", "source": str(source)}]
    target = {"name": "x86-cpu", "ep": CPU, "verify_timeout": 0.05}
    spec = write_spec(tmp_path, models, [target])
    store = str(tmp_path / "store")

    report, manifest, compiled = run(spec, store)
    [result] = report.variants
    assert (compiled, report.failed, report.exit_code) == (1, 1, 1)
    assert result.status == "failed" and result.error is not None
    assert result.error.startswith(
        "verification failed: verification ran past its time limit of 0.05 s (verify_timeout)"
    )
    # The failure keeps what was measured: in the report (--json, the matrix) ...
    assert result.coverage == 1.0 and result.seconds is not None
    assert result.verification == "failed" and result.verification_seconds is not None
    # ... and in the manifest.
    entry = manifest.models["slow"].variants["x86-cpu"]
    assert entry.status == "failed" and entry.artifact is None
    assert entry.coverage is not None and entry.coverage.fraction == 1.0
    assert entry.verification is not None and entry.verification.status == "failed"
    assert entry.verification.seconds is not None

    # Nothing changed: not compiled or verified again, still reported failed, same manifest.
    again, unchanged, compiled = run(spec, store)
    [settled] = again.variants
    assert compiled == 0 and again.exit_code == 1
    assert settled.status == "failed" and settled.error == f"{entry.error} [{SETTLED}]"
    assert (settled.coverage, settled.verification) == (1.0, "failed")
    assert unchanged == manifest

    # The timeout is an input: raised, the pair compiles again, and passes.
    spec = write_spec(tmp_path, models, [target | {"verify_timeout": 600}])
    fixed, published, compiled = run(spec, store)
    assert compiled == 1 and fixed.exit_code == 0
    variant = published.models["slow"].variants["x86-cpu"]
    assert variant.status == "ok" and variant.verification is not None
    assert variant.verification.status == "passed"
    assert variant.verification.samples_origin == "generated"
    assert variant.fingerprint != entry.fingerprint

    # Lowered again: that build fails, the passing one stays published with the failure
    # (and what was measured) beside it, and the next run compiles nothing.
    spec = write_spec(tmp_path, models, [target])
    failed_again, kept, compiled = run(spec, store)
    assert compiled == 1 and failed_again.exit_code == 1
    stays = kept.models["slow"].variants["x86-cpu"]
    assert stays.status == "ok" and stays.fingerprint == variant.fingerprint
    assert stays.failed_build is not None and stays.failed_build.fingerprint == entry.fingerprint
    assert stays.failed_build.verification is not None
    assert stays.failed_build.verification.status == "failed"
    settled_again, same, compiled = run(spec, store)
    [result] = settled_again.variants
    assert compiled == 0 and same == kept and result.status == "failed"
    assert result.error is not None and result.error.startswith("verification failed: ")
    assert result.error.endswith(f"[{SETTLED}; an older build stays published]")

    # --force compiles a settled pair again.
    _, _, compiled = run(spec, store, force=True)
    assert compiled == 1


def _gathers_out_of_range(path: Path) -> Path:
    """Loads and compiles, but every run fails: it gathers index 5 of a 4-wide input."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "index"], ["y"], axis=1)],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(np.array([5], np.int64), "index")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_pair_without_golden_samples_fails_unless_verify_is_false(tmp_path: Path) -> None:
    source = _gathers_out_of_range(tmp_path / "broken.onnx")
    targets = [{"name": "checked", "ep": CPU}, {"name": "unchecked", "ep": CPU, "verify": False}]
    spec = write_spec(tmp_path, [{"name": "broken", "source": str(source)}], targets)
    report, manifest, _ = run(spec, str(tmp_path / "store"))
    checked, unchecked = report.variants
    assert checked.status == "failed" and checked.error is not None
    assert checked.error.startswith(
        "verification failed: no golden samples: the source on the CPU EP: running sample 0 "
        "failed: [ONNXRuntimeError]"
    )
    assert "(set verify: false on the target to publish it unverified)" in checked.error
    assert (unchecked.status, unchecked.verification) == ("ok", "unverified")
    assert manifest.models["broken"].variants["checked"].status == "failed"


def test_input_shapes_too_large_for_memory_are_refused_naming_the_input(
    tmp_path: Path, model_dir: Path
) -> None:
    [model] = tiny_models(model_dir)[:1]
    huge = model | {"input_shapes": {"x": [1, 3, 100000, 100000]}}
    spec = write_spec(tmp_path, [huge], [{"name": "x86-cpu", "ep": CPU}])
    with pytest.raises(BadInputError) as refused:
        plan_run(spec, str(tmp_path / "store"))
    message = str(refused.value)
    assert message.startswith(
        f"models[tiny-cls] ({model['source']}): input 'x' [1, 3, 100000, 100000] float32 "
        "takes 111.8 GiB a sample; one sample's inputs may take at most "
    )
    assert not (tmp_path / "store" / "manifest.json").exists()


def test_the_input_memory_bound_is_an_eighth_of_memory_for_all_inputs_together(
    model_dir: Path,
) -> None:
    model = onnx.load(str(model_dir / "tiny-det.onnx"))
    from epfleet.runtime.shapes import fix_input_shapes

    fix_input_shapes(model, {"image": [1, 3, 64, 64]})  # 48 KiB, and 'gain' beside it
    check_input_memory(model, memory=8 * 64 * 1024)
    with pytest.raises(ValueError, match=r"^input 'image' \[1, 3, 64, 64\] float32 takes 48 KiB"):
        check_input_memory(model, memory=8 * 40 * 1024)


def test_default_verification_settings_keep_the_fingerprints_pairs_had() -> None:
    """Pinned: the fingerprint epfleet gave this pair before verify_timeout became an input
    (commit 975ce22). Pairs with the default timeout are not rebuilt by the upgrade."""
    request = CompileRequest(
        model="m",
        target="t",
        ep="QNNExecutionProvider",
        device="npu",
        provider_options={"htp_arch": "75"},
        input_shapes={"x": [1, 3, 8, 8]},
        source_key="sources/" + "a" * 64 + ".onnx",
        source_sha256="a" * 64,
        source_size=10,
        samples=SamplesRef(
            uri="samples/" + "b" * 64 + ".npz", sha256="b" * 64, size=5, count=1, basis="c" * 64
        ),
        fingerprint="",
    )
    identity = {"package": "onnxruntime-qnn", "version": "2.7.0"}
    default = fingerprinted(request, "1.32.0", identity).fingerprint
    assert default == "3c56ffc27e06ef664a47efc815fedd7458aacb0b5254f377ff435cf3156671a1"
    longer = request.model_copy(update={"verify_timeout": 1200})
    assert fingerprinted(longer, "1.32.0", identity).fingerprint != default


def test_a_rejected_build_crosses_processes_with_its_measurements(tmp_path: Path) -> None:
    """Dask hands a compile task's exception back pickled: the failed entry comes along."""
    request = CompileRequest(
        model="m",
        target="t",
        ep=CPU,
        device="cpu",
        provider_options={},
        input_shapes={},
        source_key="sources/" + "a" * 64 + ".onnx",
        source_sha256="a" * 64,
        source_size=10,
        fingerprint="f",
    )
    checked = Coverage(ep_nodes=2, other_nodes=1, fraction=0.6667, other_op_types=["NonZero"])
    entry = failed_entry(request, "below min_coverage", checked)
    copied = pickle.loads(pickle.dumps(RejectedBuild(entry, 1.25)))
    assert isinstance(copied, CompileError) and str(copied) == "below min_coverage"
    assert (copied.entry, copied.seconds) == (entry, 1.25)
    outcome = outcome_of_failure(request, copied)
    assert outcome.publish and outcome.entry.coverage == checked
    assert (outcome.result.coverage, outcome.result.seconds) == (0.6667, 1.25)
    # Not a verdict on the build (a store still failing): reported, not recorded.
    assert not outcome_of_failure(request, StoreError("the store is down")).publish
    assert outcome_of_failure(request, CompileError("QNN said no")).publish


def test_a_pair_that_failed_verification_says_so_once() -> None:
    """Its progress line: "failed verification: <reason>", the reason not prefixed again."""
    request = CompileRequest(
        model="m", target="t", ep=CPU, device="cpu", provider_options={}, input_shapes={},
        source_key="sources/" + "a" * 64 + ".onnx", source_sha256="a" * 64, source_size=10,
        fingerprint="f",
    )  # fmt: skip
    reason = "output 0 differs from the source by 1.2% of its range (tolerance 0.1%)"
    checked = Verification(status="failed", reason=reason)
    entry = failed_entry(request, f"verification failed: {reason}", verification=checked)
    assert failure_text(RejectedBuild(entry, 1.0)) == f"failed verification: {reason}"
    assert failure_text(CompileError("QNN said no")) == "failed: QNN said no"
