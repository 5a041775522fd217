"""`epfleet` as users run it: a subprocess, S3 over HTTP (moto), a real Prefect API."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from epfleet.formats.manifest import Manifest
from tests.support.cli_runs import epfleet, s3_manifest, s3_reader
from tests.support.paths import REPO
from tests.support.specs import (
    CPU_TARGET,
    HTP_TARGETS,
    assert_variants_match_store,
    tiny_models,
    with_npu_unfriendly_model,
    write_spec,
)

pytestmark = pytest.mark.slow


VARIANT_KEYS = {
    "model",
    "target",
    "ep",
    "status",
    "compatibility_string",
    "artifact_uri",
    "seconds",
    "error",
    "coverage",
    "verification",
    "max_rel_error",
    "verification_seconds",
    "samples_origin",
    "precision",
    "verification_twin_of",
    "metric",
    "folded",
}


def by_path(file: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A flow file (or deployments/serve.py) run by path, as Prefect and operators do."""
    return subprocess.run(
        [sys.executable, str(REPO / file), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_compile_to_s3_then_rerun_compiles_nothing(
    fleet_spec: Path, s3_bucket: str, cli_env: dict[str, str]
) -> None:
    store = f"s3://{s3_bucket}/fleet"
    first = epfleet("compile", str(fleet_spec), "--store", store, "--json", env=cli_env)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert (report["compiled"], report["skipped"], report["failed"]) == (6, 0, 0)
    assert report["generation"] == 1
    assert all(set(v) == VARIANT_KEYS and v["status"] == "ok" for v in report["variants"])
    assert "[6/6]" in first.stderr  # progress went to stderr, JSON alone to stdout

    manifest = s3_manifest(s3_bucket)
    assert assert_variants_match_store(manifest, s3_reader(s3_bucket)) == 6
    by_pair = {(v["model"], v["target"]): v for v in report["variants"]}
    assert by_pair[("tiny-cls", "sd8g3-htp")]["compatibility_string"] == (
        manifest.models["tiny-cls"].variants["sd8g3-htp"].compatibility_string
    )
    precisions = {pair: v["precision"] for pair, v in by_pair.items()}
    assert precisions == {
        (model, target): manifest.models[model].variants[target].precision
        for model, target in by_pair
    }
    assert precisions[("tiny-cls", "sd8g3-htp")] == "fp16"  # the HTP's float default
    assert precisions[("tiny-cls", "x86-cpu")] == "fp32"

    scratch = Path(cli_env["EPFLEET_CACHE"]) / "work" / "variants"
    assert list(scratch.iterdir()) == []  # every compile's scratch was cleaned up

    second = epfleet("compile", str(fleet_spec), "--store", store, "--json", env=cli_env)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert (again["compiled"], again["skipped"], again["generation"]) == (0, 6, 1)
    assert s3_manifest(s3_bucket) == manifest

    shown = epfleet("manifest", "show", "--store", store, env=cli_env)
    assert shown.returncode == 0
    assert "generation 1" in shown.stdout and "v2:6:2.51.0" in shown.stdout
    assert " precision " in shown.stdout.splitlines()[1] and " fp16 " in shown.stdout
    as_json = epfleet("manifest", "show", "--store", store, "--json", env=cli_env)
    assert Manifest.model_validate_json(as_json.stdout) == manifest


def test_exit_codes(tmp_path: Path, model_dir: Path, cli_env: dict[str, str]) -> None:
    store = str(tmp_path / "store")
    bad = write_spec(tmp_path, [{"name": "m", "source": "missing.onnx"}], [CPU_TARGET], "bad.yaml")
    result = epfleet("compile", str(bad), "--store", store, "--json", env=cli_env)
    assert result.returncode == 2
    assert "missing.onnx does not exist" in result.stderr and result.stdout == ""
    assert not Path(store, "manifest.json").exists()

    for workers in ("0", "65"):
        refused = epfleet("compile", str(bad), "--workers", workers, env=cli_env)
        assert refused.returncode == 2 and "--workers must be from 1 to 64" in refused.stderr

    unknown = epfleet("compile", str(bad), "--store", "ftp://host/x", env=cli_env)
    assert unknown.returncode == 2 and "unknown scheme 'ftp'" in unknown.stderr

    mixed = with_npu_unfriendly_model(tmp_path, model_dir, [HTP_TARGETS[0]])
    result = epfleet("compile", str(mixed), "--store", store, "--json", env=cli_env)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert (report["compiled"], report["failed"]) == (1, 1)
    failed = next(v for v in report["variants"] if v["status"] == "failed")
    assert failed["model"] == "nonzero" and "Unable to compile any nodes" in failed["error"]
    manifest = Manifest.from_json(Path(store, "manifest.json").read_bytes())
    assert manifest.models["tiny-cls"].variants["sd8g3-htp"].status == "ok"


def test_concurrent_runs_on_different_models_both_land(
    fleet_spec: Path, s3_bucket: str, cli_env: dict[str, str]
) -> None:
    store = f"s3://{s3_bucket}/fleet"

    def run(model: str) -> subprocess.CompletedProcess[str]:
        return epfleet(
            "compile",
            str(fleet_spec),
            "--store",
            store,
            "--model",
            model,
            "--workers",
            "1",
            "--json",
            env=cli_env,
        )

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, ["tiny-cls", "tiny-det"]))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    manifest = s3_manifest(s3_bucket)
    assert set(manifest.models) == {"tiny-cls", "tiny-det"}
    assert all(len(m.variants) == 3 for m in manifest.models.values())
    assert manifest.generation == 2


