"""Benchmark: `epfleet compile` against a plain sequential loop over ModelCompiler.

    python bench/fleet_compile.py [--workers 2] [--prefect ephemeral|server] [--store local|s3]
                                  [--samples N] [--verify-timeout S]

Models: PaddleOCR v4 detector, recogniser and classifier from the rapidocr-onnxruntime
wheel on PyPI (fetched once into bench/.cache), every input fixed through input_shapes.
Targets: three Snapdragon HTP targets (QNN, --htp for more) and one CPU target: 12 pairs.

It prints the wall time of
  plain   one process, a sequential loop: load, fix shapes, compile (ModelCompiler at
          ORT_ENABLE_BASIC for QNN, an ORT_ENABLE_ALL session for CPU), stamp metadata,
          upload to the store; it runs none of the variants it makes;
  cold    `epfleet compile` in a fresh process on an empty store;
  warm    the same command again (must compile nothing);
  unverified  a cold run with `verify: false` on every target: the plain loop's work;
and the ratios cold/plain (target <= 0.75) and warm/cold (target <= 0.10), and the
seconds the cold run spent compiling and verifying (running each variant on this host):
in all, and per model for the variants verified on every golden sample and for the
numerics twins checked on the first only (``epfleet.fleet.planning.twin_rules``; the three HTP
targets are one numerics family). Golden samples: one seeded generated input per model,
as `epfleet compile` makes by default (a twin's check is then the whole verification),
or with --samples N a samples file of N seeded generated inputs per model.

It also prints what signing (the store's TUF metadata, epfleet.trust) adds to a publish,
on local stores with 256 hashed bins: signing the cold run's manifest from scratch, a
publish of one changed model (a publisher in a fresh process: the signed state read and
verified, every bin's signature and the signed manifest's hash, one bin re-signed besides
manifest.json's, snapshot, timestamp, then manifest.json written as its copy), and a
publish that changes nothing;
the same for a synthetic manifest of 1,000 models x 10 variants. `--signing-only` prints
just those figures (the synthetic manifest; no compile).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples import paddle_ocr  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
MODELS = paddle_ocr.MODELS
# Snapdragon HTP targets (name: htp_arch, soc_model); --htp N takes the first N.
# (v68 is left out: QNN 2.51 fails to finalize these fp16 graphs for it, MEM_ALLOC.)
ALL_HTP = {
    "sd8g3": ("75", "57"),
    "sd8g2": ("73", "43"),
    "sd8e": ("79", "69"),
    "sd8e-g5": ("81", "87"),
    "sd8g1": ("69", "36"),
    "htp-v73-soc53": ("73", "53"),
}
HTP = dict(list(ALL_HTP.items())[:3])


def write_samples(directory: Path, models: dict[str, Path], count: int) -> dict[str, Path]:
    """A samples file of ``count`` seeded generated inputs per model (as `epfleet compile`
    generates one by default)."""
    import onnxruntime

    from epfleet.runtime.samples import generated_samples
    from epfleet.runtime.samples import write_samples as write
    from epfleet.runtime.sessions import input_infos

    files = {}
    for name, path in models.items():
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        infos = input_infos(session, {"x": MODELS[name][1]})
        files[name] = directory / f"{name}.samples.npz"
        write(files[name], generated_samples(infos, count))
    return files


def write_spec(
    directory: Path,
    models: dict[str, Path],
    verify: bool = True,
    samples: dict[str, Path] | None = None,
    verify_timeout: float | None = None,
) -> Path:
    import yaml

    targets: list[dict[str, object]] = [
        {
            "name": name,
            "ep": "QNNExecutionProvider",
            "provider_options": {
                "backend_type": "htp",
                "htp_arch": arch,
                "soc_model": soc,
                "enable_htp_fp16_precision": "1",
            },
        }
        for name, (arch, soc) in HTP.items()
    ]
    targets.append({"name": "cpu", "ep": "CPUExecutionProvider"})
    for target in targets:
        target["verify"] = verify
        if verify_timeout:
            target["verify_timeout"] = verify_timeout
    entries: list[dict[str, object]] = [
        {"name": name, "source": str(path), "input_shapes": {"x": MODELS[name][1]}}
        for name, path in models.items()
    ]
    for entry in entries:
        if samples:
            entry["samples"] = str(samples[str(entry["name"])])
    spec = {"models": entries, "targets": targets}
    path = directory / ("fleet.yaml" if verify else "fleet-unverified.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def plain_loop(models: dict[str, Path], store_uri: str) -> tuple[float, int]:
    """What a careful user writes without epfleet, in one process, one pair at a time."""
    import hashlib

    import onnx
    import onnxruntime as ort
    import onnxruntime_qnn
    from onnxruntime.capi._pybind_state import get_compatibility_info_from_model_bytes

    from epfleet.stores import open_store

    ort.set_default_logger_severity(3)
    store = open_store(store_uri)
    started = time.perf_counter()
    ort.register_execution_provider_library(
        "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
    )
    qnn_devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    pairs = 0
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for name, path in models.items():
            for target in [*HTP, "cpu"]:
                model = onnx.load(str(path))
                shape = MODELS[name][1]
                for dim, value in zip(
                    model.graph.input[0].type.tensor_type.shape.dim, shape, strict=True
                ):
                    dim.dim_value = value
                model = onnx.shape_inference.infer_shapes(model)
                fixed = work / f"{name}.fixed.onnx"
                onnx.save(model, str(fixed))
                out = work / f"{name}.{target}.onnx"
                if target == "cpu":
                    options = ort.SessionOptions()
                    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                    options.optimized_model_filepath = str(out)
                    ort.InferenceSession(str(fixed), options, providers=["CPUExecutionProvider"])
                    ep, string = "CPUExecutionProvider", f"cpu;ort={ort.__version__}"
                else:
                    arch, soc = HTP[target]
                    options = ort.SessionOptions()
                    options.add_provider_for_devices(
                        qnn_devices,
                        {
                            "backend_type": "htp",
                            "htp_arch": arch,
                            "soc_model": soc,
                            "enable_htp_fp16_precision": "1",
                        },
                    )
                    compiler = ort.ModelCompiler(
                        options,
                        str(fixed),
                        embed_compiled_data_into_model=True,
                        # epfleet's recipe: without it QNN takes only parts of these models
                        graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                        flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED,
                    )
                    compiler.compile_to_file(str(out))
                    ep = "QNNExecutionProvider"
                    string = get_compatibility_info_from_model_bytes(out.read_bytes(), ep)
                compiled = onnx.load(str(out))
                compiled.metadata_props.add(key=f"ep_compatibility_info.{ep}", value=string)
                data = compiled.SerializeToString()
                out.write_bytes(data)
                digest = hashlib.sha256(data).hexdigest()
                store.upload(f"variants/{name}/{target}/{digest}.onnx", out, digest)
                out.unlink()
                pairs += 1
    return time.perf_counter() - started, pairs


def run_epfleet(
    spec: Path, store: str, workers: int, env: dict[str, str], runner: str = "threads"
) -> tuple[float, dict]:
    started = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "epfleet.cli.app",
            "compile",
            str(spec),
            "--store",
            store,
            "--workers",
            str(workers),
            "--task-runner",
            runner,
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"epfleet compile failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return elapsed, json.loads(result.stdout)


def start_prefect_server(env: dict[str, str], home: Path) -> tuple[subprocess.Popen[bytes], str]:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env | {"PREFECT_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            return server, url
        except OSError:
            time.sleep(0.5)
    server.kill()
    sys.exit("prefect server did not start")


def synthetic_manifest(models: int = 1000, variants: int = 10) -> bytes:
    """A manifest of ``models`` x ``variants`` ok variants with realistic fields."""
    from datetime import datetime, timezone

    from epfleet.formats.manifest import (
        ArtifactRef,
        Coverage,
        Manifest,
        ModelEntry,
        SourceEntry,
        VariantEntry,
        Verification,
    )

    def sha(*parts: object) -> str:
        import hashlib

        return hashlib.sha256(repr(parts).encode()).hexdigest()

    now = datetime.now(timezone.utc).replace(microsecond=0)
    entries = {}
    for m in range(models):
        name = f"model-{m:04d}"
        source = SourceEntry(
            uri=f"sources/{sha(name)}.onnx",
            sha256=sha(name),
            size=20_000_000 + m,
            input_shapes={"x": [1, 3, 224, 224]},
        )
        entries[name] = ModelEntry(
            source=source,
            variants={
                f"target-{t}": VariantEntry(
                    ep="QNNExecutionProvider",
                    device="npu",
                    compatibility_string=f"QNN;soc_model={t};htp_arch=75;qnn_sdk=2.51.0",
                    provider_options={"backend_type": "htp", "soc_model": str(t)},
                    artifact=ArtifactRef(
                        uri=f"variants/{name}/target-{t}/{sha(name, t)}.onnx",
                        sha256=sha(name, t),
                        size=10_000_000 + t,
                    ),
                    ort_version="1.32.0",
                    ep_version="2.51.0",
                    compiled_at=now,
                    status="ok",
                    source_sha256=source.sha256,
                    fingerprint=sha("fp", name, t),
                    coverage=Coverage(ep_nodes=240, other_nodes=2, fraction=0.99),
                    verification=Verification(
                        status="passed",
                        runner="QNN HTP (host)",
                        samples=8,
                        max_abs_error=0.0012,
                        max_rel_error=0.004,
                        tolerance=0.05,
                        seconds=1.5,
                    ),
                )
                for t in range(variants)
            },
        )
    return Manifest(generation=1, models=entries).to_json()


def signing_cost(manifest_json: bytes, work: Path) -> dict[str, float]:
    """Seconds a publish on a signed local store holding ``manifest_json`` (256 bins)
    takes: ``trust init`` signing it all, then ``update_manifest`` (what every compile's
    publish does: read and verify the signed state, change it, sign, write the copy) with
    one model changed, and with nothing to change."""
    from epfleet.fleet.publishing.publish import update_manifest
    from epfleet.formats.manifest import Manifest
    from epfleet.stores import MANIFEST_KEY, open_store
    from epfleet.trust.repository import init_with_key_files
    from epfleet.trust.state import clear_cache

    store_dir = work / "signed-store"
    store = open_store(str(store_dir))
    store.write(MANIFEST_KEY, manifest_json)
    started = time.perf_counter()
    _, uri = init_with_key_files(store, work / "signing-keys", bins=256, adopt=True)
    first = time.perf_counter() - started
    os.environ["EPFLEET_TRUST_SIGNER"] = uri

    def one_changed(current: Manifest | None) -> Manifest:
        assert current is not None
        name = sorted(current.models)[0]
        entry = current.models[name].model_copy(deep=True)
        entry.source.size += 1
        models = current.models | {name: entry}
        return Manifest(generation=current.generation + 1, models=models)

    clear_cache()  # a publisher in a fresh process has verified none of the metadata yet
    started = time.perf_counter()
    changed = update_manifest(store, one_changed)
    one_model = time.perf_counter() - started
    assert changed.published and not changed.tampered, changed.tampered
    started = time.perf_counter()
    unchanged = update_manifest(store, lambda current: None)
    unchanged_s = time.perf_counter() - started
    assert not unchanged.published
    metadata = sum(p.stat().st_size for p in (store_dir / "trust" / "metadata").iterdir())
    return {
        "first": first,
        "one_model": one_model,
        "unchanged": unchanged_s,
        "metadata_mb": metadata / 1e6,
        "manifest_mb": len(manifest_json) / 1e6,
    }


def print_signing(label: str, cost: dict[str, float]) -> None:
    print(
        f"  signing {label} ({cost['manifest_mb']:.2f} MB manifest, 256 bins): "
        f"all from scratch {cost['first']:6.2f} s, one model changed "
        f"{cost['one_model']:6.2f} s, unchanged {cost['unchanged']:6.2f} s "
        f"({cost['metadata_mb']:.2f} MB of signed metadata written in all)"
    )


def print_verification_split(variants: list[dict]) -> None:
    """Per model, the HTP variants' verification seconds: those verified on every golden
    sample and the numerics twins checked on the first only (``verification_twin_of``;
    absent from the report before twins existed)."""
    for model in MODELS:
        htp = [v for v in variants if v["model"] == model and v["target"] in HTP]
        full = [v["verification_seconds"] or 0 for v in htp if not v.get("verification_twin_of")]
        twins = [v["verification_seconds"] or 0 for v in htp if v.get("verification_twin_of")]
        line = f"    {model}: {len(full)} verified on every sample, {sum(full):7.2f} s"
        if full:
            line += f" ({sum(full) / len(full):6.2f} s each)"
        line += f"; {len(twins)} twins checked on one sample, {sum(twins):7.2f} s"
        if twins:
            line += f" ({sum(twins) / len(twins):6.2f} s each)"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--prefect",
        choices=["ephemeral", "server"],
        default="ephemeral",
        help="ephemeral: Prefect's temporary local API (the CLI default); "
        "server: a `prefect server` already running, as in production",
    )
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    parser.add_argument(
        "--dask",
        action="store_true",
        help="also compile the fleet with --task-runner dask (a local cluster of --workers)",
    )
    parser.add_argument(
        "--htp",
        type=int,
        default=3,
        choices=range(1, len(ALL_HTP) + 1),
        help="how many HTP targets (pairs = 3 models x (N + 1 CPU))",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=0,
        help="golden samples per model: a samples file of N seeded generated inputs "
        "(default: none, so one generated input, as epfleet makes by default)",
    )
    parser.add_argument(
        "--verify-timeout",
        type=float,
        default=None,
        help="every target's verify_timeout in seconds (default 600: on a loaded 2-core "
        "machine, the detector's HTP variant on several samples runs past it)",
    )
    parser.add_argument(
        "--signing-only",
        action="store_true",
        help="only what signing adds to a publish, on a synthetic 1,000 x 10 manifest",
    )
    args = parser.parse_args()
    if args.signing_only:
        with tempfile.TemporaryDirectory(prefix="epfleet-bench-") as scratch:
            print_signing(
                "1,000 models x 10 variants", signing_cost(synthetic_manifest(), Path(scratch))
            )
        return
    HTP.clear()
    HTP.update(list(ALL_HTP.items())[: args.htp])

    models = paddle_ocr.fetch(CACHE)
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    work = Path(tempfile.mkdtemp(prefix="epfleet-bench-"))
    cleanup: list[subprocess.Popen[bytes]] = []
    moto = None
    try:
        env["EPFLEET_CACHE"] = str(work / "cache")
        env["PREFECT_HOME"] = str(work / "prefect-home")
        if args.store == "s3":
            import boto3
            from moto.server import ThreadedMotoServer

            moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            moto.start()
            host, port = moto.get_host_and_port()
            env |= {
                "AWS_ENDPOINT_URL": f"http://{host}:{port}",
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_DEFAULT_REGION": "us-east-1",
            }
            os.environ.update(
                {
                    k: env[k]
                    for k in (
                        "AWS_ENDPOINT_URL",
                        "AWS_ACCESS_KEY_ID",
                        "AWS_SECRET_ACCESS_KEY",
                        "AWS_DEFAULT_REGION",
                    )
                }
            )
            boto3.client("s3").create_bucket(Bucket="bench")
            plain_store, epfleet_store = "s3://bench/plain", "s3://bench/epfleet"
        else:
            plain_store, epfleet_store = str(work / "plain-store"), str(work / "epfleet-store")
        if args.prefect == "server":
            server, url = start_prefect_server(env, work / "prefect-server-home")
            cleanup.append(server)
            env["PREFECT_API_URL"] = url
        samples = write_samples(work, models, args.samples) if args.samples else None
        spec = write_spec(work, models, samples=samples, verify_timeout=args.verify_timeout)
        # Prefect creates and migrates its database on first use; a user pays that once,
        # not on every compile, so it stays out of the timings.
        run_epfleet(
            ROOT / "examples" / "fleet.yaml", str(work / "warm-up-store"), args.workers, env
        )

        plain_s, pairs = plain_loop(models, plain_store)
        cold_s, cold = run_epfleet(spec, epfleet_store, args.workers, env)
        warm_s, warm = run_epfleet(spec, epfleet_store, args.workers, env)
        unverified_spec = write_spec(
            work, models, verify=False, samples=samples, verify_timeout=args.verify_timeout
        )
        unverified_store = (
            str(work / "unverified-store") if args.store == "local" else "s3://bench/unverified"
        )
        unverified_s, unverified = run_epfleet(unverified_spec, unverified_store, args.workers, env)
        assert unverified["compiled"] == pairs and unverified["failed"] == 0, unverified
        if args.dask:
            dask_store = str(work / "dask-store") if args.store == "local" else "s3://bench/dask"
            dask_s, dask = run_epfleet(spec, dask_store, args.workers, env, "dask")
            assert dask["compiled"] == pairs and dask["failed"] == 0, dask
        from epfleet.stores import MANIFEST_KEY, open_store

        bench_manifest = open_store(epfleet_store).read(MANIFEST_KEY)
        assert bench_manifest is not None
        bench_signing = signing_cost(bench_manifest.data, work / "sign-bench")
        synthetic_signing = signing_cost(synthetic_manifest(), work / "sign-synthetic")
    finally:
        for proc in cleanup:
            proc.terminate()
            proc.wait(timeout=30)
        if moto is not None:
            moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    assert cold["compiled"] == pairs and cold["failed"] == 0, cold
    assert warm["compiled"] == 0, warm
    print(
        f"fleet compile benchmark: {pairs} pairs (3 PaddleOCR models x {len(HTP)} HTP + 1 CPU), "
        f"{args.workers} workers, {os.cpu_count()} cores, "
        f"store={args.store}, prefect={args.prefect}, "
        f"golden samples per model: {args.samples or '1 (generated)'}"
    )
    print(f"  plain sequential ModelCompiler loop + upload  {plain_s:7.2f} s")
    print(
        f"  epfleet compile, cold                         {cold_s:7.2f} s   "
        f"{cold_s / plain_s:5.2f}x plain   (target <= 0.75x)"
    )
    print(
        f"  epfleet compile, warm rerun (0 compiles)      {warm_s:7.2f} s   "
        f"{warm_s / cold_s:5.2f}x cold    (target <= 0.10x)"
    )
    print(
        f"  epfleet compile, cold, verify: false          {unverified_s:7.2f} s   "
        f"{unverified_s / plain_s:5.2f}x plain   (the same work as the plain loop)"
    )
    if args.dask:
        print(
            f"  epfleet compile --task-runner dask, cold      {dask_s:7.2f} s   "
            f"{dask_s / cold_s:5.2f}x threads (one machine: the cluster's start-up and "
            "per-worker imports)"
        )
    compile_seconds = sum(v["seconds"] or 0 for v in cold["variants"])
    verify_seconds = sum(v["verification_seconds"] or 0 for v in cold["variants"])
    verified = sum(v["verification"] == "passed" for v in cold["variants"])
    print(f"  sum of per-pair compile seconds in the cold run:      {compile_seconds:7.2f} s")
    print(
        f"  sum of per-pair verification seconds in the cold run: {verify_seconds:7.2f} s   "
        f"({verified} of {pairs} variants run on this host and matched their source; "
        "the plain loop runs none)"
    )
    print_verification_split(cold["variants"])
    print_signing(f"this run's manifest ({len(MODELS)} models)", bench_signing)
    print_signing("1,000 models x 10 variants", synthetic_signing)


if __name__ == "__main__":
    main()
