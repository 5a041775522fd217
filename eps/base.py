"""The one small interface every EP object implements, and what EP modules share.

An EP module holds every fact about its EP (package, extra, devices, how a
target becomes session options, how a variant is built, how its compatibility
string is made and judged) in one object, ``EP``, so that shared compile code
never branches on the EP's name. The package ``eps`` imports nothing from
``epfleet``: its errors and the ORT version helper live here.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import onnxruntime

DeviceType = Literal["cpu", "gpu", "npu"]
GraphOptimization = Literal["disable", "basic", "extended", "all"]
"""ORT's graph optimisation levels, as the spec spells them."""
Precision = Literal["fp32", "fp16", "w16a16", "w8a16", "w8a8"]
"""What a variant computes in: a float type, or integer QDQ with 16- or 8-bit weights and
16- or 8-bit activations (``w<weight bits>a<activation bits>``)."""
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "w16a16", "w8a16", "w8a8")
INTEGER_PRECISIONS: frozenset[Precision] = frozenset({"w16a16", "w8a16", "w8a8"})
WIDER_INTEGER: tuple[Precision, ...] = ("w8a8", "w8a16", "w16a16")
"""The integer precisions from the narrowest to the widest: after one fails, the next
wider one a target makes is the first lever."""
SIXTEEN_BIT_ACTIVATIONS: frozenset[Precision] = frozenset({"w16a16", "w8a16"})


@dataclass(frozen=True)
class Tolerance:
    """How far a variant's outputs may be from its source's: an output fails when its
    largest error exceeds both ``relative`` times the output's range and ``absolute``
    (the precision's resolution, for outputs nearly constant on the samples)."""

    relative: float
    absolute: float


# Default tolerances by the precision a variant computes in. Measured here: QNN HTP fp16
# variants of real vision and OCR models differ from the fp32 source by 0.5 to 3.2 % of
# the output's range; on a detector's heat map that spans 2e-4 on generated inputs, by
# 3.5e-4 (fp16's resolution near 1.0 is 2^-10, about 1e-3).
FP32_TOLERANCE = Tolerance(relative=1e-3, absolute=1e-5)
FP16_TOLERANCE = Tolerance(relative=0.05, absolute=1e-3)
# QDQ models against their fp32 source, measured here with ORT's QNN quantisation tools on
# the HTP backend, on held-out real inputs of four models from PyPI wheels (README,
# "Precision"): a configuration that works is 3-8 % off (a ViT-S at w8a16 8.5 % on padded
# photos, its output's SQNR 40 dB), one that does not 12-72 % (class flips, VAD
# probabilities off by more than 0.1). 8-bit activations resolve 1/256 of a tensor's
# range, 16-bit 1/65536.
W8A16_TOLERANCE = Tolerance(relative=0.10, absolute=1e-3)
W8A8_TOLERANCE = Tolerance(relative=0.10, absolute=4e-3)
# 16-bit weights as well: held to w8a16's bounds (a small CNN on this host's HTP backend,
# v73: w16a16 1.37 % off, w8a16 1.52 %; the activations' resolution is the same).
W16A16_TOLERANCE = W8A16_TOLERANCE
TOLERANCE_OF: dict[Precision, Tolerance] = {
    "fp32": FP32_TOLERANCE,
    "fp16": FP16_TOLERANCE,
    "w16a16": W16A16_TOLERANCE,
    "w8a16": W8A16_TOLERANCE,
    "w8a8": W8A8_TOLERANCE,
}
"""The output error verification accepts by default, by the precision a variant computes in."""

# The loosest tolerance any variant may be verified, published or health-checked with: a
# spec, a manifest entry (signed or not) and a device never go past it. Measured errors
# against the fp32 source: fp16 0.5-3.2 % of the output's range; QDQ w8a16 0.8-7.7 %,
# w8a8 1.1-17 % (a ViT-S at 38 % w8a8 is a broken quantisation, and is refused). A
# quarter of the range leaves room for integer precisions. The absolute floor is for
# outputs nearly constant on the samples (fp16 resolves 1e-3 near 1.0, 8-bit 4e-3 of a
# unit range); 0.05 accepts no more than the relative bound does on outputs spanning 0.2.
LOOSEST_TOLERANCE = Tolerance(relative=0.25, absolute=0.05)


