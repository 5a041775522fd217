"""Retiring models and targets from the manifest: devices stop getting them, and
``epfleet gc`` may then collect their files.

Never by accident: only models and targets named explicitly, or, asked for explicitly
(``unlisted``), what the spec no longer lists. A compile run with a ``--model`` subset
retires nothing. ``retire`` is the pure change; ``apply_retirement`` writes it through
``epfleet.fleet.publishing.publish.update_manifest`` (compare-and-swap, and the signed metadata).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from epfleet.errors import BadInputError
from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, utcnow
from epfleet.formats.spec import FleetSpec
from epfleet.stores import MANIFEST_KEY, Store


class Selection(BaseModel):
    """What to retire: whole models, a target's variants of every model, single pairs."""

    models: list[str] = Field(default_factory=list)
    targets: list[str] = Field(default_factory=list)
    pairs: list[tuple[str, str]] = Field(
        default_factory=list, description="(model, target): a target no longer built for a model"
    )
    kept: list[str] = Field(
        default_factory=list,
        description="Targets the spec no longer lists, kept: built under a runtime whose EP "
        "release devices still run",
    )

    @property
    def empty(self) -> bool:
        return not (self.models or self.targets or self.pairs)


class Retirement(BaseModel):
    """What a retirement removed from the manifest (or would, in a dry run)."""

    models: list[str] = Field(default_factory=list, description="Models removed whole")
    variants: list[str] = Field(
        default_factory=list, description="'<model>/<target>' variants removed from kept models"
    )
    kept: list[str] = Field(
        default_factory=list,
        description="Targets the spec no longer lists, kept while devices run their runtime's "
        "EP release",
    )
    bytes: int = Field(
        default=0, description="Bytes of the artifacts (and sources) no longer referenced"
    )
    generation: int | None = Field(default=None, description="Generation of the manifest after")
    written: bool = Field(default=False, description="Whether the manifest was changed")
    signed_version: int | None = Field(
        default=None, description="The store's signed timestamp version after (None: unsigned)"
    )

    @property
    def empty(self) -> bool:
        return not (self.models or self.variants)


Release = tuple[str, str]
"""An EP package and the version of it a device runs, e.g. ("onnxruntime-qnn", "2.5.0")."""


def still_run(manifest: Manifest, targets: Iterable[str], releases: set[Release]) -> list[str]:
    """Of ``targets``, those built under a runtime whose EP release devices still run: each
    of their variants names a runtime, and ``releases`` (reported by devices within the
    retention window) holds its release."""
    kept = []
    for target in targets:
        variants = [e.variants[target] for e in manifest.models.values() if target in e.variants]
        runtimes = [v.runtime for v in variants]
        if runtimes and all(
            r is not None and (r.ep_package, r.ep_version) in releases for r in runtimes
        ):
            kept.append(target)
    return kept


def unlisted(
    manifest: Manifest, spec: FleetSpec, releases: set[Release] | None = None
) -> Selection:
    """What ``manifest`` holds that ``spec`` no longer lists: models it does not name,
    targets it does not name, and a target's variants of a model outside the target's
    ``models``. A target built under a runtime the spec no longer names stays while devices
    run its release (``releases``: ``still_run``)."""
    spec_models = {m.name for m in spec.models}
    spec_targets = {t.name: t for t in spec.targets}
    models = sorted(name for name in manifest.models if name not in spec_models)
    gone = {t for entry in manifest.models.values() for t in entry.variants} - spec_targets.keys()
    kept = sorted(still_run(manifest, gone, releases or set()))
    targets = sorted(gone - set(kept))
    pairs = sorted(
        (name, target)
        for name, entry in manifest.models.items()
        if name in spec_models
        for target in entry.variants
        if target in spec_targets
        and spec_targets[target].models is not None
        and name not in (spec_targets[target].models or [])
    )
    return Selection(models=models, targets=targets, pairs=pairs, kept=kept)


def check_names(manifest: Manifest, selection: Selection, where: str) -> None:
    """BadInputError naming every model or target the selection names that ``manifest``
    does not hold (a typo must not pass silently as 'nothing to retire')."""
    targets = {t for entry in manifest.models.values() for t in entry.variants}
    problems = [
        f"model {name!r} is not in {where} (it has: {', '.join(sorted(manifest.models)) or 'none'})"
        for name in selection.models
        if name not in manifest.models
    ] + [
        f"target {name!r} is not in {where} (it has: {', '.join(sorted(targets)) or 'none'})"
        for name in selection.targets
        if name not in targets
    ]
    if problems:
        raise BadInputError("; ".join(problems))


