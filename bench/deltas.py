"""Binary deltas between two QNN EPContext variants of one model: zstd's patch-from
(``zstandard``) against ``bsdiff4``, on a real model retrained in one layer.

    python bench/deltas.py MODEL.onnx --input-shape x=1,3,48,192 [--work DIR]

Compiles MODEL and a copy with one Conv weight changed (noise of 1 % of its range: one
layer retrained) for one HTP target with ``epfleet compile``, then, for the pair of
compiled files, prints: sizes (each file, zstd -19 of the new one alone), each delta's
size, the time to make and to apply it, and whether the applied result is the new file
byte for byte. Also compares the same model compiled for two HTP targets (another
soc/arch: not a delta a device uses, a bound on unrelated variants)."""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import bsdiff4
import numpy as np
import onnx
import yaml
import zstandard
from onnx import numpy_helper

TARGETS = [
    {
        "name": "sd8g3-htp",
        "ep": "QNNExecutionProvider",
        "provider_options": {
            "backend_type": "htp",
            "htp_arch": 75,
            "soc_model": 57,
            "enable_htp_fp16_precision": 1,
        },
    },
    {
        "name": "sd8g2-htp",
        "ep": "QNNExecutionProvider",
        "provider_options": {
            "backend_type": "htp",
            "htp_arch": 73,
            "soc_model": 43,
            "enable_htp_fp16_precision": 1,
        },
    },
]


def retrained(source: Path, dest: Path, seed: int = 0) -> str:
    """``source`` with one Conv weight (the middle one), an initializer or a Constant
    node's value, moved by 1 % of its range."""
    model = onnx.load(str(source))
    tensors = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tensors[node.output[0]] = node.attribute[0].t
    convs = [n.input[1] for n in model.graph.node if n.op_type == "Conv" and n.input[1] in tensors]
    name = convs[len(convs) // 2]
    tensor = tensors[name]
    w = numpy_helper.to_array(tensor)
    noise = np.random.default_rng(seed).normal(0, 0.01 * float(np.ptp(w)), w.shape)
    changed = numpy_helper.from_array((w + noise).astype(w.dtype), tensor.name)
    tensor.CopyFrom(changed)
    onnx.save(model, str(dest))
    return f"{name} {list(w.shape)}"


def compile_htp(work: Path, source: Path, shapes: dict[str, list[int]]) -> dict[str, Path]:
    spec = {
        "models": [{"name": "m", "source": str(source), "input_shapes": shapes}],
        "targets": [dict(t, verify=False) for t in TARGETS],
    }
    work.mkdir(parents=True, exist_ok=True)
    (work / "fleet.yaml").write_text(yaml.safe_dump(spec))
    store = work / "store"
    command = [sys.executable, "-m", "epfleet", "compile", str(work / "fleet.yaml")]
    subprocess.run([*command, "--store", str(store)], check=True, capture_output=True)
    return {t["name"]: next((store / "variants" / "m" / t["name"]).glob("*.onnx")) for t in TARGETS}


def measure(label: str, old: bytes, new: bytes) -> None:
    whole = len(zstandard.ZstdCompressor(level=19).compress(new))
    print(f"{label}: base {len(old):,} B, new {len(new):,} B, new alone zstd -19 {whole:,} B")
    params = zstandard.ZstdCompressionParameters.from_level(
        19, window_log=max(20, (len(old) + len(new)).bit_length())
    )
    started = time.perf_counter()
    compressor = zstandard.ZstdCompressor(
        compression_params=params, dict_data=zstandard.ZstdCompressionDict(old, dict_type=1)
    )
    patch = compressor.compress(new)
    made = time.perf_counter() - started
    started = time.perf_counter()
    decompressor = zstandard.ZstdDecompressor(
        dict_data=zstandard.ZstdCompressionDict(old, dict_type=1), max_window_size=2**31
    )
    applied = decompressor.decompress(patch, max_output_size=len(new))
    taken = time.perf_counter() - started
    same = hashlib.sha256(applied).digest() == hashlib.sha256(new).digest()
    print(
        f"  zstd patch-from -19: {len(patch):,} B ({len(patch) / len(new):.1%} of the file), "
        f"made in {made:.2f} s, applied in {taken:.3f} s, identical {same}"
    )
    started = time.perf_counter()
    delta = bsdiff4.diff(old, new)
    made = time.perf_counter() - started
    started = time.perf_counter()
    applied = bsdiff4.patch(old, delta)
    taken = time.perf_counter() - started
    same = applied == new
    print(
        f"  bsdiff4: {len(delta):,} B ({len(delta) / len(new):.1%} of the file), "
        f"made in {made:.2f} s, applied in {taken:.3f} s, identical {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--input-shape", action="append", default=[])
    parser.add_argument("--work", type=Path, default=Path("delta-bench"))
    args = parser.parse_args()
    shapes = {
        name: [int(d) for d in dims.split(",")]
        for name, dims in (s.split("=", 1) for s in args.input_shape)
    }
    args.work.mkdir(parents=True, exist_ok=True)
    changed = args.work / "retrained.onnx"
    layer = retrained(args.model, changed)
    base = compile_htp(args.work / "base", args.model.resolve(), shapes)
    new = compile_htp(args.work / "new", changed.resolve(), shapes)
    for target in base:
        measure(
            f"{args.model.name} {target}, {layer} retrained",
            base[target].read_bytes(),
            new[target].read_bytes(),
        )
    first, second = list(base)
    measure(
        f"{args.model.name}, {first} from {second}",
        base[second].read_bytes(),
        base[first].read_bytes(),
    )


if __name__ == "__main__":
    main()
