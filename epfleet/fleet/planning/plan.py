"""Planning compiles against the published manifest: a fleet run's plan, a pool's own decision.

``plan_run`` loads the spec, stages the sources and golden samples and decides each pair
(the rules are ``epfleet.fleet.planning.rules``'s, pure); ``plan_on_pool`` decides, on a
pool's worker, the pairs a fleet run handed over to it.

A run is planned once: ``epfleet compile`` plans before the flow run (to answer an
up-to-date fleet without starting Prefect, and to start the compiles early) and hands that
plan to the flow run it starts inside ``handing_over``; the flow's plan task takes it
(``handed_plan``) when the run's inputs are the ones it was made for, and plans otherwise.
When the command compiled and published the plan itself, before Prefect's temporary API
answered (``epfleet.fleet.runs.run_way``), it hands over the finished report too
(``handed_report``): the flow run then records that run instead of compiling again. So
does a later command for a run kept to be recorded (``epfleet.fleet.runs.kept_runs``), saying
where the run came from (``handed_origin``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from pathlib import Path

import eps
from epfleet import ort_version
from epfleet.errors import BadInputError, EpfleetError, ep_errors
from epfleet.fleet.build.staging import (
    HeldUploads,
    PreparedSource,
    built_with,
    check_local_source,
    local_source,
    resolve_source,
    stage_samples,
    stage_source,
)
from epfleet.fleet.planning.calibration import StagedCalibration, stage_calibration
from epfleet.fleet.planning.rules import decide_pair, plan_pairs
from epfleet.fleet.planning.twin_rules import assign_twins
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.fleet.rollout.rules import CannotMove, policy_change, policy_dropped
from epfleet.fleet.runs.handover import PoolPair
from epfleet.fleet.runs.models import RunPlan, RunReport
from epfleet.formats.manifest import ArtifactRef, ModelEntry, SamplesRef, SourceEntry
from epfleet.formats.rollout import RolloutPolicy
from epfleet.formats.schema_version import check_writable
from epfleet.formats.spec import FleetSpec, ModelSpec, TargetSpec
from epfleet.formats.spec_file import load_spec
from epfleet.runtime.quantize import is_qdq
from epfleet.runtime.requests import CompileRequest, RuntimeRef, fingerprinted
from epfleet.settings import settings
from epfleet.stores import open_store
from epfleet.trust.model_signatures import model_signer_for
from epfleet.trust.signers import check_signer

logger = logging.getLogger(__name__)


PlanInputs = tuple[str, str, tuple[str, ...], tuple[str, ...], bool]
"""What a plan was made from: the spec's resolved path, the store, the models and targets
selected (empty: all) and ``force``."""

_handed: ContextVar[tuple[PlanInputs, RunPlan, RunReport | None, str] | None] = ContextVar(
    "handed_plan", default=None
)

HANDED_BY_THIS_COMMAND = (
    "compiled and published by the command that started this run, before Prefect's API answered"
)


def plan_inputs(
    spec_path: Path | str,
    store_uri: str,
    models: list[str] | None,
    targets: list[str] | None,
    force: bool,
) -> PlanInputs:
    return (
        str(Path(spec_path).resolve()),
        store_uri,
        tuple(models or ()),
        tuple(targets or ()),
        force,
    )


@contextmanager
def handing_over(
    plan: RunPlan,
    inputs: PlanInputs,
    done: RunReport | None = None,
    origin: str = HANDED_BY_THIS_COMMAND,
) -> Iterator[None]:
    """Within this block, a run with these inputs takes ``plan`` instead of planning again
    and, given the report of the run ``done`` already (compiled and published), records
    it instead of compiling; ``origin`` says in its log who did that run, and when."""
    token = _handed.set((inputs, plan, done, origin))
    try:
        yield
    finally:
        _handed.reset(token)


def handed_plan(inputs: PlanInputs) -> RunPlan | None:
    """The plan handed over for a run with these inputs, if any (see ``handing_over``)."""
    handed = _handed.get()
    return handed[1] if handed is not None and handed[0] == inputs else None


def handed_report(inputs: PlanInputs) -> RunReport | None:
    """The report of a run with these inputs that is done already, if one was handed over
    (see ``handing_over``): the flow run records it."""
    handed = _handed.get()
    return handed[2] if handed is not None and handed[0] == inputs else None


def handed_origin(inputs: PlanInputs) -> str:
    """Who compiled and published the run ``handed_report`` hands over, and when."""
    handed = _handed.get()
    return handed[3] if handed is not None and handed[0] == inputs else HANDED_BY_THIS_COMMAND


def _built_with(target: TargetSpec, runtimes: dict[str, list[str]]) -> tuple[str, dict[str, str]]:
    """The onnxruntime version and EP build identity the target's pairs build with: its
    pool's (decided there), its runtime environment's (built now if this host has none
    yet), or this host's."""
    if target.work_pool:
        # Its pool decides (plan_on_pool): this machine need not even have the package.
        pool = {"package": target.ep, "version": "decided on the pool", "pool": target.work_pool}
        return ort_version(), pool
    runtime = (
        RuntimeRef(name=target.runtime, requirements=runtimes[target.runtime])
        if target.runtime
        else None
    )
    with ep_errors():
        return built_with(target.ep, runtime)


