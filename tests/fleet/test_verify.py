"""Verified variants: golden samples, coverage, and running every new variant with its own
EP on this host before it is published. QNN HTP variants run for real through the
plugin's HTP backend, which executes context binaries on this x86 CPU."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.errors import WorkerDied, WorkerTimeout
from epfleet.fleet.build.variant import verify_output
from epfleet.fleet.build.verify import (
    GoldenJob,
    VerifyJob,
    computed_peak,
    fp16_overflow,
    make_golden,
    verify_artifact,
)
from epfleet.fleet.planning.plan import plan_run
from epfleet.runtime.compile_pool import CompilePool
from epfleet.runtime.compiler import CompileJob, CompileOutput, compile_job, measure_coverage
from epfleet.runtime.requests import CompileRequest
from epfleet.runtime.samples import (
    InputInfo,
    compare,
    generated_samples,
    load_samples,
    read_golden,
    write_golden,
)
from epfleet.runtime.workers import IsolatedWorkers
from epfleet.stores import open_store
from epfleet.text import share
from tests.support.native_writers import abort, double, sleep
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec

pytestmark = pytest.mark.fast

# --- samples and golden files (pure) ----------------------------------------------------


def test_generated_samples_are_seeded_and_typed() -> None:
    inputs = [InputInfo("x", "float32", [2, 3]), InputInfo("ids", "int64", [4])]
    first, again = generated_samples(inputs, 2), generated_samples(inputs, 2)
    assert len(first) == 2
    assert first[0]["x"].dtype == np.float32 and first[0]["ids"].dtype == np.int64
    np.testing.assert_array_equal(first[1]["x"], again[1]["x"])
    assert not np.array_equal(first[0]["x"], first[1]["x"])
    assert set(np.unique(first[0]["ids"])) <= {0, 1}


def test_samples_file_one_or_many_samples_and_clear_errors(tmp_path: Path) -> None:
    inputs = [InputInfo("x", "float32", [1, 3])]
    one = tmp_path / "one.npz"
    np.savez(one, x=np.ones((1, 3), np.float32))
    assert len(load_samples(one, inputs)) == 1
    many = tmp_path / "many.npz"
    np.savez(many, x=np.ones((5, 1, 3), np.float32))
    assert [s["x"].shape for s in load_samples(many, inputs)] == [(1, 3)] * 5
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"array 'x' has shape \[1, 4\]; input 'x' takes"):
        load_samples(wrong, inputs)
    extra = tmp_path / "extra.npz"
    np.savez(extra, x=np.ones((1, 3), np.float32), y=np.ones(1))
    with pytest.raises(ValueError, match=r"arrays \['y'\] that are not model inputs"):
        load_samples(extra, inputs)


def test_golden_file_is_byte_stable_and_reads_back(tmp_path: Path) -> None:
    samples = generated_samples([InputInfo("x", "float32", [2, 2])], 2)
    outputs = [[s["x"] * 2, np.array([1, 2])] for s in samples]
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    write_golden(a, samples, outputs)
    os.utime(tmp_path, (1, 1))
    write_golden(b, samples, outputs)
    assert a.read_bytes() == b.read_bytes()  # content-addressable
    read_samples, read_outputs = read_golden(a)
    np.testing.assert_array_equal(read_samples[1]["x"], samples[1]["x"])
    np.testing.assert_array_equal(read_outputs[0][1], [1, 2])


def test_compare_reports_error_relative_to_the_range_and_top1() -> None:
    reference = [[np.array([[0.0, 10.0, 5.0], [4.0, 0.0, 1.0]], np.float32)]]
    close = [[reference[0][0] + 0.05]]
    result = compare(close, reference)
    assert result.max_rel_error == pytest.approx(0.005, rel=1e-3)
    assert result.top1_agreement == 1.0 and result.failure(0.01) is None
    flipped = [[np.array([[0.0, 10.0, 11.0], [4.0, 0.0, 1.0]], np.float32)]]
    result = compare(flipped, reference)
    assert result.top1_agreement == 0.5
    assert (
        result.failure(0.02)
        == "output 0 differs from the source by 60.0% of its range (tolerance 2.0%; 6 against "
        "an absolute floor of 0)"
    )
    assert result.failure(0.02, abs_tolerance=10) is None  # within the absolute floor
    with pytest.raises(ValueError, match="NaN or inf"):
        compare([[np.full((2, 3), np.nan, np.float32)]], reference)


# --- coverage (pure) --------------------------------------------------------------------


def _graph(*ops: str) -> onnx.ModelProto:
    nodes = [
        helper.make_node(op, [], [f"o{i}"], domain="com.microsoft" if op == "EPContext" else "")
        for i, op in enumerate(ops)
    ]
    return helper.make_model(helper.make_graph(nodes, "g", [], []))


def test_coverage_of_full_partial_and_whole_graph_variants() -> None:
    full = measure_coverage(_graph("EPContext"), True, lambda: 57)
    assert (full.ep_nodes, full.other_nodes, full.fraction) == (57, 0, 1.0)
    partial = measure_coverage(
        _graph("EPContext", "EPContext", "Shape", "Gather", "Shape"), True, lambda: 20
    )
    assert (partial.ep_nodes, partial.other_nodes, partial.fraction) == (17, 3, 0.85)
    assert partial.other_op_types == ["Gather", "Shape"]
    cpu = measure_coverage(_graph("Conv", "Relu"), False, lambda: pytest.fail("not needed"))
    assert (cpu.ep_nodes, cpu.fraction) == (2, 1.0)


def test_coverage_counts_boundary_qdq_left_on_the_cpu_and_never_reads_full() -> None:
    """``QuantizeLinear -> EPContext -> DequantizeLinear``: the edges' conversions run on the
    CPU EP (the variant does not load with CPU fallback disabled), so it is not full, even
    where the share rounds to 100 %."""
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
            helper.make_node("EPContext", ["xq"], ["yq"], domain="com.microsoft"),
            helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    coverage = measure_coverage(helper.make_model(graph), True, lambda: 40_000)
    assert (coverage.other_nodes, coverage.boundary_qdq) == (2, 2)
    assert coverage.other_op_types == ["DequantizeLinear", "QuantizeLinear"]
    assert coverage.fraction == 0.9999  # 39,998 of 40,000 rounds to 1.0: capped below
    assert share(coverage.fraction) == "99.9%"
    assert "boundary_qdq" not in measure_coverage(_graph("EPContext"), True, lambda: 3).model_dump()


# --- running variants -------------------------------------------------------------------


def _tiny_cls_request(
    tmp_path: Path, model_dir: Path, target: dict, **fields: object
) -> tuple[CompileRequest, Path]:
    spec = write_spec(tmp_path, tiny_models(model_dir)[:1], [target | fields])
    plan = plan_run(spec, str(tmp_path / "store"))
    [pair] = plan.pairs
    return pair.request, tmp_path / "store"


def _compile(request: CompileRequest, source: Path, workdir: Path) -> CompileOutput:
    pool = CompilePool(1)
    try:
        job = CompileJob(request=request, source_path=str(source), workdir=str(workdir))
        return pool.run(job, compile_job)
    finally:
        pool.shutdown()


def _with_largest_weight_scaled(path: Path, factor: float, dest: Path) -> Path:
    model = onnx.load(str(path))
    weights = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    scaled = numpy_helper.to_array(weights) * factor
    weights.CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), weights.name))
    onnx.save(model, str(dest))
    return dest


@pytest.mark.parametrize("target", [HTP_TARGETS[0], CPU_TARGET], ids=["qnn-htp", "cpu"])
def test_a_variant_is_run_on_its_own_ep_and_an_altered_one_fails(
    tmp_path: Path, model_dir: Path, target: dict
) -> None:
    request, store = _tiny_cls_request(tmp_path, model_dir, target)
    assert request.samples is not None and request.samples.count == 1
    output = _compile(request, model_dir / "tiny-cls.onnx", tmp_path / "work")
    assert output.coverage is not None and output.coverage.fraction == 1.0

    passed = verify_output(request, output, open_store(str(store)))
    assert passed.status == "passed", passed.reason
    assert passed.samples_origin == "generated"  # the spec names no samples file
    assert passed.runner is not None and passed.runner.startswith(request.ep)
    assert passed.max_rel_error is not None and passed.max_rel_error <= request.tolerance
    assert passed.samples == 1

    # A deliberately wrong variant: built from the source with one weight altered (the
    # weights of an HTP variant live inside its context binary), checked against the
    # true source's golden samples.
    altered = _with_largest_weight_scaled(model_dir / "tiny-cls.onnx", 3.0, tmp_path / "bad.onnx")
    wrong = _compile(request, altered, tmp_path / "other-work")  # prepared sources are cached
    failed = verify_output(request, wrong, open_store(str(store)))
    assert failed.status == "failed"
    assert failed.reason is not None and "of its range (tolerance" in failed.reason
    assert failed.max_rel_error is not None and failed.max_rel_error > request.tolerance


def test_verify_false_is_recorded_as_unverified(tmp_path: Path, model_dir: Path) -> None:
    request, store = _tiny_cls_request(tmp_path, model_dir, CPU_TARGET, verify=False)
    output = _compile(request, model_dir / "tiny-cls.onnx", tmp_path / "work")
    result = verify_output(request, output, open_store(str(store)))
    assert (result.status, result.reason) == (
        "unverified",
        "not run: verify is false for this target",
    )


def _endless_loop_model() -> onnx.ModelProto:
    """y = x + 1e15 iterations of +1: loads fine, runs for ever."""
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
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [
            numpy_helper.from_array(np.array(10**15, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_verification_past_its_time_limit_fails_and_is_killed(tmp_path: Path) -> None:
    model = tmp_path / "endless.onnx"
    onnx.save(_endless_loop_model(), str(model))
    golden = tmp_path / "golden.npz"
    write_golden(golden, [{"x": np.zeros(1, np.float32)}], [[np.zeros(1, np.float32)]])
    job = VerifyJob(
        label="endless",
        artifact_path=str(model),
        golden_path=str(golden),
        ep="CPUExecutionProvider",
        device="cpu",
        provider_options={},
        tolerance=1e-3,
    )
    result = verify_artifact(job, timeout=3)
    assert result.status == "failed"  # unchecked is never published ok
    assert result.reason is not None
    assert result.reason.startswith("verification ran past its time limit of 3 s (verify_timeout)")
    assert "Raise the target's verify_timeout, or set verify: false" in result.reason
    assert result.seconds is not None and result.seconds < 30


def test_an_isolated_worker_that_dies_or_overruns_is_replaced() -> None:
    workers = IsolatedWorkers(1)
    try:
        with pytest.raises(WorkerDied, match="signal 6"):
            workers.call(abort, None, 60)
        assert workers.call(double, 21, 60) == 42
        with pytest.raises(WorkerTimeout):
            workers.call(sleep, 30, 1)
        assert workers.call(double, 2, 60) == 4
    finally:
        workers.shutdown()


def test_golden_of_a_source_from_a_samples_file(tmp_path: Path, model_dir: Path) -> None:
    samples = tmp_path / "samples.npz"
    x = np.random.default_rng(1).normal(size=(3, 1, 3, 48, 192)).astype(np.float32)
    np.savez(samples, x=x)
    model = onnx.load(str(model_dir / "tiny-cls.onnx"))
    from epfleet.runtime.shapes import prepare_model

    prepare_model(model, {"x": [1, 3, 48, 192]}, True, "QNN")
    source = tmp_path / "src.onnx"
    onnx.save(model, str(source))
    golden = tmp_path / "golden.npz"
    count = make_golden(
        GoldenJob(
            source_path=str(source),
            input_shapes={"x": [1, 3, 48, 192]},
            samples_path=str(samples),
            dest=str(golden),
        )
    )
    assert count == 3
    inputs, outputs = read_golden(golden)
    np.testing.assert_array_equal(inputs[2]["x"], x[2])
    assert len(outputs) == 3 and outputs[0][0].shape[0] == 1


def _overflows_in_fp16(path: Path) -> Path:
    """y = (x @ W) * 1e-5 with W = 3e4: fine in fp32, but x @ W reaches about 2e5, past
    float16's largest value (65,504)."""
    weights = numpy_helper.from_array(np.full((8, 8), 3e4, dtype=np.float32), "w")
    scale = numpy_helper.from_array(np.array(1e-5, dtype=np.float32), "scale")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["wide"]),
            helper.make_node("Mul", ["wide", "scale"], ["y"]),
        ],
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [weights, scale],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_an_fp16_failure_names_the_source_intermediate_past_float16s_range(
    tmp_path: Path,
) -> None:
    source = _overflows_in_fp16(tmp_path / "overflow.onnx")
    np.savez(tmp_path / "samples.npz", x=np.ones((1, 8), dtype=np.float32))
    spec = write_spec(
        tmp_path,
        [{"name": "overflow", "source": str(source), "samples": "samples.npz"}],
        [HTP_TARGETS[0]],
    )
    plan = plan_run(spec, str(tmp_path / "store"))
    [pair] = plan.pairs
    output = _compile(pair.request, source, tmp_path / "work")
    store = open_store(str(tmp_path / "store"))
    failed = verify_output(pair.request, output, store, str(source))
    assert failed.status == "failed", failed
    assert failed.samples_origin == "spec"
    assert failed.reason is not None
    assert "the source's intermediate 'wide' reaches 240,000 on the samples" in failed.reason
    assert "past float16's largest value (65,504; 1 intermediate(s) in all" in failed.reason
    # without the source, the failure stands alone
    plain = verify_output(pair.request, output, store)
    assert plain.status == "failed" and "intermediate" not in (plain.reason or "")


