"""Binary deltas between two builds of a variant: zstd's patch-from (the base file as the
compressor's raw-content dictionary, ``zstandard``), made by a publisher and applied by a
device that holds the base.

Why zstd and not bsdiff4 (``bench/deltas.py``: PP-OCR models compiled for QNN HTP with
onnxruntime-qnn 2.7.0, one Conv layer retrained): the same size (the 579 KB classifier:
2,943 B against 2,946 B; the 3.85 MB detector: 21,720 B against 21,990 B, where the new
file alone compresses to 2.43 MB with zstd -19), made faster (0.7-2.2 s against 2.1-2.4 s
for the detector) and applied faster (2-18 ms against 19-124 ms); and its decoder streams,
so a device reads no more than the signed size out of a forged delta, where bsdiff4 builds
the whole result in memory at the size the patch claims. (Between two HTP targets of the
detector bsdiff4 was smaller, 431 B against 684 B: both far under any bound.)

The rules: a delta is kept only when smaller than ``DELTA_BOUND`` of the full file; applying
one checks the result's size and sha256 against the signed target before anything is
written where a variant could be activated from, and any failure is an IntegrityError the
caller answers by downloading the full file.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from epfleet.errors import IntegrityError
from epfleet.fsutil import atomic_write_bytes

DELTA_BOUND = 0.5
"""A delta is published only when smaller than this share of the full file."""
LEVEL = 19
"""zstd's level for deltas (a publisher makes each once; devices only decompress)."""
CHUNK = 1 << 20
MAX_WINDOW = 2**31
"""The largest window a delta may declare (zstd's own limit for 64-bit decoders)."""


def make_delta(base: bytes, new: bytes, bound: float = DELTA_BOUND) -> bytes | None:
    """A delta that turns ``base`` into ``new``; None when it would not be smaller than
    ``bound`` of ``new`` (the full file is then the only way)."""
    import zstandard

    window = max(20, (len(base) + len(new)).bit_length())
    params = zstandard.ZstdCompressionParameters.from_level(LEVEL, window_log=window)
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    delta = zstandard.ZstdCompressor(compression_params=params, dict_data=dictionary).compress(new)
    return delta if len(delta) < bound * len(new) else None


def apply_delta(base: bytes, delta: bytes, sha256: str, size: int) -> bytes:
    """The file ``delta`` makes from ``base``, checked against the signed ``sha256`` and
    ``size``: IntegrityError for a corrupted, truncated or forged delta, or one that would
    write more than ``size`` bytes."""
    import zstandard

    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    decompressor = zstandard.ZstdDecompressor(dict_data=dictionary, max_window_size=MAX_WINDOW)
    chunks, made = [], 0
    try:  # streamed, never past size + 1 bytes, whatever size the frame claims
        with decompressor.stream_reader(io.BytesIO(delta), read_across_frames=True) as reader:
            while made <= size and (chunk := reader.read(min(CHUNK, size + 1 - made))):
                chunks.append(chunk)
                made += len(chunk)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"the delta does not apply: {exc}") from None
    data = b"".join(chunks)
    if len(data) != size:
        raise IntegrityError(f"the delta made {len(data):,} bytes, not the {size:,} signed")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise IntegrityError("the delta made a file whose sha256 is not the signed one")
    return data


def apply_delta_to_file(base: Path, delta: bytes, sha256: str, size: int, dest: Path) -> None:
    """``apply_delta`` from the file ``base`` into ``dest``, written atomically and only once
    checked: on any failure ``dest`` is untouched."""
    atomic_write_bytes(dest, apply_delta(base.read_bytes(), delta, sha256, size))
