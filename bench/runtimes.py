"""Runtime environments and compiles under several runtimes: what a second runtime costs.

    python bench/runtimes.py [--work DIR] [--no-pip-cache]

1. Builds the environment of onnxruntime 1.32.0 + onnxruntime-qnn 2.7.0 the way a compile
   host does (``epfleet.runtime.environments.ensure_environment``) in a fresh worker cache,
   then finds it again: seconds the first time and from the cache. ``--no-pip-cache``
   makes pip download the wheels again (PIP_NO_CACHE_DIR) instead of taking them from its
   own cache.
2. Compiles ``examples/fleet-runtimes.yaml`` (tiny-cls for sd-x-elite under qnn-2.7 and
   qnn-2.5, and x86-cpu) with ``epfleet compile`` into a fresh store, and the same spec
   with qnn-2.7 alone, both with their environments already built: wall seconds of each
   and their ratio. Run it on a quiet machine: the figures are wall time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from epfleet.runtime.environments import ENVIRONMENTS, ensure_environment

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "fleet-runtimes.yaml"
QNN_2_7 = ["onnxruntime==1.32.0", "onnxruntime-qnn==2.7.0"]


def build_twice(cache: Path, no_pip_cache: bool) -> tuple[float, float]:
    if no_pip_cache:
        os.environ["PIP_NO_CACHE_DIR"] = "1"
    started = time.perf_counter()
    ensure_environment("qnn-2.7", QNN_2_7, cache / ENVIRONMENTS)
    first = time.perf_counter() - started
    started = time.perf_counter()
    ensure_environment("qnn-2.7", QNN_2_7, cache / ENVIRONMENTS)
    return first, time.perf_counter() - started


def compile_seconds(spec: Path, store: Path, cache: Path) -> float:
    env = dict(os.environ, EPFLEET_CACHE=str(cache), PYTHONPATH=str(REPO))
    env.pop("PREFECT_API_URL", None)  # compiled without Prefect, as the docs' first run
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(store)],
        env=env,
        cwd=spec.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"epfleet compile {spec} failed:\n{done.stderr[-3000:]}")
    return seconds


def one_runtime(work: Path) -> Path:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["runtimes"] = {"qnn-2.7": spec["runtimes"]["qnn-2.7"]}
    for target in spec["targets"]:
        if target.get("runtimes"):
            target["runtimes"] = ["qnn-2.7"]
    path = work / "fleet-one-runtime.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--no-pip-cache", action="store_true")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-runtimes-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(EXAMPLE.parent / "models", work / "models", dirs_exist_ok=True)
    two = work / "fleet-runtimes.yaml"
    shutil.copy(EXAMPLE, two)
    one = one_runtime(work)

    first, cached = build_twice(work / "build-cache", args.no_pip_cache)
    print(f"environment qnn-2.7: built {first:.1f} s, from the cache {cached * 1000:.1f} ms")

    cache = work / "compile-cache"
    for name, requirements in yaml.safe_load(EXAMPLE.read_text())["runtimes"].items():
        ensure_environment(name, requirements, cache / ENVIRONMENTS)
    single = compile_seconds(one, work / "store-one", cache)
    double = compile_seconds(two, work / "store-two", cache)
    print(f"compile, 1 runtime:  {single:.1f} s (sd-x-elite.qnn-2.7, x86-cpu)")
    print(f"compile, 2 runtimes: {double:.1f} s (sd-x-elite.qnn-2.7, .qnn-2.5, x86-cpu)")
    print(f"two runtimes / one: {double / single:.2f}x")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
