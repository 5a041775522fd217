"""Staged rollouts (pure): the policy a spec gives, the state a model's signed entry carries,
and which devices a rollout reaches.

When a publish replaces a model's published variants and the model has a rollout policy,
its entry keeps the variants they replace (``ModelEntry.previous``) beside a
``Rollout``: its id, a random salt, its stage and its state. Every device decides alone,
from the signed entry, whether it is in: a canary id always is; any other device is
when ``sha256(salt + device id)`` (as a number mod 10,000) falls below the stage's
percentage × 100. A device that is out runs the previous variants (``view``). The store
keeps no per-device state, and the entry is signed: whoever cannot sign can neither
widen nor narrow a rollout.

States: ``active`` (devices in the current stage take the new variants), ``halted``
(the stage is frozen: devices already in keep the new variants, none joins; the gate or
an operator halts a rollout whose evidence is bad), ``reverted`` (every device runs the
previous variants), ``complete`` (every device runs the new ones; the next publish drops
``previous``). A model's first publish is never staged: there is nothing to go back to.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

RolloutState = Literal["active", "halted", "reverted", "complete"]
BUCKETS = 10_000


MAX_MIN_HOURS = 8_760.0
"""The longest ``min_hours`` a stage may have: a year."""
MAX_MIN_REPORTS = 1_000_000
MAX_LATENCY_REGRESSION = 100.0
"""10,000 % slower: past this a ``max_latency_regression`` gates nothing."""
MAX_STAGES = 100
MAX_CANARIES = 10_000
DEVICE_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
"""What a device id is (``epfleet.device.reporting.device_id``): a canary id is one."""
DEVICE_ID_MAX_LENGTH = 100
DeviceId = Annotated[
    str, StringConstraints(pattern=DEVICE_ID_PATTERN, max_length=DEVICE_ID_MAX_LENGTH)
]


MAX_SHADOW_SAMPLES = 1_000


class ShadowPolicy(BaseModel):
    """A shadow run before a device in a stage switches: the candidate beside the active
    variant on the device's own inputs, judged by the model's verification bounds."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    samples: int = Field(
        ge=1,
        le=MAX_SHADOW_SAMPLES,
        description="Inputs to run both variants on (the app's, else the golden samples' "
        "inputs), at most 1,000",
    )
    max_outside_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of the member devices that ran a shadow run whose candidate fell "
        "outside the model's bounds, past which the gate halts the rollout (0 to 1; 0: any)",
    )


class RolloutPolicy(BaseModel):
    """How a model's new variants reach the fleet (the spec's ``rollout:``, at the top level
    or on a model), as the spec gives it and as a signed entry carries it: every number
    finite and in a range the gate can act on, canary ids device ids. The same bounds hold
    when a spec is loaded (refused with the field named) and when a manifest is read (an
    entry outside them, written by someone without the keys or by hand, is refused)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    stages: list[float] = Field(
        default_factory=lambda: [5.0, 25.0, 100.0],
        max_length=MAX_STAGES,
        description="Percentages of devices, in order; the last must be 100",
    )
    canary: list[DeviceId] = Field(
        default_factory=list,
        max_length=MAX_CANARIES,
        description="Device ids that take a new variant first (lower-case letters, digits, "
        "'.', '_' and '-', as EPFLEET_DEVICE_ID)",
    )
    min_reports: int = Field(
        default=5,
        ge=1,
        le=MAX_MIN_REPORTS,
        description="Member devices that must report on a stage before the gate advances it",
    )
    max_failure_rate: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Share of member devices whose sync or health check of the model failed, "
        "past which the gate halts the rollout (0 to 1)",
    )
    max_latency_regression: float = Field(
        default=0.25,
        ge=0,
        le=MAX_LATENCY_REGRESSION,
        description="How much slower (p50, as a fraction, up to 100) the new variants may run "
        "than the ones they replace, past which the gate halts the rollout",
    )
    min_hours: float = Field(
        default=1.0,
        ge=0,
        le=MAX_MIN_HOURS,
        description="Hours a stage lasts at least before the gate advances it (up to 8,760: "
        "a year)",
    )
    approval: bool = Field(
        default=False,
        description="Each stage past the first waits for a person to approve it in the "
        "Prefect UI (the rollout-gate flow pauses for input)",
    )
    authenticated_reports: bool = Field(
        default=False,
        exclude_if=lambda required: not required,  # off: a signed entry keeps its bytes
        description="The gate counts only reports signed by the device's enrolled key "
        "(epfleet device enroll; the device signs with EPFLEET_DEVICE_KEY)",
    )

    shadow: ShadowPolicy | None = Field(
        default=None,
        exclude_if=lambda shadow: shadow is None,  # none: a signed entry keeps its bytes
        description="Devices in a stage run the new variant beside the active one on their "
        "own inputs before they switch, and keep the active one when it answers outside the "
        "model's bounds",
    )

    @field_validator("stages")
    @classmethod
    def _stages(cls, stages: list[float]) -> list[float]:
        if not stages or stages[-1] != 100:
            raise ValueError(f"stages {stages}: the last stage must be 100 (every device)")
        if any(not 0 < s <= 100 for s in stages) or stages != sorted(set(stages)):
            raise ValueError(f"stages {stages}: percentages from 0 to 100, increasing")
        return stages


class Rollout(BaseModel):
    """A rollout in progress (or ended) of a model's new variants, as its signed entry
    carries it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[0-9a-f]{16}$")
    salt: str = Field(pattern=r"^[0-9a-f]{32}$", description="Decides which devices are in")
    policy: RolloutPolicy = Field(description="Its stages, canary devices and gates")
    stage: int = Field(ge=0, description="Index into the policy's stages")
    state: RolloutState = "active"
    started_at: datetime
    stage_started_at: datetime
    reason: str | None = Field(default=None, description="Why it was halted or reverted")

    @model_validator(mode="after")
    def _a_stage_of_its_policy(self) -> Rollout:
        if self.stage >= len(self.policy.stages):
            raise ValueError(
                f"stage {self.stage} is past the policy's {len(self.policy.stages)} stages"
            )
        return self

    @property
    def percent(self) -> float:
        return self.policy.stages[self.stage]

    @property
    def last_stage(self) -> bool:
        return self.stage == len(self.policy.stages) - 1


def bucket(salt: str, device_id: str) -> int:
    """The device's place, 0 to 9,999, in this rollout's order of devices."""
    digest = hashlib.sha256((salt + device_id).encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def is_member(rollout: Rollout, device_id: str) -> bool:
    """Whether the device runs the new variants (see the module's rules)."""
    if rollout.state == "reverted":
        return False
    if rollout.state == "complete":
        return True
    if device_id in rollout.policy.canary:
        return True
    return bucket(rollout.salt, device_id) < rollout.percent * (BUCKETS / 100)
