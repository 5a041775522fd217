"""``PluginEP``: the defaults of an EP that ships as an ORT plugin library in a pip package.

A plugin EP's module subclasses it with its own facts (name, package, extra, the
module exposing ``get_library_path()``, option keys, devices) and overrides only
what differs: usually ``check_options``, ``default_device``, ``local_target``
and which devices a variant compiles and runs with.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from eps.base import (
    SINGLE_FILE,
    DeviceType,
    GraphOptimization,
    Judgement,
    Layout,
    LocalTarget,
    MissingExtraError,
    NoDeviceError,
    Precision,
    check_option_keys,
    every_option_counts,
    ort_level,
)

if TYPE_CHECKING:
    import onnxruntime

_registered: set[str] = set()
_lock = threading.Lock()


class PluginEP(ABC):
    """An EP whose pip package exposes ``get_library_path()``; satisfies
    ``eps.base.ExecutionProvider`` once a subclass sets the facts below and the two
    abstract methods."""

    name: str
    package: str
    """The pip package holding the plugin, e.g. ``onnxruntime-qnn``."""
    extra: str
    """The epfleet extra that installs ``package``."""
    library_module: str
    """The module of ``package`` whose ``get_library_path()`` names the plugin library."""
    option_keys: frozenset[str]
    """The provider option keys the plugin reads (ORT hands it unknown keys silently)."""
    device_types: frozenset[DeviceType]
    requires_static_shapes: bool = True
    partitions_graph: bool = True
    default_graph_optimization: GraphOptimization = "basic"

    def precisions(self, provider_options: Mapping[str, str]) -> tuple[Precision, ...]:
        """Plugin EPs' NPU and GPU devices compute float models in fp16 by default."""
        return ("fp16",)

    def precision_limits(self, provider_options: Mapping[str, str]) -> str:
        return f"epfleet builds {self.name} variants of float models only"

    def compile_error_advice(self, message: str) -> str | None:
        return None

    def with_precision(
        self, precision: Precision, provider_options: Mapping[str, str]
    ) -> dict[str, str]:
        return dict(provider_options)

    @abstractmethod
    def default_device(self, provider_options: Mapping[str, str]) -> DeviceType: ...

    def numerics_options(self, provider_options: Mapping[str, str]) -> dict[str, str]:
        return every_option_counts(provider_options)

    def check_options(self, provider_options: Mapping[str, str]) -> None:
        check_option_keys(self.name, provider_options, self.option_keys)

    def missing(self) -> MissingExtraError:
        return MissingExtraError(
            f"{self.name} needs the pip package {self.package!r}, which is not installed "
            f"here: pip install 'epfleet[{self.extra}]'"
        )

    def build_identity(self) -> dict[str, str]:
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
            plugin = importlib.import_module(self.library_module)
        except ImportError as exc:
            raise self.missing() from exc
        with _lock:
            if self.name not in _registered:
                try:
                    ort.register_execution_provider_library(self.name, plugin.get_library_path())
                except (RuntimeError, OSError) as exc:
                    raise NoDeviceError(
                        f"no {self.name} device on this worker: its library did not load ({exc})"
                    ) from exc
                _registered.add(self.name)
        return [d for d in ort.get_ep_devices() if d.ep_name == self.name]

    def require_devices(self) -> list[onnxruntime.OrtEpDevice]:
        found = self.devices()
        if not found:
            raise NoDeviceError(
                f"no {self.name} device on this worker (the EP registered but enumerated none)"
            )
        return found

    def compile_devices(self, device: DeviceType) -> list[onnxruntime.OrtEpDevice]:
        """The devices a variant for ``device`` compiles with: by default all of this EP's."""
        return self.require_devices()

    def session_devices(self, device: DeviceType) -> list[onnxruntime.OrtEpDevice]:
        """The devices a variant for ``device`` runs on here: by default those it compiles
        with."""
        return self.compile_devices(device)

    def build(
        self,
        src: Path,
        dst: Path,
        provider_options: Mapping[str, str],
        device: DeviceType,
        optimization: GraphOptimization,
        layout: Layout = SINGLE_FILE,
    ) -> None:
        compile_ep_context(
            self.compile_devices(device), src, dst, provider_options, optimization, layout
        )

    def generate_compatibility_string(self, artifact: Path) -> str | None:
        """None: a plugin EP writes its own string into the EPContext model."""
        return None

    def judge(self, compatibility_string: str) -> Judgement | None:
        """None: ORT asks the plugin's own validator."""
        return None

    def explain_string(self, compatibility_string: str) -> str | None:
        return None

    def sdk_version(self, compatibility_string: str) -> str | None:
        return None

    def configure_session(
        self,
        options: onnxruntime.SessionOptions,
        provider_options: Mapping[str, str],
        device: DeviceType,
    ) -> None:
        options.add_provider_for_devices(self.session_devices(device), dict(provider_options))

    @abstractmethod
    def local_target(self, devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None: ...


def has_device_type(devices: list[onnxruntime.OrtEpDevice], device: str) -> bool:
    """Whether one of ``devices`` is hardware of type ``device`` (cpu, gpu, npu)."""
    return any(d.device.type.name.lower() == device for d in devices)


def compile_ep_context(
    devices: list[onnxruntime.OrtEpDevice],
    src: Path,
    dst: Path,
    provider_options: Mapping[str, str],
    optimization: GraphOptimization,
    layout: Layout = SINGLE_FILE,
) -> None:
    """Compile ``src`` into an EPContext model at ``dst`` with ORT's compile API, its
    context binaries and large initializers beside it as ``layout`` says (ORT takes the
    initializers' file name relative to ``dst``'s directory).

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
        embed_compiled_data_into_model=layout.embed_context,
        external_initializers_file_path=layout.external_initializers,
        external_initializers_size_threshold=layout.external_min_bytes,
        graph_optimization_level=ort_level(optimization),
        flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED,
    )
    compiler.compile_to_file(str(dst))
