"""Which binary deltas a publish makes, and where they go in the manifest (pure).

A variant a run publishes replaces files devices may hold: the previous build of its
target (same target, same runtime; of the model's previous source too: a retrained
model), the variant a staged rollout keeps for the devices outside it (the previous
build, or the previous version's), and the same target built under another of the
spec's runtimes (``<target>.<runtime>``: a device whose EP package
is upgraded or moved back holds that one). ``delta_jobs`` lists, for every new
single-file variant, those bases; ``epfleet.fleet.publishing.deltas`` makes and uploads
the deltas that come out under ``epfleet.deltas.DELTA_BOUND`` of the file, and
``with_deltas`` lists them on the variant in the manifest being published.
"""

from __future__ import annotations

from dataclasses import dataclass

from epfleet.formats.manifest import (
    MAX_DELTA_SIZE,
    MAX_DELTAS,
    ArtifactRef,
    DeltaRef,
    Manifest,
    ModelEntry,
    VariantEntry,
)


@dataclass(frozen=True)
class DeltaJob:
    """A delta to make: from ``base`` to the ``target`` variant's file ``artifact``."""

    model: str
    target: str
    artifact: ArtifactRef
    base: ArtifactRef


def single_file(variant: VariantEntry | None) -> ArtifactRef | None:
    """The variant's one file, when it is an ok variant of one ``model.onnx`` small enough
    for a delta; else None."""
    if variant is None or variant.status != "ok" or variant.artifact is None:
        return None
    if variant.files or variant.model_file != "model.onnx":
        return None
    return variant.artifact if variant.artifact.size <= MAX_DELTA_SIZE else None


def base_target(target: str, variant: VariantEntry) -> str:
    """The spec's target a variant was built for (``<target>.<runtime>`` without the
    runtime)."""
    return target.removesuffix(f".{variant.runtime.name}") if variant.runtime else target


def bases_of(
    target: str, variant: VariantEntry, entry: ModelEntry | None, run: dict[str, VariantEntry]
) -> list[ArtifactRef]:
    """The files a device may hold that ``variant`` (the model's ``target``) replaces:
    from the model's published ``entry`` and the run's other variants of the model
    (``run``, by target), distinct, never the variant's own file."""
    artifact = single_file(variant)
    if artifact is None:
        return []
    published = entry.variants if entry is not None else {}
    candidates = [published.get(target)]
    if entry is not None:
        candidates.append(entry.previous.get(target))
    name = base_target(target, variant)
    for others in (published, run):
        candidates += [
            other
            for other_target, other in others.items()
            if other_target != target
            and other.ep == variant.ep
            and base_target(other_target, other) == name
        ]
    bases: dict[str, ArtifactRef] = {}
    for candidate in candidates:
        base = single_file(candidate)
        if base is not None and base.sha256 != artifact.sha256:
            bases.setdefault(base.sha256, base)
    return list(bases.values())[:MAX_DELTAS]


def delta_jobs(
    current: Manifest | None, variants: dict[tuple[str, str], VariantEntry]
) -> list[DeltaJob]:
    """The deltas a run publishing ``variants`` (by model and target) over ``current``
    makes: one from every base each new single-file variant replaces (``bases_of``)."""
    jobs = []
    for (model, target), variant in variants.items():
        artifact = single_file(variant)
        if artifact is None:
            continue
        entry = current.models.get(model) if current is not None else None
        published = entry.variants.get(target) if entry is not None else None
        if published is not None and published.digest == variant.digest:
            continue  # already published (a rebuild that kept the file)
        run = {t: v for (m, t), v in variants.items() if m == model}
        bases = bases_of(target, variant, entry, run)
        jobs += [DeltaJob(model, target, artifact, base) for base in bases]
    return jobs


def with_deltas(
    manifest: Manifest, made: dict[str, list[DeltaRef]], targets: set[tuple[str, str]]
) -> Manifest:
    """``manifest`` with the deltas ``made`` (by the sha256 of the file they make) listed
    on the run's variants (``targets``) whose file they make, beside any already listed;
    ``manifest`` itself is not changed."""
    models = dict(manifest.models)
    for model, target in sorted(targets):
        entry = models.get(model)
        variant = entry.variants.get(target) if entry is not None else None
        artifact = single_file(variant)
        if entry is None or variant is None or artifact is None:
            continue
        listed = {d.base_sha256 for d in variant.deltas}
        new = [d for d in made.get(artifact.sha256, []) if d.base_sha256 not in listed]
        if not new:
            continue
        deltas = [*variant.deltas, *new][:MAX_DELTAS]
        variants = {**entry.variants, target: variant.model_copy(update={"deltas": deltas})}
        models[model] = entry.model_copy(update={"variants": variants})
    return manifest.model_copy(update={"models": models})
