"""NVIDIA TensorRT-RTX EP (onnxruntime-ep-nv-tensorrt-rtx plugin).

Needs an NVIDIA GPU (Ampere or newer) and the driver's libcuda at registration
time; on a worker without one the library does not load or enumerates no
device, and the pair fails with "no NvTensorRTRTXExecutionProvider device on
this worker". The package pulls large CUDA/TensorRT libraries: keep it out of CI.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

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

name = "NvTensorRTRTXExecutionProvider"
extra: str | None = "trt-rtx"
requires_static_shapes = False
device_types: frozenset[DeviceType] = frozenset({"gpu"})

_PLUGIN = _plugin.Plugin(
    name,
    module="onnxruntime_ep_nv_tensorrt_rtx",
    extra="trt-rtx",
    package="onnxruntime-ep-nv-tensorrt-rtx",
)


partitions_graph = True
default_graph_optimization: GraphOptimization = "basic"


def default_tolerance(provider_options: Mapping[str, str]) -> float:
    """Its NPU and GPU devices compute in fp16 by default."""
    return FP16_TOLERANCE


def default_device(provider_options: Mapping[str, str]) -> DeviceType:
    return "gpu"


# The session provider options of the plugin (provider_option_names in
# src/tensorrt_rtx_provider_options.h of NVIDIA/TensorRT-RTX-EP-ABI, which builds
# onnxruntime-ep-nv-tensorrt-rtx, and its generated provider-options reference).
OPTION_KEYS: frozenset[str] = frozenset(
    {
        "device_id",
        "has_user_compute_stream",
        "user_compute_stream",
        "user_aux_stream_array",
        "nv_max_workspace_size",
        "nv_max_shared_mem_size",
        "nv_dump_subgraphs",
        "nv_detailed_build_log",
        "nv_profile_min_shapes",
        "nv_profile_max_shapes",
        "nv_profile_opt_shapes",
        "enable_cuda_graph",
        "nv_multi_profile_enable",
        "nv_use_external_data_initializer",
        "nv_runtime_cache_path",
        "nv_weight_streaming_budget",
        "nv_op_types_to_exclude",
    }
)


def check_options(provider_options: Mapping[str, str]) -> None:
    check_option_keys(name, provider_options, OPTION_KEYS)


def build_identity() -> dict[str, str]:
    return _PLUGIN.identity()


def devices() -> list[onnxruntime.OrtEpDevice]:
    return _PLUGIN.devices()


def build(
    src: Path,
    dst: Path,
    provider_options: Mapping[str, str],
    device: DeviceType,
    optimization: GraphOptimization,
) -> None:
    _plugin.compile_ep_context(_PLUGIN.require_devices(), src, dst, provider_options, optimization)


def generate_compatibility_string(artifact: Path) -> str | None:
    return None


def judge(compatibility_string: str) -> Judgement | None:
    return None


def configure_session(
    options: onnxruntime.SessionOptions, provider_options: Mapping[str, str], device: DeviceType
) -> None:
    _plugin.add_devices(options, _PLUGIN.require_devices(), provider_options)


def local_target(devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
    """TensorRT-RTX builds engines for the GPU it runs on."""
    return LocalTarget(device="gpu", provider_options={}) if devices else None
