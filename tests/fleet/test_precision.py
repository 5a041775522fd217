"""Precisions (pure): what each target may compute in, as its EP module says, refused at
spec load when impossible; the ladder and the quantise step's inputs in a pair's
fingerprint; calibration inputs kept apart from verification samples; the model facts a
run publishes."""

from __future__ import annotations

import numpy as np
import pytest

import eps
from epfleet.errors import BadInputError
from epfleet.fleet.planning.calibration import split
from epfleet.fleet.planning.rules import ladder_of, quantize_options
from epfleet.formats.manifest import ArtifactRef
from epfleet.formats.spec_file import parse_spec
from epfleet.runtime.requests import CompileRequest, fingerprinted

pytestmark = pytest.mark.fast

HTP = {"backend_type": "htp", "soc_model": 35}


def target(**fields: object) -> dict[str, object]:
    return {"name": "t", "ep": "QNNExecutionProvider", **fields}


def parsed(*targets: dict[str, object], model: dict[str, object] | None = None):
    return parse_spec(
        {
            "models": [model or {"name": "m", "source": "m.onnx"}],
            "targets": list(targets),
        }
    )


def test_each_arch_defaults_to_what_its_hardware_computes_in() -> None:
    spec = parsed(
        target(name="v68", provider_options=HTP | {"htp_arch": 68}),
        target(name="v75", provider_options=HTP | {"htp_arch": 75}),
        target(name="qnn-cpu", provider_options={"backend_type": "cpu"}),
        {"name": "cpu", "ep": "CPUExecutionProvider"},
    )
    assert {t.name: t.ladder for t in spec.targets} == {
        "v68": ["w8a8"],
        "v75": ["fp16"],
        "qnn-cpu": ["fp32"],
        "cpu": ["fp32"],
    }


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {"provider_options": HTP | {"htp_arch": 68}, "precision": "fp16"},
            ["targets[t]: precision: fp16 is not one", "htp_arch 68", "makes w8a8", "no fp16"],
        ),
        (
            {"provider_options": HTP | {"htp_arch": 68}, "precision": ["w8a8", "w8a16"]},
            ["w8a16 is not one", "8-bit activations only"],
        ),
        ({"provider_options": HTP, "precision": ["fp16", "fp16"]}, ["names a precision twice"]),
        ({"provider_options": HTP, "precision": []}, ["empty ladder"]),
        ({"provider_options": HTP, "precision": "int4"}, ["precision"]),
        (
            {"provider_options": HTP | {"enable_htp_fp16_precision": 0}, "precision": "fp16"},
            ["enable_htp_fp16_precision", "remove the option"],
        ),
    ],
)
def test_an_impossible_precision_is_refused_at_spec_load(
    fields: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(BadInputError) as refused:
        parsed(target(**fields))
    assert all(w in str(refused.value) for w in words), str(refused.value)


@pytest.mark.parametrize("arch", [68, 69])
def test_sixteen_bit_weights_are_refused_before_v73(arch: int) -> None:
    """Measured: v68 and v69 refuse 16-bit weights (QNN error 3110 on each Conv)."""
    with pytest.raises(BadInputError) as refused:
        parsed(target(provider_options=HTP | {"htp_arch": arch}, precision=["w8a8", "w16a16"]))
    assert "w16a16 is not one" in str(refused.value), str(refused.value)


@pytest.mark.parametrize("arch", [73, 75, 79, 81])
def test_v73_on_makes_w16a16_held_to_sixteen_bit_tolerances(arch: int) -> None:
    [spec_target] = parsed(
        target(provider_options=HTP | {"htp_arch": arch}, precision=["w8a8", "w16a16"])
    ).targets
    assert [
        (r.precision, r.tolerance) for r in ladder_of(spec_target, eps.load(spec_target.ep))
    ] == [
        ("w8a8", 0.10),
        ("w16a16", 0.10),
    ]


def test_the_cpu_ep_makes_fp32_only() -> None:
    with pytest.raises(BadInputError, match="makes fp32"):
        parsed({"name": "cpu", "ep": "CPUExecutionProvider", "precision": "w8a8"})


def test_each_rung_builds_and_verifies_at_its_precision() -> None:
    [spec_target] = parsed(
        target(provider_options=HTP, precision=["fp16", "w8a16", "w8a8"])
    ).targets
    rungs = ladder_of(spec_target, eps.load(spec_target.ep))
    assert [r.precision for r in rungs] == ["fp16", "w8a16", "w8a8"]
    assert rungs[0].provider_options["enable_htp_fp16_precision"] == "1"
    assert [r.tolerance for r in rungs] == [0.05, 0.10, 0.10]
    [given] = parsed(
        target(provider_options=HTP, precision=["fp16", "w8a8"], tolerance=0.2)
    ).targets
    assert [r.tolerance for r in ladder_of(given, eps.load(given.ep))] == [0.2, 0.2]


def request(**fields: object) -> CompileRequest:
    base: dict[str, object] = {
        "model": "m",
        "target": "t",
        "ep": "QNNExecutionProvider",
        "device": "npu",
        "provider_options": {"htp_arch": "75"},
        "input_shapes": {},
        "source_key": "sources/x.onnx",
        "source_sha256": "a" * 64,
        "source_size": 1,
        "fingerprint": "",
    }
    return fingerprinted(CompileRequest.model_validate(base | fields), "1.32.0", {"v": "1"})


def test_the_ladder_and_the_quantise_inputs_decide_the_fingerprint() -> None:
    plain = request(precision="fp16")
    assert plain.fingerprint == request().fingerprint  # float pairs keep their fingerprints
    [spec_target] = parsed(target(provider_options=HTP, precision=["fp16", "w8a16"])).targets
    _, w8a16 = ladder_of(spec_target, eps.load(spec_target.ep))
    laddered = request(precision="fp16", fallbacks=[w8a16])
    assert laddered.fingerprint != plain.fingerprint
    model = parse_spec(
        {
            "models": [{"name": "m", "source": "m.onnx", "calibration": "c.npz"}],
            "targets": [target(provider_options=HTP | {"htp_arch": 68})],
        }
    ).models[0]
    one = ArtifactRef(uri=f"samples/{'1' * 64}.npz", sha256="1" * 64, size=3)
    other = ArtifactRef(uri=f"samples/{'2' * 64}.npz", sha256="2" * 64, size=3)
    calibrated = request(precision="w8a8", quantize=quantize_options(model, one))
    assert calibrated.fingerprint != request(precision="w8a8").fingerprint
    assert (
        calibrated.fingerprint
        != request(precision="w8a8", quantize=quantize_options(model, other)).fingerprint
    )
    assert [r.precision for r in laddered.rungs] == ["fp16", "w8a16"]
    assert laddered.rungs[1].fallbacks == [] and laddered.rungs[1].tolerance == 0.10
    # metric: {kind: none} judges by the numeric gate alone: another verdict, another build
    off = request(precision="w8a8", decision_default=False)
    assert off.fingerprint != request(precision="w8a8").fingerprint
    assert request(precision="w8a8", decision_default=True).fingerprint == (
        request(precision="w8a8").fingerprint  # the default keeps the fingerprints it had
    )


def samples(values: list[float]) -> list[dict[str, np.ndarray]]:
    return [{"x": np.full((1, 4), v, np.float32)} for v in values]


def test_calibration_and_verification_never_share_an_input() -> None:
    with pytest.raises(BadInputError, match="2 of its 4 inputs are also among the model's samples"):
        split(samples([1, 2, 3, 4]), samples([3, 4, 5]), "models[m].calibration")
    kept, held = split(samples([1, 2, 3]), samples([4]), "where")
    assert len(kept) == 3 and held is None


def test_without_samples_a_fifth_of_the_calibration_is_held_out() -> None:
    kept, held = split(samples(list(range(10))), None, "where")
    assert held is not None and len(held) == 2 and len(kept) == 8
    assert {float(s["x"][0, 0]) for s in held} == {8.0, 9.0}
    kept, held = split(samples([1, 2]), None, "where")
    assert len(kept) == 1 and held is not None and len(held) == 1
    with pytest.raises(BadInputError, match="at least 2"):
        split(samples([1]), None, "where")


def test_an_htp_target_naming_its_arch_alone_is_built_for_that_arch_s_reference_soc() -> None:
    """Without a SoC this host's HTP backend computes float graphs in fp32: verification
    would not see fp16's error."""
    [arch_only] = parsed(target(provider_options={"htp_arch": 73})).targets
    assert ladder_of(arch_only, eps.load(arch_only.ep))[0].provider_options["soc_model"] == "43"
    [named] = parsed(target(provider_options={"htp_arch": 73, "soc_model": 53})).targets
    assert ladder_of(named, eps.load(named.ep))[0].provider_options["soc_model"] == "53"
