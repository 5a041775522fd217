"""ORT's built-in CPU EP: the variant is an offline ORT-optimised model.

The CPU EP has no EPContext compile and answers NOT_APPLICABLE to every
compatibility string, so epfleet writes and judges its own. An ORT_ENABLE_ALL
model is hardware specific: its ``com.microsoft.nchwc`` ops carry a channel
block size that follows the CPU's vector ISA (16 for AVX-512, 8 for AVX2/AVX,
NEON on arm64), and it may use contrib ops of the ORT version that wrote it.
The string records exactly those facts:

    epfleet-cpu/1;ort=1.32.0;arch=x86_64;isa=avx512;nchwc=1
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from eps.base import (
    SINGLE_FILE,
    DeviceType,
    ExecutionProvider,
    GraphOptimization,
    Judgement,
    Layout,
    LocalTarget,
    NoDeviceError,
    Precision,
    Verdict,
    every_option_counts,
    ort_level,
    ort_version,
)

if TYPE_CHECKING:
    import onnxruntime

NAME = "CPUExecutionProvider"
STRING_PREFIX = "epfleet-cpu/1"
NCHWC_DOMAIN = "com.microsoft.nchwc"
_FIELDS = ("ort", "arch", "isa", "nchwc")

# Not ORT options: they pin the machine class a CPU variant is built for, since the
# optimised model follows the compiling worker's CPU. A worker of another class refuses.
PIN_OPTIONS = ("arch", "isa")
ISA_CLASSES = ("avx512", "avx2", "avx", "sse", "neon")
OPTION_KEYS: frozenset[str] = frozenset(PIN_OPTIONS)
INLINE_MAX_BYTES = 64 << 20
"""Largest optimised model file of a source with external data kept with its
initializers inline (those the optimiser made); larger, they go to an external file."""


def machine_arch() -> str:
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


@functools.cache
def isa_class() -> str:
    """The vector ISA class that decides MLAS's NCHWc block size on this CPU."""
    arch = machine_arch()
    if arch == "aarch64":
        return "neon"
    if arch != "x86_64":
        return arch
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return "unknown"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    if "avx" in flags:
        return "avx"
    return "sse"


def make_string(ort_version: str, arch: str, isa: str, uses_nchwc: bool) -> str:
    return f"{STRING_PREFIX};ort={ort_version};arch={arch};isa={isa};nchwc={int(uses_nchwc)}"


def parse_string(compatibility_string: str) -> dict[str, str]:
    """Split a string made by ``make_string``; ValueError when it is not one."""
    prefix, _, rest = compatibility_string.partition(";")
    if prefix != STRING_PREFIX:
        raise ValueError(f"not an {STRING_PREFIX} string: {compatibility_string!r}")
    fields = dict(item.partition("=")[::2] for item in rest.split(";") if item)
    missing = [f for f in _FIELDS if f not in fields]
    if missing:
        raise ValueError(f"{compatibility_string!r} lacks {', '.join(missing)}")
    return fields


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def judge_against(compatibility_string: str, *, ort_version: str, arch: str, isa: str) -> Judgement:
    """Judge a CPU string against a described machine (pure; ``judge`` uses this machine)."""
    try:
        built = parse_string(compatibility_string)
    except ValueError as exc:
        return Judgement(Verdict.UNSUPPORTED, str(exc))
    if built["arch"] != arch:
        return Judgement(
            Verdict.UNSUPPORTED, f"optimised for {built['arch']}, this machine is {arch}"
        )
    if built["nchwc"] == "1" and built["isa"] != isa:
        return Judgement(
            Verdict.UNSUPPORTED,
            f"uses NCHWc kernels laid out for {built['isa']}, this CPU runs {isa}",
        )
    built_ort, local_ort = _version_tuple(built["ort"]), _version_tuple(ort_version)
    if built_ort > local_ort:
        return Judgement(
            Verdict.UNSUPPORTED,
            f"written by ORT {built['ort']}, newer than this ORT {ort_version}",
        )
    if built_ort < local_ort:
        return Judgement(
            Verdict.PREFER_RECOMPILATION,
            f"written by ORT {built['ort']}; this ORT {ort_version} may optimise better",
        )
    if built["isa"] != isa:
        return Judgement(
            Verdict.PREFER_RECOMPILATION,
            f"optimised on a {built['isa']} CPU without NCHWc; this {isa} CPU may do better",
        )
    return Judgement(Verdict.OPTIMAL, f"ORT {ort_version}, {arch}/{isa}")


