"""One model's sync: judge the published variants, decide, try the steps, activate, report.

Verdicts come from compatibility strings alone (``epfleet.device.local_eps``), the
choice from ``epfleet.device.selection``; nothing is downloaded to decide. A failure at
any step keeps the previous active variant.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import replace

import eps
from epfleet.device.activation import drop_changed_active, promote, published_variant
from epfleet.device.cache import CacheState, DeviceCache, Installed, ModelState
from epfleet.device.delta_fetch import delta_base
from epfleet.device.local_build import build_key
from epfleet.device.local_eps import LocalEps
from epfleet.device.policy import SyncPolicy
from epfleet.device.selection import USABLE, ActiveVariant, Considered, Step, decide
from epfleet.device.shadow import ShadowAsk, earlier, outside_reason, rejected, within_reason
from epfleet.device.shadow import record as shadow_record
from epfleet.device.steps import Done, Steps
from epfleet.device.variant_sets import is_file_set
from epfleet.disk import WRITE_DENIED, DiskFull
from epfleet.errors import EpfleetError, StoreError
from epfleet.formats.device_report import ModelReport, VariantVerdict
from epfleet.formats.field_ranking import ProfileRanking
from epfleet.formats.manifest import SHA256_PATTERN, ArtifactRef, ModelEntry
from epfleet.fsutil import NO_SPACE
from eps.base import INTEGER_PRECISIONS, Judgement, Precision, Verdict

logger = logging.getLogger(__name__)


def considered(
    local: LocalEps, entry: ModelEntry, measured: ProfileRanking | None = None
) -> list[Considered]:
    """Every published variant of the model, judged here by its compatibility string, with
    its place in the fleet's declared preference and in ``measured``, the field ranking of
    this device's hardware profile and runtime."""
    declared = declared_ranks(entry)
    places = {target: i for i, target in enumerate(measured.targets)} if measured else {}
    releases = runtime_ranks(local, entry)
    judged = []
    for target, variant in entry.variants.items():
        if variant.status != "ok" or variant.artifact is None:
            continue
        string = variant.compatibility_string or ""
        judgement = local.judge(variant.ep, string)
        refused = local.refused_options(variant.ep, variant.provider_options)
        if refused is not None:  # never handed to the EP: skipped, like an unsupported one
            judgement = Judgement(Verdict.UNSUPPORTED, refused)
        judged.append(
            Considered(
                target=target,
                ep=variant.ep,
                device=variant.device,
                sha256=variant.digest or variant.artifact.sha256,
                compatibility_string=string,
                verdict=judgement.verdict,
                reason=judgement.reason,
                declared_rank=declared.get(target),
                runtime_rank=releases.get(target, 0),
                measured_rank=places.get(target),
            )
        )
    return judged


def runtime_ranks(local: LocalEps, entry: ModelEntry) -> dict[str, int]:
    """Each variant built under one of the spec's runtimes, by the EP release it was built
    with: 0 for this device's own release of its EP, then the other releases, newest
    first. Variants built with the compile host's own packages are not ranked (0)."""
    keys: dict[str, tuple[int, tuple[int, ...]]] = {}
    for target, variant in entry.variants.items():
        built, mine = variant.runtime, local.release(variant.ep)
        if built is None or mine is None or built.ep_version == mine:
            keys[target] = (0, ())
        else:
            keys[target] = (1, tuple(-part for part in release_parts(built.ep_version)))
    order = sorted(set(keys.values()))
    return {target: order.index(key) for target, key in keys.items()}


def declared_ranks(entry: ModelEntry) -> dict[str, int]:
    """Each target's place in the model's declared preference, the variants of one target
    built under several runtimes (``<target>.<runtime>``) sharing their target's place."""
    places: dict[str, int] = {}
    ranks = {}
    for target in entry.preference:
        variant = entry.variants.get(target)
        suffix = f".{variant.runtime.name}" if variant and variant.runtime else ""
        base = target.removesuffix(suffix) if suffix else target
        ranks[target] = places.setdefault(base, len(places))
    return ranks


