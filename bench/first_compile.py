"""Benchmark: the README's first command against a plain loop over ONNX Runtime.

    python bench/first_compile.py [--code DIR ...] [--repeat N]

The first command, as a new user runs it: in a fresh directory holding a copy of
`examples/`, with a new Prefect home (so a new temporary-API database) and a new worker
cache,

    python -m epfleet compile examples/fleet.yaml --store ./epfleet-store
    python -m epfleet sync --store ./epfleet-store --cache ./epfleet-device

Against it, `plain`: one process that compiles the same 6 pairs (2 models x 2 Snapdragon
HTP targets and the CPU) with ORT directly in a for-loop (fix the input shapes, a
ModelCompiler at ORT_ENABLE_BASIC for QNN, an ORT_ENABLE_ALL optimised model for the CPU),
writing each to a directory: no verification, store, signing, sync or Prefect.

Each `--code DIR` (default: this checkout) is a checkout of epfleet whose command is run
(PYTHONPATH=DIR), so two versions compare side by side in one run; with `--repeat N` the
runs are interleaved N times. It prints per run the wall and CPU seconds (this process's
children: the CLI, its compile workers and Prefect's temporary API), the seconds to the
CLI's first stderr line, to its last pair's outcome line (`[6/6]`) and to its exit, and the
ratios to the plain loop's median. Timings on a shared machine are noisy: the load
average (`uptime`) is printed before and after; compare ratios within one run. No target
is asserted.

Measured here (2 cores, load 11.5 then 9, `--code` main before the compile stopped
waiting for a Prefect API and after, `--repeat 2`): plain 6.9 / 3.0 s wall, 1.1 s CPU;
before 62.8 / 41.7 s wall, 18.5 / 17.9 s
CPU, first line at 11.9 / 6.3 s, [6/6] at 58.2 / 34.9 s; after 30.9 / 37.5 s wall, 17.8 /
17.4 s CPU, first line at 1.6 / 1.8 s, [6/6] (all published) at 9.0 / 13.3 s. The rest of
the wait is Prefect's temporary API coming up to record the run.

After the first command stopped starting a Prefect API at all (it keeps its run to be
recorded later; `--code` main before it and after, `--repeat 2`, 2 cores,
load 1.9 then 2.0): plain 1.2 / 1.0 s wall, 1.4 / 1.2 s CPU; before 19.2 / 17.7 s wall,
21.2 / 19.6 s CPU, compile exit at 18.1 / 16.4 s; after 5.2 / 6.9 s wall, 7.3 / 8.0 s CPU,
first line at 0.8 / 1.0 s, [6/6] at 3.6 / 4.6 s, compile exit at 4.1 / 5.5 s. Again at
load 9.7 then 8.0: plain 2.7 / 2.3 s wall, 1.5 / 1.6 s CPU; before 42.5 / 31.9 s wall,
25.3 / 24.6 s CPU, compile exit at 39.1 / 30.1 s; after 17.0 / 17.7 s wall, 9.7 / 9.5 s
CPU, first line at 2.3 / 1.6 s, [6/6] at 11.4 / 8.6 s, compile exit at 14.1 / 13.0 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAIN = r"""
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import onnxruntime_qnn
import yaml

