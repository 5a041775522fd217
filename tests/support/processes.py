"""Finding a run's processes by a marker in their environment (its own cache directory)."""

from __future__ import annotations

from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker`` (the run's own cache)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and marker.encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
