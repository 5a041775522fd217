"""What the fleet-side readers of device reports cost with the evidence index, against a full
read of every report (what they did before it), on a local store and on S3, at several
fleet sizes, and what those sizes say of a million devices.

    python bench/evidence_index.py [--reports 10000,30000,100000] [--s3-reports 10000,30000]
        [--new 0.05] [--stores local,s3] [--save FILE] [--quick]
    python bench/evidence_index.py --load FILE [--load FILE ...]   # the tables and fit again

N reports in the format devices upload (gzip JSON, on S3 with ``Content-Encoding: gzip``,
3 models each, a staged rollout of one of them: members and non-members, a few failures)
in a store whose manifest stages that rollout, uploaded over the store's own client by
several processes at once (on S3 straight to moto, not through the counting proxy).
Each reader runs in a child process of its own (fork), so that its CPU (user + system)
and its peak memory (the child's peak resident set, VmHWM, above its resident set when
the pass started) are its own: the rollout gate (``read_evidence``, what ``epfleet
rollout status`` and the gate flow read), the field view (``epfleet manifest show
--field`` reads the same pass), and runtime-watch's reading (``stream_device_reports``
through ``find_unserved``). Requests are counted where they happen: on S3 by
tests/support/s3proxy.py between the client and moto (in a process of its own, on
loopback), on a local store by a counting wrapper (a LIST is one listing of a folder, a
GET one read, a PUT one write).

Rows, at each N: on S3, a report read through botocore's ``get_object`` and through
``bulk_read`` side by side; a full read (the readers before the index), listing the
reports alone, the gate's first pass (the index built: a full listing) and the other two
readers' (sharing it: EPFLEET_EVIDENCE_FRESH_SECONDS); each reader's pass after ``--new``
of the reports were uploaded as devices of this release upload them (the report and its
notice in the inbox; a fresh share for each reader, so that each one folds its own, none
sharing); the gate's pass after another share and the two readers sharing it; a full
listing after another share (what every EPFLEET_EVIDENCE_FULL_LISTING_EVERY-th pass
does); the gate's pass after four shares at once; the gate's pass with nothing new.

Then, over the sizes measured, each kind of pass's requests and CPU fitted as fixed + per
device (N) + per new report folded (R) (``epfleet.fleet.pass_cost_rules``), and the hour
at 1M devices with ``--new`` of them reporting in it composed from those terms: for one
folding pass, two sharing it and a full listing's extra every
EPFLEET_EVIDENCE_FULL_LISTING_EVERY passes, and for deployments/prefect.yaml's schedules.
``--quick`` is a smoke run (N = 500 and 1,500: too few devices to fill the 256 shards, so
its fit warns).
"""

from __future__ import annotations

import argparse
import json
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


def gate_restoring(store: Any) -> int:
    """The gate's pass as it answered before the aggregates: every record of the index
    restored as a report and counted again."""
    from epfleet.clock import SYSTEM_CLOCK
    from epfleet.fleet.evidence.enrolment import keys_in_force
    from epfleet.fleet.evidence.fleet_reports import index_pass
    from epfleet.fleet.publishing.publish import read_in_force
    from epfleet.fleet.rollout.rollouts import _now, _recount
    from epfleet.formats.manifest import Manifest

    in_force = read_in_force(store)
    found = in_force.manifest or Manifest()
    enrolled = keys_in_force(store, in_force)
    staged = {n: e.rollout for n, e in found.models.items() if e.rollout}
    stream = index_pass(store, enrolled).heard()
    now = _now(SYSTEM_CLOCK)
    _, tally, _, _ = _recount(stream, staged, found, enrolled, now, timedelta(days=7))
    return tally["read"]


