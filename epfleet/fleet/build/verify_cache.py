"""This machine's cache of verification results, under two keys.

- By artifact: a variant whose bytes, golden samples, EP build, ORT version and checking
  settings are those of a variant verified here before is not run again; its record is
  the earlier one's, marked ``reused``.
- By numerics (``numerics_key_for``): a variant whose numerics (source, precision,
  numerics-relevant EP options, tolerances: ``epfleet.fleet.planning.twin_rules.numerics_basis``),
  golden samples, EP build and ORT version are those of a variant verified here on every
  sample before is checked on its first sample only, as a twin of that variant's target
  (``Backing``). QNN's context binaries are not byte-stable, so a QNN rebuild, or a new
  target of a measured arch family, meets only this key.

``VerifyKey`` and ``verification_key`` are the pure part (what decides a verification's
result, hashed); ``recalled`` and ``remember`` read and write
``<EPFLEET_CACHE>/work/verified/<store>/<key>.json`` (``verified_dir``: one directory per
store, so a compile into one store never reuses what was verified for another), one file
per result, written atomically, as
the quantiser keeps its QDQ models (``epfleet.runtime.quantize``). Only passed results
on every sample are kept: a failure may be a time limit or a crash, which a second run
need not repeat, and a twin's check vouches for nothing until its representative passed.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from epfleet.fleet.planning.twin_rules import numerics_basis
from epfleet.formats.manifest import Verification
from epfleet.formats.task_metric import MetricSpec
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_bytes, store_dir_name
from epfleet.runtime.compiler import CompileOutput
from epfleet.runtime.requests import CompileRequest

CACHE_VERSION = 4
"""Bumped when what decides a verification's result changes (a new comparison, say; 4:
every input of the input sets checked for tails, whatever judges the metric)."""


class VerifyKey(BaseModel):
    """Everything a verification's result depends on."""

    artifact: list[tuple[str, str, int]]
    """(path, sha256, size) of the main file and each file beside it, sorted."""
    samples_sha256: str
    metric_inputs_sha256: str | None = None
    """The input sets the variant also runs (None: none; left out of the key)."""
    ep: str
    ep_build: dict[str, str]
    """The EP's ``build_identity()``: its package and version (and, for the CPU EP, the
    machine's ISA class)."""
    ort_version: str
    device: str
    provider_options: dict[str, str]
    tolerance: float
    abs_tolerance: float
    verify_timeout: float
    """A pass within a longer time limit need not hold within a shorter one."""
    metric: MetricSpec | None = None
    """The task metric it was judged by (left out of the key when None)."""
    decision_default: bool | None = None
    """False when ``metric: {kind: none}`` turned the default for class scores off (None:
    left out of the key)."""


def verification_key(key: VerifyKey) -> str:
    """The cache file name of a verification: a sha256 of ``key`` in a stable form."""
    document = {"version": CACHE_VERSION, **key.model_dump(mode="json", exclude_none=True)}
    document["artifact"] = sorted(document["artifact"])
    return sha256_bytes(json.dumps(document, sort_keys=True, separators=(",", ":")).encode())


def reused(earlier: Verification) -> Verification:
    """The record of a variant whose verification is ``earlier``'s: its measurements, no
    seconds spent, and marked reused."""
    return earlier.model_copy(update={"seconds": 0.0, "reused": True})


def verified_dir(cache: Path, store_uri: str) -> Path:
    """Where the verification results of variants published to the store at ``store_uri``
    are kept, in the worker cache ``cache``."""
    return cache / "work" / "verified" / store_dir_name(store_uri)


def _path(directory: Path, key: str) -> Path:
    return directory / f"{key}.json"


def recalled(directory: Path, key: str) -> Verification | None:
    """The passed verification cached under ``key`` in ``directory`` (``verified_dir``);
    None when there is none (or the file is unreadable: the variant is then verified
    again)."""
    try:
        earlier = Verification.model_validate_json(_path(directory, key).read_bytes())
    except (OSError, ValidationError):
        return None
    return earlier if earlier.status == "passed" else None


def remember(directory: Path, key: str, verification: Verification) -> None:
    """Keep a ``verification`` passed on every golden sample under ``key`` in ``directory``;
    anything else is not kept."""
    if _full_pass(verification):
        atomic_write_bytes(_path(directory, key), verification.model_dump_json().encode())


def _full_pass(verification: Verification) -> bool:
    return (
        verification.status == "passed" and not verification.reused and verification.twin_of is None
    )


class Backing(BaseModel):
    """A verification on every golden sample that vouches for variants of the same
    numerics, and the target whose variant passed it."""

    target: str
    verification: Verification


def _backing_path(directory: Path, key: str) -> Path:
    return directory / f"numerics-{key}.json"


def recalled_backing(directory: Path, key: str) -> Backing | None:
    """The full verification cached under the numerics ``key``; None when there is none or
    its file is unreadable (the variant is then verified in full)."""
    try:
        return Backing.model_validate_json(_backing_path(directory, key).read_bytes())
    except (OSError, ValidationError):
        return None


def remember_backing(directory: Path, key: str, target: str, verification: Verification) -> None:
    """Keep ``target``'s ``verification`` under the numerics ``key`` when it passed on every
    golden sample."""
    if _full_pass(verification):
        backing = Backing(target=target, verification=verification)
        atomic_write_bytes(_backing_path(directory, key), backing.model_dump_json().encode())


BuiltWith = tuple[str, dict[str, str]]
"""The onnxruntime version and the EP's build identity a variant was built and is verified
with: a runtime environment's, or this machine's (None)."""


def _host_build(ep: str, built_with: BuiltWith | None) -> BuiltWith:
    if built_with is not None:
        return built_with
    import eps
    from eps.base import ort_version

    return ort_version(), eps.load(ep).build_identity()


def numerics_key_for(request: CompileRequest, built_with: BuiltWith | None = None) -> str:
    """The numerics cache key of verifying a variant built for ``request`` (at its
    precision) with these EP and ORT builds (None: this machine's)."""
    import eps

    ort, ep_build = _host_build(request.ep, built_with)
    document = {
        "version": CACHE_VERSION,
        "basis": numerics_basis(request, eps.load(request.ep)),
        "ep_build": ep_build,
        "ort_version": ort,
    }
    return sha256_bytes(json.dumps(document, sort_keys=True, separators=(",", ":")).encode())


def key_for(
    request: CompileRequest, output: CompileOutput, built_with: BuiltWith | None = None
) -> str:
    """The cache key of verifying ``output``, compiled for ``request``, on the request's
    golden samples with these EP and ORT builds (None: this machine's)."""
    ort, ep_build = _host_build(request.ep, built_with)
    assert request.samples is not None
    files = [(output.model_file, output.sha256, output.size), *output.files]
    return verification_key(
        VerifyKey(
            artifact=files,
            samples_sha256=request.samples.sha256,
            metric_inputs_sha256=(
                request.samples.metric_inputs.sha256
                if request.samples.metric_inputs is not None
                else None
            ),
            decision_default=None if request.decision_default else False,
            ep=request.ep,
            ep_build=ep_build,
            ort_version=ort,
            device=request.device,
            provider_options=request.provider_options,
            tolerance=request.tolerance,
            abs_tolerance=request.abs_tolerance,
            verify_timeout=request.verify_timeout,
            metric=request.metric,
        )
    )
