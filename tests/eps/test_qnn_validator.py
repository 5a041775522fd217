"""QNN's compatibility rules as ``eps.qnn`` restates them, the VTCM every HTP target compiles
with, and the double that judges QNN strings as a Snapdragon device would
(``tests.support.qnn_device``).

The plugin's validator refuses to judge on this x86 host (it wants an NPU device), so the
rules are checked against the cases of the plugin's own unit tests
(``onnxruntime/test/providers/qnn/qnn_ep_context_test.cc``, ``ModelCompatibility_ApiValidate*``,
disabled there for want of a public API) and against the strings its compiles write here."""

from __future__ import annotations

from pathlib import Path

import pytest

import eps
from epfleet.device.local_eps import NO_NPU, discover, ort_judgement
from epfleet.errors import BadInputError
from epfleet.formats.spec_file import parse_spec
from eps.base import Verdict
from eps.qnn import HtpRuntime, QnnString, validate
from tests.support.qnn_device import QnnDeviceEps, htp_device
from tests.support.synced_fleet import read_manifest

pytestmark = pytest.mark.fast

V = Verdict
QNN = "QNNExecutionProvider"
DEVICE = htp_device(arch=75, vtcm_mb=8)
"""onnxruntime-qnn 2.7.0 (backend API 5.51.0, SDK 2.51.0) on an HTP v75 with 8 MB of VTCM."""


def v1(
    backend: int = 6,
    sdk: str = "2.51.0",
    api: str = "5.51.0",
    blob: str = "3.4.0",
    arch: int = 0,
    user_driver: bool = False,
) -> str:
    """A V1 string as the plugin's tests write one (``CompatibilityTestInfo::ToString``),
    its defaults the runtime's own versions and arch 0."""
    return f"{backend}:{sdk}:{api}:{blob}:{arch}:{int(user_driver)}"


def v2(
    arch: str = "75",
    soc: str = "57",
    vtcm: str = "8",
    api: str = "5.51.0",
    sdk: str = "2.51.0",
    backend: int = 6,
    user_driver: bool = False,
) -> str:
    return f"v2:{backend}:{sdk}:{api}:{arch}:{soc}:{vtcm}:{int(user_driver)}"


USER_DRIVER_DEVICE = HtpRuntime(
    arch=75, vtcm_mb=8, backend_api=(5, 51, 0), sdk=(2, 51, 0), user_driver=True
)


@pytest.mark.parametrize(
    ("case", "string", "device", "expected"),
    [
        ("ApiValidate", v1(arch=75), DEVICE, V.OPTIMAL),
        ("ApiValidate_DiffBackend", v1(backend=3, arch=75), DEVICE, V.UNSUPPORTED),
        ("CbTradRtTrad_CbNewApiVersion", v1(api="9999.9999.9999"), DEVICE, V.UNSUPPORTED),
        (
            "CbTradRtHnrd_CbNewSdkVersion",
            v1(sdk="9999.9999.9999"),
            USER_DRIVER_DEVICE,
            V.UNSUPPORTED,
        ),
        (
            "CbHnrdRtHnrd_CbNewSdkVersion",
            v1(sdk="9999.9999.9999", user_driver=True),
            USER_DRIVER_DEVICE,
            V.UNSUPPORTED,
        ),
        ("CbHnrdRtTrad", v1(arch=75, user_driver=True), DEVICE, V.UNSUPPORTED),
        ("CbOldHtpArch", v1(arch=0), DEVICE, V.PREFER_RECOMPILATION),
        ("CbNewHtpArch", v1(arch=9999), DEVICE, V.UNSUPPORTED),
        # The plugin's CbNewBlobVersion cases expect "unsupported", written when the context
        # blob version was compared; its validator no longer reads it (a comment there says
        # the backend API version covers it), so the arch decides, as in CbOldHtpArch.
        (
            "CbTradRtTrad_CbNewBlobVersion",
            v1(blob="9999.9999.9999"),
            DEVICE,
            V.PREFER_RECOMPILATION,
        ),
    ],
)
def test_v1_strings_follow_the_plugins_own_cases(
    case: str, string: str, device: HtpRuntime, expected: Verdict
) -> None:
    assert validate(string, device) is expected, case