def index_only(store: Any) -> int:
    """The index brought up to date alone (listing, shards, new reports): what every
    reader's pass costs before it answers."""
    from epfleet.fleet.evidence.enrolment import keys_in_force
    from epfleet.fleet.evidence.fleet_reports import index_pass

    return index_pass(store, keys_in_force(store)).listed


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
    from epfleet.fleet.watch.watching import watch_store
    from epfleet.formats.spec_file import load_spec

    spec = load_spec(ROOT / "examples" / "fleet.yaml")
    return len(watch_store(spec, store, 30).plan.unserved)


def runtime_watch_restoring(store: Any) -> int:
    """Runtime-watch's reading as it was before the aggregates: every record restored."""
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


def in_child(
    call: Callable[[Any], Any], open_: Callable[[], Any], env: dict[str, str]
) -> dict[str, Any]:
    """``call`` on a store from ``open_``, in a forked child with ``env`` set: its CPU,
    peak RSS over the parent's, wall, and (local) the requests counted."""
    context = get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        os.environ.update(env)
        store = open_()
        base_rss = memory_kib("VmRSS")
        start_cpu, start = time.process_time(), time.perf_counter()
        answer = call(store)
        cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
        peak = memory_kib("VmHWM")  # the child's peak resident set since the fork
        counts = store.counts if isinstance(store, CountingStore) else {}
        extra = answer if isinstance(answer, dict) else {}
        send.send(
            {"cpu": cpu, "wall": wall, "peak_mib": (peak - base_rss) / 1024, **counts, **extra}
        )

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


def write_reports(
    open_: Callable[[], Any],
    ids: list[int],
    now: datetime,
    round_: int,
    notices: bool = False,
    label: str = "",
) -> None:
    """The reports of devices ``ids`` as devices upload them (gzip JSON, on S3 with
    ``Content-Encoding: gzip``); with ``notices``, each with its notice in the inbox, as
    devices of this release upload (the first reports' notices are gone: the lifecycle
    removes old partitions). Uploaded by ``UPLOADERS`` processes of ``UPLOAD_THREADS``
    threads each, every one with a store from ``open_`` (real requests, concurrent as a
    fleet's are), printing progress."""
    chunks = [
        (ids[i : i + UPLOAD_CHUNK], now, round_, notices) for i in range(0, len(ids), UPLOAD_CHUNK)
    ]
    started, done, shown = time.perf_counter(), 0, 0.0
    context = get_context("fork")
    with context.Pool(UPLOADERS, initializer=_open_uploader, initargs=(open_,)) as pool:
        for written in pool.imap_unordered(_upload_chunk, chunks):
            done += written
            elapsed = time.perf_counter() - started
            if elapsed - shown >= 15 or done == len(ids):
                shown = elapsed
                print(
                    f"    {label}: {done:,} of {len(ids):,} reports uploaded, "
                    f"{elapsed:.0f} s ({done / max(elapsed, 1e-9):,.0f} a second)",
                    flush=True,
                )


UPLOADERS = 3
UPLOAD_THREADS = 8
UPLOAD_CHUNK = 500
_uploader: Any = None


def _open_uploader(open_: Callable[[], Any]) -> None:
    global _uploader
    _uploader = open_()


def _upload_chunk(chunk: tuple[list[int], datetime, int, bool]) -> int:
    from epfleet.formats.device_report import inbox_key, report_key

    ids, now, round_, notices = chunk

    def one(i: int) -> None:
        device = f"dev-{i:07d}"
        body = device_report(i, now, round_)
        _uploader.write(report_key(device), body, content_encoding="gzip")
        if notices:
            _uploader.write(inbox_key(device, datetime.now(timezone.utc)), b"")

    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        list(pool.map(one, ids))
    return len(ids)


