"""The evidence index: what the rollout gate, the field view and runtime-watch read of the
device reports, kept in the reports' store and updated, not rebuilt, by each pass.

A pass (``update``) finds what changed, reads the index's shards (``SHARDS`` of them,
``reports/evidence-index/<key id>/<nnn>``, gzip), reads only the reports that changed since
their record was folded (``index_rules.must_read``), hears each as the gate hears it
(``report_reading.read_attributed``: the same attribution, order and limits as a full
read), folds it into its shard's records and writes back each shard it changed, by
compare-and-swap: a reader that loses the race re-reads the shard and applies its own
changes to the one written meanwhile (``index_rules.merge``). The answer is the records:
every listed report as the gate hears it (``heard``) and as runtime-watch reads it
(``readings``), restored from what the index keeps of them (``index_rules``).

What changed: devices of this release leave a notice beside each report they upload (an
empty object, ``reports/inbox/<partition>/<device id>.json``, filed under the device's own
time: ``epfleet.formats.device_report.inbox_key``), and most passes list only the inbox
partitions from the last complete pass's start less ``EPFLEET_EVIDENCE_SKEW_SECONDS`` to now
plus that (the store's clock), reading the report each notice names when the notice is
later than its record. Every ``EPFLEET_EVIDENCE_FULL_LISTING_EVERY`` passes, on the first,
on ``rebuild`` and whenever the index is not whole (a shard or head that does not verify, a
shard older than the head says), a pass lists every device's key (``reports/devices/``,
one LIST per 1,000 reports) and keeps records only of listed reports, as every pass did
before notices: what older devices upload, and notices filed under a clock further off,
count from there. A pass that finds the index brought up to date by a pass that started
less than ``fresh`` seconds ago (the store's clock) lists nothing.

The head (``reports/evidence-index/<key id>/head.json``, sealed like a shard, written by
compare-and-swap after every shard of a pass was written) says when the last complete pass
started (the watermark), how many passes since a full listing, and each shard's version as
that pass left it; each shard carries its version. A shard older than the head says (an
older one put back) or a head older than one this machine read before (a whole older index
put back) brings a full listing.

Trust: anyone who can write reports can write the index's objects. A shard is sealed with
a key the fleet-side readers hold (``EPFLEET_EVIDENCE_KEY``, or one kept in the worker
cache); a shard that does not verify is not used: the pass reads its reports again, says
so (``IndexPass.rebuilt``) and writes it again. An older sealed shard put back costs reads,
never a vote: a record counts only while the listing shows its report as it was folded.
A reader that cannot write the store answers from what it read and leaves the index as it
was; one killed mid-pass leaves every shard whole (each is one write).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from epfleet.errors import PreconditionFailed, StoreError
from epfleet.fleet.evidence import index_rules
from epfleet.fleet.evidence.heard_reports import HeardReports
from epfleet.fleet.evidence.index_rules import (
    SHARDS,
    CheckedSignature,
    Stamp,
    device_key_fingerprint,
    merge,
    must_read,
    project,
    restore,
    seal,
    seal_of,
    shard_of,
    stamp_of,
    unseal,
)
from epfleet.fleet.evidence.reading import READ_THREADS, ReportOrder
from epfleet.fleet.evidence.rules import Unattributed, attribute
from epfleet.formats.device_report import (
    INBOX_PARTITION_SECONDS,
    INBOX_PREFIX,
    REPORTS_PREFIX,
    DeviceReport,
    inbox_device,
    inbox_partition,
    key_device,
    report_key,
    signed_by,
)
from epfleet.formats.manifest import NAME_PATTERN, DeviceKey
from epfleet.fsutil import atomic_write_bytes
from epfleet.settings import settings
from epfleet.stores import DocumentTooLarge, Store, Versioned, bulk_reader, document_limit
from epfleet.text import printable
from epfleet.trust.device_keys import EnrolledKeys

INDEX_PREFIX = "reports/evidence-index"
WRITE_ATTEMPTS = 10
CLOCK_LEFTOVER_SECONDS = 3600.0
MAX_INBOX_SPAN = 86_400.0
"""A pass that finds the last complete one started longer ago than this lists every key."""

logger = logging.getLogger(__name__)

Record = dict[str, Any]
EachShard = Callable[[int, dict[str, Record], str | None, bool], None]
"""``update``'s hook: a shard's number, its records, the seal of the stored shard that
holds exactly those (None when there is none), and whether this pass wrote it."""
SHARD_COMPRESSION = 1
"""gzip's level for a shard: a pass compresses every shard it changed; level 1 takes a
third of level 6's CPU for objects about 15 % larger."""


