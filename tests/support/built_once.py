"""Test data built once per test run, also under pytest-xdist: the session's compiled
fleet (real compiles and verifications, in-process: ``tests.support.plain_fleet``) is built by
the first worker that needs it, and every other worker waits for it and reuses it."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]
) -> Path:
    """``build(directory)``'s result, built once per test run: under pytest-xdist, the first
    worker to ask builds it in a directory all workers share, and the others wait for it
    and reuse it (tests must not change it: they take copies, ``copy_with_keys``)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"built-{name}"
    shared.mkdir(exist_ok=True)
    with (shared / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the build holds it; the waiters block here
        done = shared / ".result"
        if not done.exists():
            done.write_text(str(build(shared)))
        return Path(done.read_text())


def copy_with_keys(store: Path, directory: Path) -> Path:
    """A copy of the local ``store`` in ``directory``, with the development keys its
    publisher made beside it (``<store>.dev-keys``), so that a later publish signs as the
    original's would. Its files are new (their times now, as a compile's would be)."""
    for beside in store.parent.glob(f"{store.name}*"):
        shutil.copytree(beside, directory / beside.name, symlinks=True, copy_function=shutil.copy)
    return directory / store.name
