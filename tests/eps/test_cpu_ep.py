"""The CPU module's own compatibility string and judge (ORT answers NOT_APPLICABLE for CPU)."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi._pybind_state import (
    OrtCompiledModelCompatibility,
    get_model_compatibility_for_ep_devices,
)

from eps import cpu
from eps.base import NoDeviceError, Verdict
from examples.build_models import tiny_det

pytestmark = pytest.mark.fast

HERE = {"ort_version": "1.32.0", "arch": "x86_64", "isa": "avx2"}


def string(**fields) -> str:
    base = {"ort_version": "1.32.0", "arch": "x86_64", "isa": "avx2", "uses_nchwc": True}
    return cpu.make_string(**(base | fields))


@pytest.mark.parametrize(
    ("compatibility", "verdict", "reason"),
    [
        (string(), Verdict.OPTIMAL, "ORT 1.32.0"),
        (string(arch="aarch64", isa="neon"), Verdict.UNSUPPORTED, "optimised for aarch64"),
        (string(isa="avx512"), Verdict.UNSUPPORTED, "NCHWc kernels laid out for avx512"),
        (string(isa="avx512", uses_nchwc=False), Verdict.PREFER_RECOMPILATION, "without NCHWc"),
        (string(ort_version="1.31.1"), Verdict.PREFER_RECOMPILATION, "written by ORT 1.31.1"),
        (string(ort_version="1.33.0"), Verdict.UNSUPPORTED, "newer than this ORT"),
        ("v2:6:2.51.0:5.51.0:75:57:0:0", Verdict.UNSUPPORTED, "not an epfleet-cpu/1 string"),
        ("epfleet-cpu/1;ort=1.32.0", Verdict.UNSUPPORTED, "lacks arch, isa, nchwc"),
    ],
)
def test_judge_rules(compatibility: str, verdict: Verdict, reason: str) -> None:
    judgement = cpu.judge_against(compatibility, **HERE)
    assert judgement.verdict == verdict
    assert reason in judgement.reason


def test_ort_itself_has_no_opinion_on_cpu_strings() -> None:
    """Why epfleet judges CPU strings itself: ORT answers NOT_APPLICABLE for anything."""
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "CPUExecutionProvider"]
    answer = get_model_compatibility_for_ep_devices(devices, string())
    assert answer == OrtCompiledModelCompatibility.EP_NOT_APPLICABLE


def test_real_build_records_nchwc_and_judges_optimal_here(tmp_path: Path) -> None:
    src = tmp_path / "det.onnx"
    onnx.save(tiny_det(), src)
    dst = tmp_path / "det.opt.onnx"
    cpu.EP.build(src, dst, {}, "cpu", "all")
    compiled = cpu.EP.generate_compatibility_string(dst)
    assert compiled is not None
    fields = cpu.parse_string(compiled)
    assert fields["ort"] == ort.__version__ and fields["isa"] == cpu.isa_class()
    uses_nchwc = any(n.domain == cpu.NCHWC_DOMAIN for n in onnx.load(str(dst)).graph.node)
    assert fields["nchwc"] == str(int(uses_nchwc))
    judgement = cpu.EP.judge(compiled)
    assert judgement is not None and judgement.verdict == Verdict.OPTIMAL


def test_pinned_machine_class_is_refused_on_another_worker(tmp_path: Path) -> None:
    src = tmp_path / "det.onnx"
    onnx.save(tiny_det(), src)
    other = "neon" if cpu.isa_class() != "neon" else "avx2"
    with pytest.raises(NoDeviceError, match=f"no CPUExecutionProvider device with isa {other}"):
        cpu.EP.build(src, tmp_path / "a.onnx", {"isa": other}, "cpu", "all")
    assert not (tmp_path / "a.onnx").exists()
    cpu.EP.build(
        src, tmp_path / "b.onnx", {"isa": cpu.isa_class(), "arch": cpu.machine_arch()}, "cpu", "all"
    )
    assert (tmp_path / "b.onnx").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"intra_op_num_threads": "2"}, "takes only arch, isa"),
        ({"isa": "avx1024"}, "isa 'avx1024'"),
    ],
)
def test_cpu_options_are_checked(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cpu.EP.check_options(options)
