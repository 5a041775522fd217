"""A device of this epfleet and a manifest written by a newer one, end to end on a real
signed local store of the compiled fleet.

A newer publisher (the test's TUF writer, ``Repo``, signing as it would: the document's
schema version beside each signed entry) adds fields at the top, in a model entry, in a
variant and in its verification, under schema 1.9: the device installs the new build,
through the model's bin alone (``--model``) and through the whole signed manifest. The
same unknown key under 1.0 is refused (a typo or tampering in a document it fully
understands), and a 2.0 manifest is refused with the fix; both keep what runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.hashing import sha256_bytes
from tests.support.signed_fleet import (
    DEVICE,
    MODEL,
    Fleet,
    assert_refused,
    first_sync,
    only,
    rebuilt,
    trust_of,
)
from tests.support.synced_fleet import assert_package_runs, republish_edited_cpu_variant

pytestmark = [pytest.mark.fast]


def publish_as(fleet: Fleet, version: str) -> bytes:
    """A newer publisher's publish: a new build of tiny-cls's CPU variant, and fields this
    epfleet does not know at every level a device reads, signed under ``version``.
    Returns the new build's bytes."""
    directory = fleet.site.directory
    built = republish_edited_cpu_variant(directory, rebuilt)
    document: dict[str, Any] = json.loads((directory / "manifest.json").read_bytes())
    document["schema_version"] = version
    document["signed_by"] = "ci-7"
    entry = document["models"][MODEL]
    entry["licence"] = {"spdx": "MIT"}
    variant = entry["variants"]["x86-cpu"]
    variant["power_profile"] = "eco"
    variant["verification"]["energy_joules"] = 0.4
    (directory / "manifest.json").write_text(json.dumps(document, indent=2))
    fleet.repo.publish()
    fleet.site.push()
    return built


def test_a_device_installs_a_newer_minor_through_its_bin_and_the_whole_manifest(
    local_fleet: Fleet, tmp_path: Path
) -> None:
    fleet = local_fleet
    first = first_sync(fleet)
    built = publish_as(fleet, "1.9")
    bin_json = json.loads(
        max(fleet.repo.meta.glob(f"*.{fleet.repo.bin_of(MODEL)}.json"), key=_version).read_text()
    )
    custom = bin_json["signed"]["targets"][f"models/{MODEL}"]["custom"]
    assert custom["epfleet_schema"] == "1.9" and "licence" in custom["epfleet"]

    report = fleet.sync()  # models=[tiny-cls]: its entry from its signed bin alone
    assert report.exit_code == 0, report.manifest
    got = only(report)
    assert got.action == "downloaded", got.reason
    assert got.artifact_sha256 == sha256_bytes(built) != first.artifact_sha256
    assert_package_runs(fleet.cache, {MODEL: got.variant or ""})
    again = fleet.sync()  # the cached manifest of a newer minor is read again alike
    assert again.exit_code == 0 and only(again).action == "kept", only(again).reason

    every = sync(
        fleet.site.uri, tmp_path / "whole", SyncPolicy(models=None), DEVICE, trust_root=fleet.root
    )
    assert every.exit_code == 0, every.manifest
    assert every.manifest.generation is not None
    taken = {m.model: m for m in every.models}
    assert taken[MODEL].artifact_sha256 == sha256_bytes(built), taken[MODEL].reason
    assert sorted(taken) == ["tiny-cls", "tiny-det"]


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("1.0", ["fails validation at", "Extra inputs are not permitted"]),
        (
            "2.0",
            [
                "schema 2.0, newer than this epfleet reads (1.x): update epfleet on this "
                "device; the manifest in force stays"
            ],
        ),
    ],
)
def test_an_unknown_key_at_its_own_minor_and_a_newer_major_are_refused(
    local_fleet: Fleet, version: str, says: list[str]
) -> None:
    fleet = local_fleet
    kept = first_sync(fleet)
    publish_as(fleet, version)
    report = fleet.sync()
    assert_refused(report, kept, *says)
    assert only(report).artifact_sha256 == kept.artifact_sha256
    assert trust_of(fleet.cache, fleet.site.uri).is_dir()


def _version(path: Path) -> int:
    return int(path.name.split(".")[0])
