"""Enrolled device keys (the signed key bins) survive every later change of the signed
manifest: a rollout moved by the gate or by hand (advance, halt, revert), a publish, a
retirement, a revocation of another device; on a local store and on S3 over HTTP (moto).
A change that dropped them would leave a rollout that requires authenticated reports deaf
to every device (measured on main at 6f686e4: one advance emptied ``device_keys``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.fleet.evidence.enrolment import keys_in_force
from epfleet.fleet.rollout.rollouts import Move, move
from epfleet.formats.rollout import Rollout, RolloutPolicy
from epfleet.stores import Store
from tests.support.publish_helpers import publish_new
from tests.support.signed_store import signed_store, stage
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast

MODEL = "model-0"
STARTED = datetime.now(timezone.utc) - timedelta(hours=2)
ROLLOUT = Rollout(
    id="1" * 16,
    salt="5a17" * 8,
    policy=RolloutPolicy(stages=[10, 50, 100], canary=["dev-000"], authenticated_reports=True),
    stage=0,
    started_at=STARTED,
    stage_started_at=STARTED,
)


@pytest.fixture(params=on_stores("local", "s3"))
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A signed store whose model-0 is under a rollout that requires signed reports."""
    opened = signed_store(request, tmp_path, monkeypatch)
    stage(opened, ROLLOUT)
    return opened


def enrolled(store: Store) -> set[str]:
    return set(keys_in_force(store))  # the signed key bins


def test_enrolled_keys_survive_rollout_moves_and_publishes(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "device-keys"
    for device in ("dev-000", "dev-001"):
        code = main(["device", "enroll", device, "--store", store.uri, "--keys", str(keys)])
        assert code == 0, capsys.readouterr().err
    assert enrolled(store) == {"dev-000", "dev-001"}
    hows: list[Move] = ["advance", "halt", "revert"]
    for how in hows:
        moved = move(store, MODEL, how, f"by hand: {how}")
        assert moved.move == how
        assert enrolled(store) == {"dev-000", "dev-001"}, f"after {how}"
    publish_new(store, 1)
    assert enrolled(store) == {"dev-000", "dev-001"}, "after a publish"
    assert main(["retire", "--store", store.uri, "--model", "model-1"]) == 0
    assert enrolled(store) == {"dev-000", "dev-001"}, "after a retirement"
    code = main(["device", "revoke", "dev-001", "--store", store.uri])
    assert code == 0 and enrolled(store) == {"dev-000"}
    capsys.readouterr()
    assert main(["device", "list", "--store", store.uri, "--json"]) == 0
    assert "dev-000" in capsys.readouterr().out
