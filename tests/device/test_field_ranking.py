"""Measured choice end to end, on a real signed store: devices report the latency of the
variant they run (signed with their enrolled keys), the rollout gate signs a ranking per
hardware profile and runtime, and at their next sync the devices of each profile activate
the variant measured fastest on their profile; with no evidence, or with only forged
evidence, they activate what they did before; a tampered ranking is refused and said."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from securesystemslib.dsse import Envelope

from epfleet.device.local_eps import LocalEps
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.fleet.evidence.enrolment import enroll
from epfleet.fleet.rollout.rollouts import run_gate
from epfleet.formats.device_report import REPORT_PAYLOAD_TYPE, DeviceReport, report_key
from epfleet.stores import Store
from epfleet.trust.keys import new_key
from epfleet.trust.layout import metadata_key
from epfleet.trust.state import read_state
from epfleet.trust.targets import ranking_target
from tests.support.ranked_fleet import (
    MODEL,
    OtherHardware,
    hardware_a,
    hardware_b,
    latency_report,
    make_ranked_fleet,
    put_signed,
)

pytestmark = pytest.mark.fast

REPORTERS = [f"a{i}" for i in range(1, 9)] + [f"b{i}" for i in range(1, 5)] + ["c1"]
GENUINE = {  # device -> (profile, target, its median run in ms)
    "a1": ("a", "cpu-a", 9.0),
    "a2": ("a", "cpu-a", 9.4),
    "a3": ("a", "cpu-b", 3.0),
    "a4": ("a", "cpu-b", 3.2),
    "b1": ("b", "cpu-a", 2.0),
    "b2": ("b", "cpu-a", 2.2),
    "b3": ("b", "cpu-b", 8.0),
    "b4": ("b", "cpu-b", 8.5),
}


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Store, Path, dict]:
    store, root, signer, keys = make_ranked_fleet(str(tmp_path / "store"), tmp_path, REPORTERS)
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", signer)
    monkeypatch.setenv("EPFLEET_RANKING_MIN_DEVICES", "2")
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "worker"))
    monkeypatch.setattr("epfleet.fleet.evidence.index_rules.SETTLE_SECONDS", 0.0)
    return store, root, keys


def active(
    store: Store, root: Path, cache: Path, device: str, local: LocalEps | None = None
) -> tuple[str | None, DeviceReport]:
    report = sync(store.uri, cache, SyncPolicy(), device, trust_root=root, local=local)
    [found] = report.models
    assert found.served, found.reason
    return found.target, report


def put_genuine(store: Store, keys: dict) -> None:
    hardware = {"a": hardware_a(), "b": hardware_b()}
    for device, (profile, target, p50) in GENUINE.items():
        put_signed(
            store, latency_report(store, device, hardware[profile], target, p50), keys[device]
        )


def test_each_profile_activates_its_fastest_variant_at_the_next_sync(
    fleet: tuple[Store, Path, dict], tmp_path: Path
) -> None:
    store, root, keys = fleet
    other = OtherHardware()
    # no evidence: today's order (the declared preference: cpu-a) on both profiles
    assert active(store, root, tmp_path / "dev-a", "dev-a")[0] == "cpu-a"
    assert active(store, root, tmp_path / "dev-b", "dev-b", other)[0] == "cpu-a"
    generation = read_state(store).document.generation  # type: ignore[union-attr]

    put_genuine(store, keys)
    reading, _ = run_gate(store)
    assert reading.rankings_published is not None and reading.rankings_published.signed
    [ranking] = reading.rankings.values()
    orders = {p.hardware: p.targets for p in ranking.profiles}
    assert sorted(orders.values()) == [["cpu-a", "cpu-b"], ["cpu-b", "cpu-a"]]
    # a side document: the manifest did not change, and a pass with the same evidence
    # signs nothing
    assert read_state(store).document.generation == generation  # type: ignore[union-attr]
    again, _ = run_gate(store)
    assert again.rankings_published is not None and not again.rankings_published.signed
    # a publish of the manifest (an enrolment) carries the signed ranking as it is
    enroll(store, "late", keys_dir=tmp_path / "device-keys")
    assert read_state(store).document.generation == generation + 1  # type: ignore[union-attr]

    target, report = active(store, root, tmp_path / "dev-a", "dev-a")
    assert target == "cpu-b"
    assert report.models[0].action == "downloaded"
    assert "field ranking of this hardware and runtime, fastest first: cpu-b 3.1 ms" in (
        report.models[0].reason
    )
    assert active(store, root, tmp_path / "dev-b", "dev-b", other)[0] == "cpu-a"
    assert active(store, root, tmp_path / "new-a", "new-a")[0] == "cpu-b"
    assert active(store, root, tmp_path / "new-b", "new-b", other)[0] == "cpu-a"


def forge(store: Store, keys: dict) -> None:
    """Reports pushing cpu-a first on profile a (0.1 ms) and cpu-b last, by every way that
    must not count."""
    hardware = hardware_a()

    def fast(device: str, target: str = "cpu-a", p50: float = 0.1) -> DeviceReport:
        return latency_report(store, device, hardware, target, p50)

    stranger = new_key()
    for i in range(4):  # devices nobody enrolled, signed with keys nobody enrolled
        put_signed(store, fast(f"x{i}"), stranger)
        put_signed(store, fast(f"y{i}", "cpu-b", 500.0), None)  # nobody enrolled, unsigned
    put_signed(store, fast("a5"), stranger)  # an enrolled id, another key's signature
    put_signed(store, fast("a6", "cpu-b", 500.0), None)  # an enrolled id, unsigned
    # numbers that are not finite, signed by the enrolled device itself
    for device, value in (("a7", math.nan), ("a8", math.inf)):
        body = fast(device).model_dump(mode="json")
        body["models"][0]["profile"]["p50_ms"] = value
        payload = json.dumps(body).encode()  # NaN and Infinity, as json writes them
        envelope = Envelope(payload=payload, payload_type=REPORT_PAYLOAD_TYPE, signatures={})
        envelope.sign(keys[device])
        data = json.dumps(envelope.to_dict()).encode()
        store.write(report_key(device), gzip.compress(data), content_encoding="gzip")
    # one enrolled device voting many times: a model listed five times in its report, and
    # its report copied under other devices' keys
    one = fast("c1")
    one = one.model_copy(update={"models": one.models * 5})
    for under in ("c1", "x10", "x11", "a1"):
        put_signed(store, one, keys["c1"], under=under)


def test_forged_latency_reports_change_no_devices_choice(
    fleet: tuple[Store, Path, dict], tmp_path: Path
) -> None:
    store, root, keys = fleet
    forge(store, keys)
    reading, _ = run_gate(store)
    assert reading.rankings == {}  # only forgeries and one vote: no ranking
    assert reading.ranking_refused == {
        "not enrolled": 4,  # x0-x3
        "unsigned": 5,  # y0-y3, a6
        "bad signature": 1,  # a5 under a stranger's key
        "unreadable": 2,  # a7's NaN, a8's inf, signed by themselves
        "key": 3,  # c1's report under x10, x11 and a1
        "repeated": 4,  # c1's four more mentions of m
    }
    assert active(store, root, tmp_path / "dev-a", "dev-a")[0] == "cpu-a"

    put_genuine(store, keys)
    genuine, _ = run_gate(store)
    [before] = genuine.rankings.values()
    forge(store, keys)  # again, over the genuine reports of a1 and b3
    forged, _ = run_gate(store)
    [after] = forged.rankings.values()
    profile_a = next(p for p in after.profiles if p.targets == ["cpu-b", "cpu-a"])
    cpu_a = next(m for m in profile_a.order if m.target == "cpu-a")
    assert cpu_a.devices <= 3  # c1's one vote at most, never five, never under a1's key
    assert [p.targets for p in after.profiles] == [p.targets for p in before.profiles]
    assert active(store, root, tmp_path / "dev-a", "dev-a")[0] == "cpu-b"
    assert active(store, root, tmp_path / "dev-b", "dev-b", OtherHardware())[0] == "cpu-a"


def test_a_tampered_ranking_is_refused_and_the_device_keeps_its_order(
    fleet: tuple[Store, Path, dict], tmp_path: Path
) -> None:
    store, root, keys = fleet
    other = OtherHardware()
    assert active(store, root, tmp_path / "dev-b", "dev-b", other)[0] == "cpu-a"
    put_genuine(store, keys)
    run_gate(store)
    state = read_state(store)
    path = ranking_target(MODEL, state.succinct)
    ranking_bin = state.succinct.get_role_for_target(path)
    assert ranking_bin == state.succinct.get_role_for_target(f"models/{MODEL}")  # one bin
    version = state.snapshot.signed.meta[f"{ranking_bin}.json"].version  # type: ignore[union-attr]
    key = metadata_key(ranking_bin, version)
    signed = json.loads(store.read(key).data)  # type: ignore[union-attr]
    custom = signed["signed"]["targets"][path]["custom"]
    ranking = json.loads(custom["epfleet"])
    for profile in ranking["profiles"]:
        profile["order"].reverse()  # every profile's slowest first: cpu-b on profile b
    custom["epfleet"] = json.dumps(ranking)
    store.write(key, json.dumps(signed, separators=(",", ":")).encode())

    report = sync(
        store.uri, tmp_path / "dev-b", SyncPolicy(), "dev-b", trust_root=root, local=other
    )
    # a device wanting every model takes its entries from the signed manifest.json: only
    # the ranking's bin is refused, and said
    assert report.manifest.status == "fetched"
    assert any(
        "the signed field ranking of 'm'" in w and "ordered as with no evidence" in w
        for w in report.warnings
    ), report.warnings
    [found] = report.models
    assert found.target == "cpu-a"  # the order it had, not the tampered ranking's cpu-b
    assert "field ranking" not in found.reason
    # a device wanting m by name loads the same bin for its entry: the refresh is refused
    # whole, and the device keeps what it runs
    named = sync(store.uri, tmp_path / "dev-b", SyncPolicy(models=[MODEL]), "dev-b",
                 trust_root=root, local=other)  # fmt: skip
    assert named.manifest.status == "rejected"
    assert named.models[0].target == "cpu-a"
