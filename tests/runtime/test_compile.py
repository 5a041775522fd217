"""Real compiles with ONNX Runtime: QNN HTP context binaries and CPU-optimised models.

QNN compiles run in a worker process, as they do in epfleet: after a QNN compile,
QNN's validator segfaults in the same process (see eps/qnn.py), and the device sync
tests judge QNN strings in this test process.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import pytest
from onnxruntime.capi._pybind_state import get_compatibility_info_from_model_bytes

import eps
from epfleet.errors import CompileError, WorkerCrashed
from epfleet.hashing import sha256_file
from epfleet.runtime.compile_pool import CompilePool
from epfleet.runtime.compiler import CompileJob, compile_job
from epfleet.runtime.op_types import graph_op_types
from epfleet.runtime.requests import CompileRequest
from tests.support.native_writers import abort_on_crash, crash_or_compile

pytestmark = pytest.mark.fast

HTP = {"backend_type": "htp", "enable_htp_fp16_precision": "1"}


@pytest.fixture(scope="module")
def worker() -> Iterator[CompilePool]:
    pool = CompilePool(workers=1)
    yield pool
    pool.shutdown()


def job(
    model_dir: Path,
    tmp_path: Path,
    ep: str,
    options: dict,
    source: str = "tiny-cls.onnx",
    **overrides,
) -> CompileJob:
    src = model_dir / source
    fields = dict(
        model="tiny-cls",
        target=f"t-{options.get('htp_arch', 'cpu')}",
        ep=ep,
        device="npu" if ep.startswith("QNN") else "cpu",
        provider_options=options,
        input_shapes={"x": [1, 3, 48, 192]},
        source_key="sources/x.onnx",
        source_sha256=sha256_file(src)[0],
        source_size=src.stat().st_size,
        fingerprint=f"fp-{ep}-{options.get('htp_arch', 'cpu')}",
    )
    request = CompileRequest(**(fields | overrides))
    return CompileJob(request=request, source_path=str(src), workdir=str(tmp_path))


@pytest.mark.parametrize(("arch", "soc"), [("75", "57"), ("73", "43"), ("79", "69")])
def test_qnn_htp_compile_stamps_the_ep_string(
    model_dir: Path, tmp_path: Path, arch: str, soc: str, worker: CompilePool
) -> None:
    out = worker.run(
        job(model_dir, tmp_path, "QNNExecutionProvider", HTP | {"htp_arch": arch, "soc_model": soc})
    )
    data = Path(out.artifact_path).read_bytes()
    read_back = get_compatibility_info_from_model_bytes(data, "QNNExecutionProvider")
    assert read_back == out.compatibility_string
    assert out.compatibility_written_by == "ep"
    # QNN string: v2:<backend 6 = HTP>:<sdk>:<api>:<htp_arch>:<soc_model>:...
    fields = read_back.split(":")
    assert fields[1] == "6" and fields[4:6] == [arch, soc]
    model = onnx.load_from_string(data)
    props = {p.key: p.value for p in model.metadata_props}
    assert props["ep_compatibility_info.QNNExecutionProvider"] == read_back
    assert props["epfleet.source_sha256"] == sha256_file(model_dir / "tiny-cls.onnx")[0]
    assert props["epfleet.target"] == f"t-{arch}"
    assert (
        props["epfleet.ep_version"] == eps.load("QNNExecutionProvider").build_identity()["version"]
    )
    assert any(node.op_type == "EPContext" for node in model.graph.node)
    # what the device's health check counts for its profile, read without onnx
    assert graph_op_types(out.artifact_path) == [node.op_type for node in model.graph.node]
    assert (out.sha256, out.size) == sha256_file(Path(out.artifact_path))


def test_cpu_variant_gets_an_epfleet_string(model_dir: Path, tmp_path: Path) -> None:
    out = compile_job(job(model_dir, tmp_path, "CPUExecutionProvider", {}))
    data = Path(out.artifact_path).read_bytes()
    assert out.compatibility_written_by == "epfleet"
    assert (
        get_compatibility_info_from_model_bytes(data, "CPUExecutionProvider")
        == out.compatibility_string
    )
    assert out.compatibility_string.startswith("epfleet-cpu/1;ort=")


def test_model_no_node_of_which_the_npu_takes_fails_clearly(
    model_dir: Path, tmp_path: Path, worker: CompilePool
) -> None:
    bad = job(
        model_dir,
        tmp_path,
        "QNNExecutionProvider",
        HTP | {"htp_arch": "75", "soc_model": "57"},
        source="nonzero.onnx",
        model="nonzero",
        input_shapes={"x": [1, 8]},
    )
    with pytest.raises(
        CompileError,
        match=r"QNNExecutionProvider failed to compile 'nonzero': QNN took no node of the "
        r"model.*Unable to compile any nodes",
    ):
        worker.run(bad)


def test_a_crashing_compile_fails_alone(model_dir: Path, tmp_path: Path) -> None:
    pool = CompilePool(workers=2)
    good = [
        job(model_dir, tmp_path, "CPUExecutionProvider", {}, target=f"cpu-{i}") for i in range(3)
    ]
    crash = good[0].model_copy(
        update={"request": good[0].request.model_copy(update={"model": "crash"})}
    )
    try:
        with ThreadPoolExecutor(4) as threads:
            outcomes = [threads.submit(pool.run, j, crash_or_compile) for j in [crash, *good]]
        with pytest.raises(CompileError, match="compile process crashed while compiling 'crash'"):
            outcomes[0].result()
        for outcome in outcomes[1:]:
            assert Path(outcome.result().artifact_path).exists()  # innocent jobs all compiled
        assert Path(pool.run(good[0], crash_or_compile).artifact_path).exists()  # pool still works
    finally:
        pool.shutdown()


def test_a_crash_in_an_isolated_call_is_reported_and_the_worker_replaced() -> None:
    pool = CompilePool(workers=1)
    try:
        with pytest.raises(WorkerCrashed, match="crashed while health-checking v1"):
            pool.call(abort_on_crash, "crash", "health-checking v1")
        assert pool.call(abort_on_crash, "fine", "health-checking v2") == "FINE"
    finally:
        pool.shutdown()


def qdq_source(tmp_path: Path, model: onnx.ModelProto, precision: str, shape: list[int]) -> Path:
    """``model`` quantised by epfleet's quantise step (ORT's QNN recipe) at ``precision``,
    calibrated on 4 seeded inputs of ``shape``."""
    import numpy as np

    from epfleet.runtime.quantize import quantize
    from epfleet.runtime.requests import QuantizeOptions
    from epfleet.runtime.shapes import fix_input_shapes

    fix_input_shapes(model, {"x": shape})
    src, qdq = tmp_path / f"{precision}.src.onnx", tmp_path / f"{precision}.qdq.onnx"
    onnx.save(model, str(src))
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, x=np.random.default_rng(0).uniform(0, 1, (4, *shape)).astype("float32"))
    options = QuantizeOptions(calibration=None)
    quantize(src, qdq, tmp_path / f"{precision}.float.onnx", precision, options, calibration)
    return qdq


def lstm() -> onnx.ModelProto:
    """An LSTM over 16 steps of 32 features, 64 units."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(0, 0.2, (1, 256, 32)).astype("float32"), "W"),
        numpy_helper.from_array(rng.normal(0, 0.2, (1, 256, 64)).astype("float32"), "R"),
        numpy_helper.from_array(np.zeros((1, 512), "float32"), "B"),
    ]
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=64, name="lstm")],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_qnn_s_raw_compile_errors_come_with_one_sentence_saying_what_they_mean(
    model_dir: Path, tmp_path: Path, worker: CompilePool
) -> None:
    """Measured here: a quantised LSTM fails for HTP v68 with QNN_COMMON_ERROR_MEM_ALLOC
    (it compiles for v73); 16-bit weights fail for v69 in ORT's layout transformer."""
    v68 = HTP | {"htp_arch": "68", "soc_model": "35"}
    source = qdq_source(tmp_path, lstm(), "w8a8", [16, 1, 32])
    with pytest.raises(CompileError) as refused:
        worker.run(compiling(model_dir, tmp_path, source, v68, input_shapes={"x": [16, 1, 32]}))
    said = str(refused.value)
    assert "ran out of memory finalising the HTP graph" in said, said
    assert said.index("newer htp_arch") < said.index("QNN_COMMON_ERROR_MEM_ALLOC: Memory"), said

    cls = onnx.load(str(model_dir / "tiny-cls.onnx"))
    source = qdq_source(tmp_path, cls, "w16a16", [1, 3, 48, 192])
    v69 = HTP | {"htp_arch": "69", "soc_model": "36"}
    with pytest.raises(CompileError, match=r"the HTP refused a Conv for its data types.*OpType"):
        worker.run(compiling(model_dir, tmp_path, source, v69))
    v73 = HTP | {"htp_arch": "73", "soc_model": "43"}
    built = worker.run(compiling(model_dir, tmp_path, source, v73))
    assert built.coverage is not None  # all its compute on the HTP, the I/O Q/DQ aside
    assert built.coverage.other_nodes == built.coverage.boundary_qdq == 2


def compiling(model_dir: Path, tmp_path: Path, source: Path, options: dict, **fields) -> CompileJob:
    """A job compiling ``source`` (a QDQ model: compiled as it is)."""
    digest = {"source_sha256": sha256_file(source)[0], "source_size": source.stat().st_size}
    run = job(model_dir, tmp_path, "QNNExecutionProvider", options, **digest, **fields)
    return run.model_copy(update={"source_path": str(source)})
