"""The shadow run itself, in this process (the sync runs it in its worker: the end-to-end
test, tests/fleet/test_shadow_rollout.py): the candidate beside the active variant on the
app's inputs or the golden samples' inputs, judged by the candidate's tolerance (and task
metric, whose value it reports), with its figures; inputs that do not fit are refused
naming the array."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from epfleet.device.health import HealthJob, ShadowJob, run_shadow
from epfleet.errors import HealthCheckError
from epfleet.formats.task_metric import TaskMetric
from epfleet.runtime.samples import write_golden, write_samples
from eps.base import Tolerance
from examples.build_models import tiny_cls

pytestmark = pytest.mark.fast

SHAPE = [1, 3, 48, 192]


def fixed(model: onnx.ModelProto) -> onnx.ModelProto:
    for dim, size in zip(model.graph.input[0].type.tensor_type.shape.dim, SHAPE, strict=True):
        dim.Clear()
        dim.dim_value = size
    return model


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tiny-cls, and tiny-cls with the weights of classes 0 and 1 of its last layer swapped."""
    out = tmp_path_factory.mktemp("shadow")
    model = fixed(tiny_cls())
    onnx.save(model, str(out / "active.onnx"))
    [weights] = [i for i in model.graph.initializer if i.name == "fc.w"]
    array = numpy_helper.to_array(weights).copy()
    array[:, [0, 1]] = array[:, [1, 0]]
    weights.CopyFrom(numpy_helper.from_array(array, "fc.w"))
    onnx.save(model, str(out / "swapped.onnx"))
    samples = [
        {"x": np.random.default_rng(k).uniform(-1, 1, SHAPE).astype(np.float32)} for k in range(16)
    ]
    write_samples(out / "app.npz", samples)
    write_golden(out / "golden.npz", samples[:2], [[np.zeros((1, 4), np.float32)]] * 2)
    return {p.stem: p for p in out.iterdir()}


def job(
    variants: dict[str, Path],
    candidate: str,
    inputs: str = "app",
    tolerance: float = 0.001,
    metric: TaskMetric | None = None,
) -> ShadowJob:
    def health(label: str) -> HealthJob:
        return HealthJob(
            label=label,
            path=str(variants[label]),
            ep="CPUExecutionProvider",
            device="cpu",
            provider_options={},
            input_shapes={"x": SHAPE},
            tolerance=Tolerance(relative=tolerance, absolute=1e-5),
            metric=metric,
        )

    return ShadowJob(
        candidate=health(candidate),
        active=health("active"),
        inputs_path=str(variants[inputs]),
        inputs="app" if inputs != "golden" else "golden",
        samples=8,
    )


ARGMAX = TaskMetric(kind="argmax_agreement", output="probs", value=1.0, min=0.99)


def test_the_same_model_agrees_within_its_bounds_with_its_figures(
    variants: dict[str, Path],
) -> None:
    outcome = run_shadow(job(variants, "active", metric=ARGMAX))
    run = outcome.run
    assert outcome.outside is None and run.within
    assert (run.samples, run.inputs, run.max_rel_error, run.tolerance) == (8, "app", 0.0, 0.001)
    assert (run.metric, run.metric_value, run.metric_min) == ("argmax_agreement", 1.0, 0.99)
    assert run.candidate_p50_ms > 0 and run.active_p50_ms > 0 and run.seconds > 0


def test_a_perturbed_last_layer_is_outside_its_tolerance(variants: dict[str, Path]) -> None:
    outcome = run_shadow(job(variants, "swapped"))
    assert not outcome.run.within and outcome.outside is not None
    assert "differs from the active variant by" in outcome.outside
    assert outcome.run.max_rel_error is not None and outcome.run.max_rel_error > 0.01


def test_golden_inputs_run_at_most_what_the_file_holds(variants: dict[str, Path]) -> None:
    run = run_shadow(job(variants, "active", inputs="golden")).run
    assert run.within and (run.samples, run.inputs) == (2, "golden")


def test_app_inputs_that_do_not_fit_the_model_are_refused_naming_the_array(
    variants: dict[str, Path], tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.npz"
    write_samples(wrong, [{"image": np.zeros(SHAPE, np.float32)}])
    bad = job(variants, "active").model_copy(update={"inputs_path": str(wrong)})
    with pytest.raises(HealthCheckError, match=r"do not fit the model: .*\['image'\]"):
        run_shadow(bad)
