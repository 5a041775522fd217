"""Where epfleet's log records go outside a Prefect run: ``epfleet: <message>`` on stderr.

epfleet's modules log to ``logging.getLogger(__name__)``; inside a Prefect run the
flows hand those records to the run's logs (``tasks/sync.py``). A command-line front
end calls ``log_to_stderr`` once, so that progress lines appear on stderr and stdout
carries only the result. ``CompileProgress`` shows the compiles in flight of
``epfleet compile``.
"""

from __future__ import annotations

import functools
import logging
import shutil
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

PACKAGE_LOGGER = "epfleet"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def log_to_stderr(level: int = logging.INFO) -> None:
    """Print epfleet's records of ``level`` and above to stderr as ``epfleet: <message>``
    (idempotent). They no longer propagate to the root logger, so each line appears once
    even where Prefect's logging setup gave the root logger a console handler."""
    logger = logging.getLogger(PACKAGE_LOGGER)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("epfleet: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


class CompileProgress:
    """The compiles in flight, on stderr: a line as each one finishes and, on a terminal,
    a live line of those still compiling with their seconds so far (redrawn each second).
    Off a terminal only the plain lines are written."""

    REFRESH_SECONDS = 1.0

    def __init__(self, compiles: list[tuple[str, Future[Any]]]) -> None:
        self._compiles = compiles
        self._lock = threading.Lock()
        self._finished = 0
        self._running_since: dict[str, float] = {}
        self._live = sys.stderr.isatty()
        self._stop = threading.Event()
        self._drawn = False
        for label, future in compiles:
            future.add_done_callback(functools.partial(self._done, label))
        self._thread: threading.Thread | None = None
        if self._live and compiles:
            self._thread = threading.Thread(target=self._redraw, name="epfleet-progress")
            self._thread.daemon = True
            self._thread.start()

    def _done(self, label: str, future: Future[Any]) -> None:
        if future.cancelled():
            return
        error = future.exception()
        with self._lock:
            self._finished += 1
            what = (
                f"compiled in {future.result().seconds:.2f} s"
                if error is None
                else f"compile failed: {' '.join(str(error).split())[:200]}"
            )
            self._write(f"epfleet: [{self._finished}/{len(self._compiles)}] {label}: {what}\n")

    def _write(self, text: str) -> None:
        """Write ``text`` (under the lock), clearing the live line first."""
        if self._drawn:
            text = "\r\033[K" + text
            self._drawn = False
        sys.stderr.write(text)
        sys.stderr.flush()

    def _redraw(self) -> None:
        while not self._stop.wait(self.REFRESH_SECONDS):
            now = time.monotonic()
            running = []
            for label, future in self._compiles:
                if future.running():
                    since = self._running_since.setdefault(label, now)
                    running.append(f"{label} {now - since:.0f} s")
            with self._lock:
                if self._stop.is_set():
                    return
                if not running:
                    if self._drawn:
                        self._write("")
                    continue
                width = shutil.get_terminal_size().columns - 1
                self._write(f"compiling: {', '.join(running)}"[:width])
                self._drawn = True

    def close(self) -> None:
        """Stop redrawing and clear the live line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * self.REFRESH_SECONDS)
        with self._lock:
            if self._drawn:
                self._write("")
