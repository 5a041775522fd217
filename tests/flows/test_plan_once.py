"""A compile run is planned once: ``epfleet compile`` hands its plan to the flow run it
starts, and a flow run started any other way plans for itself (real Prefect API, real
compiles; the planner is only wrapped to count its calls)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tasks.compile
from epfleet.cli.app import main
from epfleet.fleet.planning import plan as planning
from epfleet.formats.manifest import Manifest
from flows.fleet_compile import fleet_compile
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Each real ``plan_run`` call, as (spec, store)."""
    calls: list[tuple[str, str]] = []
    real = planning.plan_run

    def counted(spec_path, store_uri, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((str(spec_path), store_uri))
        return real(spec_path, store_uri, *args, **kwargs)

    monkeypatch.setattr(planning, "plan_run", counted)
    monkeypatch.setattr(tasks.compile, "plan_run", counted)
    return calls


def test_the_command_plans_once_and_the_flow_takes_its_plan(
    tmp_path: Path, model_dir: Path, plans: list[tuple[str, str]]
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store = tmp_path / "store"
    code = main(["compile", str(spec), "--store", str(store), "--workers", "1"])
    assert code == 0
    assert plans == [(str(spec), str(store))]
    manifest = Manifest.from_json((store / "manifest.json").read_bytes())
    assert sorted(manifest.models) == ["tiny-cls", "tiny-det"]


def test_a_flow_run_started_otherwise_plans_for_itself(
    tmp_path: Path, model_dir: Path, plans: list[tuple[str, str]]
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    report = fleet_compile(spec=str(spec), store=str(tmp_path / "store"), workers=1)
    assert report.compiled == 2
    assert len(plans) == 1


def test_a_plan_is_taken_only_by_a_run_of_the_same_inputs(tmp_path: Path) -> None:
    plan = planning.RunPlan(store="s", sources={}, pairs=[], generation=0, published_sources={})
    made_for = planning.plan_inputs(tmp_path / "fleet.yaml", "s", ["a"], None, False)
    with planning.handing_over(plan, made_for):
        assert (
            planning.handed_plan(
                planning.plan_inputs(tmp_path / "fleet.yaml", "s", ["a"], [], False)
            )
            is plan
        )
        for other in (
            planning.plan_inputs(tmp_path / "other.yaml", "s", ["a"], None, False),
            planning.plan_inputs(tmp_path / "fleet.yaml", "t", ["a"], None, False),
            planning.plan_inputs(tmp_path / "fleet.yaml", "s", ["b"], None, False),
            planning.plan_inputs(tmp_path / "fleet.yaml", "s", ["a"], None, True),
        ):
            assert planning.handed_plan(other) is None
    assert planning.handed_plan(made_for) is None