def index_key() -> bytes:
    """The key sealing the index: EPFLEET_EVIDENCE_KEY, else one made once and kept in the
    worker cache (readable by its owner only)."""
    given = settings().evidence_key
    if given is not None:
        return given.get_secret_value().encode()
    path = settings().cache / "work" / "evidence-index.key"
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    made = secrets.token_hex(32).encode()
    atomic_write_bytes(path, made)
    path.chmod(0o600)
    return path.read_bytes().strip()  # another process may have made it first


def _index_folder(key: bytes) -> str:
    key_id = hashlib.sha256(b"epfleet evidence index key id\n" + key).hexdigest()[:16]
    return f"{INDEX_PREFIX}/{key_id}"


def shard_key(key: bytes, shard: int) -> str:
    return f"{_index_folder(key)}/{shard:03d}.json.gz"


@dataclass
class IndexPass:
    """What one pass read and wrote, and the fleet's reports as the index holds them."""

    compact: list[bytes] = field(default_factory=list)
    """Each shard's records of listed reports, as a shard is stored (gzip: its seal, a
    line break, its JSON), unverified: read only from what this pass read or wrote."""
    listing: str = "full"
    """What the pass listed: ``full`` (every device's key, and the recent notices), ``inbox``
    (the recent notices) or ``none`` (the index was fresh: ``as_of``)."""
    as_of: float | None = None
    """When the pass whose index this one answered from without listing started (the
    store's clock, POSIX seconds)."""
    listed: int = 0
    noticed: int = 0
    reports_read: int = 0
    shards_read: int = 0
    shards_written: int = 0
    rebuilt: list[str] = field(default_factory=list)
    """Shards not used, and why (forged, damaged, sealed under another key)."""
    not_written: list[str] = field(default_factory=list)
    """Shards this reader could not write back (a read-only store), and why."""

    @property
    def records(self) -> dict[str, Record]:
        """Report key -> its record, for every listed report (all held: for tests)."""
        return {k: r for k, r in self._records()}

    def _records(self) -> Iterator[tuple[str, Record]]:
        for compact in self.compact:
            body = gzip.decompress(compact).partition(b"\n")[2]
            shard: dict[str, Record] = json.loads(body)["records"]
            yield from sorted(shard.items())

    def heard(self) -> Iterator[DeviceReport | Unattributed]:
        """Every listed report as the rollout gate hears it, a shard at a time."""
        for key, record in self._records():
            yield heard_from(key, record)

    def readings(self) -> Iterator[DeviceReport | Unattributed]:
        """Every listed report as runtime-watch reads it, or why it cannot."""
        for key, record in self._records():
            yield reading_from(key, record)


def reading_from(key: str, record: Record) -> DeviceReport | Unattributed:
    """The report of ``record`` as runtime-watch reads it, or why it cannot."""
    if "report" in record:
        return restore(record["report"])
    return Unattributed(key, "unreadable", record["problem"])


def heard_from(key: str, record: Record) -> DeviceReport | Unattributed:
    signature = record.get("signature")
    checked = (
        CheckedSignature(signature["key"], signature["verified"]) if signature is not None else None
    )
    if "counted" in record:
        return restore(record["counted"], checked)
    if "problem" in record:
        return Unattributed(key, "unreadable", record["problem"])
    if "unattributed" in record:
        reason, detail = record["unattributed"]
        return Unattributed(key, reason, detail, restore(record["report"]))
    return restore(record["report"], checked)


def fold(
    heard: DeviceReport | Unattributed,
    raw: DeviceReport | Unattributed,
    stamp: Stamp,
    read_after: float,
    enrolled_key: DeviceKey | None,
    key_stamp: str | None = None,
) -> Record:
    """The record of a report listed with ``stamp``, read after ``read_after`` (the store's
    clock) as ``raw`` and heard by the gate as ``heard`` (the one remembered, when it
    counts in its place)."""
    record: Record = {"stamp": list(stamp), "read_after": read_after, "fold": secrets.token_hex(8)}
    if isinstance(raw, Unattributed):
        if raw.report is not None:
            record["report"] = project(raw.report)
            record["unattributed"] = [raw.reason, raw.detail]
        else:
            record["problem"] = raw.detail
    else:
        record["report"] = project(raw)
    if heard is not raw and isinstance(heard, DeviceReport):
        record["counted"] = project(heard)
    if isinstance(heard, DeviceReport) and heard._envelope is not None:
        record["signature"] = {
            "key": device_key_fingerprint(enrolled_key),
            "verified": enrolled_key is not None and signed_by(heard, enrolled_key),
        }
        if key_stamp is not None:
            record["signature"]["keys"] = key_stamp
    return record


