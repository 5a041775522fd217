"""Binary deltas between QNN EPContext variants: zstd's patch-from (``zstandard``)
against ``bsdiff4`` on one model, and the bytes each device of the example fleet
downloads with and without deltas.

    python bench/deltas.py MODEL.onnx --input-shape x=1,3,48,192 [--work DIR]
    python bench/deltas.py --fleet [--work DIR]

With MODEL: compiles MODEL and a copy with one Conv weight changed (noise of 1 % of its
range: one layer retrained) for the HTP targets of tests/support/specs.py with ``epfleet
compile``, then, for each pair of compiled files, prints: sizes (each file, zstd -19 of
the new one alone), each delta's size, the time to make and to apply it, and whether the
applied result is the new file byte for byte. Also compares the same model compiled for
two HTP targets (another soc/arch: not a delta a device uses, a bound on unrelated
variants).

With ``--fleet``: the example fleet (examples/fleet.yaml's models and targets) is compiled
and published, a device of each kind syncs it, every model is retrained in one layer and
published again, and each device syncs once from a copy of the store whose manifest lists
the deltas and once from one whose manifest does not (what an epfleet without deltas, or
a device of schema 1.7, downloads): bytes downloaded per device, side by side. Then the
runtime upgrade of examples/fleet-runtimes.yaml: tiny-cls on a Snapdragon X Elite built
under onnxruntime-qnn 2.5.0, then 2.7.0 added; a device moved from 2.5.0 to 2.7.0 syncs,
with and without deltas. Runtime environments build into $EPFLEET_CACHE/runtimes (the
first build takes minutes). Compiles run in this process, as ``epfleet compile`` does
without a Prefect API (tests/support/plain_fleet.py)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLES = ROOT / "examples"

from tests.support.retrain import retrained  # noqa: E402  (onnx only)

if TYPE_CHECKING:
    from epfleet.device.local_eps import LocalEps

# The rest is imported where used: compile workers are spawned, and each imports this
# script again, where it must not load onnxruntime before entering its runtime.


def compile_htp(work: Path, source: Path, shapes: dict[str, list[int]]) -> dict[str, Path]:
    from tests.support.specs import HTP_TARGETS as TARGETS

    spec = {
        "models": [{"name": "m", "source": str(source), "input_shapes": shapes}],
        "targets": [dict(t, verify=False) for t in TARGETS],
    }
    work.mkdir(parents=True, exist_ok=True)
    (work / "fleet.yaml").write_text(yaml.safe_dump(spec))
    store = work / "store"
    command = [sys.executable, "-m", "epfleet", "compile", str(work / "fleet.yaml")]
    subprocess.run([*command, "--store", str(store)], check=True, capture_output=True)
    return {t["name"]: next((store / "variants" / "m" / t["name"]).glob("*.onnx")) for t in TARGETS}


def measure(label: str, old: bytes, new: bytes) -> None:
    whole = len(zstandard.ZstdCompressor(level=19).compress(new))
    print(f"{label}: base {len(old):,} B, new {len(new):,} B, new alone zstd -19 {whole:,} B")
    params = zstandard.ZstdCompressionParameters.from_level(
        19, window_log=max(20, (len(old) + len(new)).bit_length())
    )
    started = time.perf_counter()
    compressor = zstandard.ZstdCompressor(
        compression_params=params, dict_data=zstandard.ZstdCompressionDict(old, dict_type=1)
    )
    patch = compressor.compress(new)
    made = time.perf_counter() - started
    started = time.perf_counter()
    decompressor = zstandard.ZstdDecompressor(
        dict_data=zstandard.ZstdCompressionDict(old, dict_type=1), max_window_size=2**31
    )
    applied = decompressor.decompress(patch, max_output_size=len(new))
    taken = time.perf_counter() - started
    same = hashlib.sha256(applied).digest() == hashlib.sha256(new).digest()
    print(
        f"  zstd patch-from -19: {len(patch):,} B ({len(patch) / len(new):.1%} of the file), "
        f"made in {made:.2f} s, applied in {taken:.3f} s, identical {same}"
    )
    import bsdiff4  # (pip install bsdiff4: only the comparison needs it)

    started = time.perf_counter()
    delta = bsdiff4.diff(old, new)
    made = time.perf_counter() - started
    started = time.perf_counter()
    applied = bsdiff4.patch(old, delta)
    taken = time.perf_counter() - started
    same = applied == new
    print(
        f"  bsdiff4: {len(delta):,} B ({len(delta) / len(new):.1%} of the file), "
        f"made in {made:.2f} s, applied in {taken:.3f} s, identical {same}"
    )


def without_deltas(store: Path, dest: Path) -> Path:
    """An unsigned copy of ``store`` whose manifest lists no delta: what a device that
    does not use them (an older epfleet) is served."""
    from tests.support.synced_fleet import copy_store

    copy_store(store, dest)
    manifest = json.loads((dest / "manifest.json").read_bytes())
    for entry in manifest["models"].values():
        for variant in [*entry.get("variants", {}).values(), *entry.get("previous", {}).values()]:
            if variant:
                variant.pop("deltas", None)
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def new_samples(old: Path, new: Path) -> int:
    """Bytes of the golden samples ``new``'s models have and ``old``'s do not (a new
    source's: a device downloads them whatever way its variant comes)."""
    before = json.loads((old / "manifest.json").read_bytes())["models"]
    after = json.loads((new / "manifest.json").read_bytes())["models"]
    return sum(
        entry["samples"]["size"]
        for name, entry in after.items()
        if entry.get("samples")
        and entry["samples"]["sha256"] != (before.get(name, {}).get("samples") or {}).get("sha256")
    )


def sync_bytes(store: Path, device: Path, local: LocalEps | None) -> tuple[int, str]:
    """One sync of every model: bytes downloaded, and what each model did."""
    from epfleet.device.policy import SyncPolicy
    from epfleet.device.session import SyncSession

    with SyncSession(
        str(store), device, SyncPolicy(), "bench-device", local=local, allow_unsigned=True
    ) as session:
        session.fetch_manifest()
        for model in session.wanted():
            session.sync_model(model)
        report = session.finish()
    done = ", ".join(
        f"{m.model} {m.action} {m.target}{' by delta' if m.delta_from else ''}"
        for m in report.models
    )
    return sum(m.bytes_downloaded for m in report.models), done


def compare(
    label: str, old: Path, new: Path, work: Path, local: LocalEps | None, upgraded: LocalEps | None
) -> None:
    """A device synced from ``old`` (``local``'s EPs), then from ``new`` (``upgraded``'s
    EPs), with and without the deltas ``new`` lists: the bytes of the second sync."""
    from tests.support.synced_fleet import copy_store

    device = work / "device"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    first, done = sync_bytes(copy_store(old, work / "store"), device, local)
    print(f"{label}: first sync {first:,} B ({done})")
    figures = {}
    for mode in ("without deltas", "with deltas"):
        here = work / mode.replace(" ", "-")
        shutil.copytree(device, here / "device", symlinks=True)
        served = work / "store"
        shutil.rmtree(served)
        if mode == "with deltas":
            copy_store(new, served)
        else:
            without_deltas(new, served)
        figures[mode], done = sync_bytes(served, here / "device", upgraded)
        print(f"  {mode}: {figures[mode]:,} B ({done})")
    before, after = figures["without deltas"], figures["with deltas"]
    print(f"  with deltas / without: {after / before:.3f} ({before / after:.1f}x fewer bytes)")
    samples = new_samples(old, new)
    if samples:
        before, after = before - samples, after - samples
        print(
            f"  variants alone (less {samples:,} B of new golden samples): {before:,} B "
            f"-> {after:,} B, {after / before:.3f} ({before / after:.1f}x fewer bytes)"
        )


def fleet(work: Path) -> None:
    """The example fleet retrained in one layer, and moved to a newer onnxruntime-qnn."""
    from epfleet.settings import settings
    from eps.qnn import HtpRuntime
    from tests.support.plain_fleet import compile_spec
    from tests.support.qnn_device import QnnDeviceEps, htp_device
    from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models
    from tests.support.synced_fleet import copy_store

    cache = settings().cache
    work.mkdir(parents=True, exist_ok=True)
    models = tiny_models(EXAMPLES / "models")
    targets = [*HTP_TARGETS, CPU_TARGET]
    spec = {"models": models, "targets": targets}
    store = work / "retrain" / "store"
    shutil.rmtree(store.parent, ignore_errors=True)
    store.parent.mkdir(parents=True)
    (store.parent / "fleet.yaml").write_text(yaml.safe_dump(spec))
    assert compile_spec(store.parent / "fleet.yaml", store, cache).exit_code == 0
    old = copy_store(store, work / "retrain" / "old")
    layers = []
    for model in models:
        changed = store.parent / f"{model['name']}.retrained.onnx"
        layers.append(f"{model['name']}: {retrained(Path(model['source']), changed)}")
        model["source"] = str(changed)
    (store.parent / "fleet.yaml").write_text(yaml.safe_dump(spec))
    assert compile_spec(store.parent / "fleet.yaml", store, cache).exit_code == 0
    print(f"one layer retrained ({'; '.join(layers)}), every model, every target:")
    devices: dict[str, LocalEps | None] = {
        "Snapdragon 8 Gen 3 device (HTP v75)": QnnDeviceEps(htp_device(75, 8)),
        "Snapdragon 8 Gen 2 device (HTP v73)": QnnDeviceEps(htp_device(73, 8)),
        "x86-64 device (this host's EPs)": None,
    }
    for n, (label, local) in enumerate(devices.items()):
        compare(label, old, store, work / "retrain" / f"device-{n}", local, local)

    upgrade = yaml.safe_load((EXAMPLES / "fleet-runtimes.yaml").read_text())
    for model in upgrade["models"]:
        model["source"] = str(EXAMPLES / model["source"])
    store = work / "upgrade" / "store"
    shutil.rmtree(store.parent, ignore_errors=True)
    store.parent.mkdir(parents=True)
    spec_file = store.parent / "fleet.yaml"
    on_2_5 = {**upgrade, "targets": [dict(t) for t in upgrade["targets"]]}
    on_2_5["targets"][0]["runtimes"] = ["qnn-2.5"]
    spec_file.write_text(yaml.safe_dump(on_2_5))
    assert compile_spec(spec_file, store, cache).exit_code == 0
    old = copy_store(store, work / "upgrade" / "old")
    spec_file.write_text(yaml.safe_dump(upgrade))
    assert compile_spec(spec_file, store, cache).exit_code == 0
    device_2_5 = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 49, 0), sdk=(2, 49, 40))
    device_2_7 = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 51, 0), sdk=(2, 51, 0))
    print("runtime upgrade (examples/fleet-runtimes.yaml, qnn-2.7 added beside qnn-2.5):")
    compare(
        "Snapdragon X Elite device, onnxruntime-qnn 2.5.0 -> 2.7.0",
        old,
        store,
        work / "upgrade" / "device",
        QnnDeviceEps(device_2_5, "2.5.0"),
        QnnDeviceEps(device_2_7, "2.7.0"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, nargs="?")
    parser.add_argument("--input-shape", action="append", default=[])
    parser.add_argument("--fleet", action="store_true", help="the example fleet's devices")
    parser.add_argument("--work", type=Path, default=Path("delta-bench"))
    args = parser.parse_args()
    if args.fleet:
        fleet(args.work.resolve())
        return
    if args.model is None:
        parser.error("give MODEL.onnx, or --fleet")
    shapes = {
        name: [int(d) for d in dims.split(",")]
        for name, dims in (s.split("=", 1) for s in args.input_shape)
    }
    args.work.mkdir(parents=True, exist_ok=True)
    changed = args.work / "retrained.onnx"
    layer = retrained(args.model, changed)
    base = compile_htp(args.work / "base", args.model.resolve(), shapes)
    new = compile_htp(args.work / "new", changed.resolve(), shapes)
    for target in base:
        measure(
            f"{args.model.name} {target}, {layer} retrained",
            base[target].read_bytes(),
            new[target].read_bytes(),
        )
    first, second = list(base)
    measure(
        f"{args.model.name}, {first} from {second}",
        base[second].read_bytes(),
        base[first].read_bytes(),
    )


if __name__ == "__main__":
    main()
