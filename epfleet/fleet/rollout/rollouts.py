"""Staged rollouts in a store: each one's status with its field evidence (from the device
reports), the gate that advances or halts them, and an operator's advance, halt, resume
and revert.

The device reports are read once per gate run (``read_evidence``), through the evidence
index (only what changed since the last pass is read): the same reports feed every
rollout's evidence and the fleet's field view (``epfleet manifest show --field``).

Every move is a publish (``epfleet.fleet.publishing.publish.update_manifest``): the rollout state
is in the model's signed entry, so only a holder of the online key moves a rollout, and
a move is compare-and-swap against the rollout it judged (a rollout replaced meanwhile by a
newer publish is left alone), and a move that changes nothing publishes nothing. The
rules are ``epfleet.fleet.rollout.rules``'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field

from epfleet.clock import SYSTEM_CLOCK, Clock
from epfleet.errors import BadInputError
from epfleet.fleet.evidence.aggregate_rules import merged
from epfleet.fleet.evidence.aggregates import ShardAggregates, each_of
from epfleet.fleet.evidence.enrolment import keys_in_force
from epfleet.fleet.evidence.field_rules import FieldRow, field_rows, field_view
from epfleet.fleet.evidence.fleet_reports import full_attributed_device_reports, index_pass
from epfleet.fleet.evidence.index import heard_from, index_key
from epfleet.fleet.evidence.ranking_rules import LatencyTally, ProfileChoice, explain, rank
from epfleet.fleet.evidence.rankings import RankingsPublished, publish_rankings
from epfleet.fleet.evidence.reading import reports_from
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.evidence.sketch_rules import within_error
from epfleet.fleet.publishing.publish import read_in_force, update_manifest
from epfleet.fleet.rollout.aggregate_rules import (
    GateContext,
    context_digest,
    contribution,
    evidence_of,
    field_of,
    microseconds,
    rankings_of,
    tally_of,
)
from epfleet.fleet.rollout.rules import (
    CannotMove,
    Evidence,
    Verdict,
    advance,
    count,
    halt,
    judge,
    resume,
    revert,
)
from epfleet.fleet.watch.shared_aggregates import stored_context, watch_aggregates
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.field_ranking import ModelRanking
from epfleet.formats.manifest import DeviceKey, Manifest, ModelEntry
from epfleet.formats.rollout import Rollout
from epfleet.settings import settings
from epfleet.stores import Store
from epfleet.text import printable

Move = Literal["advance", "halt", "resume", "revert"]


class RolloutStatus(BaseModel):
    model: str
    rollout: Rollout
    evidence: Evidence
    verdict: Verdict
    """What the gate would do now."""


class Moved(BaseModel):
    model: str
    rollout_id: str
    move: Move
    reason: str
    stage: int
    state: str
    published: bool
    """False when the rollout had changed meanwhile, or the move changed nothing."""
    unchanged: str | None = None
    """Why nothing was published, when the move changed nothing."""


class IndexCounts(BaseModel):
    """What one pass of the evidence index read and wrote (``epfleet.fleet.evidence.index``)."""

    listing: str = Field(
        default="full",
        description="What the pass listed: every device's key (full), the recent notices "
        "(inbox), or nothing: a pass that had just brought the index up to date (none)",
    )
    listed: int = Field(description="Reports listed")
    reports_read: int = Field(description="Reports read: new or changed since the last pass")
    shards_written: int
    rebuilt: list[str] = Field(description="Shards that did not verify, rebuilt from reports")
    not_written: list[str] = Field(description="Shards this reader could not write back")
    contributions_computed: int = Field(
        default=0,
        description="Records whose part of the shard aggregates was computed (new or changed "
        "records, or all of a shard's when what they are judged against changed)",
    )


class GateReading(BaseModel):
    """One pass over the device reports: every rollout's status and the field view."""

    statuses: list[RolloutStatus]
    field: list[FieldRow] = Field(description="The fleet's evidence per model × target")
    read: int = Field(description="Reports read and attributed to the device their key names")
    unreadable: int = Field(description="Reports that could not be read")
    unattributed: int = Field(
        default=0, description="Reports read under the key of another device (not counted)"
    )
    index: IndexCounts | None = Field(
        default=None, description="What the evidence index's pass read (None: a full recount)"
    )
    rankings: dict[str, ModelRanking] = Field(
        default_factory=dict,
        description="The field rankings these reports give (``ranking_rules``), per model",
    )
    ranking_choices: list[ProfileChoice] = Field(
        default_factory=list,
        description="What each hardware profile and runtime measured takes, and why",
    )
    ranking_refused: dict[str, int] = Field(
        default_factory=dict, description="Latency votes not counted, by reason"
    )
    rankings_published: RankingsPublished | None = Field(
        default=None, description="What the gate signed of the rankings (None: not asked)"
    )


