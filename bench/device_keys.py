"""What enrolled device keys cost in the signed key bins, against the manifest that carried
them before, on a local signed store.

    python bench/device_keys.py [--devices 10000,100000] [--enrols 5]
    python bench/device_keys.py --batch 10000 [--sample 500]

``--batch N [--sample K]``: N devices enrolled into a new signed store one by one
(``epfleet device enroll --public-key``, N signed publishes) and into another in one batch
(``epfleet device enroll --from FILE``, ``enroll_batch``): wall time, store PUTs and GETs
(and HEADs), side by side as ratios. With ``--sample K`` the one-by-one side measures K
enrolments into the empty store and K once N - K are in, and scales them to N
(``batch_run``). Nothing else is measured then.

For each N: a signed store with 3 models and N enrolled devices, built twice: the keys in
the signed key bins (``epfleet.trust.device_keys``, what ``epfleet device enroll`` writes
now), and the same keys in the signed manifest (``Manifest.device_keys``, what it wrote
before; the "before" column). Printed side by side:

- enrol: wall time of one more ``enroll`` (a key made elsewhere, ``--public-key``), the
  median of ``--enrols``, with N already enrolled (before: one signed publish of the
  manifest with one more key, what ``enroll`` did);
- bin: the bytes of a key bin (mean of those signed), of the signed keys index that lists
  them, and of the signed snapshot devices download;
- device sync: the signed-metadata bytes a device's first sync fetches (every model: the
  signed manifest.json, ``ManifestStatus.body_bytes``) and an unchanged poll, and after
  one enrolment (what every device fetches after each enrolment);
- readers: wall time and key bins verified to look up the keys of 5 % of the devices (what
  a gate pass that folds 5 % new reports asks) in a new process, on a new machine and on
  one that verified the bins before (its copies in the worker cache).

The "before" store is built by signing a manifest that carries the keys (one publish), as
an older epfleet left it; keys are made once and shared by both stores.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat  # noqa: E402
from securesystemslib.signer import SSlibKey  # noqa: E402

from epfleet.device.policy import SyncPolicy  # noqa: E402
from epfleet.device.session import sync  # noqa: E402
from epfleet.fleet.evidence.enrolment import (  # noqa: E402
    enroll,
    enroll_batch,
    enrolled_keys,
    keys_in_force,
    local_key_bins,
    publish_keys,
    read_batch,
)
from epfleet.fleet.publishing.publish import read_in_force, update_manifest  # noqa: E402
from epfleet.formats.manifest import DeviceKey, Manifest, utcnow  # noqa: E402
from epfleet.stores import open_store  # noqa: E402
from epfleet.trust.device_keys import DeviceRecord, KeyBook, KeyClaim  # noqa: E402
from epfleet.trust.layout import KEYS_INDEX_KEY, metadata_key  # noqa: E402
from epfleet.trust.repository import development_root  # noqa: E402
from epfleet.trust.state import clear_cache  # noqa: E402
from tests.support.publish_helpers import publish_new  # noqa: E402

MODELS = 3


def device_keys(n: int) -> dict[str, DeviceKey]:
    """N device ids and public keys (P-256, as ``epfleet device enroll`` makes them)."""
    keys = {}
    now = utcnow()
    for i in range(n):
        public = ec.generate_private_key(ec.SECP256R1()).public_key()
        key = SSlibKey.from_crypto(public)
        pem = public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
        keys[f"dev-{i:07d}"] = DeviceKey(
            keyid=key.keyid, keytype=key.keytype, scheme=key.scheme, public=pem, enrolled_at=now
        )
    return keys


def new_store(folder: Path) -> Any:
    store = open_store(str(folder / "store"))
    for i in range(MODELS):
        publish_new(store, i)  # the first publish signs it with development keys
    return store


def in_bins(store: Any, keys: dict[str, DeviceKey]) -> float:
    """Every key enrolled in the key bins, in one signed publish; its wall time."""

    def records(book: KeyBook) -> list[DeviceRecord | KeyClaim]:
        made: list[DeviceRecord | KeyClaim] = []
        for device, key in keys.items():
            made.append(DeviceRecord(device=device, key=key))
            made.append(KeyClaim(keyid=key.keyid, device=device))
        return made

    started = time.perf_counter()
    publish_keys(store, records)
    return time.perf_counter() - started


def in_manifest(store: Any, keys: dict[str, DeviceKey]) -> None:
    def carried(current: Manifest | None) -> Manifest | None:
        assert current is not None
        return current.succeeded_by(dict(current.models), utcnow()).model_copy(
            update={"device_keys": keys}
        )

    update_manifest(store, carried)


def enrol_times(store: Any, folder: Path, count: int) -> float:
    times = []
    for i in range(count):
        public = folder / f"new-{i}.pem"
        made = ec.generate_private_key(ec.SECP256R1()).public_key()
        public.write_bytes(made.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
        started = time.perf_counter()
        enroll(store, f"new-{folder.name}-{i}", public_key=public)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def manifest_enrol_times(store: Any, count: int) -> float:
    """What an enrolment cost before: one signed publish of the manifest with one more key."""
    times = []
    for i in range(count):
        [(_, key)] = device_keys(1).items()
        started = time.perf_counter()
        current = read_in_force(store).manifest
        assert current is not None
        in_manifest(store, {**current.device_keys, f"new-{i}": key})
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sync_bytes(store: Any, folder: Path, enrol: bool) -> tuple[int, int, int]:
    """Metadata bytes of a device's first sync, an unchanged poll, and a poll after one
    more enrolment (on the keys' side of ``enrol``: bins, else the manifest)."""
    root = development_root(store.uri)
    cache = folder / "device"

    def one() -> int:
        clear_cache()
        found = sync(store.uri, cache, SyncPolicy(), "dev-0000000", trust_root=root)
        return found.manifest.body_bytes

    first, unchanged = one(), one()
    made = ec.generate_private_key(ec.SECP256R1()).public_key()
    public = folder / "late.pem"
    public.write_bytes(made.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    if enrol:
        enroll(store, "late-device", public_key=public)
    else:
        key = SSlibKey.from_crypto(made)
        late = DeviceKey(
            keyid=key.keyid,
            keytype=key.keytype,
            scheme=key.scheme,
            public=public.read_text(),
            enrolled_at=utcnow(),
        )
        current = read_in_force(store).manifest
        assert current is not None
        in_manifest(store, {**current.device_keys, "late-device": late})
    return first, unchanged, one()


def sizes(store: Any) -> tuple[float, int, int]:
    """A key bin's bytes (mean), the keys index's, the snapshot's."""
    state = read_in_force(store).state
    assert state is not None and state.snapshot is not None
    meta = keys_in_force(store).book.listing()
    lengths = []
    for name in meta:
        found = store.size(metadata_key(name[: -len(".json")], meta[name].version))
        lengths.append(found or 0)
    snapshot = store.size(metadata_key("snapshot", state.snapshot.signed.version)) or 0
    index = store.size(KEYS_INDEX_KEY) or 0
    return (statistics.mean(lengths) if lengths else 0.0), index, snapshot


def lookup(store: Any, devices: list[str], *, same_machine: bool = False) -> tuple[float, int]:
    """Wall time and key bins verified to look up ``devices``' keys in a new process: on a
    new machine, or (``same_machine``) on one that verified the bins before."""
    clear_cache()
    if not same_machine:
        shutil.rmtree(local_key_bins(), ignore_errors=True)
    started = time.perf_counter()
    keys = keys_in_force(store).prefetch(devices)
    found = {d: keys[d] for d in devices if d in keys}
    took = time.perf_counter() - started
    assert len(found) == len(devices)
    assert enrolled_keys(store, devices[:1])
    return took, keys.book.bins_read


def run(n: int, enrols: int) -> dict[str, Any]:
    keys = device_keys(n)
    sample = random.Random(0).sample(sorted(keys), max(1, n // 20))
    row: dict[str, Any] = {"n": n}
    with tempfile.TemporaryDirectory() as tmp:
        after, before = Path(tmp) / "after", Path(tmp) / "before"
        after.mkdir()
        before.mkdir()
        bins_store, manifest_store = new_store(after), new_store(before)
        row["build"] = in_bins(bins_store, keys)
        in_manifest(manifest_store, keys)
        row["enrol"] = enrol_times(bins_store, after, enrols)
        row["enrol_before"] = manifest_enrol_times(manifest_store, enrols)
        row["bin"], row["index"], row["snapshot"] = sizes(bins_store)
        _, _, row["snapshot_before"] = sizes(manifest_store)
        row["sync"] = sync_bytes(bins_store, after, enrol=True)
        row["sync_before"] = sync_bytes(manifest_store, before, enrol=False)
        row["lookup"], row["bins_read"] = lookup(bins_store, sample)
        row["lookup_again"], row["bins_read_again"] = lookup(bins_store, sample, same_machine=True)
        row["lookup_before"], _ = lookup(manifest_store, sample)
    return row


class Counted:
    """Counts a store's requests by kind (PUT: ``write``, GET: ``read``/``read_range``,
    HEAD: ``size``), wrapping the store's own methods."""

    def __init__(self, store: Any):
        self.counts = {"PUT": 0, "GET": 0, "HEAD": 0}
        for method, kind in (("write", "PUT"), ("read", "GET"), ("read_range", "GET")):
            setattr(store, method, self._counting(getattr(store, method), kind))
        store.size = self._counting(store.size, "HEAD")

    def _counting(self, plain: Any, kind: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[kind] += 1
            return plain(*args, **kwargs)

        return counted


def batch_run(n: int, sample: int) -> None:
    """N devices enrolled one by one, and in one batch: time and requests, printed. With
    ``sample`` (2 x sample < N) the one-by-one side enrols ``sample`` devices into an empty
    store and ``sample`` more once N - sample are in (the rest loaded in one batch, not
    counted), and scales their mean per enrolment to N: an enrolment's cost grows with the
    size of its key bins, so the first and the last of the N bound it."""
    keys = device_keys(n)
    devices = list(keys)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        public = folder / "public"
        public.mkdir()
        for device, key in keys.items():
            (public / f"{device}.pem").write_text(key.public)

        def batch_file(name: str, chosen: list[str]) -> Path:
            path = folder / name
            path.write_text("".join(f"{d} public/{d}.pem\n" for d in chosen))
            return path

        def one_by_one(store: Any, chosen: list[str]) -> tuple[float, dict[str, int]]:
            counted = Counted(store)
            started = time.perf_counter()
            for device in chosen:
                enroll(store, device, public_key=public / f"{device}.pem")
            return time.perf_counter() - started, dict(counted.counts)

        (folder / "one").mkdir()
        single = new_store(folder / "one")
        sampled = sample > 0 and 2 * sample < n
        if sampled:
            first_time, first = one_by_one(single, devices[:sample])
            enroll_batch(single, read_batch(batch_file("middle.txt", devices[sample:-sample])))
            last_time, last = one_by_one(single, devices[-sample:])
            scale = n / (2 * sample)
            one_time = (first_time + last_time) * scale
            one = {k: round((first[k] + last[k]) * scale) for k in first}
        else:
            one_time, one = one_by_one(single, devices)
        clear_cache()
        assert len(keys_in_force(single)) == n
        (folder / "batch").mkdir()
        batched = new_store(folder / "batch")
        counted = Counted(batched)
        started = time.perf_counter()
        enroll_batch(batched, read_batch(batch_file("all.txt", devices)))
        batch_time, batch = time.perf_counter() - started, dict(counted.counts)
        clear_cache()
        assert len(keys_in_force(batched)) == n

    def ratio(a: float, b: float) -> str:
        return f"{a / b:,.0f}x" if b else "-"

    how = (
        f"one by one: {sample} into an empty store and {sample} with {n - sample:,} in, "
        f"measured ({first_time:.1f} s and {last_time:.1f} s), scaled to {n:,}"
        if sampled
        else "one by one: measured whole"
    )
    print(f"N = {n:,} devices enrolled into a new signed store (local); {how}")
    print(f"{'':24}{'one by one':>14}{'batch':>14}{'ratio':>9}")
    times = f"{one_time:>14,.1f}{batch_time:>14,.1f}{ratio(one_time, batch_time):>9}"
    print(f"  {'wall time, s':22}{times}")
    for kind in ("PUT", "GET", "HEAD"):
        a, b = one[kind], batch[kind]
        print(f"  {kind + ' requests':22}{a:>14,}{b:>14,}{ratio(a, b):>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="10000,100000")
    parser.add_argument("--enrols", type=int, default=5)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--sample", type=int, default=0)
    args = parser.parse_args()
    os.environ["EPFLEET_CACHE"] = tempfile.mkdtemp(prefix="bench-device-keys-cache-")
    if args.batch:
        batch_run(args.batch, args.sample)
        return
    rows = [run(int(n), args.enrols) for n in args.devices.split(",")]

    def shown(value: float) -> str:
        return f"{value:,.3f}" if isinstance(value, float) and value < 100 else f"{value:,.0f}"

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"

    print(f"{'':44}{'bins':>14}{'manifest':>14}{'ratio':>9}")
    for r in rows:
        n = r["n"]
        print(f"N = {n:,} enrolled (bulk publish into bins: {r['build']:.1f} s)")
        lines = [
            ("enrol one more device, s", r["enrol"], r["enrol_before"]),
            ("signed snapshot, bytes", r["snapshot"], r["snapshot_before"]),
            ("a key bin, bytes (mean)", r["bin"], 0),
            ("signed keys index, bytes", r["index"], 0),
            ("device first sync, metadata bytes", r["sync"][0], r["sync_before"][0]),
            ("device unchanged poll, bytes", r["sync"][1], r["sync_before"][1]),
            ("device poll after one enrolment, bytes", r["sync"][2], r["sync_before"][2]),
            (f"look up 5 % ({n // 20:,}) keys, s", r["lookup"], r["lookup_before"]),
            ("  the same, bins verified before, s", r["lookup_again"], r["lookup_before"]),
        ]
        for label, mine, theirs in lines:
            print(f"  {label:42}{shown(mine):>14}{shown(theirs):>14}{ratio(mine, theirs):>9}")
        print(f"  {'key bins verified for that lookup':42}{r['bins_read']:>14}")
        print(f"  {'  the same, bins verified before':42}{r['bins_read_again']:>14}")


if __name__ == "__main__":
    main()
