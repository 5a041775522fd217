"""Real third-party models: PaddleOCR v4 (via the rapidocr-onnxruntime wheel on PyPI), whose
inputs have symbolic dims spelled three ways (-1, '?', 'p2o.DynamicDimension.N'), and the
ddddocr wheel's captcha detector and dynamic-quantisation recogniser. Only the wheels'
.onnx files are used; each is fetched once into tests/.cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from epfleet.formats.manifest import Manifest
from epfleet.runtime.shapes import graph_inputs
from examples import ddddocr, paddle_ocr
from tests.support.cli_runs import epfleet, s3_manifest, s3_reader
from tests.support.paths import TESTS
from tests.support.specs import assert_variants_match_store, write_spec

# one worker under pytest-xdist (--dist loadgroup): both tests share the downloaded wheel's
# models, which two workers would download into tests/.cache at once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("third_party")]

CACHE = TESTS / ".cache" / "rapidocr"
MODELS = {name: paddle_ocr.MODELS[name] for name in ("ocr-cls", "ocr-rec")}
HTP = [("sd8g3", 75, 57), ("sd8g2", 73, 43), ("sd8e", 79, 69)]


@pytest.fixture(scope="session")
def paddle_ocr_models() -> dict[str, Path]:
    return paddle_ocr.fetch(CACHE, list(MODELS))


def test_paddle_ocr_compiled_for_three_htp_targets_and_cpu_then_synced_to_this_host(
    unsigned_allowed: None,  # a compile into S3 with no `trust init`: an unsigned store
    paddle_ocr_models: dict[str, Path],
    tmp_path: Path,
    s3_bucket: str,
    cli_env: dict[str, str],
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
    # Each with its SoC's VTCM (8 MB for SM8650, SM8550 and SM8750): a device of that SoC
    # judges it optimal.
    assert {s.split(":", 4)[4] for s in htp_strings} == {"75:57:8:0", "73:43:8:0", "79:69:8:0"}

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
        golden = manifest.models[result["model"]].samples
        assert cpu.artifact is not None and golden is not None
        assert result["bytes_downloaded"] == cpu.artifact.size + golden.size
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


DDDD_CACHE = TESTS / ".cache" / "ddddocr"

# Run in a fresh process, apart from epfleet: load a published QNN HTP variant with the
# plugin's HTP backend (this x86 host runs context binaries on its CPU), feed it the golden
# inputs, and print how far it is from the golden outputs, relative to each output's range.
FRESH_PROCESS_CHECK = """
import json, sys
import numpy as np, onnxruntime as ort, onnxruntime_qnn
path, golden, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
session_options = ort.SessionOptions()
session_options.add_provider_for_devices(devices, options)
session = ort.InferenceSession(path, session_options)
arrays = np.load(golden)
feeds = {key.split("/")[2]: arrays[key] for key in arrays.files if key.startswith("input/0/")}
outputs = session.run(None, feeds)
errors = []
for index, got in enumerate(outputs):
    ref = arrays[f"output/0/{index}"].astype(np.float64)
    diff = float(np.abs(got.reshape(ref.shape) - ref).max())
    errors.append([diff, float(ref.max() - ref.min())])
print(json.dumps({"providers": session.get_providers(), "errors": errors}))
"""


def test_ddddocr_htp_variants_are_verified_and_each_runs_in_a_fresh_process(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """A YOLO-style detector and a dynamic-quantisation recogniser (which QNN takes only in
    part) from the ddddocr wheel: every QNN HTP variant published ok has run and matched."""
    paths = ddddocr.fetch(DDDD_CACHE, ["captcha-det", "captcha-rec-dq"])
    htp = {"backend_type": "htp", "enable_htp_fp16_precision": 1}
    spec = write_spec(
        tmp_path,
        [
            {
                "name": name,
                "source": str(paths[name]),
                "input_shapes": {ddddocr.MODELS[name][1]: ddddocr.MODELS[name][2]},
            }
            for name in paths
        ],
        [
            {
                "name": "sd8g3",
                "ep": "QNNExecutionProvider",
                "provider_options": htp | {"htp_arch": 75, "soc_model": 57},
            },
            {
                "name": "sd8e",
                "ep": "QNNExecutionProvider",
                "provider_options": htp | {"htp_arch": 79, "soc_model": 69},
            },
            {
                "name": "sd8g3-whole",
                "ep": "QNNExecutionProvider",
                "min_coverage": 1.0,
                "provider_options": htp | {"htp_arch": 75, "soc_model": 57},
            },
            {"name": "cpu", "ep": "CPUExecutionProvider"},
        ],
    )
    store = tmp_path / "store"
    result = epfleet("compile", str(spec), "--store", str(store), "--json", env=cli_env)
    assert result.returncode == 1, result.stderr  # one pair refused by min_coverage
    report = {(v["model"], v["target"]): v for v in json.loads(result.stdout)["variants"]}
    refused = report[("captcha-rec-dq", "sd8g3-whole")]
    assert refused["status"] == "failed"
    assert "below the target's min_coverage 1; left out:" in refused["error"]
    assert "ConvInteger" in refused["error"] and "DynamicQuantizeLinear" in refused["error"]
    assert [key for key, v in report.items() if v["status"] != "ok"] == [
        ("captcha-rec-dq", "sd8g3-whole")
    ]

    manifest = Manifest.from_json((store / "manifest.json").read_bytes())
    checked = 0
    for name, model in manifest.models.items():
        assert model.samples is not None
        for target, variant in model.variants.items():
            if variant.status != "ok":
                continue
            assert variant.verification is not None and variant.verification.status == "passed", (
                name,
                target,
                variant.verification,
            )
            assert variant.coverage is not None
            if variant.ep != "QNNExecutionProvider":
                continue
            partial = name == "captcha-rec-dq"
            assert (variant.coverage.fraction < 1) == partial, (name, target, variant.coverage)
            assert variant.artifact is not None
            fresh = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    FRESH_PROCESS_CHECK,
                    str(store / variant.artifact.uri),
                    str(store / model.samples.uri),
                    json.dumps(variant.provider_options),
                ],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert fresh.returncode == 0, fresh.stderr[-2000:]
            ran = json.loads(fresh.stdout.strip().splitlines()[-1])
            assert ran["providers"][0] == "QNNExecutionProvider"
            check = variant.verification
            assert check.tolerance is not None and check.abs_tolerance is not None
            for diff, span in ran["errors"]:  # each output within the published tolerance
                assert diff <= max(check.tolerance * span, check.abs_tolerance), (name, target, ran)
            checked += 1
    assert checked == 5  # the detector for three targets, the recogniser for two
