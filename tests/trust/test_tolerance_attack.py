"""What a signed entry can loosen on a device: nothing past ``eps.base.LOOSEST_TOLERANCE``.
A wrong build published with its verification tolerance inflated to 1e9, and signed with
the online key (a stolen key, or a forged manifest.json the signer took in), is refused
by the device's validation of the signed entry; the variant it runs stays active. (The
health check's own bound, for entries validated under older rules, is tested in
tests/device/test_tolerance_bounds.py.) Real syncs of the compiled fleet (``fleet_store``, tests/conftest.py),
signed by tests/support/signed_fleet.py's TUF writer."""

from __future__ import annotations

import json

import pytest

from tests.support.signed_fleet import MODEL, Fleet, assert_refused, first_sync
from tests.support.synced_fleet import republish_edited_cpu_variant, scale_largest_weight

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("loosened", [{"tolerance": 1e9}, {"abs_tolerance": 1e9}])
def test_a_signed_entry_loosening_the_health_check_is_refused(
    local_fleet: Fleet, loosened: dict[str, float]
) -> None:
    good = first_sync(local_fleet)
    store = local_fleet.site.directory
    republish_edited_cpu_variant(store, scale_largest_weight)  # runs, but 3x one weight
    document = json.loads((store / "manifest.json").read_bytes())
    document["models"][MODEL]["variants"]["x86-cpu"]["verification"].update(loosened)
    (store / "manifest.json").write_text(json.dumps(document))
    local_fleet.repo.publish()  # signed with the online key

    report = local_fleet.sync()

    [field] = loosened
    assert_refused(
        report,
        good,
        f"the signed entry of '{MODEL}'",
        f"fails validation at variants.x86-cpu.verification.{field}",
        "less than or equal to",
    )