def bounded(tolerance: Tolerance) -> Tolerance:
    """``tolerance`` no looser than ``LOOSEST_TOLERANCE`` (NaN counts as loosest)."""
    relative, absolute = tolerance.relative, tolerance.absolute
    return Tolerance(
        relative=relative if relative <= LOOSEST_TOLERANCE.relative else LOOSEST_TOLERANCE.relative,
        absolute=absolute if absolute <= LOOSEST_TOLERANCE.absolute else LOOSEST_TOLERANCE.absolute,
    )


class EpError(Exception):
    """An EP cannot do what was asked on this machine; the message says why."""


class MissingExtraError(EpError):
    """An execution provider's pip package is not installed."""


class NoDeviceError(EpError):
    """The EP is installed but has no device here for what was asked."""


DEFAULT_TOLERANCE = FP16_TOLERANCE
"""The tolerance when nothing says what a variant computes in (a compile request written
by an older epfleet, which verified every variant with fp16's)."""


def effective_tolerance(
    relative: float | None = None,
    absolute: float | None = None,
    *,
    precision: Precision | None = None,
    module: ExecutionProvider | None = None,
    provider_options: Mapping[str, str] | None = None,
) -> Tolerance:
    """The one rule for the tolerance a variant is verified, published and health-checked
    with; every caller asks here. Each of ``relative`` and ``absolute`` that is given (a
    target's in the spec, or what a compile host's verification recorded) wins; the other
    is the default of the precision the variant computes in (``TOLERANCE_OF``):
    ``precision``, else the EP ``module``'s default precision for ``provider_options``;
    with neither, ``DEFAULT_TOLERANCE``."""
    if precision is None and module is not None:
        precision = module.precisions(provider_options or {})[0]
    default = DEFAULT_TOLERANCE if precision is None else TOLERANCE_OF[precision]
    return Tolerance(
        relative=default.relative if relative is None else relative,
        absolute=default.absolute if absolute is None else absolute,
    )


@functools.cache
def ort_version() -> str:
    """The installed onnxruntime's version, without importing it."""
    return importlib.metadata.version("onnxruntime")


def ort_level(optimization: GraphOptimization) -> onnxruntime.GraphOptimizationLevel:
    import onnxruntime as ort

    return {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]


class Verdict(str, Enum):
    """How well a compiled variant suits this machine (ORT's OrtCompiledModelCompatibility)."""

    OPTIMAL = "optimal"
    PREFER_RECOMPILATION = "prefer_recompilation"
    UNSUPPORTED = "unsupported"
    UNKNOWN = "unknown"  # ORT's EP_NOT_APPLICABLE: the EP has no opinion; never treated as OK


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class Layout:
    """How a variant's files are laid out in its directory. The default is a single file:
    EP contexts embedded in the model, every initializer inside it."""

    embed_context: bool = True
    """Embed EP context binaries in the EPContext nodes; False writes them beside the model."""
    external_initializers: str | None = None
    """File name, beside the model, for initializers of at least ``external_min_bytes``;
    None keeps every initializer inside the model."""
    external_min_bytes: int = 1024


SINGLE_FILE = Layout()


@dataclass(frozen=True)
class LocalTarget:
    """What a device compiles for when it recompiles a model for its own hardware."""

    device: DeviceType
    provider_options: dict[str, str]


