"""Execution-provider modules, one per EP, behind the ``eps.base.ExecutionProvider`` interface.

The table below is the whole registry: ORT EP name -> module, imported only
when asked for, so a worker never imports a plugin it does not use.
"""

from __future__ import annotations

import importlib
from typing import cast

from eps.base import ExecutionProvider

EP_MODULES: dict[str, str] = {
    "QNNExecutionProvider": "eps.qnn",
    "CPUExecutionProvider": "eps.cpu",
    "OpenVINOExecutionProvider": "eps.openvino",
    "NvTensorRTRTXExecutionProvider": "eps.trt_rtx",
}


def known() -> list[str]:
    return sorted(EP_MODULES)


def describe_known() -> str:
    """Every known EP with the pip extra that installs it (imports the small EP modules,
    not their plugins)."""
    described = []
    for ep_name in known():
        extra = load(ep_name).extra
        described.append(f"{ep_name} (epfleet[{extra}])" if extra else f"{ep_name} (built in)")
    return ", ".join(described)


def load(ep_name: str) -> ExecutionProvider:
    """The module for ``ep_name``; KeyError listing the known EPs when there is none."""
    try:
        module_name = EP_MODULES[ep_name]
    except KeyError:
        raise KeyError(
            f"unknown execution provider {ep_name!r}; known: {describe_known()}"
        ) from None
    return cast(ExecutionProvider, importlib.import_module(module_name))
