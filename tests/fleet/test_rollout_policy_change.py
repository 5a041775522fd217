"""A rollout policy changed in the spec during a rollout is applied by the next compile, which
says so, or refused before anything compiles (epfleet/fleet/rollout/rules.py
``follow_policy``): a compile with nothing else to do used to answer "up to date" and leave
the rollout on its old policy. The compiled test fleet, planned and published in-process
as ``epfleet compile`` does with no Prefect API."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from epfleet.cli.app import main
from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.publishing.publish import read_in_force, update_manifest
from epfleet.fleet.runs.compile_run import run_compiles
from epfleet.fleet.runs.plain_runner import PlainRunner
from epfleet.formats.manifest import Manifest, utcnow
from epfleet.formats.rollout import Rollout, RolloutPolicy
from epfleet.stores import Store, open_store
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec

pytestmark = pytest.mark.fast

MODEL = "tiny-cls"
STARTED = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
ROLLOUT = Rollout(
    id="2" * 16,
    salt="5a17" * 8,
    policy=RolloutPolicy(stages=[10, 50, 100]),
    stage=1,
    started_at=STARTED,
    stage_started_at=STARTED,
)


@pytest.fixture
def store(fleet_store: Path) -> Store:
    """The compiled test fleet, tiny-cls at the second stage of a rollout."""
    opened = open_store(str(fleet_store))

    def stage(current: Manifest | None) -> Manifest | None:
        assert current is not None
        entry = current.models[MODEL]
        staged = entry.model_copy(update={"rollout": ROLLOUT, "previous": dict(entry.variants)})
        return current.succeeded_by(current.models | {MODEL: staged}, utcnow())

    update_manifest(opened, stage)
    return opened


def spec_with(directory: Path, model_dir: Path, rollout: dict) -> Path:
    """The test fleet's spec, with ``rollout`` as its policy."""
    spec = write_spec(directory, tiny_models(model_dir), [*HTP_TARGETS, CPU_TARGET])
    document = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump(document | {"rollout": rollout}, sort_keys=False))
    return spec


def generation(store: Store) -> int:
    manifest = read_in_force(store).manifest
    assert manifest is not None
    return manifest.generation


def signed_rollout(store: Store) -> Rollout:
    manifest = read_in_force(store).manifest
    assert manifest is not None and manifest.models[MODEL].rollout is not None
    return manifest.models[MODEL].rollout


def test_a_changed_policy_is_applied_to_the_rollout_under_way_and_said(
    store: Store,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    same = spec_with(tmp_path, model_dir, {"stages": [10, 50, 100]})
    assert plan_run(same, store.uri).is_noop  # the policy it runs: nothing to do

    changed = spec_with(tmp_path, model_dir, {"stages": [10, 50, 100], "max_failure_rate": 0.2})
    plan = plan_run(changed, store.uri)
    assert not plan.is_noop and not plan.to_compile
    assert set(plan.policy_changes) == {MODEL}  # tiny-det has no rollout under way
    before = generation(store)
    report = run_compiles(plan, PlainRunner(store, os.cpu_count() or 1))
    assert report.published and report.generation == before + 1
    assert capsys.readouterr().err == (
        f"epfleet: model {MODEL}: its rollout {ROLLOUT.id} (active, stage 2) follows the "
        "spec's changed rollout policy: max_failure_rate 0.05 -> 0.2\n"
    )
    followed = signed_rollout(store)
    assert followed.policy.max_failure_rate == 0.2
    assert followed.model_dump(exclude={"policy"}) == ROLLOUT.model_dump(exclude={"policy"})
    assert plan_run(changed, store.uri).is_noop


def test_a_policy_without_the_stage_reached_is_refused_before_anything_compiles(
    store: Store,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    before = generation(store)
    fewer = spec_with(tmp_path, model_dir, {"stages": [100]})
    assert main(["compile", str(fewer), "--store", store.uri]) == 2
    err = capsys.readouterr().err
    assert (
        f"models[{MODEL}].rollout: the spec's rollout policy has 1 stage [100.0], and its "
        f"rollout {ROLLOUT.id} under way is at stage 2 [10.0, 50.0, 100.0]: advance or "
        "revert that rollout first, or keep its stages"
    ) in err
    assert generation(store) == before
    assert signed_rollout(store) == ROLLOUT


def test_a_policy_dropped_from_the_spec_leaves_the_rollout_as_it_is_and_says_so(
    store: Store,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    before = generation(store)
    spec = write_spec(tmp_path, tiny_models(model_dir), [*HTP_TARGETS, CPU_TARGET])
    plan = plan_run(spec, store.uri)
    assert plan.is_noop and set(plan.policy_kept) == {MODEL}
    capsys.readouterr()
    assert main(["compile", str(spec), "--store", store.uri]) == 0
    assert (
        f"epfleet: model {MODEL}: its rollout {ROLLOUT.id} (active, stage 2) keeps the policy "
        "it started with: the spec gives the model no rollout policy now"
    ) in capsys.readouterr().err
    assert generation(store) == before
    assert signed_rollout(store) == ROLLOUT