def read_evidence(
    store: Store,
    models: list[str] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    *,
    full: bool = False,
    fresh: float | None = None,
) -> GateReading:
    """Every rollout in the manifest in force (or of ``models``), with its evidence and
    the gate's verdict at ``clock.now()`` (a stage's ``min_hours``), and the field view,
    from the evidence index brought up to date (``epfleet.fleet.evidence.index``), or with
    ``full`` from one streamed pass over every report (a recount, the index untouched).
    The index may be as a pass that started less than ``fresh`` seconds ago left it
    (default EPFLEET_EVIDENCE_FRESH_SECONDS; ``run_gate`` reads again before it advances)."""
    signed = read_in_force(store)
    manifest = signed.manifest
    entries = manifest.models if manifest is not None else {}
    unknown = sorted(set(models or ()) - set(entries))
    if unknown:
        raise BadInputError(f"no model {', '.join(unknown)} in {store.uri}")
    staged = {n: e.rollout for n, e in entries.items() if e.rollout and (not models or n in models)}
    enrolled = keys_in_force(store, signed)
    now = _now(clock)
    configured = settings()
    max_age = timedelta(days=configured.ranking_max_age_days)
    in_force = manifest or Manifest()

    counts = None
    if full:
        stream = full_attributed_device_reports(store, enrolled)
        evidence, tally, latencies, field = _recount(
            stream, staged, in_force, enrolled, now, max_age
        )
    else:
        context = GateContext(staged, in_force, enrolled, max_age)
        reports, key = reports_from(store), index_key()
        aggregates = ShardAggregates(
            reports,
            key,
            "gate",
            context_digest(context),
            lambda report_key, record: contribution(heard_from(report_key, record), context),
            microseconds(now),
        )
        kept = [aggregates]
        watching = stored_context(reports, key)  # runtime-watch's, folded here too
        if watching is not None:
            kept.append(watch_aggregates(reports, key, watching, microseconds(now), True))
        indexed = index_pass(store, enrolled, fresh=fresh, each_shard=each_of(kept))
        counts = IndexCounts(
            listing=indexed.listing,
            listed=indexed.listed,
            reports_read=indexed.reports_read,
            shards_written=indexed.shards_written,
            rebuilt=indexed.rebuilt + [r for a in kept for r in a.rebuilt],
            not_written=indexed.not_written + [r for a in kept for r in a.not_written],
            contributions_computed=aggregates.computed,
        )
        fleet = merged(aggregates.folded.values())
        evidence = {name: evidence_of(fleet, name) for name in staged}
        tally = tally_of(fleet)
        latencies = rankings_of(fleet)
        field = field_rows(in_force, field_of(fleet))
    rankings = rank(latencies, in_force, configured.ranking_min_devices)
    found = []
    for name, rollout in sorted(staged.items()):
        found.append(
            RolloutStatus(
                model=name,
                rollout=rollout,
                evidence=evidence[name],
                verdict=judge(rollout, evidence[name], now),
            )
        )
    return GateReading(
        statuses=found,
        field=field,
        read=tally["read"],
        unreadable=tally["unreadable"],
        unattributed=tally["key"],
        index=counts,
        rankings=rankings,
        ranking_choices=explain(latencies, rankings, configured.ranking_min_devices),
        ranking_refused=dict(sorted(latencies.refused.items())),
    )


