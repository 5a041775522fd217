"""Functions a worker process runs in tests/runtime/test_progress_output.py (importable by the
spawned worker, which cannot unpickle a test module's local functions)."""

from __future__ import annotations

import os


def write_like_qnn(_: object) -> str:
    """What QNN's libraries do at load, then a real error, at the fd level."""
    os.write(1, b" # LIBNATIVE: No alternate configuration present - using defaults.\n")
    os.write(2, b"real native error: something broke\n")
    os.write(2, b" # LIBNATIVE: config file detected - enabling thread local storage\n")
    return "done"


def write_then_die(_: object) -> None:
    """A real error written just before the process aborts in native code."""
    os.write(2, b"last words before the abort\n")
    os.abort()
