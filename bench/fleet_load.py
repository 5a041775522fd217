"""Load benchmark: simulated devices polling a signed S3 store, and what a fleet of them costs.

    python bench/fleet_load.py [--devices 6] [--polls 3] [--models 200] [--htp-targets 2]
                               [--before DIR] [--latency-ms 0]

A signed store on moto's S3 (in a process of its own, on loopback) behind tests/support/s3proxy.py
(which logs every request) behind bench/loopback.py's relay (which counts the bytes on the
wire, HTTP headers included): --models small CPU models (Y = X @ W, stamped with this
host's CPU string, as a compile publishes them), each with --htp-targets synthetic QNN HTP
variants this host judges unsupported (as in a real fleet: the report lists them), signed
with 256 bins. Devices are real `python -m epfleet sync` processes, each with its own cache
and id; one first sync per side is measured, the other devices start from a copy of its
cache, and each device polls once unmeasured (a copied cache's report goes up under its
own id) before --polls measured no-op polls. Then one model gets a new build and each
device's next poll is measured: it downloads it and uploads its report.

With --before DIR (a checkout of the old code, e.g. `git worktree add /tmp/before <commit>`)
the same devices run the old code too, in the same run, one after the other per poll, and
the table shows both. Per no-op sync: requests by kind (GET-class: GET and HEAD; PUT),
bytes up and down on the wire, CPU (user + system, from wait4) and wall, p50 and p99; the
changed poll's report upload; the first sync's requests; and the monthly S3 bill at 10,000
and 1,000,000 devices polling hourly (prices below, us-east-1 S3 Standard list prices:
requests and internet egress; the device uplink is free to AWS but not to the device).

Both trees' packages are byte-compiled first, as an installed package is (pip compiles
it): a process with PYTHONDONTWRITEBYTECODE set would otherwise compile every module it
imports from source in every sync. The load average is printed with the table: CPU
figures of a busy machine are higher (cache misses, frequency) for both sides alike.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
from loopback import Relay, moto_in_own_process  # noqa: E402  (bench/, beside this script)

from tests.support.s3proxy import FaultProxy  # noqa: E402

BUCKET, PREFIX = "bench", "fleet"
STORE = f"s3://{BUCKET}/{PREFIX}"
GET_PRICE, PUT_PRICE = 0.0004 / 1000, 0.005 / 1000  # $ per GET-class / PUT-class request
EGRESS_PRICE = 0.09 / 1e9  # $ per byte out to the internet (first 10 TB a month)
POLLS_A_MONTH = 24 * 30  # hourly


@dataclass
class Sync:
    """One `epfleet sync` process: what it asked the store, moved, and cost."""

    requests: dict[str, int]
    up: int
    down: int
    cpu: float
    wall: float
    code: int
    stderr: str = ""


@dataclass
class Side:
    """One version of the code: where it runs from, and its measurements."""

    name: str
    tree: Path
    first: Sync | None = None
    polls: list[Sync] = field(default_factory=list)
    changed: list[Sync] = field(default_factory=list)
    report_bytes: int = 0
    report_encoding: str = ""
    onnx_loaded: bool | None = None


def write_model(path: Path, label: str, stamp: bool) -> str | None:
    """Y = X @ W (64 x 64); with ``stamp`` the CPU EP's compatibility string, returned."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import eps

    weights = np.random.default_rng(len(label)).standard_normal((64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 64])],
        initializer=[numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version, model.doc_string = 8, label
    onnx.save_model(model, str(path))
    if not stamp:
        return None
    string = eps.load("CPUExecutionProvider").generate_compatibility_string(path)
    assert string is not None
    helper.set_model_props(model, {"ep_compatibility_info.CPUExecutionProvider": string})
    onnx.save_model(model, str(path))
    return string


def build_fleet(work: Path, models: int, htp_targets: int) -> Path:
    """The signed fleet in s3://bench/fleet; the root file devices trust."""
    from epfleet import ort_version
    from epfleet.formats.keys import source_key, variant_key
    from epfleet.formats.manifest import (
        ArtifactRef,
        Manifest,
        ModelEntry,
        SourceEntry,
        VariantEntry,
    )
    from epfleet.hashing import sha256_file
    from epfleet.stores import MANIFEST_KEY, open_store
    from epfleet.trust.repository import init_with_key_files

    store, now, entries = open_store(STORE), datetime.now(timezone.utc), {}
    htp = [(f"sd{a}-htp", a, s) for a, s in ((75, 57), (73, 43), (79, 69), (81, 87))]
    for i in range(models):
        name = f"model-{i:04d}"
        refs = []
        for label, key_of in (("source", source_key), ("cpu", None)):
            path = work / f"{name}-{label}.onnx"
            string = write_model(path, f"{name} {label}", stamp=key_of is None)
            sha, size = sha256_file(path)
            key = key_of(sha) if key_of else variant_key(name, "x86-cpu", sha)
            store.upload(key, path, sha)
            refs.append((ArtifactRef(uri=key, sha256=sha, size=size), string))
            path.unlink()
        (source, _), (artifact, string) = refs
        common = {"ort_version": ort_version(), "compiled_at": now, "status": "ok"}
        common |= {"source_sha256": source.sha256}
        variants = {
            "x86-cpu": VariantEntry(
                ep="CPUExecutionProvider",
                device="cpu",
                compatibility_string=string,
                artifact=artifact,
                fingerprint=f"cpu-{i}",
                **common,
            )
        }
        for target, arch, soc in htp[:htp_targets]:
            fake = ArtifactRef(uri=variant_key(name, target, "0" * 64), sha256="0" * 64, size=1)
            variants[target] = VariantEntry(
                ep="QNNExecutionProvider",
                device="npu",
                compatibility_string=f"v2:6:2.51.0:5.51.0:{arch}:{soc}:0:0",
                provider_options={
                    "backend_type": "htp",
                    "htp_arch": str(arch),
                    "soc_model": str(soc),
                },
                artifact=fake,
                fingerprint=f"{target}-{i}",
                **common,
            )
        entries[name] = ModelEntry(
            source=SourceEntry(uri=source.uri, sha256=source.sha256, size=source.size),
            variants=variants,
        )
    store.write(MANIFEST_KEY, Manifest(generation=1, models=entries).to_json())
    root, _ = init_with_key_files(store, work / "keys", bins=256, adopt=True)
    return root


def publish_new_build(work: Path) -> None:
    """A new build of model-0000's CPU variant, signed as a compile's publish signs it."""
    from epfleet.formats.keys import variant_key
    from epfleet.formats.manifest import ArtifactRef, Manifest
    from epfleet.hashing import sha256_file
    from epfleet.stores import open_store
    from epfleet.trust.keys import ONLINE_KEY, file_uri, online_signer, public_key_of
    from epfleet.trust.repository import publish_trust

    store, path = open_store(STORE), work / "rebuilt.onnx"
    write_model(path, "model-0000 cpu, rebuilt", stamp=True)
    sha, size = sha256_file(path)
    store.upload(variant_key("model-0000", "x86-cpu", sha), path, sha)

    def change(current: Manifest | None) -> Manifest:
        assert current is not None
        manifest = current.model_copy(deep=True)
        variant = manifest.models["model-0000"].variants["x86-cpu"]
        variant.artifact = ArtifactRef(
            uri=variant_key("model-0000", "x86-cpu", sha), sha256=sha, size=size
        )
        manifest.generation += 1
        return manifest

    uri = file_uri(work / "keys" / ONLINE_KEY)
    publish_trust(store, online_signer(uri, public_key_of(uri)), change)


class Counter:
    """The proxy's request log and the relay's byte counts, read around one sync."""

    def __init__(self, proxy: FaultProxy, relay: Relay) -> None:
        self.proxy, self.relay = proxy, relay

    def mark(self) -> tuple[int, int, int]:
        return len(self.proxy.log), self.relay.bytes[0], self.relay.bytes[1]

    def since(self, mark: tuple[int, int, int]) -> tuple[dict[str, int], int, int]:
        kinds: dict[str, int] = {}
        for seen in self.proxy.log[mark[0] :]:
            listing = seen.method == "GET" and seen.path.rstrip("/") == f"/{BUCKET}"
            kind = "LIST" if listing else seen.method
            kinds[kind] = kinds.get(kind, 0) + 1
        return kinds, self.relay.bytes[0] - mark[1], self.relay.bytes[1] - mark[2]


def run_sync(
    side: Side,
    cache: Path,
    device: str,
    counter: Counter,
    env: dict[str, str],
    extra: tuple[str, ...] = (),
    python: tuple[str, ...] = (),
) -> Sync:
    """One `python -m epfleet sync` of ``side``'s code, measured."""
    command = [sys.executable, *python, "-m", "epfleet", "sync", "--store", STORE]
    command += ["--cache", str(cache), "--device-id", device, "--json", *extra]
    env = env | {"PYTHONPATH": str(side.tree)}
    time.sleep(0.2)  # the relay counts the previous sync's last bytes
    mark = counter.mark()
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(command, cwd=side.tree, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    time.sleep(0.2)
    kinds, up, down = counter.since(mark)
    cpu = usage.ru_utime + usage.ru_stime
    return Sync(kinds, up, down, cpu, wall, child.returncode, stderr)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def get_class(sync: Sync) -> int:
    return sync.requests.get("GET", 0) + sync.requests.get("HEAD", 0)


def monthly_cost(syncs: list[Sync], devices: int) -> float:
    polls = devices * POLLS_A_MONTH
    gets = statistics.mean(get_class(s) for s in syncs)
    puts = statistics.mean(s.requests.get("PUT", 0) + s.requests.get("LIST", 0) for s in syncs)
    down = statistics.mean(s.down for s in syncs)
    return polls * (gets * GET_PRICE + puts * PUT_PRICE + down * EGRESS_PRICE)


def measure(args: argparse.Namespace, work: Path, sides: list[Side], counter: Counter) -> None:
    from epfleet.stores import open_store

    root = build_fleet(work, args.models, args.htp_targets)
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", AWS_MAX_ATTEMPTS="5")
    env["AWS_ENDPOINT_URL"] = counter.relay.endpoint_url
    devices = [f"dev-{i:03d}" for i in range(args.devices)]
    for side in sides:
        first_cache = work / side.name / devices[0]
        side.first = run_sync(
            side, first_cache, devices[0], counter, env, ("--trust-root", str(root))
        )
        if side.first.code != 0:
            sys.exit(f"{side.name}: the first sync failed:\n{side.first.stderr[-3000:]}")
        for device in devices[1:]:
            shutil.copytree(first_cache, work / side.name / device, symlinks=True)
        for device in devices:  # each copy's first poll: its report goes up under its own id
            run_sync(side, work / side.name / device, device, counter, env)
    for _ in range(args.polls):
        for device in devices:
            for side in sides:  # side by side: the same load on both
                done = run_sync(side, work / side.name / device, device, counter, env)
                if done.code != 0:
                    sys.exit(f"{side.name}: a no-op sync failed:\n{done.stderr[-3000:]}")
                side.polls.append(done)
    for side in sides:  # does a no-op sync import onnx? (-X importtime lists every import)
        done = run_sync(
            side,
            work / side.name / devices[0],
            devices[0],
            counter,
            env,
            python=("-X", "importtime"),
        )
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
        side.onnx_loaded = "onnx" in imported
    publish_new_build(work)
    s3 = open_store(STORE)
    for device in devices:
        for side in sides:
            done = run_sync(side, work / side.name / device, device, counter, env)
            side.changed.append(done)
            key = f"{PREFIX}/reports/devices/{device}.json"
            head = s3.client.head_object(Bucket=BUCKET, Key=key)  # type: ignore[attr-defined]
            side.report_bytes = int(head["ContentLength"])
            side.report_encoding = head.get("ContentEncoding", "")


def p50_p99(values: list[float], fmt: str, scale: float = 1.0) -> str:
    return f"{pct(values, 0.5) / scale:{fmt}} / {pct(values, 0.99) / scale:{fmt}}"


def mean_of(syncs: list[Sync], kind: str) -> float:
    return statistics.mean(s.requests.get(kind, 0) for s in syncs)


def side_rows(side: Side) -> dict[str, str]:
    """The table's column for one side."""
    first, polls, changed, kb = side.first, side.polls, side.changed, 1000
    assert first is not None
    column = {
        "first sync: requests": ", ".join(f"{k} {v}" for k, v in sorted(first.requests.items())),
        "first sync: up / down": f"{first.up / kb:.0f} / {first.down / kb:.0f} KB",
        "first sync: CPU / wall": f"{first.cpu:.1f} / {first.wall:.1f} s",
        "no-op sync: GET-class requests": f"{statistics.mean(get_class(p) for p in polls):.2f}",
        "  of which HEAD": f"{mean_of(polls, 'HEAD'):.2f}",
        "no-op sync: PUT requests": f"{mean_of(polls, 'PUT'):.2f}",
        "no-op sync: bytes up (p50 / p99)": p50_p99([p.up for p in polls], ".0f") + " B",
        "no-op sync: bytes down (p50 / p99)": p50_p99([p.down for p in polls], ".0f") + " B",
        "no-op sync: on the wire (p50 / p99)": p50_p99([p.up + p.down for p in polls], ".2f", kb)
        + " KB",
        "no-op sync: CPU (p50 / p99)": p50_p99([p.cpu for p in polls], ".2f") + " s",
        "no-op sync: wall (p50 / p99)": p50_p99([p.wall for p in polls], ".2f") + " s",
        "no-op sync imports onnx": "yes" if side.onnx_loaded else "no",
        "changed poll: PUTs": f"{mean_of(changed, 'PUT'):.0f}",
        "changed poll: report as stored": f"{side.report_bytes / kb:.1f} KB "
        + (side.report_encoding or "plain JSON"),
        "changed poll: up / down (p50)": f"{pct([p.up for p in changed], 0.5) / kb:.1f} / "
        f"{pct([p.down for p in changed], 0.5) / kb:.1f} KB",
    }
    for devices in (10_000, 1_000_000):
        uplink = statistics.mean(p.up for p in polls) * devices * POLLS_A_MONTH
        column[f"S3 a month, {devices:,} devices hourly"] = f"${monthly_cost(polls, devices):,.0f}"
        column[f"  device uplink a month, {devices:,}"] = f"{uplink / 1e12:.3f} TB"
    return column


def print_table(args: argparse.Namespace, sides: list[Side]) -> None:
    columns = [side_rows(side) for side in sides]
    print(
        f"\nfleet load: {args.devices} devices x {args.polls} no-op polls, {args.models} models x "
        f"{1 + args.htp_targets} targets, signed S3 (moto) on loopback, {os.cpu_count()} cores"
    )
    print(
        f"prices: GET-class ${GET_PRICE * 1000:.4f}/1k, PUT-class ${PUT_PRICE * 1000:.3f}/1k, "
        f"egress ${EGRESS_PRICE * 1e9:.2f}/GB (S3 Standard, us-east-1 list prices)"
    )
    width = max(len(key) for key in columns[0]) + 2
    print(f"  {'':<{width}}" + "".join(f"{side.name:>28}" for side in sides))
    for key in columns[0]:
        print(f"  {key:<{width}}" + "".join(f"{column[key]:>28}" for column in columns))
    new = sides[-1]
    if len(sides) == 2:
        cpu = [statistics.median(p.cpu for p in side.polls) for side in sides]
        print(f"\nno-op sync CPU, after / before (medians): {cpu[1] / cpu[0]:.2f} (done: <= 0.6)")
    wire = pct([p.up + p.down for p in new.polls], 0.99)
    quiet = all(get_class(p) <= 2 and not p.requests.get("PUT") for p in new.polls)
    print(
        f"an unchanged poll: <= 2 GET-class and 0 PUT: {'yes' if quiet else 'NO'}; < 4 KB on "
        f"the wire (p99 {wire / 1000:.2f} KB): {'yes' if wire < 4000 else 'NO'}; a changed "
        f"poll uploads a gzipped report: {'yes' if new.report_encoding == 'gzip' else 'NO'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=6, help="simulated devices")
    parser.add_argument("--polls", type=int, default=3, help="measured no-op polls per device")
    parser.add_argument("--models", type=int, default=200, help="models in the fleet")
    parser.add_argument(
        "--htp-targets",
        type=int,
        default=2,
        choices=range(5),
        help="synthetic HTP variants per model (unsupported here)",
    )
    parser.add_argument("--before", type=Path, help="a checkout of the old code to compare")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="round trip per request")
    args = parser.parse_args()
    sides = [Side("after", ROOT)]
    if args.before is not None:
        sides.insert(0, Side("before", args.before.resolve()))
    import boto3

    for side in sides:  # as installed: byte-compiled (see the docstring)
        for package in ("epfleet", "eps"):
            compileall.compile_dir(side.tree / package, quiet=1)
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="epfleet-bench-load-"))
    try:
        with moto_in_own_process() as port:
            boto3.client("s3").create_bucket(Bucket=BUCKET)
            proxy = FaultProxy(port)
            relay = Relay(int(proxy.endpoint_url.rsplit(":", 1)[1]), latency=args.latency_ms / 1000)
            try:
                measure(args, work, sides, Counter(proxy, relay))
            finally:
                proxy.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(args, sides)
    print(f"load average (1 min) at the start {load[0]:.1f}, at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
