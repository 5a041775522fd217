"""A target's ``fold_io``, end to end with real ORT quantisation and QNN HTP compiles: the
folded w8a8 variant of a small classifier compiles whole (coverage 100 %, no boundary
Q/DQ), is verified with CPU fallback disabled on quantised golden inputs, records its
integer I/O in the manifest, and is marked in the compile table and ``manifest show``; the
device's health check runs it the same way and refuses a folded_io that does not fit it.
QNN runs in processes of their own (see tests/runtime/test_boundary_qdq.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from epfleet.formats.manifest import Manifest
from epfleet.formats.schema_version import SCHEMA_VERSION
from examples.build_models import tiny_cls
from tests.support.specs import write_spec

pytestmark = pytest.mark.slow

V75 = {"backend_type": "htp", "htp_arch": 75, "soc_model": 57}
SHAPE = [1, 3, 48, 192]


def images(seed: int, count: int) -> np.ndarray:
    """Smooth gradients with a little noise, in [0, 1], like real images."""
    rng = np.random.default_rng(seed)
    rows = np.linspace(0, 1, SHAPE[2], dtype=np.float32)[:, None]
    cols = np.linspace(0, 1, SHAPE[3], dtype=np.float32)[None, :]
    out = np.empty((count, *SHAPE), np.float32)
    for k in range(count):
        for c in range(3):
            a, b = rng.uniform(-1, 1, 2)
            base = 0.5 + 0.4 * np.sin(3 * a * rows + 2 * b * cols + c)
            out[k, 0, c] = np.clip(base + rng.normal(0, 0.05, base.shape), 0, 1)
    return out


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epfleet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


HEALTH = """
import json, sys
from epfleet.device.health import HealthJob, check_health
from epfleet.errors import HealthCheckError
job = HealthJob.model_validate_json(sys.argv[1])
try:
    health = check_health(job)
except HealthCheckError as exc:
    print(json.dumps({"error": str(exc)}))
else:
    print(health.model_dump_json())
