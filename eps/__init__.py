"""Execution-provider modules, one per EP, each exposing ``EP``, an ``eps.base.ExecutionProvider``.

The table below is the whole registry: ORT EP name -> the module holding its ``EP``,
the pip package that provides the EP and the epfleet extra that installs it. A
module is imported only when asked for, so a worker never imports a plugin it does
not use, and listing the known EPs imports none.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from eps.base import ExecutionProvider


@dataclass(frozen=True)
class Row:
    module: str
    """The module whose ``EP`` object implements the EP."""
    package: str
    """The pip package that provides the EP (``onnxruntime`` for a built-in one)."""
    extra: str | None
    """The epfleet extra that installs ``package``; None when onnxruntime has the EP."""


EP_MODULES: dict[str, Row] = {
    "QNNExecutionProvider": Row(module="eps.qnn", package="onnxruntime-qnn", extra="qnn"),
    "CPUExecutionProvider": Row(module="eps.cpu", package="onnxruntime", extra=None),
    "OpenVINOExecutionProvider": Row(
        module="eps.openvino", package="onnxruntime-ep-openvino", extra="openvino"
    ),
    "NvTensorRTRTXExecutionProvider": Row(
        module="eps.trt_rtx", package="onnxruntime-ep-nv-tensorrt-rtx", extra="trt-rtx"
    ),
}


def known() -> list[str]:
    return sorted(EP_MODULES)


def describe_known() -> str:
    """Every known EP with the pip extra that installs it (from the table: imports nothing)."""
    described = []
    for ep_name in known():
        extra = EP_MODULES[ep_name].extra
        described.append(f"{ep_name} (epfleet[{extra}])" if extra else f"{ep_name} (built in)")
    return ", ".join(described)


def load(ep_name: str) -> ExecutionProvider:
    """The ``EP`` object for ``ep_name``; KeyError listing the known EPs when there is none."""
    try:
        row = EP_MODULES[ep_name]
    except KeyError:
        raise KeyError(
            f"unknown execution provider {ep_name!r}; known: {describe_known()}"
        ) from None
    ep: ExecutionProvider = importlib.import_module(row.module).EP
    return ep
