"""Running ``epfleet`` as users do, in a subprocess, and reading what it published to S3."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import boto3

from epfleet.formats.manifest import Manifest
from tests.support.specs import tiny_models, write_spec


def epfleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epfleet.cli.app", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def s3_reader(bucket: str) -> Callable[[str], bytes]:
    s3 = boto3.client("s3")
    return lambda key: s3.get_object(Bucket=bucket, Key=f"fleet/{key}")["Body"].read()


def s3_manifest(bucket: str) -> Manifest:
    body = boto3.client("s3").get_object(Bucket=bucket, Key="fleet/manifest.json")["Body"].read()
    return Manifest.from_json(body)


def compile_fleet(directory: Path, model_dir: Path, targets: list[dict], prefect_api: str) -> Path:
    """A real ``epfleet compile`` of the two small models into ``directory``/store, in a
    subprocess whose Prefect API is ``prefect_api`` (so it runs as the fleet-compile flow)."""
    spec = write_spec(directory, tiny_models(model_dir), targets)
    store = directory / "store"
    env = dict(os.environ, PREFECT_API_URL=prefect_api, EPFLEET_CACHE=str(directory / "cache"))
    done = epfleet("compile", str(spec), "--store", str(store), "--json", env=env)
    assert done.returncode == 0, done.stderr
    return store