def check_runtime_packages(runtimes: dict[str, list[str]]) -> None:
    """BadInputError, before any environment is built, for a runtime requirement naming a
    package this host does not let specs install (EPFLEET_RUNTIME_PACKAGES)."""
    from epfleet.runtime.environments import allowed_packages, refused_packages
    from epfleet.settings import settings

    allowed = allowed_packages(settings().runtime_packages)
    for name, requirements in runtimes.items():
        refused = refused_packages(requirements, allowed)
        if refused:
            raise BadInputError(
                f"runtimes[{name}]: {', '.join(refused)} is not onnxruntime or an EP package "
                f"(allowed here: {', '.join(sorted(allowed))}); a compile host installs and "
                "runs what a runtime names, so others need EPFLEET_RUNTIME_PACKAGES"
            )


def check_metric_functions(models: list[ModelSpec]) -> None:
    """BadInputError, before anything compiles, for a custom task metric whose module this
    host does not let specs call (EPFLEET_METRIC_MODULES)."""
    from epfleet.formats.task_metric import module_allowed, refusal
    from epfleet.settings import settings

    allowed = settings().metric_modules
    for model in models:
        function = model.named_metric.function if model.named_metric else None
        if function and not module_allowed(function, allowed):
            raise BadInputError(f"models[{model.name}]: {refusal(function)}")


def plan_run(
    spec_path: Path,
    store_uri: str,
    models: list[str] | None = None,
    targets: list[str] | None = None,
    force: bool = False,
) -> RunPlan:
    """Load and check the spec, stage the sources and decide which pairs to compile.
    Raises BadInputError before anything compiles."""
    spec: FleetSpec = load_spec(spec_path)
    pairs = spec.pairs(models, targets)
    check_metric_functions([model for model, _ in pairs])
    if not pairs:
        raise BadInputError("the selected models and targets form no pair to compile")
    store = open_store(store_uri)  # an unknown scheme is refused first; nothing is made yet
    for name in dict.fromkeys(model.name for model, _ in pairs):
        check_local_source(spec.model(name), resolve_source(spec_path, spec.model(name).source))
    store.clean_up_incomplete()  # uploads killed runs left, after EPFLEET_MULTIPART_GRACE
    requirements = spec.runtime_requirements()
    check_runtime_packages(requirements)
    identities = {target.name: _built_with(target, requirements) for _, target in pairs}
    check_signer(store)  # what a publish would refuse is refused now, before any compile
    model_signer_for(store)  # and so is a model-signing key it would refuse
    static_eps: dict[str, set[str]] = {}
    for model, target in pairs:
        needs_static = eps.load(target.ep).requires_static_shapes
        static_eps.setdefault(model.name, set()).update([target.ep] if needs_static else [])
    manifest = read_in_force(store).manifest
    check_writable(manifest.schema_version if manifest else None, store.uri)
    published = manifest.models if manifest else {}
    sources: dict[str, SourceEntry] = {}
    samples: dict[str, SamplesRef | None] = {}
    calibrations: dict[str, ArtifactRef | None] = {}
    problems: dict[str, str] = {}
    with HeldUploads(store) as uploads:  # nothing reaches the store until all models pass
        prepared: dict[str, PreparedSource] = {}
        for name, static in static_eps.items():  # every source, before any golden sample
            model = spec.model(name)
            sources[name], prepared[name] = stage_source(
                model, resolve_source(spec_path, model.source), static, uploads
            )
        for name in static_eps:
            model = spec.model(name)
            before = published.get(name)
            samples_uri = resolve_source(spec_path, model.samples) if model.samples else None
            quantizing = [t.name for m, t in pairs if m.name == name and t.quantizes]
            if quantizing and not is_qdq(prepared[name].model):
                staged = _calibration(
                    spec_path, model, quantizing, samples_uri, prepared[name], uploads
                )
                calibrations[name] = staged.ref
                if staged.held_out is not None:
                    samples_uri = str(staged.held_out)
            try:
                samples[name] = stage_samples(
                    model,
                    samples_uri,
                    sources[name],
                    prepared[name],
                    before.samples if before and before.source == sources[name] else None,
                    uploads,
                    metric_sets(spec_path, model),
                )
            except BadInputError:
                raise
            except EpfleetError as exc:
                samples[name], problems[name] = None, f"no golden samples: {exc}"
        uploads.release()
    ep_modules = {target.ep: eps.load(target.ep) for _, target in pairs}
    planned = assign_twins(
        plan_pairs(
            pairs,
            sources,
            samples,
            problems,
            manifest,
            identities,
            force,
            store.size,
            int(settings().embed_context_max_bytes),
            ep_modules,
            calibrations=calibrations,
            runtimes=spec.runtimes,
        ),
        ep_modules,
    )
    rollouts = {name: policy for name in sources if (policy := spec.rollout_of(name)) is not None}
    return RunPlan(
        store=store_uri,
        sources=sources,
        pairs=planned,
        generation=manifest.generation if manifest else 0,
        published_sources={
            name: published[name].source if name in published else None for name in sources
        },
        samples=samples,
        published_samples={
            name: published[name].samples if name in published else None for name in sources
        },
        calibrations=calibrations,
        published_calibrations={
            name: published[name].calibration if name in published else None
            for name in calibrations
        },
        rollouts=rollouts,
        policy_changes=_policy_changes(published, rollouts),
        policy_kept={
            name: note
            for name in sources
            if name in published
            and name not in rollouts
            and (note := policy_dropped(published[name])) is not None
        },
        preferences=(preferences := _preferences(spec, pairs)),
        published_preferences={
            name: published[name].preference if name in published else [] for name in preferences
        },
    )


