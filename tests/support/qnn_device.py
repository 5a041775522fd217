"""A Snapdragon device's QNN validator on a host without an NPU: ``QnnDeviceEps`` is this
host's EPs (``discover``), except that QNN strings are judged by ``eps.qnn.validate`` for a
given ``HtpRuntime`` instead of by the plugin, whose validator refuses to judge on x86.

The double's rules are table-tested against the cases of the plugin's own unit tests and
against the strings its compiles write here (tests/eps/test_qnn_validator.py, which also
checks that the real validator still refuses this host, so the double is the only judge
there is here)."""

from __future__ import annotations

import eps
from epfleet.device.local_eps import LocalEps, discover, explained
from eps.base import Judgement, Verdict
from eps.qnn import HtpRuntime, validate

QNN = "QNNExecutionProvider"
RUNTIME_2_7 = (5, 51, 0), (2, 51, 0)
"""onnxruntime-qnn 2.7.0's HTP backend API and QAIRT SDK versions (its strings say so)."""


def htp_device(arch: int, vtcm_mb: int) -> HtpRuntime:
    """A device with onnxruntime-qnn 2.7.0 on an HTP of ``arch`` with ``vtcm_mb`` of VTCM."""
    backend_api, sdk = RUNTIME_2_7
    return HtpRuntime(arch=arch, vtcm_mb=vtcm_mb, backend_api=backend_api, sdk=sdk)


class QnnDeviceEps(LocalEps):
    def __init__(self, runtime: HtpRuntime, release: str | None = None) -> None:
        """``release``: the onnxruntime-qnn version the device says it runs (default:
        this host's)."""
        found = discover()
        assert QNN in found.devices, "the QNN plugin enumerates a device on this host"
        super().__init__(found.devices, found.absent)
        self.releases = {**found.releases, **({QNN: release} if release else {})}
        self.runtime = runtime

    def _judge(self, ep: str, compatibility_string: str) -> Judgement:
        if ep != QNN:
            return super()._judge(ep, compatibility_string)
        try:
            verdict = validate(compatibility_string, self.runtime)
        except ValueError as exc:
            return Judgement(Verdict.UNSUPPORTED, f"its validator refused the string: {exc}")
        answer = Judgement(
            verdict,
            f"QNN (HTP v{self.runtime.arch}, VTCM "
            f"{self.runtime.vtcm_mb} MB) answered {verdict.value}",
        )
        return explained(answer, eps.load(ep).explain_string(compatibility_string))
