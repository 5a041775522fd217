"""This machine's memory of the newest signed report heard from each enrolled device: one
file per device, ``<EPFLEET_CACHE>/work/heard-reports/<store>/<device id>``, holding the
report object's bytes as the store held them, written atomically.

The rollout gate and the field view keep what ``epfleet.fleet.evidence.rules.newest``
tells them to and count it in place of an older report put back under the device's key.
The memory is this machine's: a gate run elsewhere (another worker without this cache)
starts with none and counts what each key holds until it hears a newer signed report.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from epfleet.formats.manifest import NAME_PATTERN
from epfleet.fsutil import atomic_write_bytes
from epfleet.settings import settings


class HeardReports:
    """The newest signed reports heard from the devices of one store's reports."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def of(cls, reports_uri: str) -> HeardReports:
        """The memory of the reports at ``reports_uri`` in the worker cache (EPFLEET_CACHE)."""
        name = hashlib.sha256(reports_uri.encode()).hexdigest()[:32]
        return cls(settings().cache / "work" / "heard-reports" / name)

    def recall(self, device: str) -> bytes | None:
        """The report object remembered for ``device``; None when there is none."""
        try:
            return self._path(device).read_bytes()
        except FileNotFoundError:
            return None

    def remember(self, device: str, data: bytes) -> None:
        atomic_write_bytes(self._path(device), data)

    def _path(self, device: str) -> Path:
        if not re.fullmatch(NAME_PATTERN, device):  # enrolled ids match it: never a path
            raise ValueError(f"device id {device!r} is not a device id")
        return self.directory / device
