"""A signed store with one model published, on a local store or S3, and that model staged
under a rollout: the fixture of the trust tests that move rollouts, enrol device keys and
order reports through signed publishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.fleet.publishing.publish import update_manifest
from epfleet.formats.manifest import Manifest, utcnow
from epfleet.formats.rollout import Rollout
from epfleet.stores import Store, open_store
from epfleet.trust.repository import has_trust, init_with_key_files
from tests.support.publish_helpers import publish_new

MODEL = "model-0"


def signed_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Store:
    """The store of ``request.param`` ("local", or "s3": the ``s3_store_uri`` fixture's)
    with model-0 published and signed: a local store signs with the development keys its
    first publish creates, S3 with keys made here (``EPFLEET_TRUST_SIGNER``)."""
    uri = (
        str(tmp_path / "store")
        if request.param == "local"
        else request.getfixturevalue("s3_store_uri")
    )
    opened = open_store(uri)
    publish_new(opened, 0)
    if not has_trust(opened):
        _, signer = init_with_key_files(opened, tmp_path / "fleet-keys", bins=16, adopt=True)
        monkeypatch.setenv("EPFLEET_TRUST_SIGNER", signer)
    return opened


def stage(store: Store, rollout: Rollout, model: str = MODEL) -> None:
    """``model`` staged under ``rollout``, its CPU variant kept as the way back."""

    def staged(current: Manifest | None) -> Manifest | None:
        assert current is not None
        entry = current.models[model]
        moved = entry.model_copy(
            update={"rollout": rollout, "previous": {"cpu": entry.variants["cpu"]}}
        )
        return current.succeeded_by(current.models | {model: moved}, utcnow())

    update_manifest(store, staged)