def test_the_deprecated_prune_retires_what_the_spec_no_longer_lists_never_a_subset(
    tmp_path: Path, model_dir: Path, cli_env: dict[str, str]
) -> None:
    store = str(tmp_path / "store")
    both = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET], "both.yaml")
    assert epfleet("compile", str(both), "--store", store, env=cli_env).returncode == 0
    # A --model subset with --prune retires nothing: pruning is judged on the whole spec.
    subset = epfleet(
        "compile",
        str(both),
        "--store",
        store,
        "--model",
        "tiny-cls",
        "--prune",
        "--json",
        env=cli_env,
    )
    assert subset.returncode == 0, subset.stderr
    assert json.loads(subset.stdout)["pruned"]["models"] == []
    one = write_spec(tmp_path, tiny_models(model_dir)[:1], [CPU_TARGET], "one.yaml")
    assert [m["name"] for m in tiny_models(model_dir)[:1]] == ["tiny-cls"]
    pruned = epfleet("compile", str(one), "--store", store, "--prune", "--json", env=cli_env)
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["pruned"]["models"] == ["tiny-det"]
    assert "pruned model tiny-det (no longer in the spec)" in pruned.stderr
    deprecated = " ".join(pruned.stderr.split())
    assert (
        f"--prune is deprecated and will be removed: run epfleet retire --spec {one}" in deprecated
    )
    manifest = Manifest.from_json(Path(store, "manifest.json").read_bytes())
    assert list(manifest.models) == ["tiny-cls"]
    assert manifest.models["tiny-cls"].variants["x86-cpu"].status == "ok"


FILES_AND_COMMANDS = {
    "flows/fleet_compile.py": "compile",
    "flows/runtime_watch.py": "watch",
    "flows/device_sync.py": "sync",
    "deployments/serve.py": "serve",
}


def test_files_run_by_path_are_the_cli_commands(cli_env: dict[str, str]) -> None:
    with ThreadPoolExecutor(2) as pool:
        helps = pool.map(lambda f: by_path(f, "--help", env=cli_env), FILES_AND_COMMANDS)
    for (file, command), shown in zip(FILES_AND_COMMANDS.items(), helps, strict=True):
        assert shown.returncode == 0, (file, shown.stderr[-2000:])
        assert f"Usage: epfleet {command}" in shown.stdout, file


def test_watch_and_device_sync_run_by_path_and_as_commands(
    tmp_path: Path, model_dir: Path, cli_env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir)[:1], [CPU_TARGET])
    store = str(tmp_path / "store")
    compiled = epfleet("compile", str(spec), "--store", store, "--workers", "1", env=cli_env)
    assert compiled.returncode == 0, compiled.stderr

    watched = by_path(
        "flows/runtime_watch.py", str(spec), "--store", store, "--dry-run", env=cli_env
    )
    assert watched.returncode == 0, watched.stderr[-2000:]
    header, _rule, row = watched.stdout.splitlines()[:3]
    assert header.split() == ["model", "target", "status", "why"]
    assert row.split()[:3] == ["tiny-cls", "x86-cpu", "current"]
    as_json = epfleet("watch", str(spec), "--store", store, "--dry-run", "--json", env=cli_env)
    assert as_json.returncode == 0, as_json.stderr[-2000:]
    assert [p["status"] for p in json.loads(as_json.stdout)["pairs"]] == ["current"]
    refused = epfleet("watch", str(spec), "--report-max-age-days", "0", env=cli_env)
    assert refused.returncode == 2 and "--report-max-age-days must be 1 or more" in refused.stderr

    cache = str(tmp_path / "device")
    args = ("--store", store, "--cache", cache, "--device-id", "by-path")
    synced = by_path("flows/device_sync.py", *args, env=cli_env)
    assert synced.returncode == 0, synced.stderr[-2000:]
    report = json.loads(synced.stdout)
    assert (report["device_id"], [m["action"] for m in report["models"]]) == (
        "by-path",
        ["downloaded"],
    )
    again = epfleet("sync", *args, "--prefer", "cpu", "--json", env=cli_env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [m["action"] for m in json.loads(again.stdout)["models"]] == ["kept"]