def update(
    reports: Store,
    enrolled: Mapping[str, DeviceKey],
    memory: HeardReports | None = None,
    *,
    key: bytes | None = None,
    threads: int = READ_THREADS,
    write: bool = True,
    rebuild: bool = False,
    settle: float | None = None,
    full: bool = False,
    fresh: float = 0.0,
    each_shard: EachShard | None = None,
) -> IndexPass:
    """One pass over the reports in ``reports`` (see the module): the index brought up to
    date with them, written back unless ``write`` is False, and the fleet's reports as it
    holds them. ``enrolled``: the devices' keys (the signed manifest's); ``memory``: this
    machine's memory of the newest signed reports (``heard_reports``). ``rebuild``: every
    report read again, the shards' records set aside; ``full``: every device's key listed
    (as every ``EPFLEET_EVIDENCE_FULL_LISTING_EVERY`` passes); ``fresh``: no listing at
    all when a pass that started less than this many seconds ago (the store's clock)
    brought the index up to date. ``each_shard``: called with each shard's number, its
    records of the fleet's reports, once it is up to date, the seal of the stored shard
    that holds exactly those records (None when the pass holds others: a shard it could not
    write, records of reports no longer listed) and whether this pass wrote it, from the
    pass's threads: the aggregates' hook, ``epfleet.fleet.evidence.aggregates``."""
    key = key if key is not None else index_key()
    settle = index_rules.SETTLE_SECONDS if settle is None else settle
    started = _store_clock(reports, key) if write else None
    found = IndexPass()
    head, head_etag = _read_head(reports, key, found)
    if head is not None and started is not None and _seen_later(key, reports.uri, head):
        found.rebuilt.append("head: older than one this machine read before: full listing")
        head = None
    configured = settings()
    if rebuild or full or head is None or started is None:
        found.listing = "full"
    elif fresh > 0 and started - head.watermark <= fresh:
        found.listing = "none"
        found.as_of = head.watermark
    elif head.passes + 1 >= configured.evidence_full_listing_every:
        found.listing = "full"
    elif started - head.watermark > MAX_INBOX_SPAN:
        found.listing = "full"  # fewer requests than a long run of partitions, and as sure
    else:
        found.listing = "inbox"
    order = ReportOrder(enrolled, memory or HeardReports.of(reports.uri))
    read_object = bulk_reader(reports)
    listed: dict[int, dict[str, tuple[int | None, float]]] = {}
    newest = 0.0
    if found.listing == "full":
        for obj in reports.iter_objects(f"{REPORTS_PREFIX}/"):
            stamp = stamp_of(obj.size, obj.modified)
            listed.setdefault(shard_of(obj.key), {})[obj.key] = stamp
            newest = max(newest, stamp[1])
            found.listed += 1
    if found.listing != "none" and started is not None:
        since = head.watermark if head is not None else started
        if found.listing == "full":  # notices only spare reads of reports listed anyway
            since = max(since, started - INBOX_PARTITION_SECONDS)
        skew = configured.evidence_skew_seconds
        for notice in _notices(reports, since - skew, started + skew):
            where, modified = report_key(notice[0]), notice[1]
            shard = listed.setdefault(shard_of(where), {})
            if found.listing == "full":
                size, at = shard.get(where, (None, 0.0))
                if size is not None and modified >= at:  # a notice of the report listed
                    shard[where] = (size, modified)
            else:
                shard[where] = (None, max(modified, shard.get(where, (None, 0.0))[1]))
            found.noticed += 1
    read_after = started if started is not None else newest
    key_stamp = enrolled.stamp if isinstance(enrolled, EnrolledKeys) else lambda _: None
    versions = [0] * SHARDS
    incomplete: list[int] = []

    def enrolled_fingerprint(report_key: str, kept: Record | None) -> str | None:
        """Looked up only where ``must_read`` compares it (a signed record), and only when
        the device's signed key bin changed since the record was folded: a lookup reads
        that bin."""
        device = key_device(report_key)
        if device is None or kept is None or kept.get("signature") is None:
            return None
        stamp = key_stamp(device)
        if stamp is not None and kept["signature"].get("keys") == stamp:
            known: str | None = kept["signature"]["key"]
            return known
        return device_key_fingerprint(enrolled.get(device))

    def one_shard(shard: int) -> tuple[bytes, int, bool, bool]:
        """The shard brought up to date and written back: its records of listed reports
        (as stored, gzip: a pass holds a few shards' records at a time, not the fleet's),
        how many reports it read, whether it wrote it, and whether it was there."""
        base, etag, stored, version, sealed = _read_shard(reports, shard, key, found)
        floor = head.versions[shard] if head is not None else 0
        if 0 <= version < floor:
            found.rebuilt.append(
                f"{shard_key(key, shard)}: version {version}, older than the head's "
                f"{floor} (an older shard put back, or removed)"
            )
        if version < floor:
            incomplete.append(shard)  # its reports are found by listing every key
        version = max(version, 0)
        keys = listed.get(shard, {})
        if found.listing == "full":
            records = {k: r for k, r in base.items() if k in keys}
            candidates = keys
        else:
            records = dict(base)
            candidates = dict(keys)
            for report_key, record in base.items():  # a key enrolled or revoked since
                signature = record.get("signature")
                fingerprint = enrolled_fingerprint(report_key, record)
                if signature is not None and signature["key"] != fingerprint:
                    candidates.setdefault(report_key, (None, record["stamp"][1]))
        read = 0
        for report_key, stamp in candidates.items():
            kept = base.get(report_key)
            fingerprint = enrolled_fingerprint(report_key, kept)
            if not (rebuild or must_read(kept, stamp, fingerprint, settle)):
                device = key_device(report_key)
                now_stamp = key_stamp(device) if device is not None else None
                if kept is not None and kept.get("signature") and now_stamp is not None:
                    signature = {**kept["signature"], "keys": now_stamp}  # the key, same
                    records[report_key] = {**kept, "signature": signature}
                continue
            read += 1
            got = _read_report(read_object, report_key, order)
            if got is None:  # removed since it was listed
                records.pop(report_key, None)
                continue
            heard, raw, size = got
            device = key_device(report_key)
            enrolled_key = enrolled.get(device) if device else None
            folded = (size if stamp[0] is None else stamp[0], stamp[1])
            records[report_key] = fold(
                heard,
                raw,
                folded,
                read_after,
                enrolled_key,
                key_stamp(device) if device else None,
            )
        written = False
        versions[shard] = version
        if records != base and write:
            records, written, stored, versions[shard], sealed = _write_shard(
                reports, shard, key, records, base, etag, max(version, floor), found
            )
        elif records != base:
            stored = sealed = None
        kept_records = {k: r for k, r in records.items() if found.listing != "full" or k in keys}
        if len(kept_records) != len(records):
            sealed = None
        if each_shard is not None:
            each_shard(shard, kept_records, sealed, written)
        if stored is None or len(kept_records) != len(records):
            stored = gzip.compress(b"\n" + json.dumps({"records": kept_records}).encode(), 1)
        return stored, read, written, etag is not None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for compact, read, written, existed in pool.map(one_shard, range(SHARDS)):
            found.compact.append(compact)
            found.reports_read += read
            found.shards_written += written
            found.shards_read += existed
    if found.listing != "full" and incomplete:
        again = update(
            reports,
            enrolled,
            memory,
            key=key,
            threads=threads,
            write=write,
            full=True,
            each_shard=each_shard,
        )
        again.rebuilt[:0] = found.rebuilt
        return again
    if write and started is not None and found.listing != "none" and not found.not_written:
        passes = 0 if found.listing == "full" else (head.passes + 1 if head else 0)
        mine = Head(watermark=started, passes=passes, versions=versions)
        _write_head(reports, key, mine, head_etag, found)
    return found


