#!/usr/bin/env python
"""The device's trust client under test by tuf-conformance (theupdateframework/tuf-conformance):
its client-under-test CLI (``init``, ``refresh``, ``download``) over epfleet's own pieces,
as a device runs them: the ``https://`` store (``epfleet.stores.https``, every wait
bounded), ``StoreFetcher`` (ngclient's downloads from a store, under the transfer
limits) and the device's staged refresh (``epfleet.trust.updater``: python-tuf's Updater,
unmodified, in a staging copy of the metadata directory, promoted as the device cache is
written).

    <client> --metadata-dir DIR init ROOT
    <client> --metadata-dir DIR --metadata-url URL refresh
    <client> --metadata-dir DIR --metadata-url URL --target-name PATH ...
             --target-base-url URL --target-dir DIR download

Run the suite with bench/tuf_conformance/run.sh (it fetches nothing itself: give it a
checkout of tuf-conformance). Exit codes: 0 done, 1 failed (the reason on stderr).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from tuf.api import exceptions as tuf_errors
from tuf.ngclient import Updater

from epfleet.errors import EpfleetError
from epfleet.stores.https import HttpsStore
from epfleet.trust.fetcher import StoreFetcher
from epfleet.trust.updater import promote, staged


class Fetcher(StoreFetcher):
    """``StoreFetcher`` over the two mirrors the suite serves (metadata and targets): a URL
    under one of them is that mirror's key."""

    def __init__(self, *bases: str) -> None:
        self.fetchers = {base.rstrip("/") + "/": StoreFetcher(HttpsStore(base)) for base in bases}
        super().__init__(next(iter(self.fetchers.values())).store)

    def _fetch(self, url: str) -> Iterator[bytes]:
        for base, fetcher in self.fetchers.items():
            if url.startswith(base):
                key = url.removeprefix(base)
                return fetcher._fetch(fetcher_url(key))
        raise tuf_errors.DownloadError(f"{url} is under neither mirror")


def fetcher_url(key: str) -> str:
    from epfleet.trust.fetcher import STORE_URL

    return STORE_URL + key


def updater(args: argparse.Namespace, stage: Path) -> Updater:
    bases = [args.metadata_url] + ([args.target_base_url] if args.target_base_url else [])
    fetcher = Fetcher(*bases)
    return Updater(
        str(stage),
        args.metadata_url.rstrip("/") + "/",
        args.target_dir,
        (args.target_base_url or "").rstrip("/") + "/" if args.target_base_url else None,
        fetcher=fetcher,
        bootstrap=None,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metadata-url")
    parser.add_argument("--metadata-dir", required=True)
    parser.add_argument("--target-name", action="append")
    parser.add_argument("--target-dir")
    parser.add_argument("--target-base-url")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init").add_argument("trusted_root")
    commands.add_parser("refresh")
    commands.add_parser("download")
    args = parser.parse_args()
    try:
        if args.command == "init":
            shutil.copyfile(args.trusted_root, Path(args.metadata_dir) / "root.json")
        else:
            directory = Path(args.metadata_dir)
            with staged(directory) as stage:
                try:
                    client = updater(args, stage)
                    client.refresh()
                    for name in args.target_name or [] if args.command == "download" else []:
                        info = client.get_targetinfo(name)
                        if info is None:
                            raise tuf_errors.RepositoryError(f"{name} is not a target")
                        if client.find_cached_target(info) is None:
                            client.download_target(info)
                finally:
                    # What ngclient verified and wrote to the stage is kept even when a
                    # later step fails, as the TUF spec's client persists each role (the
                    # suite checks it). A device promotes only a whole refresh its
                    # high-water rules judged (epfleet.trust.client): stricter, and safe,
                    # as the next refresh verifies again what it did not keep.
                    promote(stage, directory)
    except (tuf_errors.RepositoryError, tuf_errors.DownloadError, EpfleetError, OSError) as exc:
        print(f"epfleet client: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
