"""Resumable, verified downloads from a store onto a device.

An object is fetched in ``PARALLEL`` segments of at least ``SEGMENT`` bytes, all at
once, each a ranged GET written in place (one TCP stream rarely fills a fast link;
boto3's own ``download_file`` does the same with 8 MiB parts). Few large segments
rather than many small ones: every GET costs the server something (moto even reads the
whole object for each). What each segment holds is recorded beside the partial file,
so an interrupted download resumes where every segment stopped, in this sync or a later
one. Only when every byte is there is the file hashed and compared with the manifest's
size and sha256; a mismatch deletes it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from epfleet.errors import IntegrityError, TransientStoreError
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_file
from epfleet.stores import Store

MiB = 1 << 20
SEGMENT = 16 * MiB
PARALLEL = 4
ATTEMPTS = 3


class Transfer:
    def __init__(
        self,
        store: Store,
        key: str,
        sha256: str,
        size: int,
        part: Path,
        log: Callable[[str], None],
    ) -> None:
        self.store, self.key, self.sha256, self.size, self.part = store, key, sha256, size, part
        self.log = log
        self.segment = max(SEGMENT, -(-size // PARALLEL))
        self.segments = [(s, min(s + self.segment, size)) for s in range(0, size, self.segment)]
        self.progress = part.with_name(part.name + ".progress")
        self.done = self._resume()
        self.moved = 0
        """Bytes this transfer moved, failed attempts included."""
        self._lock = threading.Lock()

    def _resume(self) -> list[int]:
        """Bytes already held per segment: from the progress record, or, without one, the
        partial file read as a prefix (a download that began sequentially)."""
        try:
            record = json.loads(self.progress.read_text())
            if record["size"] == self.size and record["segment"] == self.segment:
                return [int(n) for n in record["done"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        held = self.part.stat().st_size if self.part.exists() else 0
        if held > self.size:
            self.part.unlink()
            held = 0
        return [max(0, min(held - start, end - start)) for start, end in self.segments]

    def run(self) -> int:
        """Fetch what is missing, verify, and return the bytes moved. Raises
        TransientStoreError when the store stays unreachable (progress is kept) and
        IntegrityError when the bytes are not the manifest's (nothing is kept). Resumed
        bytes that do not verify (say, a record lost in a crash) get one fresh download."""
        resumed = sum(self.done) > 0
        try:
            return self._run_once()
        except IntegrityError:
            if not resumed:
                raise
            self.log(f"{self.key}: the resumed download did not verify; starting over")
            self.done = [0] * len(self.segments)
            moved = self.moved
            result = self._run_once()
            self.moved += moved
            return result

    def _run_once(self) -> int:
        before = sum(self.done)
        fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    self._fetch_missing(fd)
                    break
                except TransientStoreError as exc:
                    if attempt == ATTEMPTS:
                        raise
                    self.log(f"{self.key}: {exc}; resuming (attempt {attempt + 1})")
            os.fsync(fd)
        finally:
            self.moved = sum(self.done) - before
            if sum(self.done) < self.size:
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
        return self.moved

    def _fetch_missing(self, fd: int) -> None:
        todo = [i for i, (s, e) in enumerate(self.segments) if self.done[i] < e - s]
        if not todo:
            return
        with ThreadPoolExecutor(min(PARALLEL, len(todo))) as pool:
            fetches = [pool.submit(self._fetch_segment, fd, i) for i in todo]
            for fetch in fetches:  # every segment runs to its end or its error first
                fetch.result()

    def _fetch_segment(self, fd: int, index: int) -> None:
        start, end = self.segments[index]
        offset = start + self.done[index]
        for chunk in self.store.read_range(self.key, offset, end):
            chunk = chunk[: end - offset]  # a server that ignores the range's end
            os.pwrite(fd, chunk, offset)
            offset += len(chunk)
            self.done[index] += len(chunk)
            if offset >= end:
                break
        if len(self.segments) > 1:
            self._save_progress(fd)  # a crash from here on loses no finished segment

    def _save_progress(self, fd: int) -> None:
        with self._lock:
            os.fsync(fd)  # the record never claims bytes the disk may not have
            record = {"size": self.size, "segment": self.segment, "done": list(self.done)}
            atomic_write_bytes(self.progress, json.dumps(record).encode())
