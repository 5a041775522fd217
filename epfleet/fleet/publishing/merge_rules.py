"""How a compile run's results merge into the manifest in force (pure: the rules are
``merge``'s docstring). The manifest it is given is never changed: readers of one process
share the signed manifest it is read from."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from pydantic import BaseModel, Field

from epfleet.fleet.rollout.rules import Begin, CannotMove, follow_policy, start, start_version
from epfleet.formats.manifest import (
    ArtifactRef,
    FailedBuild,
    Manifest,
    ModelEntry,
    SamplesRef,
    SourceEntry,
    VariantEntry,
)
from epfleet.formats.rollout import RolloutPolicy


class Merged(BaseModel):
    manifest: Manifest | None = Field(description="The next manifest; None when unchanged")
    conflicts: list[str] = Field(
        default_factory=list,
        description="Models whose source another publisher changed since this run planned",
    )


class ModelFacts(BaseModel):
    """What a run sets on each model's entry besides its source and variants, by model."""

    samples: dict[str, SamplesRef | None] = Field(
        default_factory=dict, description="Golden samples"
    )
    calibration: dict[str, ArtifactRef | None] = Field(
        default_factory=dict, description="Calibration inputs of integer variants"
    )
    preference: dict[str, list[str]] = Field(
        default_factory=dict, description="The spec's targets of the model, in its order"
    )
    rollout: dict[str, RolloutPolicy] = Field(
        default_factory=dict, description="How new variants of the model reach the fleet"
    )


def merge(
    current: Manifest | None,
    sources: dict[str, SourceEntry],
    planned_on: dict[str, SourceEntry | None],
    variants: dict[tuple[str, str], VariantEntry],
    facts: ModelFacts | None = None,
    present: Callable[[ArtifactRef], bool] | None = None,
    *,
    now: datetime,
    seed: str,
) -> Merged:
    """Apply one run's sources and (model, target) results to ``current``, publishing at
    ``now``; ``seed``, random, makes the ids and salts of the rollouts it starts.

    ``planned_on`` holds each model's source entry as the run found it when it planned.
    The rules:

    - Entries this run did not touch are kept: concurrent runs on different models
      never drop each other's work.
    - A model whose source entry (sha256 or input shapes) changes loses the variants
      built for the old one: a device must never pair a source with a variant of
      something else.
    - If another publisher changed a model's source since this run planned, that model
      is left as they published it and reported in ``conflicts``.
    - A failed compile never replaces a working build. If the failure was for other
      inputs (a new fingerprint), the working entry records it in ``error`` and, with
      its measurements, in ``failed_build``.
    - A rebuild that is the same build with other bytes (``rebuilt_alike``) keeps the
      published artifact and files while ``present`` says each is still in the store.
    - ``facts`` sets each model's golden samples, calibration inputs and target order.
    - A model with a rollout policy (``facts.rollout``) whose published variants this run
      replaces, its source unchanged, is staged (``epfleet.fleet.rollout.rules.start``);
      one whose source this run replaces is staged as a new version over the entry it
      replaces (``start_version``: devices outside the rollout keep the whole previous
      version, samples included).
    - A model whose rollout under way has another policy than ``facts.rollout`` gives it
      follows the new policy (``rollout_rules.follow_policy``); one the new policy cannot
      apply to (a stage it no longer has, reached since the run planned) keeps its own.
    """
    base = current or Manifest()
    models = dict(base.models)  # ``current`` is never changed: an entry is copied to change it
    copied: set[str] = set()

    def editable(name: str) -> ModelEntry:
        if name not in copied:
            models[name] = models[name].model_copy(deep=True)
            copied.add(name)
        return models[name]

    conflicts = []
    changed = False
    new_sources: set[str] = set()
    replaced_versions: dict[str, ModelEntry] = {}
    replaced: dict[str, dict[str, VariantEntry | None]] = {}
    for name, source in sources.items():
        published = models[name].source if name in models else None
        if published == source:
            continue
        if published != planned_on.get(name):
            conflicts.append(name)
            continue
        if name in models:
            replaced_versions[name] = models[name]
        models[name] = ModelEntry(source=source)
        copied.add(name)
        new_sources.add(name)
        changed = True
    facts = facts or ModelFacts()
    for field in ("samples", "calibration", "preference"):
        for name, value in getattr(facts, field).items():
            if name in conflicts or name not in models or getattr(models[name], field) == value:
                continue
            setattr(editable(name), field, value)
            changed = True
    for (model_name, target), variant in variants.items():
        if model_name in conflicts:
            continue
        previous = models[model_name].variants.get(target)
        if previous is not None and previous.status == "ok" and variant.status == "failed":
            if previous.fingerprint == variant.fingerprint:
                continue  # the same build failed again here (e.g. no device on this worker)
            failed = FailedBuild.model_validate(variant.model_dump(include=_FAILED_FIELDS))
            variant = previous.model_copy(
                update={
                    "error": f"kept this build; a newer compile failed: {variant.error}",
                    "failed_build": failed,
                }
            )
        if (
            previous is not None
            and previous.artifact is not None
            and present is not None
            and previous.rebuilt_alike(variant)
            and all(present(ref) for ref in [previous.artifact, *previous.files])
        ):
            kept = {"artifact": previous.artifact, "model_file": previous.model_file}
            variant = variant.model_copy(update=kept | {"files": previous.files})
        if previous is not None and previous.same_build(variant):
            continue
        if variant.status == "ok" and (previous is None or previous.digest != variant.digest):
            was = previous if previous is not None and previous.status == "ok" else None
            replaced.setdefault(model_name, {})[target] = was
        editable(model_name).variants[target] = variant
        changed = True
    for name, spec_policy in facts.rollout.items():
        if name in conflicts or name not in models:
            continue
        try:
            followed = follow_policy(models[name], spec_policy)
        except CannotMove:
            continue  # the plan refused it; a stage reached since is left as it is
        if followed is not models[name]:
            models[name] = followed
            copied.add(name)
            changed = True
    for name, old in replaced_versions.items():
        policy = facts.rollout.get(name)
        if policy is not None:
            models[name] = start_version(models[name], old, policy, Begin.derived(now, seed, name))
    for name, targets in replaced.items():
        policy = facts.rollout.get(name)
        if policy is not None and name not in new_sources:
            models[name] = start(models[name], targets, policy, Begin.derived(now, seed, name))
    if not changed:
        return Merged(manifest=None, conflicts=conflicts)
    manifest = base.succeeded_by(models, now)
    return Merged(manifest=manifest, conflicts=conflicts)


_FAILED_FIELDS = set(FailedBuild.model_fields)
