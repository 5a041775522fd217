"""What runtime-watch decides (pure: every fact it needs is passed in).

A published pair is *stale* when it was compiled with another ORT or EP package
version than the compile workers now have, and *missing* when the spec has it but
the manifest does not. Both are worth a compile. A pair that failed with the very
versions the workers still have would fail again (also one whose older build stays
published beside that failure, ``failed_build``): it is reported, not retried.

Device reports say which devices run a model on something the fleet did not publish
for them (a local build or the CPU fallback). Devices with the same EPs and hardware
form a *profile*; a profile is unserved for a model when no compile the watch can
start would help it: no target for its EPs, or targets whose published variants it
judges not optimal although they are current.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from functools import partial
from typing import Literal

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field

from epfleet.fleet.evidence.rules import made_at
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.field_ranking import hardware_profile
from epfleet.formats.manifest import Manifest
from epfleet.formats.spec import FleetSpec

PairStatus = Literal["current", "stale", "missing", "failing", "unknown"]
UNSERVED_ACTIONS = frozenset({"recompiled", "fallback"})


class Runtime(BaseModel):
    """The ORT and EP package versions the compile workers have (None: not installed)."""

    ort_version: str
    ep_versions: dict[str, str | None] = Field(description="EP name -> package version")
    ep_packages: dict[str, str | None] = Field(description="EP name -> package name")
    spec_releases: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="EP name -> the spec's runtimes that build its targets -> the release of "
        "its package each pins",
    )


class PairCheck(BaseModel):
    model: str
    target: str
    ep: str
    status: PairStatus
    reason: str

    @property
    def needs_compile(self) -> bool:
        return self.status in ("stale", "missing")


MAX_LISTED_DEVICES = 100
"""Devices an unserved profile names; it counts them all (a profile may be half a fleet)."""


class UnservedProfile(BaseModel):
    profile_id: str = Field(description="Stable short id of the EPs and hardware")
    label: str
    eps: list[str]
    devices: list[str] = Field(
        description=f"Ids of the devices with this profile (the first {MAX_LISTED_DEVICES})"
    )
    device_count: int = Field(default=0, description="How many devices have this profile")
    models: dict[str, str] = Field(description="Unserved model -> why")
    targets: list[str] = Field(description="Spec targets for these EPs (may be none)")


class WatchPlan(BaseModel):
    pairs: list[PairCheck]
    unserved: list[UnservedProfile]
    reports_read: int
    reports_skipped: list[str] = Field(default_factory=list)

    @property
    def to_compile(self) -> list[PairCheck]:
        return [p for p in self.pairs if p.needs_compile]

    def compile_subset(self) -> tuple[list[str], list[str]]:
        """The models and targets to pass fleet-compile: their pairs include every pair to
        compile; the others it plans as up to date."""
        todo = self.to_compile
        return sorted({p.model for p in todo}), sorted({p.target for p in todo})


def check_pairs(spec: FleetSpec, manifest: Manifest | None, runtime: Runtime) -> list[PairCheck]:
    checks = []
    for model, target in spec.pairs():
        entry = manifest.models.get(model.name) if manifest else None
        variant = entry.variants.get(target.name) if entry else None
        check = partial(PairCheck, model=model.name, target=target.name, ep=target.ep)
        if variant is None:
            checks.append(check(status="missing", reason="not in the manifest"))
            continue
        if target.work_pool:
            checks.append(
                check(
                    status="unknown",
                    reason=f"compiled on work pool {target.work_pool}: "
                    "its versions are not visible here",
                )
            )
            continue
        if target.runtime:
            checks.append(
                check(
                    status="current",
                    reason=f"built under the spec's runtime {target.runtime}: the workers' "
                    "own versions do not decide it",
                )
            )
            continue
        worker_ep = runtime.ep_versions.get(target.ep)
        if worker_ep is None:
            # A compile started from here could not build it: never trigger one.
            checks.append(check(status="unknown", reason=f"{target.ep} is not installed here"))
            continue
        newer = variant.failed_build
        if newer and (newer.ort_version, newer.ep_version) == (runtime.ort_version, worker_ep):
            reason = f"failed with these very versions (an older build stays): {newer.error}"
            checks.append(check(status="failing", reason=reason))
            continue
        changes = []
        if variant.ort_version != runtime.ort_version:
            changes.append(f"ORT {variant.ort_version} -> {runtime.ort_version}")
        if variant.ep_version != worker_ep:
            package = runtime.ep_packages.get(target.ep) or target.ep
            changes.append(f"{package} {variant.ep_version} -> {worker_ep}")
        if changes:
            was = "failed with" if variant.status == "failed" else "compiled with"
            checks.append(
                check(status="stale", reason=f"{was} older runtime: {', '.join(changes)}")
            )
        elif variant.status == "failed":
            checks.append(
                check(
                    status="failing",
                    reason=f"failed with these very versions: {variant.error or '?'}",
                )
            )
        else:
            checks.append(check(status="current", reason="compiled with the workers' versions"))
    return checks


def report_time(report: DeviceReport) -> datetime:
    """When the device made the report (``epfleet.fleet.evidence.rules.made_at``)."""
    return made_at(report.generated_at)


def profile_of(report: DeviceReport) -> tuple[str, str, list[str]]:
    """(id, label, EPs) of the device's EPs and hardware, the same for identical devices."""
    ident, label = hardware_profile(report.devices)
    return ident, label, sorted({d.ep for d in report.devices})


