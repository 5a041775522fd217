"""Rollout moves mean what they say (epfleet/fleet/rollout/rollouts.py ``move``): an advance of a
halted rollout is refused until ``epfleet rollout resume``, and a move that changes
nothing (a halt of a halted rollout, a resume of an active one) publishes nothing and says
so; on a local store and on S3 over HTTP (moto), where a move is a signed publish."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.fleet.rollout.rollouts import move
from epfleet.formats.manifest import Manifest
from epfleet.formats.rollout import Rollout, RolloutPolicy
from epfleet.stores import Store
from tests.support.signed_store import signed_store, stage
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast

MODEL = "model-0"
STARTED = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
ROLLOUT = Rollout(
    id="1" * 16,
    salt="5a17" * 8,
    policy=RolloutPolicy(stages=[10, 50, 100]),
    stage=0,
    started_at=STARTED,
    stage_started_at=STARTED,
)


@pytest.fixture(params=on_stores("local", "s3"))
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A signed store whose model-0 is under a rollout at its first stage."""
    opened = signed_store(request, tmp_path, monkeypatch)
    stage(opened, ROLLOUT)
    return opened


def signed(store: Store) -> Manifest:
    manifest = read_in_force(store).manifest
    assert manifest is not None
    return manifest


def rollout(store: Store) -> Rollout:
    found = signed(store).models[MODEL].rollout
    assert found is not None
    return found


def run(store: Store, how: str, *extra: str) -> int:
    return main(["rollout", how, "--store", store.uri, "--model", MODEL, *extra])


def test_a_halt_of_a_halted_rollout_publishes_nothing(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(store, "halt", "--reason", "crash reports") == 0
    assert "halted, stage 1 (published)" in capsys.readouterr().out
    generation = signed(store).generation

    assert run(store, "halt", "--reason", "again") == 0
    assert capsys.readouterr().out == (
        f"{MODEL}: rollout {ROLLOUT.id} halted, stage 1 "
        "(unchanged: its rollout is halted already, nothing published)\n"
    )
    assert signed(store).generation == generation
    assert rollout(store).reason == "crash reports"  # the first reason stays


def test_a_halted_rollout_is_advanced_only_after_a_resume(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(store, "halt", "--reason", "crash reports") == 0
    generation = signed(store).generation
    capsys.readouterr()

    assert run(store, "advance") == 2
    err = capsys.readouterr().err
    assert (
        f"model 'model-0' in {store.uri}: its rollout is halted (crash reports) at stage 1: "
        "resume it first (epfleet rollout resume), then advance; nothing to advance"
    ) in err
    assert signed(store).generation == generation
    assert (rollout(store).state, rollout(store).stage) == ("halted", 0)

    assert run(store, "resume") == 0
    assert "active, stage 1 (published)" in capsys.readouterr().out
    resumed = rollout(store)
    assert (resumed.state, resumed.stage, resumed.reason) == ("active", 0, None)
    assert resumed.stage_started_at == ROLLOUT.stage_started_at  # the stage goes on

    assert run(store, "advance") == 0
    assert "active, stage 2 (published)" in capsys.readouterr().out
    assert rollout(store).stage == 1


def test_a_resume_of_an_active_rollout_publishes_nothing(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    generation = signed(store).generation
    assert run(store, "resume") == 0
    assert "(unchanged: its rollout is active already, nothing published)" in (
        capsys.readouterr().out
    )
    assert signed(store).generation == generation


def test_a_revert_of_a_reverted_rollout_is_refused_and_publishes_nothing(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(store, "revert", "--reason", "accuracy") == 0
    generation = signed(store).generation
    capsys.readouterr()
    assert run(store, "revert") == 2
    assert "its rollout is reverted; nothing to revert" in capsys.readouterr().err
    assert run(store, "resume") == 2
    assert "its rollout is reverted; nothing to resume" in capsys.readouterr().err
    assert signed(store).generation == generation


def test_the_gates_advance_of_a_rollout_halted_since_it_judged_leaves_it_halted(
    store: Store,
) -> None:
    assert run(store, "halt", "--reason", "crash reports") == 0
    generation = signed(store).generation
    moved = move(store, MODEL, "advance", "the gate: 5 member devices", ROLLOUT.id)
    assert not moved.published and moved.state == "halted"
    assert moved.unchanged is not None
    assert moved.unchanged.startswith("its rollout is halted now: its rollout is halted")
    assert signed(store).generation == generation
    assert rollout(store).state == "halted"
