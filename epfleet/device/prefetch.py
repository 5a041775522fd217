"""The next model's download, fetched while this one is checked.

A first sync of many small models waits a round trip for each model's variant while
its CPU is idle, then checks the model (tens of milliseconds for a small one) while its
link is idle. ``Prefetch`` overlaps them: while one model is decided, checked and
activated, the files the next models' syncs are about to download (each one's plan's
first step, a published variant in one file: ``epfleet.device.model_sync.
first_download``) are downloaded into their partial files, ``DEPTH`` at a time, in
threads; each model's download step then finds the bytes there and only verifies them
(``epfleet.device.download`` resumes a partial download, and a whole one costs no
request). A model's sync starts once its own download ahead has ended. A failure ahead
is not reported: the step meets it again and says so. The bytes moved ahead count in
the report of the model they were for.
"""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import Future, ThreadPoolExecutor

from epfleet.device.cache import DeviceCache, ModelState
from epfleet.device.fetching import Fetcher
from epfleet.device.model_sync import first_download
from epfleet.device.policy import SyncPolicy
from epfleet.device.steps import Steps
from epfleet.formats.manifest import ArtifactRef, ModelEntry
from epfleet.limits import Deadline, within
from epfleet.stores import Store

logger = logging.getLogger(__name__)

MAX_BYTES = 64 << 20
"""Larger files are not downloaded ahead: their own step fetches them in parallel segments."""
DEPTH = 4
"""Downloads running ahead at most: a small model's check takes less than a round trip to
a far store, so one ahead would only move the wait (measured: 12 models, 200 ms a
request, 0.22 s a model either way)."""


class Prefetch:
    """Downloads ahead for one sync, ``DEPTH`` threads of its own, under its deadline."""

    def __init__(self, store: Store, cache: DeviceCache, deadline: Deadline) -> None:
        self._fetcher = Fetcher(store, cache, offline=False, clock=deadline.clock)
        self._deadline = deadline
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[str, Future[int]] = {}
        self._planned: set[str] = set()
        """Models whose first download was looked for (started or not)."""
        self._files: set[str] = set()
        """The sha256 of every file downloaded ahead."""

    def ahead_of(
        self,
        upcoming: list[tuple[str, ModelEntry, ModelState | None]],
        steps: Steps,
        policy: SyncPolicy,
    ) -> None:
        """Start downloading what the ``upcoming`` models' syncs (in order) will download
        first, as long as fewer than ``DEPTH`` downloads run ahead, when that is a small
        file. Only an optimisation: whatever goes wrong here, the model's own sync meets
        and reports."""
        for model, entry, mstate in upcoming:
            if len(self._ahead) >= DEPTH:
                return
            if model in self._planned:
                continue
            self._planned.add(model)
            try:
                artifact = first_download(steps, model, entry, mstate, policy)
            except Exception as exc:
                logger.debug("%s: nothing fetched ahead (%s)", model, exc)
                continue
            if artifact is None or artifact.size > MAX_BYTES or artifact.sha256 in self._files:
                continue  # (two models with the same file: one partial file, one download)
            self._files.add(artifact.sha256)
            self.start(model, artifact)

    def start(self, model: str, artifact: ArtifactRef) -> None:
        """Download ``artifact`` for ``model``'s coming sync."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(DEPTH, thread_name_prefix="epfleet-prefetch")
        context = contextvars.copy_context()  # its log records stay the sync's
        self._ahead[model] = self._pool.submit(context.run, self._fetch, artifact)

    def _fetch(self, artifact: ArtifactRef) -> int:
        try:
            with within(self._deadline):
                _, moved = self._fetcher.to_partial(artifact.uri, artifact.sha256, artifact.size)
        except Exception as exc:  # only an optimisation: the step meets it, and says so
            logger.debug("%s: not fetched ahead (%s)", artifact.uri, exc)
            return 0  # what a failed attempt moved is not counted (the step's is)
        logger.debug("%s: fetched ahead", artifact.uri)
        return moved

    def wait(self, model: str) -> int:
        """Wait for ``model``'s download ahead, if any, to end; the bytes it moved."""
        future = self._ahead.pop(model, None)
        return future.result() if future is not None else 0

    def close(self) -> None:
        """Cancel the downloads not started, wait for the others, stop the threads."""
        for future in self._ahead.values():
            future.cancel()
        for future in self._ahead.values():
            if not future.cancelled():
                future.result()
        self._ahead.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
