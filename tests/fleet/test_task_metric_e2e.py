"""A task metric decides the ladder, end to end: ``epfleet compile`` of a classifier
whose top two classes are close, for a Snapdragon HTP target with the ladder [w8a8,
fp16]. Its w8a8 variant is within the numeric tolerance (0.8 % of range off) and agrees
on 6 rows in 16: with no metric named it is refused by the default for class scores
(argmax agreement, min 0.97), and with ``metric: {kind: argmax_agreement, min: 0.99}`` by
that metric; the fp16 one, which keeps every row, is published, with its score
in the manifest, ``manifest show`` and the compile table. Real ORT quantisation, QNN
compiles and verification on this host's HTP backend; the CLI under a Prefect API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from epfleet.formats.manifest import Manifest
from tests.support.cli_runs import epfleet
from tests.support.fragile import features, fragile_classifier
from tests.support.specs import write_spec

pytestmark = pytest.mark.slow

V73 = {"backend_type": "htp", "htp_arch": 73, "soc_model": 57}


def spec(root: Path, metric: dict[str, object] | None) -> Path:
    fragile_classifier(root / "fragile.onnx")
    np.savez(root / "samples.npz", x=features(1, 16))
    np.savez(root / "calibration.npz", x=features(2, 16))
    model: dict[str, object] = {
        "name": "fragile",
        "source": "fragile.onnx",
        "samples": "samples.npz",
        "calibration": "calibration.npz",
    }
    if metric:
        model["metric"] = metric
    target = {
        "name": "sd8g2",
        "ep": "QNNExecutionProvider",
        "provider_options": V73,
        "precision": ["w8a8", "fp16"],
    }
    return write_spec(root, [model], [target])


def test_a_task_metric_refuses_the_rung_that_breaks_the_task(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    plain, judged = tmp_path / "plain", tmp_path / "judged"
    plain.mkdir(), judged.mkdir()

    numeric = epfleet(
        "compile", str(spec(plain, None)), "--store", str(plain / "store"), "--json", env=cli_env
    )
    assert numeric.returncode == 0, numeric.stderr[-2000:]
    # No metric named: the w8a8 rung is within the numeric tolerance, but its 'logits' are
    # class scores, so it is judged by its decisions too (the default for integer rungs).
    by_default = json.loads(numeric.stdout)["variants"][0]
    assert by_default["precision"] == "fp16" and by_default["metric"] is None
    plain_manifest = Manifest.from_json((plain / "store" / "manifest.json").read_bytes())
    lost_by_default = plain_manifest.models["fragile"].variants["sd8g2"].precision_tried[0]
    assert lost_by_default.precision == "w8a8" and lost_by_default.max_rel_error is not None
    assert lost_by_default.max_rel_error < 0.02
    assert "(min 0.97) on output 'logits'" in lost_by_default.reason
    assert "the default for an integer variant's class scores" in lost_by_default.reason

    metric = {"kind": "argmax_agreement", "min": 0.99}
    run = epfleet(
        "compile", str(spec(judged, metric)), "--store", str(judged / "store"), env=cli_env
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "fp16 (w8a8 verification failed in " in run.stdout
    # judged on the 16 samples and the 16 calibration inputs: 32 cannot show 0.99
    assert "argmax_agreement 32/32 = 1 [0.91, 1] (min 0.99) on 32 inputs" in run.stderr
    manifest = Manifest.from_json((judged / "store" / "manifest.json").read_bytes())
    variant = manifest.models["fragile"].variants["sd8g2"]
    assert variant.precision == "fp16"
    check = variant.verification
    assert check is not None and check.metric is not None
    assert check.metric.value == 1.0 and check.metric.output == "logits"
    assert check.metric.inputs == {"samples": 16, "calibration": 16}
    assert check.metric.evidence == "undecided"
    lost = variant.precision_tried[0]
    assert lost.precision == "w8a8" and lost.max_rel_error is not None and lost.max_rel_error < 0.02
    assert "task metric argmax_agreement " in lost.reason and "/16 = 0." in lost.reason
    assert "(min 0.99) on output 'logits' over 16 sample(s)" in lost.reason  # settled: no more

    shown = epfleet("manifest", "show", "--store", str(judged / "store"), env=cli_env)
    assert shown.returncode == 0, shown.stderr
    assert "argmax_agreement 32/32 = 1 [0.91, 1] (min 0.99) on 32 inputs" in shown.stdout
