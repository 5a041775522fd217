"""Where epfleet's log records go outside a Prefect run: ``epfleet: <message>`` on stderr.

epfleet's modules log to ``logging.getLogger(__name__)``; inside a Prefect run the
flows hand those records to the run's logs (``tasks/sync.py``). A command-line front
end calls ``log_to_stderr`` once, so that progress lines appear on stderr and stdout
carries only the result.
"""

from __future__ import annotations

import logging
import sys

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