@pytest.mark.parametrize(
    ("string", "expected", "why"),
    [
        (v2(), V.OPTIMAL, "same arch and VTCM"),
        (v2(vtcm="0"), V.PREFER_RECOMPILATION, "compiled without vtcm_mb: never optimal"),
        (v2(vtcm="4"), V.PREFER_RECOMPILATION, "less VTCM than the device has"),
        (v2(vtcm="16"), V.UNSUPPORTED, "more VTCM than the device has"),
        (v2(arch="79", soc="69"), V.UNSUPPORTED, "a newer arch"),
        (v2(arch="73", soc="43"), V.PREFER_RECOMPILATION, "an older v7x arch"),
        (v2(arch="69", soc="36"), V.UNSUPPORTED, "v6x on a v7x device"),
        (v2(api="5.52.0"), V.UNSUPPORTED, "a newer backend API than the device's"),
        (v2(api="5.49.0", sdk="2.49.40"), V.OPTIMAL, "an older runtime's binary"),
        (v2(arch="73,75", soc="43,57", vtcm="8,8"), V.OPTIMAL, "the best of several archs"),
        (v2(arch="79,73", soc="69,43", vtcm="8,8"), V.PREFER_RECOMPILATION, "one arch usable"),
        (v2(backend=4), V.UNSUPPORTED, "another backend"),
        (v2(user_driver=True), V.UNSUPPORTED, "a user-driver binary on the traditional path"),
    ],
)
def test_v2_strings(string: str, expected: Verdict, why: str) -> None:
    assert validate(string, DEVICE) is expected, why


def test_v6x_binaries_still_run_on_v6x_devices() -> None:
    v69 = htp_device(arch=69, vtcm_mb=8)
    assert validate(v2(arch="69", soc="36"), v69) is V.OPTIMAL
    assert validate(v2(arch="68", soc="35", vtcm="2"), v69) is V.PREFER_RECOMPILATION


