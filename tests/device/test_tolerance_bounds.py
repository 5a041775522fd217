"""The loosest tolerance a device accepts (``eps.base.LOOSEST_TOLERANCE``): a health check
never compares more loosely, whatever tolerance the manifest entry carries (one validated
under older rules, or signed with a stolen online key). The spec's and the manifest's own
refusals are in tests/formats/test_spec.py and tests/formats/test_manifest.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from epfleet.device.health import HealthJob, check_health
from epfleet.errors import HealthCheckError
from epfleet.runtime.samples import write_golden
from eps.base import LOOSEST_TOLERANCE, Tolerance, bounded

pytestmark = pytest.mark.fast


def test_bounded_never_loosens_and_treats_nan_as_loosest() -> None:
    assert bounded(Tolerance(0.05, 1e-3)) == Tolerance(0.05, 1e-3)
    assert bounded(Tolerance(1e9, 1e9)) == LOOSEST_TOLERANCE
    assert bounded(Tolerance(math.nan, math.nan)) == LOOSEST_TOLERANCE


def _identity(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 11])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("scale", "accepted"), [(2.0, False), (1.2, True)])
def test_a_health_check_compares_no_looser_than_the_bound(
    tmp_path: Path, scale: float, accepted: bool
) -> None:
    """The variant (an identity) against golden outputs ``scale`` times its own: off by
    50 % of their range at 2.0, 16.7 % at 1.2. The entry claims a tolerance of 1e9."""
    x = np.linspace(0, 1, 11, dtype=np.float32).reshape(1, 11)
    golden = tmp_path / "golden.npz"
    write_golden(golden, [{"x": x}], [[x * scale]])
    job = HealthJob(
        label="identity",
        path=str(_identity(tmp_path / "identity.onnx")),
        ep="CPUExecutionProvider",
        device="cpu",
        provider_options={},
        input_shapes={},
        golden_path=str(golden),
        tolerance=Tolerance(relative=1e9, absolute=1e9),
    )
    if accepted:
        health = check_health(job)
        assert health.max_rel_error is not None and 0.16 < health.max_rel_error < 0.17
        return
    with pytest.raises(HealthCheckError) as refused:
        check_health(job)
    assert "differs from the source by 50.0% of its range (tolerance 25.0%; " in str(refused.value)
    assert "absolute floor of 0.05); not activated" in str(refused.value)