def retire(manifest: Manifest, selection: Selection) -> tuple[Manifest | None, Retirement]:
    """``manifest`` without the selected models, targets and pairs (a new generation), and
    what was removed; None when nothing in it is selected. Names it does not hold are
    skipped (``check_names`` refuses them first)."""
    models = dict(manifest.models)  # ``manifest`` is never changed: an entry is copied first
    done = Retirement(kept=selection.kept)
    released: dict[str, int] = {}
    for name in sorted(set(selection.models)):
        entry = models.pop(name, None)
        if entry is not None:
            done.models.append(name)
            released |= files_of(entry)
    drop = set(selection.targets)
    for name, entry in list(models.items()):
        chosen = [t for t in sorted(entry.variants) if t in drop or (name, t) in selection.pairs]
        if chosen:
            variants = {t: v for t, v in entry.variants.items() if t not in chosen}
            models[name] = entry.model_copy(update={"variants": variants})
        for target in chosen:
            artifact = entry.variants[target].artifact
            done.variants.append(f"{name}/{target}")
            if artifact is not None:
                released[artifact.uri] = artifact.size
    if done.empty:
        return None, done
    still: dict[str, int] = {}
    for entry in models.values():
        still |= files_of(entry)
    done.bytes = sum(size for key, size in released.items() if key not in still)
    after = manifest.succeeded_by(models, utcnow())
    done.generation = after.generation
    return after, done


def files_of(entry: ModelEntry) -> dict[str, int]:
    """Every store key a model entry references, with its size."""
    refs: list[ArtifactRef | None] = [entry.source, entry.samples]
    refs += [variant.artifact for variant in entry.variants.values()]
    return {ref.uri: ref.size for ref in refs if ref is not None}


def selection_for(
    manifest: Manifest,
    *,
    spec: FleetSpec | None = None,
    models: Iterable[str] = (),
    targets: Iterable[str] = (),
    releases: set[Release] | None = None,
) -> Selection:
    """The selection from the command line's choices: what ``spec`` no longer lists
    (when given; ``releases``: the EP releases devices still run), else the models and
    targets named."""
    if spec is not None:
        return unlisted(manifest, spec, releases)
    return Selection(models=sorted(set(models)), targets=sorted(set(targets)))


def apply_retirement(
    store: Store,
    *,
    spec: FleetSpec | None = None,
    models: Iterable[str] = (),
    targets: Iterable[str] = (),
    dry_run: bool = False,
    releases: set[Release] | None = None,
) -> Retirement:
    """Retire from the store's manifest what ``spec`` no longer lists (when given; but a
    runtime's variants while devices run its release, ``releases``), or the ``models`` and
    ``targets`` named, with compare-and-swap; with ``dry_run`` only say what would go.
    BadInputError for no manifest, nothing chosen, or a name it lacks."""
    from epfleet.fleet.publishing.publish import read_in_force

    models, targets = list(models), list(targets)
    if spec is None and not (models or targets):
        raise BadInputError(
            "name the models or targets to retire, or give a spec to retire what it no longer lists"
        )
    current = read_in_force(store).manifest
    if current is None:
        raise BadInputError(f"no manifest at {store.uri}/{MANIFEST_KEY}: nothing to retire")
    check_names(
        current,
        selection_for(current, models=models, targets=targets),
        f"{store.uri}/{MANIFEST_KEY}",
    )
    if dry_run:
        chosen = selection_for(
            current, spec=spec, models=models, targets=targets, releases=releases
        )
        _, done = retire(current, chosen)
        done.generation = current.generation
        return done
    return _write(store, spec, models, targets, releases)


def _write(
    store: Store,
    spec: FleetSpec | None,
    models: list[str],
    targets: list[str],
    releases: set[Release] | None = None,
) -> Retirement:
    from epfleet.fleet.publishing.publish import update_manifest

    outcome: list[Retirement] = []

    def change(current: Manifest | None) -> Manifest | None:
        """Recomputed on every compare-and-swap attempt, from the manifest then in force."""
        outcome.clear()
        if current is None:
            outcome.append(Retirement())
            return None
        after, done = retire(
            current,
            selection_for(current, spec=spec, models=models, targets=targets, releases=releases),
        )
        outcome.append(done)
        return after

    published = update_manifest(store, change)
    done = outcome[-1] if outcome else Retirement()
    done.written = published.published
    done.generation = published.manifest.generation if published.manifest else None
    done.signed_version = published.signed_version
    return done


def releases_reported(store: Store) -> set[Release]:
    """The EP releases of the devices that reported within EPFLEET_GC_RETENTION_DAYS: a
    target built under one of them is kept when the spec no longer lists it."""
    from epfleet.settings import settings

    return releases_in_use(store, utcnow() - timedelta(days=settings().gc_retention_days))


def releases_in_use(store: Store, since: datetime) -> set[Release]:
    """The EP releases (package, version) of the devices that reported since ``since``
    (the store's clock), streamed; unreadable reports are left out."""
    from epfleet.fleet.evidence.reading import Problems
    from epfleet.lifecycle.gc_pins import recent_reports

    return {
        (package, version)
        for report in recent_reports(store, since, Problems())
        for package, version in report.ep_packages.items()
    }
