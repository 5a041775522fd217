"""Benchmark: the device side of epfleet against a 1,000-model fleet on a loopback S3 (moto).

    python bench/device_sync.py [--reps 20] [--size-mib 256] [--rounds 3] [--link-mbit 800]
                                [--link-size-mib 64] [--profile]

Fleet: 20 tiny CNNs (examples/build_models.py tiny_cls, one seed each) compiled for this
machine's CPU by `epfleet compile` into s3://bench/fleet; the manifest is then padded to
1,000 models x 10 variants (6 QNN HTP, 2 OpenVINO, this CPU and another CPU ISA). The 980
padding models have no artifacts: a device that wants only the 20 never downloads them.

It prints this machine's verdict on each target, MB/s per download round, then a table
(metric, value, target, met) of
  fetch     a sync's manifest fetch into an empty cache, and of an unchanged manifest (a conditional
            GET; target 0 body bytes), with the HTTP bytes a TCP relay counts on the wire;
  first     the first sync of the 20 models into an empty cache (20 downloads);
  decide    a sync session's models with nothing to download, median and p90 of --reps runs (target
            median < 200 ms), after the first sync and again after a fleet update (a new
            build of the 20 variants, so each model lists a rollback variant too); EP
            discovery, done once before, is timed apart;
  download  one --size-mib object: boto3 download_file (default TransferConfig) against
            Fetcher.download (up to 4 parallel ranged GETs, fsync, sha256), alternating, best
            and median MB/s, and the ratio of medians epfleet/raw (target >= 0.9); also
            against download_file in one GET (multipart off), since moto reads the whole
            object for every ranged GET, which penalises the default's parallel ranged GETs.
            Once on raw loopback (CPU-bound: moto, the client and hashing share 2 cores),
            once through a relay paced at --link-mbit (default 800 Mbit/s), as on a device.
  signed    the same fleet signed with TUF (256 succinct hashed bins, one target per model, its
            variants in the signed custom field), side by side with the unsigned manifest:
            a device wanting the 20 models, its first sync's metadata bytes (target <= 700 KB),
            an unchanged sync's bytes (<= 1 KB) and time, the bytes after one wanted model
            changed (<= 60 KB), and the decision for the 20 models from signed metadata
            (bins loaded and verified, entries validated, strings judged; <= 20 ms), its
            wall and its CPU (which a busy machine disturbs less).
--profile adds cProfile's top entries for one decide (after the update) and one unchanged fetch.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loopback import Relay, moto_in_own_process  # noqa: E402  (bench/, beside this script)

if TYPE_CHECKING:
    from epfleet.device.local_eps import LocalEps
    from epfleet.device.policy import SyncPolicy
    from epfleet.formats.device_report import ManifestStatus, ModelReport

T = TypeVar("T")
Row = tuple[str, str, str, bool | None]  # metric, value, target, met (None: no target)

BUCKET, STORE = "bench", "s3://bench/fleet"
MiB = 1 << 20
N_MODELS, N_REAL = 1000, 20
QNN, OPENVINO = "QNNExecutionProvider", "OpenVINOExecutionProvider"
OV = '{"ovep_compat_ver":"1.0","ovep_ver":"1.8.1","ovep_bin_ver":"1.1","ov_compat_string":"%s"}'
HTP = "sd8g3:75:57 sd8g2:73:43 sd8e:79:69 sd8e-g5:81:87 sd8g1:69:36 sc8280x:68:53"
SYNTHETIC = {  # target: ep, device, compatibility string, provider options
    f"{name}-htp": (QNN, "npu", f"v2:6:2.51.0:5.51.0:{a}:{s}:0:0", {"htp_arch": a, "soc_model": s})
    for name, a, s in (target.split(":") for target in HTP.split())
} | {  # Intel NPU and GPU, which this machine lacks
    "ov-npu": (OPENVINO, "npu", OV % "meta=1.0;ov=2026.4.1;npu_platform=4000", {}),
    "ov-gpu": (OPENVINO, "gpu", OV % "meta=1.0;ov=2026.4.1;gpu_arch=xe-lpg", {}),
}


def fake_sha(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def compile_real_models(work: Path, cpu_target: str) -> list[str]:
    """20 tiny_cls models x this machine's CPU, published by the real CLI."""
    import onnx
    import yaml

    from examples.build_models import tiny_cls

    (work / "models").mkdir()
    names = [f"cls-{i:02d}" for i in range(N_REAL)]
    for seed, name in enumerate(names):
        onnx.save(tiny_cls(seed=seed), str(work / "models" / f"{name}.onnx"))
    models = [
        {"name": n, "source": f"models/{n}.onnx", "input_shapes": {"x": [1, 3, 48, 192]}}
        for n in names
    ]
    spec = {"models": models, "targets": [{"name": cpu_target, "ep": "CPUExecutionProvider"}]}
    (work / "fleet.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env |= {"PREFECT_HOME": str(work / "prefect"), "EPFLEET_CACHE": str(work / "compile-cache")}
    command = [sys.executable, "-m", "epfleet", "compile", str(work / "fleet.yaml")]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--store", STORE, "--json"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if done.returncode != 0:
        sys.exit(f"epfleet compile failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"epfleet compile: {N_REAL} CPU variants in {time.perf_counter() - started:.1f} s")
    return names


def pad_manifest(real: list[str], cpu_target: str) -> int:
    """Give each real model 9 synthetic variants, add 980 synthetic models, publish."""
    import eps.cpu as cpu
    from epfleet import ort_version
    from epfleet.formats.manifest import Manifest, ModelEntry, SourceEntry, VariantEntry, utcnow
    from epfleet.stores import MANIFEST_KEY, open_store

    store, now, ort, arch = open_store(STORE), utcnow(), ort_version(), cpu.machine_arch()
    got = store.read(MANIFEST_KEY)
    assert got is not None
    manifest = Manifest.from_json(got.data)
    targets = dict(SYNTHETIC)
    for isa in (cpu.isa_class(), "avx2" if cpu.isa_class() != "avx2" else "avx512"):
        string = cpu.make_string(ort, arch, isa, True)
        targets[f"cpu-{isa}"] = ("CPUExecutionProvider", "cpu", string, {})

    def variant(model: str, target: str, source_sha: str) -> VariantEntry:
        ep, device, string, options = targets[target]
        sha, size = fake_sha(model, target), 2 * MiB + int(fake_sha(target)[:5], 16) * 64
        artifact = {"uri": f"variants/{model}/{target}/{sha}.onnx", "sha256": sha, "size": size}
        fingerprint = fake_sha("fingerprint", model, target)[:32]
        return VariantEntry.model_validate(
            {"ep": ep, "device": device, "compatibility_string": string, "status": "ok"}
            | {"provider_options": options, "artifact": artifact, "ort_version": ort}
            | {"compiled_at": now, "source_sha256": source_sha, "fingerprint": fingerprint}
        )

    for name in real:
        entry = manifest.models[name]
        for target in targets:
            if target != cpu_target:  # the real, compiled CPU variant stays
                entry.variants[target] = variant(name, target, entry.source.sha256)
    for i in range(N_REAL, N_MODELS):
        name, sha = f"model-{i:04d}", fake_sha("source", i)
        uri, shapes = f"sources/{sha}.onnx", {"x": [1, 3, 224, 224]}
        source = SourceEntry(uri=uri, sha256=sha, size=4 * MiB, input_shapes=shapes)
        variants = {target: variant(name, target, sha) for target in targets}
        manifest.models[name] = ModelEntry(source=source, variants=variants)
    padded = manifest.model_copy(update={"generation": manifest.generation + 1})
    data = Manifest.from_json(padded.to_json()).to_json()  # validated as a device will
    store.write(MANIFEST_KEY, data)
    return len(data)


def publish_revision(wanted: list[str], cpu_target: str) -> None:
    """A fleet update: a new build (one more metadata entry) of each real CPU variant."""
    import onnx

    from epfleet.formats.manifest import Manifest
    from epfleet.stores import MANIFEST_KEY, open_store

    store = open_store(STORE)
    manifest = Manifest.from_json(getattr(store.read(MANIFEST_KEY), "data", b""))
    for name in wanted:
        variant = manifest.models[name].variants[cpu_target]
        assert variant.artifact is not None
        model = onnx.load_from_string(getattr(store.read(variant.artifact.uri), "data", b""))
        model.metadata_props.add(key="bench_revision", value="2")
        data = model.SerializeToString()
        sha = hashlib.sha256(data).hexdigest()
        store.write(uri := f"variants/{name}/{cpu_target}/{sha}.onnx", data)
        update = {"uri": uri, "sha256": sha, "size": len(data)}
        variant.artifact = variant.artifact.model_copy(update=update)
    update = {"generation": manifest.generation + 1}
    store.write(MANIFEST_KEY, manifest.model_copy(update=update).to_json())


def timed(call: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    started = time.perf_counter()
    return call(*args, **kwargs), time.perf_counter() - started


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def fetch_manifest(store_uri: str, cache_dir: Path) -> ManifestStatus:
    """A sync's manifest fetch: lock the cache, load its state, conditional GET."""
    from epfleet.device.cache import DeviceCache
    from epfleet.device.manifest_cache import fetch_manifest
    from epfleet.stores import open_store

    cache = DeviceCache(cache_dir)
    with cache.locked():
        return fetch_manifest(open_store(store_uri), cache, cache.load_state())


def sync_models(
    store_uri: str, cache_dir: Path, policy: SyncPolicy, local: LocalEps
) -> list[ModelReport]:
    """A sync session's models, without its manifest fetch and report (EPs discovered)."""
    from epfleet.device.session import SyncSession

    with SyncSession(
        store_uri, cache_dir, policy, "bench", local=local, allow_unsigned=True
    ) as session:
        return [session.sync_model(model) for model in session.wanted()]


def measure_sync(args: argparse.Namespace, work: Path, port: int, local: LocalEps) -> list[Row]:
    import eps.cpu as cpu
    from epfleet.device.cache import DeviceCache
    from epfleet.device.policy import SyncPolicy
    from epfleet.formats.manifest import Manifest

    wanted = compile_real_models(work, cpu_target := f"cpu-{cpu.isa_class()}")
    size = pad_manifest(wanted, cpu_target)
    fresh = [timed(fetch_manifest, STORE, work / f"fresh-{i}")[1] for i in range(5)]
    cache, policy = work / "device-cache", SyncPolicy(models=wanted)
    status = fetch_manifest(STORE, cache)
    assert status.status == "fetched" and status.body_bytes == size, status
    first, first_s = timed(sync_models, STORE, cache, policy, local)
    assert [r.action for r in first] == ["downloaded"] * N_REAL, [r.reason for r in first]
    verdicts = sorted({c.target: c.verdict.value for c in first[0].considered}.items())
    print(f"verdicts here: {', '.join(f'{t}={v}' for t, v in verdicts)}")

    def repeat() -> tuple[list[float], list[float]]:  # fetch, then decide, --reps times
        fetches, decides = [], []
        for _ in range(args.reps):
            status, seconds = timed(fetch_manifest, STORE, cache)
            assert status.status == "unchanged" and status.body_bytes == 0, status
            fetches.append(seconds)
            reports, seconds = timed(sync_models, STORE, cache, policy, local)
            assert [r.action for r in reports] == ["kept"] * N_REAL, [r.reason for r in reports]
            decides.append(seconds)
        return fetches, decides

    unchanged, decide = repeat()
    cached = DeviceCache(cache).cached_manifest()
    assert cached is not None
    parse = [timed(Manifest.from_json, cached, newer_minor="ignore")[1] for _ in range(5)]

    relay = Relay(port)  # HTTP bytes on the wire: one fetch of each kind
    os.environ["AWS_ENDPOINT_URL"] = relay.endpoint_url
    wire = []
    for into in (work / "fresh-wire", cache):
        before = list(relay.bytes)
        status = fetch_manifest(STORE, into)
        wire.append(f"{relay.bytes[0] - before[0]} / {relay.bytes[1] - before[1]} B")
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
    assert status.status == "unchanged"
    publish_revision(wanted, cpu_target)  # then every model keeps a rollback variant
    assert fetch_manifest(STORE, cache).status == "fetched"
    again = sync_models(STORE, cache, policy, local)
    assert [r.action for r in again] == ["downloaded"] * N_REAL, [r.reason for r in again]
    updated = repeat()[1]
    if args.profile:
        import cProfile
        import pstats

        for call, a in ((sync_models, (policy, local)), (fetch_manifest, ())):
            profiler = cProfile.Profile()
            profiler.runcall(call, STORE, cache, *a)
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(14)
    decide_s, upd_s = statistics.median(decide), statistics.median(updated)
    signed = measure_signed(args, work, wanted, cpu_target, local)
    return [
        ("manifest (1,000 models x 10 variants)", f"{size / 1e6:.2f} MB", "", None),
        ("fetch_manifest, empty cache (median of 5)", ms(statistics.median(fresh)), "", None),
        ("  HTTP bytes on the wire (up / down)", wire[0], "", None),
        ("fetch_manifest, unchanged (median)", ms(statistics.median(unchanged)), "", None),
        ("  body_bytes", "0", "0", True),  # asserted on every run above
        ("  HTTP bytes on the wire (up / down)", wire[1], "", None),
        (f"first sync, {N_REAL} downloads", f"{first_s:.2f} s", "", None),
        ("decide, nothing to download (median)", ms(decide_s), "< 200 ms", decide_s < 0.2),
        ("decide, nothing to download (p90)", ms(p90(decide)), "", None),
        ("decide after an update, rollbacks kept (median)", ms(upd_s), "< 200 ms", upd_s < 0.2),
        ("decide after an update, rollbacks kept (p90)", ms(p90(updated)), "", None),
        ("  parsing the cached manifest alone (median)", ms(statistics.median(parse)), "", None),
        *signed,
    ]


def fetch_signed(store_uri: str, cache_dir: Path, root: bytes, wanted: list[str]) -> ManifestStatus:
    """A signed sync's metadata step: lock the cache, load its state, refresh, look up the
    wanted models' entries."""
    from epfleet.device.cache import DeviceCache
    from epfleet.device.signed_manifest import fetch_signed_manifest
    from epfleet.stores import open_store

    cache = DeviceCache(cache_dir)
    with cache.locked():
        return fetch_signed_manifest(open_store(store_uri), cache, cache.load_state(), root, wanted)


def decide_signed(
    store_uri: str, trust: Path, root: bytes, wanted: list[str], local: LocalEps
) -> tuple[float, float]:
    """Seconds (wall, and this process's CPU: less disturbed by a busy machine) to decide
    the wanted models from signed metadata after a refresh: each one's bin loaded and
    verified, its entry validated, its variants judged here."""
    from epfleet.device.model_sync import considered
    from epfleet.stores import open_store
    from epfleet.trust.client import StoreFetcher, open_updater, signed_entry

    store = open_store(store_uri)
    updater = open_updater(StoreFetcher(store), trust, root)
    updater.refresh()
    started, cpu = time.perf_counter(), time.process_time()
    for model in wanted:
        considered(local, signed_entry(updater, store, model))
    return time.perf_counter() - started, time.process_time() - cpu


def decide_unsigned(cached: bytes | None, wanted: list[str], local: LocalEps) -> float:
    """The same decision from the cached unsigned manifest: its wanted entries parsed and
    validated, their variants judged here."""
    from epfleet.device.manifest_cache import manifest_in_force
    from epfleet.device.model_sync import considered

    started = time.perf_counter()
    manifest = manifest_in_force(cached, wanted, STORE, Path("bench"))
    for entry in manifest.models.values():
        considered(local, entry)
    return time.perf_counter() - started


def measure_signed(
    args: argparse.Namespace, work: Path, wanted: list[str], cpu_target: str, local: LocalEps
) -> list[Row]:
    """The signed path beside the unsigned one, on the fleet as it is now."""
    from epfleet.device.cache import DeviceCache
    from epfleet.formats.manifest import Manifest
    from epfleet.stores import MANIFEST_KEY, open_store
    from epfleet.trust.client import trust_dir
    from epfleet.trust.keys import online_signer, public_key_of
    from epfleet.trust.repository import init_with_key_files, publish_trust

    store = open_store(STORE)
    manifest = Manifest.from_json(getattr(store.read(MANIFEST_KEY), "data", b""))
    (root_file, uri), sign_s = timed(
        init_with_key_files, store, work / "keys", bins=256, adopt=True
    )
    online, root = online_signer(uri, public_key_of(uri)), root_file.read_bytes()
    plain, cache = work / "unsigned-cache", work / "signed-cache"
    u_first = fetch_manifest(STORE, plain)
    first, first_s = timed(fetch_signed, STORE, cache, root, wanted)
    assert first.status == "fetched" and first.signed, first
    unchanged, u_unchanged = [], []
    for _ in range(args.reps):
        status, seconds = timed(fetch_signed, STORE, cache, root, wanted)
        assert status.status == "unchanged", status
        unchanged.append(seconds)
        u_unchanged.append(timed(fetch_manifest, STORE, plain)[1])
    trust = trust_dir(cache / ".epfleet", store.uri)
    decided = [decide_signed(STORE, trust, root, wanted, local) for _ in range(args.reps)]
    decide, decide_cpu = [wall for wall, _ in decided], [cpu for _, cpu in decided]
    cached = DeviceCache(plain).cached_manifest()
    u_decide = [decide_unsigned(cached, wanted, local) for _ in range(args.reps)]

    def change(current: Manifest | None) -> Manifest:
        """One wanted model changes: a new build of a variant. (The signer signs the last
        signed document plus this change, never an edited manifest.json.)"""
        assert current is not None
        changed = current.model_copy(deep=True)
        entry = changed.models[wanted[0]]
        variant = entry.variants[cpu_target]
        entry.variants[cpu_target] = variant.model_copy(update={"fingerprint": "0" * 32})
        changed.generation += 1
        return changed

    republished, resign_s = timed(publish_trust, store, online, change)
    assert len(republished.bins) <= 2, republished  # the model's bin (and manifest.json's)
    manifest = change(manifest)
    store.write(MANIFEST_KEY, manifest.to_json())  # the unsigned copy, as a publish writes it
    changed = fetch_signed(STORE, cache, root, wanted)
    u_changed = fetch_manifest(STORE, plain)
    assert changed.status == "fetched" and u_changed.status == "fetched"
    kb = 1000
    status = fetch_signed(STORE, cache, root, wanted)
    assert status.body_bytes <= kb, status
    medians = statistics.median(unchanged), statistics.median(decide)
    print("\nsigned (TUF, 256 bins) beside unsigned (manifest.json), 20 of 1,000 models wanted")
    print(f"  {'':<44} {'unsigned':>12} {'signed':>12}")
    for what, a, b in (
        (
            "first sync: metadata bytes",
            f"{u_first.body_bytes / kb:.0f} KB",
            f"{first.body_bytes / kb:.0f} KB",
        ),
        ("unchanged sync: bytes", "0 B", f"{status.body_bytes} B"),
        ("unchanged sync: time (median)", ms(statistics.median(u_unchanged)), ms(medians[0])),
        (
            "one wanted model changed: bytes",
            f"{u_changed.body_bytes / kb:.0f} KB",
            f"{changed.body_bytes / kb:.1f} KB",
        ),
        ("decide the 20 models (median)", ms(statistics.median(u_decide)), ms(medians[1])),
    ):
        print(f"  {what:<44} {a:>12} {b:>12}")
    return [
        ("signed: trust init (sign and write the repository)", f"{sign_s:.2f} s", "", None),
        ("signed: publish one changed model", f"{resign_s:.2f} s", "", None),
        (
            "signed: first sync metadata (20 wanted)",
            f"{first.body_bytes / kb:.0f} KB",
            "<= 700 KB",
            first.body_bytes <= 700 * kb,
        ),
        ("signed: first sync metadata time", ms(first_s), "", None),
        (
            "signed: unchanged sync bytes",
            f"{status.body_bytes} B",
            "<= 1 KB",
            status.body_bytes <= kb,
        ),
        ("signed: unchanged sync time (median)", ms(medians[0]), "", None),
        (
            "signed: one wanted model changed",
            f"{changed.body_bytes / kb:.1f} KB",
            "<= 60 KB",
            changed.body_bytes <= 60 * kb,
        ),
        ("signed: decide 20 models (median)", ms(medians[1]), "<= 20 ms", medians[1] <= 0.02),
        ("signed: decide 20 models (p90)", ms(p90(decide)), "", None),
        ("signed: decide 20 models, CPU (median)", ms(statistics.median(decide_cpu)), "", None),
    ]


def measure_download(
    args: argparse.Namespace, work: Path, local: LocalEps, size_mib: int, link: str
) -> list[Row]:
    import boto3
    from boto3.s3.transfer import TransferConfig

    from epfleet.device.cache import DeviceCache
    from epfleet.device.fetching import Fetcher
    from epfleet.stores import open_store

    client, key, size = boto3.client("s3"), f"blobs/big-{size_mib}.bin", size_mib * MiB
    blob, digest = work / "blob.bin", hashlib.sha256()
    with open(blob, "wb") as f:
        for _ in range(size_mib):
            digest.update(chunk := os.urandom(MiB))
            f.write(chunk)
    client.upload_file(str(blob), BUCKET, f"fleet/{key}")
    blob.unlink()
    fetcher = Fetcher(open_store(STORE), DeviceCache(work / "dl"), offline=False)
    assert fetcher.store.size(key) == size  # its client is made here, outside the timings
    one_get = {"Config": TransferConfig(multipart_threshold=size + 1)}
    raw: dict[str, Any] = {"boto3 download_file": {}, "boto3 download_file, one GET": one_get}
    speed: dict[str, list[float]] = {name: [] for name in [*raw, "Fetcher.download"]}
    for _ in range(args.rounds):
        for name, kwargs in raw.items():
            where = str(work / "raw")
            os.sync()  # every download starts with no dirty pages of the previous one
            _, seconds = timed(client.download_file, BUCKET, f"fleet/{key}", where, **kwargs)
            speed[name].append(size / seconds / 1e6)
            os.unlink(where)
        os.sync()
        moved, seconds = timed(fetcher.download, key, digest.hexdigest(), size, work / "ours")
        assert moved == size
        speed["Fetcher.download"].append(size / seconds / 1e6)
        (work / "ours").unlink()
    for name, values in speed.items():
        figures = ", ".join(f"{v:.0f}" for v in values)
        print(f"download {size_mib} MiB over {link}, {name}: {figures} MB/s")
    ours = statistics.median(speed["Fetcher.download"])
    rows: list[Row] = [
        (f"download ({link}): {name} best / median", mbs(v), "", None) for name, v in speed.items()
    ]
    for name in raw:
        ratio = ours / statistics.median(speed[name])
        rows.append((f"  ratio epfleet/{name}", f"{ratio:.2f}", ">= 0.9", ratio >= 0.9))
    return rows


def mbs(values: list[float]) -> str:
    return f"{max(values):.0f} / {statistics.median(values):.0f} MB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20, help="decide and fetch repetitions")
    parser.add_argument("--size-mib", type=int, default=256, help="download test object size")
    parser.add_argument("--rounds", type=int, default=3, help="download rounds per client")
    parser.add_argument(
        "--link-mbit", type=float, default=800, help="paced link for the second download test"
    )
    parser.add_argument("--link-size-mib", type=int, default=64, help="object size on the link")
    parser.add_argument("--profile", action="store_true", help="cProfile decide and fetch")
    args = parser.parse_args()

    import boto3

    from epfleet.device.local_eps import discover

    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="epfleet-bench-sync-"))
    try:
        with moto_in_own_process() as port:
            boto3.client("s3").create_bucket(Bucket=BUCKET)
            local, discover_s = timed(discover)
            rows: list[Row] = [("EP discovery (once, outside decide)", ms(discover_s), "", None)]
            rows += measure_sync(args, work, port, local)
            rows += measure_download(args, work, local, args.size_mib, "loopback")
            # A device's real link, paced by a relay: there the network, not the CPU, limits.
            link = Relay(port, rate=args.link_mbit * 1e6 / 8)
            os.environ["AWS_ENDPOINT_URL"] = link.endpoint_url
            label = f"a {args.link_mbit:.0f} Mbit/s link"
            rows += measure_download(args, work, local, args.link_size_mib, label)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\ndevice sync benchmark ({os.cpu_count()} cores, moto S3 on loopback)")
    print(f"  {'metric':<52} {'value':>20}  {'target':>8}  met")
    for metric, value, target, met in rows:
        verdict = "-" if met is None else "yes" if met else "NO"
        print(f"  {metric:<52} {value:>20}  {target:>8}  {verdict}")
    print(f"load average (1 min) at the start {load:.1f}, at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
