"""Benchmark: a model whose external data is over 2 GB, compiled for the CPU, published to a
loopback S3 (moto, multipart) and synced onto a device, with each step's peak memory.

    python bench/large_model.py [--gb 2.2] [--dir DIR] [--keep] [--ort-probes] [--skip-e2e]
                                [--every SECONDS] [--folded]

The model is generated streaming (the weights are never in memory: the data file is
written in 64 MB blocks of random fp32, each tensor at a 4096-aligned offset so ORT can
mmap it): a chain of MatMul + Add on an input [1, N], with ~600 MB weights.

End to end, each step in its own process: `epfleet compile SPEC --store s3://bench/fleet`
(one CPU target), `epfleet sync --store ... --cache DIR`, then
`onnxruntime.ModelPackageContext(DIR).select_component(...).create_session()` and one run,
once with the package's session options and once with session.disable_prepacking=1 (as a
reference, so is a plain boto3 upload_file of the data file to the same moto).

Per step: wall seconds, and the peak over the step of its process tree's RSS and of its
RssAnon, polled from /proc every ~50 ms (a spike between two polls can be missed, hence
also the largest VmHWM: one process's own peak RSS, which the kernel keeps). Weights that
ORT mmaps from a file count in RSS (as RssFile: clean page cache the kernel can drop and
read again) but not in RssAnon (heap copies that have to stay resident): RssAnon is the
figure that grows with the model if something copies it. The bytes each step moves are
counted by a TCP relay in front of moto, and each stored object's ETag tells whether it
went up in parts (multipart).

--folded feeds each weight through a Transpose, so the CPU build's constant folding makes
2 GB of new initializers that cannot stay references into the source's data file.

--ort-probes measures ONNX Runtime itself on the generated model (graph-only load and
save, the CPU "compile" = an optimised session saving its model, with and without the
session config entries that matter, a session run, a streamed sha256) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from loopback import Relay, moto_in_own_process  # noqa: E402  (bench/, beside this script)

MB, GB = 10**6, 10**9
BLOCK = 64 * MB
ALIGN = 4096
LAYER_BYTES = 600 * MB
DATA_FILE = "model.onnx.data"
MODEL, TARGET, BUCKET = "big", "x86-cpu", "bench"
STORE = f"s3://{BUCKET}/fleet"
BUDGET = 1 * GB


def layout(gb: float) -> tuple[int, int]:
    """(layers, N): about --gb of fp32 [N, N] weights, ~600 MB each, N a multiple of 64."""
    layers = max(1, math.ceil(gb * GB / LAYER_BYTES))
    n = math.ceil(math.sqrt(gb * GB / (4 * layers)) / 64) * 64
    return layers, n


def generate(directory: Path, gb: float, seed: int = 0) -> Path:
    """Write model.onnx and its data file (weights streamed in 64 MB blocks); return the
    model's path."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    layers, n = layout(gb)
    path, data_path = directory / "model.onnx", directory / DATA_FILE
    if path.exists() and data_path.exists() and data_path.stat().st_size == layers * 4 * n * n:
        return path  # made by an earlier run with --keep (n is a multiple of 64: aligned)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    scale = np.float32(1 / math.sqrt(n))  # keeps activations of order one down the chain
    initializers, nodes, previous = [], [], "x"
    with open(data_path, "wb") as data:
        for i in range(layers):
            data.seek(offset := -(-data.tell() // ALIGN) * ALIGN)  # zero padding
            rows_per_block = max(1, BLOCK // (4 * n))
            for start in range(0, n, rows_per_block):
                rows = min(rows_per_block, n - start)
                block = rng.standard_normal((rows, n), dtype=np.float32)
                block *= scale
                data.write(block.data)
            weight = TensorProto(name=f"w{i}", dims=[n, n], data_type=TensorProto.FLOAT)
            weight.data_location = TensorProto.EXTERNAL
            for key, value in (("location", DATA_FILE), ("offset", offset), ("length", 4 * n * n)):
                weight.external_data.add(key=key, value=str(value))
            bias = rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)
            initializers += [weight, onnx.numpy_helper.from_array(bias, f"b{i}")]
            out = "y" if i == layers - 1 else f"h{i}"
            nodes += [
                helper.make_node("MatMul", [previous, f"w{i}"], [f"m{i}"]),
                helper.make_node("Add", [f"m{i}", f"b{i}"], [out]),
            ]
            previous = out
    graph = helper.make_graph(
        nodes,
        "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())  # never onnx.save: nothing to load or write
    return path


def describe(proc: psutil.Process) -> str:
    """A short name for a process: its program and first arguments."""
    words = [Path(w).name if "/" in w else w for w in proc.cmdline()[:4]]
    return " ".join(words).replace("\n", " ")[:48] + f" [{proc.pid}]"


def tree_memory(pid: int) -> tuple[int, int, dict[int, tuple[str, int, int, int]]]:
    """RSS and RssAnon (bytes) summed over a process and its descendants, and per process
    (name, rss, anon, VmHWM: its own peak RSS since it started or exec'd)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, {}
    each: dict[int, tuple[str, int, int, int]] = {}
    for proc in procs:
        try:
            fields = dict(
                line.split(":", 1)
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            )
            rss, anon, hwm = (
                int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon", "VmHWM")
            )
            each[proc.pid] = (describe(proc), rss, anon, hwm)
        except (OSError, KeyError, psutil.Error):
            continue  # gone meanwhile, or a zombie without VmRSS
    return sum(v[1] for v in each.values()), sum(v[2] for v in each.values()), each


@dataclass
class Measured:
    what: str
    seconds: float = 0.0
    rss: int = 0  # peak of the tree's RSS sum
    anon: int = 0  # peak of the tree's RssAnon sum
    hwm: int = 0  # the largest VmHWM of one process of the tree (misses its last ~50 ms)
    biggest: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # pid: name, peaks
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""


def measure(
    what: str,
    command: list[str],
    env: dict[str, str] | None = None,
    every: float | None = None,
    extra: Callable[[], str] = str,
) -> Measured:
    """Run a command, polling its process tree's memory every ~50 ms until it exits; with
    ``every``, print a line of the tree's memory (and ``extra()``) every that many seconds."""
    result = Measured(what)
    next_line = every
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT)
        while True:
            rss, anon, each = tree_memory(proc.pid)
            result.rss, result.anon = max(result.rss, rss), max(result.anon, anon)
            for child, (name, p_rss, p_anon, p_hwm) in each.items():
                result.hwm = max(result.hwm, p_hwm)
                old = result.biggest.get(child, (name, 0, 0))  # the name seen first: alive
                result.biggest[child] = (old[0], max(old[1], p_rss), max(old[2], p_anon))
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                break
            elapsed = time.perf_counter() - started
            if every and next_line and elapsed >= next_line:
                next_line += every
                print(f"    {elapsed:6.0f} s  RSS {gb(rss)}  RssAnon {gb(anon)}  {extra()}")
            time.sleep(0.05)
        result.seconds = time.perf_counter() - started
        proc.returncode = result.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        result.stdout, result.stderr = out.read(), err.read()
    return result


def gb(n: int) -> str:
    return f"{n / GB:.2f} GB"


def print_table(rows: list[Measured], budget: bool) -> None:
    print(
        "\npeak RSS counts file-backed pages (weights ORT mmaps: page cache the kernel can drop);"
        "\npeak RssAnon counts only anonymous memory (heap copies), the figure a budget binds."
    )
    if budget:
        print("target: peak RSS of the compile and of the sync under 1 GB")
    head = f"{'step':<60} {'wall':>8} {'peak RSS':>10} {'RssAnon':>10} {'max VmHWM':>10}"
    print(head + ("   under 1 GB?" if budget else ""))
    for m in rows:
        line = f"{m.what:<60} {m.seconds:>7.1f}s {gb(m.rss):>10} {gb(m.anon):>10} {gb(m.hwm):>10}"
        if budget:
            rss, anon = ("yes" if n < BUDGET else "NO" for n in (m.rss, m.anon))
            line += f"   RSS {rss:<3}  RssAnon {anon}"
        if m.returncode:
            line += f"   exit {m.returncode}"
        print(line)
        if len(m.biggest) > 1:
            for name, r, a in sorted(m.biggest.values(), key=lambda v: -v[1])[:3]:
                print(f"    {name:<64} peak RSS {gb(r)}, RssAnon {gb(a)}")


# The ORT probes: each runs in a process of its own, prints one JSON object.
PROBE_COMMON = """if True:
    import json, os, sys, time
    def status():
        fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
        keys = ("VmRSS", "RssAnon", "RssFile", "VmHWM")
        return {k: int(fields[k].split()[0]) * 1024 for k in keys}
    def mapped(directory):
        total = 0
        for line in open("/proc/self/maps"):
            parts = line.split()
            if len(parts) > 5 and parts[5].startswith(directory):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                total += end - start
        return total
"""
PROBE_GRAPH = """
import onnx
model = onnx.load(sys.argv[1], load_external_data=False)
onnx.save(model, sys.argv[2])
print(json.dumps({"after": status(), "bytes": os.path.getsize(sys.argv[2])}))
"""
PROBE_COMPILE = """
import onnx, onnxruntime as ort
src, dst, level, config = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
options = ort.SessionOptions()
options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
options.optimized_model_filepath = dst
for key, value in config.items():
    options.add_session_config_entry(key, value)
try:
    session = ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
except Exception as exc:
    print(json.dumps({"error": str(exc)[:300], "after": status()}))
    sys.exit(0)
after, maps = status(), mapped(os.path.dirname(src))
out = os.path.dirname(dst)
files = {n: os.path.getsize(os.path.join(out, n)) for n in sorted(os.listdir(out))}
model = onnx.load(dst, load_external_data=False)
tensors = [t for t in model.graph.initializer if t.external_data]
external = [dict((e.key, e.value) for e in t.external_data) for t in tensors]
offsets = [int(e.get("offset", 0)) for e in external]
ops = sorted({n.op_type for n in model.graph.node})
print(json.dumps({"after": after, "mapped_source": maps, "files": files, "ops": ops,
                  "external": len(external), "aligned": all(o % 4096 == 0 for o in offsets)}))
"""
PROBE_RUN = """
import numpy as np, onnxruntime as ort
src, config = sys.argv[1], json.loads(sys.argv[2])
options = ort.SessionOptions()
for key, value in config.items():
    options.add_session_config_entry(key, value)
session = ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
created, maps = status(), mapped(os.path.dirname(src))
shape = session.get_inputs()[0].shape
started = time.perf_counter()
y = session.run(None, {"x": np.ones(shape, np.float32)})[0]
seconds = round(time.perf_counter() - started, 3)
finite = bool(np.isfinite(y).all())
print(json.dumps({"created": created, "mapped": maps, "after": status(), "finite": finite,
                  "run_s": seconds}))
"""
PROBE_SHA = """
from epfleet.hashing import sha256_file
from pathlib import Path
digest, size = sha256_file(Path(sys.argv[1]))
print(json.dumps({"after": status(), "bytes": size}))
"""


def probe(what: str, code: str, *args: str) -> tuple[Measured, dict]:
    command = [sys.executable, "-c", PROBE_COMMON + textwrap.dedent(code), *args]
    m = measure(what, command)
    try:
        got = json.loads(m.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        got = {"error": f"exit {m.returncode}: {m.stderr[-400:]}"}
    return m, got


def transposed(source: Path, path: Path | None = None) -> Path:
    """The source's graph with each weight fed through a Transpose: ORT's constant folding
    then makes new initializers, which it cannot leave in the source's data file. Written
    to ``path`` (default transposed.onnx beside the source), which must sit beside the
    source's data file."""
    import onnx
    from onnx import helper

    model = onnx.load(str(source), load_external_data=False)
    nodes = []
    for node in model.graph.node:
        if node.op_type == "MatMul":
            nodes.append(helper.make_node("Transpose", [node.input[1]], [node.input[1] + "t"]))
            node.input[1] += "t"
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = path or source.with_name("transposed.onnx")  # beside the source: same data file
    path.write_bytes(model.SerializeToString())
    return path


def ort_probes(source: Path, work: Path) -> None:
    """What ONNX Runtime and onnx themselves take in memory on this model."""
    rows: list[tuple[Measured, dict]] = []

    def run(what: str, code: str, *args: str) -> dict:
        m, got = probe(what, code, *args)
        rows.append((m, got))
        return got

    ext = "session.optimized_model_external_initializers_file_name"
    min_size = "session.optimized_model_external_initializers_min_size_in_bytes"
    to_file = {ext: "optimized.data", min_size: "1024"}
    no_prepack = {"session.disable_prepacking": "1"}
    shutil.rmtree(work, ignore_errors=True)  # an earlier run's, with --keep
    work.mkdir(parents=True)
    graph = str(work / "graph.onnx")
    run("(a) onnx.load(load_external_data=False)+save", PROBE_GRAPH, str(source), graph)
    folded = transposed(source)
    compiles = {
        "ALL, no external file": (source, "ORT_ENABLE_ALL", {}),
        "ALL, no external file, no prepacking": (source, "ORT_ENABLE_ALL", no_prepack),
        "ALL, external file": (source, "ORT_ENABLE_ALL", to_file),
        "ALL, external file, no prepacking": (source, "ORT_ENABLE_ALL", to_file | no_prepack),
        "BASIC, external file": (source, "ORT_ENABLE_BASIC", to_file),
        "BASIC, external file, no prepacking": (source, "ORT_ENABLE_BASIC", to_file | no_prepack),
        "folded, no external file, no prepacking": (folded, "ORT_ENABLE_ALL", no_prepack),
        "folded, external file, no prepacking": (folded, "ORT_ENABLE_ALL", to_file | no_prepack),
    }
    optimized: dict[str, Path] = {}
    for i, (name, (src, level, config)) in enumerate(compiles.items()):
        out = work / f"compiled-{i}"
        out.mkdir()
        dst = out / "model.onnx"
        what = f"(b) compile: {name}"
        got = run(what, PROBE_COMPILE, str(src), str(dst), level, json.dumps(config))
        if "error" not in got and name.startswith("ALL") and "no prepacking" in name:
            if not (out / DATA_FILE).exists():  # it still points at the source's data file
                os.link(source.parent / DATA_FILE, out / DATA_FILE)
            optimized[name.replace(", no prepacking", "")] = dst
    for name, path in ({"source": source} | optimized).items():
        for label, config in (("", {}), (", no prepacking", no_prepack)):
            what = f"(c) session + run: {name}{label}"
            run(what, PROBE_RUN, str(path), json.dumps(config))
    run("(d) sha256_file of the data file", PROBE_SHA, str(source.parent / DATA_FILE))
    print_table([m for m, _ in rows], budget=False)
    print(
        "\nwhat each probe saw (bytes; 'mapped': bytes of files in the model's directory "
        "that the process has mapped)"
    )
    for m, got in rows:
        print(f"  {m.what}: {got}")


OPEN = """if True:
    import json, sys, numpy as np, onnxruntime as ort
    context = ort.ModelPackageContext(sys.argv[1])
    chosen = context.select_component(sys.argv[2], ort.ModelPackageOptions(ort.SessionOptions()))
    options = None  # the package's session options, if its manifest has any
    if sys.argv[3] == "no-prepacking":  # (ModelPackageOptions does not pass config entries)
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_prepacking", "1")
    session = chosen.create_session(options)
    shape = session.get_inputs()[0].shape
    y = session.run(None, {"x": np.ones(shape, np.float32)})[0]
    finite = bool(np.isfinite(y).all())
    print(json.dumps({"variant": chosen.get_selected_variant_name(), "finite": finite}))
"""

UPLOAD = """if True:
    import sys, boto3
    s3 = boto3.client("s3")
    s3.upload_file(sys.argv[1], sys.argv[2], "reference/upload")
    s3.delete_object(Bucket=sys.argv[2], Key="reference/upload")
"""


def stored_objects() -> list[tuple[str, int, int]]:
    """(key, size, parts: 0 when uploaded in one PUT) of every object in the bench bucket."""
    import boto3

    s3 = boto3.client("s3")
    found = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", []):
            etag = item["ETag"].strip('"')
            parts = int(etag.rpartition("-")[2]) if "-" in etag else 0
            found.append((item["Key"], item["Size"], parts))
    return found


def step(
    what: str, command: list[str], env: dict[str, str], relay: Relay, every: float | None
) -> Measured:
    before = list(relay.bytes)

    def moved() -> str:
        return f"HTTP up {gb(relay.bytes[0] - before[0])}, down {gb(relay.bytes[1] - before[1])}"

    print(f"{what} ...", flush=True)
    m = measure(what, command, env, every, moved)
    up, down = (relay.bytes[i] - before[i] for i in (0, 1))
    print(
        f"{what}: exit {m.returncode} in {m.seconds:.1f} s; HTTP bytes up {gb(up)}, down {gb(down)}"
    )
    if m.returncode:
        print(textwrap.indent(m.stderr[-3000:], "    "))
    return m


def print_device(report: str, cache: Path, source: Path) -> None:
    """What the sync says it did, and the variant directory it activated."""
    try:
        models = json.loads(report)["models"]
    except (ValueError, KeyError):
        print(f"  sync printed no JSON report: {report[-300:]!r}")
        return
    for entry in models:
        keys = ("model", "action", "variant", "bytes_downloaded")
        print("  sync report: " + ", ".join(f"{k} {entry.get(k)}" for k in keys))
    from epfleet.hashing import sha256_file

    for path in sorted((cache / "models").rglob("*")):
        if path.is_file():
            print(f"  {path.relative_to(cache)}  {path.stat().st_size} B")
            if path.name == DATA_FILE:
                same = sha256_file(path) == sha256_file(source.parent / DATA_FILE)
                print(f"    byte for byte the source's {DATA_FILE}: {'yes' if same else 'no'}")


def end_to_end(source: Path, work: Path, every: float | None) -> bool:
    """compile -> S3 (moto, multipart) -> sync -> ModelPackageContext, each measured;
    whether every step ran and exited 0."""
    import boto3
    import yaml

    spec = work / "fleet.yaml"
    model = {"name": MODEL, "source": str(source)}
    spec.write_text(
        yaml.safe_dump(
            {"models": [model], "targets": [{"name": TARGET, "ep": "CPUExecutionProvider"}]}
        )
    )
    cache = work / "device"
    for scratch in ("device", "worker-cache", "prefect"):  # an earlier run's, with --keep
        shutil.rmtree(work / scratch, ignore_errors=True)
    with moto_in_own_process() as port:
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        relay = Relay(port)
        env = dict(os.environ, AWS_ENDPOINT_URL=relay.endpoint_url, EPFLEET_ALLOW_UNSIGNED="true")
        env |= {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_HOME": str(work / "prefect")}
        env |= {"EPFLEET_CACHE": str(work / "worker-cache")}
        epfleet = [sys.executable, "-m", "epfleet"]
        rows = [
            step(
                "epfleet compile (CPU target, publish to S3)",
                [*epfleet, "compile", str(spec), "--store", STORE, "--json"],
                env,
                relay,
                every,
            )
        ]
        try:
            for variant in json.loads(rows[0].stdout)["variants"]:
                print(f"  compile report: {variant}")
        except (ValueError, KeyError):
            print(f"  compile printed no JSON report: {rows[0].stdout[-300:]!r}")
        reference = [sys.executable, "-c", UPLOAD, str(source.parent / DATA_FILE), BUCKET]
        rows.append(
            step("reference: boto3 upload_file of the data file", reference, env, relay, every)
        )
        objects = stored_objects()
        print(f"stored in s3://{BUCKET}: {len(objects)} objects, {gb(sum(o[1] for o in objects))}")
        for key, size, parts in sorted(objects, key=lambda o: -o[1])[:6]:
            how = f"multipart, {parts} parts" if parts else "one PUT"
            print(f"  {key:<70} {size:>12} B  {how}")
        if rows[0].returncode == 0:  # the compile
            rows.append(
                step(
                    "epfleet sync (download, verify, health check, activate)",
                    [*epfleet, "sync", "--store", STORE, "--cache", str(cache), "--json"],
                    env,
                    relay,
                    every,
                )
            )
            if rows[-1].returncode == 0:
                print_device(rows[-1].stdout, cache, source)
            for how in ("package options", "no-prepacking") if rows[-1].returncode == 0 else ():
                opened = step(
                    f"ModelPackageContext + create_session + run, {how}",
                    [sys.executable, "-c", OPEN, str(cache), MODEL, how],
                    env,
                    relay,
                    every,
                )
                print(f"  {opened.stdout.strip()}")
                rows.append(opened)
    print_table(rows, budget=True)
    return len(rows) == 5 and not any(m.returncode for m in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.2, help="weights to generate, in GB")
    parser.add_argument("--dir", type=Path, help="work directory (default a temp dir in /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--ort-probes", action="store_true", help="measure ORT itself")
    parser.add_argument("--skip-e2e", action="store_true", help="no compile, publish, sync")
    parser.add_argument(
        "--folded",
        action="store_true",
        help="weights behind Transposes: the CPU build's constant folding makes new ones",
    )
    parser.add_argument(
        "--every", type=float, help="print each step's memory and transfers every N seconds"
    )
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="epfleet-large-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    ok = True
    try:
        started = time.perf_counter()
        source = generate(work / "source", args.gb)
        layers, n = layout(args.gb)
        total = (source.parent / DATA_FILE).stat().st_size
        print(
            f"generated {source}: {layers} x MatMul [1, {n}] x [{n}, {n}] + Add, "
            f"external data {gb(total)} ({total} bytes) in {time.perf_counter() - started:.1f} s"
        )
        if args.folded:  # the same weights behind Transposes, in a folder of its own
            folder = work / "source-folded"
            folder.mkdir(exist_ok=True)
            if not (folder / DATA_FILE).exists():
                os.link(source.parent / DATA_FILE, folder / DATA_FILE)
            source = transposed(source, folder / "model.onnx")
            print(f"folded: {source} feeds each weight through a Transpose")
        if args.ort_probes:
            ort_probes(source, work / "probes")
        if not args.skip_e2e:
            ok = end_to_end(source, work, args.every)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
