"""epfleet: ONNX models compiled for the execution provider each device really has."""

import functools

__version__ = "0.1.0"

# Bumped whenever the compile recipe changes in a way that changes artifacts
# (shape fixing, metadata stamping, compile flags): it is part of every pair's
# fingerprint, so a new recipe recompiles the fleet.
RECIPE_VERSION = "2"

# Compiles run in worker processes; more than this on one machine is a typo.
MAX_WORKERS = 64


@functools.cache
def ort_version() -> str:
    """The installed onnxruntime's version, without importing it."""
    import importlib.metadata

    return importlib.metadata.version("onnxruntime")
