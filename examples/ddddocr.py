"""More real third-party models, from the ddddocr wheel on PyPI (only its .onnx files):
a YOLO-style detector, a CRNN recogniser (Conv + LSTM) whose width is symbolic, and an
older recogniser built on dynamic-quantisation ops (DynamicQuantizeLinear, ConvInteger)
that QNN takes only in part."""

from __future__ import annotations

from pathlib import Path

from examples.wheels import fetch_wheel_models

WHEEL = "ddddocr==1.6.1"

# name: (file in the wheel, input name, input shape that input_shapes fixes it to)
MODELS: dict[str, tuple[str, str, list[int]]] = {
    "captcha-det": ("common_det.onnx", "images", [1, 3, 416, 416]),
    "captcha-rec": ("common.onnx", "input1", [1, 1, 64, 256]),
    "captcha-rec-dq": ("common_old.onnx", "input1", [1, 1, 64, 256]),
}


def fetch(cache: Path, names: list[str] | None = None) -> dict[str, Path]:
    chosen = names or list(MODELS)
    paths = fetch_wheel_models(cache, WHEEL, [MODELS[name][0] for name in chosen])
    return {name: paths[MODELS[name][0]] for name in chosen}
