"""Fleet specs for tests: the HTP and CPU targets, spec files, the example models, and the check
that a run's variants match what the store holds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from onnxruntime.capi._pybind_state import get_compatibility_info_from_model_bytes

from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_bytes

HTP_TARGETS = [
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


CPU_TARGET = {"name": "x86-cpu", "ep": "CPUExecutionProvider"}


def write_spec(
    directory: Path,
    models: list[dict],
    targets: list[dict],
    name: str = "fleet.yaml",
    runtimes: dict[str, Any] | None = None,
) -> Path:
    path = directory / name
    spec: dict[str, Any] = {"models": models, "targets": targets}
    if runtimes:
        spec["runtimes"] = runtimes
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def tiny_models(model_dir: Path) -> list[dict]:
    """The spec entries of the two small models, with symbolic dims fixed."""
    return [
        {
            "name": "tiny-cls",
            "source": str(model_dir / "tiny-cls.onnx"),
            "input_shapes": {"x": [1, 3, 48, 192]},
        },
        {
            "name": "tiny-det",
            "source": str(model_dir / "tiny-det.onnx"),
            "input_shapes": {"image": [1, 3, 64, 64]},
        },
    ]


def with_npu_unfriendly_model(directory: Path, model_dir: Path, targets: list[dict]) -> Path:
    """A spec whose `nonzero` model no NPU EP can compile, beside `tiny-cls`, which any can."""
    return write_spec(
        directory,
        [
            {
                "name": "tiny-cls",
                "source": str(model_dir / "tiny-cls.onnx"),
                "input_shapes": {"x": [1, 3, 32, 32]},
            },
            {
                "name": "nonzero",
                "source": str(model_dir / "nonzero.onnx"),
                "input_shapes": {"x": [1, 8]},
            },
        ],
        targets,
    )


def assert_variants_match_store(manifest: Manifest, read: Callable[[str], bytes]) -> int:
    """Every ok variant's stored bytes match its sha256 and size, and its manifest string is
    what ORT reads from those bytes for its EP. Returns how many variants were checked."""
    checked = 0
    for model in manifest.models.values():
        for variant in model.variants.values():
            assert variant.status == "ok" and variant.artifact is not None
            data = read(variant.artifact.uri)
            assert (sha256_bytes(data), len(data)) == (
                variant.artifact.sha256,
                variant.artifact.size,
            )
            assert (
                get_compatibility_info_from_model_bytes(data, variant.ep)
                == variant.compatibility_string
            )
            assert variant.source_sha256 == model.source.sha256
            checked += 1
    return checked
