"""What a runtime environment's worker loads, and whether it runs an HTP context binary:
called in a worker of ``epfleet.runtime.workers`` (importable there by name)."""

from __future__ import annotations

import importlib.metadata


def run_htp(path: str) -> tuple[str, str]:
    """Run the QNN HTP variant at ``path`` once on zeros in this worker's onnxruntime and
    onnxruntime-qnn (this host's HTP backend executes it); their versions. Raises what
    ONNX Runtime raises when the binary is refused."""
    import numpy as np
    import onnxruntime as ort

    import eps

    options = ort.SessionOptions()
    eps.load("QNNExecutionProvider").configure_session(options, {"backend_type": "htp"}, "npu")
    session = ort.InferenceSession(path, options)
    feeds = {
        i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
        for i in session.get_inputs()
    }
    session.run(None, feeds)
    return ort.__version__, importlib.metadata.version("onnxruntime-qnn")
