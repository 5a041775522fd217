"""The OpenVINO plugin EP for real: a device this worker has compiles, a device it lacks
fails that pair alone with "no ... device on this worker"."""

from __future__ import annotations

from pathlib import Path

import pytest

import eps
from epfleet.formats.manifest import Manifest
from flows.fleet_compile import fleet_compile
from tests.support.specs import HTP_TARGETS, assert_variants_match_store, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]
OPENVINO = "OpenVINOExecutionProvider"


def test_openvino_targets_next_to_qnn(tmp_path: Path, model_dir: Path) -> None:
    ov_devices = {d.ep_metadata.get("ov_device") for d in eps.load(OPENVINO).devices()}
    spec = write_spec(
        tmp_path,
        [
            {
                "name": "tiny-cls",
                "source": str(model_dir / "tiny-cls.onnx"),
                "input_shapes": {"x": [1, 3, 32, 32]},
            }
        ],
        [
            {"name": "ov-cpu", "ep": OPENVINO, "device": "cpu"},
            {"name": "ov-npu", "ep": OPENVINO, "device": "npu"},
            HTP_TARGETS[0],
        ],
    )
    store = tmp_path / "store"
    report = fleet_compile(spec=str(spec), store=str(store), workers=2)
    status = {v.target: v for v in report.variants}
    assert status["sd8g3-htp"].status == "ok"
    for target, ov_device in [("ov-cpu", "CPU"), ("ov-npu", "NPU")]:
        if ov_device in ov_devices:
            assert status[target].status == "ok", status[target].error
        else:
            assert status[target].status == "failed"
            assert f"no {OPENVINO} {ov_device} device on this worker" in (
                status[target].error or ""
            )

    manifest = Manifest.from_json((store / "manifest.json").read_bytes())
    variants = manifest.models["tiny-cls"].variants
    failed = [t for t, v in variants.items() if v.status == "failed"]
    assert all("device on this worker" in (variants[t].error or "") for t in failed)
    ok_only = manifest.model_copy(deep=True)
    for target in failed:
        del ok_only.models["tiny-cls"].variants[target]
    assert assert_variants_match_store(ok_only, lambda key: (store / key).read_bytes()) == 3 - len(
        failed
    )


def test_plugin_mode_options_that_openvino_ignores_are_refused() -> None:
    from epfleet.errors import BadInputError
    from epfleet.formats.spec_file import parse_spec

    with pytest.raises(BadInputError, match="device_type is ignored by the OpenVINO plugin EP"):
        parse_spec(
            {
                "models": [{"name": "m", "source": "m.onnx"}],
                "targets": [
                    {"name": "ov", "ep": OPENVINO, "provider_options": {"device_type": "NPU"}}
                ],
            }
        )
