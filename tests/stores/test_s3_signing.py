"""``epfleet.stores.s3.signing`` signs as botocore's ``S3SigV4Auth`` does, byte for byte: the
same requests (object keys that need quoting, listing queries with prefixes and
continuation tokens, session tokens, endpoints with and without ports, credentials that
refresh) signed both ways at the same fixed time give the same headers."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, RefreshableCredentials

from epfleet.stores.s3.signing import Signer, canonical_query

pytestmark = pytest.mark.fast

AT = datetime(2026, 12, 7, 23, 59, 58, tzinfo=timezone.utc)
KEYS = [
    "reports/devices/dev-1.json",
    "reports/inbox/20261207T2359/dev 2.json",
    "reports/devices/d\u00e9v-3 \u4e2d\u6587.json",
    "a+b~c%d=e&f;g,h@i$j!k'l(m)n*o:p",
    "spaces  in  a  row/ leading and trailing ",
    "dots/./and/../segments//doubled",
    "\U0001f600/emoji",
]
QUERIES: list[dict[str, str]] = [
    {"list-type": "2", "prefix": "fleet/reports/inbox/20261207T2359/"},
    {"list-type": "2", "prefix": "fleet/a b+c~d%e/", "encoding-type": "url"},
    {
        "list-type": "2",
        "prefix": "fleet/reports/",
        "encoding-type": "url",
        "continuation-token": "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM+=",
        "max-keys": "1000",
    },
    {"list-type": "2", "prefix": "fleet/\u00e9t\u00e9/", "start-after": "fleet/\u00e9t\u00e9/z"},
]
ENDPOINTS = [
    ("http://127.0.0.1:5000", "127.0.0.1:5000", "/bucket/"),
    ("https://s3.eu-west-1.amazonaws.com", "s3.eu-west-1.amazonaws.com", "/bucket/"),
    ("https://bucket.s3.amazonaws.com:443", "bucket.s3.amazonaws.com", "/"),
    ("http://[::1]:9000", "[::1]:9000", "/bucket/"),
]
PLAIN = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SESSION = Credentials("ASIAEXAMPLE", "secret/with+chars=", "FQoGZXIvYXdzE//token+with/chars==")


def botocore_headers(
    credentials: Any, url: str, region: str, params: dict[str, str] | None, at: datetime
) -> dict[str, str]:
    request = AWSRequest("GET", url, params=params or {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("botocore.auth.get_current_datetime", lambda: at.replace(tzinfo=None))
        S3SigV4Auth(credentials.get_frozen_credentials(), "s3", region).add_auth(request)
    return dict(request.headers.items())


@pytest.mark.parametrize("credentials", [PLAIN, SESSION], ids=["keys", "session token"])
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
def test_object_reads_are_signed_as_botocore_signs_them(
    credentials: Credentials, endpoint: tuple[str, str, str]
) -> None:
    origin, host, prefix = endpoint
    signer = Signer(host, "eu-west-1")
    for key in KEYS:
        path = prefix + quote("fleet/" + key, safe="/~")
        ours = signer.headers(credentials.get_frozen_credentials(), path, "", AT)
        theirs = botocore_headers(credentials, origin + path, "eu-west-1", None, AT)
        assert ours.pop("Host") == host
        assert ours == theirs, key


@pytest.mark.parametrize("credentials", [PLAIN, SESSION], ids=["keys", "session token"])
def test_listing_pages_are_signed_as_botocore_signs_them(credentials: Credentials) -> None:
    signer = Signer("127.0.0.1:5000", "us-east-1")
    for params in QUERIES:
        query = canonical_query(params)
        ours = signer.headers(credentials.get_frozen_credentials(), "/bucket", query, AT)
        # botocore signs an operation's parameters, and, from a URL, its query as it is
        theirs = botocore_headers(
            credentials, "http://127.0.0.1:5000/bucket", "us-east-1", params, AT
        )
        from_url = botocore_headers(
            credentials, f"http://127.0.0.1:5000/bucket?{query}", "us-east-1", None, AT
        )
        ours.pop("Host")
        assert ours == theirs == from_url, params


def test_the_signing_key_follows_the_day_and_refreshed_credentials() -> None:
    """The key derived once is derived again on a new day and for a new secret: credentials
    that refresh (an assumed role's) are asked for on each request and signed as refreshed."""
    issued = iter(range(1, 100))

    def refresh() -> dict[str, str]:
        n = next(issued)
        return {
            "access_key": f"ASIAROLE{n}",
            "secret_key": f"secret-{n}",
            "token": f"token-{n}",
            "expiry_time": (datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat(),
        }

    refreshing = RefreshableCredentials.create_from_metadata(refresh(), refresh, "test")
    signer = Signer("127.0.0.1:5000", "us-east-1")
    seen = set()
    for at in (AT, AT, AT + timedelta(seconds=3), AT + timedelta(days=1)):
        frozen = refreshing.get_frozen_credentials()  # each second, past its expiry: new keys
        ours = signer.headers(frozen, "/bucket/fleet/k", "", at)
        theirs = botocore_headers(
            frozen_as(frozen), "http://127.0.0.1:5000/bucket/fleet/k", "us-east-1", None, at
        )
        ours.pop("Host")
        assert ours == theirs
        seen.add((frozen.access_key, ours["Authorization"]))
    assert len({key for key, _ in seen}) > 1  # the credentials did refresh
    assert len(seen) == 4


def frozen_as(frozen: Any) -> Credentials:
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)