@dataclass
class Head:
    """What the index says of its passes (sealed beside its shards): the store's time at
    which the last complete pass started (every report listed or noticed before it is
    folded), how many passes since one listed every device's key, and each shard's version
    as a complete pass left it (a shard older than that was put back: a full listing)."""

    watermark: float
    passes: int
    versions: list[int]

    def merged(self, theirs: Head) -> Head:
        """This head, written over ``theirs`` (another complete pass's, written meanwhile)."""
        return Head(
            watermark=max(self.watermark, theirs.watermark),
            passes=min(self.passes, theirs.passes),
            versions=[max(a, b) for a, b in zip(self.versions, theirs.versions, strict=True)],
        )


HEAD_PLACE = -1
"""The head's place in ``seal`` (the shards' are 0 to SHARDS - 1)."""


def head_key(key: bytes) -> str:
    return f"{_index_folder(key)}/head.json"


def _read_head(reports: Store, key: bytes, found: IndexPass) -> tuple[Head | None, str | None]:
    """The index's head and its version; None (and the version, if there is one) when there
    is none or it does not verify (then named in ``found.rebuilt``)."""
    where = head_key(key)
    try:
        stored = reports.read(where)
    except DocumentTooLarge as exc:
        found.rebuilt.append(f"{where}: {exc}")
        return None, None
    if stored is None:
        return None, None
    try:
        body = unseal(HEAD_PLACE, stored.data, key)
        head = Head(
            watermark=float(body["watermark"]),
            passes=int(body["passes"]),
            versions=[int(v) for v in body["versions"]],
        )
        if len(head.versions) != SHARDS:
            raise ValueError(f"{len(head.versions)} shard versions, not {SHARDS}")
    except (ValueError, KeyError, TypeError) as exc:
        found.rebuilt.append(printable(f"{where}: {exc}"))
        return None, stored.etag
    return head, stored.etag


