"""Where things are: the repository root, for tests that read its files or run its code."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (holds ``epfleet/``, ``docs/``, ``examples/``, ``tests/``)."""
TESTS = REPO / "tests"
