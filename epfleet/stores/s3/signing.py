"""AWS Signature Version 4 for the bodiless requests of ``epfleet.stores.s3.direct`` (a GET of
an object, a page of a listing), built here rather than through botocore's ``S3SigV4Auth``:
the same headers and the same signature, byte for byte (tests/stores/test_s3_signing.py
signs the same requests both ways and compares), at a fraction of its CPU. botocore builds
an ``AWSRequest``, re-parses its URL three times and derives the signing key (four HMACs)
for every request; here the key is derived once per secret and day, the canonical request
is formatted directly, and the caller's path and query are already in canonical form.

What a request carries, as botocore's signer gives it for a GET with no body over http or
https (no ``Content-MD5``, so the payload hash is signed: the empty body's):
``host``, ``x-amz-content-sha256``, ``x-amz-date`` and, with a session token,
``x-amz-security-token``.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from typing import Protocol
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ALGORITHM = "AWS4-HMAC-SHA256"


class Credentials(Protocol):
    """botocore's frozen credentials (``ReadOnlyCredentials``)."""

    access_key: str
    secret_key: str
    token: str | None


class Signer:
    """Signs GETs for one host, region and service (thread-safe)."""

    def __init__(self, host: str, region: str, service: str = "s3") -> None:
        self.host, self.region, self.service = host, region, service
        self._key: tuple[str, str, bytes] | None = None  # (secret, day, signing key)

    def headers(
        self, credentials: Credentials, path: str, query: str, now: datetime
    ) -> dict[str, str]:
        """The headers of a signed ``GET path?query`` at ``now`` (UTC): ``path`` as sent
        (each segment quoted as botocore quotes a key), ``query`` in SigV4's canonical form
        (names and values quoted with ``-_.~`` safe, sorted), or ""."""
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        token = credentials.token
        if token:
            signed = "host;x-amz-content-sha256;x-amz-date;x-amz-security-token"
            canonical_headers = (
                f"host:{self.host}\nx-amz-content-sha256:{EMPTY_SHA256}\n"
                f"x-amz-date:{stamp}\nx-amz-security-token:{_trim(token)}\n"
            )
        else:
            signed = "host;x-amz-content-sha256;x-amz-date"
            canonical_headers = (
                f"host:{self.host}\nx-amz-content-sha256:{EMPTY_SHA256}\nx-amz-date:{stamp}\n"
            )
        canonical = f"GET\n{path}\n{query}\n{canonical_headers}\n{signed}\n{EMPTY_SHA256}"
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = (
            f"{ALGORITHM}\n{stamp}\n{scope}\n"
            f"{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"
        )
        key = self._signing_key(credentials.secret_key, day)
        signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
        headers = {
            "Host": self.host,
            "X-Amz-Date": stamp,
            "X-Amz-Content-SHA256": EMPTY_SHA256,
            "Authorization": (
                f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
                f"SignedHeaders={signed}, Signature={signature}"
            ),
        }
        if token:
            headers["X-Amz-Security-Token"] = token
        return headers

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached = self._key  # one tuple, replaced whole: no lock needed
        if cached is not None and cached[0] == secret and cached[1] == day:
            return cached[2]
        key = _derive(secret, day, self.region, self.service)
        self._key = (secret, day, key)
        return key


def canonical_query(params: dict[str, str]) -> str:
    """A query string in SigV4's canonical form, as botocore makes it from an operation's
    parameters: names and values quoted (``-_.~`` safe), sorted."""
    pairs = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in params.items())
    return "&".join(f"{k}={v}" for k, v in pairs)


def _derive(secret: str, day: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode("utf-8")
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return key


def _trim(value: str) -> str:
    """A header value as SigV4 canonicalises it: runs of whitespace made one space."""
    return " ".join(value.split())
