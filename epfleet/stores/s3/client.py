"""The boto3 S3 clients of a process: one per settings and AWS environment, shared.

Making a client costs ~0.1 s (botocore loads its S3 model) and a device sync opens the
store several times; clients are thread-safe, so every store of this process with the
same settings and AWS environment shares one. Retries are botocore's standard mode with
``AWS_MAX_ATTEMPTS`` attempts (5 by default). Every request of a client is bounded in time
(``epfleet.stores.s3.bounds``): socket timeouts alone let an answer that trickles in a byte
at a time wait forever.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import boto3
import botocore.session
from botocore import UNSIGNED
from botocore.config import Config
from botocore.utils import parse_timestamp

from epfleet.stores.s3.bounds import bound_waits

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

DEFAULT_REGION = "us-east-1"
DEFAULT_MAX_ATTEMPTS = 5

_clients: dict[tuple[object, ...], S3Client] = {}
_clients_lock = threading.Lock()
_CLIENT_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)
MAX_SHARED_CLIENTS = 8  # rotating session tokens must not grow the cache without bound


def shared_client(settings: tuple[int, float, float]) -> S3Client:
    """The client for (attempts, connect timeout, read timeout) in this AWS environment;
    one that signs nothing with EPFLEET_S3_UNSIGNED (a public bucket, no credentials)."""
    from epfleet.settings import settings as epfleet_settings

    unsigned = epfleet_settings().s3_unsigned
    key = (tuple(os.environ.get(name) for name in _CLIENT_ENV), settings, unsigned)
    attempts, connect_timeout, read_timeout = settings
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            if len(_clients) >= MAX_SHARED_CLIENTS:
                _clients.clear()
            config = Config(
                # total_max_attempts counts the first attempt, as AWS_MAX_ATTEMPTS does
                # (botocore reads a max_attempts here as retries: one attempt more)
                retries={"mode": "standard", "total_max_attempts": attempts},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                # one shared client serves threaded reads (runtime-watch reads 16 reports
                # at a time, a download 4 segments): botocore's default keeps 10 connections
                max_pool_connections=32,
                **({"signature_version": UNSIGNED} if unsigned else {}),
            )
            core = botocore.session.get_session()
            core.get_component("response_parser_factory").set_parser_defaults(
                timestamp_parser=parse_s3_timestamp
            )
            session = boto3.session.Session(botocore_session=core)
            region = session.region_name or DEFAULT_REGION
            client = session.client("s3", region_name=region, config=config)
            client = _clients[key] = bound_waits(client)
        return client


_MONTHS = {
    m: i
    for i, m in enumerate(
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1
    )
}


def parse_s3_timestamp(value: str) -> datetime:
    """A timestamp of an S3 answer, parsed by botocore's own parser (dateutil: ~40 us, most
    of the client's CPU a listed key, and some of every GET's) unless it is one of the two
    forms S3 sends, parsed here in about 1 us: ISO 8601 in UTC (a listing's
    ``LastModified``, ``2026-12-07T18:00:00.000Z``) and an HTTP date (a header's,
    ``Mon, 07 Dec 2026 18:00:00 GMT``)."""
    if isinstance(value, str):
        try:
            if value.endswith("Z") and "T" in value:
                return datetime.fromisoformat(value[:-1] + "+00:00")
            _, day, month, year, clock, zone = value.split()
            if zone == "GMT" and month in _MONTHS:
                hour, minute, second = clock.split(":")
                return datetime(
                    int(year),
                    _MONTHS[month],
                    int(day),
                    int(hour),
                    int(minute),
                    int(second),
                    tzinfo=timezone.utc,
                )
        except ValueError:
            pass
    parsed: datetime = parse_timestamp(value)
    return parsed


def env_attempts() -> int:
    """AWS_MAX_ATTEMPTS, as boto3 reads it, else 5 (a device on a flaky link may want fewer)."""
    value = os.environ.get("AWS_MAX_ATTEMPTS", "")
    if not value.isdigit() or int(value) < 1:
        return DEFAULT_MAX_ATTEMPTS
    return int(value)
