"""Shadow runs on canaries: before a device in a rollout's stage switches to the rollout's
candidate, it runs the candidate beside its active variant on inputs of its own, and keeps
the active variant when the candidate answers outside the model's bounds.

When: the model's signed entry has a rollout (active or halted) whose policy asks for
``shadow: {samples: N}``, the device is a member of its stage, the sync is about to
activate a variant other than the one it runs (the candidate, downloaded and health-checked
already), and it runs one. A fresh device (nothing active) has nothing to compare with.

Inputs: the app's, through the sync's hook (``ShadowInputs``: given the model's name and
N, the app returns its samples, arrays by input name, or the path of an ``.npz`` of them;
``inputs_directory`` reads ``<dir>/<model>.npz``, what ``epfleet sync --shadow-inputs``
uses), else the model's golden samples' inputs; at most N of them. They stay on the
device (the app's are written, when given as arrays, to the cache's scratch directory and
removed after the run): only the figures go into the report.

What is compared: the candidate's outputs against the active variant's on the same
inputs, by the candidate's own verification bounds as the health check applies them
(``epfleet.device.health.out_of_bounds``: its tolerance, never looser than the loosest
one, and its task metric where the spec names one). Both run in the sync's worker process,
killed past ``EPFLEET_HEALTH_TIMEOUT``. A candidate outside the bounds is not activated;
the record of the run (``ShadowRecord``, in the cache's state) keeps the sync from
downloading it again beside the same active variant while the rollout lasts, and every
report of the model says the run's figures while the rollout lasts (``reported``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epfleet.device.cache import ModelState
from epfleet.device.cache.state import ShadowRecord
from epfleet.formats.device_report import ShadowRun
from epfleet.formats.manifest import ModelEntry

ShadowInputs = Callable[[str, int], "Sequence[Mapping[str, Any]] | Path | None"]
"""The app's hook: (model, samples wanted) -> its inputs (arrays by input name, one dict
a sample), or the path of an ``.npz`` of them, or None (then the golden samples' inputs)."""

RUNNING = ("active", "halted")


@dataclass(frozen=True)
class ShadowAsk:
    """The shadow run a model's sync owes before it switches."""

    rollout: str
    samples: int
    inputs: ShadowInputs | None


def asked(entry: ModelEntry, mine: ModelEntry, inputs: ShadowInputs | None) -> ShadowAsk | None:
    """The shadow run the signed ``entry`` asks of this device (``mine``: the entry as the
    device runs it, ``entry`` itself when the rollout reaches it), or None."""
    rollout = entry.rollout
    if rollout is None or rollout.policy.shadow is None or rollout.state not in RUNNING:
        return None
    if mine is not entry:
        return None  # outside the stage: it runs the previous variants, nothing to switch to
    return ShadowAsk(rollout=rollout.id, samples=rollout.policy.shadow.samples, inputs=inputs)


def inputs_directory(root: Path) -> ShadowInputs:
    """The hook that reads a model's inputs from ``<root>/<model>.npz`` (arrays by input
    name; a leading axis holds several samples), None when there is no such file."""

    def inputs(model: str, samples: int) -> Path | None:
        path = root / f"{model}.npz"
        return path if path.is_file() else None

    return inputs


def rejected(entry: ModelEntry, mstate: ModelState) -> str | None:
    """The digest of the candidate a shadow run of this rollout (active or halted) found
    outside the bounds beside the variant still active, or None."""
    record, active, rollout = mstate.shadow, mstate.active, entry.rollout
    if record is None or rollout is None or rollout.state not in RUNNING or active is None:
        return None  # (a completed rollout: every device takes the new variants)
    if record.rollout != rollout.id or record.run.within or record.active != active.digest:
        return None
    return record.candidate


def reported(entry: ModelEntry, mstate: ModelState | None) -> ShadowRun | None:
    """The shadow run the model's report gives: the last one, while its rollout lasts."""
    record = mstate.shadow if mstate is not None else None
    if record is None or entry.rollout is None or record.rollout != entry.rollout.id:
        return None
    return record.run


def record(ask: ShadowAsk, candidate: str, active: str, run: ShadowRun) -> ShadowRecord:
    return ShadowRecord(rollout=ask.rollout, candidate=candidate, active=active, run=run)


def outside_reason(run: ShadowRun, why: str) -> str:
    """Why the device keeps its active variant, with the run's figures."""
    return (
        f"the shadow run of {run.candidate} beside {run.active} on {run.samples} "
        f"{'app' if run.inputs == 'app' else 'golden sample'} inputs found it outside the "
        f"model's bounds ({why}; candidate p50 {run.candidate_p50_ms:g} ms, active "
        f"{run.active_p50_ms:g} ms); kept {run.active}"
    )


def earlier(run: ShadowRun) -> str:
    """What an earlier sync's shadow run found, for the reason of a sync that keeps."""
    figures = []
    if run.max_rel_error is not None:
        figures.append(f"{run.max_rel_error:.2%} of range")
    if run.tolerance is not None:
        figures.append(f"tolerance {run.tolerance:.2%}")
    if run.metric is not None and run.metric_value is not None:
        figures.append(f"{run.metric} {run.metric_value:.4g}")
    return ", ".join([*figures, "found by an earlier sync"])


def within_reason(run: ShadowRun) -> str:
    error = f"{run.max_rel_error:.2%}" if run.max_rel_error is not None else "-"
    tolerance = f"{run.tolerance:.2%}" if run.tolerance is not None else "-"
    return (
        f"its shadow run beside {run.active} on {run.samples} "
        f"{'app' if run.inputs == 'app' else 'golden sample'} inputs agreed (max error "
        f"{error} of range, tolerance {tolerance}; p50 {run.candidate_p50_ms:g} ms against "
        f"{run.active_p50_ms:g} ms, {run.seconds:g} s)"
    )