def _recount(
    stream: Iterator[DeviceReport | Unattributed],
    staged: dict[str, Rollout],
    manifest: Manifest,
    enrolled: Mapping[str, DeviceKey],
    now: datetime,
    max_age: timedelta,
) -> tuple[dict[str, Evidence], dict[str, int], LatencyTally, list[FieldRow]]:
    """Every rollout's evidence, the pass's tally, the ranking's and the field view, from
    one pass over the reports as the gate hears them."""
    evidence = {name: Evidence() for name in staged}
    tally = {"read": 0, "unreadable": 0, "key": 0}
    latencies = LatencyTally()

    def readable() -> Iterator[DeviceReport]:
        for heard in stream:
            for name, rollout in staged.items():
                count(evidence[name], rollout, name, heard, enrolled)
            latencies.add(heard, manifest, enrolled, now, max_age, authenticated=bool(enrolled))
            if isinstance(heard, Unattributed):
                tally[heard.reason] += 1
                continue
            tally["read"] += 1
            yield heard

    field = field_view(manifest, readable())
    return evidence, tally, latencies, field


def check_index(store: Store, clock: Clock = SYSTEM_CLOCK) -> tuple[GateReading, list[str]]:
    """The gate's reading through the evidence index and its aggregates (brought up to date
    as a gate run would), and where it differs from a full recount of every report: none,
    when the index holds what the reports say. Counts must be equal; latencies read from a
    sketch within its relative error (``sketch_rules``); a verdict's decision equal (its
    wording quotes those latencies)."""
    indexed = read_evidence(store, clock=clock, fresh=0.0)
    recount = read_evidence(store, clock=clock, full=True)
    differences = []
    mine, theirs = indexed.model_dump(exclude={"index"}), recount.model_dump(exclude={"index"})
    for name in ("read", "unreadable", "unattributed", "ranking_refused"):
        if mine[name] != theirs[name]:
            differences.append(f"reports {name}: index {mine[name]}, recount {theirs[name]}")
    for status, other, mine_status, their_status in zip(
        indexed.statuses, recount.statuses, mine["statuses"], theirs["statuses"], strict=True
    ):
        if not close(mine_status, their_status, ignore={"reason"}):
            differences.append(
                f"{status.model}: rollout evidence differs (index: {status.verdict.reason}; "
                f"recount: {other.verdict.reason})"
            )
    rows = {(r.model, r.target): r for r in recount.field}
    for row in indexed.field:
        other_row = rows.pop((row.model, row.target), None)
        if other_row is None or not close(row.model_dump(), other_row.model_dump()):
            differences.append(f"field view of {row.model} x {row.target} differs")
    differences += [f"field view of {model} x {target} differs" for model, target in rows]
    if not close(_ranked(indexed), _ranked(recount)):
        differences.append("field rankings differ")
    return indexed, [printable(d) for d in differences]


def _ranked(reading: GateReading) -> dict[str, Any]:
    """The rankings as compared: each profile's variants by target (two measured within the
    sketch's error of each other may come in either order)."""
    return {
        model: {
            (p.profile, p.runtime): {m.target: m.model_dump() for m in p.order}
            for p in ranking.profiles
        }
        for model, ranking in reading.rankings.items()
    }


def close(mine: Any, theirs: Any, ignore: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether two dumped readings agree: equal, but for floats (latencies), within the
    sketch's relative error, and keys in ``ignore``."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return mine.keys() == theirs.keys() and all(
            close(mine[k], theirs[k], ignore) for k in mine if k not in ignore
        )
    if isinstance(mine, list | tuple) and isinstance(theirs, list | tuple):
        return len(mine) == len(theirs) and all(
            close(a, b, ignore) for a, b in zip(mine, theirs, strict=True)
        )
    if isinstance(mine, float) and isinstance(theirs, float):
        return within_error(mine, theirs)
    return bool(mine == theirs)


def rebuild_index(store: Store) -> IndexCounts:
    """The evidence index rebuilt from every report (each read again, the shards' records
    set aside), as the gate hears them now."""
    indexed = index_pass(store, keys_in_force(store), rebuild=True)
    return IndexCounts(
        listing=indexed.listing,
        listed=indexed.listed,
        reports_read=indexed.reports_read,
        shards_written=indexed.shards_written,
        rebuilt=indexed.rebuilt,
        not_written=indexed.not_written,
    )


def statuses(
    store: Store, models: list[str] | None = None, clock: Clock = SYSTEM_CLOCK
) -> list[RolloutStatus]:
    """Every rollout's status (``read_evidence``)."""
    return read_evidence(store, models, clock).statuses


