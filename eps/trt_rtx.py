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

from epfleet.errors import NoDeviceError
from eps import _plugin
from eps.base import DeviceType, Judgement

if TYPE_CHECKING:
    import onnxruntime

name = "NvTensorRTRTXExecutionProvider"
extra: str | None = "trt-rtx"
requires_static_shapes = False
device_types: frozenset[DeviceType] = frozenset({"gpu"})

_PACKAGE = "onnxruntime-ep-nv-tensorrt-rtx"
_MODULE = "onnxruntime_ep_nv_tensorrt_rtx"


def default_device(provider_options: Mapping[str, str]) -> DeviceType:
    return "gpu"


def check_options(provider_options: Mapping[str, str]) -> None:
    target_sm = provider_options.get("nv_target_sm")
    if target_sm is not None and not target_sm.startswith("sm"):
        raise ValueError(f"nv_target_sm {target_sm!r} must look like 'sm86'")


def build_identity() -> dict[str, str]:
    return {"package": _PACKAGE, "version": _plugin.package_version(name, "trt-rtx", _PACKAGE)}


def devices() -> list[onnxruntime.OrtEpDevice]:
    plugin = _plugin.import_plugin(name, _MODULE, "trt-rtx", _PACKAGE)
    try:
        _plugin.register(name, plugin.get_library_path())
    except (RuntimeError, OSError) as exc:
        raise NoDeviceError(f"no {name} device on this worker: {exc}") from exc
    return _plugin.devices_of(name)


def build(src: Path, dst: Path, provider_options: Mapping[str, str], device: DeviceType) -> None:
    found = devices()
    _plugin.require_devices(name, found)
    _plugin.compile_ep_context(found, src, dst, provider_options)


def generate_compatibility_string(artifact: Path) -> str | None:
    return None


def judge(compatibility_string: str) -> Judgement | None:
    return None