@contextmanager
def s3_store() -> Iterator[tuple[Callable[[], Any], Callable[[], Any], FaultProxy]]:
    """moto in a process of its own: the readers' store (through the counting proxy) and
    the uploaders' (straight to moto: the proxy counts the readers' requests only)."""
    import boto3

    with moto_in_own_process() as port:
        direct = os.environ["AWS_ENDPOINT_URL"]
        proxy = FaultProxy(port)
        os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint_url
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        from epfleet.stores import open_store

        def uploader() -> Any:
            os.environ["AWS_ENDPOINT_URL"] = direct  # in the uploading process only
            return open_store(f"s3://{BUCKET}/fleet")

        yield (lambda: open_store(f"s3://{BUCKET}/fleet")), uploader, proxy


SETTLED = 6.0  # seconds: older than the index's settle time (5 s) when a pass starts


def measure(kind: str, n: int, new_share: float, work: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every pass of the bench on ``n`` reports in a ``kind`` store of its own."""
    from epfleet.stores import MANIFEST_KEY, open_store

    now = datetime.now(timezone.utc)
    rows: list[tuple[str, dict[str, Any]]] = []
    where = f"{kind}, N = {n:,}"
    with ExitStack() as stack:
        proxy: FaultProxy | None = None
        if kind == "s3":
            opener, uploader, proxy = stack.enter_context(s3_store())
        else:
            directory = work / f"store-{n}"

            def opener() -> Any:
                return CountingStore(open_store(str(directory)))

            uploader = opener
        store = opener()
        store.write(MANIFEST_KEY, manifest(now))
        write_reports(uploader, list(range(n)), now, 0, label=where)
        time.sleep(SETTLED)

        def run(label: str, call: Callable[[Any], int], new: int, **env: str) -> None:
            mark = len(proxy.log) if proxy is not None else 0
            result = in_child(call, opener, env)
            if proxy is not None:
                for seen in proxy.log[mark:]:
                    listing = seen.method == "GET" and seen.path.rstrip("/") == f"/{BUCKET}"
                    method = "LIST" if listing else seen.method
                    result[method] = result.get(method, 0) + 1
            result["new"] = new
            rows.append((label, result))
            print(f"  {where}: {label}: {fmt(result)}", flush=True)

        if kind == "s3":
            rows.append(("reads", in_child(reads_side_by_side(n), opener, {})))
        run(FULL_READ, full, n)
        run("listing the reports alone", listing, 0)
        now_fresh = {"EPFLEET_EVIDENCE_FRESH_SECONDS": "0"}
        shared = {"EPFLEET_EVIDENCE_FRESH_SECONDS": "3600"}
        run(FIRST_PASS, gate, n, **now_fresh)
        run("field view: pass 1 (shares it)", field_view, 0, **shared)
        run("runtime-watch: pass 1 (shares it)", runtime_watch, 0, **shared)
        new = max(1, int(n * new_share))
        percent = f"{new_share:.0%} new"
        readers = [("gate", gate), ("field view", field_view), ("runtime-watch", runtime_watch)]
        for round_, (name, call) in enumerate(readers, start=1):
            ids = list(range((round_ - 1) * new, round_ * new))
            write_reports(uploader, [i % n for i in ids], now, round_, notices=True, label=where)
            time.sleep(SETTLED)  # the new reports settled: what is read is the new share only
            run(f"{name}: pass 2 ({percent})", call, new, **now_fresh)
        write_reports(uploader, [i % n for i in range(3 * new, 4 * new)], now, 4, True, where)
        time.sleep(SETTLED)
        run(f"gate: pass 3 ({percent})", gate, new, **now_fresh)
        run(SHARING_FIELD_VIEW, field_view, 0, **shared)
        run(SHARING_RUNTIME_WATCH, runtime_watch, 0, **shared)
        write_reports(uploader, [i % n for i in range(4 * new, 5 * new)], now, 5, True, where)
        time.sleep(SETTLED)
        every = {"EPFLEET_EVIDENCE_FULL_LISTING_EVERY": "1", **now_fresh}
        run(f"gate: full listing ({percent})", gate, new, **every)
        more = 4 * new  # a second share, so that the fit tells what grows with N from R
        write_reports(
            uploader, [i % n for i in range(5 * new, 5 * new + more)], now, 6, True, where
        )
        time.sleep(SETTLED)
        run(f"gate: pass 4 ({4 * new_share:.0%} new)", gate, more, **now_fresh)
        run(NOTHING_NEW, gate, 0, **now_fresh)
        run("gate restoring records: nothing new (before)", gate_restoring, 0, **now_fresh)
        run("runtime-watch: nothing new", runtime_watch, 0, **now_fresh)
        run(
            "runtime-watch restoring: nothing new (before)", runtime_watch_restoring, 0, **now_fresh
        )
        run("index update alone: nothing new", index_only, 0, **now_fresh)
    return rows


FULL_READ = "full read (before)"
FIRST_PASS = "gate: pass 1 (builds the index)"
NOTHING_NEW = "gate: nothing new"
SHARING_FIELD_VIEW = "field view: pass 3 (shares the gate's)"
SHARING_RUNTIME_WATCH = "runtime-watch: pass 3 (shares it)"
MEASURES = ("GET", "LIST", "PUT", "cpu")
SHARED_READ = "gate or field view, sharing a pass"  # both answer read_evidence's aggregates
SHARED_WATCH = "runtime-watch, sharing a pass"


def reads_side_by_side(n: int) -> Callable[[Any], dict[str, float]]:
    """The CPU of reading reports with botocore's get_object (``read``) and with
    ``bulk_read``, in turns of 100 reports, 1,000 of each (or N)."""

    def measure(store: Any) -> dict[str, float]:
        from epfleet.formats.device_report import report_key

        keys = [report_key(f"dev-{i:07d}") for i in range(min(n, 1000))]
        spent = {"get_object": 0.0, "bulk_read": 0.0}
        store.bulk_read(keys[0])  # the pool and signer made once, as a pass makes them
        for start in range(0, len(keys), 100):
            for name, read in (("get_object", store.read), ("bulk_read", store.bulk_read)):
                began = time.process_time()
                for key in keys[start : start + 100]:
                    assert read(key) is not None
                spent[name] += time.process_time() - began
        per = {name: 1000 * cpu / len(keys) for name, cpu in spent.items()}
        print(
            f"  a report read, client CPU: get_object {per['get_object']:.2f} ms, "
            f"bulk_read {per['bulk_read']:.2f} ms "
            f"({per['bulk_read'] / per['get_object']:.2f} of get_object's)",
            flush=True,
        )
        return per

    return measure


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
    parser.add_argument(
        "--reports",
        default="10000,30000,100000",
        help="the fleet sizes N to measure, comma-separated (two or more to fit the terms)",
    )
    parser.add_argument("--new", type=float, default=0.05, help="the share of N new per pass")
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument(
        "--s3-reports", help="the fleet sizes for the S3 store, when not --reports's"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: N = 500 and 1,500, both stores"
    )
    parser.add_argument("--save", type=Path, help="write the measured passes here (JSON)")
    parser.add_argument(
        "--load",
        type=Path,
        action="append",
        default=[],
        help="no run: the passes saved by --save (repeatable; later files add sizes)",
    )
    args = parser.parse_args()
    if args.quick:
        args.reports, args.s3_reports = "500,1500", None
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    measured: dict[str, dict[int, list[tuple[str, dict[str, Any]]]]] = {}
    for saved in args.load:
        for kind, by_size in json.loads(saved.read_text()).items():
            for size, rows in by_size.items():
                measured.setdefault(kind, {})[int(size)] = [tuple(row) for row in rows]
    if not args.load:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            os.environ["EPFLEET_CACHE"] = str(work / "cache")
            os.environ["EPFLEET_ALLOW_UNSIGNED"] = "true"
            preload()
            for kind in args.stores.split(","):
                sizes = args.s3_reports if kind == "s3" and args.s3_reports else args.reports
                for n in (int(size) for size in sizes.split(",")):
                    os.environ["EPFLEET_CACHE"] = str(work / f"cache-{kind}-{n}")
                    measured.setdefault(kind, {})[n] = measure(kind, n, args.new, work / kind)
                    table(kind, n, args.new, measured[kind][n])
                    if args.save:
                        args.save.write_text(json.dumps(measured, indent=1))
    for kind, by_size in measured.items():
        if args.load:
            for n, rows in sorted(by_size.items()):
                table(kind, n, args.new, rows)
        fitted(kind, by_size, args.new)


def table(kind: str, n: int, new_share: float, rows: list[tuple[str, dict[str, Any]]]) -> None:
    found = dict(rows)
    first = found[FULL_READ]
    print(f"\n{kind} store, N = {n:,} reports, {new_share:.0%} new per pass")
    print(f"{'pass':46} {'GET':>7} {'LIST':>5} {'PUT':>5} {'CPU s':>7} {'xfull':>6} {'MiB':>5}")
    for label, r in rows:
        if "cpu" not in r or label == "reads":
            continue
        ratio = r["cpu"] / first["cpu"] if first["cpu"] else 0.0
        print(
            f"{label:46} {r.get('GET', 0):>7,} {r.get('LIST', 0):>5} {r.get('PUT', 0):>5} "
            f"{r['cpu']:>7.2f} {ratio:>6.2f} {r['peak_mib']:>5.0f}"
        )
    budget = new_share * n + 1000
    folding = [r for label, r in rows if "pass 2" in label]
    worst = max(r.get("GET", 0) for r in folding)
    print(f"pass 2 GETs at most {worst:,}: target {new_share:g} N + 1,000 = {budget:,.0f}")
    built = found[FIRST_PASS]["cpu"]
    ratios = [r["cpu"] / built for r in folding]
    print(f"pass 2 CPU {min(ratios):.2f}-{max(ratios):.2f} of the gate's first pass: target 0.3")
    if "reads" in found:
        per = found["reads"]
        print(
            f"a report read, client CPU: get_object {per['get_object']:.2f} ms, "
            f"bulk_read {per['bulk_read']:.2f} ms"
        )


def passes_of(
    by_size: dict[int, list[tuple[str, dict[str, Any]]]], pick: Callable[[str], bool]
) -> list[Any]:
    from epfleet.fleet.pass_cost_rules import Measured

    return [
        Measured(
            n, 0 if label == FULL_READ else int(r["new"]), {m: float(r.get(m, 0)) for m in MEASURES}
        )
        for n, rows in sorted(by_size.items())
        for label, r in rows
        if pick(label)
    ]  # the full read reads every report: what it costs is per device


def fitted(
    kind: str, by_size: dict[int, list[tuple[str, dict[str, Any]]]], new_share: float
) -> None:
    """The terms fitted over the measured sizes, and the hour they give at 1M devices,
    for the bench's hour and for the deployments' schedules."""
    from epfleet.fleet.pass_cost_rules import (
        FOLDING,
        FULL_LISTING,
        Measured,
        Schedule,
        fit_pass,
        hour,
        totals,
    )
    from epfleet.settings import settings

    folding = passes_of(
        by_size,
        lambda label: (
            label.startswith("gate: pass 2")
            or label.startswith("gate: pass 3")
            or label.startswith("gate: pass 4")
        ),
    )
    listing_extra = []
    for n, rows in sorted(by_size.items()):
        found = dict(rows)
        full_listing = next(r for label, r in rows if label.startswith("gate: full listing"))
        inbox = next(r for label, r in rows if label.startswith("gate: pass 3"))
        listing_extra.append(
            Measured(
                n,
                0,
                {m: float(full_listing.get(m, 0) - inbox.get(m, 0)) for m in MEASURES},
                sizes={m: float(full_listing.get(m, 0)) for m in MEASURES},
            )
        )
        del found
    fits = {
        FOLDING: fit_pass(folding, MEASURES, f"{kind}: {FOLDING}"),
        SHARED_READ: fit_pass(
            passes_of(by_size, lambda label: label == SHARING_FIELD_VIEW),
            MEASURES,
            f"{kind}: field view sharing",
        ),
        SHARED_WATCH: fit_pass(
            passes_of(by_size, lambda label: label == SHARING_RUNTIME_WATCH),
            MEASURES,
            f"{kind}: runtime-watch sharing",
        ),
        FULL_LISTING: fit_pass(listing_extra, MEASURES, f"{kind}: full listing"),
        "full read (before), for scale": fit_pass(
            passes_of(by_size, lambda label: label == FULL_READ), MEASURES, f"{kind}: full read"
        ),
    }
    sizes = ", ".join(f"{n:,}" for n in sorted(by_size))
    print(
        f"\n{kind} store: each pass's terms fitted over N = {sizes} (least squares; "
        f"R = the new reports a pass folds)"
    )
    print(
        f"{'kind of pass':42} {'measure':>7} {'fixed':>10} {'per device':>12} "
        f"{'per new report':>15}"
    )
    for what, by_measure in fits.items():
        for measure, terms in by_measure.items():
            print(
                f"{what:42} {measure:>7} {terms.fixed:>10.4g} {terms.per_device:>12.4g} "
                f"{terms.per_new:>15.4g}"
            )
    warnings = [w for by_measure in fits.values() for t in by_measure.values() for w in t.warnings]
    devices = 1_000_000
    new = int(devices * new_share)
    every = settings().evidence_full_listing_every
    schedules = [
        Schedule(
            f"one folding pass, two sharing it, a full listing every {every} passes",
            folding=1,
            sharing={SHARED_READ: 1, SHARED_WATCH: 1},
            full_listing_every=every,
        ),
        # deployments/prefect.yaml: the gate hourly and on its trigger (device reports, at
        # most every 300 s: on a large fleet, every 300 s); a gate run finding a pass less
        # than EPFLEET_EVIDENCE_FRESH_SECONDS (600) old shares it unless it would advance a
        # rollout, so every other run folds; runtime-watch hourly shares one; the field
        # view when someone asks (once here); the full listing every 12 folding passes
        Schedule(
            "deployments/prefect.yaml on a large fleet: 12 gate runs (its trigger, every "
            "300 s), every other one folding (EPFLEET_EVIDENCE_FRESH_SECONDS 600) and the "
            "rest sharing, runtime-watch hourly and the field view once sharing",
            folding=6,
            sharing={SHARED_READ: 6 + 1, SHARED_WATCH: 1},
            full_listing_every=every,
        ),
    ]
    for schedule in schedules:
        spent = hour({k: v for k, v in fits.items()}, schedule, devices, new)
        summed = totals(spent)
        print(f"\n{kind}: the hour at 1M devices, {new:,} new reports in it: {schedule.name}")
        print(
            f"{'':42} {'measure':>7} {'fixed':>10} {'per device':>12} "
            f"{'per new report':>15} {'total':>10}"
        )
        for what, by_measure in [*spent.items(), ("the hour", summed)]:
            for measure, parts in by_measure.items():
                print(
                    f"{what:42} {measure:>7} {parts[0]:>10,.0f} {parts[1]:>12,.0f} "
                    f"{parts[2]:>15,.0f} {sum(parts):>10,.0f}"
                )
        gets, cpu = sum(summed["GET"]), sum(summed["cpu"])
        doubt = " (WARNINGS below: not to be trusted as it stands)" if warnings else ""
        print(f"the hour: ~{gets:,.0f} GETs (target 100,000), ~{cpu:,.0f} CPU-s (target 60){doubt}")
    for warning in warnings:
        print(f"WARNING: {warning}")


if __name__ == "__main__":
    main()
