"""What the fleet-side readers of device reports cost with the evidence index, against a full
read of every report (what they did before it), on a local store and on S3.

    python bench/evidence_index.py [--reports 10000] [--new 0.05] [--stores local,s3]

N reports in the format devices upload (gzip JSON, 3 models each, a staged rollout of one
of them: members and non-members, a few failures) in a store whose manifest stages that
rollout. Each reader runs in a child process of its own (fork), so that its CPU (user +
system) and its peak memory (the child's peak resident set, VmHWM, above its resident set
when the pass started) are its own: the rollout gate (``read_evidence``, what ``epfleet
rollout status`` and the gate flow read), the field view (``epfleet manifest show
--field`` reads the same pass), and runtime-watch's reading (``stream_device_reports``
through ``find_unserved``). Requests are counted where they happen: on S3 by
tests/support/s3proxy.py between the client and moto (in a process of its own, on
loopback), on a local store by a counting wrapper (a LIST is one listing of a folder, a
GET one read, a PUT one write).

Rows: a full read (the readers before the index), listing the reports alone, each
reader's first pass (the index built, or found up to date by the reader before it), each
reader's pass after ``--new`` of the reports were rewritten (a fresh share for each
reader, so that each one folds its own), and the gate's pass with nothing new. The 1M
hour (``hour``): one pass folds the new share, two find the index up to date, each
scaled linearly in N.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
from loopback import moto_in_own_process  # noqa: E402  (bench/, beside this script)

from tests.support.s3proxy import FaultProxy  # noqa: E402
from tests.support.staged_rollout import ROLLOUT  # noqa: E402

BUCKET = "bench"
MODELS = ["ocr-det", "ocr-rec", "cls"]


def rollout(now: datetime) -> Any:
    """The tests' staged rollout (``tests.support.staged_rollout.ROLLOUT``: its id, salt
    and stages), started two hours before ``now``, with no canary and 5 reports a side."""
    started = now - timedelta(hours=2)
    policy = ROLLOUT.policy.model_copy(update={"canary": [], "min_reports": 5})
    return ROLLOUT.model_copy(
        update={"policy": policy, "started_at": started, "stage_started_at": started}
    )


def manifest(now: datetime) -> bytes:
    from epfleet.formats.manifest import (
        ArtifactRef,
        Manifest,
        ModelEntry,
        SourceEntry,
        VariantEntry,
    )

    entries = {}
    for name in MODELS:
        ref = ArtifactRef(uri=f"variants/{name}/cpu/{'0' * 64}.onnx", sha256="0" * 64, size=1)
        variant = VariantEntry(
            ep="CPUExecutionProvider",
            device="cpu",
            compatibility_string="cpu",
            artifact=ref,
            fingerprint=name,
            ort_version="1.32.0",
            compiled_at=now,
            status="ok",
            source_sha256="1" * 64,
        )
        entries[name] = ModelEntry(
            source=SourceEntry(uri=f"sources/{'1' * 64}.onnx", sha256="1" * 64, size=1),
            variants={"cpu": variant},
            previous={"cpu": variant} if name == MODELS[0] else {},
            rollout=rollout(now) if name == MODELS[0] else None,
        )
    return Manifest(generation=1, models=entries).to_json()


def device_report(i: int, now: datetime, round_: int) -> bytes:
    from epfleet.formats.device_report import (
        DeviceInfo,
        DeviceReport,
        ManifestStatus,
        ModelReport,
        Profile,
        RolloutSeen,
        encode_report,
    )
    from epfleet.formats.rollout import is_member

    device = f"dev-{i:07d}"
    staged = rollout(now)
    qnn = "2.7.0" if i % 3 else "2.5.0"
    models = []
    for k, name in enumerate(MODELS):
        failed = (i + round_) % 97 == 0 and k == 0
        models.append(
            ModelReport(
                model=name,
                action="failed" if failed else "kept",
                variant=f"{name}-cpu",
                target="cpu",
                ep="CPUExecutionProvider",
                verdict=None,
                bytes_downloaded=0,
                reason="health check failed" if failed else "",
                considered=[],
                seconds=0.05,
                profile=None
                if failed
                else Profile(
                    session_ms=5,
                    first_run_ms=9,
                    p50_ms=8.0 + (i % 50) / 10 + round_,
                    p95_ms=12.0,
                    runs=20,
                    ep_nodes=40,
                    other_nodes=0,
                ),
                rollout=RolloutSeen(
                    id=ROLLOUT.id, member=is_member(staged, device), stage=0, state="active"
                )
                if k == 0
                else None,
            )
        )
    report = DeviceReport(
        device_id=device,
        generated_at=(now + timedelta(seconds=round_)).isoformat(),
        ort_version="1.32.0",
        ep_packages={"onnxruntime": "1.32.0", "onnxruntime-qnn": qnn},
        devices=[
            DeviceInfo(
                ep="CPUExecutionProvider",
                type="cpu",
                vendor="x",
                vendor_id=0x8086,
                device_id=0,
                ep_vendor="x",
            )
        ],
        store=f"s3://{BUCKET}/fleet",
        cache="/var/lib/epfleet",
        manifest=ManifestStatus(status="unchanged", generation=1, body_bytes=0),
        models=models,
        seconds=0.4,
        sequence=1 + round_,
    )
    return encode_report(report)


class CountingStore:
    """A local store that counts what a reader asks of it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.counts = {"GET": 0, "PUT": 0, "LIST": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> Any:
        self.counts["GET"] += 1
        return self.inner.read(key)

    def write(self, key: str, data: bytes, **options: Any) -> str:
        self.counts["PUT"] += 1
        return self.inner.write(key, data, **options)

    def iter_objects(self, prefix: str, **options: Any) -> Iterator[Any]:
        self.counts["LIST"] += 1
        return self.inner.iter_objects(prefix, **options)

    def list_objects(self, prefix: str, **options: Any) -> list[Any]:
        self.counts["LIST"] += 1
        return self.inner.list_objects(prefix, **options)


def gate(store: Any) -> int:
    from epfleet.fleet.rollout.rollouts import read_evidence

    return read_evidence(store).read


def full(store: Any) -> int:
    from epfleet.fleet.rollout.rollouts import read_evidence

    return read_evidence(store, full=True).read


def listing(store: Any) -> int:
    from epfleet.fleet.watch.inputs import report_keys

    return sum(1 for _ in report_keys(store))


def field_view(store: Any) -> int:
    from epfleet.fleet.rollout.rollouts import read_evidence

    return len(read_evidence(store).field)


def runtime_watch(store: Any) -> int:
    from epfleet.fleet.evidence.enrolment import keys_in_force
    from epfleet.fleet.publishing.publish import read_in_force
    from epfleet.fleet.watch.inputs import compile_worker_runtime, stream_device_reports
    from epfleet.fleet.watch.rules import check_pairs, find_unserved
    from epfleet.formats.device_report import DeviceReport
    from epfleet.formats.spec_file import load_spec

    spec = load_spec(ROOT / "examples" / "fleet.yaml")
    in_force = read_in_force(store)
    found = in_force.manifest
    runtime = compile_worker_runtime(spec)
    checks = check_pairs(spec, found, runtime)
    enrolled = keys_in_force(store, in_force)
    reports = (
        r for r in stream_device_reports(store, enrolled=enrolled) if isinstance(r, DeviceReport)
    )
    unserved, _ = find_unserved(
        reports, spec, checks, runtime, datetime.now(timezone.utc), timedelta(days=30)
    )
    return len(unserved)


def in_child(call: Callable[[Any], int], open_: Callable[[], Any]) -> dict[str, Any]:
    """``call`` on a store from ``open_``, in a forked child: its CPU, peak RSS over the
    parent's, wall, and (local) the requests counted."""
    context = get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        store = open_()
        base_rss = memory_kib("VmRSS")
        start_cpu, start = time.process_time(), time.perf_counter()
        call(store)
        cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
        peak = memory_kib("VmHWM")  # the child's peak resident set since the fork
        counts = store.counts if isinstance(store, CountingStore) else {}
        send.send({"cpu": cpu, "wall": wall, "peak_mib": (peak - base_rss) / 1024, **counts})

    process = context.Process(target=child)
    process.start()
    result: dict[str, Any] = receive.recv()
    process.join()
    return result


def memory_kib(field: str) -> int:
    """A line of /proc/self/status, in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def write_reports(store: Any, ids: list[int], now: datetime, round_: int) -> None:
    from epfleet.formats.device_report import report_key

    def one(i: int) -> None:
        store.write(report_key(f"dev-{i:07d}"), device_report(i, now, round_))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, ids))


@contextmanager
def s3_store(work: Path) -> Iterator[tuple[Callable[[], Any], FaultProxy]]:
    import boto3

    with moto_in_own_process() as port:
        proxy = FaultProxy(port)
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint_url
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        from epfleet.stores import open_store

        yield (lambda: open_store(f"s3://{BUCKET}/fleet")), proxy


def measure(kind: str, args: argparse.Namespace, work: Path) -> list[tuple[str, dict[str, Any]]]:
    from epfleet.stores import MANIFEST_KEY, open_store

    now = datetime.now(timezone.utc)
    rows: list[tuple[str, dict[str, Any]]] = []
    with ExitStack() as stack:
        proxy: FaultProxy | None = None
        if kind == "s3":
            opener, proxy = stack.enter_context(s3_store(work))
        else:
            directory = work / "store"

            def opener() -> Any:
                return CountingStore(open_store(str(directory)))

        store = opener()
        store.write(MANIFEST_KEY, manifest(now))
        n = args.reports
        started = time.perf_counter()
        write_reports(store, list(range(n)), now, 0)
        print(f"  {kind}: {n} reports written in {time.perf_counter() - started:.0f} s", flush=True)
        time.sleep(6)  # older than the index's settle time when the first pass starts

        def run(label: str, call: Callable[[Any], int]) -> None:
            mark = len(proxy.log) if proxy is not None else 0
            result = in_child(call, opener)
            if proxy is not None:
                for seen in proxy.log[mark:]:
                    listing = seen.method == "GET" and seen.path.rstrip("/") == f"/{BUCKET}"
                    method = "LIST" if listing else seen.method
                    result[method] = result.get(method, 0) + 1
            rows.append((label, result))
            print(f"  {kind}: {label}: {fmt(result)}", flush=True)

        run("full read (before)", full)
        run("listing the reports alone", listing)
        readers = [("gate", gate), ("field view", field_view), ("runtime-watch", runtime_watch)]
        for name, call in readers:
            run(f"{name}: pass 1", call)
        new = max(1, int(n * args.new))
        for round_, (name, call) in enumerate(readers, start=1):
            ids = list(range((round_ - 1) * new, round_ * new))
            write_reports(store, [i % n for i in ids], now, round_)
            time.sleep(6)  # the new reports settled: what is read is the new share only
            run(f"{name}: pass 2 ({args.new:.0%} new)", call)
        run("gate: pass 3 (nothing new)", gate)
    return rows


def fmt(result: dict[str, Any]) -> str:
    return (
        f"GET {result.get('GET', 0)}, LIST {result.get('LIST', 0)}, PUT {result.get('PUT', 0)}, "
        f"CPU {result['cpu']:.2f} s, wall {result['wall']:.2f} s, "
        f"peak +{result['peak_mib']:.0f} MiB"
    )


def preload() -> None:
    """Import here what the readers import, before the children fork: a child's CPU is
    its pass, not the imports every long-running reader has done once."""
    import eps
    from epfleet.fleet.rollout import rollouts  # noqa: F401
    from epfleet.fleet.watch import inputs, rules  # noqa: F401
    from epfleet.formats import spec_file  # noqa: F401
    from epfleet.stores import s3  # noqa: F401

    eps.load("CPUExecutionProvider").build_identity()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reports", type=int, default=10_000)
    parser.add_argument("--new", type=float, default=0.05)
    parser.add_argument("--stores", default="local,s3")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["EPFLEET_CACHE"] = str(work / "cache")
        os.environ["EPFLEET_ALLOW_UNSIGNED"] = "true"
        preload()
        for kind in args.stores.split(","):
            rows = measure(kind, args, work / kind)
            table(kind, args, rows)


def table(kind: str, args: argparse.Namespace, rows: list[tuple[str, dict[str, Any]]]) -> None:
    n = args.reports
    first = dict(rows)["full read (before)"]
    load = os.getloadavg()[0]
    print(f"\n{kind} store, N = {n:,} reports, {args.new:.0%} new per pass 2, load {load:.1f}")
    print(f"{'pass':34} {'GET':>7} {'LIST':>5} {'PUT':>5} {'CPU s':>7} {'xfull':>6} {'MiB':>5}")
    for label, r in rows:
        ratio = r["cpu"] / first["cpu"] if first["cpu"] else 0.0
        print(
            f"{label:34} {r.get('GET', 0):>7,} {r.get('LIST', 0):>5} {r.get('PUT', 0):>5} "
            f"{r['cpu']:>7.2f} {ratio:>6.2f} {r['peak_mib']:>5.0f}"
        )
    budget = args.new * n + 1000
    worst = max(r.get("GET", 0) for label, r in rows if "pass 2" in label)
    print(f"pass 2 GETs at most {worst:,}: target 0.05 N + 1,000 = {budget:,.0f}")
    built = dict(rows)["gate: pass 1"]["cpu"]
    ratios = [r["cpu"] / built for label, r in rows if "pass 2" in label]
    print(f"pass 2 CPU {min(ratios):.2f}-{max(ratios):.2f} of the gate's first pass: target 0.3")
    hour(kind, args, rows)


def hour(kind: str, args: argparse.Namespace, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """The three readers' hour at 1M devices with ``--new`` of them reporting in it: the
    new reports are folded once (by the first reader to pass: the gate's pass 2), the
    other two find the index up to date (the gate's pass 3). Each measured pass scaled
    linearly in N at the same new share: its listing, its records and its new reports all
    grow with N; its 256 shard requests do not (an upper bound on CPU)."""
    found = dict(rows)
    scale = 1_000_000 / args.reports
    folding = found[f"gate: pass 2 ({args.new:.0%} new)"]
    current = found["gate: pass 3 (nothing new)"]
    listed = found["listing the reports alone"]

    def gets(label: str, r: dict[str, Any]) -> float:
        shards = 0 if "full" in label else min(r.get("GET", 0), 257)  # not per report
        return (r.get("GET", 0) - shards) * scale + shards

    cpu = (folding["cpu"] + 2 * current["cpu"]) * scale
    requests = gets("", folding) + 2 * gets("", current)
    lists = 3 * (1_000_000 // 1000 + 1) if kind == "s3" else 3
    print(
        f"at 1M devices, {args.new:.0%} new in the hour (one pass folds them, two find the "
        f"index up to date): ~{requests:,.0f} GETs, ~{lists:,} LISTs, ~{cpu:,.0f} CPU-s "
        f"(target 100,000 GETs, 60 CPU-s); of which listing the reports "
        f"~{3 * listed['cpu'] * scale:,.0f} CPU-s"
    )
    for label, r in rows:
        if "pass 2" in label or "full" in label:
            cpu = r["cpu"] * scale
            print(f"  one {label:32} ~{gets(label, r):>9,.0f} GETs ~{cpu:>6,.0f} CPU-s")


if __name__ == "__main__":
    main()
