"""Benchmark: what the field rankings add to a device sync (bytes downloaded, ms).

    python bench/field_ranking.py [--models 20] [--profiles 10] [--bins 256] [--reps 9] [--named]

Two signed local stores with the same fleet: ``--models`` models of two real CPU variants
each (a small MatMul stamped with this host's CPU string), ``--bins`` hashed bins. The
second also has a signed field ranking for every model (``--profiles`` hardware profiles
each, this device's among them, the order the declared one so that no sync switches
variant and only the ranking's cost is measured). A device that wants every model (the
signed manifest.json; ``--named``: the models named, their bins only) syncs each store (in
this process, health checks in this thread); printed side by side, without and with
rankings, and as a ratio:

  first     a fresh device's first sync: signed-metadata bytes (the bins it loads) and
            wall ms (it downloads and health-checks every model's variant too);
  unchanged the median of --reps unchanged syncs: metadata bytes and wall ms;
  refreshed a sync after the gate signed one model's ranking again with new figures
            (with rankings), or after nothing (without): metadata bytes and wall ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from epfleet import ort_version
from epfleet.device.health import in_thread
from epfleet.device.local_eps import discover, ep_versions
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import SyncSession, sync
from epfleet.fleet.evidence.rankings import publish_rankings
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.field_ranking import (
    Measured,
    ModelRanking,
    ProfileRanking,
    hardware_profile,
    runtime_label,
)
from epfleet.formats.manifest import Manifest
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.trust.repository import init_with_key_files
from tests.support.ranked_fleet import TARGETS, make_ranked_fleet


def copy_models(store: Store, models: int) -> None:
    """The ranked fleet's model ``m`` published again as m0 .. m<models-1> (same files)."""
    found = store.read(MANIFEST_KEY)
    assert found is not None
    manifest = Manifest.from_json(found.data)
    entry = manifest.models["m"]
    copied = Manifest(generation=1, models={f"m{i}": entry for i in range(models)})
    store.write(MANIFEST_KEY, copied.to_json())


def fleet(root: Path, models: int, bins: int) -> tuple[Store, Path, str]:
    """A signed store of ``models`` models, unsigned first, then signed with ``bins``."""
    root.mkdir()
    scratch = root / "scratch"
    scratch.mkdir()
    made, _, _, _ = make_ranked_fleet(str(scratch / "store"), scratch, [])
    store = open_store(str(root / "store"))
    for key in [o.key for o in made.iter_objects("") if not o.key.startswith("trust/")]:
        data = made.read(key)
        assert data is not None
        store.write(key, data.data)
    copy_models(store, models)
    trusted, signer = init_with_key_files(store, root / "keys", bins=bins, adopt=True)
    return store, trusted, signer


def rankings(models: int, profiles: int, shift: float = 0.0) -> dict[str, ModelRanking]:
    """Every model ranked on ``profiles`` profiles, this device's first, in declared order."""
    mine, label = hardware_profile(discover().describe())
    runtime = runtime_label(ort_version(), ep_versions())
    found = {}
    for i in range(models):
        ranked = []
        for p in range(profiles):
            ident = mine if p == 0 else f"{p:012x}"
            ranked.append(
                ProfileRanking(
                    profile=ident,
                    hardware=label if p == 0 else f"QNNExecutionProvider/npu/0x5143:{p:#06x}",
                    runtime=runtime,
                    order=[
                        Measured(target=t, devices=40 + p, p50_ms=round(2.0 + j + shift, 3))
                        for j, t in enumerate(TARGETS)
                    ],
                )
            )
        found[f"m{i}"] = ModelRanking(model=f"m{i}", min_devices=5, profiles=ranked)
    return found


def timed_sync(
    store: Store, cache: Path, trusted: Path, policy: SyncPolicy
) -> tuple[int, float, DeviceReport]:
    started = time.perf_counter()
    report = sync(store.uri, cache, policy, "bench-device", trust_root=trusted)
    ms = (time.perf_counter() - started) * 1000
    assert all(m.served for m in report.models), [m.reason for m in report.models]
    return report.manifest.body_bytes, ms, report


def measure(
    store: Store, trusted: Path, cache: Path, reps: int, refresh: Callable[[], None], named: bool
) -> dict[str, tuple]:
    found = store.read("manifest.json")
    assert found is not None
    models = sorted(Manifest.from_json(found.data).models) if named else []
    policy = SyncPolicy(models=models)
    first = timed_sync(store, cache, trusted, policy)
    unchanged = [timed_sync(store, cache, trusted, policy) for _ in range(reps)]
    refresh()
    refreshed = timed_sync(store, cache, trusted, policy)
    return {
        "first": first[:2],
        "unchanged": (
            statistics.median(u[0] for u in unchanged),
            statistics.median(u[1] for u in unchanged),
        ),
        "refreshed": refreshed[:2],
        "targets": tuple(sorted({m.target for m in first[2].models})),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--profiles", type=int, default=10)
    parser.add_argument("--bins", type=int, default=256)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--named", action="store_true")
    args = parser.parse_args()
    SyncSession.default_health = staticmethod(in_thread)  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as work:
        work_dir = Path(work)
        os.environ["EPFLEET_CACHE"] = str(work_dir / "worker")
        plain, plain_root, _ = fleet(work_dir / "plain", args.models, args.bins)
        ranked, ranked_root, signer = fleet(work_dir / "ranked", args.models, args.bins)
        os.environ["EPFLEET_TRUST_SIGNER"] = signer
        published = publish_rankings(ranked, rankings(args.models, args.profiles))
        assert published.signed
        before = measure(
            plain, plain_root, work_dir / "cache-plain", args.reps, lambda: None, args.named
        )

        def refresh() -> None:
            changed = rankings(args.models, args.profiles)
            changed["m0"] = rankings(1, args.profiles, shift=0.5)["m0"]
            assert publish_rankings(ranked, changed).bins

        after = measure(
            ranked, ranked_root, work_dir / "cache-ranked", args.reps, refresh, args.named
        )
    assert before["targets"] == after["targets"] == (TARGETS[0],)
    print(
        f"{args.models} models x 2 CPU variants, {args.bins} bins; rankings of "
        f"{args.profiles} profiles a model; a device wanting "
        f"{'them by name' if args.named else 'every model'}\n"
    )
    print(f"{'sync':<11}{'metadata bytes':>30}{'wall ms':>30}")
    header = ("without", "with", "ratio") * 2
    print(f"{'':<11}" + "".join(f"{h:>10}" for h in header))
    for name in ("first", "unchanged", "refreshed"):
        (b0, t0), (b1, t1) = before[name], after[name]
        ratio_b = f"{b1 / b0:.2f}x" if b0 else "-"
        print(
            f"{name:<11}{b0:>10,.0f}{b1:>10,.0f}{ratio_b:>10}{t0:>10.0f}{t1:>10.0f}{t1 / t0:>9.2f}x"
        )


if __name__ == "__main__":
    main()
