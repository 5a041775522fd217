"""A model's field ranking: per hardware profile and runtime, its published variants in
the order devices of that kind measured them, fastest first.

A shared format: the rollout gate writes it (``epfleet.fleet.evidence.ranking_rules``) into the
store's signed metadata, a TUF target ``field/rankings/<model>/<n>`` in the bin of the
model's own ``models/<model>`` (``epfleet.fleet.evidence.rankings``,
``epfleet.trust.targets.ranking_target``), and the device reads it from there
(``epfleet.trust.client``) to order the variants it judged usable
(``epfleet.device.selection``). So this module imports only pydantic and epfleet's pure
modules.

A *hardware profile* is what runtime-watch calls one: the set of a device's EP devices
as its report lists them (EP, type, vendor id, device id), hashed (``hardware_profile``);
the *runtime* is its ORT release and EP packages' releases (``runtime_label``). A device
looks its own pair up (``ModelRanking.for_device``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from epfleet.formats.device_report import MAX_COUNT, MAX_MS, DeviceInfo

RANKING_TARGETS = "field/rankings/"
"""The TUF target path prefix of the rankings (``field/rankings/<model>/<n>``)."""
RANKED_MODELS = "field/ranked"
"""The TUF target listing the models that have a ranking: what a device wanting every
model reads before it loads any model's bin."""
RANKING_FORMAT = 1
MAX_LABEL = 4000
"""The longest hardware label or runtime a ranking carries (a report's longer ones vote
for nothing)."""


def hardware_profile(devices: Iterable[DeviceInfo]) -> tuple[str, str]:
    """(id, label) of a device's EPs and hardware, the same for identical devices."""
    parts = sorted({f"{d.ep}/{d.type}/{d.vendor_id:#06x}:{d.device_id:#06x}" for d in devices})
    ident = hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
    return ident, ", ".join(parts) or "no EP devices"


def runtime_label(ort_version: str, ep_packages: Mapping[str, str]) -> str:
    """The runtime a device runs: its ORT version and its EP packages' versions."""
    packages = sorted((p, v) for p, v in ep_packages.items() if p != "onnxruntime")
    return ", ".join([f"ORT {ort_version}", *(f"{p} {v}" for p, v in packages)])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class Measured(_Strict):
    """One variant's field latency on a profile."""

    target: str = Field(description="A target of the model's signed entry")
    devices: int = Field(ge=1, le=MAX_COUNT, description="Distinct devices that reported it")
    p50_ms: float = Field(ge=0, le=MAX_MS, description="The median of their median runs")


class ProfileRanking(_Strict):
    profile: str = Field(max_length=64, description="The hardware profile's id")
    hardware: str = Field(max_length=MAX_LABEL, description="Its EP devices, as reports list them")
    runtime: str = Field(max_length=MAX_LABEL)
    order: list[Measured] = Field(
        min_length=2, max_length=1000, description="The measured variants, fastest first"
    )
    slower_than_cpu: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="Accelerator variants measured slower than this profile's fastest CPU "
        "variant: placed after it, never preferred to it here",
    )

    @property
    def targets(self) -> list[str]:
        return [m.target for m in self.order]


class ModelRanking(_Strict):
    format: int = Field(default=RANKING_FORMAT, ge=1, le=RANKING_FORMAT)
    model: str
    min_devices: int = Field(ge=1, le=MAX_COUNT, description="Devices a variant needed")
    profiles: list[ProfileRanking]

    def for_device(self, profile: str, runtime: str) -> ProfileRanking | None:
        """The ranking of a device of ``profile`` running ``runtime``; None: none measured."""
        return next(
            (p for p in self.profiles if p.profile == profile and p.runtime == runtime), None
        )
