"""Benchmark: what a shadow run costs a device, beside the health check it already pays.

    python bench/shadow_run.py [--samples 1 8 32] [--reps 3]

For two small models (examples/build_models.py tiny_cls at 1x3x48x192, tiny_det at
1x3x64x64), the "active" variant is the source optimised offline for this CPU (ORT_ENABLE_ALL,
what epfleet publishes for a CPU target) and the "candidate" the same source optimised at
ORT_ENABLE_BASIC (another build, numerically equal). In the sync's kind of worker process
(``CompilePool``, killable, the time limit the sync gives), it times:

  health   the candidate's health check on N golden samples (``check_health``): what a
           device pays before any switch;
  shadow   the shadow run on the same N inputs (``run_shadow``): both variants' sessions,
           a warm-up run each, N runs each, the comparison; its own ``seconds`` (inside the
           worker) and the call's wall (pickling, the worker's reply);

best of --reps each, and the ratio shadow/health. The worker's start (importing ORT), paid
once per sync whatever it runs, is timed apart.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def optimised(source: Path, out: Path, level: str) -> Path:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import onnx
    import onnxruntime as ort

    from epfleet.device.health import HealthJob, ShadowJob, check_health, run_shadow
    from epfleet.runtime.compile_pool import CompilePool
    from epfleet.runtime.samples import write_golden
    from eps.base import Tolerance
    from examples.build_models import tiny_cls, tiny_det

    models = {
        "tiny-cls": (tiny_cls(), {"x": [1, 3, 48, 192]}),
        "tiny-det": (tiny_det(), {"image": [1, 3, 64, 64], "gain": [1, 1, 1, 1]}),
    }
    work = Path(tempfile.mkdtemp(prefix="shadow-bench-"))
    started = time.perf_counter()
    pool = CompilePool(1)
    rows = []
    try:
        warm = time.perf_counter()
        probe = None
        for name, (model, shapes) in models.items():
            fixed = work / f"{name}.onnx"
            for value in model.graph.input:  # fix the symbolic dims
                dims = value.type.tensor_type.shape.dim
                for dim, size in zip(dims, shapes[value.name], strict=True):
                    dim.Clear()
                    dim.dim_value = size
            onnx.save(model, str(fixed))
            active = optimised(fixed, work / f"{name}-all.onnx", "ORT_ENABLE_ALL")
            candidate = optimised(fixed, work / f"{name}-basic.onnx", "ORT_ENABLE_BASIC")
            source = ort.InferenceSession(str(fixed), providers=["CPUExecutionProvider"])
            rng = np.random.default_rng(0)
            for count in args.samples:
                samples = [
                    {k: rng.uniform(0, 1, v).astype(np.float32) for k, v in shapes.items()}
                    for _ in range(count)
                ]
                golden = work / f"{name}-{count}.npz"
                write_golden(golden, samples, [source.run(None, s) for s in samples])

                def job(
                    path: Path, label: str, golden: Path = golden, shapes: dict = shapes
                ) -> HealthJob:
                    return HealthJob(
                        label=label,
                        path=str(path),
                        ep="CPUExecutionProvider",
                        device="cpu",
                        provider_options={},
                        input_shapes=shapes,
                        golden_path=str(golden),
                        tolerance=Tolerance(relative=0.001, absolute=1e-5),
                    )

                if probe is None:  # the worker's start: importing ORT and epfleet there
                    probe = pool.call(check_health, job(candidate, "warm"), "start", timeout=300)
                    warm = time.perf_counter() - warm
                health, shadow, inside = [], [], []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    pool.call(check_health, job(candidate, "candidate"), "health", timeout=300)
                    health.append(time.perf_counter() - t)
                    shadow_job = ShadowJob(
                        candidate=job(candidate, "candidate"),
                        active=job(active, "active"),
                        inputs_path=str(golden),
                        inputs="golden",
                        samples=count,
                    )
                    t = time.perf_counter()
                    outcome = pool.call(run_shadow, shadow_job, "shadow", timeout=300)
                    shadow.append(time.perf_counter() - t)
                    inside.append(outcome.run.seconds)
                    assert outcome.run.within, outcome
                rows.append(
                    (
                        name,
                        count,
                        min(health) * 1000,
                        min(shadow) * 1000,
                        min(inside) * 1000,
                        outcome.run.candidate_p50_ms,
                        outcome.run.active_p50_ms,
                    )
                )
    finally:
        pool.shutdown()
    print(f"worker start (ORT imported, first check): {warm * 1000:.0f} ms, paid once a sync")
    print(
        f"{'model':9} {'N':>3} {'health ms':>10} {'shadow ms':>10} {'in worker':>10} "
        f"{'shadow/health':>14} {'cand p50':>9} {'active p50':>11}"
    )
    for name, count, health_ms, shadow_ms, inside_ms, cand, act in rows:
        print(
            f"{name:9} {count:>3} {health_ms:>10.1f} {shadow_ms:>10.1f} {inside_ms:>10.1f} "
            f"{shadow_ms / health_ms:>13.2f}x {cand:>9.3f} {act:>11.3f}"
        )
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