def release_parts(version: str) -> tuple[int, ...]:
    """A release's numbers, for ordering (2.7.0 -> (2, 7, 0); what is not a number
    counts as 0)."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def sync_model(
    steps: Steps,
    model: str,
    entry: ModelEntry,
    state: CacheState,
    policy: SyncPolicy,
    shadow: ShadowAsk | None = None,
) -> ModelReport:
    """Sync ``model``; ``state`` is updated (and saved when a variant is activated).
    ``shadow``: the shadow run its rollout asks before a switch (``epfleet.device.shadow``)."""
    started, moved_before = time.perf_counter(), steps.fetcher.moved
    cache = steps.cache
    mstate = state.models.setdefault(model, ModelState())
    measured = steps.measured.get(model)
    judged = considered(steps.local, entry, measured)
    notes: list[str] = []
    if mstate.active is not None and not cache.intact(model, mstate.active, rehash=policy.verify):
        previous = mstate.previous
        usable = previous is not None and cache.intact(model, previous, rehash=True)
        notes.append(drop_changed_active(mstate, usable))
    key = build_key(entry)
    plan = plan_steps(steps, entry, mstate, policy, judged, key)
    failures: list[str] = []
    done: Done | None = None
    for step in plan:
        try:
            done = steps.run(step, model, entry, mstate, judged)
            break
        except EpfleetError as exc:
            failures.append(f"{describe(step)}: {exc}")
            logger.warning("%s: %s failed: %s", model, describe(step), exc)
            if step.kind == "recompile" and not isinstance(exc, (StoreError, DiskFull)):
                mstate.recompile_failed[key] = str(exc)  # a build that cannot work
    unsettled = bool(notes)  # rolled back from a changed variant: its directory must go
    record = mstate.shadow
    keeps = done is not None and done.installed is mstate.active
    if shadow is not None and record is not None and keeps and rejected(entry, mstate):
        assert done is not None
        done = replace(done, reason=outside_reason(record.run, earlier(record.run)))  # why kept
    if done is not None and shadow is not None:
        try:
            candidate = done.installed
            done = shadow_judged(steps, model, entry, mstate, done, shadow)
            unsettled = unsettled or done.installed is not candidate
        except EpfleetError as exc:
            failures.append(str(exc))
            logger.warning("%s: %s", model, exc)
            done, unsettled = None, True  # the candidate's directory goes too
    verdicts = [
        VariantVerdict(
            target=c.target, ep=c.ep, device=c.device, verdict=c.verdict, reason=c.reason
        )
        for c in judged
    ]
    seconds = round(time.perf_counter() - started, 3)
    moved = steps.fetcher.moved - moved_before
    if done is None:
        if unsettled:
            settle(cache, model, state)
        kept = mstate.active
        reason = "; ".join(notes + failures) or "nothing published can run here"
        if kept is not None and cache.intact(model, kept):
            reason += f" (still running {kept.name})"
        return failed(model, kept, reason, verdicts, moved, seconds, entry)
    if done.installed is not mstate.active:
        activate(cache, model, state, done.installed)
    elif unsettled:
        settle(cache, model, state)
    precision = precision_of(done.installed, entry)
    recompiled = done.action == "recompiled"
    stood_in = quantised_passed_over(entry, judged, precision) if recompiled else []
    return ModelReport(
        model=model,
        action=done.action,
        variant=done.installed.name,
        target=done.installed.target,
        artifact_sha256=done.installed.sha256 if done.installed.origin == "published" else None,
        ep=done.installed.ep,
        source_sha256=source_of(done.installed),
        verdict=done.verdict,
        bytes_downloaded=moved,
        delta_from=done.delta_from,
        reason="; ".join([*notes, *failures, done.reason, *stood_in, *ranked(measured)]),
        considered=verdicts,
        seconds=seconds,
        precision=precision,
        profile=done.installed.profile,
    )


def shadow_judged(
    steps: Steps, model: str, entry: ModelEntry, mstate: ModelState, done: Done, ask: ShadowAsk
) -> Done:
    """``done`` when its variant may be activated: it is what runs already, or nothing
    intact runs to compare it with, or its shadow run beside the active variant finds it
    within the model's bounds; else the active variant kept (the candidate's directory goes
    when the state is settled). The run is recorded in ``mstate``."""
    active = mstate.active
    if done.installed is active or active is None or not steps.cache.intact(model, active):
        return done
    outcome = steps.shadow(model, done.installed, active, entry, ask)
    if outcome is None:
        return replace(done, reason=f"{done.reason}; no inputs for its shadow run")
    run = outcome.run
    mstate.shadow = shadow_record(ask, done.installed.digest, active.digest, run)
    if outcome.outside is None:
        return replace(done, reason=f"{done.reason}; {within_reason(run)}")
    logger.warning("%s: %s", model, outside_reason(run, outcome.outside))
    return Done(
        installed=active,
        action="kept",
        verdict=steps.judge_installed(active).verdict,
        reason=outside_reason(run, outcome.outside),
    )


def ranked(measured: ProfileRanking | None) -> list[str]:
    """What the report says of the field ranking the choice followed."""
    if measured is None:
        return []
    said = ", ".join(f"{m.target} {m.p50_ms:.1f} ms" for m in measured.order)
    return [f"field ranking of this hardware and runtime, fastest first: {said}"]


def quantised_passed_over(
    entry: ModelEntry, judged: list[Considered], built: Precision | None
) -> list[str]:
    """What a local float build stands in for: the published quantised variants this
    device judged usable (the report says so, never silently)."""
    if built in INTEGER_PRECISIONS:
        return []
    quantised = [
        f"{c.target} ({entry.variants[c.target].precision})"
        for c in judged
        if c.verdict in USABLE and entry.variants[c.target].precision in INTEGER_PRECISIONS
    ]
    if not quantised:
        return []
    return [
        f"a local {built or 'float'} build runs in place of the fleet's verified quantised "
        f"variant {', '.join(quantised)}"
    ]


def plan_steps(
    steps: Steps,
    entry: ModelEntry,
    mstate: ModelState,
    policy: SyncPolicy,
    judged: list[Considered],
    key: str,
) -> list[Step]:
    """What the model's sync tries, in order, given how its variants were judged here."""
    active = mstate.active
    active_view = (
        ActiveVariant(
            origin=active.origin,
            target=active.target,
            sha256=active.digest,
            source_sha256=active.source_sha256,
            verdict=steps.judge_installed(active).verdict,
        )
        if active is not None
        else None
    )
    plan = decide(
        judged,
        active_view,
        entry.source.digest,
        recompile=policy.recompile,
        recompile_failed_before=key in mstate.recompile_failed,
        recompile_suboptimal=policy.recompile_suboptimal,
        preference=policy.prefer,
    )
    if refused_again(entry, mstate, plan, judged):
        return [Step(kind="keep")]
    return plan