def find_unserved(
    reports: Iterable[DeviceReport],
    spec: FleetSpec,
    checks: list[PairCheck],
    runtime: Runtime,
    now: datetime,
    max_age: timedelta,
) -> tuple[list[UnservedProfile], int]:
    """Unserved profiles, and how many reports were old enough to be ignored (devices
    gone quiet). ``reports`` is consumed once, one report at a time: what is kept of
    them is the profiles, so a fleet's reports can be streamed through."""
    by_pair = {(c.model, c.target): c for c in checks}
    by_name = {t.name: t for t in spec.targets}
    profiles: dict[str, UnservedProfile] = {}
    quiet = 0
    for report in reports:
        if now - report_time(report) > max_age:
            quiet += 1
            continue
        counted = False
        ident, label, device_eps = profile_of(report)
        lacking = lacking_runtime(report, runtime)
        if lacking is not None:
            profile = profiles.setdefault(
                f"{ident}-{lacking[0]}",
                UnservedProfile(
                    profile_id=f"{ident}-{lacking[0]}",
                    label=f"{label}; {lacking[0]}",
                    eps=device_eps,
                    devices=[],
                    models={},
                    targets=[],
                ),
            )
            profile.device_count += 1
            if len(profile.devices) < MAX_LISTED_DEVICES:
                profile.devices.append(report.device_id)
            for model_report in report.models:
                profile.models.setdefault(model_report.model, lacking[1])
        hardware = {(d.ep, d.type) for d in report.devices}
        accelerators = {(ep, kind) for ep, kind in hardware if kind != "cpu"}
        for model_report in report.models:
            if model_report.action not in UNSERVED_ACTIONS:
                continue
            targets = [
                t.name
                for t in spec.targets
                if (t.ep, t.device_type) in hardware
                and (t.models is None or model_report.model in t.models)
            ]
            # A compile the watch starts may serve it: one for its accelerators, when it has
            # any (a pending CPU pair does not help a device whose NPU variant is refused).
            accelerated = [
                t for t in targets if (by_name[t].ep, by_name[t].device_type) in accelerators
            ]
            pending = [
                by_pair.get((model_report.model, t))
                for t in (accelerated if accelerators else targets)
            ]
            if any(check is not None and check.needs_compile for check in pending):
                continue
            reason = _unserved_reason(report, model_report.model, targets, spec, runtime)
            profile = profiles.setdefault(
                ident,
                UnservedProfile(
                    profile_id=ident,
                    label=label,
                    eps=device_eps,
                    devices=[],
                    models={},
                    targets=[],
                ),
            )
            if not counted:  # one report per device
                counted = True
                profile.device_count += 1
                if len(profile.devices) < MAX_LISTED_DEVICES:
                    profile.devices.append(report.device_id)
            profile.models.setdefault(model_report.model, reason)
            profile.targets = sorted(set(profile.targets) | set(targets))
    return list(profiles.values()), quiet


MAX_RELEASE_CHARS = 40


def readable_release(version: str) -> str:
    """A release a device reports, as a profile may name it: its PEP 440 form when it is
    one of at most ``MAX_RELEASE_CHARS`` characters, else ``an unreadable version`` (the
    device wrote the text: a forged one groups with every other forged one instead of
    naming a profile, an event or a log line of its own)."""
    try:
        normal = str(Version(version)) if len(version) <= MAX_RELEASE_CHARS else None
    except InvalidVersion:
        normal = None
    return (
        normal
        if normal is not None and len(normal) <= MAX_RELEASE_CHARS
        else "an unreadable version"
    )


def lacking_runtime(report: DeviceReport, runtime: Runtime) -> tuple[str, str] | None:
    """(the device's release, why) when the device runs a release of an EP that the spec
    builds under named runtimes, and none of them is that release; else None."""
    for ep in sorted({d.ep for d in report.devices}):
        releases = runtime.spec_releases.get(ep)
        package = runtime.ep_packages.get(ep)
        theirs = report.ep_packages.get(package) if package else None
        if not releases or theirs is None:
            continue
        theirs = readable_release(theirs)
        if theirs in {readable_release(release) for release in releases.values()}:
            continue
        named = ", ".join(f"{name}: {version}" for name, version in sorted(releases.items()))
        return (
            f"{package} {theirs}",
            f"runs {package} {theirs}, which none of the spec's runtimes builds with "
            f"({named}): add a runtime for it, or move the device to one of them",
        )
    return None


def _unserved_reason(
    report: DeviceReport, model: str, targets: list[str], spec: FleetSpec, runtime: Runtime
) -> str:
    accelerators = {(d.ep, d.type) for d in report.devices if d.type != "cpu"}
    by_name = {t.name: t for t in spec.targets}
    model_report = next(m for m in report.models if m.model == model)
    verdicts = sorted(
        {f"{v.target}: {v.verdict.value}" for v in model_report.considered if v.target in targets}
    )
    judged = f"published variants judged {'; '.join(verdicts) or 'not optimal'}"
    if not any((by_name[t].ep, by_name[t].device_type) in accelerators for t in targets):
        missing = ", ".join(f"{ep} {kind}" for ep, kind in sorted(accelerators)) or "its EPs"
        return f"no target in the spec for {missing}" + (f" ({judged})" if targets else "")
    newer = []
    for name in targets:
        package = runtime.ep_packages.get(by_name[name].ep)
        theirs = report.ep_packages.get(package) if package else None
        ours = runtime.ep_versions.get(by_name[name].ep)
        if theirs and ours and theirs != ours:
            newer.append(f"{package} {theirs} on the device, {ours} on the compile workers")
    if newer:
        judged += f" ({'; '.join(sorted(set(newer)))})"
    return judged + ": add a target for this hardware or upgrade the compile workers"
