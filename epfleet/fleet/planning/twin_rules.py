"""Verification by distinct numerics, not by target (pure: every fact is passed in).

Targets of one model whose variants compute the same outputs (same source, input shapes,
precision ladder, tolerances, golden samples, coverage floor and the options their EP
module's ``numerics_options`` keeps) form a numerics group. The first of a group in spec
order, its representative, is verified on every golden sample; the others, its twins,
are checked on the first sample only, which still proves they load and run.

- ``numerics_basis``: what decides one rung's outputs (also the key of the compile
  host's cache of full verifications, ``epfleet.fleet.build.verify_cache``).
- ``assign_twins``: the planned pairs with each twin's ``twin_of`` set, and a twin held
  back before planned again when its representative may now pass.
- ``hold_back``: pairs verify independently and concurrently, so a twin's check may pass
  while its representative fails; before publishing, such a twin fails, naming it.
"""

from __future__ import annotations

import json
from typing import Any

from epfleet import RECIPE_VERSION
from epfleet.fleet.planning.rules import EpModules, PlannedPair
from epfleet.fleet.runs.models import PairOutcome, PairResult
from epfleet.formats.manifest import VariantEntry
from epfleet.hashing import sha256_bytes
from epfleet.runtime.requests import CompileRequest
from eps.base import ExecutionProvider

HELD_BACK = "held back: "
"""How the error of a twin held back for its representative starts."""


def numerics_basis(request: CompileRequest, ep: ExecutionProvider) -> dict[str, Any]:
    """What decides the outputs of ``request``'s variant at its precision (``ep``: its EP's
    module), and what they are verified against: equal for two requests, their variants
    compute the same outputs and pass or fail the same verification."""
    basis: dict[str, Any] = {
        "recipe": RECIPE_VERSION,
        "source_sha256": request.source_sha256,
        "input_shapes": request.input_shapes,
        "ep": request.ep,
        "device": request.device,
        "precision": request.precision,
        "numerics_options": ep.numerics_options(request.provider_options),
        "graph_optimization": request.graph_optimization,
        "quantize": request.quantize.model_dump(mode="json") if request.quantize else None,
        "samples_sha256": request.samples.sha256 if request.samples else None,
        "tolerance": request.tolerance,
        "abs_tolerance": request.abs_tolerance,
    }
    if request.metric is not None:
        # Only when named: numerics verified under the numeric gate alone keep their keys.
        basis["metric"] = request.metric.model_dump(mode="json")
    if request.folds_io:
        # Fed integers and loaded without CPU fallback: verified on its own terms.
        basis["fold_io"] = True
    return basis


def group_key(pair: PlannedPair, ep_modules: EpModules) -> str | None:
    """The numerics group of a pair; None for one verified on its own: not verified, no
    golden samples, or compiled on a work pool (with the pool's packages, decided there)."""
    request = pair.request
    if pair.work_pool or not request.verify or request.samples is None:
        return None
    basis = {
        "rungs": [numerics_basis(rung, ep_modules[rung.ep]) for rung in request.rungs],
        "min_coverage": request.min_coverage,
    }
    return sha256_bytes(json.dumps(basis, sort_keys=True).encode())


def held_back(entry: VariantEntry | None, fingerprint: str) -> bool:
    """Whether ``entry`` records these inputs as a twin held back for its representative."""
    failure = entry.failure_for(fingerprint) if entry else None
    return failure is not None and (failure.error or "").startswith(HELD_BACK)


def recorded(pair: PlannedPair) -> VariantEntry | None:
    """What the manifest records for a pair's current inputs: their failure (kept beside
    an older working build, or as the entry), else the entry."""
    previous = pair.previous
    if previous is None:
        return None
    return previous.failure_for(pair.request.fingerprint) or previous


