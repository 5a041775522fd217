"""The fleet spec: which models to compile for which EP targets (pure: no I/O but reading YAML)."""

from __future__ import annotations

import re
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

import eps
from epfleet.errors import BadInputError
from epfleet.formats.manifest import (
    FILE_PATH_MAX_LENGTH,
    FILE_PATH_PATTERN,
    NAME_MAX_LENGTH,
    NAME_PATTERN,
)
from epfleet.formats.rollout import RolloutPolicy
from epfleet.formats.task_metric import MetricSpec, NoMetric
from eps.base import (
    INTEGER_PRECISIONS,
    LOOSEST_TOLERANCE,
    DeviceType,
    GraphOptimization,
    Precision,
)

WORK_POOL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
DEFAULT_VERIFY_TIMEOUT = 600.0
MAX_VERIFY_TIMEOUT = 86_400.0
"""The longest ``verify_timeout`` a spec may give: a day (a timer cannot wait forever)."""
CalibrateMethod = Literal["minmax", "entropy", "percentile"]


class QuantizationSpec(BaseModel):
    """Options of the quantise step that makes a model's QDQ model for integer variants."""

    model_config = ConfigDict(extra="forbid")

    per_channel: bool = Field(
        default=False, description="Quantise Conv and MatMul weights per output channel"
    )
    calibrate_method: CalibrateMethod = Field(
        default="minmax",
        description="How activation ranges are taken from the calibration inputs: minmax, "
        "entropy or percentile",
    )
    nodes_to_exclude: list[str] = Field(
        default_factory=list,
        description="Node names left in float (a failed verification names the layers "
        "whose error explodes)",
    )


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=NAME_MAX_LENGTH,
        description="Unique model name, e.g. ocr-det",
    )
    source: str = Field(
        min_length=1,
        description="ONNX file (its external data files beside it), or a model folder (e.g. "
        "ONNX Runtime GenAI's: config, tokenizer and ONNX files): a path relative to the spec "
        "file or a file:// URI; an s3:// URI for a single-file ONNX model",
    )
    model_file: str | None = Field(
        default=None,
        pattern=FILE_PATH_PATTERN,
        max_length=FILE_PATH_MAX_LENGTH,
        description="The main ONNX file of a folder source; model.onnx when the folder has "
        "one, else its only .onnx file",
    )
    input_shapes: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Fixed shape per input name, for symbolic or unknown dims",
    )
    samples: str | None = Field(
        default=None,
        min_length=1,
        description="Sample inputs for verification: an .npz of arrays by input name "
        "(relative to the spec); an extra leading axis holds several samples. "
        "Omitted: seeded generated inputs",
    )
    calibration: str | None = Field(
        default=None,
        min_length=1,
        description="Inputs that integer (w16a16, w8a16, w8a8) variants are calibrated on: an "
        ".npz in the samples format (relative to the spec), inputs like the real data, none of "
        "them among the samples. Without samples, a fifth of them (at least one) is held "
        "out for verification. The task metric is judged on them too",
    )
    verification: str | None = Field(
        default=None,
        min_length=1,
        description="More inputs the task metric is judged on (beside the samples and the "
        "calibration inputs): an .npz in the samples format (relative to the spec), real "
        "inputs held out from calibration. Used by a named metric, and by the default for "
        "class scores on integer variants; not with metric {kind: none}",
    )
    quantization: QuantizationSpec = Field(
        default_factory=lambda: QuantizationSpec(),
        description="How integer variants are quantised (ORT's QNN quantisation tools)",
    )
    rollout: RolloutPolicy | None = Field(
        default=None,
        description="How new variants of this model reach the fleet (overrides the spec's)",
    )
    metric: MetricSpec | NoMetric | None = Field(
        default=None,
        discriminator="kind",
        description="What the model's users judge it by (e.g. {kind: argmax_agreement, min: "
        "0.99}): a variant is published only when it reaches this on the golden samples, the "
        "calibration and verification inputs as well as the numeric tolerance. Omitted: the "
        "numeric gate, and integer variants' class-score outputs judged by their decisions "
        "(min 0.97); {kind: none}: the numeric gate alone",
    )

    @property
    def named_metric(self) -> MetricSpec | None:
        """The task metric the spec names (None: none, or ``kind: none``)."""
        return self.metric if isinstance(self.metric, MetricSpec) else None

    @property
    def decision_default(self) -> bool:
        """Whether integer variants' class scores are judged by the default: no metric
        named, and the default not turned off with ``kind: none``."""
        return self.metric is None

    @field_validator("input_shapes")
    @classmethod
    def _positive_dims(cls, shapes: dict[str, list[int]]) -> dict[str, list[int]]:
        for input_name, dims in shapes.items():
            if not dims:
                raise ValueError(f"input {input_name!r}: shape is empty")
            bad = [d for d in dims if d <= 0]
            if bad:
                raise ValueError(
                    f"input {input_name!r}: every dim must be a positive integer, got {dims}"
                )
        return shapes


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=NAME_MAX_LENGTH,
        description="Unique target name; the variant name",
    )
    ep: str = Field(description="ORT execution provider name, e.g. QNNExecutionProvider")
    device: DeviceType | None = Field(
        default=None, description="cpu, gpu or npu; the EP module's default when omitted"
    )
    provider_options: dict[str, str] = Field(default_factory=dict)
    precision: list[Precision] | None = Field(
        default=None,
        description="What variants compute in: fp32, fp16, w16a16, w8a16 or w8a8 (16- or "
        "8-bit weights, 16- or 8-bit activations: a QDQ model quantised with the model's "
        "calibration inputs); a list is a ladder, tried in order, the first that passes "
        "verification published. Omitted: the EP's default for the target's hardware",
    )
    models: list[str] | None = Field(
        default=None, description="Subset of model names; every model when omitted"
    )
    runtimes: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Names of the spec's runtimes to build this target under, one variant "
        "each, named <target>.<runtime>; omitted: the compile host's own onnxruntime and EP "
        "package",
    )
    runtime: str | None = Field(
        default=None,
        description="The one runtime this target builds under (a target with runtimes "
        "becomes one target per runtime, each with its runtime here)",
    )
    work_pool: str | None = Field(
        default=None,
        pattern=WORK_POOL_PATTERN,
        description="Prefect work pool whose workers compile this target (hardware-bound "
        "EPs); the fleet flow runs deployment compile-pairs/<work_pool> for its pairs. "
        "Omitted: the pairs compile where the fleet flow runs",
    )

    graph_optimization: GraphOptimization | None = Field(
        default=None,
        description="ORT graph optimisation level the variant is compiled at; the EP "
        "module's default (basic for EPContext compiles) when omitted",
    )
    min_coverage: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Smallest share of the graph the EP must take (1.0: full compile)",
    )
    embed_context: bool | None = Field(
        default=None,
        description="Embed EP context binaries in the variant's model (true) or write them "
        "as files beside it (false); omitted: embedded when the source totals less than "
        "EPFLEET_EMBED_CONTEXT_MAX_BYTES. Only for EPs that compile EPContext models",
    )
    verify: bool = Field(
        default=True,
        description="Run each new variant on this host and compare it with its source",
    )
    fold_io: bool = Field(
        default=False,
        description="For the ladder's integer precisions (w16a16, w8a16, w8a8): remove the "
        "QDQ model's QuantizeLinear of each graph input and DequantizeLinear to each graph "
        "output before compiling, so the variant takes and gives integers and loads with "
        "CPU fallback disabled; the manifest records each one's scale and zero point "
        "(folded_io). The ladder's float precisions compile as they are",
    )
    tolerance: float | None = Field(
        default=None,
        gt=0,
        description="Largest output error accepted, relative to the output's range; the EP "
        "module's default for the target's precision when omitted",
    )
    abs_tolerance: float | None = Field(
        default=None,
        ge=0,
        description="Absolute errors up to this always pass (outputs nearly constant on the "
        "samples); the EP module's default for the target's precision when omitted",
    )
    verify_timeout: float = Field(
        default=DEFAULT_VERIFY_TIMEOUT,
        gt=0,
        le=MAX_VERIFY_TIMEOUT,
        allow_inf_nan=False,
        description="Seconds one verification may take (up to 86,400: a day); past it the "
        "pair fails",
    )

    @property
    def device_type(self) -> DeviceType:
        """The target's device; validation fills in the EP module's default."""
        assert self.device is not None
        return self.device

    @property
    def ladder(self) -> list[Precision]:
        """The precisions to try, in order; validation fills in the EP module's default."""
        assert self.precision is not None
        return self.precision

    @property
    def quantizes(self) -> bool:
        """Whether some precision of its ladder is an integer one (a QDQ model)."""
        return any(p in INTEGER_PRECISIONS for p in self.ladder)

    @field_validator("fold_io", mode="before")
    @classmethod
    def _a_boolean(cls, fold: Any) -> Any:
        # pydantic would take "yes", 1 or "on": a spec says true or false
        if not isinstance(fold, bool):
            raise ValueError(f"must be true or false, got {fold!r}")
        return fold

    @field_validator("precision", mode="before")
    @classmethod
    def _one_or_a_ladder(cls, precision: Any) -> Any:
        return [precision] if isinstance(precision, str) else precision

    @field_validator("provider_options", mode="before")
    @classmethod
    def _stringify(cls, options: Any) -> Any:
        # ORT takes string options; YAML turns `htp_arch: 75` into an int and `x: true` into a bool.
        if not isinstance(options, dict):
            return options
        stringified = {}
        for key, value in options.items():
            if value is None or isinstance(value, (list, dict)):
                raise ValueError(
                    f"provider option {key!r} must be a string, number or boolean, got {value!r}"
                )
            stringified[str(key)] = "1" if value is True else "0" if value is False else str(value)
        return stringified

    @field_validator("tolerance", "abs_tolerance")
    @classmethod
    def _bounded(cls, value: float | None, info: ValidationInfo) -> float | None:
        loosest = (
            LOOSEST_TOLERANCE.relative
            if info.field_name == "tolerance"
            else LOOSEST_TOLERANCE.absolute
        )
        if value is not None and not value <= loosest:
            raise ValueError(
                f"{value:g} is looser than any variant may be verified with ({loosest:g}): "
                "a device refuses such an entry; quantise or fix the model instead"
            )
        return value

    @field_validator("ep")
    @classmethod
    def _known_ep(cls, ep_name: str) -> str:
        if ep_name not in eps.EP_MODULES:
            raise ValueError(
                f"unknown execution provider {ep_name!r}; known: {eps.describe_known()}"
            )
        return ep_name

    @model_validator(mode="after")
    def _ep_facts(self) -> TargetSpec:
        module = eps.load(self.ep)
        try:
            module.check_options(self.provider_options)
        except ValueError as exc:
            key, _, problem = str(exc).partition(": ")
            if key not in self.provider_options:
                raise ValueError(f"provider_options: {exc}") from None
            # The error names one option first (eps.base.check_option_keys): place it there.
            error = PydanticCustomError("value_error", "Value error, {p}", {"p": problem})
            where = ("provider_options", key)
            raise ValidationError.from_exception_data(
                "TargetSpec", [{"type": error, "loc": where, "input": self.provider_options[key]}]
            ) from None
        if self.graph_optimization is None:
            self.graph_optimization = module.default_graph_optimization
        self._precisions(module)
        if self.fold_io and not self.quantizes:
            error = PydanticCustomError(
                "value_error",
                "precision {p} has no integer precision whose Quantize/Dequantize to fold; "
                "add w8a8, w8a16 or w16a16 to it, or remove fold_io",
                {"p": ", ".join(self.ladder)},
            )
            raise ValidationError.from_exception_data(
                "TargetSpec", [{"type": error, "loc": ("fold_io",), "input": True}]
            ) from None
        if self.device is None:
            self.device = module.default_device(self.provider_options)
        elif self.device not in module.device_types:
            supported = ", ".join(sorted(module.device_types))
            raise ValueError(f"device {self.device!r}: {self.ep} targets {supported}")
        return self

    def _precisions(self, module: eps.ExecutionProvider) -> None:
        makes = module.precisions(self.provider_options)
        if self.precision is None:
            self.precision = [makes[0]]
        if not self.precision:
            raise ValueError("precision: an empty ladder; name at least one precision")
        if len(set(self.precision)) != len(self.precision):
            raise ValueError(f"precision: {self.precision} names a precision twice")
        for precision in self.precision:
            if precision not in makes:
                raise ValueError(
                    f"precision: {precision} is not one this target can make ({self.ep}"
                    f"{_options_said(self.provider_options)} makes {', '.join(makes)}: "
                    f"{module.precision_limits(self.provider_options)})"
                )
            try:
                module.with_precision(precision, self.provider_options)
            except ValueError as exc:
                raise ValueError(f"provider_options.{exc}") from None


