"""A device report as ``epfleet sync --json`` printed it, for tests of its rendering."""

REPORT = {
    "device_id": "vm", "generated_at": "2026-12-01T17:29:57+00:00", "ort_version": "1.32.0",
    "ep_packages": {"onnxruntime": "1.32.0"},
    "devices": [{"ep": "CPUExecutionProvider", "type": "cpu", "vendor": "AMD",
                 "vendor_id": 4130, "device_id": 0, "ep_vendor": "Microsoft"}],
    "store": "st", "cache": "/tmp/c",
    "manifest": {"status": "unchanged", "generation": 1, "body_bytes": 485, "signed": True},
    "models": [{
        "model": "tiny-cls", "action": "kept", "variant": "x86-cpu-a11928e6a250",
        "target": "x86-cpu", "ep": "CPUExecutionProvider", "verdict": "optimal",
        "bytes_downloaded": 0, "reason": "still the best choice here", "precision": "fp32",
        "seconds": 0.002,
        "considered": [{
            "target": t, "ep": "QNNExecutionProvider", "device": "npu",
            "verdict": "unsupported",
            "reason": "its validator refused this device: Currently QnnEpFactory::"
            "ValidateCompiledModelCompatibilityInfoImpl only supports "
            "OrtHardwareDeviceType_NPU, but no OrtHardwareDeviceType_NPU is found in the "
            "`devices` argument.",
        } for t in ("sd8g3-htp", "sd8g2-htp")],
    }],
    "seconds": 0.1,
}  # fmt: skip
"""A device report as epfleet sync --json printed it here (one model, QNN refused)."""
