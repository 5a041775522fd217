"""Filling a (small, mounted) disk to a given free space, for full-disk tests."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until ``leave`` bytes are free (0: until a write fails)."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if leave:
            os.write(fd, b"\0" * (shutil.disk_usage(disk).free - leave))
            return
        for chunk in (1 << 20, 1 << 12):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
