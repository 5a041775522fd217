"""Intel OpenVINO EP (onnxruntime-ep-openvino plugin).

The plugin enumerates one OrtEpDevice per OpenVINO device (``ep_metadata
ov_device`` = CPU, GPU or NPU) plus an ``OpenVINOExecutionProvider.AUTO``
meta-device that cannot produce EPContext models. In plugin mode the
``device_type`` provider option is ignored: the device is chosen by picking the
OrtEpDevice, so a target's ``device`` decides it. The EP writes its own
compatibility string.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from epfleet.errors import NoDeviceError
from eps import _plugin
from eps.base import (
    FP16_TOLERANCE,
    DeviceType,
    GraphOptimization,
    Judgement,
    LocalTarget,
    check_option_keys,
)

if TYPE_CHECKING:
    import onnxruntime

name = "OpenVINOExecutionProvider"
extra: str | None = "openvino"
requires_static_shapes = True
device_types: frozenset[DeviceType] = frozenset({"npu", "gpu", "cpu"})

_PLUGIN = _plugin.Plugin(
    name, module="onnxruntime_ep_openvino", extra="openvino", package="onnxruntime-ep-openvino"
)
_IGNORED_IN_PLUGIN_MODE = ("device_type", "precision")


partitions_graph = True
default_graph_optimization: GraphOptimization = "basic"


def default_tolerance(provider_options: Mapping[str, str]) -> float:
    """Its NPU and GPU devices compute in fp16 by default."""
    return FP16_TOLERANCE


def default_device(provider_options: Mapping[str, str]) -> DeviceType:
    return "npu"


# The keys onnxruntime-ep-openvino 1.8.1 reads (OpenVINOEpPluginOptions::ParseProviderOptions
# in its .so). It honours load_config, reshape_input, enable_causallm, hint_enable_gqa and
# dump_subgraphs; it logs the rest as ignored (device_type, device_id and device_luid: pick the
# OrtEpDevice; the others: set them through load_config).
OPTION_KEYS: frozenset[str] = frozenset(
    {
        "load_config",
        "reshape_input",
        "enable_causallm",
        "hint_enable_gqa",
        "dump_subgraphs",
        "device_type",
        "device_id",
        "device_luid",
        "precision",
        "cache_dir",
        "num_of_threads",
        "num_streams",
        "model_priority",
        "enable_opencl_throttling",
        "enable_qdq_optimizer",
    }
)


def check_options(provider_options: Mapping[str, str]) -> None:
    check_option_keys(name, provider_options, OPTION_KEYS)
    ignored = [key for key in _IGNORED_IN_PLUGIN_MODE if key in provider_options]
    if ignored:
        raise ValueError(
            f"{', '.join(ignored)} is ignored by the OpenVINO plugin EP: choose the device with "
            "the target's 'device' field and the precision with load_config "
            '(e.g. {"INFERENCE_PRECISION_HINT": "F32"})'
        )


def build_identity() -> dict[str, str]:
    return _PLUGIN.identity()


def devices() -> list[onnxruntime.OrtEpDevice]:
    return _PLUGIN.devices()


def _devices_of_type(device: DeviceType) -> list[onnxruntime.OrtEpDevice]:
    wanted = device.upper()
    found = [d for d in devices() if d.ep_metadata.get("ov_device") == wanted]
    if not found:
        raise NoDeviceError(f"no {name} {wanted} device on this worker")
    return found


def build(
    src: Path,
    dst: Path,
    provider_options: Mapping[str, str],
    device: DeviceType,
    optimization: GraphOptimization,
) -> None:
    _plugin.compile_ep_context(_devices_of_type(device), src, dst, provider_options, optimization)


def generate_compatibility_string(artifact: Path) -> str | None:
    return None


def judge(compatibility_string: str) -> Judgement | None:
    return None


def configure_session(
    options: onnxruntime.SessionOptions, provider_options: Mapping[str, str], device: DeviceType
) -> None:
    _plugin.add_devices(options, _devices_of_type(device), provider_options)


def local_target(devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
    """A local OpenVINO build only for an Intel NPU or GPU: its CPU device is left to the CPU
    EP's variant, which every machine can build for itself."""
    for device in ("npu", "gpu"):
        if any(d.ep_metadata.get("ov_device") == device.upper() for d in devices):
            return LocalTarget(device=device, provider_options={})
    return None
