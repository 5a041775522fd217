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
from typing import TYPE_CHECKING

from eps._plugin import PluginEP
from eps.base import DeviceType, ExecutionProvider, LocalTarget, NoDeviceError

if TYPE_CHECKING:
    import onnxruntime

_IGNORED_IN_PLUGIN_MODE = ("device_type", "precision")

# The keys onnxruntime-ep-openvino 1.8.1 reads (OpenVINOEpPluginOptions::ParseProviderOptions
# in its .so). It honours load_config, reshape_input, enable_causallm, hint_enable_gqa and
# dump_subgraphs; it logs the rest as ignored (device_type, device_id and device_luid: pick the
# OrtEpDevice; the others: set them through load_config).
OPTION_KEYS = frozenset(
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


class OpenVino(PluginEP):
    name = "OpenVINOExecutionProvider"
    package = "onnxruntime-ep-openvino"
    extra = "openvino"
    library_module = "onnxruntime_ep_openvino"
    option_keys = OPTION_KEYS
    device_types = frozenset({"npu", "gpu", "cpu"})

    def default_device(self, provider_options: Mapping[str, str]) -> DeviceType:
        return "npu"

    def check_options(self, provider_options: Mapping[str, str]) -> None:
        super().check_options(provider_options)
        ignored = [key for key in _IGNORED_IN_PLUGIN_MODE if key in provider_options]
        if ignored:
            raise ValueError(
                f"{', '.join(ignored)} is ignored by the OpenVINO plugin EP: choose the device "
                "with the target's 'device' field and the precision with load_config "
                '(e.g. {"INFERENCE_PRECISION_HINT": "F32"})'
            )

    def compile_devices(self, device: DeviceType) -> list[onnxruntime.OrtEpDevice]:
        """The OpenVINO device of that type (``ep_metadata ov_device``), to compile with and
        to run on."""
        wanted = device.upper()
        found = [d for d in self.devices() if d.ep_metadata.get("ov_device") == wanted]
        if not found:
            raise NoDeviceError(f"no {self.name} {wanted} device on this worker")
        return found

    def local_target(self, devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
        """A local OpenVINO build only for an Intel NPU or GPU: its CPU device is left to the
        CPU EP's variant, which every machine can build for itself."""
        for device in ("npu", "gpu"):
            if any(d.ep_metadata.get("ov_device") == device.upper() for d in devices):
                return LocalTarget(device=device, provider_options={})
        return None


EP: ExecutionProvider = OpenVino()