def _write_head(reports: Store, key: bytes, mine: Head, etag: str | None, found: IndexPass) -> None:
    """Write ``mine`` as the head by compare-and-swap, merged with one written meanwhile."""
    where = head_key(key)
    for _ in range(WRITE_ATTEMPTS):
        data = seal(HEAD_PLACE, vars(mine), key)
        try:
            if etag is None:
                reports.write(where, data, if_none_match=True)
            else:
                reports.write(where, data, if_match=etag)
        except PreconditionFailed:
            theirs, etag = _read_head(reports, key, IndexPass())
            if theirs is not None:
                mine = mine.merged(theirs)
            continue
        except StoreError as exc:
            found.not_written.append(printable(f"{where}: {exc}"))
            return
        _remember(key, reports.uri, mine.watermark)
        return
    found.not_written.append(f"{where}: lost the race {WRITE_ATTEMPTS} times")


def _seen_path(key: bytes, uri: str) -> Path:
    name = hashlib.sha256(_index_folder(key).encode() + b"\n" + uri.encode()).hexdigest()[:32]
    return settings().cache / "work" / "evidence-index-seen" / name


def _seen_later(key: bytes, uri: str, head: Head) -> bool:
    """Whether this machine wrote or read a head later than ``head`` (an older head and its
    shards put back together), remembering ``head``'s time otherwise."""
    path = _seen_path(key, uri)
    try:
        seen = float(path.read_text())
    except (OSError, ValueError):
        seen = 0.0
    if head.watermark < seen:
        return True
    _remember(key, uri, head.watermark)
    return False


def _remember(key: bytes, uri: str, watermark: float) -> None:
    with suppress(OSError):
        atomic_write_bytes(_seen_path(key, uri), repr(watermark).encode())


def _notices(reports: Store, start: float, end: float) -> Iterator[tuple[str, float]]:
    """(device id, the store's time of the notice) of every notice filed in the inbox
    partitions from the store time ``start`` to ``end``."""
    step = INBOX_PARTITION_SECONDS
    at = start - start % step
    while at <= end:
        partition = inbox_partition(datetime.fromtimestamp(at, timezone.utc))
        for obj in reports.iter_objects(f"{INBOX_PREFIX}/{partition}/"):
            device = inbox_device(obj.key)
            if device is not None and re.fullmatch(NAME_PATTERN, device):
                yield device, stamp_of(obj.size, obj.modified)[1]
        at += step