class Cpu:
    """The CPU EP: built into onnxruntime, runs the whole variant, judges its own strings."""

    name = NAME
    extra = None
    requires_static_shapes = False
    device_types: frozenset[DeviceType] = frozenset({"cpu"})
    partitions_graph = False
    default_graph_optimization: GraphOptimization = "all"

    def precisions(self, provider_options: Mapping[str, str]) -> tuple[Precision, ...]:
        return ("fp32",)

    def precision_limits(self, provider_options: Mapping[str, str]) -> str:
        return "the CPU variant is ORT's optimised fp32 model"

    def compile_error_advice(self, message: str) -> str | None:
        return None

    def with_precision(
        self, precision: Precision, provider_options: Mapping[str, str]
    ) -> dict[str, str]:
        return dict(provider_options)

    def default_device(self, provider_options: Mapping[str, str]) -> DeviceType:
        return "cpu"

    def numerics_options(self, provider_options: Mapping[str, str]) -> dict[str, str]:
        return every_option_counts(provider_options)

    def check_options(self, provider_options: Mapping[str, str]) -> None:
        unknown = sorted(set(provider_options) - OPTION_KEYS)
        if unknown:
            raise ValueError(
                f"{NAME} takes only {', '.join(PIN_OPTIONS)} (to pin the machine "
                f"class it is built for), got {', '.join(unknown)}"
            )
        isa = provider_options.get("isa")
        if isa is not None and isa not in ISA_CLASSES:
            raise ValueError(f"isa {isa!r} is not one of {', '.join(ISA_CLASSES)}")

    def build_identity(self) -> dict[str, str]:
        return {
            "package": "onnxruntime",
            "version": ort_version(),
            "arch": machine_arch(),
            "isa": isa_class(),
        }

    def devices(self) -> list[onnxruntime.OrtEpDevice]:
        import onnxruntime as ort

        return [d for d in ort.get_ep_devices() if d.ep_name == NAME]

    def build(
        self,
        src: Path,
        dst: Path,
        provider_options: Mapping[str, str],
        device: DeviceType,
        optimization: GraphOptimization,
        layout: Layout = SINGLE_FILE,
    ) -> None:
        """The optimised model ORT writes; no EP context, so ``layout.embed_context`` does
        not apply. With ``layout.external_initializers`` (a source with external data),
        first the optimised graph that still refers to the source's data files for every
        initializer the optimiser left alone (nothing read or written: the variant
        shares those files with its source); when that fails (initializers the optimiser
        made, inline, past protobuf's 2 GB) or its model file is larger than
        ``INLINE_MAX_BYTES``, every large initializer into ``external_initializers``."""
        here = {"arch": machine_arch(), "isa": isa_class()}
        for key in PIN_OPTIONS:
            wanted = provider_options.get(key)
            if wanted is not None and wanted != here[key]:
                raise NoDeviceError(
                    f"no {NAME} device with {key} {wanted} on this worker (it is "
                    f"{here['arch']}/{here['isa']}); compile this target on a matching worker"
                )
        if layout.external_initializers:
            try:
                _optimize(src, dst, optimization, SINGLE_FILE)
                if dst.stat().st_size <= INLINE_MAX_BYTES:
                    return
            except Exception:  # ORT's INVALID_PROTOBUF past 2 GB: written externally below
                pass
            dst.unlink(missing_ok=True)
        _optimize(src, dst, optimization, layout)

    def generate_compatibility_string(self, artifact: Path) -> str | None:
        import onnx

        model = onnx.load(str(artifact), load_external_data=False)
        uses_nchwc = any(node.domain == NCHWC_DOMAIN for node in model.graph.node)
        return make_string(ort_version(), machine_arch(), isa_class(), uses_nchwc)

    def judge(self, compatibility_string: str) -> Judgement | None:
        return judge_against(
            compatibility_string, ort_version=ort_version(), arch=machine_arch(), isa=isa_class()
        )

    def explain_string(self, compatibility_string: str) -> str | None:
        """None: ``judge`` gives its reasons itself."""
        return None

    def sdk_version(self, compatibility_string: str) -> str | None:
        """None: ORT itself is the CPU EP's whole runtime."""
        return None

    def configure_session(
        self,
        options: onnxruntime.SessionOptions,
        provider_options: Mapping[str, str],
        device: DeviceType,
    ) -> None:
        """Nothing to add: a session runs on the CPU EP when no other EP is configured."""

    def local_target(self, devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
        return LocalTarget(device="cpu", provider_options={}) if devices else None


def _optimize(src: Path, dst: Path, optimization: GraphOptimization, layout: Layout) -> None:
    """ORT's optimised model of ``src`` at ``dst``. Prepacking is off: a build never runs
    the model, and packing copies every MatMul/Gemm weight into the heap (measured on a
    2.2 GB model: 2.8 GB peak with it, 0.07 GB without)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort_level(optimization)
    options.optimized_model_filepath = str(dst)
    options.add_session_config_entry("session.disable_prepacking", "1")
    if layout.external_initializers:
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name",
            layout.external_initializers,
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes",
            str(layout.external_min_bytes),
        )
    ort.InferenceSession(str(src), options, providers=[NAME])


EP: ExecutionProvider = Cpu()
