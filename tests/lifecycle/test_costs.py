"""The cost view: bytes per model and target, and the store's total split into referenced,
unreferenced and other, on a local store and on S3 (moto over HTTP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.fleet.publishing.publish import read_manifest
from epfleet.lifecycle.costs import cost_markdown, cost_table, costs
from epfleet.stores import Store, open_store
from tests.support.gc_fleet import make_fleet, referenced, referenced_by

pytestmark = pytest.mark.fast


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/fleet")


def test_costs_per_model_target_and_store(store: Store) -> None:
    store, fleet = make_fleet(store)
    manifest = fleet.manifest
    data = costs(store, manifest)
    (cls,) = data.models
    entry = manifest.models["cls"]
    sizes = {t: v.artifact.size for t, v in entry.variants.items() if v.artifact}
    assert cls.variants == sizes and cls.source == entry.source.size
    assert cls.total == entry.source.size + (entry.samples.size if entry.samples else 0) + sum(
        sizes.values()
    )
    assert {t.target: t.bytes for t in data.targets} == sizes
    listed = {o.key: o.size for o in store.list_objects("", hidden=True)}
    uploads = sum(u.size for u in store.incomplete_uploads())
    t = data.totals
    assert t.objects == len(listed)
    assert t.total == sum(listed.values()) + uploads
    assert t.referenced == sum(listed[k] for k in referenced(manifest))
    gc_kinds = fleet.removable | fleet.pinned | fleet.young
    assert t.unreferenced == sum(listed[k] for k in gc_kinds) + uploads
    assert t.referenced + t.unreferenced + t.other == t.total and t.other > 0
    assert t.missing == []

    text = cost_table(store, manifest)
    assert text.splitlines()[0].split() == ["model", "source", "samples", "htp", "x86-cpu", "total"]
    assert "all models" in text and f"in {t.objects} objects" in text
    markdown = cost_markdown(data)
    assert markdown.startswith("| model | source | samples | htp | x86-cpu | total |\n|---|")


def test_missing_referenced_files_are_named(tmp_path: Path) -> None:
    store, fleet = make_fleet(open_store(str(tmp_path / "store")))
    lost = sorted(referenced_by(fleet.manifest.models["cls"]))[0]
    store.delete(lost)
    manifest, _ = read_manifest(store)
    data = costs(store, manifest)
    assert data.totals.missing == [lost]
    assert f"MISSING 1 referenced file(s): {lost}" in cost_table(store, manifest)


def test_empty_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "empty"))
    data = costs(store, None)
    assert data.models == [] and data.totals.total == 0 and data.generation is None
    assert "0 B in 0 objects" in cost_table(store, None)
