"""What importing ``eps`` loads, in a fresh interpreter (slow tier: each test starts
one): listing the known EPs imports no plugin, and ``eps`` imports nothing from
``epfleet``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow


def python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    return done.stdout


def test_listing_the_known_eps_imports_none_of_them() -> None:
    out = python(
        "import json, sys, eps\n"
        "try:\n"
        "    eps.load('FancyExecutionProvider')\n"
        "except KeyError:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    modules = json.loads(out)
    imported = [m for m in modules if m.startswith(("onnxruntime", "epfleet", "onnx"))]
    assert imported == []
    assert [m for m in modules if m.startswith("eps.")] == ["eps.base"]


def test_eps_imports_nothing_from_epfleet() -> None:
    modules = json.loads(
        python(
            "import json, sys\n"
            "import eps, eps._plugin, eps.cpu, eps.openvino, eps.qnn, eps.trt_rtx\n"
            "print(json.dumps(sorted(sys.modules)))\n"
        )
    )
    assert [m for m in modules if m.split(".")[0] == "epfleet"] == []
