"""How a boto3 or botocore failure of an S3 store becomes an epfleet error.

A transient failure (5xx, throttling, a dropped or unreachable connection) becomes
TransientStoreError, which the caller may retry; a socket that stalled (or an answer that
did not come whole in time), TransferTooSlow; an attempt the sync's deadline stopped,
DeadlineExceeded;
a missing object ObjectMissing; anything else (no bucket, no credentials, TLS)
StoreError naming the object and what to check.
"""

from __future__ import annotations

from typing import NoReturn

import botocore.exceptions as bce
from boto3.exceptions import RetriesExceededError, S3UploadFailedError

from epfleet.errors import (
    ObjectMissing,
    StoreError,
    StoreMissing,
    TransferTooSlow,
    TransientStoreError,
)
from epfleet.stores.s3.bounds import DeadlineReached

THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
    }
)
CLOCK_CODES = frozenset({"RequestTimeTooSkewed"})
MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
CREDENTIAL_CODES = frozenset(
    {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"}
)


def status_of(exc: bce.ClientError) -> int:
    """The HTTP status S3 answered."""
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def code_of(exc: bce.ClientError) -> str:
    """S3's error code (``NoSuchKey``, ``SlowDown``, ...)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_missing(exc: BaseException) -> bool:
    """A ClientError saying the object is not there."""
    return isinstance(exc, bce.ClientError) and code_of(exc) in MISSING_CODES


def missing_bucket(store_uri: str, bucket: str, endpoint: str | None) -> StoreMissing:
    """The one error of every command that meets a store whose bucket does not exist."""
    at = f" at {endpoint}" if endpoint else ""
    return StoreMissing(
        f"store {store_uri}: bucket {bucket!r} does not exist{at}; check the store URI and "
        "AWS_ENDPOINT_URL"
    )


def clock_skewed(action: str, where: str, code: str) -> StoreError:
    """The error for a request S3 refused because this machine's clock is off: its
    signature's time is more than 15 minutes from S3's."""
    return StoreError(
        f"{action} {where}: S3 refused the request's time ({code}): this machine's clock "
        "is more than 15 minutes off; correct it (NTP) and retry"
    )


def raise_store_error(
    exc: BaseException,
    *,
    where: str,
    action: str,
    bucket: str,
    attempts: int,
    stall_timeout: float,
    store_uri: str = "",
    endpoint: str | None = None,
) -> NoReturn:
    """Turn a boto3/botocore failure of ``action`` on ``where`` into TransientStoreError
    or StoreError (anything else is raised as it is)."""
    if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, bce.ClientError):
        exc = exc.__context__
    if isinstance(exc, RetriesExceededError):
        exc = getattr(exc, "last_exception", None) or exc
    if isinstance(exc, bce.SSLError):
        raise StoreError(
            f"{action} {where}: TLS error ({exc}); check AWS_ENDPOINT_URL and CA settings"
        ) from exc
    if isinstance(exc, DeadlineReached):
        raise exc.deadline.exceeded(f"{action} {where} stopped") from None
    if isinstance(exc, bce.ReadTimeoutError):
        raise TransferTooSlow(
            f"{action} {where}: no complete answer within {stall_timeout:g} s "
            f"(EPFLEET_STALL_TIMEOUT; {attempts} attempts)"
        ) from exc
    if isinstance(exc, (bce.ConnectionError, bce.HTTPClientError)):
        raise TransientStoreError(
            f"{action} {where}: cannot reach the S3 endpoint ({exc}); "
            "check network and AWS_ENDPOINT_URL"
        ) from exc
    if isinstance(exc, bce.IncompleteReadError):
        raise TransientStoreError(f"{action} {where}: the connection dropped ({exc})") from exc
    if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
        raise StoreError(
            f"{action} {where}: no usable AWS credentials ({exc}); "
            "check AWS_ACCESS_KEY_ID / AWS_PROFILE"
        ) from exc
    if isinstance(exc, bce.ClientError):
        status, code = status_of(exc), code_of(exc)
        if status >= 500 or status == 429 or code in THROTTLING_CODES:
            raise TransientStoreError(
                f"{action} {where}: S3 answered {status} {code}; retry later"
            ) from exc
        if code == "NoSuchBucket":
            raise missing_bucket(store_uri, bucket, endpoint) from exc
        if code in MISSING_CODES:
            raise ObjectMissing(
                f"{action} {where}: no such object (check the key and that "
                f"bucket {bucket!r} exists)"
            ) from exc
        if code in CLOCK_CODES:
            raise clock_skewed(action, where, code) from exc
        if code in CREDENTIAL_CODES:
            raise StoreError(
                f"{action} {where}: access denied ({code}); check credentials, "
                "bucket policy and AWS_ENDPOINT_URL"
            ) from exc
        raise StoreError(f"{action} {where}: S3 answered {status} {code}: {exc}") from exc
    if isinstance(exc, bce.BotoCoreError):
        raise StoreError(f"{action} {where}: {exc}") from exc
    raise exc
