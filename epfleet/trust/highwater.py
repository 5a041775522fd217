"""A device's high-water mark of one repository's signed metadata: what it accepted, never lowered.

ngclient refuses a rollback by comparing what a store serves with the metadata cached in
the trust directory; when that cache is lost (emptied, deleted, damaged), anything
validly signed would do again, older or not. The mark is kept in the device cache's
state (``CacheState.trust``, one per trust directory), apart from the trust directory, and
every signed set the device accepts is checked against it: a set older than the mark is
refused.

The mark also records the root versions the device verified, by the sha256 of each
root's signed part (canonical JSON: the same for any copy of that root, whatever its
formatting or extra signatures). That record tells apart the same repository served
older (refused), a root chain that forks from what the device trusted (refused), and a
new repository the operator provisioned the device for (the mark starts again), and
shows whether a root offered to replace a damaged cached copy is one the device trusted.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Lineage = Literal["same", "new", "forked"]


class TrustMark(BaseModel):
    """The newest signed metadata a device accepted from one repository."""

    roots: dict[int, str] = Field(
        default_factory=dict,
        description="Root version -> sha256 of its signed part, for every root verified",
    )
    timestamp: int = Field(default=0, description="The highest signed timestamp version")
    snapshot: int = Field(default=0, description="The highest signed snapshot version")
    generation: int | None = Field(
        default=None,
        description="The highest generation of the signed manifest.json taken whole",
    )

    @property
    def root_version(self) -> int:
        return max(self.roots, default=0)


def lineage(mark: TrustMark, chain: dict[int, str]) -> Lineage:
    """How the root chain a refresh verified (version -> signed sha256, from the root it
    started from) relates to the roots the mark recorded: ``new`` when the root it started
    from is not the one recorded for its version (the device was provisioned with another
    repository's root: the mark starts again), ``forked`` when a later root differs from
    the one recorded (signed by keys the repository retired: refused), else ``same`` (the
    mark applies, also when there is nothing to compare)."""
    start = min(chain, default=0)
    if start in mark.roots and mark.roots[start] != chain[start]:
        return "new"
    if any(mark.roots[v] != digest for v, digest in chain.items() if v in mark.roots):
        return "forked"
    return "same"


def below(mark: TrustMark, role: str, version: int) -> str | None:
    """Why ``version`` of ``role`` (root, timestamp or snapshot) is older than the mark, or
    None when it is not."""
    floor = {
        "root": mark.root_version,
        "timestamp": mark.timestamp,
        "snapshot": mark.snapshot,
    }[role]
    if version >= floor:
        return None
    return f"{role} version {version}, older than version {floor} which this device accepted"


def generation_below(mark: TrustMark, generation: int) -> str | None:
    """Why a signed manifest.json of ``generation`` is older than the mark, or None."""
    if mark.generation is None or generation >= mark.generation:
        return None
    return (
        f"manifest generation {generation}, older than generation {mark.generation} which "
        "this device accepted"
    )


def advanced(
    mark: TrustMark | None,
    chain: dict[int, str],
    timestamp: int,
    snapshot: int,
    generation: int | None = None,
) -> TrustMark:
    """The mark after accepting a signed set: each version the higher of the two, the root
    chain's records added. ``mark`` None: the first (or a new repository's) mark."""
    base = mark or TrustMark()
    generations = [g for g in (base.generation, generation) if g is not None]
    return TrustMark(
        roots={**base.roots, **chain},
        timestamp=max(base.timestamp, timestamp),
        snapshot=max(base.snapshot, snapshot),
        generation=max(generations) if generations else None,
    )


def with_generation(mark: TrustMark, generation: int | None) -> TrustMark:
    """The mark with the generation of a signed manifest.json taken whole (never lowered)."""
    if generation is None or (mark.generation is not None and mark.generation >= generation):
        return mark
    return mark.model_copy(update={"generation": generation})