class ExecutionProvider(Protocol):
    """What shared code asks of an EP: the ``EP`` object of each module in ``eps/``.

    The facts are read-only properties, so a class attribute of a narrower type fits."""

    @property
    def name(self) -> str:
        """ORT's EP name, e.g. ``QNNExecutionProvider``; the key of
        ``ep_compatibility_info.<name>``."""
        ...

    @property
    def extra(self) -> str | None:
        """The epfleet pip extra that installs this EP, or None when onnxruntime has it
        built in."""
        ...

    @property
    def requires_static_shapes(self) -> bool:
        """True when every model input must have fixed dims before compiling (NPU EPs)."""
        ...

    @property
    def device_types(self) -> frozenset[DeviceType]:
        """The device types a variant of this EP can target."""
        ...

    @property
    def partitions_graph(self) -> bool:
        """True when a variant is an EPContext model in which the EP's partitions are
        EPContext nodes and other nodes are left to ORT's CPU EP; False when the EP runs
        the whole variant."""
        ...

    @property
    def default_graph_optimization(self) -> GraphOptimization:
        """The level a target compiles at when the spec does not say."""
        ...

    def precisions(self, provider_options: Mapping[str, str]) -> tuple[Precision, ...]:
        """What a target with these options can compute in on its hardware, its default
        first. Integer precisions (QDQ models) are made by epfleet's quantise step."""
        ...

    def precision_limits(self, provider_options: Mapping[str, str]) -> str:
        """Why ``precisions`` is what it is for these options, for an error message
        (e.g. "HTP v68 has no fp16 unit and no 16-bit activations")."""
        ...

    def compile_error_advice(self, message: str) -> str | None:
        """One sentence saying what a compile error of this EP (``message``, as ORT raised
        it) means and what to change, or None when the module knows nothing of it; the
        compile's error gives the sentence, then the original message."""
        ...

    def with_precision(
        self, precision: Precision, provider_options: Mapping[str, str]
    ) -> dict[str, str]:
        """The provider options that build a variant at ``precision`` (one of
        ``precisions``), e.g. the switch that makes an NPU compute a float model in fp16.
        ValueError naming the option when the target's options contradict it."""
        ...

    def default_device(self, provider_options: Mapping[str, str]) -> DeviceType:
        """Device type a target runs on when the spec does not say."""
        ...

    def numerics_options(self, provider_options: Mapping[str, str]) -> dict[str, str]:
        """The part of a target's provider options (those a precision builds with) that
        decides a variant's outputs, in a form equal for targets whose variants of one model
        compute the same outputs: such targets are verified once on every golden sample and
        otherwise checked on their first (``epfleet.fleet.planning.twin_rules``). Without a
        measurement that says otherwise, every option counts: ``every_option_counts``."""
        ...

    def check_options(self, provider_options: Mapping[str, str]) -> None:
        """Raise ValueError naming the option when a provider option is invalid."""
        ...

    def build_identity(self) -> dict[str, str]:
        """What, besides the inputs, decides the artifact: at least ``package`` and
        ``version``. Part of every pair's fingerprint. Raises MissingExtraError."""
        ...

    def devices(self) -> list[onnxruntime.OrtEpDevice]:
        """This EP's devices on this machine, registering its plugin library first. Raises
        MissingExtraError without the package, NoDeviceError when the library does not load."""
        ...

    def build(
        self,
        src: Path,
        dst: Path,
        provider_options: Mapping[str, str],
        device: DeviceType,
        optimization: GraphOptimization,
        layout: Layout = SINGLE_FILE,
    ) -> None:
        """Turn the prepared model at ``src`` into a variant for ``device`` at ``dst``,
        optimising the graph at ``optimization`` first, its other files (contexts, external
        initializers) beside ``dst`` as ``layout`` says. Raises NoDeviceError when this
        worker has no device to compile with, MissingExtraError without the package."""
        ...

    def generate_compatibility_string(self, artifact: Path) -> str | None:
        """The string epfleet writes when the EP wrote none; None when the EP writes its own."""
        ...

    def judge(self, compatibility_string: str) -> Judgement | None:
        """epfleet's own verdict for strings it generates; None defers to ORT's validator."""
        ...

    def explain_string(self, compatibility_string: str) -> str | None:
        """What a string says of the hardware and runtime a variant was built for, in
        words (for a device's report of a verdict), or None when the module cannot read
        it."""
        ...

    def sdk_version(self, compatibility_string: str) -> str | None:
        """The version of the vendor SDK a string says the variant was built with (QNN:
        the QAIRT release), or None when the EP's strings name none (or this one is not
        one the module reads)."""
        ...

    def configure_session(
        self,
        options: onnxruntime.SessionOptions,
        provider_options: Mapping[str, str],
        device: DeviceType,
    ) -> None:
        """Make ``options`` run a variant of this EP on this machine's ``device``.
        Raises NoDeviceError when there is no such device here, MissingExtraError without
        the package."""
        ...

    def local_target(self, devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
        """How a device with these of this EP's devices recompiles a model for itself,
        or None when this EP does not build for the hardware it finds here."""
        ...


def every_option_counts(provider_options: Mapping[str, str]) -> dict[str, str]:
    """``numerics_options`` of an EP for which nothing is measured: every option may change
    the outputs, so only targets with the same options share a verification."""
    return dict(provider_options)


def check_option_keys(
    ep_name: str, provider_options: Mapping[str, str], known: Collection[str]
) -> None:
    """Refuse the first provider option key the EP does not take, naming its close match or
    else every known key: ORT hands unknown keys to a plugin EP, which silently ignores them.

    The message starts with the key and a colon (``htp_arc: unknown ...``), so the spec
    places the error at ``provider_options.<key>``."""
    for key in provider_options:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known))}"
            raise ValueError(f"{key}: unknown {ep_name} option; {hint}")
