"""Running ``epfleet`` as users do, in a subprocess, and reading what it published to S3."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import boto3

from epfleet.formats.manifest import Manifest


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