def _options_said(options: dict[str, str]) -> str:
    said = [f"{key} {options[key]}" for key in ("backend_type", "htp_arch") if key in options]
    return f" with {', '.join(said)}" if said else ""


DASK_RESOURCE_PREFIX = "runtime-"


class RuntimeSpec(BaseModel):
    """A named compile runtime: the pip requirements of its environment and, when its
    compiles do not run on the compile host, where they run. A spec may give a runtime as
    its requirement list alone."""

    model_config = ConfigDict(extra="forbid")

    requirements: list[str] = Field(
        description="pip requirements of the environment (onnxruntime and an EP package, "
        "pinned), e.g. [onnxruntime==1.32.0, onnxruntime-qnn==2.5.0]"
    )
    work_pool: str | None = Field(
        default=None,
        pattern=WORK_POOL_PATTERN,
        description="Prefect work pool whose workers compile this runtime's pairs (in the "
        "runtime's environment, which they build); the fleet flow runs deployment "
        "compile-pairs/<work_pool> for them. Omitted: the target's work pool, else the "
        "fleet flow's own task runner",
    )
    dask_resource: bool = Field(
        default=False,
        description="On the Dask task runner, only workers advertising the resource "
        "runtime-<name> compile this runtime's pairs (dask worker ADDRESS --resources "
        "runtime-<name>=1)",
    )
    _pins: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def pins(self) -> dict[str, str]:
        """Package (canonical name) -> the release its requirement pins with ``==``."""
        return self._pins


class FleetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[ModelSpec] = Field(min_length=1)
    runtimes: dict[str, RuntimeSpec] = Field(
        default_factory=dict,
        description="Named compile runtimes that a target's runtimes build under: each the "
        "pip requirements of an environment (onnxruntime and an EP package, pinned), e.g. "
        "qnn-2.5: [onnxruntime==1.32.0, onnxruntime-qnn==2.5.0], or an object with those "
        "requirements and where its compiles run (work_pool, dask_resource)",
    )
    targets: list[TargetSpec] = Field(min_length=1)
    rollout: RolloutPolicy | None = Field(
        default=None,
        description="Staged rollouts of new variants: stages, canary devices and the gates "
        "that advance or halt them; omitted: a publish reaches every device at once",
    )

    def rollout_of(self, model: str) -> RolloutPolicy | None:
        """The model's rollout policy: its own, else the spec's."""
        return self.model(model).rollout or self.rollout

    @field_validator("runtimes", mode="before")
    @classmethod
    def _requirement_lists(cls, runtimes: Any) -> Any:
        """A runtime given as its requirement list alone."""
        if not isinstance(runtimes, dict):
            return runtimes
        return {
            name: {"requirements": given} if isinstance(given, list) else given
            for name, given in runtimes.items()
        }

    def runtime_requirements(self) -> dict[str, list[str]]:
        """Runtime name -> its pip requirements."""
        return {name: runtime.requirements for name, runtime in self.runtimes.items()}

    @model_validator(mode="after")
    def _one_target_per_runtime(self) -> FleetSpec:
        """A target with ``runtimes`` becomes one target per runtime, ``<target>.<runtime>``,
        in the order it lists them (idempotent: an expanded spec stays as it is)."""
        for name, defined in self.runtimes.items():
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"runtimes: {name!r} is not a valid name ({NAME_PATTERN})")
            defined._pins = check_requirements(name, defined.requirements)
        expanded = []
        for target in self.targets:
            asked = target.runtimes or ([target.runtime] if target.runtime else [])
            unknown = [name for name in asked if name not in self.runtimes]
            if unknown:
                known = ", ".join(sorted(self.runtimes)) or "none: add a runtimes section"
                raise ValueError(
                    f"target {target.name!r} names unknown runtime(s) {', '.join(unknown)}; "
                    f"the spec's runtimes: {known}"
                )
            if target.runtimes is None:
                expanded.append(target)
                continue
            for runtime in target.runtimes:
                name = f"{target.name}.{runtime}"
                if len(name) > NAME_MAX_LENGTH:
                    raise ValueError(f"target {name!r} is longer than {NAME_MAX_LENGTH}")
                pool = _pool_of(target, runtime, self.runtimes[runtime].work_pool)
                expanded.append(
                    target.model_copy(
                        update={
                            "name": name,
                            "runtimes": None,
                            "runtime": runtime,
                            "work_pool": pool,
                        }
                    )
                )
        self.targets = expanded
        return self

    @model_validator(mode="after")
    def _names(self) -> FleetSpec:
        _require_unique("models", [m.name for m in self.models])
        _require_unique("targets", [t.name for t in self.targets])
        model_names = {m.name for m in self.models}
        for target in self.targets:
            unknown = sorted(set(target.models or ()) - model_names)
            if unknown:
                raise ValueError(
                    f"target {target.name!r} names unknown models {unknown}; "
                    f"the spec's models are {sorted(model_names)}"
                )
        return self

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def pairs(
        self, models: list[str] | None = None, targets: list[str] | None = None
    ) -> list[tuple[ModelSpec, TargetSpec]]:
        """Every (model, target) pair, optionally narrowed to named models and targets."""
        _require_known("model", models, [m.name for m in self.models])
        _require_known("target", targets, [t.name for t in self.targets])
        chosen = []
        for model in self.models:
            if models and model.name not in models:
                continue
            for target in self.targets:
                if targets and target.name not in targets:
                    continue
                if target.models is not None and model.name not in target.models:
                    continue
                chosen.append((model, target))
        return chosen