def metric_sets(spec_path: Path, model: ModelSpec) -> dict[str, str]:
    """The input sets beside the samples that a model's task metric is judged on: its
    calibration and verification inputs, unless ``metric: {kind: none}`` turns judging
    off (then they would cost runs and judge nothing). With no metric named they serve the
    default for class scores."""
    if model.named_metric is None and not model.decision_default:
        return {}
    given = {"calibration": model.calibration, "verification": model.verification}
    return {name: resolve_source(spec_path, path) for name, path in given.items() if path}


def _policy_changes(
    published: dict[str, ModelEntry], rollouts: dict[str, RolloutPolicy]
) -> dict[str, str]:
    """What following the spec's rollout policies changes in the rollouts under way, by
    model; BadInputError, before anything compiles, for a policy one cannot follow."""
    changes = {}
    for name, policy in rollouts.items():
        if name not in published:
            continue
        try:
            change = policy_change(published[name], policy)
        except CannotMove as exc:
            raise BadInputError(f"models[{name}].rollout: {exc}") from None
        if change is not None:
            changes[name] = change
    return changes


def _preferences(
    spec: FleetSpec, pairs: list[tuple[ModelSpec, TargetSpec]]
) -> dict[str, list[str]]:
    """Each model's targets in the spec's order: the whole spec's, whichever pairs run."""
    return {
        model.name: [t.name for t in spec.targets if t.models is None or model.name in t.models]
        for model in {m.name: m for m, _ in pairs}.values()
    }


def _calibration(
    spec_path: Path,
    model: ModelSpec,
    quantizing: list[str],
    samples_uri: str | None,
    prepared: PreparedSource,
    uploads: HeldUploads,
) -> StagedCalibration:
    if model.calibration is None:
        raise BadInputError(
            f"models[{model.name}]: target(s) {', '.join(quantizing)} build integer (QDQ) "
            "variants, which are calibrated on inputs like the model's real data: give "
            f"models[{model.name}].calibration, an .npz of arrays by input name with a "
            "leading sample axis (without samples, a fifth of them are held out to verify on)"
        )
    with ExitStack() as stack:
        field = f"models[{model.name}]"
        calibration = stack.enter_context(
            local_source(resolve_source(spec_path, model.calibration), f"{field}.calibration")
        )
        samples = (
            stack.enter_context(local_source(samples_uri, f"{field}.samples"))
            if samples_uri
            else None
        )
        staged = stage_calibration(model, calibration, samples, prepared.model, uploads)
    if staged.held_out is not None:
        logger.warning(
            "models[%s]: no samples given, so %d of its %d calibration inputs are held out "
            "to verify its integer variants on, and not calibrated on",
            model.name,
            staged.held_out_count,
            staged.held_out_count + staged.count,
        )
    return staged


def plan_on_pool(
    pairs: list[PoolPair], store: str, force: bool
) -> tuple[list[CompileRequest], list[tuple[str, str]]]:
    """On the pool's worker: fingerprint each pair with this machine's ORT and EP packages
    (a runtime's pair: its runtime environment's, built here the first time) and decide,
    as the fleet flow does for its own pairs, which to compile."""
    target_store = open_store(store)
    todo, skipped = [], []
    for pair in pairs:
        with ep_errors():  # a runtime's pair: its environment's, built here the first time
            request = fingerprinted(
                pair.request, *built_with(pair.request.ep, pair.request.runtime)
            )
        action, _ = decide_pair(request, pair.previous, force, target_store.size)
        if action == "compile":
            todo.append(request)
        else:
            skipped.append((request.model, request.target))
    return todo, skipped
