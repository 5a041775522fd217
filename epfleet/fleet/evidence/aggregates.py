"""Per-shard aggregates of the evidence index, kept in the store beside its shards: a reader
merges a few hundred shard aggregates instead of restoring every device's record.

Each reader kind (the gate's pass, runtime-watch's) keeps, per shard
(``reports/evidence-index/<key id>/aggregates/<kind>/<nnn>.json.gz``, sealed as the shards
are), each record's contribution (``aggregate_rules``), tagged with the record's identity
(the fold that made it, and the key its signature was checked with) and with the
*context* it was judged in (a digest of what the reader judges against: the rollouts, the
manifest, its windows), and the shard's folded sum with the time span it holds for. A
pass, for each shard the index update hands over (``index.update``'s ``each_shard``),
reuses the contributions of records it knows, computes the others from their records (no
report read), and folds again only when something changed or the clock left the span.

Trust: the aggregates are the index's, sealed under its key; one that does not verify is
not used: its contributions are computed again from the shard's records, and the pass says
so. Stale ones (another reader wrote an older state last) cost computing, never a vote: a
contribution counts only for the record identity it was made from. Each is one write, so a
reader killed mid-pass leaves each whole.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from epfleet.errors import StoreError
from epfleet.fleet.evidence.aggregate_rules import (
    Contribution,
    Counts,
    Folded,
    PathTable,
    decode_contribution,
    decode_counts,
    encode_contribution,
    encode_counts,
    fold,
    refold,
    seal,
    unseal,
)
from epfleet.fleet.evidence.index import EachShard, Record, _index_folder
from epfleet.stores import DocumentTooLarge, Store
from epfleet.text import printable

logger = logging.getLogger(__name__)


def _identity_of(part: str) -> str:
    """The identity a stored contribution was made for (its JSON's first item)."""
    return part[2 : part.index('"', 2)]


def _contribution_of(part: str, table: PathTable) -> Contribution:
    return decode_contribution(json.loads(part)[1], table)


Contribute = Callable[[str, Record], Contribution]
"""A record's contribution, from its report key and its record."""


def aggregate_key(key: bytes, kind: str, shard: int, what: str) -> str:
    """Where a shard's aggregate is kept: its ``sum`` (the records' identities and their
    folded sum: what a pass reads of a shard that did not change) or its ``parts`` (each
    record's contribution and their folded sum, sealed together: read only when the shard
    changed, and the one object a pass that just wrote the shard reads)."""
    return f"{_index_folder(key)}/aggregates/{kind}/{shard:03d}.{what}.json.gz"


def record_identity(record: Record) -> str:
    """What a contribution was made from: the record's fold and the key its signature was
    checked with (the index folds a signed report again when its device's key in force
    changes; an unsigned one counts the same under any key)."""
    fold_id = record.get("fold") or f"{record['stamp']}@{record['read_after']}"
    signature = record.get("signature") or {}
    said = f"{fold_id}|{signature.get('key')}|{signature.get('verified')}"
    return hashlib.sha256(said.encode()).hexdigest()[:20]


@dataclass
class ShardAggregates:
    """One reader's aggregates, shard by shard, as the index update hands the shards over
    (call it with a shard's number and its records)."""

    reports: Store
    key: bytes
    kind: str
    context: str
    """A digest of everything the contributions are judged against but the clock."""
    contribute: Contribute
    now: int
    """The reader's clock, microseconds since the epoch."""
    write: bool = True
    written_only: bool = False
    """Only the shards the pass wrote (another reader's aggregates, kept by the pass that
    changed their records: ``folded`` then holds those shards alone)."""
    folded: dict[int, Counts] = field(default_factory=dict)
    computed: int = 0
    """Contributions computed from records (the others were reused)."""
    written: int = 0
    rebuilt: list[str] = field(default_factory=list)
    """Aggregates not used because they did not verify, and why."""
    not_written: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(
        self,
        shard: int,
        records: Mapping[str, Record],
        sealed: str | None = None,
        written: bool = True,
    ) -> None:
        if self.written_only and not written:
            return
        # a shard this pass just wrote has a new seal: no stored sum was folded of it
        summed = None if written and sealed is not None else self._read(shard, "sum")
        if summed is not None and summed.get("context") == self.context:
            held = Folded(decode_counts(summed["folded"]), summed["at"], summed["until"])
            if sealed is not None and summed.get("of") == sealed and held.holds(self.now):
                with self._lock:
                    self.folded[shard] = held.counts
                return
        identities = {k: record_identity(record) for k, record in records.items()}
        stored = self._read(shard, "parts")
        parts: dict[str, str] = {}
        table = PathTable()
        before: Folded | None = None  # the sum of exactly the stored parts, sealed with them
        if stored is not None and stored.get("context") == self.context:
            parts, table = stored["parts"], PathTable.of(stored["paths"])
            before = Folded(decode_counts(stored["folded"]), stored["at"], stored["until"])
        kept = {k: p for k, p in parts.items() if identities.get(k) == _identity_of(p)}
        made: dict[str, Contribution] = {}
        for report_key, identity in identities.items():
            if report_key not in kept:
                made[report_key] = self.contribute(report_key, records[report_key])
                encoded = encode_contribution(made[report_key], table)
                kept[report_key] = json.dumps([identity, encoded], separators=(",", ":"))
        now = None
        if before is not None:
            known = {k: _identity_of(p) for k, p in parts.items()}
            changed = [k for k in known if identities.get(k) != known[k]]
            removed = [_contribution_of(parts[k], table) for k in changed]
            added = [
                made.get(k) or _contribution_of(kept[k], table)
                for k in identities
                if identities[k] != known.get(k)
            ]
            now = refold(before, removed, added, self.now)
        if now is None:
            now = fold(
                (made.get(k) or _contribution_of(kept[k], table) for k in identities), self.now
            )
        with self._lock:
            self.folded[shard] = now.counts
            self.computed += len(made)
        if not self.write:
            return
        parts_seal = None
        if stored is not None and stored.get("context") == self.context:
            parts_seal = stored.get("seal")
        if made or kept.keys() != parts.keys() or parts_seal is None:
            parts_body = {
                "context": self.context,
                "paths": table.paths,
                "parts": kept,
                "folded": encode_counts(now.counts),
                "at": now.at,
                "until": now.until,
            }
            parts_seal = self._write(shard, "parts", parts_body, level=1)
        if parts_seal is None:
            return  # a sum must name the parts it was folded of
        body: dict[str, Any] = {
            "context": self.context,
            "of": sealed,
            "parts": parts_seal,
            "folded": encode_counts(now.counts),
            "at": now.at,
            "until": now.until,
        }
        if summed is None or {k: summed.get(k) for k in body} != body:
            self._write(shard, "sum", body)

    def _write(self, shard: int, what: str, body: dict[str, Any], level: int = 6) -> str | None:
        """Write a shard's aggregate; its seal, or None when it could not be written."""
        where = aggregate_key(self.key, self.kind, shard, what)
        plain = seal(f"{self.kind} {what}", shard, body, self.key)
        data = gzip.compress(plain, level, mtime=0)
        try:
            self.reports.write(where, data)
        except StoreError as exc:
            with self._lock:
                self.not_written.append(printable(f"{where}: {exc}"))
            return None
        with self._lock:
            self.written += 1
        return plain.partition(b"\n")[0].decode()

    def _read(self, shard: int, what: str) -> dict[str, Any] | None:
        where = aggregate_key(self.key, self.kind, shard, what)
        try:
            stored = self.reports.read(where)
        except DocumentTooLarge as exc:
            self._rebuilt(f"{where}: {exc}")
            return None
        if stored is None:
            return None
        try:
            plain = gzip.decompress(stored.data)
            body = unseal(f"{self.kind} {what}", shard, plain, self.key)
            body["seal"] = plain.partition(b"\n")[0].decode()
            return body
        except (ValueError, KeyError, TypeError, OSError, EOFError) as exc:
            self._rebuilt(printable(f"{where}: {exc}"))
            return None

    def _rebuilt(self, why: str) -> None:
        logger.warning("evidence aggregate computed again from the index's records: %s", why)
        with self._lock:
            self.rebuilt.append(why)


def each_of(hooks: list[ShardAggregates]) -> EachShard:
    """One ``index.update`` hook that hands each shard to every one of ``hooks``."""

    def each(shard: int, records: dict[str, Record], sealed: str | None, written: bool) -> None:
        for hook in hooks:
            hook(shard, records, sealed, written)

    return each
