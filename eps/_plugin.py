"""Helpers shared by EP modules whose EP ships as an ORT plugin library."""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from epfleet.errors import MissingExtraError, NoDeviceError
from eps.base import GraphOptimization, ort_level

if TYPE_CHECKING:
    import onnxruntime

_registered: set[str] = set()
_lock = threading.Lock()


@dataclass(frozen=True)
class Plugin:
    """An EP that ships as a pip package exposing ``get_library_path()``."""

    ep_name: str
    module: str
    extra: str
    package: str

    def missing(self) -> MissingExtraError:
        return MissingExtraError(
            f"{self.ep_name} needs the pip package {self.package!r}, which is not installed "
            f"here: pip install 'epfleet[{self.extra}]'"
        )

    def identity(self) -> dict[str, str]:
        try:
            version = importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError as exc:
            raise self.missing() from exc
        return {"package": self.package, "version": version}

    def devices(self) -> list[onnxruntime.OrtEpDevice]:
        """This EP's devices here, registering its library once per process (ORT refuses a
        second registration). A library that does not load means no usable device here."""
        import onnxruntime as ort

        try:
            plugin = importlib.import_module(self.module)
        except ImportError as exc:
            raise self.missing() from exc
        with _lock:
            if self.ep_name not in _registered:
                try:
                    ort.register_execution_provider_library(self.ep_name, plugin.get_library_path())
                except (RuntimeError, OSError) as exc:
                    raise NoDeviceError(
                        f"no {self.ep_name} device on this worker: its library did not load ({exc})"
                    ) from exc
                _registered.add(self.ep_name)
        return [d for d in ort.get_ep_devices() if d.ep_name == self.ep_name]

    def require_devices(self) -> list[onnxruntime.OrtEpDevice]:
        found = self.devices()
        if not found:
            raise NoDeviceError(
                f"no {self.ep_name} device on this worker (the EP registered but enumerated none)"
            )
        return found


def add_devices(
    options: onnxruntime.SessionOptions,
    devices: list[onnxruntime.OrtEpDevice],
    provider_options: Mapping[str, str],
) -> None:
    options.add_provider_for_devices(devices, dict(provider_options))


def has_device_type(devices: list[onnxruntime.OrtEpDevice], device: str) -> bool:
    """Whether one of ``devices`` is hardware of type ``device`` (cpu, gpu, npu)."""
    return any(d.device.type.name.lower() == device for d in devices)


def compile_ep_context(
    devices: list[onnxruntime.OrtEpDevice],
    src: Path,
    dst: Path,
    provider_options: Mapping[str, str],
    optimization: GraphOptimization,
) -> None:
    """Compile ``src`` into an EPContext model at ``dst`` with ORT's compile API.

    ``optimization`` matters: the compile API defaults to ORT_DISABLE_ALL, which leaves
    the shape sub-graphs that fixed input shapes made constant (Shape, Gather, Range,
    Reshape) unfolded, so an NPU EP takes only parts of typical real models, and such
    partial HTP models do not run. At ORT_ENABLE_BASIC they fold and the EP takes all.

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
        graph_optimization_level=ort_level(optimization),
        flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED,
    )
    compiler.compile_to_file(str(dst))
