"""Benchmark: one runtime-watch pass over a large fleet's device reports, on loopback S3 (moto).

    python bench/runtime_watch.py [--devices 2000] [--models 20]

The store holds a manifest of --models models × 8 targets (6 Snapdragon HTP, OpenVINO
NPU, CPU), one pair compiled with an older QNN package, and one report per device (5
models each; one device in ten runs a model on the CPU fallback). It times the watch's
steps and compares reading the reports one at a time with epfleet's threaded read, in one
run. moto runs in its own process, as a real store would.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from loopback import Relay, moto_in_own_process  # bench/, beside this script

from epfleet.fleet.watch.inputs import READ_THREADS, read_reports
from epfleet.fleet.watch.rules import Runtime, check_pairs, find_unserved
from epfleet.formats.device_report import DeviceInfo, DeviceReport, ManifestStatus, ModelReport
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    SourceEntry,
    VariantEntry,
    utcnow,
)
from epfleet.formats.spec_file import parse_spec
from epfleet.stores import open_store

BUCKET = "bench-watch"
QNN, CPU, OV = "QNNExecutionProvider", "CPUExecutionProvider", "OpenVINOExecutionProvider"
HTP = [(75, 57), (73, 43), (79, 69), (81, 87), (69, 36), (68, 53)]


def fleet(models: int):  # type: ignore[no-untyped-def]
    targets = [
        {"name": f"htp-{a}-{s}", "ep": QNN, "provider_options": {"htp_arch": a, "soc_model": s}}
        for a, s in HTP
    ]
    targets += [{"name": "ov-npu", "ep": OV, "device": "npu"}, {"name": "x86-cpu", "ep": CPU}]
    names = [f"model-{i:03d}" for i in range(models)]
    spec = parse_spec(
        {"models": [{"name": n, "source": f"{n}.onnx"} for n in names], "targets": targets}
    )
    sha = "c" * 64

    def variant(target: dict, ep_version: str) -> VariantEntry:
        return VariantEntry(
            ep=target["ep"],
            device="cpu" if target["ep"] == CPU else "npu",
            compatibility_string="s",
            artifact=ArtifactRef(uri=f"variants/m/t/{sha}.onnx", sha256=sha, size=5),
            ort_version="1.32.0",
            ep_version=ep_version,
            compiled_at=utcnow(),
            status="ok",
            source_sha256=sha,
            fingerprint="f",
        )

    versions = {QNN: "2.7.0", OV: "1.8.1", CPU: "1.32.0"}
    manifest = Manifest(
        generation=7,
        models={
            n: ModelEntry(
                source=SourceEntry(uri=f"sources/{sha}.onnx", sha256=sha, size=10),
                variants={t["name"]: variant(t, versions[t["ep"]]) for t in targets},
            )
            for n in names
        },
    )
    manifest.models[names[0]].variants["htp-75-57"].ep_version = "2.6.0"
    runtime = Runtime(
        ort_version="1.32.0",
        ep_versions=versions,
        ep_packages={QNN: "onnxruntime-qnn", OV: "onnxruntime-ep-openvino", CPU: "onnxruntime"},
    )
    return spec, manifest, runtime, names


def device_report(i: int, names: list[str]) -> bytes:
    unserved = i % 10 == 0
    kinds = [("OpenVINOExecutionProvider", "npu", 0x8086)] if i % 3 else [(QNN, "npu", 0x5143)]
    return (
        DeviceReport(
            device_id=f"device-{i:06d}",
            generated_at=utcnow().isoformat(),
            ort_version="1.32.0",
            ep_packages={"onnxruntime": "1.32.0"},
            devices=[
                DeviceInfo(ep=ep, type=t, vendor="v", vendor_id=v, device_id=i % 4, ep_vendor="v")
                for ep, t, v in [*kinds, (CPU, "cpu", 0x8086)]
            ],
            store=f"s3://{BUCKET}",
            cache="/var/lib/app/models",
            manifest=ManifestStatus(status="unchanged", generation=7, body_bytes=0),
            models=[
                ModelReport(
                    model=name,
                    action="fallback" if unserved and k == 0 else "kept",
                    variant="v",
                    target="x86-cpu",
                    ep=CPU,
                    verdict=None,
                    bytes_downloaded=0,
                    reason="",
                    considered=[],
                    seconds=0.01,
                )
                for k, name in enumerate(names[i % 5 : i % 5 + 5])
            ],
            seconds=0.5,
        )
        .model_dump_json()
        .encode()
    )


def timed(call, *args, **kwargs):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = call(*args, **kwargs)
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument(
        "--latency-ms", type=float, default=20, help="round trip added for the second read"
    )
    args = parser.parse_args()
    rows = []
    with moto_in_own_process() as port:
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        store = open_store(f"s3://{BUCKET}")
        spec, manifest, runtime, names = fleet(args.models)
        store.write("manifest.json", manifest.to_json())
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda i: store.write(
                        f"reports/devices/device-{i:06d}.json", device_report(i, names)
                    ),
                    range(args.devices),
                )
            )
        keys, list_s = timed(store.list_keys, "reports/devices/")
        assert len(keys) == args.devices
        rows.append((f"list {len(keys)} report keys", f"{list_s * 1000:.0f} ms"))
        (one_by_one, _), seq_s = timed(read_reports, store, 1)
        (reports, skipped), par_s = timed(read_reports, store, READ_THREADS)
        assert len(reports) == len(one_by_one) == args.devices and not skipped
        rows.append(("read + validate reports, one at a time", f"{seq_s:.2f} s"))
        rows.append((f"read + validate reports, {READ_THREADS} threads", f"{par_s:.2f} s"))
        rows.append(("  speed-up", f"{seq_s / par_s:.1f}x"))
        # The same reads with a real endpoint's round trip: there the wait, not the CPU,
        # dominates, and reading many at a time pays off.
        relay = Relay(port, latency=args.latency_ms / 1000)
        os.environ["AWS_ENDPOINT_URL"] = relay.endpoint_url
        far = open_store(f"s3://{BUCKET}")
        label = f"{args.latency_ms:.0f} ms round trip"
        sample = far.list_keys("reports/devices/")[: args.devices // 4]
        far_seq_s = timed(lambda: [far.read(k) for k in sample])[1] * 4
        _, far_par_s = timed(read_reports, far, READ_THREADS)
        rows.append((f"read reports, {label}, one at a time (est.)", f"{far_seq_s:.2f} s"))
        rows.append(
            (f"read + validate reports, {label}, {READ_THREADS} threads", f"{far_par_s:.2f} s")
        )
        rows.append(("  speed-up", f"{far_seq_s / far_par_s:.1f}x"))
        checks, check_s = timed(check_pairs, spec, manifest, runtime)
        rows.append((f"check {len(checks)} pairs", f"{check_s * 1000:.1f} ms"))
        (profiles, _), find_s = timed(
            find_unserved, reports, spec, checks, runtime, utcnow(), timedelta(days=30)
        )
        devices = sum(p.device_count for p in profiles)
        rows.append(
            (
                f"group unserved: {len(profiles)} profiles, {devices} devices",
                f"{find_s * 1000:.0f} ms",
            )
        )
        stale = [c for c in checks if c.needs_compile]
        rows.append(("stale pairs found", f"{len(stale)}"))
        rows.append(
            (
                "whole pass (list, read threaded, check, group)",
                f"{list_s + par_s + check_s + find_s:.2f} s",
            )
        )
    print(
        f"\nruntime-watch benchmark: {args.devices} device reports, {args.models} models × 8 "
        f"targets ({os.cpu_count()} cores, moto S3 on loopback in its own process)"
    )
    for metric, value in rows:
        print(f"  {metric:<52} {value:>10}")


if __name__ == "__main__":
    main()