@pytest.mark.parametrize(
    ("string", "message"),
    [
        ("v2:6:2.51.0:5.51.0:75:57:8", "has 8 fields"),
        ("v2:6:2.51.0:5.51.0:73,75:57:8,8:0", "differ in count"),
        ("v3:6:2.51.0:5.51.0:75:57:8:0", "unknown QNN string version"),
        ("v2:6:2.51:5.51.0:75:57:8:0", "major.minor.patch"),
        ("v2:6:2.51.0:5.51.0:75:57:eight:0", "not a number"),
        ("6:2.47.0:5.47.0:0.0.0:73", "has 6 fields"),
    ],
)
def test_malformed_strings_are_refused(string: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(string, DEVICE)


def test_the_strings_this_hosts_compiles_write_carry_their_socs_vtcm(fleet_store: Path) -> None:
    """The test fleet's HTP variants, compiled here by onnxruntime-qnn: each string names
    its SoC's VTCM (8 MB for SM8650 and SM8550), so a device of that arch and VTCM judges it
    optimal; the plugin itself refuses to judge on this host."""
    manifest = read_manifest(fleet_store)
    expected = {"sd8g3-htp": (75, 57), "sd8g2-htp": (73, 43)}
    local = discover()
    for entry in manifest.models.values():
        for target, (arch, soc) in expected.items():
            variant = entry.variants[target]
            assert variant.compatibility_string is not None
            assert variant.provider_options["vtcm_mb"] == "8"
            parsed = QnnString.parse(variant.compatibility_string)
            assert (parsed.archs, parsed.soc_models, parsed.vtcm_mbs) == ((arch,), (soc,), (8,))
            assert variant.compatibility_string.endswith(f":{arch}:{soc}:8:0")
            assert validate(variant.compatibility_string, htp_device(arch, 8)) is V.OPTIMAL
            assert validate(variant.compatibility_string, htp_device(arch, 16)) is (
                V.PREFER_RECOMPILATION
            )
            real = ort_judgement(local.devices[QNN], QNN, variant.compatibility_string)
            assert real.verdict is V.UNSUPPORTED and real.reason == NO_NPU


def test_the_double_explains_a_prefer_recompilation_verdict() -> None:
    judged = QnnDeviceEps(htp_device(arch=75, vtcm_mb=16)).judge(QNN, v2())
    assert judged.verdict is V.PREFER_RECOMPILATION
    assert judged.reason.endswith("built for HTP v75 SoC 57 with VTCM 8 MB by QNN SDK 2.51.0")
    unset = QnnDeviceEps(DEVICE).judge(QNN, v2(vtcm="0"))
    assert "VTCM 0 (compiled without vtcm_mb)" in unset.reason


# --- the VTCM an HTP target compiles with ---

QNN_EP = eps.load(QNN)
HTP = {"backend_type": "htp", "enable_htp_fp16_precision": "1"}


@pytest.mark.parametrize(
    ("options", "vtcm"),
    [
        ({"htp_arch": "75", "soc_model": "57"}, "8"),  # SM8650
        ({"htp_arch": "73", "soc_model": "60"}, "8"),  # SC8380XP
        ({"htp_arch": "68"}, "2"),  # the arch's reference SoC, SM7325
        ({"htp_arch": "81", "soc_model": "72"}, "16"),  # SA8797
        ({"htp_arch": "75", "soc_model": "57", "vtcm_mb": "4"}, "4"),  # the target's own
    ],
)
def test_an_htp_target_compiles_with_its_socs_vtcm(options: dict[str, str], vtcm: str) -> None:
    built = QNN_EP.with_precision(
        "fp16" if options["htp_arch"] != "68" else "w8a8", {**HTP, **options}
    )
    assert built["vtcm_mb"] == vtcm


def test_a_target_whose_socs_vtcm_is_unknown_is_refused_naming_the_option() -> None:
    target = {
        "name": "mystery",
        "ep": QNN,
        "provider_options": {**HTP, "htp_arch": 75, "soc_model": 99},
    }
    spec = {"models": [{"name": "m", "source": "m.onnx"}], "targets": [target]}
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec)
    message = str(raised.value)
    assert "targets[mystery]: provider_options.vtcm_mb: the VTCM size of SoC 99" in message
    assert "is not known to epfleet; set vtcm_mb" in message
    target["provider_options"] = {**HTP, "htp_arch": 75, "soc_model": 99, "vtcm_mb": 8}
    assert parse_spec(spec).targets[0].provider_options["vtcm_mb"] == "8"


@pytest.mark.parametrize(
    ("vtcm", "message"),
    [("16", "more than SoC 57's VTCM \\(8 MB\\)"), ("0", "must be the VTCM size in MB")],
)
def test_a_vtcm_no_device_takes_is_refused(vtcm: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QNN_EP.check_options({**HTP, "htp_arch": "75", "soc_model": "57", "vtcm_mb": vtcm})


def test_a_target_that_names_no_soc_is_told_how_to_name_one() -> None:
    target = {"name": "bare", "ep": QNN}
    with pytest.raises(BadInputError) as raised:
        parse_spec({"models": [{"name": "m", "source": "m.onnx"}], "targets": [target]})
    assert "the target names no SoC" in str(raised.value)
    assert "name the SoC (soc_model, or htp_arch" in str(raised.value)


@pytest.mark.parametrize(
    ("string", "sdk"),
    [
        ("v2:6:2.49.40:5.49.0:73:60:0:0", "2.49.40"),  # onnxruntime-qnn 2.5.0
        ("v2:6:2.51.0:5.51.0:73:60:8:0", "2.51.0"),  # 2.7.0
        ("6:2.47.0:5.47.0:0.0.0:73:0", "2.47.0"),  # 2.3.0, a V1 string
        ("v3:6:2.51.0", None),
        ("cpu:x86-64:avx2", None),
    ],
)
def test_the_sdk_release_a_string_names(string: str, sdk: str | None) -> None:
    assert eps.load(QNN).sdk_version(string) == sdk
    assert eps.load("CPUExecutionProvider").sdk_version(string) is None
