"""The ``trust-refresh`` flow on a Prefect API: it signs the timestamp and snapshot of a
store's TUF metadata again, says when they expire, and completes on an unsigned store."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.artifacts import Artifact
from tuf.api.metadata import Metadata

from epfleet.stores import open_store
from epfleet.trust.keys import file_uri
from epfleet.trust.repository import TIMESTAMP_KEY, utcnow
from flows.trust_refresh import trust_refresh
from tests.support.trust_helpers import make_trusted_store

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


def test_the_flow_signs_timestamp_and_snapshot_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(str(tmp_path / "store"))
    keys = tmp_path / "keys"
    make_trusted_store(store, keys)
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", file_uri(keys / "online.pem"))
    assert trust_refresh(store=str(tmp_path / "store")) == 2
    stamp = Metadata.from_bytes(store.read(TIMESTAMP_KEY).data)  # type: ignore[union-attr]
    assert stamp.signed.version == 2 and stamp.signed.snapshot_meta.version == 2
    assert stamp.signed.expires > utcnow()
    table = Artifact.get("trust-refresh-expiries")
    assert table is not None and "timestamp" in str(table.data)


def test_the_flow_completes_on_a_store_without_trust_metadata(tmp_path: Path) -> None:
    assert trust_refresh(store=str(tmp_path / "unsigned")) is None
