"""Runs compiled and published without Prefect, kept to be recorded on a Prefect API later.

``epfleet compile`` with no Prefect API (no PREFECT_API_URL) and nothing that needs
Prefect to do the work compiles and publishes without it, and does not start Prefect's
temporary API (seconds of CPU, tens of seconds on a busy machine). What a fleet-compile
flow run needs to record that run (its plan and report: the flow's artifacts and variant
events are made from them) is kept here, one JSON file per run, in the worker cache, in
a directory of the store's (``EPFLEET_CACHE/work/kept-runs/<store>``, ``kept_dir``); the
next compile into that store that has a Prefect API records each as a fleet-compile flow
run on that API, then removes its file: a compile records its own store's runs, never
another's. The store is named by
its canonical URI (``Store.uri``), the same from any working directory. Runs kept before
runs were kept per store (files in ``work/kept-runs`` itself, ``from_before_stores``) are
never recorded: their records name the store as it was typed, often a path relative to a
working directory they do not name, so which store each is of cannot be told for sure; a
compile says so in one line, until they are removed. No Prefect import here.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from epfleet.fleet.runs.models import RunPlan, RunReport
from epfleet.fsutil import atomic_write_bytes, is_temp_name
from epfleet.hashing import store_dir_name
from epfleet.settings import settings

if TYPE_CHECKING:
    from epfleet.fleet.planning.plan import PlanInputs

FORMAT = 1
MAX_KEPT = 20
"""Runs kept at most: keeping one more drops the oldest (said in one line)."""
MAX_BYTES = 16 * 1024 * 1024
"""A run's record larger than this (a huge fleet's plan) is not kept (said in one line)."""


def kept_root() -> Path:
    return settings().cache / "work" / "kept-runs"


def kept_dir(store_uri: str) -> Path:
    """Where the runs compiled into the store at ``store_uri`` (canonical) are kept."""
    return kept_root() / store_dir_name(store_uri)


def from_before_stores() -> list[Path]:
    """The files of runs kept before runs were kept per store (in ``kept_root`` itself,
    claimed or not), by name; never recorded (see the module's docstring)."""
    try:
        entries = list(os.scandir(kept_root()))
    except OSError:
        return []
    return sorted(
        Path(e.path)
        for e in entries
        if e.name.endswith((".json", ".json" + CLAIMED))
        and not e.name.startswith(".")  # an atomic write's temporary file
        and e.is_file(follow_symlinks=False)
    )


@dataclass(frozen=True)
class KeptRun:
    path: Path
    kept_at: str
    inputs: PlanInputs
    workers: int
    plan: RunPlan
    report: RunReport


def keep(
    inputs: PlanInputs, workers: int, plan: RunPlan, report: RunReport
) -> tuple[Path, list[Path]]:
    """Keep this run's record (atomically) with its store's (``inputs`` name the store by
    its canonical URI): its file, and the oldest records of that store dropped to stay
    within ``MAX_KEPT``. ValueError when it is larger than ``MAX_BYTES``; OSError as the
    disk says."""
    spec, store, models, targets, force = inputs
    data = json.dumps(
        {
            "format": FORMAT,
            "kept_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "spec": spec,
            "store": store,
            "models": list(models),
            "targets": list(targets),
            "force": force,
            "workers": workers,
            "plan": plan.model_dump(mode="json"),
            "report": report.model_dump(mode="json"),
        }
    ).encode()
    if len(data) > MAX_BYTES:
        raise ValueError(f"its record is {len(data)} bytes, over {MAX_BYTES}")
    directory = kept_dir(store)
    dropped = []
    existing = pending(store)
    for old in existing[: max(0, len(existing) - MAX_KEPT + 1)]:
        old.unlink(missing_ok=True)
        dropped.append(old)
    # Named by time first, so that names sort oldest first.
    now = time.time_ns()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now // 10**9))
    name = f"{stamp}.{now % 10**9:09d}-{secrets.token_hex(4)}.json"
    path = directory / name
    atomic_write_bytes(path, data)
    return path, dropped


CLAIMED = ".recording"
"""A kept run's file being recorded by a command is renamed with this suffix, so that
two commands never record it twice; one a killed command left is pending again after
``STALE_CLAIM_SECONDS``."""
STALE_CLAIM_SECONDS = 3600.0


def pending(store_uri: str) -> list[Path]:
    """The files of the runs kept for the store at ``store_uri`` (canonical), oldest first
    (none when the directory is missing)."""
    try:
        entries = list(kept_dir(store_uri).iterdir())
    except OSError:
        return []
    now = time.time()
    kept = []
    for entry in entries:
        if entry.suffix == ".json" and not is_temp_name(entry.name):
            kept.append(entry)
        elif entry.suffix == CLAIMED:
            try:
                if now - entry.stat().st_mtime > STALE_CLAIM_SECONDS:
                    kept.append(entry)
            except OSError:
                continue
    return sorted(kept, key=lambda p: p.name)


def claim(path: Path) -> Path | None:
    """Take a kept run's file to record it: its new path, or None when another command
    took it first."""
    claimed = path if path.suffix == CLAIMED else path.with_name(path.name + CLAIMED)
    try:
        os.replace(path, claimed)
        os.utime(claimed)
    except FileNotFoundError:
        return None
    return claimed


def release(claimed: Path) -> None:
    """Give back a claimed file that was not recorded: pending again."""
    with suppress(OSError):
        os.replace(claimed, claimed.with_name(claimed.name.removesuffix(CLAIMED)))


def load(path: Path) -> KeptRun:
    """A kept run's record; ValueError (or OSError) when it cannot be read."""
    raw = json.loads(path.read_bytes())
    if raw.get("format") != FORMAT:
        raise ValueError(f"unknown record format {raw.get('format')!r}")
    inputs: PlanInputs = (  # (as ``epfleet.fleet.planning.plan.plan_inputs`` makes them)
        raw["spec"],
        raw["store"],
        tuple(raw["models"]),
        tuple(raw["targets"]),
        bool(raw["force"]),
    )
    return KeptRun(
        path=path,
        kept_at=raw["kept_at"],
        inputs=inputs,
        workers=int(raw["workers"]),
        plan=RunPlan.model_validate(raw["plan"]),
        report=RunReport.model_validate(raw["report"]),
    )