def refused_again(
    entry: ModelEntry, mstate: ModelState, plan: list[Step], judged: list[Considered]
) -> bool:
    """Whether the plan starts with the download of the candidate a shadow run of this
    rollout found outside the bounds beside the variant still active: it is kept instead."""
    refused = rejected(entry, mstate)
    if refused is None or not plan or plan[0].kind != "download":
        return False
    return any(c.target == plan[0].target and c.sha256 == refused for c in judged)


def first_download(
    steps: Steps, model: str, entry: ModelEntry, mstate: ModelState | None, policy: SyncPolicy
) -> ArtifactRef | None:
    """The file the model's sync will download first, when its plan starts with the
    download of a published variant in one file that the cache does not hold for a
    rollback; else None (it keeps, builds, falls back, or downloads a file set)."""
    mstate = mstate or ModelState()
    judged = considered(steps.local, entry, steps.measured.get(model))
    plan = plan_steps(steps, entry, mstate, policy, judged, "")
    if not plan or plan[0].kind != "download" or plan[0].target is None:
        return None
    variant = entry.variants[plan[0].target]
    if variant.artifact is None or is_file_set(variant.model_file, variant.files):
        return None
    if delta_base(variant, mstate) is not None:
        return None  # the step fetches a delta, not the whole file
    previous = mstate.previous
    if (
        previous is not None
        and previous.name
        == published_variant(plan[0].target, variant, steps.fetcher.clock.now()).name
    ):
        return None
    return variant.artifact


