"""What a device does about one model (pure: every verdict and fact is passed in).

Given the verdicts on the published variants, what is active in the device cache
and whether a local recompile is allowed, ``decide`` returns the steps to try in
order; the sync engine runs them until one succeeds. The rules:

1. Usable variants are those judged optimal or prefer-recompilation; unsupported
   and unknown (ORT's EP_NOT_APPLICABLE) never are. They rank by verdict, then by
   the device's preference of device type (npu, gpu, cpu unless configured), then
   by the fleet's declared preference (the model entry's ``preference``: the spec's
   target order, e.g. a w8a8 target listed before an fp16 one; targets it does not
   list come after those it does; a target's variants built under several runtimes
   share its place), then by the EP release a variant was built with
   (``runtime_rank``: this device's own release first, then the newest), then by
   manifest order.
2. If some published variant is optimal: download the optimal ones in rank order,
   except that the active variant is kept rather than fetched again (and nothing
   ranked below it is tried). If all fail, a device that runs something keeps it;
   a fresh device goes on to rule 3.
3. Otherwise, a locally built variant of the published source that still judges
   optimal is kept. Failing that, take the prefer-recompilation variants in rank
   order (keeping the active one): a variant the fleet verified, calibrated, signed
   and staged runs before anything built here, which nobody verified (a real QNN
   device judges every binary built for another VTCM size, or another arch it can
   run, prefer-recompilation). Then recompile locally (when allowed, the source is
   published and the same local build has not already failed), and last run the
   source itself on the CPU EP.
4. ``recompile_suboptimal`` (the policy asks for it explicitly) moves the local
   recompile of rule 3 before the prefer-recompilation variants, as ORT's verdict
   suggests; the device's report says when such a float build stands in for a
   quantised variant the fleet published.
5. Measured choice: when the signed field ranking of this device's hardware profile and
   runtime measures some of the usable variants (``measured_rank``), those variants swap
   places among themselves so that the fastest measured comes first, within their
   verdict (an optimal variant still goes before a prefer-recompilation one); variants
   it does not measure keep their places. With no ranking the order is rules 1-4's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from eps.base import DeviceType, Verdict

DEFAULT_PREFERENCE: tuple[DeviceType, ...] = ("npu", "gpu", "cpu")
USABLE = (Verdict.OPTIMAL, Verdict.PREFER_RECOMPILATION)


class Considered(BaseModel):
    """One published variant and how this device judged it."""

    target: str
    ep: str
    device: DeviceType
    sha256: str  # the variant's digest: its file's sha256, or its file set's digest
    compatibility_string: str
    verdict: Verdict
    reason: str
    declared_rank: int | None = None
    """Its target's position in the model's declared preference (0 first); None when the
    entry does not list it (or lists no preference)."""
    runtime_rank: int = 0
    """0 when it was built under a runtime with this device's own release of its EP (or
    with the compile host's packages); then 1, 2, ... for the other releases, newest
    first."""
    measured_rank: int | None = None
    """Its place in the signed field ranking of this device's hardware profile and runtime
    (0 fastest); None when the ranking does not measure it, or there is none."""


class ActiveVariant(BaseModel):
    """What the device cache runs now, as far as choosing is concerned."""

    origin: Literal["published", "local", "fallback"]
    target: str | None
    sha256: str  # its digest, as Considered's
    source_sha256: str
    verdict: Verdict


class Step(BaseModel):
    kind: Literal["keep", "download", "recompile", "fallback"]
    target: str | None = None
    """The published variant to keep or download."""


def rank(considered: Sequence[Considered], preference: Sequence[DeviceType]) -> list[Considered]:
    """The usable variants, best first (see the module's rules); manifest order breaks ties
    (the sort is stable). Then, within each verdict, the variants the field ranking
    measured take the places the measured ones held, fastest first (rule 5)."""
    usable = [c for c in considered if c.verdict in USABLE]
    order = {device: i for i, device in enumerate(preference)}
    ranked = sorted(
        usable,
        key=lambda c: (
            USABLE.index(c.verdict),
            order.get(c.device, len(order)),
            c.declared_rank is None,
            c.declared_rank or 0,
            c.runtime_rank,
        ),
    )
    for verdict in USABLE:
        places = [
            i for i, c in enumerate(ranked) if c.verdict == verdict and c.measured_rank is not None
        ]
        fastest = sorted((ranked[i] for i in places), key=lambda c: c.measured_rank or 0)
        for place, variant in zip(places, fastest, strict=True):
            ranked[place] = variant
    return ranked


def _is_active(active: ActiveVariant | None, variant: Considered) -> bool:
    return (
        active is not None
        and active.origin == "published"
        and active.target == variant.target
        and active.sha256 == variant.sha256
    )


def decide(
    considered: Sequence[Considered],
    active: ActiveVariant | None,
    source_sha256: str | None,
    *,
    recompile: bool,
    recompile_failed_before: bool,
    recompile_suboptimal: bool = False,
    preference: Sequence[DeviceType] = DEFAULT_PREFERENCE,
) -> list[Step]:
    """The steps to try, in order. ``source_sha256`` is the published source (None when
    the manifest has none to offer)."""
    ranked = rank(considered, preference)
    optimal = [c for c in ranked if c.verdict == Verdict.OPTIMAL]
    prefer = [c for c in ranked if c.verdict == Verdict.PREFER_RECOMPILATION]

    def fetch(variants: list[Considered]) -> list[Step]:
        # The active variant further down the list is kept, not downloaded again.
        return [
            Step(kind="keep" if _is_active(active, c) else "download", target=c.target)
            for c in variants
        ]

    steps: list[Step] = []
    if optimal:
        steps = fetch(optimal)
        keeps = [i for i, step in enumerate(steps) if step.kind == "keep"]
        if keeps:
            return steps[: keeps[0] + 1]
        if active is not None:
            return steps
        # A fresh device whose optimal variants all fail still gets something to run.
    elif (
        active is not None
        and active.origin == "local"
        and active.source_sha256 == source_sha256
        and active.verdict == Verdict.OPTIMAL
    ):
        return [Step(kind="keep")]

    build = recompile and source_sha256 is not None and not recompile_failed_before
    if build and recompile_suboptimal:
        steps.append(Step(kind="recompile"))
    steps.extend(fetch(prefer))
    if build and not recompile_suboptimal:
        steps.append(Step(kind="recompile"))
    if source_sha256 is not None:
        steps.append(Step(kind="fallback"))
    return steps