def _pool_of(target: TargetSpec, runtime: str, runtime_pool: str | None) -> str | None:
    """The work pool a target's pairs under ``runtime`` compile on: the runtime's, else
    the target's; ValueError naming both when they differ."""
    if runtime_pool and target.work_pool and runtime_pool != target.work_pool:
        raise ValueError(
            f"target {target.name!r} names work pool {target.work_pool!r} and its runtime "
            f"{runtime!r} work pool {runtime_pool!r}: name one of them"
        )
    return runtime_pool or target.work_pool


def dask_resource(runtime: str) -> str:
    """The Dask worker resource a runtime pinned to Dask workers needs."""
    return f"{DASK_RESOURCE_PREFIX}{runtime}"


def _require_unique(field: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{field}: duplicate name {name!r}")
        seen.add(name)


def _require_known(kind: str, asked: list[str] | None, known: list[str]) -> None:
    unknown = sorted(set(asked or ()) - set(known))
    if unknown:
        raise BadInputError(f"unknown {kind} {', '.join(unknown)}; the spec has {', '.join(known)}")


def check_requirements(name: str, requirements: list[str]) -> dict[str, str]:
    """The releases the requirements pin with ``==`` (canonical package name -> version);
    ValueError naming the runtime when a requirement is not one pip reads, or the list
    does not pin onnxruntime (the environment would run the host's, unnoticed)."""
    if not requirements:
        raise ValueError(f"runtime {name!r} lists no requirements")
    named = set()
    pins: dict[str, str] = {}
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise ValueError(
                f"runtime {name!r}: {text!r} is not a pip requirement ({exc})"
            ) from None
        if requirement.url:
            raise ValueError(
                f"runtime {name!r}: {text!r} names a URL; name a release of the package "
                "index (or give the host a wheel directory: EPFLEET_RUNTIME_WHEELS)"
            )
        package = canonicalize_name(requirement.name)
        named.add(package)
        exact = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(exact) == 1:
            pins[package] = exact[0]
    if "onnxruntime" not in named:
        raise ValueError(
            f"runtime {name!r} does not pin onnxruntime: add e.g. 'onnxruntime==1.32.0' (a "
            "runtime's workers import the onnxruntime its requirements install)"
        )
    return pins
