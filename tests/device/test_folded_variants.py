"""A device and a folded variant (a variant that takes and gives integers, its manifest
entry's ``folded_io`` saying how): the health check quantises the golden inputs and
dequantises the outputs, the active record keeps the folded_io for the app; and forged
records, signed with the online key, are refused with the variant that is active kept.

The variants here run on the CPU EP (hand-made: integer I/O around a MatMul, stamped with
this host's CPU string); the same on the QNN HTP with CPU fallback disabled is in
tests/fleet/test_fold_io.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import eps
from epfleet.device.cache import DeviceCache
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.keys import samples_key, variant_key
from epfleet.formats.manifest import Manifest, SamplesRef
from epfleet.formats.variant_checks import FoldedIo, FoldedTensor, Verification
from epfleet.runtime.samples import write_golden
from epfleet.stores import open_store
from epfleet.trust.repository import publish_trust
from tests.support.hand_made_fleet import CPU, DEVICE, MODEL, TARGET, make_fleet, upload
from tests.support.trust_helpers import online_key

pytestmark = pytest.mark.fast

FOLDED = "cpu-folded"
WEIGHTS = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)  # write_model's


def golden_samples() -> tuple[list[dict[str, np.ndarray]], list[list[np.ndarray]]]:
    rng = np.random.default_rng(4)
    samples = [{"X": rng.uniform(0, 1, (1, 8)).astype(np.float32)} for _ in range(3)]
    return samples, [[s["X"] @ WEIGHTS] for s in samples]


def folded_model(path: Path, io: FoldedIo) -> Path:
    """Y = X @ W with uint8 X and Y: the MatMul between their DequantizeLinear and
    QuantizeLinear, as folding leaves a QDQ model; stamped with this host's CPU string."""
    x, y = io.inputs[0], io.outputs[0]
    initializers = [
        numpy_helper.from_array(WEIGHTS, "W"),
        numpy_helper.from_array(np.array(x.scale, np.float32), "sx"),
        numpy_helper.from_array(np.array(x.zero_point, np.uint8), "zx"),
        numpy_helper.from_array(np.array(y.scale, np.float32), "sy"),
        numpy_helper.from_array(np.array(y.zero_point, np.uint8), "zy"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["X", "sx", "zx"], ["Xf"]),
            helper.make_node("MatMul", ["Xf", "W"], ["Yf"]),
            helper.make_node("QuantizeLinear", ["Yf", "sy", "zy"], ["Y"]),
        ],
        "folded",
        [helper.make_tensor_value_info("X", TensorProto.UINT8, [1, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.UINT8, [1, 4])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    string = eps.load(CPU).generate_compatibility_string(path)
    assert string is not None
    helper.set_model_props(model, {f"ep_compatibility_info.{CPU}": string})
    onnx.save_model(model, str(path))
    return path


def folded_io() -> FoldedIo:
    _, outputs = golden_samples()
    values = np.concatenate([o[0].ravel() for o in outputs])
    low, high = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
    scale = (high - low) / 255
    return FoldedIo(
        inputs=[FoldedTensor(name="X", dtype="uint8", scale=1 / 255, zero_point=0)],
        outputs=[
            FoldedTensor(name="Y", dtype="uint8", scale=scale, zero_point=round(-low / scale))
        ],
    )


@pytest.fixture
def fleet(tmp_path: Path) -> Any:
    """The hand-made signed fleet (model m, its CPU variant) with golden samples, synced
    once: the device runs the unfolded variant."""
    made = make_fleet(str(tmp_path / "store"), tmp_path)
    store = open_store(made.uri)
    samples, outputs = golden_samples()
    write_golden(tmp_path / "golden.npz", samples, outputs)
    golden = upload(store, tmp_path / "golden.npz", samples_key("{sha}"))
    artifact = upload(
        store,
        folded_model(tmp_path / "folded.onnx", folded_io()),
        variant_key(MODEL, FOLDED, "{sha}"),
    )

    def change(current: Manifest | None) -> Manifest:
        assert current is not None
        manifest = current.model_copy(deep=True)
        entry = manifest.models[MODEL]
        entry.samples = SamplesRef(**golden.model_dump(), count=3, basis="by hand")
        manifest.generation += 1
        return manifest

    publish_trust(store, online_key(made.keys), change)
    first = run_sync(made, tmp_path)
    assert first.models[0].action == "downloaded" and first.models[0].target == TARGET
    return made, store, artifact


def run_sync(made: Any, tmp_path: Path) -> DeviceReport:
    return sync(made.uri, tmp_path / "cache", SyncPolicy(), DEVICE, trust_root=made.root)


def publish_folded(made: Any, store: Any, artifact: Any, io: dict[str, Any]) -> None:
    """Sign, with the online key, an entry for the folded variant carrying ``io`` as its
    folded_io (not validated: what an attacker holding the key can sign), listed first."""

    def change(current: Manifest | None) -> Manifest:
        assert current is not None
        manifest = current.model_copy(deep=True)
        entry = manifest.models[MODEL]
        unfolded = entry.variants[TARGET]
        variant = unfolded.model_copy(
            update={
                "compatibility_string": eps.load(CPU).generate_compatibility_string(
                    Path(store.root) / artifact.uri
                ),
                "artifact": artifact,
                "fingerprint": "by-hand-folded",
                "precision": "w8a8",
                "verification": Verification(status="passed", tolerance=0.05, samples=3),
                "folded_io": FoldedIo.model_construct(
                    inputs=[FoldedTensor.model_construct(**t) for t in io["inputs"]],
                    outputs=[FoldedTensor.model_construct(**t) for t in io["outputs"]],
                ),
            }
        )
        entry.variants = {FOLDED: variant, TARGET: unfolded}
        entry.preference = [FOLDED, TARGET]
        manifest.generation += 1
        return manifest

    publish_trust(store, online_key(made.keys), change)


def active(tmp_path: Path) -> Any:
    return DeviceCache(tmp_path / "cache").load_state().models[MODEL].active


def test_a_folded_variant_is_health_checked_on_quantised_inputs_and_activated(
    fleet: Any, tmp_path: Path
) -> None:
    made, store, artifact = fleet
    io = folded_io()
    publish_folded(made, store, artifact, io.model_dump(mode="json"))
    report = run_sync(made, tmp_path)
    [model] = report.models
    assert (model.action, model.target) == ("downloaded", FOLDED), model.reason
    assert model.precision == "w8a8"
    now = active(tmp_path)
    assert now.target == FOLDED and now.folded_io == io  # what an app feeds it with
    # the health check ran it on the golden inputs, quantised, within 8-bit error
    x = np.random.default_rng(4).uniform(0, 1, (1, 8)).astype(np.float32)
    session = ort.InferenceSession(str(Path(store.root) / artifact.uri))
    from epfleet.runtime.folded_io import dequantize, quantize

    got = dequantize(session.run(None, {"X": quantize(x, io.inputs[0])})[0], io.outputs[0])
    span = float(np.ptp(np.concatenate([o[0] for o in golden_samples()[1]])))
    assert np.abs(got - x @ WEIGHTS).max() / span < 0.02


@pytest.mark.parametrize(
    ("forge", "expected"),
    [
        (
            {"inputs": {"dtype": "uint16"}},
            "folded_io says input 'X' is uint16; the model's is tensor(uint8); not activated",
        ),
        (
            {"inputs": {"name": "image"}},
            "folded_io names input 'image', which the model does not have (its inputs: 'X')",
        ),
        (
            {"outputs": {"name": "logits"}},
            "folded_io names output 'logits', which the model does not have",
        ),
        (
            {"inputs": {"scale": 0.0}},
            "fails validation at models.m.variants.cpu-folded.folded_io.inputs.0.scale: "
            "Input should be greater than 0",
        ),
        (
            {"inputs": {"scale": -0.5}},
            "fails validation at models.m.variants.cpu-folded.folded_io.inputs.0.scale: "
            "Input should be greater than 0",
        ),
        (
            {"outputs": {"scale": float("nan")}},
            "fails validation at models.m.variants.cpu-folded.folded_io.outputs.0.scale",
        ),
        (
            {"outputs": {"zero_point": 300}},
            "fails validation at models.m.variants.cpu-folded.folded_io.outputs.0: Value error, "
            "'Y': zero_point 300 is outside uint8's range [0, 255]",
        ),
    ],
)
def test_a_forged_folded_io_is_refused_and_the_active_variant_kept(
    fleet: Any, tmp_path: Path, forge: dict[str, dict[str, Any]], expected: str
) -> None:
    made, store, artifact = fleet
    io = folded_io().model_dump(mode="json")
    for kind, change in forge.items():
        io[kind][0] |= change
    publish_folded(made, store, artifact, io)
    report = run_sync(made, tmp_path)
    [model] = report.models
    assert model.target == TARGET and model.action == "kept", model
    if "fails validation" in expected:  # no model has it: the signed document is refused
        assert report.manifest.status == "rejected"
        assert expected in (report.manifest.reason or ""), report.manifest
    else:  # it does not fit the model: the health check refuses the variant
        assert expected in model.reason, model.reason
    assert active(tmp_path).target == TARGET and active(tmp_path).folded_io is None
