"""Helpers shared by EP modules whose EP ships as an ORT plugin library."""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from epfleet.errors import MissingExtraError, NoDeviceError

if TYPE_CHECKING:
    import onnxruntime

_registered: set[str] = set()
_lock = threading.Lock()


def missing_extra(ep_name: str, extra: str, package: str) -> MissingExtraError:
    return MissingExtraError(
        f"{ep_name} needs the pip package {package!r}, which is not installed here: "
        f"pip install 'epfleet[{extra}]'"
    )


def import_plugin(ep_name: str, module: str, extra: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing_extra(ep_name, extra, package) from exc


def package_version(ep_name: str, extra: str, package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise missing_extra(ep_name, extra, package) from exc


def register(ep_name: str, library_path: str) -> None:
    """Register a plugin library once per process (ORT refuses a second registration)."""
    import onnxruntime as ort

    with _lock:
        if ep_name in _registered:
            return
        if not any(d.ep_name == ep_name for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(ep_name, library_path)
        _registered.add(ep_name)


def devices_of(ep_name: str) -> list[onnxruntime.OrtEpDevice]:
    import onnxruntime as ort

    return [d for d in ort.get_ep_devices() if d.ep_name == ep_name]


def require_devices(ep_name: str, devices: list[onnxruntime.OrtEpDevice]) -> None:
    if not devices:
        raise NoDeviceError(
            f"no {ep_name} device on this worker (the EP registered but enumerated none)"
        )


def compile_ep_context(
    devices: list[onnxruntime.OrtEpDevice],
    src: Path,
    dst: Path,
    provider_options: Mapping[str, str],
) -> None:
    """Compile ``src`` into an EPContext model at ``dst`` with ORT's compile API.

    ERROR_IF_NO_NODES_COMPILED turns a compile in which the EP took no node into
    an error, instead of a "variant" that is the source model in disguise.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_provider_for_devices(devices, dict(provider_options))
    compiler = ort.ModelCompiler(
        options,
        str(src),
        embed_compiled_data_into_model=True,
        flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED,
    )
    compiler.compile_to_file(str(dst))
