"""The execution providers this device has, and how they judge a compatibility string.

Discovery registers every plugin EP whose package is installed (through the
``eps`` registry), enumerates ``onnxruntime.get_ep_devices()`` and groups the
devices by EP. Judging needs only the string, never the model:

- an EP module that generates its own strings (CPU) judges them itself;
- otherwise ORT's validator, ``get_model_compatibility_for_ep_devices``, answers
  for this EP's devices. A validator that raises (QNN on a host without an NPU)
  means unsupported here, with ORT's reason (``NO_NPU`` in plain words where it wants
  an NPU this device does not have); EP_NOT_APPLICABLE means unknown,
  which is never treated as compatible.

QNN's validator segfaults in a process that has run a QNN compile (see
``eps/qnn.py``), so judging must happen in a process that compiles nothing: the
sync engine compiles and health-checks in a worker process.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import eps
from epfleet.formats.device_report import DeviceInfo
from eps.base import Judgement, MissingExtraError, NoDeviceError, Verdict

if TYPE_CHECKING:
    import onnxruntime


class LocalEps:
    def __init__(
        self, devices: dict[str, list[onnxruntime.OrtEpDevice]], absent: dict[str, str]
    ) -> None:
        self.devices = devices
        """EP name -> this machine's devices for it (only EPs with at least one)."""
        self.absent = absent
        """EP name -> why it cannot run here (package missing, library or device absent)."""
        self.releases: dict[str, str] = {}
        """EP name -> the version of its package here (the CPU EP's: onnxruntime's): which
        release of each EP this device runs, for preferring the variants built with it."""
        self._judged: dict[tuple[str, str], Judgement] = {}
        self._refused: dict[tuple[str, tuple[tuple[str, str], ...]], str | None] = {}

    def release(self, ep: str) -> str | None:
        """The version of ``ep``'s package on this device, or None when it is absent."""
        return self.releases.get(ep)

    def present(self, ep: str) -> bool:
        return ep in self.devices

    def describe(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
                ep=ep,
                type=d.device.type.name.lower(),
                vendor=d.device.vendor,
                vendor_id=d.device.vendor_id,
                device_id=d.device.device_id,
                ep_vendor=d.ep_vendor,
            )
            for ep, found in self.devices.items()
            for d in found
        ]

    def judge(self, ep: str, compatibility_string: str) -> Judgement:
        """This device's verdict on a variant of ``ep`` with that string (memoised: a
        manifest repeats strings across models)."""
        key = (ep, compatibility_string)
        judged = self._judged.get(key)
        if judged is None:
            judged = self._judged[key] = self._judge(ep, compatibility_string)
        return judged

    def refused_options(self, ep: str, provider_options: dict[str, str]) -> str | None:
        """Why this device's ``ep`` would not take a variant's published provider options
        (a key it does not know, a bad value), or None when it takes them or is absent
        (memoised: a fleet's variants of one target repeat their options)."""
        if ep not in self.devices:
            return None
        key = (ep, tuple(sorted(provider_options.items())))
        if key not in self._refused:
            self._refused[key] = self._refuse(ep, provider_options)
        return self._refused[key]

    def _refuse(self, ep: str, provider_options: dict[str, str]) -> str | None:
        try:
            eps.load(ep).check_options(provider_options)
        except ValueError as exc:
            return f"its provider_options are not accepted by {ep} here: {exc}"
        return None

    def _judge(self, ep: str, compatibility_string: str) -> Judgement:
        if ep not in self.devices:
            why = self.absent.get(ep, f"{ep} is not an execution provider epfleet knows")
            return Judgement(Verdict.UNSUPPORTED, f"{ep} cannot run here: {why}")
        module = eps.load(ep)
        own = module.judge(compatibility_string)
        if own is not None:
            return own
        judged = ort_judgement(self.devices[ep], ep, compatibility_string)
        return explained(judged, module.explain_string(compatibility_string))


def explained(judged: Judgement, built_for: str | None) -> Judgement:
    """A usable but suboptimal verdict says what the variant was built for: why the EP
    would rather it were rebuilt for this device."""
    if judged.verdict is not Verdict.PREFER_RECOMPILATION or built_for is None:
        return judged
    return Judgement(judged.verdict, f"{judged.reason}: {built_for}")


def ort_judgement(
    devices: list[onnxruntime.OrtEpDevice], ep: str, compatibility_string: str
) -> Judgement:
    from onnxruntime.capi._pybind_state import (
        OrtCompiledModelCompatibility,
        get_model_compatibility_for_ep_devices,
    )

    try:
        answer = get_model_compatibility_for_ep_devices(devices, compatibility_string)
    except RuntimeError as exc:
        if _wants_an_npu(exc) and not any(d.device.type.name == "NPU" for d in devices):
            return Judgement(Verdict.UNSUPPORTED, NO_NPU)
        return Judgement(Verdict.UNSUPPORTED, f"its validator refused this device: {exc}")
    verdicts = {
        OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL: Verdict.OPTIMAL,
        OrtCompiledModelCompatibility.EP_SUPPORTED_PREFER_RECOMPILATION: (
            Verdict.PREFER_RECOMPILATION
        ),
        OrtCompiledModelCompatibility.EP_UNSUPPORTED: Verdict.UNSUPPORTED,
    }
    verdict = verdicts.get(answer, Verdict.UNKNOWN)
    if verdict is Verdict.UNKNOWN:
        return Judgement(verdict, f"{ep} has no opinion on this string ({answer.name})")
    return Judgement(verdict, f"ORT: {ep} answered {answer.name}")


NO_NPU = "no NPU on this device"
"""The reason of a variant whose EP's validator takes only NPU devices, on a device with
none (QNN on a host without a Snapdragon NPU)."""


def _wants_an_npu(exc: RuntimeError) -> bool:
    """The validator refused the devices for not being NPUs: ORT's QNN plugin says
    "... only supports OrtHardwareDeviceType_NPU, but no OrtHardwareDeviceType_NPU is found
    in the `devices` argument"."""
    return "no OrtHardwareDeviceType_NPU is found" in str(exc)


def discover() -> LocalEps:
    """Register the installed plugin EPs and group this machine's devices by EP."""
    found: dict[str, list[onnxruntime.OrtEpDevice]] = {}
    absent: dict[str, str] = {}
    for ep in eps.known():
        module = eps.load(ep)
        try:
            devices = module.devices()
        except MissingExtraError as exc:
            absent[ep] = str(exc)
            continue
        except NoDeviceError as exc:
            absent[ep] = str(exc)
            continue
        if devices:
            found[ep] = devices
        else:
            absent[ep] = f"{ep} is installed but enumerates no device here"
    local = LocalEps(found, absent)
    identities = ep_identities()
    for ep in found:
        if ep in identities:
            local.releases[ep] = identities[ep]["version"]
    return local


@functools.cache
def ep_identities() -> dict[str, dict[str, str]]:
    """EP name -> its package and version, for every EP whose package is installed: read
    once a process, for device discovery and the report's package versions alike."""
    identities: dict[str, dict[str, str]] = {}
    for ep in eps.known():
        try:
            identities[ep] = eps.load(ep).build_identity()
        except MissingExtraError:
            continue
    return identities


def ep_versions() -> dict[str, str]:
    """Package -> version of ORT and of every installed EP package."""
    return {identity["package"]: identity["version"] for identity in ep_identities().values()}