def source_of(installed: Installed) -> str | None:
    """The source digest ``installed`` was built from, for the report (None when unknown:
    a variant adopted from a model file whose metadata does not say)."""
    value = installed.source_sha256
    return value if re.fullmatch(SHA256_PATTERN, value) else None


def precision_of(installed: Installed, entry: ModelEntry | None) -> Precision | None:
    """What ``installed`` computes in, as recorded when it was installed. For one an older
    epfleet installed: fp32 for the source on the CPU EP, what its EP module says of a
    local build, the manifest entry's of the same published build; else None."""
    if installed.precision is not None:
        return installed.precision
    if installed.origin == "fallback":
        return "fp32"
    if installed.origin == "local":
        try:
            return eps.load(installed.ep).precisions(installed.provider_options)[0]
        except KeyError:  # an EP this epfleet does not know
            return None
    published = entry.variants.get(installed.target or "") if entry is not None else None
    if published is None or published.digest != installed.digest:
        return None
    return published.precision


def activate(cache: DeviceCache, model: str, state: CacheState, installed: Installed) -> None:
    """Make ``installed`` active (the old active kept for rollback), write the state and
    then the package manifest, and only then remove what neither references."""
    promote(state.models[model], installed)
    settle(cache, model, state)


def settle(cache: DeviceCache, model: str, state: CacheState) -> None:
    """Write the state and then the package manifest, and only then remove the model's
    directories that neither references (a replaced or rolled-back-from variant)."""
    cache.save_state(state)
    outvoted = cache.write_package(state)
    if model in outvoted:
        logger.info("%s: ORT would select the rollback variant; listing the active alone", model)
    cache.prune(model, state.models[model])


def unexpected(model: str, state: CacheState, exc: Exception) -> ModelReport:
    """The report of a model whose sync raised something no step expects."""
    kept = state.models.get(model, ModelState()).active
    if isinstance(exc, EpfleetError):
        reason = str(exc)
    elif isinstance(exc, OSError) and (exc.errno in WRITE_DENIED or exc.errno in NO_SPACE):
        reason = f"cannot write {exc.filename or 'the device cache'}: {exc.strerror}"
    else:
        reason = f"unexpected {type(exc).__name__}: {exc}"
    if kept is not None:
        reason += f" (still running {kept.name})"
    return failed(model, kept, reason, [], 0, 0.0)


def failed(
    model: str,
    kept: Installed | None,
    reason: str,
    considered: list[VariantVerdict],
    moved: int,
    seconds: float,
    entry: ModelEntry | None = None,
) -> ModelReport:
    """A model nothing could be done for; ``kept`` (if any) is still what runs."""
    return ModelReport(
        model=model,
        action="failed",
        variant=kept.name if kept else None,
        target=kept.target if kept else None,
        artifact_sha256=kept.sha256 if kept and kept.origin == "published" else None,
        ep=kept.ep if kept else None,
        source_sha256=source_of(kept) if kept else None,
        verdict=None,
        bytes_downloaded=moved,
        reason=reason,
        considered=considered,
        seconds=seconds,
        precision=precision_of(kept, entry) if kept else None,
        profile=kept.profile if kept else None,
    )


def describe(step: Step) -> str:
    return f"{step.kind} {step.target}" if step.target else step.kind