def assign_twins(planned: list[PlannedPair], ep_modules: EpModules) -> list[PlannedPair]:
    """``planned`` (in spec order; ``ep_modules``: their EP modules) with each twin's
    ``twin_of`` naming its group's first pair. A pair held back before is compiled again
    unless it is still a twin and its representative is up to date and failed (then it
    would be held back again)."""
    first: dict[tuple[str, str], PlannedPair] = {}
    assigned = []
    for pair in planned:
        key = group_key(pair, ep_modules)
        representative = first.setdefault((pair.request.model, key), pair) if key else pair
        if representative is pair:
            if pair.action == "skip" and held_back(pair.previous, pair.request.fingerprint):
                reason = "held back before as a numerics twin; now verified on its own"
                pair = pair.model_copy(update={"action": "compile", "reason": reason})
            assigned.append(pair)
            continue
        update: dict[str, Any] = {
            "request": pair.request.model_copy(update={"twin_of": representative.request.target})
        }
        if pair.action == "skip" and held_back(pair.previous, pair.request.fingerprint):
            settled = recorded(representative) if representative.action == "skip" else None
            if settled is None or settled.status == "ok":
                update |= {
                    "action": "compile",
                    "reason": f"held back for {representative.request.target}, which may pass now",
                }
        assigned.append(pair.model_copy(update=update))
    return assigned


def hold_back(planned: list[PlannedPair], outcomes: list[PairOutcome]) -> list[PairOutcome]:
    """``outcomes`` with each twin that was checked on fewer than every golden sample failed
    when its representative did not pass verification at the same precision: failed in
    this run (published as failed when that was a verdict on its build, otherwise only
    reported), or up to date and failed. A representative up to date and ok counts with
    its recorded verification."""
    by_key = {o.key: o for o in outcomes}
    pairs = {(p.request.model, p.request.target): p for p in planned}
    settled = []
    for outcome in outcomes:
        pair = pairs.get(outcome.key)
        twin_of = pair.request.twin_of if pair else None
        checked = outcome.entry.verification
        if (
            pair is None
            or twin_of is None
            or outcome.result.status != "ok"
            or checked is None
            or checked.twin_of is None
        ):
            settled.append(outcome)
            continue
        theirs = by_key.get((pair.request.model, twin_of))
        representative = pairs.get((pair.request.model, twin_of))
        entry = theirs.entry if theirs else (recorded(representative) if representative else None)
        problem = _not_backing(entry, outcome.entry, theirs)
        if problem is None:
            settled.append(outcome)
            continue
        settled.append(_held_back(pair.request, outcome, twin_of, problem, theirs))
    return settled


def _not_backing(
    entry: VariantEntry | None, twin: VariantEntry, theirs: PairOutcome | None
) -> str | None:
    """Why the representative's ``entry`` does not vouch for ``twin``'s numerics; None when
    it does (ok, verification passed, same precision)."""
    if theirs is not None and not theirs.publish:
        return f"was not decided in this run: {theirs.result.error}"
    if entry is None:
        return "has no build"
    verified = entry.verification
    if entry.status != "ok":
        return f"failed: {entry.error}"
    if verified is None or verified.status != "passed":
        return f"was not verified ({verified.reason if verified else 'no record'})"
    if entry.precision != twin.precision:
        return (
            f"passed at {entry.precision or 'its default precision'}, not at "
            f"{twin.precision or 'the default precision'}"
        )
    return None


def _held_back(
    request: CompileRequest,
    outcome: PairOutcome,
    twin_of: str,
    problem: str,
    theirs: PairOutcome | None,
) -> PairOutcome:
    checked = outcome.entry.verification
    samples = checked.samples if checked else 1
    error = (
        f"{HELD_BACK}this variant was checked on its first {samples} golden sample(s) only, "
        f"as a numerics twin of {twin_of}, whose variant is verified on every sample, and "
        f"{twin_of} {problem}"
    )
    entry = outcome.entry.model_copy(
        update={
            "status": "failed",
            "error": error,
            "artifact": None,
            "files": [],
            "compatibility_string": None,
        }
    )
    result = PairResult.of(request, entry, "failed", outcome.result.seconds)
    publish = theirs is None or theirs.publish
    return PairOutcome(entry=entry, result=result, publish=publish)
