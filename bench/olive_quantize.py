"""Olive's QNN static quantisation of one model, for bench/task_metrics.py; run in Olive's
own venv (olive-ai 0.13.0 needs torch, which the project's venv does not have).

    python bench/olive_quantize.py SOURCE CALIBRATION.npz OUT.onnx w8a8|w8a16|w16a16 0|1

(the last argument: per-channel weights)

OnnxStaticQuantization with prepare_qdq_config on a QNNExecutionProvider accelerator: Olive
calls ORT's get_qnn_qdq_config with the pass's precision (weights) and activation type, after
its own quant_preprocess (ORT's shape inference and optimisation). Calibration: the samples
of CALIBRATION.npz ([N, *input shape]), one at a time, as they are.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from olive.data.registry import Registry
from olive.workflows import run


@Registry.register_dataset("epfleet_npz")
def npz_dataset(
    data_dir: str | None = None, path: str = "", **_: object
) -> list[dict[str, torch.Tensor]]:
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    count = len(next(iter(arrays.values())))
    return [{name: torch.from_numpy(a[k]) for name, a in arrays.items()} for k in range(count)]


@Registry.register_dataloader("epfleet_each")
def each(dataset: list[dict[str, torch.Tensor]], **_: object) -> list[dict[str, torch.Tensor]]:
    return dataset  # every sample already has its batch axis


def main() -> None:
    source, calibration, out, precision, per_channel = sys.argv[1:6]
    work = Path(tempfile.mkdtemp(prefix="olive-"))
    config = {
        "input_model": {"type": "ONNXModel", "model_path": source},
        "systems": {
            "local": {
                "type": "LocalSystem",
                "accelerators": [
                    {"device": "npu", "execution_providers": ["QNNExecutionProvider"]}
                ],
            }
        },
        "data_configs": [
            {
                "name": "calibration",
                "user_script": __file__,
                "load_dataset_config": {"type": "epfleet_npz", "params": {"path": calibration}},
                "dataloader_config": {"type": "epfleet_each"},
            }
        ],
        "passes": {
            "quantize": {
                "type": "OnnxStaticQuantization",
                "data_config": "calibration",
                "prepare_qdq_config": True,
                "quant_format": "QDQ",
                "per_channel": per_channel == "1",
                "precision": "int16"
                if precision == "w16a16"
                else "int8"
                if per_channel == "1"
                else "uint8",
                "activation_type": "uint8" if precision == "w8a8" else "uint16",
            }
        },
        "host": "local",
        "target": "local",
        "output_dir": str(work / "out"),
        "cache_dir": str(work / "cache"),
        "log_severity_level": 3,
    }
    run(config)
    found = [p for p in (work / "out").rglob("*.onnx")]
    if not found:
        sys.exit(f"Olive wrote no model under {work / 'out'}")
    onnx.save(onnx.load(str(found[0])), out)


if __name__ == "__main__":
    main()
