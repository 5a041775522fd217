"""Discovery and judging with the real ONNX Runtime and plugins installed here (no NPU)."""

from __future__ import annotations

import pytest

import eps.cpu as cpu
from epfleet import ort_version
from epfleet.device.local_eps import NO_NPU, LocalEps, discover, ep_identities, ep_versions
from eps.base import Verdict

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def local() -> LocalEps:
    return discover()


def test_discovery_groups_devices_by_ep(local: LocalEps) -> None:
    assert local.present("CPUExecutionProvider")
    assert local.present("QNNExecutionProvider")  # the plugin enumerates a CPU-typed device
    assert not local.present("NvTensorRTRTXExecutionProvider")
    assert "epfleet[trt-rtx]" in local.absent["NvTensorRTRTXExecutionProvider"]
    described = {(d.ep, d.type) for d in local.describe()}
    assert ("CPUExecutionProvider", "cpu") in described
    # OpenVINO's AUTO meta-device is an EP of its own name, never mixed into OpenVINO's.
    assert all(
        d.ep_name == "OpenVINOExecutionProvider"
        for d in local.devices.get("OpenVINOExecutionProvider", [])
    )


def test_the_releases_discovery_and_the_report_name_come_from_one_read(local: LocalEps) -> None:
    import importlib.metadata

    read = ep_identities()
    assert local.releases == {ep: read[ep]["version"] for ep in local.devices}
    assert local.releases["QNNExecutionProvider"] == importlib.metadata.version("onnxruntime-qnn")
    assert ep_versions()["onnxruntime-qnn"] == local.releases["QNNExecutionProvider"]
    assert ep_versions()["onnxruntime"] == ort_version()
    assert "onnxruntime-ep-nv-tensorrt-rtx" not in ep_versions()  # not installed here


def test_qnn_string_is_unsupported_for_want_of_an_npu(local: LocalEps) -> None:
    """ORT's QNN plugin refuses to judge without an NPU device, in words naming its
    internals; the reason says it plainly."""
    judged = local.judge("QNNExecutionProvider", "v2:6:2.51.0:5.51.0:75:57:0:0")
    assert judged.verdict is Verdict.UNSUPPORTED
    assert judged.reason == NO_NPU


def test_cpu_strings_are_judged_by_the_cpu_module(local: LocalEps) -> None:
    here = cpu.make_string(ort_version(), cpu.machine_arch(), cpu.isa_class(), True)
    assert local.judge("CPUExecutionProvider", here).verdict is Verdict.OPTIMAL
    other_isa = "neon" if cpu.isa_class() != "neon" else "avx2"
    elsewhere = cpu.make_string(ort_version(), cpu.machine_arch(), other_isa, True)
    assert local.judge("CPUExecutionProvider", elsewhere).verdict is Verdict.UNSUPPORTED
    older = cpu.make_string("1.20.0", cpu.machine_arch(), cpu.isa_class(), True)
    assert local.judge("CPUExecutionProvider", older).verdict is Verdict.PREFER_RECOMPILATION


def test_an_ep_this_device_lacks_is_unsupported_without_asking_ort(local: LocalEps) -> None:
    judged = local.judge("NvTensorRTRTXExecutionProvider", "anything")
    assert judged.verdict is Verdict.UNSUPPORTED and "cannot run here" in judged.reason
    unknown = local.judge("MadeUpExecutionProvider", "x")
    assert unknown.verdict is Verdict.UNSUPPORTED and "not an execution provider" in unknown.reason


def test_openvino_string_is_judged_by_orts_validator_where_openvino_has_a_device(
    local: LocalEps,
) -> None:
    """On Intel hosts the OpenVINO plugin enumerates a CPU device and ORT's validator answers;
    on AMD hosts it enumerates none, and the variant cannot run here."""
    judged = local.judge("OpenVINOExecutionProvider", '{"ovep_compat_ver":"1.0"}')
    assert judged.verdict is Verdict.UNSUPPORTED
    if local.present("OpenVINOExecutionProvider"):
        assert judged.reason == "ORT: OpenVINOExecutionProvider answered EP_UNSUPPORTED"
    else:
        assert "enumerates no device" in judged.reason
