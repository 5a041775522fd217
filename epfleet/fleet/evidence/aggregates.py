"""Per-shard aggregates of the evidence index, kept in the store beside its shards: a reader
merges a few hundred shard aggregates instead of restoring every device's record.

Each reader kind (the gate's pass, runtime-watch's) keeps, per shard
(``reports/evidence-index/<key id>/aggregates/<kind>/<nnn>.json.gz``, sealed as the shards
are), each record's contribution (``aggregate_rules``), tagged with the record's identity
(the fold that made it, and the fingerprint of its device's enrolled key) and with the
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
    decode_contribution,
    decode_counts,
    encode_contribution,
    encode_counts,
    fold,
    seal,
    unseal,
)
from epfleet.fleet.evidence.index import Record, _index_folder
from epfleet.fleet.evidence.index_rules import device_key_fingerprint
from epfleet.formats.device_report import key_device
from epfleet.formats.manifest import DeviceKey
from epfleet.stores import DocumentTooLarge, Store
from epfleet.text import printable

logger = logging.getLogger(__name__)

Contribute = Callable[[str, Record], Contribution]
"""A record's contribution, from its report key and its record."""


def aggregate_key(key: bytes, kind: str, shard: int) -> str:
    return f"{_index_folder(key)}/aggregates/{kind}/{shard:03d}.json.gz"


def record_identity(record: Record, enrolled_key: DeviceKey | None) -> str:
    """What a contribution was made from: the record's fold and its device's enrolled key."""
    fold_id = record.get("fold") or f"{record['stamp']}@{record['read_after']}"
    return f"{fold_id}|{device_key_fingerprint(enrolled_key)}"


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
    enrolled: Mapping[str, DeviceKey]
    now: int
    """The reader's clock, microseconds since the epoch."""
    write: bool = True
    folded: dict[int, Counts] = field(default_factory=dict)
    computed: int = 0
    """Contributions computed from records (the others were reused)."""
    written: int = 0
    rebuilt: list[str] = field(default_factory=list)
    """Aggregates not used because they did not verify, and why."""
    not_written: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, shard: int, records: Mapping[str, Record]) -> None:
        where = aggregate_key(self.key, self.kind, shard)
        stored = self._read(where, shard)
        known: dict[str, Any] = {}
        if stored is not None and stored.get("context") == self.context:
            known = stored["entries"]
        entries: dict[str, Any] = {}
        contributions: list[Contribution] = []
        computed = 0
        for report_key, record in records.items():
            device = key_device(report_key)
            identity = record_identity(record, self.enrolled.get(device) if device else None)
            kept = known.get(report_key)
            if kept is not None and kept[0] == identity:
                entries[report_key] = kept
                contributions.append(decode_contribution(kept[1]))
                continue
            one = self.contribute(report_key, record)
            computed += 1
            entries[report_key] = [identity, encode_contribution(one)]
            contributions.append(one)
        unchanged = computed == 0 and len(entries) == len(known)
        if unchanged and stored is not None:
            before = Folded(decode_counts(stored["folded"]), stored["at"], stored["until"])
            if before.holds(self.now):
                with self._lock:
                    self.folded[shard] = before.counts
                return
        now = fold(contributions, self.now)
        with self._lock:
            self.folded[shard] = now.counts
            self.computed += computed
        if self.write:
            body = {
                "context": self.context,
                "entries": entries,
                "folded": encode_counts(now.counts),
                "at": now.at,
                "until": now.until,
            }
            data = gzip.compress(seal(self.kind, shard, body, self.key), 6, mtime=0)
            try:
                self.reports.write(where, data)
            except StoreError as exc:
                with self._lock:
                    self.not_written.append(printable(f"{where}: {exc}"))
                return
            with self._lock:
                self.written += 1

    def _read(self, where: str, shard: int) -> dict[str, Any] | None:
        try:
            stored = self.reports.read(where)
        except DocumentTooLarge as exc:
            self._rebuilt(f"{where}: {exc}")
            return None
        if stored is None:
            return None
        try:
            return unseal(self.kind, shard, gzip.decompress(stored.data), self.key)
        except (ValueError, KeyError, TypeError, OSError, EOFError) as exc:
            self._rebuilt(printable(f"{where}: {exc}"))
            return None

    def _rebuilt(self, why: str) -> None:
        logger.warning("evidence aggregate computed again from the index's records: %s", why)
        with self._lock:
            self.rebuilt.append(why)