def _now(clock: Clock) -> datetime:
    return clock.now().replace(microsecond=0)  # as the manifest stores times


def move(
    store: Store,
    model: str,
    how: Move,
    reason: str,
    rollout_id: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> Moved:
    """Advance, halt, resume or revert the model's rollout (the one ``rollout_id`` names,
    when given) in one publish; an advance starts the next stage at ``clock.now()``. A
    move that changes nothing publishes nothing and says why (``Moved.unchanged``), and so
    does the gate's move (``rollout_id`` given) of a rollout moved since it judged it.
    BadInputError when the model has no rollout under way, or for an advance of a
    halted rollout (resume it first)."""
    steps: dict[Move, Callable[[ModelEntry, datetime, str], ModelEntry]] = {
        "advance": lambda entry, now, _: advance(entry, now),
        "halt": lambda entry, _, why: halt(entry, why),
        "resume": lambda entry, _, __: resume(entry),
        "revert": lambda entry, _, why: revert(entry, why),
    }
    done: list[ModelEntry] = []
    unchanged: list[str] = []

    def change(current: Manifest | None) -> Manifest | None:
        done.clear()
        unchanged.clear()
        entry = current.models.get(model) if current is not None else None
        if current is None or entry is None:
            raise BadInputError(f"no model {model!r} in {store.uri}")
        if rollout_id is not None and (entry.rollout is None or entry.rollout.id != rollout_id):
            return None  # a newer publish replaced the rollout judged: leave it
        try:
            moved = steps[how](entry, _now(clock), reason)
        except CannotMove as exc:
            if rollout_id is not None:  # the gate's move: a person moved it since it judged
                assert entry.rollout is not None
                unchanged.append(f"its rollout is {entry.rollout.state} now: {exc}")
                done.append(entry)
                return None
            raise BadInputError(
                f"model {model!r} in {store.uri}: {exc}; nothing to {how}"
            ) from None
        done.append(moved)
        if moved is entry:
            assert entry.rollout is not None
            unchanged.append(f"its rollout is {entry.rollout.state} already")
            return None
        models = current.models | {model: moved}
        return current.succeeded_by(models, _now(clock))  # keeps the enrolled device keys

    published = update_manifest(store, change)
    after = done[-1].rollout if done else None
    return Moved(
        model=model,
        rollout_id=rollout_id or (after.id if after else ""),
        move=how,
        reason=reason,
        stage=after.stage if after else -1,
        state=after.state if after else "unchanged",
        published=published.published,
        unchanged=unchanged[-1] if unchanged else None,
    )


Approve = Callable[[RolloutStatus], tuple[str, str]]
"""Asks a person whether to advance a rollout whose policy wants approval: (decision, why)."""


def run_gate(
    store: Store, approve: Approve | None = None, clock: Clock = SYSTEM_CLOCK
) -> tuple[GateReading, list[Moved]]:
    """Judge every active rollout on its evidence at ``clock.now()`` and advance or halt
    those the gate decides (``rollout_rules.judge``), asking ``approve`` first for a stage
    past the first of a policy with ``approval``, and sign the field rankings the same
    reports give (``epfleet.fleet.evidence.rankings``); the reading judged and the moves made.
    A reading from an index a recent pass left (EPFLEET_EVIDENCE_FRESH_SECONDS) that would
    advance a rollout is made again from the index brought up to date."""
    reading = read_evidence(store, clock=clock)
    shared = reading.index is not None and reading.index.listing == "none"
    if shared and any(status.verdict.decision == "advance" for status in reading.statuses):
        # a halt or a wait on evidence a few minutes old is safe; a stage opened on it is not
        reading = read_evidence(store, clock=clock, fresh=0.0)
    reading.rankings_published = publish_rankings(store, reading.rankings)
    moves = []
    for status in reading.statuses:
        decision: str = status.verdict.decision
        reason = status.verdict.reason
        if decision == "advance" and status.rollout.policy.approval and status.rollout.stage:
            decision, reason = approve(status) if approve else ("wait", "waits for approval")
        if decision in ("advance", "halt"):
            how: Move = "advance" if decision == "advance" else "halt"
            moves.append(move(store, status.model, how, reason, status.rollout.id, clock))
    return reading, moves
