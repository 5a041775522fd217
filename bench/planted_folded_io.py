"""Benchmark: `epfleet trust refresh` on a signed store whose unsigned manifest.json someone
without the keys has padded with a long `folded_io` list.

    python bench/planted_folded_io.py [--entries 5000 10000 20000 200000]

For each count, a signed local store (one small CPU model, 16 bins) gets a manifest.json
that claims the signed generation and lists that many folded inputs on the model's CPU
variant; `trust refresh` runs in-process (it compares that copy with the signed manifest,
warns, and puts the signed copy back), then, on the same copy planted again, `device enroll`.
Prints the planted file's size, each command's wall time and exit code, and whether
manifest.json is the signed copy again after the refresh.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from epfleet.cli.app import main  # noqa: E402
from epfleet.settings import reset_settings  # noqa: E402
from epfleet.stores import MANIFEST_KEY, open_store  # noqa: E402
from tests.support.hand_made_fleet import MODEL, TARGET, make_fleet  # noqa: E402


def planted(signed: bytes, entries: int) -> bytes:
    """The signed manifest with ``entries`` folded inputs on the model's CPU variant."""
    document = json.loads(signed)
    tensors = [
        {"name": f"input-{i}", "dtype": "uint8", "scale": 0.5, "zero_point": 0}
        for i in range(entries)
    ]
    document["models"][MODEL]["variants"][TARGET]["folded_io"] = {"inputs": tensors}
    return json.dumps(document).encode()


def run(entries: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        fleet = make_fleet(str(Path(scratch) / "store"), Path(scratch))
        os.environ["EPFLEET_TRUST_SIGNER"] = f"file2:{fleet.keys / 'online.pem'}"
        reset_settings()
        store = open_store(fleet.uri)
        found = store.read(MANIFEST_KEY)
        assert found is not None
        data = planted(found.data, entries)
        store.write(MANIFEST_KEY, data)
        refresh = timed(["trust", "refresh", "--store", fleet.uri])
        restored = store.read(MANIFEST_KEY)
        back = restored is not None and restored.data == found.data
        store.write(MANIFEST_KEY, data)
        keys = Path(scratch) / "device-keys"
        enroll = timed(["device", "enroll", "dev-1", "--keys", str(keys), "--store", fleet.uri])
        print(
            f"{entries:>8,} folded inputs  {len(data) / 1e6:5.1f} MB  trust refresh {refresh}  "
            f"(manifest.json the signed copy again: {back})  device enroll {enroll}",
            flush=True,
        )


def timed(argv: list[str]) -> str:
    """``epfleet ARGV`` in this process: its wall time and exit code."""
    output = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(output), contextlib.redirect_stdout(output):
        code = main(argv)
    return f"{time.perf_counter() - start:.2f} s, exit {code}"


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[5_000, 10_000, 20_000, 200_000])
    for entries in parser.parse_args().entries:
        run(entries)


if __name__ == "__main__":
    main_()
