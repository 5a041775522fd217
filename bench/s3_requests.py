"""Client CPU of one S3 request, the ways epfleet makes them: a read of a small object (a
device report) and a page of a listing (1,000 keys).

    python bench/s3_requests.py [--objects 2000] [--listed 3000]

moto's S3 server runs in a process of its own and tests/support/s3proxy.py's proxy in
another, in front of it (moto closes every connection after its answer; the proxy keeps
connections alive, as S3 does): what this process spends is the client's alone. Reads
go in turns of 100 objects of 1-2 KB each way, over ``--objects`` objects: botocore's
``get_object`` (``S3Store.read``), the bulk read as it was before it signed and sent its
own requests (bench/s3_direct_before.py: botocore's signer, urllib3, a timer thread a
request) and ``S3Store.bulk_read`` now. Listing pages the same, over ``--listed`` keys:
botocore's ``list_objects_v2`` paginator (what ``S3Store.iter_objects`` used) and
``iter_objects`` now. CPU is this process's (user + system) per request; ratios are to
botocore's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from loopback import moto_in_own_process  # noqa: E402  (bench/, beside this script)

BUCKET = "bench"
PROXY = """if True:
    import sys
    sys.path.insert(0, sys.argv[1])
    from tests.support.s3proxy import FaultProxy
    proxy = FaultProxy(int(sys.argv[2]))
    print(proxy.endpoint_url, flush=True)
    sys.stdin.read()  # until the benchmark closes it
    proxy.close()
"""


@contextmanager
def proxy_in_own_process(port: int) -> Iterator[str]:
    proxy = subprocess.Popen(
        [sys.executable, "-c", PROXY, str(ROOT), str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proxy.stdout is not None and proxy.stdin is not None
    try:
        yield proxy.stdout.readline().strip()
    finally:
        proxy.stdin.close()
        proxy.wait(timeout=30)


def cpu_per_call(
    calls: dict[str, Callable[[Any], Any]], items: list[Any], turn: int
) -> dict[str, float]:
    """Milliseconds of this process's CPU per item for each call, in turns of ``turn``
    items each (so that a busy moment of the machine falls on all of them alike)."""
    spent = dict.fromkeys(calls, 0.0)
    for start in range(0, len(items), turn):
        for name, call in calls.items():
            began = time.process_time()
            for item in items[start : start + turn]:
                call(item)
            spent[name] += time.process_time() - began
    return {name: 1000 * cpu / len(items) for name, cpu in spent.items()}


def show(what: str, per: dict[str, float]) -> None:
    base = next(iter(per.values()))
    print(f"{what}, client CPU per request:")
    for name, ms in per.items():
        print(f"  {name:<44} {ms:6.3f} ms  {ms / base:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--listed", type=int, default=3000)
    args = parser.parse_args()
    with moto_in_own_process() as port, proxy_in_own_process(port) as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        from s3_direct_before import DirectReads as DirectBefore

        from epfleet.stores.s3 import S3Store

        store = S3Store(BUCKET, "fleet")
        keys = [f"reports/devices/dev-{i:07d}.json" for i in range(args.objects)]
        listed = [f"reports/inbox/20261207T2359/dev-{i:07d}.json" for i in range(args.listed)]
        with ThreadPoolExecutor(16) as pool:
            body = b'{"report": "%s"}' % (b"x" * 1400)
            list(pool.map(lambda key: store.write(key, body), keys))
            list(pool.map(lambda key: store.write(key, b""), listed))
        before = DirectBefore(store)
        reads: dict[str, Callable[[Any], Any]] = {
            "botocore get_object (S3Store.read)": store.read,
            "bulk read before (botocore signer, urllib3)": before.read,
            "bulk read now (S3Store.bulk_read)": store.bulk_read,
        }
        for read in reads.values():
            assert read(keys[0]) == store.read(keys[0])  # pools and signers made once
        show(f"a read of a {len(body):,}-byte object", cpu_per_call(reads, keys, 100))
        client = store.client

        def botocore_listing(_: object) -> int:
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix="fleet/reports/inbox/"
            )
            return sum(len(page.get("Contents", [])) for page in pages)

        def listing_now(_: object) -> int:
            return sum(1 for _ in store.iter_objects("reports/inbox/"))

        assert botocore_listing(None) == listing_now(None) == args.listed
        pages = -(-args.listed // 1000)
        per_listing = cpu_per_call(
            {"botocore list_objects_v2": botocore_listing, "S3Store.iter_objects now": listing_now},
            list(range(10)),
            1,
        )
        show(
            f"a page of a listing (1,000 keys; {pages} pages a listing)",
            {name: ms / pages for name, ms in per_listing.items()},
        )


if __name__ == "__main__":
    main()
