"""Mergeable aggregates of the evidence index's records (pure): what each record adds to a
reader's answer (its *contribution*, computed once, when the record or what it is judged
against changes), a shard's sum of them, and the fleet's sum of the shards'.

An aggregate is a table of counts (``Counts``), keyed by what is counted and where (a
``path``, a JSON list naming, say, a rollout's side on one runtime):

- ``("n", path)``: a count (devices, failures, refusals by reason);
- ``("sb", path, sign, index)``: a latency sample's bucket (``sketch_rules``), and
  ``("sx", path, value)`` the sample itself, kept while a shard holds at most
  ``EXACT_PER_SHARD`` samples of that path: a quantile is then read from the exact values
  (as a recount gives it, to the bit), else from the buckets (within 1 %);
- ``("v", path, value)``: a value kept for its extremes (the largest shadow-run error, the
  smallest tolerance), every distinct value with its count; under a path made by
  ``listed`` (devices named, problems quoted), only a shard's ``LISTED_PER_SHARD``
  smallest: a reader names the first ones of the fleet's in that order and counts the rest.

Adding counts is merging; no count depends on the order records come in.

Time: a record's contribution may hold on the reader's clock (a ranking counts a report
made no earlier than its maximum age before now, and no later than now plus a skew): such
a part is a ``Window``, counted as ``inside`` from ``start`` through ``end`` (microseconds
since the epoch), as ``before`` or ``after`` out of it. A fold at ``now`` says until when
its sum holds (``Folded.until``): the first instant any record's window opens or closes.

A shard's aggregate is stored sealed, as the index's shards are (HMAC-SHA256 under the
index key): a sealed aggregate that does not verify is not used.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epfleet.fleet.evidence.sketch_rules import Bucket, bucket_of, sketched

AGGREGATE_FORMAT = 3
EXACT_PER_SHARD = 32
"""Samples of one path a shard keeps exactly; past this many, only their buckets."""
LISTED_PER_SHARD = 100
"""Values of a ``listed`` path a shard keeps (the smallest)."""
_SEAL_CONTEXT = b"epfleet evidence aggregate v1\n"
FOREVER = 2**62

Key = tuple[Any, ...]
Counts = dict[Key, int]


@functools.lru_cache(maxsize=65536)
def path(*parts: object) -> str:
    """A path naming where something is counted (the same few thousand for a fleet:
    cached)."""
    return json.dumps(parts, separators=(",", ":"))


def listed(*parts: object) -> str:
    """A path whose values are names, of which a shard keeps only the first few."""
    return path("listed", *parts)


def add_count(counts: Counts, where: str, n: int = 1) -> None:
    if n:
        key = ("n", where)
        counts[key] = counts.get(key, 0) + n


def add_sample(counts: Counts, where: str, value: float) -> None:
    sign, index = bucket_of(value)
    for key in (("sb", where, sign, index), ("sx", where, value)):
        counts[key] = counts.get(key, 0) + 1


def add_value(counts: Counts, where: str, value: float | str) -> None:
    key = ("v", where, value)
    counts[key] = counts.get(key, 0) + 1


def merge_into(total: Counts, part: Mapping[Key, int]) -> None:
    for key, n in part.items():
        total[key] = total.get(key, 0) + n


@dataclass(frozen=True)
class Window:
    """A part of a contribution that depends on the reader's clock (see the module)."""

    start: int
    end: int
    inside: Counts
    before: Counts
    after: Counts

    def at(self, now: int) -> Counts:
        if now < self.start:
            return self.before
        return self.inside if now <= self.end else self.after

    def changes_after(self, now: int) -> int:
        """The first instant past ``now`` at which ``at`` answers otherwise."""
        if now < self.start:
            return self.start
        return self.end + 1 if now <= self.end else FOREVER

    def same_since(self, now: int) -> int:
        """The first instant from which ``at`` answers as it does at ``now``."""
        if now < self.start:
            return -FOREVER
        return self.start if now <= self.end else self.end + 1