"""


def health_check(job: dict) -> dict:
    """The device's health check of a variant, in a process of its own (QNN)."""
    done = subprocess.run(
        [sys.executable, "-c", HEALTH, json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_folded_variant_runs_all_on_the_htp_and_says_how_to_feed_it(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    source = tmp_path / "cls.onnx"
    onnx.save(tiny_cls(), str(source))
    np.savez(tmp_path / "calibration.npz", x=images(1, 8))
    np.savez(tmp_path / "samples.npz", x=images(2, 3))
    htp = {"ep": "QNNExecutionProvider", "provider_options": V75, "precision": "w8a8"}
    spec = write_spec(
        tmp_path,
        [
            {
                "name": "cls",
                "source": str(source),
                "input_shapes": {"x": SHAPE},
                "calibration": "calibration.npz",
                "samples": "samples.npz",
                # The tiny model's random classes are near-tied, so its w8a8 variants flip
                # 0-1 of the 3 samples' decisions; folding, not deciding, is tested here.
                "metric": {"kind": "argmax_agreement", "min": 0.0},
            }
        ],
        [
            {"name": "htp", **htp},
            {"name": "htp-folded", **htp, "fold_io": True},
            # a ladder: its integer rung folded, to uint16
            {"name": "htp-folded16", **htp, "precision": ["w8a16", "fp16"], "fold_io": True},
        ],
    )
    store = tmp_path / "store"
    done = run_cli(["compile", str(spec), "--store", str(store), "--json"], cli_env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = {v["target"]: v for v in json.loads(done.stdout)["variants"]}
    assert (report["htp-folded"]["folded"], report["htp"]["folded"]) == (True, False)

    manifest = Manifest.from_json((store / "manifest.json").read_bytes())
    assert manifest.schema_version == SCHEMA_VERSION  # 1.4 added folded_io
    plain = manifest.models["cls"].variants["htp"]
    folded = manifest.models["cls"].variants["htp-folded"]
    assert plain.folded_io is None and plain.coverage is not None
    assert plain.coverage.boundary_qdq == 2 and plain.coverage.fraction < 1.0
    assert folded.coverage is not None
    assert (folded.coverage.fraction, folded.coverage.boundary_qdq) == (1.0, 0)
    assert folded.coverage.other_nodes == 0
    io = folded.folded_io
    assert io is not None
    assert [(t.name, t.dtype) for t in io.inputs] == [("x", "uint8")]
    assert [(t.name, t.dtype) for t in io.outputs] == [("probs", "uint8")]
    assert all(t.scale > 0 for t in [*io.inputs, *io.outputs])
    # both from the one QDQ model: the same quantisation
    assert folded.quantization == plain.quantization
    checked, unfolded = folded.verification, plain.verification
    assert checked is not None and checked.status == "passed", checked
    assert checked.runner is not None and "(CPU fallback disabled)" in checked.runner
    assert unfolded is not None and unfolded.status == "passed"
    assert checked.max_rel_error is not None and unfolded.max_rel_error is not None
    # the integer edges round the input and output as the Q/DQ nodes did: same error
    assert abs(checked.max_rel_error - unfolded.max_rel_error) < 1e-3, (checked, unfolded)
    wide = manifest.models["cls"].variants["htp-folded16"]
    assert wide.precision == "w8a16" and wide.folded_io is not None
    assert {t.dtype for t in [*wide.folded_io.inputs, *wide.folded_io.outputs]} == {"uint16"}
    assert wide.coverage is not None and wide.coverage.fraction == 1.0
    assert wide.verification is not None and wide.verification.status == "passed"
    print(
        f"measured: coverage {plain.coverage.fraction} -> {folded.coverage.fraction}; "
        f"verification error {unfolded.max_rel_error:.4%} unfolded, "
        f"{checked.max_rel_error:.4%} folded; w8a16 folded {wide.verification.max_rel_error:.4%}"
    )

    shown = run_cli(["manifest", "show", "--store", str(store)], cli_env)
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if "htp-folded" in line)
    assert "w8a8 folded" in row and "100%" in row
    row = next(line for line in shown.stdout.splitlines() if " htp " in line)
    assert "folded" not in row and "2 I/O Q/DQ on CPU" in row

    # The device's health check: the same variant, the same way.
    assert folded.artifact is not None and manifest.models["cls"].samples is not None
    job = {
        "label": "cls/htp-folded",
        "path": str(store / folded.artifact.uri),
        "ep": "QNNExecutionProvider",
        "device": "npu",
        "provider_options": folded.provider_options,
        "input_shapes": {"x": SHAPE},
        "golden_path": str(store / manifest.models["cls"].samples.uri),
        "tolerance": {"relative": checked.tolerance, "absolute": checked.abs_tolerance},
        "folded_io": io.model_dump(mode="json"),
    }
    health = health_check(job)
    assert "error" not in health, health
    assert health["samples"] == 3 and health["max_rel_error"] == pytest.approx(
        checked.max_rel_error, rel=1e-3
    )
    # Without folded_io (as a device that dropped it would): floats into a uint8 input.
    dropped = health_check(job | {"folded_io": None})
    assert "error" in dropped and "tensor(uint8)" in dropped["error"], dropped
    # Forged records: the variant is not activated, and the error says why.
    forged = io.model_dump(mode="json")
    forged["inputs"][0]["dtype"] = "uint16"
    refused = health_check(job | {"folded_io": forged})
    assert refused["error"] == (
        "cls/htp-folded: folded_io says input 'x' is uint16; the model's is tensor(uint8); "
        "not activated"
    )
    forged = io.model_dump(mode="json")
    forged["outputs"][0]["name"] = "logits"
    refused = health_check(job | {"folded_io": forged})
    assert refused["error"] == (
        "cls/htp-folded: folded_io names output 'logits', which the model does not have "
        "(its outputs: 'probs'); not activated"
    )
    # The unfolded variant does not load with CPU fallback disabled: fold_io is what does it.
    assert plain.artifact is not None
    partial = health_check(job | {"path": str(store / plain.artifact.uri), "folded_io": forged})
    assert "with CPU fallback disabled" in partial["error"], partial
