"""NVIDIA TensorRT-RTX EP (onnxruntime-ep-nv-tensorrt-rtx plugin).

Needs an NVIDIA GPU (Ampere or newer) and the driver's libcuda at registration
time; on a worker without one the library does not load or enumerates no
device, and the pair fails with "no NvTensorRTRTXExecutionProvider device on
this worker". The package pulls large CUDA/TensorRT libraries: keep it out of CI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from eps._plugin import PluginEP
from eps.base import DeviceType, ExecutionProvider, LocalTarget

if TYPE_CHECKING:
    import onnxruntime

# The session provider options of the plugin (provider_option_names in
# src/tensorrt_rtx_provider_options.h of NVIDIA/TensorRT-RTX-EP-ABI, which builds
# onnxruntime-ep-nv-tensorrt-rtx, and its generated provider-options reference).
OPTION_KEYS = frozenset(
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


class TrtRtx(PluginEP):
    name = "NvTensorRTRTXExecutionProvider"
    package = "onnxruntime-ep-nv-tensorrt-rtx"
    extra = "trt-rtx"
    library_module = "onnxruntime_ep_nv_tensorrt_rtx"
    option_keys = OPTION_KEYS
    device_types = frozenset({"gpu"})
    requires_static_shapes = False

    def default_device(self, provider_options: Mapping[str, str]) -> DeviceType:
        return "gpu"

    def local_target(self, devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
        """TensorRT-RTX builds engines for the GPU it runs on."""
        return LocalTarget(device="gpu", provider_options={}) if devices else None


EP: ExecutionProvider = TrtRtx()
