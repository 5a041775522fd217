"""Runtime-watch's reading of the device reports as mergeable aggregates (pure): what one
report, as the watch reads it, adds (``contribution``: the very rules of ``find_unserved``
applied to that one report), and the watch's findings from the fleet's sum
(``unserved_of``).

A contribution is judged against a ``WatchContext`` (the spec, the pair checks, the compile
workers' runtime, the report window: ``context_digest``). A report older than the window
counts as quiet: a ``Window`` that closes at the report's time plus the window, on the
reader's clock. An unserved profile names its devices in device id order, the first
``MAX_LISTED_DEVICES`` of the fleet, and counts them all; a model's reason is the first in
that order's sense too (the smallest text), so that the findings do not depend on the
order the reports were read in; unreadable reports are named likewise, the first
``MAX_LISTED_PROBLEMS``, and counted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from epfleet.fleet.evidence.aggregate_rules import (
    FOREVER,
    Contribution,
    Counts,
    Merged,
    Window,
    add_count,
    add_value,
    listed,
    path,
)
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.watch.rules import (
    MAX_LISTED_DEVICES,
    PairCheck,
    Runtime,
    UnservedProfile,
    find_unserved,
    report_time,
)
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.spec import FleetSpec

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MAX_LISTED_PROBLEMS = 100


@dataclass(frozen=True)
class WatchContext:
    """What the watch judges a report against, but the clock."""

    spec: FleetSpec
    checks: list[PairCheck]
    runtime: Runtime
    max_age: timedelta


def context_digest(context: WatchContext) -> str:
    said = {
        "spec": context.spec.model_dump(mode="json"),
        "checks": [c.model_dump(mode="json") for c in context.checks],
        "runtime": context.runtime.model_dump(mode="json"),
        "max_age": context.max_age.total_seconds(),
    }
    return hashlib.sha256(json.dumps(said, sort_keys=True).encode()).hexdigest()


def contribution(found: DeviceReport | Unattributed, context: WatchContext) -> Contribution:
    """What one report object, as the watch reads it, adds (see the module)."""
    always: Counts = {}
    if isinstance(found, Unattributed):
        add_count(always, path("skipped"))
        add_value(always, listed("problem"), str(found))
        return Contribution(always)
    made = report_time(found)
    add_count(always, path("read"))
    profiles, _ = find_unserved(
        [found], context.spec, context.checks, context.runtime, made, context.max_age
    )
    inside: Counts = {}
    for profile in profiles:
        ident = profile.profile_id
        add_count(inside, path("unserved", ident, "devices"), profile.device_count)
        add_count(inside, path("unserved", ident, "label", profile.label, *profile.eps))
        for device in profile.devices:
            add_value(inside, listed("unserved", ident, "device"), device)
        for model, why in profile.models.items():
            add_value(inside, listed("unserved", ident, "model", model), why)
        for target in profile.targets:
            add_count(inside, path("unserved", ident, "target", target))
    quiet: Counts = {}
    add_count(quiet, path("quiet"))
    end = (made + context.max_age - EPOCH) // timedelta(microseconds=1)
    return Contribution(always, Window(-FOREVER, end, inside, {}, quiet))


@dataclass
class WatchReading:
    unserved: list[UnservedProfile]
    quiet: int
    read: int
    problems: list[str]
    """The first unreadable reports named, and how many more there were."""


def unserved_of(merged: Merged) -> WatchReading:
    """The watch's findings from the fleet's merged aggregates."""
    profiles: dict[str, UnservedProfile] = {}
    for where in merged.counts:
        parts = json.loads(where)
        if parts[0] == "unserved" and parts[2] == "label":
            ident = parts[1]
            profiles[ident] = UnservedProfile(
                profile_id=ident,
                label=parts[3],
                eps=parts[4:],
                devices=[],
                device_count=merged.count(path("unserved", ident, "devices")),
                models={},
                targets=[],
            )
    for where in merged.counts:
        parts = json.loads(where)
        if parts[0] == "unserved" and parts[2] == "target" and parts[1] in profiles:
            profiles[parts[1]].targets.append(parts[3])
    for where, values in merged.values.items():
        parts = json.loads(where)
        if parts[:2] != ["listed", "unserved"] or parts[2] not in profiles:
            continue
        profile = profiles[parts[2]]
        if parts[3] == "device":
            profile.devices = sorted(map(str, values))[:MAX_LISTED_DEVICES]
        else:
            profile.models[parts[4]] = min(map(str, values))
    for profile in profiles.values():
        profile.targets.sort()
        profile.models = dict(sorted(profile.models.items()))
    skipped = merged.count(path("skipped"))
    named = sorted(map(str, merged.values.get(listed("problem"), [])))[:MAX_LISTED_PROBLEMS]
    more = skipped - len(named)
    return WatchReading(
        unserved=[profiles[i] for i in sorted(profiles)],
        quiet=merged.count(path("quiet")),
        read=merged.count(path("read")),
        problems=named + ([f"... and {more} more unreadable reports"] if more > 0 else []),
    )
