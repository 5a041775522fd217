"""Benchmark: a captcha reader over 37 classes (CTC: blank, 26 letters, 10 digits) compiled
for HTP v68 at w8a8, with ``metric: {kind: sequence_match, blank: 0, time_axis: 0, min:
0.99}``, 12 samples and 96 calibration inputs: what `python -m epfleet compile` publishes
or refuses, and why.

    python bench/captcha_v68.py [--readers lstm64,lstm32,lstm16,lstm8,lstm16-t10,conv]

No 37-class CRNN ships in a wheel, so the readers are built here with onnx.helper and
seeded random weights (they read no captcha: they show the verdict's form and what the
arch compiles, not a reader's accuracy): three 3x3 conv layers with max pooling over a
1x1x64x160 captcha (``bench/task_metrics.py``'s, as ddddocr preprocesses it), the 20
columns (or 10, ``-t10``) of the last one as a time-major sequence, then
  lstmN  a bidirectional LSTM of N units and a linear CTC head: a CRNN;
  conv   the linear CTC head on the columns directly (no recurrent layer).
Each is compiled in a fresh store (workers 1); it prints the pair's status and the
manifest's verification record (the metric with its count, interval and inputs) or the
compile's error.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import task_metrics as tm  # noqa: E402

CLASSES = 37
SETS = {"samples": 12, "calibration": 96}
METRIC = {"kind": "sequence_match", "blank": 0, "time_axis": 0, "min": 0.99}
TARGET = {
    "name": "v68",
    "ep": "QNNExecutionProvider",
    "provider_options": {"backend_type": "htp", "htp_arch": "68"},
    "verify_timeout": 7200,
}


def reader(path: Path, units: int, steps: int) -> Path:
    """The reader (``units`` 0: no LSTM) writing logits [steps, 1, 37], weights seeded."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(37)
    weights, nodes = [], []

    def weight(name: str, shape: list[int], fan_in: int) -> str:
        value = rng.standard_normal(shape) * np.sqrt(2 / fan_in)
        weights.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def shape(name: str, dims: list[int]) -> str:
        weights.append(numpy_helper.from_array(np.array(dims, np.int64), name))
        return name

    x = "image"
    last_pool = [2, 2 * 20 // steps]
    for i, (cin, cout, pool) in enumerate([(1, 16, [2, 2]), (16, 32, [2, 2]), (32, 64, last_pool)]):
        kernel, bias = (
            weight(f"conv{i}.w", [cout, cin, 3, 3], cin * 9),
            weight(f"conv{i}.b", [cout], 100),
        )
        nodes += [
            helper.make_node("Conv", [x, kernel, bias], [f"conv{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"]),
            helper.make_node(
                "MaxPool", [f"relu{i}"], [f"pool{i}"], kernel_shape=pool, strides=pool
            ),
        ]
        x = f"pool{i}"
    nodes += [  # [1, 64, 8, T] -> [T, 1, 512]
        helper.make_node("Transpose", [x], ["columns"], perm=[3, 0, 1, 2]),
        helper.make_node("Reshape", ["columns", shape("seq.shape", [steps, 1, 512])], ["seq"]),
    ]
    features, width = "seq", 512
    if units:
        lstm = [
            weight("lstm.w", [2, 4 * units, 512], 512),
            weight("lstm.r", [2, 4 * units, units], units),
        ]
        lstm.append(weight("lstm.b", [2, 8 * units], 1000))
        nodes += [
            helper.make_node(
                "LSTM", ["seq", *lstm], ["lstm"], hidden_size=units, direction="bidirectional"
            ),
            helper.make_node("Transpose", ["lstm"], ["lstm.t"], perm=[0, 2, 1, 3]),
            helper.make_node(
                "Reshape", ["lstm.t", shape("h.shape", [steps, 1, 2 * units])], ["hidden"]
            ),
        ]
        features, width = "hidden", 2 * units
    nodes += [
        helper.make_node("MatMul", [features, weight("head.w", [width, CLASSES], width)], ["proj"]),
        helper.make_node("Add", ["proj", weight("head.b", [CLASSES], 100)], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "captcha37",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, 64, 160])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [steps, 1, CLASSES])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def captchas(work: Path) -> None:
    """The samples and calibration inputs: captchas in each set's own fonts."""
    for seed, (split, count) in enumerate(SETS.items()):
        rng = np.random.default_rng(seed + 1)
        made = [tm.captcha(rng, tm.CAPTCHA_FONTS[split])[0] for _ in range(count)]
        np.savez(work / f"{split}.npz", image=np.stack(made).astype(np.float32))


def compile_reader(name: str, work: Path) -> list[str]:
    """`python -m epfleet compile` of the reader's spec in ``work``: what it said."""
    import yaml

    units = 0 if name == "conv" else int(name.removeprefix("lstm").split("-")[0])
    steps = 10 if name.endswith("-t10") else 20
    reader(work / f"{name}.onnx", units, steps)
    model = {"name": "captcha37", "source": f"{name}.onnx", "metric": METRIC}
    model |= {split: f"{split}.npz" for split in SETS}
    spec = work / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"models": [model], "targets": [TARGET]}, sort_keys=False))
    store = work / f"{name}-store"
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(ROOT))
    env |= {"EPFLEET_CACHE": str(work / f"{name}-cache"), "PREFECT_HOME": str(work / "prefect")}
    command = [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(store)]
    started = time.perf_counter()
    run = subprocess.run(
        [*command, "--workers", "1", "--json"], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - started
    if run.returncode not in (0, 1) or not run.stdout.strip():
        sys.exit(f"epfleet compile failed ({run.returncode}):\n{run.stderr[-3000:]}")
    [pair] = json.loads(run.stdout)["variants"]
    lines = [f"{name}: {pair['status']} {pair.get('precision') or ''} ({wall:.0f} s)"]
    if pair.get("error"):
        lines.append(f"  {pair['error']}")
    entry = json.loads((store / "manifest.json").read_text())["models"]["captcha37"]
    check = entry["variants"]["v68"].get("verification") or {}
    if check.get("metric"):
        metric = check["metric"]
        lines.append(
            f"  {metric['kind']} {metric['hits']}/{metric['trials']} = {metric['value']:.3g} "
            f"[{metric['low']}, {metric['high']}] (min {metric['min']}) on {metric['inputs']}, "
            f"{metric['evidence']}; verification {check['status']} in {check['seconds']} s"
        )
    if check.get("reason"):
        lines.append(f"  reason: {check['reason']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", default="lstm64,lstm32,lstm16,lstm8,lstm16-t10,conv")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="epfleet-captcha-v68-") as scratch:
        work = Path(scratch)
        captchas(work)
        for name in args.readers.split(","):
            print("\n".join(compile_reader(name, work)), flush=True)


if __name__ == "__main__":
    main()
