"""Where epfleet's log records go outside a Prefect run: ``epfleet: <message>`` on stderr.

epfleet's modules log to ``logging.getLogger(__name__)``; inside a Prefect run the
flows hand those records to the run's logs (``tasks/sync.py``). A command-line front
end calls ``log_to_stderr`` once, so that progress lines appear on stderr and stdout
carries only the result. ``CompileProgress`` shows each pair of ``epfleet compile`` as it
compiles, verifies and ends (``pair_progress`` is how the build tells it).
"""

from __future__ import annotations

import functools
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

PACKAGE_LOGGER = "epfleet"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (tests swap it), each line
    fitted to its width (``epfleet.text.output_width``)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)

    def format(self, record: logging.LogRecord) -> str:
        return _fitted(super().format(record))


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


def say(text: str) -> None:
    """Print a line of a command's progress on stderr, fitted to its width."""
    print(_fitted(text), file=sys.stderr, flush=True)


def _fitted(text: str) -> str:
    from epfleet.text import output_width, wrap

    return wrap(text, output_width(sys.stderr))


_pair_listeners: list[Callable[[str, str, bool], None]] = []


def pair_progress(label: str, what: str, *, final: bool = False) -> None:
    """Tell whatever shows the run's progress (``CompileProgress``) where pair ``label``
    (``model × target``) is: a phase under way (``verifying``), or with ``final`` how it
    ended (``verified ...``, ``failed verification: ...``)."""
    for listener in list(_pair_listeners):
        listener(label, what, final)


class CompileProgress:
    """Each pair's progress, on stderr: a line when it starts verifying (often the longest
    phase), a counted line with its outcome (``[3/12] m × t: verified ...``, ``failed
    verification: ...``, ``compile failed: ...``) and, on a terminal, a live line of the
    pairs still compiling or verifying with their seconds so far (redrawn each second).
    Off a terminal only the plain lines are written."""

    REFRESH_SECONDS = 1.0

    def __init__(self, compiles: list[tuple[str, Future[Any]]]) -> None:
        self._compiles = compiles
        self._lock = threading.Lock()
        self._finished: set[str] = set()
        self._running_since: dict[str, float] = {}
        self._verifying_since: dict[str, float] = {}
        self._live = sys.stderr.isatty()
        self._stop = threading.Event()
        self._drawn = False
        for label, future in compiles:
            future.add_done_callback(functools.partial(self._done, label))
        _pair_listeners.append(self._on_pair)
        self._thread: threading.Thread | None = None
        if self._live and compiles:
            self._thread = threading.Thread(target=self._redraw, name="epfleet-progress")
            self._thread.daemon = True
            self._thread.start()

    def _done(self, label: str, future: Future[Any]) -> None:
        """A compile ended: a failure is the pair's outcome; a success waits for it."""
        if future.cancelled() or future.exception() is None:
            return
        self._on_pair(
            label, f"compile failed: {' '.join(str(future.exception()).split())[:200]}", True
        )

    def _on_pair(self, label: str, what: str, final: bool) -> None:
        with self._lock:
            if label not in self._labels or label in self._finished:
                return
            if not final:
                self._verifying_since.setdefault(label, time.monotonic())
                self._write(_fitted(f"epfleet: {label}: {what}") + "\n")
                return
            self._finished.add(label)
            self._verifying_since.pop(label, None)
            count = f"[{len(self._finished)}/{len(self._compiles)}]"
            self._write(_fitted(f"epfleet: {count} {label}: {what}") + "\n")

    @functools.cached_property
    def _labels(self) -> frozenset[str]:
        return frozenset(label for label, _ in self._compiles)

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
                verifying = [f"{k} {now - t:.0f} s" for k, t in self._verifying_since.items()]
                phases = [f"compiling: {', '.join(running)}"] if running else []
                phases += [f"verifying: {', '.join(verifying)}"] if verifying else []
                if not phases:
                    if self._drawn:
                        self._write("")
                    continue
                width = shutil.get_terminal_size().columns - 1
                self._write(" · ".join(phases)[:width])
                self._drawn = True

    def close(self) -> None:
        """Stop redrawing and clear the live line."""
        if self._on_pair in _pair_listeners:
            _pair_listeners.remove(self._on_pair)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * self.REFRESH_SECONDS)
        with self._lock:
            if self._drawn:
                self._write("")
