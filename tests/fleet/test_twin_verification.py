"""Verification that scales with distinct numerics, not targets: real QNN HTP compiles and
runs on this host's HTP backend, as the CLI runs them without Prefect.

One small float model, two specs of golden samples, three HTP targets: v73 and v75 (one
numerics family, ``eps.qnn``) and v69 (outside it). v73, first in spec order, is verified
on every golden sample, v75 on its first only, v69 on every one. The "overflows" model's
third sample drives an intermediate past float16's range, so its fp16 v73 variant really
fails verification (no test double) while v75's one-sample check passes: v75 is held
back, naming v73, and shown right when verified on its own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from epfleet.cli.compile import _run_without_prefect
from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.planning.twin_rules import HELD_BACK
from epfleet.fleet.publishing.publish import read_manifest
from epfleet.fleet.runs.models import RunReport
from epfleet.fleet.views import detail, render_manifest
from epfleet.formats.manifest import Manifest, VariantEntry, Verification
from epfleet.stores import open_store
from tests.support.specs import write_spec

pytestmark = pytest.mark.fast

TARGETS = [
    {
        "name": name,
        "ep": "QNNExecutionProvider",
        "provider_options": {"backend_type": "htp", "htp_arch": arch, "soc_model": soc},
    }
    for name, arch, soc in [("v73", "73", "43"), ("v75", "75", "57"), ("v69", "69", "36")]
]


def doubling_model(path: Path) -> Path:
    """y = (x + x) - x: y = x in fp32; in fp16, x + x saturates past 65,504."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "x"], ["twice"]),
            helper.make_node("Sub", ["twice", "x"], ["y"]),
        ],
        "doubling",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def fleet(directory: Path) -> Path:
    source = doubling_model(directory / "doubling.onnx")
    rng = np.random.default_rng(0)
    fits = rng.uniform(-1, 1, (3, 1, 64)).astype(np.float32)
    overflows = fits.copy()
    overflows[2] = rng.uniform(4e4, 6e4, (1, 64))  # x + x reaches 1.2e5
    np.savez(directory / "fits.npz", x=fits)
    np.savez(directory / "overflows.npz", x=overflows)
    models = [
        {"name": name, "source": str(source), "samples": str(directory / f"{name}.npz")}
        for name in ("fits", "overflows")
    ]
    return write_spec(directory, models, TARGETS)


def compile_fleet(
    spec: Path, store: str, force: bool = False, targets: list[str] | None = None
) -> tuple[RunReport, Manifest, int]:
    plan = plan_run(spec, store, force=force, targets=targets)
    if plan.is_noop:
        report = plan.report({}, plan.generation, published=False)
    else:
        report = _run_without_prefect(plan, store, 1)
    manifest, _ = read_manifest(open_store(store))
    assert manifest is not None
    return report, manifest, len(plan.to_compile)


def checked(entry: VariantEntry) -> Verification:
    assert entry.verification is not None
    return entry.verification


def test_one_target_of_a_numerics_family_is_verified_in_full_and_vouches_for_the_others(
    tmp_path: Path,
) -> None:
    spec, store = fleet(tmp_path), str(tmp_path / "store")
    report, manifest, compiled = compile_fleet(spec, store)
    assert compiled == 6
    fits = manifest.models["fits"].variants
    assert fits["v73"].status == fits["v75"].status == fits["v69"].status == "ok"
    # v73 (first in spec order) on every sample, v75 on the first as its twin, v69 (another
    # numerics) on every sample.
    assert (checked(fits["v73"]).samples, checked(fits["v73"]).twin_of) == (3, None)
    assert (checked(fits["v75"]).samples, checked(fits["v75"]).twin_of) == (1, "v73")
    assert (checked(fits["v69"]).samples, checked(fits["v69"]).twin_of) == (3, None)
    assert all(checked(e).status == "passed" for e in fits.values())
    cells = {r.target: detail(r) for r in report.variants if r.model == "fits"}
    assert [t for t, text in cells.items() if "(twin of v73)" in text] == ["v75"]
    shown = [line for line in render_manifest(manifest, store).splitlines() if "fits" in line]
    assert sum("(twin of v73, 1 sample)" in line for line in shown) == 1

    # The third sample overflows fp16 on v73: it fails on its own, and v75, whose check on
    # the first sample passed, is held back naming v73 (pairs verify concurrently; the
    # publish decides).
    overflows = manifest.models["overflows"].variants
    rep, twin = overflows["v73"], overflows["v75"]
    assert rep.status == "failed" and checked(rep).status == "failed"
    assert rep.error is not None and "past float16's largest value" in rep.error
    assert twin.status == "failed" and twin.artifact is None
    assert twin.error is not None and twin.error.startswith(HELD_BACK)
    assert "numerics twin of v73" in twin.error and "v73 failed: verification failed" in twin.error
    assert checked(twin).status == "passed" and checked(twin).twin_of == "v73"
    assert checked(overflows["v69"]).samples == 3 and checked(overflows["v69"]).twin_of is None
    held = next(r for r in report.variants if (r.model, r.target) == ("overflows", "v75"))
    assert held.status == "failed" and held.verification_twin_of == "v73"

    # Nothing changed: nothing compiles, the held-back twin included (its representative
    # is up to date and failed).
    again, unchanged, compiled = compile_fleet(spec, store)
    assert compiled == 0 and unchanged == manifest
    assert [r.status for r in again.variants if r.model == "overflows"][:2] == ["failed"] * 2

    # v75 alone (--target v75, forced): no twin in the run, but this machine verified its
    # numerics in full before (v73 of "fits"): checked on one sample, as v73's twin. The
    # "overflows" numerics never passed here, so its v75 is verified in full, and fails on
    # its own as v73 did: the hold-back was right.
    alone, manifest, compiled = compile_fleet(spec, store, force=True, targets=["v75"])
    assert compiled == 2
    fits_v75 = manifest.models["fits"].variants["v75"]
    assert fits_v75.status == "ok"
    assert (checked(fits_v75).samples, checked(fits_v75).twin_of) == (1, "v73")
    solo = manifest.models["overflows"].variants["v75"]
    assert solo.status == "failed" and checked(solo).status == "failed"
    assert checked(solo).samples == 3 and checked(solo).twin_of is None
    assert solo.error is not None and "past float16's largest value" in solo.error
    assert alone.failed == 1