spec_path, out = Path(sys.argv[1]), Path(sys.argv[2])
spec = yaml.safe_load(spec_path.read_text())
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
qnn = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
for m in spec["models"]:
    model = onnx.load(str(spec_path.parent / m["source"]))
    params = {}
    for graph_input in model.graph.input:
        shape = m["input_shapes"].get(graph_input.name)
        for dim, value in zip(graph_input.type.tensor_type.shape.dim, shape or [], strict=False):
            if dim.dim_param:
                params[dim.dim_param] = value
    for graph_input in model.graph.input:  # a named dim fixed wherever it appears
        shape = m["input_shapes"].get(graph_input.name)
        for k, dim in enumerate(graph_input.type.tensor_type.shape.dim):
            value = shape[k] if shape else params.get(dim.dim_param)
            if value is not None:
                dim.dim_value = value
    fixed = out / f"{m['name']}.fixed.onnx"
    onnx.save(model, str(fixed))
    for t in spec["targets"]:
        dst = out / f"{m['name']}.{t['name']}.onnx"
        options = ort.SessionOptions()
        if t["ep"] == "CPUExecutionProvider":
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.optimized_model_filepath = str(dst)
            ort.InferenceSession(str(fixed), options, providers=["CPUExecutionProvider"])
            continue
        provider = {k: str(v) for k, v in t["provider_options"].items()}
        options.add_provider_for_devices(qnn, provider)
        ort.ModelCompiler(
            options,
            str(fixed),
            embed_compiled_data_into_model=True,
            graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        ).compile_to_file(str(dst))
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def first_command(code: Path) -> dict[str, float]:
    """The README's first command in a fresh directory, as a new user runs it."""
    with tempfile.TemporaryDirectory(prefix="epfleet-first-") as scratch:
        work = Path(scratch)
        shutil.copytree(ROOT / "examples", work / "examples")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EPFLEET_"))}
        env |= {
            "PYTHONPATH": str(code),
            "PREFECT_HOME": str(work / "prefect-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "EPFLEET_CACHE": str(work / "cache"),
        }
        cpu, started = children_cpu(), time.perf_counter()
        compile_cli = subprocess.Popen(
            [sys.executable, "-m", "epfleet", "compile", "examples/fleet.yaml",
             "--store", "./epfleet-store"],
            cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        first_line = last_pair = None
        assert compile_cli.stderr is not None
        for line in compile_cli.stderr:
            now = time.perf_counter() - started
            first_line = now if first_line is None else first_line
            if line.startswith("epfleet: [6/6]"):
                last_pair = now
        if compile_cli.wait() != 0:
            sys.exit(f"{code}: epfleet compile failed ({compile_cli.returncode})")
        compiled = time.perf_counter() - started
        subprocess.run(
            [sys.executable, "-m", "epfleet", "sync", "--store", "./epfleet-store",
             "--cache", "./epfleet-device"],
            cwd=work, env=env, check=True, capture_output=True,
        )  # fmt: skip
        return {
            "wall": time.perf_counter() - started,
            "cpu": children_cpu() - cpu,
            "first line": first_line or float("nan"),
            "[6/6]": last_pair or float("nan"),
            "compile exit": compiled,
        }


def plain_loop() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="epfleet-plain-") as scratch:
        cpu, started = children_cpu(), time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", PLAIN, str(ROOT / "examples" / "fleet.yaml"), scratch],
            check=True, capture_output=True,
        )  # fmt: skip
        return {"wall": time.perf_counter() - started, "cpu": children_cpu() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", type=Path, action="append", help="an epfleet checkout")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    codes = [c.resolve() for c in args.code or [ROOT]]
    print(f"load before: {load()} (1-min average, {os.cpu_count()} cores)")
    runs: list[tuple[str, dict[str, float]]] = []
    for _ in range(args.repeat):
        runs.append(("plain", plain_loop()))
        for code in codes:
            runs.append((str(code), first_command(code)))
    print(f"load after: {load()}")
    plain = [r for name, r in runs if name == "plain"]
    base = {k: statistics.median(r[k] for r in plain) for k in ("wall", "cpu")}
    columns = ["wall", "cpu", "first line", "[6/6]", "compile exit"]
    print(f"{'run':<32}" + "".join(f"{c:>14}" for c in columns) + f"{'wall/plain':>12}"
          f"{'cpu/plain':>11}")  # fmt: skip
    for name, r in runs:
        cells = "".join(f"{r[c]:>12.1f} s" if c in r else f"{'-':>14}" for c in columns)
        ratios = f"{r['wall'] / base['wall']:>12.1f}{r['cpu'] / base['cpu']:>11.1f}"
        print(f"{name[-32:]:<32}{cells}{ratios}")


if __name__ == "__main__":
    main()
