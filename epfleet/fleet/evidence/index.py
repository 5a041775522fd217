"""The evidence index: what the rollout gate, the field view and runtime-watch read of the
device reports, kept in the reports' store and updated, not rebuilt, by each pass.

A pass (``update``) lists ``reports/devices/`` (one LIST per 1,000 reports), reads the
index's shards (``SHARDS`` of them, ``reports/evidence-index/<key id>/<nnn>``, gzip), reads
only the reports the listing shows changed since their record was folded
(``index_rules.must_read``), hears each as the gate hears it
(``report_reading.read_attributed``: the same attribution, order and limits as a full
read), folds it into its shard's records and writes back each shard it changed, by
compare-and-swap: a reader that loses the race re-reads the shard and applies its own
changes to the one written meanwhile (``index_rules.merge``). The answer is the records:
every listed report as the gate hears it (``heard``) and as runtime-watch reads it
(``readings``), restored from what the index keeps of them (``index_rules``).

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
import secrets
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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
    shard_of,
    stamp_of,
    unseal,
)
from epfleet.fleet.evidence.reading import READ_THREADS, ReportOrder
from epfleet.fleet.evidence.rules import Unattributed, attribute
from epfleet.formats.device_report import REPORTS_PREFIX, DeviceReport, key_device, signed_by
from epfleet.formats.manifest import DeviceKey
from epfleet.fsutil import atomic_write_bytes
from epfleet.settings import settings
from epfleet.stores import DocumentTooLarge, Store, document_limit
from epfleet.text import printable
from epfleet.trust.device_keys import EnrolledKeys

INDEX_PREFIX = "reports/evidence-index"
WRITE_ATTEMPTS = 10
CLOCK_LEFTOVER_SECONDS = 3600.0

logger = logging.getLogger(__name__)

Record = dict[str, Any]


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
    listed: int = 0
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
            if "report" in record:
                yield restore(record["report"])
            else:
                yield Unattributed(key, "unreadable", record["problem"])


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
    record: Record = {"stamp": list(stamp), "read_after": read_after}
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
) -> IndexPass:
    """One pass over the reports in ``reports`` (see the module): the index brought up to
    date with them, written back unless ``write`` is False, and the fleet's reports as it
    holds them. ``enrolled``: the devices' keys (the signed manifest's); ``memory``: this
    machine's memory of the newest signed reports (``heard_reports``). ``rebuild``: every
    report read again, the shards' records set aside."""
    key = key if key is not None else index_key()
    settle = index_rules.SETTLE_SECONDS if settle is None else settle
    started = _store_clock(reports, key) if write else None
    order = ReportOrder(enrolled, memory or HeardReports.of(reports.uri))
    found = IndexPass()
    listed: dict[int, dict[str, Stamp]] = {}
    newest = 0.0
    for obj in reports.iter_objects(f"{REPORTS_PREFIX}/"):
        stamp = stamp_of(obj.size, obj.modified)
        listed.setdefault(shard_of(obj.key), {})[obj.key] = stamp
        newest = max(newest, stamp[1])
        found.listed += 1
    read_after = started if started is not None else newest
    key_stamp = enrolled.stamp if isinstance(enrolled, EnrolledKeys) else lambda _: None

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
        base, etag, stored = _read_shard(reports, shard, key, found)
        keys = listed.get(shard, {})
        records = {k: r for k, r in base.items() if k in keys}
        read = 0
        for report_key, stamp in keys.items():
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
            got = _read_report(reports, report_key, order)
            if got is None:  # removed since it was listed
                records.pop(report_key, None)
                continue
            device = key_device(report_key)
            enrolled_key = enrolled.get(device) if device else None
            records[report_key] = fold(
                *got, stamp, read_after, enrolled_key, key_stamp(device) if device else None
            )
        written = False
        if records != base and write:
            records, written, stored = _write_shard(reports, shard, key, records, base, etag, found)
        elif records != base:
            stored = None
        if stored is None or any(k not in keys for k in records):
            kept_records = {k: r for k, r in records.items() if k in keys}
            stored = gzip.compress(b"\n" + json.dumps({"records": kept_records}).encode(), 1)
        return stored, read, written, etag is not None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for compact, read, written, existed in pool.map(one_shard, range(SHARDS)):
            found.compact.append(compact)
            found.reports_read += read
            found.shards_written += written
            found.shards_read += existed
    return found


def _read_report(
    reports: Store, key: str, order: ReportOrder
) -> tuple[DeviceReport | Unattributed, DeviceReport | Unattributed] | None:
    """(heard, raw): the report at ``key`` as the gate hears it (in its device's order) and
    as the key holds it; None when it was removed since it was listed."""
    try:
        stored = reports.read(key)
    except DocumentTooLarge as exc:
        raw: DeviceReport | Unattributed = Unattributed(key, "unreadable", str(exc))
        return order.counted(key, raw, None), raw
    if stored is None:
        return None
    raw = attribute(key, stored.data, document_limit(key)[0])
    return order.counted(key, raw, stored.data), raw


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
) -> tuple[dict[str, Record], str | None, bytes | None]:
    """A shard's records, version and bytes as stored (empty, None and None when there is
    none, or when it does not verify: then it is named in ``found.rebuilt``)."""
    where = shard_key(key, shard)
    try:
        stored = reports.read(where)
    except DocumentTooLarge as exc:
        found.rebuilt.append(f"{where}: {exc}")
        return {}, None, None
    if stored is None:
        return {}, None, None
    try:
        body = unseal(shard, gzip.decompress(stored.data), key)
        records: dict[str, Record] = body["records"]
    except (ValueError, KeyError, TypeError, OSError, EOFError) as exc:
        found.rebuilt.append(printable(f"{where}: {exc}"))
        return {}, stored.etag, None
    return records, stored.etag, stored.data


def _write_shard(
    reports: Store,
    shard: int,
    key: bytes,
    records: dict[str, Record],
    base: dict[str, Record],
    etag: str | None,
    found: IndexPass,
) -> tuple[dict[str, Record], bool, bytes | None]:
    """Write ``records`` as the shard by compare-and-swap against ``etag`` (the version
    ``base`` was read at); on a lost race, apply this pass's changes to the shard written
    meanwhile and try again. The records written (or, when it cannot write, its own),
    whether they were, and the bytes written."""
    where = shard_key(key, shard)
    changed = {k for k, r in records.items() if base.get(k) != r}
    ours = records
    for _ in range(WRITE_ATTEMPTS):
        data = gzip.compress(seal(shard, {"records": records}, key), compresslevel=6, mtime=0)
        try:
            if etag is None:
                reports.write(where, data, if_none_match=True)
            else:
                reports.write(where, data, if_match=etag)
        except PreconditionFailed:
            theirs, etag, _ = _read_shard(reports, shard, key, IndexPass())
            records = merge(theirs, ours, base, changed)
            continue
        except StoreError as exc:
            found.not_written.append(printable(f"{where}: {exc}"))
            logger.warning("the evidence index's shard %s was not written: %s", where, exc)
            return ours, False, None
        return records, True, data
    found.not_written.append(f"{where}: lost the race {WRITE_ATTEMPTS} times")
    return ours, False, None
