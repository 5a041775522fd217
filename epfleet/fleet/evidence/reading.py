"""Device reports read from a store as a stream: many at a time, never all held at once.

A fleet has one report per device, a million for a large one: ``stream_reports`` reads
the keys it is given ``threads`` at a time and hands each report over as soon as it is
parsed, holding at most ``2 * threads`` of them (each within ``EPFLEET_MAX_DOCUMENT_BYTES``,
and within it once inflated), so that runtime-watch and gc keep what they make of the
reports (profiles, pins), not the reports. Reports are gzip-compressed JSON, or plain
JSON from older devices (``epfleet.formats.device_report.decode_report``).

Why a report cannot be used is an ``epfleet.fleet.evidence.rules.Unattributed`` (the one
kind of unusable report): as text, ``key: why``, its key and what it holds, which whoever
wrote it chose, made ``epfleet.text.printable`` (no escape sequence or line break reaches
a terminal or a log).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from itertools import islice
from typing import TypeVar

from epfleet.errors import BadInputError
from epfleet.fleet.evidence.heard_reports import HeardReports
from epfleet.fleet.evidence.rules import Unattributed, attribute, decoded, newest
from epfleet.formats.device_report import DeviceReport, key_device
from epfleet.formats.manifest import DeviceKey
from epfleet.settings import settings
from epfleet.stores import DocumentTooLarge, Store, document_limit, reports_store

T = TypeVar("T")
READ_THREADS = 16
MAX_LISTED_PROBLEMS = 100
"""Unreadable reports named one by one; past this many, only counted."""


def check_report_window(window: timedelta, what: str) -> None:
    """BadInputError when ``window`` (a retention or a maximum age of reports, named by
    ``what``) is shorter than the devices' heartbeat (``EPFLEET_REPORT_HEARTBEAT`` as set
    here): a device whose report has not changed uploads it only once per heartbeat, and
    would look gone (its variants unpinned, its profile unseen) between two uploads."""
    heartbeat = timedelta(seconds=settings().report_heartbeat)
    if window < heartbeat:
        raise BadInputError(
            f"{what} ({_days(window)}) is shorter than the devices' report heartbeat "
            f"EPFLEET_REPORT_HEARTBEAT ({_days(heartbeat)}): a device whose report has not "
            "changed uploads it once per heartbeat; make the window at least that long "
            "(twice is safer: a poll may come up to one sync interval late), or set "
            "EPFLEET_REPORT_HEARTBEAT here as the devices have it"
        )


def _days(span: timedelta) -> str:
    return f"{span.total_seconds() / 86400:g} days"


def read_report(
    store: Store, key: str, check: Callable[[DeviceReport], object]
) -> DeviceReport | Unattributed | None:
    """The report at ``key``; or why it cannot be used, ``check`` raising ValueError
    counting as a reason; None when it was removed since it was listed."""
    try:
        found = store.read(key)
    except DocumentTooLarge as exc:  # over EPFLEET_MAX_DOCUMENT_BYTES: one bad report
        return Unattributed(key, "unreadable", str(exc))
    if found is None:
        return None
    report = decoded(key, found.data, document_limit(key)[0])
    if isinstance(report, DeviceReport):
        try:
            check(report)
        except ValueError as exc:
            return Unattributed(key, "unreadable", str(exc))
    return report


def read_attributed(
    store: Store, key: str, order: ReportOrder | None = None
) -> DeviceReport | Unattributed | None:
    """The report at ``key`` as the rollout gate hears it (``evidence_rules.attribute``),
    or why not, in its device's order when ``order`` is given (``ReportOrder.counted``);
    None when it was removed since it was listed."""
    try:
        found = store.read(key)
    except DocumentTooLarge as exc:  # over EPFLEET_MAX_DOCUMENT_BYTES: one bad report
        heard: DeviceReport | Unattributed = Unattributed(key, "unreadable", str(exc))
        data = None
    else:
        if found is None:
            return None
        data = found.data
        heard = attribute(key, data, document_limit(key)[0])
    return order.counted(key, heard, data) if order is not None else heard


@dataclass(frozen=True)
class ReportOrder:
    """The enrolled devices' keys (the signed manifest's) and this machine's memory of the
    newest signed report heard from each: what puts a device's reports in order."""

    enrolled: Mapping[str, DeviceKey]
    memory: HeardReports

    def counted(
        self, key: str, heard: DeviceReport | Unattributed, data: bytes | None
    ) -> DeviceReport | Unattributed:
        """The report that counts for the device ``key`` names, ``heard`` from ``data``
        or the one remembered (``evidence_rules.newest``), remembering ``heard`` when it
        is the newest."""
        device = key_device(key)
        enrolled_key = self.enrolled.get(device) if device is not None else None
        if device is None or enrolled_key is None:
            return heard
        kept = self.memory.recall(device)
        remembered = attribute(key, kept, document_limit(key)[0]) if kept is not None else None
        chosen, remember = newest(heard, remembered, enrolled_key)
        if remember and data is not None:
            self.memory.remember(device, data)
        return chosen


def stream_attributed_reports(
    store: Store,
    keys: Iterable[str],
    *,
    threads: int = READ_THREADS,
    order: ReportOrder | None = None,
) -> Iterator[DeviceReport | Unattributed]:
    """Each report of ``keys`` as the rollout gate hears it (``read_attributed``, in its
    device's ``order`` when given), streamed as ``stream_reports`` streams them."""
    return _stream(store, keys, threads, lambda store, key: read_attributed(store, key, order))


def stream_reports(
    store: Store,
    keys: Iterable[str],
    *,
    threads: int = READ_THREADS,
    check: Callable[[DeviceReport], object] = lambda report: None,
) -> Iterator[DeviceReport | Unattributed]:
    """Each report of ``keys`` (an iterable, consumed as it goes), in their order, or why
    it cannot be used (see ``read_report``); reports removed since they were listed are
    left out. At most ``2 * threads`` reads are in flight or waiting to be taken."""
    return _stream(store, keys, threads, lambda store, key: read_report(store, key, check))


def _stream(
    store: Store, keys: Iterable[str], threads: int, read: Callable[[Store, str], T | None]
) -> Iterator[T]:
    window = 2 * threads
    pending: deque[Future[T | None]] = deque()
    key_iter = iter(keys)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for key in islice(key_iter, window):
            pending.append(pool.submit(read, store, key))
        while pending:
            result = pending.popleft().result()
            for more in islice(key_iter, 1):
                pending.append(pool.submit(read, store, more))
            if result is not None:
                yield result


class Problems:
    """Reports that could not be read: the first ``MAX_LISTED_PROBLEMS`` named, all counted."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.count = 0

    def add(self, problem: Unattributed) -> None:
        self.count += 1
        if len(self.listed) < MAX_LISTED_PROBLEMS:
            self.listed.append(str(problem))

    def summary(self) -> list[str]:
        """The named problems, and how many more there were."""
        more = self.count - len(self.listed)
        return self.listed + ([f"... and {more} more unreadable reports"] if more else [])


def reports_from(store: Store) -> Store:
    """Where the fleet's device reports are: the store EPFLEET_REPORT_TO names, where
    devices behind a read-only mirror send them, else ``store`` itself."""
    return reports_store(store, settings().report_to)
