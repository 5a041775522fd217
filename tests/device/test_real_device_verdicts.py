"""What a Snapdragon device does with the fleet's HTP variants, judged as its QNN validator
would judge them (``tests.support.qnn_device``: the plugin's rules for a device of a given
HTP arch, VTCM size and runtime; the plugin itself refuses to judge on this x86 host). The
variants are the test fleet's, compiled here by onnxruntime-qnn with their SoC's VTCM, and
the chosen one is downloaded, health-checked on this host's HTP backend and activated for
real."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.device.model_sync import considered, quantised_passed_over
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import SyncSession
from epfleet.formats.device_report import DeviceReport, ModelReport
from eps.base import Verdict
from eps.qnn import HtpRuntime
from tests.support.qnn_device import QNN, QnnDeviceEps, htp_device
from tests.support.synced_fleet import DEVICE, copy_store, read_manifest

pytestmark = pytest.mark.fast

MODELS = ["tiny-cls", "tiny-det"]


def sync_as(device: HtpRuntime, store: Path, cache: Path, **policy: object) -> DeviceReport:
    """One whole sync, as ``epfleet sync`` runs it, on a device with that HTP."""
    local = QnnDeviceEps(device)
    with SyncSession(str(store), cache, SyncPolicy(**policy), DEVICE, local=local) as session:  # type: ignore[arg-type]
        session.fetch_manifest()
        for model in session.wanted():
            session.sync_model(model)
        return session.finish()


def by_model(report: DeviceReport) -> dict[str, ModelReport]:
    return {m.model: m for m in report.models}


@pytest.fixture
def store(fleet_store: Path, tmp_path: Path) -> Path:
    """The fleet's HTP and CPU variants."""
    return copy_store(fleet_store, tmp_path / "store")


@pytest.fixture
def htp_store(htp_only_store: Path, tmp_path: Path) -> Path:
    """HTP variants only: this host's CPU variant, optimal here, would win over any HTP
    variant a Snapdragon judges prefer-recompilation, where it would be unsupported."""
    return copy_store(htp_only_store, tmp_path / "store")


def test_a_device_of_the_targets_arch_and_vtcm_activates_it_as_optimal(
    store: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "device"
    report = sync_as(htp_device(arch=73, vtcm_mb=8), store, cache)
    assert report.exit_code == 0
    for name, result in by_model(report).items():
        assert (result.action, result.target, result.ep, result.verdict) == (
            "downloaded",
            "sd8g2-htp",
            QNN,
            Verdict.OPTIMAL,
        ), name
        verdicts = {v.target: v.verdict for v in result.considered}
        assert verdicts["sd8g3-htp"] is Verdict.UNSUPPORTED  # v75: newer than the device
        assert result.profile is not None and result.profile.runs > 0  # ran on the HTP here
    again = sync_as(htp_device(arch=73, vtcm_mb=8), store, cache)
    assert [m.action for m in again.models] == ["kept", "kept"]
    assert again.models[0].bytes_downloaded == 0


def test_another_vtcm_activates_the_published_variant_without_a_local_build(
    htp_store: Path, tmp_path: Path
) -> None:
    """A device whose VTCM differs from the one the variant was built for judges it
    prefer-recompilation: it runs the fleet's verified variant, says why it is suboptimal,
    and builds nothing (recompiling is on, as by default)."""
    report = sync_as(htp_device(arch=73, vtcm_mb=16), htp_store, tmp_path / "device")
    assert report.exit_code == 0
    for name, result in by_model(report).items():
        assert (result.action, result.target, result.verdict) == (
            "downloaded",
            "sd8g2-htp",
            Verdict.PREFER_RECOMPILATION,
        ), name
        assert "built for HTP v73 SoC 43 with VTCM 8 MB by QNN SDK" in result.reason


def test_recompile_suboptimal_builds_locally_first_when_asked(
    htp_store: Path, tmp_path: Path
) -> None:
    """The old order, on request: this host builds for its CPU (QNN builds no local HTP
    variant without an NPU), and that build runs instead of the published HTP variant."""
    report = sync_as(
        htp_device(arch=73, vtcm_mb=16), htp_store, tmp_path / "device", recompile_suboptimal=True
    )
    assert {m.model: m.action for m in report.models} == dict.fromkeys(MODELS, "recompiled")
    assert all(m.ep == "CPUExecutionProvider" for m in report.models)


def test_a_binary_from_a_newer_runtime_is_refused(store: Path, tmp_path: Path) -> None:
    """A device on onnxruntime-qnn 2.5.0 (backend API 5.49.0) refuses 2.7.0's binaries,
    whatever its HTP: it takes the CPU variant."""
    older = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 49, 0), sdk=(2, 49, 40))
    report = sync_as(older, store, tmp_path / "device")
    for result in report.models:
        assert (result.action, result.target) == ("downloaded", "x86-cpu")
        verdicts = {v.target: v.verdict for v in result.considered if v.ep == QNN}
        assert set(verdicts.values()) == {Verdict.UNSUPPORTED}


def test_a_float_local_build_in_place_of_a_quantised_variant_says_so(store: Path) -> None:
    entry = read_manifest(store).models["tiny-cls"]
    quantised = entry.variants["sd8g2-htp"].model_copy(update={"precision": "w8a8"})
    entry = entry.model_copy(update={"variants": {**entry.variants, "sd8g2-htp": quantised}})
    judged = considered(QnnDeviceEps(htp_device(arch=73, vtcm_mb=16)), entry)
    assert quantised_passed_over(entry, judged, "fp32") == [
        "a local fp32 build runs in place of the fleet's verified quantised variant "
        "sd8g2-htp (w8a8)"
    ]
    assert quantised_passed_over(entry, judged, "w8a8") == []
    unsupported = considered(QnnDeviceEps(htp_device(arch=69, vtcm_mb=8)), entry)
    assert quantised_passed_over(entry, unsupported, "fp32") == []


def test_the_string_is_read_alike_where_ort_has_no_reader(
    fleet_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime 1.24 has no ``get_compatibility_info_from_model``: a device on it reads
    the string from the model's metadata, and gets what ORT's reader gets (every variant
    of the test fleet, HTP and CPU)."""
    import builtins

    from epfleet.device.steps import embedded_string

    variants = [
        (fleet_store / v.artifact.uri, v.ep, v.compatibility_string)
        for entry in read_manifest(fleet_store).models.values()
        for v in entry.variants.values()
        if v.artifact is not None
    ]
    by_ort = [embedded_string(path, ep) for path, ep, _ in variants]
    real_import = builtins.__import__
    refused: list[str] = []

    def without_the_reader(name: str, *args: object, **kwargs: object) -> object:
        fromlist = args[2] if len(args) > 2 else kwargs.get("fromlist")
        if name.endswith("_pybind_state") and "get_compatibility_info_from_model" in (
            fromlist or ()
        ):
            refused.append(name)
            raise ImportError("cannot import name 'get_compatibility_info_from_model'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", without_the_reader)
    by_metadata = [embedded_string(path, ep) for path, ep, _ in variants]
    assert len(variants) >= 6 and len(refused) == len(variants)
    assert by_metadata == by_ort == [string for _, _, string in variants]
