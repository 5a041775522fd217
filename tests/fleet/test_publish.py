"""Publishing the manifest with compare-and-swap: concurrent publishers lose nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.errors import StoreError
from epfleet.fleet.publishing.publish import publish, read_manifest
from epfleet.stores import MANIFEST_KEY, Store, open_store
from tests.support.publish_helpers import one_model, publish_new, race
from tests.support.s3proxy import FaultProxy

pytestmark = pytest.mark.fast


def check_all_landed(store: Store, count: int) -> None:
    manifest, _ = read_manifest(store)
    assert manifest is not None
    assert sorted(manifest.models) == sorted(f"model-{i}" for i in range(count))
    assert manifest.generation == count  # every publish was one compare-and-swap step


def test_race_on_a_local_store(tmp_path: Path) -> None:
    race(str(tmp_path / "store"))
    check_all_landed(open_store(str(tmp_path / "store")), 16)


def test_race_on_s3(s3_store_uri: str) -> None:
    race(s3_store_uri)
    check_all_landed(open_store(s3_store_uri), 16)


def test_s3_409_conflicts_are_retried(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    store = open_store(f"s3://{s3_bucket}/fleet")
    publish_new(store, 0)
    s3_proxy.conflict_next_conditional_puts(3)
    outcome = publish_new(store, 1)
    assert outcome.published and outcome.manifest is not None and outcome.manifest.generation == 2
    check_all_landed(store, 2)


def test_lost_publish_response_is_not_a_conflict(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    store = open_store(f"s3://{s3_bucket}/fleet")
    publish_new(store, 0)
    s3_proxy.lose_next_put_responses(f"/{s3_bucket}/fleet/{MANIFEST_KEY}", 1)
    outcome = publish_new(store, 1)
    assert outcome.published and outcome.manifest is not None and outcome.manifest.generation == 2
    check_all_landed(store, 2)


def test_invalid_manifest_is_never_published_over(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    store.write(MANIFEST_KEY, b'{"schema_version": "1.0", "generation": "lots"}')
    with pytest.raises(StoreError, match="fails validation, refusing to publish over it"):
        publish_new(store, 0)
    assert (
        tmp_path / MANIFEST_KEY
    ).read_bytes() == b'{"schema_version": "1.0", "generation": "lots"}'


def test_a_manifest_naming_a_removed_object_is_not_published(tmp_path: Path) -> None:
    """A run that found an object already stored skips uploading it; when `epfleet gc`
    removed it meanwhile, the publish is refused and the manifest in the store is kept."""
    store = open_store(str(tmp_path / "store"))
    publish_new(store, 1)
    before = store.read(MANIFEST_KEY)
    sources, variants = one_model(2)
    store.write(
        next(iter(sources.values())).uri, bytes(3)
    )  # the source is there, the variant is not
    with pytest.raises(StoreError, match=r"variants/model-2/cpu/.* was removed while this run"):
        publish(store, sources, dict.fromkeys(sources), variants)
    after = store.read(MANIFEST_KEY)
    assert before is not None and after is not None and after.data == before.data