@dataclass(frozen=True)
class Contribution:
    """What one record adds to a reader's aggregate."""

    always: Counts = field(default_factory=dict)
    window: Window | None = None


@dataclass(frozen=True)
class Folded:
    """A shard's aggregate, which holds for a reader's clock in [at, until): from the last
    instant a record's window opened or closed before it was folded to the next one (a
    reader whose clock is behind the folder's still uses it)."""

    counts: Counts
    at: int
    until: int

    def holds(self, now: int) -> bool:
        return self.at <= now < self.until


def fold(contributions: Iterable[Contribution], now: int) -> Folded:
    """The sum of ``contributions`` at ``now`` (microseconds since the epoch), each path's
    exact samples dropped past ``EXACT_PER_SHARD`` (their buckets stay)."""
    counts: Counts = {}
    since, until = -FOREVER, FOREVER
    for one in contributions:
        merge_into(counts, one.always)
        if one.window is not None:
            merge_into(counts, one.window.at(now))
            since = max(since, one.window.same_since(now))
            until = min(until, one.window.changes_after(now))
    found = normalised(counts)
    assert found is not None  # sums of contributions: no count below zero
    return Folded(found, since, until)


def refold(
    before: Folded, removed: Iterable[Contribution], added: Iterable[Contribution], now: int
) -> Folded | None:
    """``before`` with the contributions of the records that changed or went ``removed``
    (as they counted at ``before.at``) taken out and those ``added`` put in, at ``now``
    (within the span ``before`` holds for); None when it cannot be done so (a count kept
    only in part: fold the shard again)."""
    if not before.holds(now):
        return None
    counts = dict(before.counts)
    since, until = before.at, before.until
    for one in removed:
        for part in (one.always, one.window.at(before.at) if one.window else {}):
            for key, n in part.items():
                counts[key] = counts.get(key, 0) - n
    for one in added:
        merge_into(counts, one.always)
        if one.window is not None:
            merge_into(counts, one.window.at(now))
            since = max(since, one.window.same_since(now))
            until = min(until, one.window.changes_after(now))
    found = normalised(counts)
    return Folded(found, since, until) if found is not None else None


def normalised(counts: Counts) -> Counts | None:
    """``counts`` without zeros, each path's exact samples dropped unless they are all
    there and at most ``EXACT_PER_SHARD``, a ``listed`` path's values cut to the smallest
    ``LISTED_PER_SHARD``; None when a count is below zero (a value cut before, taken out)."""
    exact: dict[str, int] = {}
    sampled: dict[str, int] = {}
    names: dict[str, list[Key]] = {}
    for key, n in counts.items():
        if n < 0 and key[0] != "sx":
            return None
        if key[0] == "sx":
            exact[key[1]] = exact.get(key[1], 0) + n if n >= 0 else -(2**62)
        elif key[0] == "sb":
            sampled[key[1]] = sampled.get(key[1], 0) + n
        elif key[0] == "v" and key[1].startswith('["listed"') and n > 0:
            names.setdefault(key[1], []).append(key)
    partial = {
        where for where, n in exact.items() if n != sampled.get(where, 0) or n > EXACT_PER_SHARD
    }
    found = {k: n for k, n in counts.items() if n and not (k[0] == "sx" and k[1] in partial)}
    for keys in names.values():
        for key in sorted(keys, key=lambda k: k[2])[LISTED_PER_SHARD:]:
            del found[key]
    return found


@dataclass
class Merged:
    """The fleet's aggregate, read by path."""

    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    """Path -> its samples as (value, count), increasing: exact when every shard kept
    them all, else the sketch's representatives."""
    values: dict[str, list[float | str]] = field(default_factory=dict)
    exact: dict[str, bool] = field(default_factory=dict)

    def count(self, where: str) -> int:
        return self.counts.get(where, 0)


