"""The fleet-compile flow's store artifacts (costs, runtimes), under a real (isolated)
Prefect API."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.artifacts import Artifact

from epfleet.fleet.publishing.publish import read_manifest
from epfleet.lifecycle.costs import cost_markdown, costs
from epfleet.stores import open_store
from flows.fleet_compile import fleet_compile
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_fleet_flow_publishes_a_cost_artifact_and_the_variants_serving_each_runtime(
    tmp_path: Path, model_dir: Path
) -> None:
    cpu_under_runtimes = {
        "name": "cpu",
        "ep": "CPUExecutionProvider",
        "runtimes": ["ort-a", "ort-b"],
        "models": ["tiny-cls"],
    }
    spec = write_spec(
        tmp_path,
        tiny_models(model_dir),
        [CPU_TARGET, cpu_under_runtimes],
        runtimes={"ort-a": ["onnxruntime==1.32.0"], "ort-b": ["onnxruntime==1.32.0"]},
    )
    store = open_store(str(tmp_path / "store"))
    report = fleet_compile(spec=str(spec), store=store.uri, workers=1)
    assert report.failed == 0 and report.published
    artifact = Artifact.get("fleet-compile-costs")
    assert artifact is not None and isinstance(artifact.data, str)
    expected = costs(store, read_manifest(store)[0])
    assert artifact.data == cost_markdown(expected)
    assert "| tiny-cls |" in artifact.data and "| tiny-det |" in artifact.data
    assert expected.totals.referenced > 0 and expected.totals.unreferenced == 0
    served = Artifact.get("fleet-compile-runtimes")
    assert served is not None and isinstance(served.data, str)
    assert served.data.splitlines() == [
        "```",
        "runtime ort-a: onnxruntime 1.32.0",
        "  served by cpu.ort-a (1 model)",
        "runtime ort-b: onnxruntime 1.32.0",
        "  served by cpu.ort-b (1 model)",
        "```",
    ]