def _read_report(
    read: Callable[[str], Versioned | None], key: str, order: ReportOrder
) -> tuple[DeviceReport | Unattributed, DeviceReport | Unattributed, int] | None:
    """(heard, raw, size): the report at ``key`` (read with ``read``: the store's
    ``bulk_reader``) as the gate hears it (in its device's order), as the key holds it, and
    its size; None when it was removed since it was listed."""
    try:
        stored = read(key)
    except DocumentTooLarge as exc:
        raw: DeviceReport | Unattributed = Unattributed(key, "unreadable", str(exc))
        return order.counted(key, raw, None), raw, -1
    if stored is None:
        return None
    raw = attribute(key, stored.data, document_limit(key)[0])
    return order.counted(key, raw, stored.data), raw, len(stored.data)


def _store_clock(reports: Store, key: bytes) -> float | None:
    """The store's time now, as the modification time of an object written for this pass
    under a name of its own (a random nonce, so that neither another pass nor a writer of
    reports can put its time in this one's place), then removed; None when this reader
    cannot write the store. Clocks left by killed passes are removed after an hour."""
    folder = f"{_index_folder(key)}/clocks/"
    mine = folder + secrets.token_hex(16)
    try:
        reports.write(mine, b"the time a pass of the evidence index started\n")
        listed = reports.list_objects(folder)
    except StoreError as exc:
        logger.info("the evidence index cannot write the store (%s): read only", exc)
        return None
    started = next((stamp_of(o.size, o.modified)[1] for o in listed if o.key == mine), None)
    for leftover in listed:
        age = started - stamp_of(leftover.size, leftover.modified)[1] if started else 0.0
        if leftover.key == mine or age > CLOCK_LEFTOVER_SECONDS:
            try:
                reports.delete(leftover.key)
            except StoreError as exc:  # harmless: a clock object is never read
                logger.info("the evidence index's clock %s stays: %s", leftover.key, exc)
    return started


def _read_shard(
    reports: Store, shard: int, key: bytes, found: IndexPass
) -> tuple[dict[str, Record], str | None, bytes | None, int, str | None]:
    """A shard's records, version token, bytes as stored, version number and seal (empty,
    None, None, 0 and None when there is none; empty, its token, None, -1 and None when it
    does not verify: then it is named in ``found.rebuilt``)."""
    where = shard_key(key, shard)
    try:
        stored = bulk_reader(reports)(where)
    except DocumentTooLarge as exc:
        found.rebuilt.append(f"{where}: {exc}")
        return {}, None, None, 0, None
    if stored is None:
        return {}, None, None, 0, None
    try:
        plain = gzip.decompress(stored.data)
        body = unseal(shard, plain, key)
        records: dict[str, Record] = body["records"]
        version = int(body.get("version", 0))
    except (ValueError, KeyError, TypeError, OSError, EOFError) as exc:
        found.rebuilt.append(printable(f"{where}: {exc}"))
        return {}, stored.etag, None, -1, None
    return records, stored.etag, stored.data, version, seal_of(plain)


def _write_shard(
    reports: Store,
    shard: int,
    key: bytes,
    records: dict[str, Record],
    base: dict[str, Record],
    etag: str | None,
    version: int,
    found: IndexPass,
) -> tuple[dict[str, Record], bool, bytes | None, int, str | None]:
    """Write ``records`` as the shard by compare-and-swap against ``etag`` (the version
    ``base`` was read at, numbered ``version``); on a lost race, apply this pass's changes
    to the shard written meanwhile and try again. The records written (or, when it cannot
    write, its own), whether they were, the bytes written, their version number and their
    seal."""
    where = shard_key(key, shard)
    changed = {k for k, r in records.items() if base.get(k) != r}
    ours = records
    for _ in range(WRITE_ATTEMPTS):
        body = {"records": records, "version": version + 1}
        plain = seal(shard, body, key)
        data = gzip.compress(plain, compresslevel=SHARD_COMPRESSION, mtime=0)
        try:
            if etag is None:
                reports.write(where, data, if_none_match=True)
            else:
                reports.write(where, data, if_match=etag)
        except PreconditionFailed:
            theirs, etag, _, version, _ = _read_shard(reports, shard, key, IndexPass())
            version = max(version, 0)
            records = merge(theirs, ours, base, changed)
            continue
        except StoreError as exc:
            found.not_written.append(printable(f"{where}: {exc}"))
            logger.warning("the evidence index's shard %s was not written: %s", where, exc)
            return ours, False, None, version, None
        return records, True, data, version + 1, seal_of(plain)
    found.not_written.append(f"{where}: lost the race {WRITE_ATTEMPTS} times")
    return ours, False, None, version, None
