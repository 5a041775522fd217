"""The tolerance a variant is verified with has one owner, ``eps.base.effective_tolerance``
(a target's value, else the EP module's default for the precision, else the global
default), and what the plan, the verification, the manifest entry, the compile's
verification line and a device's health check use is that one value."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

import eps
from epfleet.device.cache import Installed
from epfleet.device.steps import tolerance as device_tolerance
from epfleet.fleet.build.variant import build_variant, describe_verification
from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.planning.rules import ladder_of
from epfleet.formats.manifest import ModelEntry, SourceEntry
from epfleet.formats.spec import TargetSpec
from epfleet.runtime.requests import CompileRequest
from epfleet.stores import open_store
from eps.base import (
    DEFAULT_TOLERANCE,
    FP16_TOLERANCE,
    FP32_TOLERANCE,
    TOLERANCE_OF,
    Tolerance,
    effective_tolerance,
)
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec

pytestmark = pytest.mark.fast

CPU = "CPUExecutionProvider"


def test_the_rule_given_values_then_the_precisions_then_the_global_default() -> None:
    assert effective_tolerance() == DEFAULT_TOLERANCE
    for precision, default in TOLERANCE_OF.items():
        assert effective_tolerance(precision=precision) == default
        assert effective_tolerance(0.02, precision=precision) == Tolerance(0.02, default.absolute)
        assert effective_tolerance(None, 1e-4, precision=precision) == Tolerance(
            default.relative, 1e-4
        )
    # no precision: the EP module's default one for the options
    cpu = eps.load(CPU)
    assert (
        effective_tolerance(module=cpu, provider_options={}) == TOLERANCE_OF[cpu.precisions({})[0]]
    )
    assert effective_tolerance(0.2, 0.01, module=cpu) == Tolerance(0.2, 0.01)
    # an older compile request (no tolerances in it) gets the global default
    assert (CompileRequest.model_fields["tolerance"].default,) == (DEFAULT_TOLERANCE.relative,)
    assert CompileRequest.model_fields["abs_tolerance"].default == DEFAULT_TOLERANCE.absolute


def test_every_rung_of_a_ladder_takes_the_rule() -> None:
    htp = TargetSpec.model_validate(HTP_TARGETS[0] | {"precision": ["fp16", "w8a16"]})
    assert [(r.tolerance, r.abs_tolerance) for r in ladder_of(htp, eps.load(htp.ep))] == [
        (FP16_TOLERANCE.relative, FP16_TOLERANCE.absolute),
        (TOLERANCE_OF["w8a16"].relative, TOLERANCE_OF["w8a16"].absolute),
    ]
    given = TargetSpec.model_validate(HTP_TARGETS[0] | {"precision": ["fp16"], "tolerance": 0.07})
    assert [(r.tolerance, r.abs_tolerance) for r in ladder_of(given, eps.load(given.ep))] == [
        (0.07, FP16_TOLERANCE.absolute)
    ]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, FP32_TOLERANCE),  # the CPU EP computes in fp32
        ({"tolerance": 0.02, "abs_tolerance": 1e-4}, Tolerance(0.02, 1e-4)),
    ],
    ids=["defaults", "the-targets"],
)
def test_plan_verification_manifest_compile_line_and_device_agree(
    tmp_path: Path, model_dir: Path, fields: dict, expected: Tolerance
) -> None:
    """One real CPU compile of tiny-cls, verified: the request, the verification record,
    the manifest entry it is published as, the compile's verification line and the
    tolerance a device health-checks that entry with are the same numbers."""
    spec = write_spec(tmp_path, tiny_models(model_dir)[:1], [CPU_TARGET | fields])
    store_uri = str(tmp_path / "store")
    [pair] = plan_run(spec, store_uri).pairs
    request = pair.request
    assert (request.tolerance, request.abs_tolerance) == (expected.relative, expected.absolute)

    entry = build_variant(request, open_store(store_uri), 1).entry  # the manifest's entry
    check = entry.verification
    assert check is not None and check.status == "passed", check
    assert (check.tolerance, check.abs_tolerance) == (expected.relative, expected.absolute)
    assert f"tolerance {expected.relative:.2%}," in describe_verification(check)

    installed = Installed(
        name="v",
        origin="published",
        target=request.target,
        ep=entry.ep,
        device=entry.device,
        compatibility_string=entry.compatibility_string,
        sha256=entry.artifact.sha256,
        size=entry.artifact.size,
        source_sha256=entry.source_sha256,
        activated_at=datetime.now(timezone.utc),
        mtime_ns=0,
    )
    model = ModelEntry(
        source=SourceEntry(uri="s", sha256="0" * 64, size=1), variants={request.target: entry}
    )
    assert device_tolerance(installed, model) == expected
    # a variant built on the device (no record) gets the rule's default for its precision
    local = installed.model_copy(update={"origin": "local"})
    assert device_tolerance(local, model) == effective_tolerance(precision=entry.precision)