def merged(shards: Iterable[Mapping[Key, int]]) -> Merged:
    """The sum of the shards' aggregates, read by path."""
    total: Counts = {}
    for counts in shards:
        merge_into(total, counts)
    found = Merged()
    buckets: dict[str, list[tuple[Bucket, int]]] = {}
    exact: dict[str, list[tuple[float, int]]] = {}
    for key, n in total.items():
        if n <= 0:
            continue
        kind, where = key[0], key[1]
        if kind == "n":
            found.counts[where] = n
        elif kind == "sb":
            buckets.setdefault(where, []).append(((key[2], key[3]), n))
        elif kind == "sx":
            exact.setdefault(where, []).append((key[2], n))
        elif kind == "v":
            found.values.setdefault(where, []).append(key[2])
    for where, counted in buckets.items():
        kept = sorted(exact.get(where, []))
        if sum(n for _, n in kept) == sum(n for _, n in counted):
            found.samples[where], found.exact[where] = kept, True
        else:
            found.samples[where], found.exact[where] = sketched(counted), False
    return found


def encode_counts(counts: Mapping[Key, int]) -> list[Any]:
    return [[list(k), n] for k, n in counts.items()]


def decode_counts(stored: list[Any]) -> Counts:
    return {tuple(k): n for k, n in stored}


@dataclass
class PathTable:
    """The paths a shard's stored contributions name, each stored once: a contribution
    names a path by its place here (places never change while the table is kept)."""

    paths: list[str] = field(default_factory=list)
    places: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, paths: list[str]) -> PathTable:
        return cls(list(paths), {p: i for i, p in enumerate(paths)})

    def place(self, where: str) -> int:
        found = self.places.get(where)
        if found is None:
            found = self.places[where] = len(self.paths)
            self.paths.append(where)
        return found

    def encode(self, counts: Mapping[Key, int]) -> list[Any]:
        return [[k[0], self.place(k[1]), *k[2:], n] for k, n in counts.items()]

    def decode(self, stored: list[Any]) -> Counts:
        return {(e[0], self.paths[e[1]], *e[2:-1]): e[-1] for e in stored}


def encode_contribution(one: Contribution, table: PathTable) -> dict[str, Any]:
    found: dict[str, Any] = {"a": table.encode(one.always)}
    w = one.window
    if w is not None:
        found["w"] = [
            w.start,
            w.end,
            table.encode(w.inside),
            table.encode(w.before),
            table.encode(w.after),
        ]
    return found


def decode_contribution(stored: dict[str, Any], table: PathTable) -> Contribution:
    w = stored.get("w")
    window = (
        Window(w[0], w[1], table.decode(w[2]), table.decode(w[3]), table.decode(w[4]))
        if w is not None
        else None
    )
    return Contribution(table.decode(stored["a"]), window)


def seal(kind: str, shard: int, body: dict[str, Any], key: bytes) -> bytes:
    """A shard's aggregate as stored: its seal, a line break, its JSON."""
    data = {**body, "format": AGGREGATE_FORMAT, "kind": kind, "shard": shard}
    raw = json.dumps(data, separators=(",", ":")).encode()
    return _mac(key, raw).encode() + b"\n" + raw


def unseal(kind: str, shard: int, stored: bytes, key: bytes) -> dict[str, Any]:
    """The body of a stored aggregate; ValueError saying why when its seal does not verify
    under ``key``, or it is not the ``kind`` aggregate of shard ``shard`` of this format."""
    mac, newline, raw = stored.partition(b"\n")
    if not newline or not hmac.compare_digest(mac, _mac(key, raw).encode()):
        raise ValueError("its seal does not verify under this index key (forged or damaged)")
    body: dict[str, Any] = json.loads(raw)
    said = (body.get("format"), body.get("kind"), body.get("shard"))
    if said != (AGGREGATE_FORMAT, kind, shard):
        raise ValueError(f"sealed as format, kind and shard {said!r}")
    return body


def _mac(key: bytes, raw: bytes) -> str:
    return hmac.new(key, _SEAL_CONTEXT + raw, hashlib.sha256).hexdigest()