def _overflows_beside_sentinels(path: Path) -> Path:
    """Three real fp16 overflows on ones (x @ W reaches 240,000, x * 1e5 100,000, their sum
    340,000) beside values that are not fp16's problem: Log(0) is -inf already in fp32,
    and an attention-style mask fills with float32's lowest value (finfo.min), then adds
    x to it."""
    lowest = float(np.finfo(np.float32).min)
    keep = np.array([[True, False] * 4])
    graph = helper.make_graph(
        [
            helper.make_node("Sub", ["x", "x"], ["zeros"]),
            helper.make_node("Log", ["zeros"], ["log0"]),
            helper.make_node("Max", ["log0", "nothing"], ["floor"]),
            helper.make_node("Where", ["keep", "x", "lowest"], ["masked"]),
            helper.make_node("Add", ["masked", "x"], ["masked_shifted"]),
            helper.make_node("Max", ["masked_shifted", "nothing"], ["clipped"]),
            helper.make_node("MatMul", ["x", "w"], ["wide"]),
            helper.make_node("Mul", ["x", "big"], ["mid"]),
            helper.make_node("Add", ["wide", "mid"], ["both"]),
            helper.make_node("Mul", ["both", "scale"], ["scaled"]),
            helper.make_node("Add", ["scaled", "floor"], ["partial"]),
            helper.make_node("Add", ["partial", "clipped"], ["y"]),
        ],
        "sentinels",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [
            numpy_helper.from_array(np.full((8, 8), 3e4, dtype=np.float32), "w"),
            numpy_helper.from_array(np.array(1e5, dtype=np.float32), "big"),
            numpy_helper.from_array(np.array(1e-5, dtype=np.float32), "scale"),
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "nothing"),
            numpy_helper.from_array(np.array(lowest, dtype=np.float32), "lowest"),
            numpy_helper.from_array(keep, "keep"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_fp16_diagnosis_skips_fp32_infinities_and_mask_sentinels(tmp_path: Path) -> None:
    source = _overflows_beside_sentinels(tmp_path / "sentinels.onnx")
    why = fp16_overflow(str(source), [{"x": np.ones((1, 8), dtype=np.float32)}])
    # Before: the -inf of Log(0) (or the 3.4e38 of the mask) was named as the overflow.
    assert "the source's intermediate 'both' reaches 340,000 on the samples" in why, why
    assert "(65,504; 3 intermediate(s) in all, not counting values already infinite" in why


def test_computed_peak_leaves_out_non_finite_values_and_sentinels() -> None:
    lowest = np.finfo(np.float32).min
    assert computed_peak(np.array([1.0, -np.inf, np.nan, 3.0], np.float32)) == 3.0
    assert computed_peak(np.array([lowest, lowest + 5, -7.0], np.float32)) == 7.0
    assert computed_peak(np.array([-1e9, 2.0], np.float32)) == 1e9  # not a float32 limit
    assert computed_peak(np.array([np.inf, lowest], np.float32)) is None
    assert computed_peak(np.array([1, 2], np.int64)) is None


def _golden_too_large_to_load(path: Path) -> Path:
    """A golden file whose arrays' headers declare 364 TiB each (and hold no data):
    loading it runs out of memory inside the verification worker."""
    header = io.BytesIO()
    shape = {"descr": "<f4", "fortran_order": False, "shape": (10**7, 10**7)}
    np.lib.format.write_array_header_1_0(header, shape)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("input/0/x.npy", header.getvalue())
        archive.writestr("output/0/0.npy", header.getvalue())
    return path


def test_a_verification_that_runs_out_of_memory_fails(tmp_path: Path, model_dir: Path) -> None:
    job = VerifyJob(
        label="tiny-cls × x86-cpu",
        artifact_path=str(model_dir / "tiny-cls.onnx"),
        golden_path=str(_golden_too_large_to_load(tmp_path / "golden.npz")),
        ep="CPUExecutionProvider",
        device="cpu",
        provider_options={},
        tolerance=1e-3,
    )
    result = verify_artifact(job, timeout=120)
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("verifying tiny-cls × x86-cpu ran out of memory: Unable to")
