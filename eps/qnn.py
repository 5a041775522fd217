"""Qualcomm QNN EP (onnxruntime-qnn plugin): HTP context binaries for Snapdragon NPUs.

Compiling is offline: on an x86 host the plugin enumerates a CPU-typed device
and still emits HTP context binaries for whatever ``htp_arch``/``soc_model`` the
target names. Its compatibility string looks like
``v2:6:2.51.0:5.51.0:75:57:0:0`` and is written by the EP itself. Its validator
only accepts NPU devices, so judging a string is ORT's business on the device.

Measured here (onnxruntime 1.32.0, onnxruntime-qnn 2.7.0): on a host without an
NPU, ``get_model_compatibility_for_ep_devices`` with the QNN device raises
RuntimeError, as documented, but only until a QNN compile has run in the same
process; after one, the same call segfaults. Compiles therefore run in worker
processes (``epfleet.pool``), and a validator must run in one that has not compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from epfleet.errors import NoDeviceError
from eps import _plugin
from eps.base import (
    FP16_TOLERANCE,
    FP32_TOLERANCE,
    DeviceType,
    GraphOptimization,
    Judgement,
    LocalTarget,
)

if TYPE_CHECKING:
    import onnxruntime

name = "QNNExecutionProvider"
extra: str | None = "qnn"
requires_static_shapes = True
device_types: frozenset[DeviceType] = frozenset({"npu", "gpu", "cpu"})  # HTP, GPU, CPU backends

_PLUGIN = _plugin.Plugin(name, module="onnxruntime_qnn", extra="qnn", package="onnxruntime-qnn")
_BACKENDS = {"htp", "cpu", "gpu", "saver"}
_HTP_ARCHS = {"68", "69", "73", "75", "79", "81"}


_DEVICE_OF_BACKEND: dict[str, DeviceType] = {"htp": "npu", "gpu": "gpu", "cpu": "cpu"}


partitions_graph = True
default_graph_optimization: GraphOptimization = "basic"


def default_tolerance(provider_options: Mapping[str, str]) -> float:
    """The HTP computes float models in fp16 (or quantised); the CPU backend in fp32."""
    if provider_options.get("backend_type", "htp") == "cpu":
        return FP32_TOLERANCE
    return FP16_TOLERANCE


def default_device(provider_options: Mapping[str, str]) -> DeviceType:
    return _DEVICE_OF_BACKEND.get(provider_options.get("backend_type", "htp"), "npu")


def check_options(provider_options: Mapping[str, str]) -> None:
    backend = provider_options.get("backend_type")
    if backend is not None and backend not in _BACKENDS:
        raise ValueError(f"backend_type {backend!r} is not one of {sorted(_BACKENDS)}")
    arch = provider_options.get("htp_arch")
    if arch is not None and arch not in _HTP_ARCHS:
        raise ValueError(f"htp_arch {arch!r} is not one of {sorted(_HTP_ARCHS)}")
    soc = provider_options.get("soc_model")
    if soc is not None and not soc.isdigit():
        raise ValueError(f"soc_model {soc!r} must be a Qualcomm SoC model number, e.g. '57'")


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
    """An HTP variant runs on an NPU, and on an x86 host through the plugin's HTP backend,
    which executes the context binary on the CPU; a GPU variant needs an Adreno GPU."""
    found = _PLUGIN.require_devices()
    if device == "gpu" and not _plugin.has_device_type(found, "gpu"):
        raise NoDeviceError(f"no {name} GPU device here")
    _plugin.add_devices(options, found, provider_options)


def local_target(devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
    """On a Snapdragon the HTP backend compiles for the SoC it runs on (no htp_arch needed);
    a host without an NPU (this x86 machine) gets no local QNN build."""
    if not _plugin.has_device_type(devices, "npu"):
        return None
    return LocalTarget(
        device="npu", provider_options={"backend_type": "htp", "enable_htp_fp16_precision": "1"}
    )
