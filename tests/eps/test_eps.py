"""The EP registry and modules: every row loads its EP, listing the known EPs imports no
plugin, ``eps`` stands alone (imports nothing from ``epfleet``), and epfleet turns the EP
modules' errors into its own where they leave for the user."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path

import onnx
import pytest

import eps
from epfleet import errors
from epfleet.cli.app import main
from epfleet.hashing import sha256_file
from epfleet.runtime.compiler import CompileJob, compile_job
from epfleet.runtime.requests import CompileRequest
from eps import cpu
from eps._plugin import PluginEP
from eps.base import DeviceType, LocalTarget, MissingExtraError, NoDeviceError
from examples.build_models import tiny_det
from tests.support.paths import REPO
from tests.support.specs import write_spec

pytestmark = pytest.mark.fast

TRT_RTX = "NvTensorRTRTXExecutionProvider"
KNOWN = (
    "known: CPUExecutionProvider (built in), NvTensorRTRTXExecutionProvider "
    "(epfleet[trt-rtx]), OpenVINOExecutionProvider (epfleet[openvino]), "
    "QNNExecutionProvider (epfleet[qnn])"
)
trt_rtx_installed = importlib.util.find_spec("onnxruntime_ep_nv_tensorrt_rtx") is not None


@pytest.mark.parametrize("ep_name", sorted(eps.EP_MODULES))
def test_every_row_loads_its_module_ep(ep_name: str) -> None:
    row = eps.EP_MODULES[ep_name]
    ep = eps.load(ep_name)
    assert ep is importlib.import_module(row.module).EP
    assert ep.name == ep_name
    assert ep.extra == row.extra
    assert ep.device_types and ep.default_device({}) in ep.device_types
    if isinstance(ep, PluginEP):
        assert ep.package == row.package
    else:
        assert ep.build_identity()["package"] == row.package


def test_unknown_ep_lists_the_known_ones() -> None:
    """(Without importing them: tests/eps/test_fresh_imports.py.)"""
    with pytest.raises(KeyError) as raised:
        eps.load("FancyExecutionProvider")
    assert raised.value.args[0] == f"unknown execution provider 'FancyExecutionProvider'; {KNOWN}"


def test_eps_imports_nothing_from_epfleet_even_lazily() -> None:
    """Not inside a function either (at import: tests/eps/test_fresh_imports.py)."""
    for path in sorted((REPO / "eps").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] == "epfleet"], path.name


class Fancy(PluginEP):
    name = "FancyExecutionProvider"
    package = "onnxruntime-ep-fancy"
    extra = "fancy"
    library_module = "onnxruntime_ep_fancy"
    option_keys = frozenset({"fancy_level"})
    device_types = frozenset({"npu"})

    def default_device(self, provider_options: Mapping[str, str]) -> DeviceType:
        return "npu"

    def local_target(self, devices: list) -> LocalTarget | None:
        return None


def test_missing_plugin_package_names_the_extra() -> None:
    fancy = Fancy()
    for call in (fancy.build_identity, fancy.devices):
        with pytest.raises(
            MissingExtraError,
            match=r"'onnxruntime-ep-fancy', which is not installed here: pip install 'epfleet\[fancy\]'",
        ):
            call()
    with pytest.raises(ValueError, match="fancy_levl: unknown FancyExecutionProvider option"):
        fancy.check_options({"fancy_levl": "2"})
    assert fancy.generate_compatibility_string(Path("x.onnx")) is None
    assert fancy.judge("fancy:1") is None


def test_epfleet_raises_the_ep_errors_as_its_own() -> None:
    """A missing package is bad input (exit code 2); a missing device fails the pair."""
    with (
        pytest.raises(errors.MissingExtraError, match=r"^needs qnn$") as missing,
        errors.ep_errors(),
    ):
        raise MissingExtraError("needs qnn")
    assert isinstance(missing.value, errors.BadInputError)
    assert isinstance(missing.value, MissingExtraError)  # eps's own catch still holds
    with pytest.raises(errors.NoDeviceError, match=r"^no NPU$") as no_device, errors.ep_errors():
        raise NoDeviceError("no NPU")
    assert isinstance(no_device.value, errors.CompileError)
    assert isinstance(no_device.value, NoDeviceError)


def test_compile_worker_fails_a_pair_without_a_device_as_a_compile_error(
    tmp_path: Path,
) -> None:
    src = tmp_path / "det.onnx"
    onnx.save(tiny_det(), src)
    other = "neon" if cpu.isa_class() != "neon" else "avx2"
    request = CompileRequest(
        model="det",
        target="pinned",
        ep="CPUExecutionProvider",
        device="cpu",
        provider_options={"isa": other},
        input_shapes={},
        source_key="sources/det.onnx",
        source_sha256=sha256_file(src)[0],
        source_size=src.stat().st_size,
        fingerprint="fp-pinned",
    )
    job = CompileJob(request=request, source_path=str(src), workdir=str(tmp_path))
    with pytest.raises(
        errors.NoDeviceError, match=f"^no CPUExecutionProvider device with isa {other}"
    ):
        compile_job(job)


@pytest.mark.skipif(trt_rtx_installed, reason="needs a host without the TensorRT-RTX plugin")
def test_a_session_for_a_missing_ep_is_refused_with_its_extra() -> None:
    from epfleet.runtime.sessions import open_session

    with pytest.raises(errors.MissingExtraError, match=r"pip install 'epfleet\[trt-rtx\]'"):
        open_session("x.onnx", TRT_RTX, {}, "gpu", "x")


@pytest.mark.skipif(trt_rtx_installed, reason="needs a host without the TensorRT-RTX plugin")
def test_compiling_for_a_missing_ep_is_bad_input(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = [{"name": "tiny-cls", "source": str(model_dir / "tiny-cls.onnx")}]
    spec = write_spec(tmp_path, models, [{"name": "rtx", "ep": TRT_RTX}])
    code = main(["compile", str(spec), "--store", str(tmp_path / "s")])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert f"epfleet: error: {TRT_RTX} needs the pip package" in stderr
    assert "pip install 'epfleet[trt-rtx]'" in stderr
