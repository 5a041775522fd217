"""Resumable, verified downloads from a store onto a device.

An object is fetched in ``PARALLEL`` segments of at least ``SEGMENT`` bytes, all at
once, each a ranged GET written in place (one TCP stream rarely fills a fast link;
boto3's own ``download_file`` does the same with 8 MiB parts). Few large segments
rather than many small ones: every GET costs the server something (moto even reads the
whole object for each). What each segment holds is recorded beside the partial file,
so an interrupted download resumes where every segment stopped, in this sync or a later
one. Only when every byte is there is the file hashed and compared with the manifest's
size and sha256; a mismatch deletes it.

Retries on the device: one layer per kind of fault, never stacked.

- A request that fails before its body streams (connection refused, 5xx, throttling):
  botocore's own retries (standard mode, ``AWS_MAX_ATTEMPTS``; ``epfleet.stores.s3``).
- A connection that drops mid-body (``TransientStoreError`` from a segment): this
  module resumes the unfinished segments from their last byte, up to ``ATTEMPTS``
  rounds; past that the partial file and its record stay for the next sync.
- Bytes that do not verify after a resume: one fresh download (``Transfer.run``);
  bytes that do not verify from scratch fail the step, and the sync tries the next
  one (``epfleet.device.model_sync``).
- The ``device-sync`` flow's tasks have no Prefect retries on top of these
  (``tasks/sync.py``): the next scheduled sync is the retry.

Deadlines (``epfleet.limits``): every chunk of every segment counts against one
``TransferGuard`` for the whole object, so a store that trickles is aborted once the
download's rate over ``EPFLEET_RATE_WINDOW`` falls below ``EPFLEET_MIN_RATE``, and one
whose connection goes silent when the store's socket waits ``EPFLEET_STALL_TIMEOUT``
(``epfleet.stores.s3``); the sync's deadline (``EPFLEET_SYNC_DEADLINE``) stops it too.
None of these is resumed in the same sync (another round would wait as long again):
the partial file and its record stay for the next one.

Progress and resumption go to this module's logger (``epfleet.device.download``).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from epfleet.clock import SYSTEM_CLOCK, Clock
from epfleet.errors import IntegrityError, TransientStoreError
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_file
from epfleet.limits import DeadlineExceeded, TransferGuard, TransferTooSlow, current_deadline
from epfleet.stores import Store

MiB = 1 << 20
SEGMENT = 16 * MiB
PARALLEL = 4
ATTEMPTS = 3
PROGRESS_EVERY = 8 * MiB
REPORT_EVERY = 5.0  # seconds

logger = logging.getLogger(__name__)


class Transfer:
    def __init__(
        self,
        store: Store,
        key: str,
        sha256: str,
        size: int,
        part: Path,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store, self.key, self.sha256, self.size, self.part = store, key, sha256, size, part
        self.clock = clock
        """Times the stall, the rate and the progress lines (the sync's deadline has its own)."""
        self.segment = max(SEGMENT, -(-size // PARALLEL))
        self.segments = [(s, min(s + self.segment, size)) for s in range(0, size, self.segment)]
        self.progress = part.with_name(part.name + ".progress")
        self.moved = 0
        """Bytes this transfer moved, failed attempts included."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = clock.monotonic()
        self._reported = self._started
        self.done = self._resume()
        self._initial = sum(self.done)
        self.guard = TransferGuard(f"download of {key}", store.uri, clock=clock)

    def _resume(self) -> list[int]:
        """Bytes already held per segment. A download in several segments always has a
        progress record (written before its first byte); a partial file without one was
        written by a single stream, so it is a prefix (and verification catches the rest).
        A record that does not fit this object is not trusted: the partial file goes."""
        if self.progress.exists():
            try:
                record = json.loads(self.progress.read_text())
                done = [int(n) for n in record["done"]]
                fits = (record["size"], record["segment"]) == (self.size, self.segment)
                if fits and len(done) == len(self.segments) and self.part.exists():
                    return [
                        max(0, min(n, end - start))
                        for n, (start, end) in zip(done, self.segments, strict=True)
                    ]
            except (OSError, ValueError, KeyError, TypeError):
                pass
            self.progress.unlink(missing_ok=True)
            self.part.unlink(missing_ok=True)
            return [0] * len(self.segments)
        held = self.part.stat().st_size if self.part.exists() else 0
        if held > self.size:
            self.part.unlink(missing_ok=True)
            held = 0
        return [max(0, min(held - start, end - start)) for start, end in self.segments]

    def run(self) -> int:
        """Fetch what is missing, verify, and return the bytes moved. Raises
        TransientStoreError when the store stays unreachable (progress is kept) and
        IntegrityError when the bytes are not the manifest's (nothing is kept). Resumed
        bytes that do not verify get one fresh download."""
        resumed = sum(self.done) > 0
        deadline = current_deadline()
        if deadline is not None and deadline.passed():
            raise deadline.exceeded(f"download of {self.key} not started")
        self.guard = TransferGuard(f"download of {self.key}", self.store.uri, clock=self.clock)
        try:
            self._run_once()
        except IntegrityError:
            if not resumed:
                raise
            logger.info("%s: the resumed download did not verify; starting over", self.key)
            self.done = [0] * len(self.segments)
            self._run_once()
        return self.moved

    def _run_once(self) -> None:
        before = sum(self.done)
        fd = os.open(self.part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            if len(self.segments) > 1:
                self._save_progress(fd)  # before the first byte: see _resume
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    self._fetch_missing(fd)
                    break
                except (TransferTooSlow, DeadlineExceeded):
                    raise  # another round would wait as long again: the next sync resumes
                except TransientStoreError as exc:
                    if attempt == ATTEMPTS:
                        raise
                    logger.info("%s: %s; resuming (attempt %d)", self.key, exc, attempt + 1)
            os.fsync(fd)
        finally:
            self.moved += sum(self.done) - before
            if sum(self.done) < self.size and len(self.segments) > 1:
                self._save_progress(fd)
            os.close(fd)
        self.progress.unlink(missing_ok=True)
        got = sha256_file(self.part)
        if got != (self.sha256, self.size):
            self.part.unlink(missing_ok=True)
            raise IntegrityError(
                f"{self.store.uri}/{self.key} has sha256 {got[0]} ({got[1]} bytes), "
                f"the manifest says {self.sha256} ({self.size} bytes); not activated"
            )

    def _fetch_missing(self, fd: int) -> None:
        """Fetch every unfinished segment at once. A dropped connection ends its own segment
        (the caller retries what is missing); any other error, or Ctrl-C, stops the others
        at their next chunk. Every worker has stopped before this returns, so none writes to
        ``fd`` after it is closed."""
        todo = [i for i, (s, e) in enumerate(self.segments) if self.done[i] < e - s]
        if not todo:
            return
        self._stop.clear()
        pool = ThreadPoolExecutor(min(PARALLEL, len(todo)))
        try:
            dropped: list[TransientStoreError] = []
            # Each segment runs in a copy of this context: its log records stay those of the
            # Prefect run (or anything else in context) that started the download.
            fetches = [
                pool.submit(contextvars.copy_context().run, self._fetch_segment, fd, i)
                for i in todo
            ]
            for fetch in as_completed(fetches):
                error = fetch.exception()
                if isinstance(error, TransientStoreError):
                    dropped.append(error)
                elif error is not None:
                    raise error
            if dropped:  # a limit's error first: it is not worth another round
                limit = (e for e in dropped if isinstance(e, (TransferTooSlow, DeadlineExceeded)))
                raise next(limit, dropped[0])
        except BaseException:
            self._stop.set()
            raise
        finally:
            pool.shutdown(wait=True)

    def _fetch_segment(self, fd: int, index: int) -> None:
        start, end = self.segments[index]
        offset = start + self.done[index]
        saved = offset
        for chunk in self.store.read_range(self.key, offset, end):
            if self._stop.is_set():
                return
            self.guard.add(len(chunk))
            view = memoryview(chunk)[: end - offset]  # a server that ignores the range's end
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
                self.done[index] += written
            if len(self.segments) > 1 and offset - saved >= PROGRESS_EVERY:
                self._save_progress(fd)  # a crash loses at most this much of the segment
                saved = offset
                self._report()
            if offset >= end:
                break

    def _report(self) -> None:
        """A progress line every REPORT_EVERY seconds: large models take minutes on a slow
        link, and a device should not look hung."""
        now = self.clock.monotonic()
        with self._lock:
            if now - self._reported < REPORT_EVERY:
                return
            self._reported = now
        held = sum(self.done)
        rate = (held - self._initial) / max(now - self._started, 1e-3) / 1e6
        logger.info(
            "%s: %d%% (%.0f of %.0f MB, %.0f MB/s)",
            self.key,
            held * 100 // self.size,
            held / 1e6,
            self.size / 1e6,
            rate,
        )

    def _save_progress(self, fd: int) -> None:
        with self._lock:
            done = list(self.done)  # copied first: the fsync below covers these bytes
            os.fsync(fd)  # the record never claims bytes the disk may not have
            record = {"size": self.size, "segment": self.segment, "done": done}
            atomic_write_bytes(self.progress, json.dumps(record).encode())
